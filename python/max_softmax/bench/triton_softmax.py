"""Triton's tutorial fused softmax, a peer in the benchmark (GPU only).

The design of the Triton tutorial (02-fused-softmax): a program per row,
the whole row in one block of SRAM, rows processed in a persistent loop.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _softmax_kernel(out_ptr, in_ptr, in_stride, out_stride, n_rows, n_cols, BLOCK: tl.constexpr):
    start = tl.program_id(0)
    step = tl.num_programs(0)
    for row in tl.range(start, n_rows, step):
        cols = tl.arange(0, BLOCK)
        mask = cols < n_cols
        x = tl.load(in_ptr + row * in_stride + cols, mask=mask, other=-float("inf"))
        x = x.to(tl.float32)
        x = x - tl.max(x, axis=0)
        e = tl.exp(x)
        y = e / tl.sum(e, axis=0)
        tl.store(out_ptr + row * out_stride + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


def triton_softmax(x: torch.Tensor, y: torch.Tensor) -> None:
    """Softmax of the rows of 2-D `x` into `y`."""
    rows, n = x.shape
    block = triton.next_power_of_2(n)
    if block > 1 << 17:
        raise ValueError("the Triton tutorial kernel holds a row in SRAM: rows up to 131072")
    warps = 4 if block < 2048 else (8 if block < 4096 else 16)
    programs = min(rows, 132 * 4)
    _softmax_kernel[(programs,)](
        y, x, x.stride(0), y.stride(0), rows, n, BLOCK=block, num_warps=warps
    )
