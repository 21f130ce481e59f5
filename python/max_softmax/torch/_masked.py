"""Scaled, masked and causal softmax on torch tensors: the fused masked ops
(op/masked_softmax_ops), run by the launch extension (`_launch.masked`), else
their own destination-passing models (models.masked_into_model), on an
(outer, L, n) view of x, a (mask_rows, n) additive mask and a float64
options tensor (the scale, its length the mask / causal flags:
`validation.masked_options`), so one model per (op, dtype, device) serves
every combination; with autograd in x (reverse, any order, forward
mode, vmap)."""

from __future__ import annotations

from typing import Any

import torch

from ..models import masked_into_model
from ..validation import (
    check_mask_dtype,
    check_masked_options,
    check_same_device,
    mask_suffix,
    masked_flags,
    masked_options,
    masked_view,
    normalize_axis,
)
from . import _launch as torch_launch
from ._autograd import (
    TRACED,
    for_compile,
    for_eager,
    leading,
    needs_function,
    pick,
    row_backward,
)
from ._buffers import DTYPES
from ._device import check_device, device_kind
from ._graph_path import cached, execute

_NEG_INF = float("-inf")


def _call_masked(
    out: torch.Tensor,
    x: torch.Tensor,
    mask: torch.Tensor,
    options: torch.Tensor,
    log_out: bool,
) -> None:
    """Write the masked op into `out` (the arguments as `_launch.masked`;
    the flags are in the options' length): by the launch extension where it
    is built, else by the destination-passing model. Called directly outside
    torch.compile; `_masked_op` is this same function registered for it."""
    if torch_launch.available(out.is_cuda):
        torch_launch.masked(out, x, mask, options, log_out)
        return
    op = "log_softmax_masked" if log_out else "softmax_masked"
    model = masked_into_model(op, DTYPES[out.dtype], device_kind(out))
    execute(model, (out, x, mask, options))


# The masked op as a torch custom op, for torch.compile (whose tracer cannot
# see into MAX); torch reads its schema from `_call_masked`'s signature.
_masked_op = torch.library.custom_op(
    "max_softmax::softmax_masked", _call_masked, mutates_args=("out",)
)


def _run_masked(
    x: torch.Tensor, mask: torch.Tensor | None, value: float, log_out: bool, causal: bool
) -> torch.Tensor:
    """The masked op on `x` along its last dim with `mask` already (rows, n)."""
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    if x.numel() == 0:
        return out
    x3 = x.detach().contiguous().view(masked_view(list(x.shape)))
    flags = masked_flags(mask is not None, causal)
    options = cached(
        ("options", x.device, value, flags),
        lambda: torch.tensor(masked_options(value, flags), dtype=torch.float64, device=x.device),
    )
    m = mask
    if m is None:
        m = cached(
            ("no mask", x.device, x.dtype),
            lambda: torch.zeros((1, 1), dtype=x.dtype, device=x.device),
        )
    else:
        m = m.contiguous()
    out3 = out.view(x3.shape)
    if torch.compiler.is_compiling():
        _masked_op(out3, x3, m, options, log_out)
    else:
        _call_masked(out3, x3, m, options, log_out)
    return out


class MaskedFn(torch.autograd.Function):
    """The masked op, differentiable in x: dx = scale * the backward op of
    the output; log-softmax's masked positions (-inf) get 0. The mask gets
    no gradient (the caller refuses one that wants it)."""

    @staticmethod
    def forward(x, mask, value, log_out, causal):  # type: ignore[override]
        return _run_masked(x, mask, value, log_out, causal)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple, output: torch.Tensor) -> None:
        ctx.save_for_backward(output)
        ctx.save_for_forward(output)
        ctx.args = inputs[2:4]

    @staticmethod
    def backward(ctx, dy):  # type: ignore[override]
        (out,) = ctx.saved_tensors
        value, log_out = ctx.args
        name = "log_softmax_backward" if log_out else "softmax_backward"
        dx = row_backward(name, out, dy, -1)
        plain = not needs_function(dx)
        if value != 1.0:
            dx = dx.mul_(value) if plain else dx * value
        if log_out:  # dropped positions: the gradient of masked_fill, 0
            dropped = out == _NEG_INF
            dx = dx.masked_fill_(dropped, 0.0) if plain else dx.masked_fill(dropped, 0.0)
        return dx, None, None, None, None

    @staticmethod
    def jvp(ctx, tx, _tm, _v, _l, _c):  # type: ignore[override]
        (out,) = ctx.saved_tensors
        value, log_out = ctx.args
        if tx is None:
            return torch.zeros_like(out)
        t = tx * value if value != 1.0 else tx
        if not log_out:  # the Jacobian is symmetric: the backward op
            return row_backward("softmax_backward", out, t, -1)
        t = t.masked_fill(out == _NEG_INF, 0.0)  # dropped inputs add nothing
        return t - (t * out.exp()).sum(-1, keepdim=True)

    @staticmethod
    def vmap(info, in_dims, x, mask, value, log_out, causal):  # type: ignore[override]
        (x,), _ = leading(info, in_dims[:1], x)
        if mask is not None and in_dims[1] is not None:
            # One mask a batch element: repeat each one's rows over its rows
            # of x (the kernel reads mask row r % mask_rows).
            (mask,), _ = leading(info, in_dims[1:2], mask)
            n = x.shape[-1]
            if x.numel() == 0:
                return torch.empty_like(x), 0
            rows, mask_rows = x[0].numel() // n, mask.shape[1]
            mask = mask.unsqueeze(1).expand(-1, rows // mask_rows, mask_rows, n)
            mask = mask.reshape(-1, n)
        # An unbatched mask's rows repeat every mask_rows rows of x, which a
        # leading batch dim keeps.
        return MaskedFn.apply(x, mask, value, log_out, causal), 0


MaskedFnEager, MaskedFnCompiled = for_eager(MaskedFn), for_compile(MaskedFn)
_MASKED_FUNCTIONS = (MaskedFn, MaskedFnEager, MaskedFnCompiled)


def _mask_rows(op: str, x: torch.Tensor, dim: int, last: bool, mask: torch.Tensor) -> torch.Tensor:
    """`mask` as the (mask_rows, n) additive rows the kernels read."""
    if not isinstance(mask, torch.Tensor):
        raise TypeError(f"max_softmax: {op} needs the mask as a torch.Tensor, got {type(mask)}")
    check_mask_dtype(op, mask.dtype == torch.bool, mask.is_floating_point(), mask.dtype)
    check_same_device(op, "the mask", mask.device, x.device)
    wants_grad = mask.requires_grad and torch.is_grad_enabled()
    if mask.is_floating_point() and (wants_grad or _wants_tangent(mask)):
        raise NotImplementedError(
            f"max_softmax: {op} gives no gradient to a floating mask; detach the mask, or "
            "add it to x before a plain softmax to differentiate it"
        )
    k = mask_suffix(op, list(x.shape), list(mask.shape), last)
    m = mask.detach()
    if m.dtype == torch.bool:
        zero = torch.zeros((), dtype=x.dtype, device=x.device)
        m = torch.where(m, zero, torch.full_like(zero, _NEG_INF))
    else:
        m = m.to(x.dtype)
    if not k:  # one mask row per row of x
        m = m.expand(x.shape)
        m = m if last else m.movedim(dim, -1)
    return m.contiguous().reshape(-1, x.shape[-1] if last else x.shape[dim])


def _wants_tangent(t: torch.Tensor) -> bool:
    """Whether forward-mode AD carries a tangent for `t`."""
    fwd = torch.autograd.forward_ad
    return fwd._current_level >= 0 and fwd.unpack_dual(t).tangent is not None


def masked(
    op: str,
    x: torch.Tensor,
    dim: int,
    scale: float | None,
    mask: torch.Tensor | None,
    causal: bool,
) -> torch.Tensor:
    """softmax / log_softmax of x * scale + mask (and causal): the edge."""
    if x.dtype not in DTYPES:
        raise TypeError(f"max_softmax: {op} needs a floating-point tensor, got {x.dtype}")
    check_device(x, op, x.device.type != "cuda" or torch_launch.available(cuda=True))
    dim = normalize_axis(dim, x.dim())
    value, causal = check_masked_options(op, scale, causal, x.dim(), dim)
    last = dim == x.dim() - 1
    work = x if last else x.movedim(dim, -1)
    m = None if mask is None else _mask_rows(op, x, dim, last, mask)
    log_out = op == "log_softmax"
    fn = pick(_MASKED_FUNCTIONS, *((work,) if m is None else (work, m)))
    if fn is None or fn is TRACED:
        y = _run_masked(work, m, value, log_out, causal)
    else:
        y = fn.apply(work, m, value, log_out, causal)
    return y if last else y.movedim(-1, dim)
