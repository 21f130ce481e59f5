"""`softmax` and `log_softmax`, drop-ins for torch's: `dtype=`, 0-d inputs
and torch's legacy implicit dim as torch, plain calls on our row ops
(`_autograd`), and scale / mask / causal calls on the fused masked ops
(`_masked`)."""

from __future__ import annotations

import operator
import warnings

import numpy as np
import torch

from ._autograd import (
    TRACED,
    LogSoftmaxFn,
    LogSoftmaxFnCompiled,
    LogSoftmaxFnEager,
    SoftmaxFn,
    SoftmaxFnCompiled,
    SoftmaxFnEager,
    pick,
)
from ._buffers import DTYPES
from ._masked import masked
from ._rows import run, run_eager, run_planned

_Tensor = torch.Tensor
_forward_ad = torch.autograd.forward_ad
_compiling = torch.compiler.is_compiling


def _implicit_dim(rank: int, name: str) -> int:
    """torch's legacy choice for `dim=None` (with its warning)."""
    warnings.warn(
        f"Implicit dimension choice for {name} has been deprecated. "
        "Change the call to include dim=X as an argument.",
        stacklevel=4,
    )
    return 0 if rank in (0, 1, 3) else 1


def _as_dim(name: str, dim: object) -> int:
    """`dim` as torch's argument parser takes it: an integer (a numpy
    integer, a 0-d integer tensor), not a bool, a float or an array
    (TypeError)."""
    if isinstance(dim, torch.Tensor):
        ok = dim.ndim == 0 and not (dim.is_floating_point() or dim.is_complex())
        ok = ok and dim.dtype != torch.bool
    else:
        ok = hasattr(type(dim), "__index__")
        ok = ok and not isinstance(dim, (bool, np.bool_, np.ndarray))
    if not ok:
        raise TypeError(f"max_softmax: {name}'s dim must be an int, got {type(dim).__name__}")
    return operator.index(dim)


def _prepare(
    name: str, x: torch.Tensor, dim: int | None, dtype: torch.dtype | None
) -> tuple[torch.Tensor, int]:
    """(x cast to `dtype`, dim as an int): torch casts before the op, so the
    gradient flows back through the cast; dim None is torch's implicit one,
    other integer types become an int (`_as_dim`)."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"max_softmax: {name} needs a torch.Tensor, got {type(x).__name__}")
    if dim is None:
        dim = _implicit_dim(x.dim(), name)
    elif type(dim) is not int:
        dim = _as_dim(name, dim)
    if dtype is not None:
        if dtype not in DTYPES:
            names = ", ".join(str(d) for d in DTYPES)
            raise TypeError(f"max_softmax: {name} dtype= must be one of {names}, got {dtype}")
        x = x.to(dtype)
    return x, dim


def _scalar(name: str, x: torch.Tensor, dim: int) -> torch.Tensor:
    """A 0-d input as torch: one row of one element (softmax 1, log_softmax
    0; NaN for inf and NaN), dim 0 or -1."""
    if dim not in (0, -1):  # an int by now (`_prepare`)
        raise IndexError(
            f"max_softmax: {name} of a 0-d tensor takes dim 0 or -1 "
            f"(Dimension out of range (expected to be in range of [-1, 0], but got {dim}))"
        )
    fn = softmax if name == "softmax" else log_softmax
    return fn(x.reshape(1), 0).reshape(())


# Each op's autograd Functions: (setup_context-style for torch.func, ctx-style for
# plain eager calls, jvp-less for torch.compile).
_FUNCTIONS = {
    "softmax": (SoftmaxFn, SoftmaxFnEager, SoftmaxFnCompiled),
    "log_softmax": (LogSoftmaxFn, LogSoftmaxFnEager, LogSoftmaxFnCompiled),
}


def _row_op(
    name: str,
    x: torch.Tensor,
    dim: int | None,
    dtype: torch.dtype | None,
    scale: float | None,
    mask: torch.Tensor | None,
    causal: bool,
) -> torch.Tensor:
    """`softmax` / `log_softmax` (op `name`): the casts, the masked and 0-d
    cases, then our kernel, through the autograd Function the call needs."""
    # An inference step's repeat (no grad, no transform, no torch.compile, a
    # plan for the shape) goes straight to its launch: these few C reads are
    # all it pays (the full path adds ~0.5 µs, 15% of a small CPU call).
    if (
        type(x) is _Tensor
        and type(dim) is int
        and dtype is None
        and scale is None
        and mask is None
        and not causal
        and not x.requires_grad
        and _forward_ad._current_level < 0
        and not _compiling()
    ):
        out = run_planned(name, x, dim)
        if out is not None:
            return out
    if dtype is not None or type(dim) is not int or not isinstance(x, torch.Tensor):
        x, dim = _prepare(name, x, dim, dtype)
    if scale is not None or mask is not None or causal:  # is_masked_call, inline
        return masked(name, x, dim, scale, mask, causal)
    if x.ndim == 0:
        return _scalar(name, x, dim)
    fn = pick(_FUNCTIONS[name], x)
    if fn is None:
        return run_eager(name, dim, x)
    if fn is TRACED:
        return run(name, dim, x)
    return fn.apply(x, dim)


def softmax(
    x: torch.Tensor,
    dim: int | None = -1,
    dtype: torch.dtype | None = None,
    *,
    scale: float | None = None,
    mask: torch.Tensor | None = None,
    causal: bool = False,
) -> torch.Tensor:
    """`torch.softmax(x, dim, dtype)` computed by our kernels, differentiable
    to any order, in forward mode and under `torch.func` (grad, jvp, vmap).

    `dtype` casts x first, as torch. A 0-d x gives 1 (dim 0 or -1).
    `dim=None` picks torch's legacy implicit dim, with its warning.

    With `scale`, `mask` (boolean, True keeps, or floating, added after
    scaling; broadcastable to x) or `causal` (over the last two dims, row i
    keeps columns j <= i): the softmax of `x * scale + mask`, fused in one
    kernel; a row with nothing kept gives zeros. Gradients flow to x only
    (masked positions get 0); a floating mask that requires grad raises
    NotImplementedError.
    """
    return _row_op("softmax", x, dim, dtype, scale, mask, causal)


def log_softmax(
    x: torch.Tensor,
    dim: int | None = -1,
    dtype: torch.dtype | None = None,
    *,
    scale: float | None = None,
    mask: torch.Tensor | None = None,
    causal: bool = False,
) -> torch.Tensor:
    """`torch.log_softmax(x, dim, dtype)` computed by our kernels,
    differentiable as `softmax`. A 0-d x gives 0.

    `scale`, `mask`, `causal` as for `softmax`; a row with nothing kept
    gives -inf, and masked positions (output -inf) get gradient 0, as
    `masked_fill(~mask, -inf)` followed by torch's log_softmax.
    """
    return _row_op("log_softmax", x, dim, dtype, scale, mask, causal)
