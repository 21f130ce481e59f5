"""Softmax along an axis that is not the last (`inner > 1`).

The tensor is viewed as (outer, n, inner) and each thread owns one column
(o, i), walking j = 0..n-1 at stride `inner`. Neighbouring threads own
neighbouring i, so every step of the walk is a coalesced load across the
warp. One online sweep gives (max, sum); a second writes the result.
"""

from max.gpu import block_idx, thread_idx
from max.gpu.host import DeviceContext
from std.builtin.device_passable import DevicePassable
from std.math import ceildiv
from std.utils.numerics import inf

from .gpu_launch import kernel_arg
from .row_math import (
    accum_dtype,
    epilogue,
    fold_pair,
    online_add,
    online_sum_guard,
    row_scale,
)
from .row_tensors import RowTensors

comptime STRIDED_THREADS = 256
comptime STRIDED_SUM_BLOCK = 256

comptime StridedLauncher[dtype: DType] = def(
    DeviceContext, RowTensors[dtype], Int, Int, Int
) raises thin -> None
"""Launches an op's strided kernel on the (outer, n, inner) view of its
tensors (this file's, the backward's)."""


def strided_rows_kernel[
    dtype: DType, log_out: Bool
](
    dst: Pointer[Scalar[dtype], MutAnyOrigin],
    src: Pointer[Scalar[dtype], MutAnyOrigin],
    outer: Int64,
    n: Int64,
    inner: Int64,
):
    """One thread per column of the (outer, n, inner) view.

    Args:
        dst: Output, same layout as `src`.
        src: Input, `outer * n * inner` elements.
        outer: Product of the dims before the axis.
        n: Length of the axis.
        inner: Product of the dims after the axis (the stride of the walk).
    """
    comptime acc = accum_dtype[dtype]()
    comptime assert acc.is_floating_point()
    var col = Int(block_idx.x) * STRIDED_THREADS + Int(thread_idx.x)
    var cols = Int(outer) * Int(inner)
    if col >= cols:
        return
    var len = Int(n)
    var stride = Int(inner)
    var o = col // stride
    var i = col % stride
    var base = o * len * stride + i

    # Online pairs over blocks of STRIDED_SUM_BLOCK steps, folded into the
    # total, so one thread's float32 sum over a million steps stays accurate.
    var m = -inf[acc]()
    var s = Scalar[acc](0)
    for b in range(0, len, STRIDED_SUM_BLOCK):
        var bm = -inf[acc]()
        var bs = Scalar[acc](0)
        for j in range(b, min(b + STRIDED_SUM_BLOCK, len)):
            var v = src[unsafe_offset=base + j * stride].cast[acc]()
            (bm, bs) = online_add[acc, 1](bm, bs, v)
        var folded = fold_pair[acc](m, s, bm, bs)
        m = folded[0]
        s = folded[1]
    var scale = row_scale[log_out, acc](online_sum_guard[acc](m, s))
    for j in range(len):
        var at = base + j * stride
        var v = src[unsafe_offset=at].cast[acc]()
        dst[unsafe_offset=at] = epilogue[log_out, acc, 1](v, m, scale).cast[
            dtype
        ]()


def launch_strided[
    declared: TypeList[Trait=AnyType, ...],
    //,
    kernel: def(* args: * declared) thin -> None,
    *Ts: DevicePassable,
](ctx: DeviceContext, columns: Int, *args: *Ts) raises:
    """Enqueue a strided kernel (this one, the backward's) on `args`: a
    thread per column of `columns`, `STRIDED_THREADS` a block."""
    ctx.enqueue_function[kernel](
        *args,
        grid_dim=ceildiv(columns, STRIDED_THREADS),
        block_dim=STRIDED_THREADS,
    )


def launch_strided_rows[
    dtype: DType, log_out: Bool
](
    ctx: DeviceContext, t: RowTensors[dtype], outer: Int, n: Int, inner: Int
) raises:
    """`strided_rows_kernel` on the (outer, n, inner) view of `t` (`src` is
    `a`)."""
    launch_strided[strided_rows_kernel[dtype, log_out]](
        ctx,
        outer * inner,
        kernel_arg(t.dst),
        kernel_arg(t.a),
        Int64(outer),
        Int64(n),
        Int64(inner),
    )
