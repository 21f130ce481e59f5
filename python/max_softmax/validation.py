"""Argument checks shared by the graph-level and array-level functions.

Every user mistake becomes a Python exception that names the problem,
before anything reaches MAX or Mojo.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from max.dtype import DType

SUPPORTED_DTYPES: tuple[DType, ...] = (
    DType.float32,
    DType.float16,
    DType.bfloat16,
    DType.float64,
)
"""Element types every op accepts (16-bit types compute in float32)."""


BASELINE_VARIANTS: tuple[str, ...] = ("tree", "online", "split_smem")
"""Replaced designs kept to measure against: ops of their own in op/baselines/."""

VARIANTS: tuple[str, ...] = (
    "auto",
    "warp",
    "block",
    "smem",
    "split",
    "split_stream",
    *BASELINE_VARIANTS,
)
"""Kernel families `variant=` accepts; "auto" uses the dispatch table in
op/dispatch.mojo. Others exist for benchmarks and tests."""


class SoftmaxInputError(ValueError):
    """Raised for input that max_softmax cannot take (dtype, rank, axis)."""


def check_dtype(dtype: DType) -> DType:
    """Return `dtype` if it is a supported floating type, else raise."""
    if dtype not in SUPPORTED_DTYPES:
        names = ", ".join(d.name for d in SUPPORTED_DTYPES)
        raise TypeError(
            f"max_softmax: softmax needs a floating-point tensor ({names}), got {dtype.name}"
        )
    return dtype


def check_variant(variant: str, device_kind: str) -> str:
    """Return `variant` if it names a kernel family in `VARIANTS` that can run
    on `device_kind` ("cpu" or "gpu"), else raise: the CPU has one family."""
    if variant not in VARIANTS:
        raise ValueError(f"max_softmax: unknown variant {variant!r}; choose one of {VARIANTS}")
    if variant != "auto" and device_kind != "gpu":
        raise ValueError(
            f"max_softmax: variant {variant!r} is a GPU kernel family; on the {device_kind} "
            "leave variant='auto'"
        )
    return variant


def check_dy_like(
    op: str, x: Any, dy: Any, dims: Callable[[Any], list] = lambda t: list(t.shape)
) -> None:
    """Raise ValueError unless `dy` has the dtype, dims and device of `x`:
    graph `TensorValue`s and eager `Tensor`s alike (`dims` lists a shape)."""
    x_device, dy_device = getattr(x, "device", "cpu"), getattr(dy, "device", "cpu")
    if dy.dtype != x.dtype or dims(dy) != dims(x) or dy_device != x_device:
        raise ValueError(
            f"max_softmax: {op} needs dy like its first input (same shape, dtype and "
            f"device): got {dy.dtype.name}{dims(dy)} on {dy_device} for "
            f"{x.dtype.name}{dims(x)} on {x_device}"
        )


def normalize_axis(axis: int, rank: int) -> int:
    """Map `axis` (negative counts from the end) into [0, rank), or raise."""
    if rank == 0:
        raise SoftmaxInputError(
            "max_softmax: softmax needs a tensor of rank >= 1, got a scalar (rank 0)"
        )
    if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)):
        raise TypeError(f"max_softmax: axis must be an int, got {axis!r}")
    if not -rank <= axis < rank:
        raise SoftmaxInputError(
            f"max_softmax: axis {axis} is out of range for a tensor of rank "
            f"{rank} (valid: {-rank} to {rank - 1})"
        )
    return int(axis) % rank


def canonical_shape(shape: tuple[int, ...], axis: int) -> tuple[int, int, int]:
    """The (outer, n, inner) view the kernels work on, for a concrete shape
    and an axis (negative counts from the end)."""
    axis = normalize_axis(axis, len(shape))
    outer = int(np.prod(shape[:axis], dtype=np.int64))
    inner = int(np.prod(shape[axis + 1 :], dtype=np.int64))
    return outer, int(shape[axis]), inner
