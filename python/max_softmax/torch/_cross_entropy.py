"""Cross-entropy on torch tensors, a drop-in for `F.cross_entropy`.

Class-index targets run our fused loss op: two outputs (loss, dlogits),
int64 targets and a float64 options tensor (ignore_index, label_smoothing),
or with z-loss, softcap or class weights (ignore_index, label_smoothing,
z_loss, softcap[, weights]), by the launch extension (the same kernels MAX's
op picks by the options' length) or, where it is not built or
MAX_SOFTMAX_LAUNCH=graph, the op's destination-passing models
(models.cross_entropy_into_model).
Its forward writes the gradient too, and the first-order backward only
scales it. Higher-order, forward-mode and
`torch.func` derivatives recompute the gradient with our softmax and torch
ops. Class-probability targets run the fused soft_cross_entropy op the
same way (`SoftCrossEntropyFn`), through the launch extension; softcap,
gradients in the target, forward mode, `torch.func` and torch.compile take
our log_softmax and torch ops (not fused).
"""

from __future__ import annotations

from typing import Any

import torch

from ..models import cross_entropy_into_model, scale_rows_into_model
from ..validation import (
    EMPTY_LOSS,
    check_class_weight,
    check_cross_entropy_extras,
    check_cross_entropy_options,
    check_same_device,
    check_soft_targets,
    check_targets_in_range,
)
from . import _launch as torch_launch
from ._autograd import (
    TRACED,
    for_compile,
    for_eager,
    forward_mode,
    leading,
    needs_function,
    pick,
)
from ._buffers import DTYPES
from ._device import check_device, device_kind, is_wrapped
from ._functional import log_softmax, softmax
from ._graph_path import cached, execute
from ._options import NO_EXTRAS, options_tensor
from ._rows import PLAN_LIMIT
from .linear import cross_entropy_inplace

_functorch = torch._C._functorch


def _call_cross_entropy(reduction: str, with_grad: bool, tensors: tuple[torch.Tensor, ...]) -> None:
    """Write cross-entropy into `tensors`' outputs: (loss, [dlogits,] logits,
    targets, options) (no replay: the op is one graph call either way)."""
    if torch_launch.available(tensors[-3].is_cuda):
        loss, *rest = tensors
        dlogits = rest.pop(0) if with_grad else None
        logits, targets, options = rest
        torch_launch.cross_entropy(loss, dlogits, logits, targets, options, reduction)
        return
    logits = tensors[-3]
    model = cross_entropy_into_model(
        with_grad, DTYPES[logits.dtype], device_kind(logits), reduction
    )
    execute(model, tensors)


@torch.library.custom_op("max_softmax::cross_entropy", mutates_args=("loss", "dlogits"))
def _cross_entropy_op(
    loss: torch.Tensor,
    dlogits: torch.Tensor,
    logits: torch.Tensor,
    targets: torch.Tensor,
    options: torch.Tensor,
    reduction: str,
    with_grad: bool,
) -> None:
    """Cross-entropy as a torch custom op, for torch.compile (whose tracer
    cannot see into MAX); `dlogits` is not touched unless `with_grad`."""
    head = (loss, dlogits) if with_grad else (loss,)
    _call_cross_entropy(reduction, with_grad, (*head, logits, targets, options))


_plans: dict[tuple, torch_launch.CrossEntropyLauncher] = {}
"""Launches of the plain cross-entropy (no z-loss, softcap or weights) by
(rows, classes, dtype, device, reduction, ignore_index, label_smoothing),
made by its first launch-extension call: a repeated call (a training step's
loss) skips straight to the launch. At most `PLAN_LIMIT`, as the row ops'."""


def _cross_entropy_rows(
    logits: torch.Tensor,
    targets: torch.Tensor,
    ignore_index: int,
    reduction: str,
    eps: float,
    with_grad: bool,
    extras: tuple = NO_EXTRAS,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(loss, dlogits or None) of contiguous (rows, classes) `logits` and
    (rows,) int64 `targets` (every caller passes them contiguous: saved
    from `cross_entropy`'s): the loss (1,) for "mean"/"sum", (rows,) for
    "none"."""
    rows, classes = logits.shape
    loss = torch.empty(
        (rows,) if reduction == "none" else (1,), dtype=logits.dtype, device=logits.device
    )
    dlogits = torch.empty_like(logits) if with_grad else None
    key = (rows, classes, logits.dtype, logits.device, reduction, ignore_index, eps)
    plan = _plans.get(key) if extras is NO_EXTRAS else None
    if plan is not None and not torch.compiler.is_compiling():
        plan(loss, dlogits, logits, targets)
        return loss, dlogits
    if rows == 0 or classes == 0:
        loss.fill_(EMPTY_LOSS[reduction])
        if dlogits is not None:
            dlogits.zero_()
        return loss, dlogits
    options = options_tensor(logits.device, ignore_index, eps, extras)
    # Without the gradient the op ignores `dlogits`: any tensor will do.
    grad_out = dlogits if dlogits is not None else loss
    if torch.compiler.is_compiling():
        _cross_entropy_op(loss, grad_out, logits, targets, options, reduction, with_grad)
    elif extras is NO_EXTRAS and torch_launch.available(logits.is_cuda):
        plan = torch_launch.cross_entropy_launcher(logits, options, reduction)
        plan(loss, dlogits, logits, targets)
        if len(_plans) >= PLAN_LIMIT:
            _plans.clear()
        _plans[key] = plan
    else:
        head = (loss, grad_out) if with_grad else (loss,)
        _call_cross_entropy(reduction, with_grad, (*head, logits, targets, options))
    return loss, dlogits


def _gradient(
    logits: torch.Tensor,
    targets: torch.Tensor,
    ignore_index: int,
    reduction: str,
    eps: float,
    extras: tuple = NO_EXTRAS,
) -> torch.Tensor:
    """d loss / d logits (the mean's 1/count included) by our softmax and
    torch ops, differentiable: softmax - (1 - eps) onehot - eps / C on kept
    rows, 0 on ignored rows, NaN on out-of-range targets (as the kernel).
    With (weight, z_loss, softcap) `extras`: p (A) - eps / C w - (1 - eps)
    w_t onehot, A = (1 - eps) w_t + eps / C sum(w) + 2 z_loss lse, times
    the softcap's 1 - tanh^2; "mean" over the sum of w_t over kept rows."""
    classes = logits.shape[-1]
    kept = targets != ignore_index
    bad = kept & ((targets < 0) | (targets >= classes))
    safe = torch.where(kept & ~bad, targets, torch.zeros_like(targets))
    onehot = torch.nn.functional.one_hot(safe, classes).to(logits.dtype)
    weight, z_loss, cap = extras
    if weight is None and not z_loss and not cap:
        g = softmax(logits, -1) - (1.0 - eps) * onehot - eps / classes
        count = kept.sum().to(logits.dtype)
    else:
        y = cap * torch.tanh(logits / cap) if cap else logits
        w = (
            torch.ones(classes, dtype=logits.dtype, device=logits.device)
            if weight is None
            else weight.to(logits.dtype)
        )
        w_t = w[safe].unsqueeze(-1)
        factor = (1.0 - eps) * w_t + eps / classes * w.sum()
        if z_loss:
            factor = factor + 2 * z_loss * torch.logsumexp(y, -1, keepdim=True)
        g = softmax(y, -1) * factor - eps / classes * w - (1.0 - eps) * w_t * onehot
        if cap:
            g = g * (1 - (y / cap) ** 2)
        count = (w_t.squeeze(-1) * kept.to(logits.dtype)).sum()
    g = g * kept.unsqueeze(-1).to(logits.dtype)
    if reduction == "mean":
        g = g / count
    return torch.where(bad.unsqueeze(-1), torch.full_like(g, float("nan")), g)


def _scale_rows(dlogits: torch.Tensor, factor: torch.Tensor) -> None:
    """(rows, n) `dlogits` times `factor` ((rows,) or (1,)) in place, rows
    whose factor is 1 left unread: on CUDA by the launch extension; on the
    CPU, where the launch path is on, by torch (the factor is on the host:
    reading it costs no sync, and no model is compiled); else by the
    scale_rows op's model (no host read of the factor, no second pass)."""
    if dlogits.numel() == 0:
        return
    if dlogits.is_cuda:
        if torch_launch.available(cuda=True):  # the extension's is GPU-only
            torch_launch.scale_rows(dlogits, factor)
            return
    elif torch_launch.available():
        if not bool((factor == 1).all()):
            dlogits.mul_(factor.reshape(-1, 1))
        return
    per_row = factor.shape[0] != 1
    model = scale_rows_into_model(DTYPES[dlogits.dtype], device_kind(dlogits), per_row)
    execute(model, (dlogits, factor))


class CrossEntropyFn(torch.autograd.Function):
    """Cross-entropy of (rows, classes) logits whose forward also writes the
    gradient (one fused pass over the logits); backward hands that gradient
    on, scaled in place. `holder` (a fresh list) carries the gradient from
    forward to setup_context."""

    @staticmethod
    def forward(logits, targets, ignore_index, reduction, eps, extras, holder):  # type: ignore[override]
        loss, dlogits = _cross_entropy_rows(
            logits, targets, ignore_index, reduction, eps, True, extras
        )
        holder.append(dlogits)
        return loss

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple, output: torch.Tensor) -> None:
        logits, targets, ignore_index, reduction, eps, extras, holder = inputs
        ctx.save_for_backward(logits, targets)
        ctx.save_for_forward(logits, targets)
        # Held outside save_for_backward: the first backward gives it away
        # (scaled in place, or as it is), so torch's version check on saved
        # tensors would refuse a second backward that never reads it.
        ctx.dlogits = holder.pop() if holder else None
        ctx.args = (ignore_index, reduction, eps, extras)

    @staticmethod
    def backward(ctx, grad_loss):  # type: ignore[override]
        logits, targets = ctx.saved_tensors
        ignore_index, reduction, eps, extras = ctx.args
        none = (None, None, None, None, None, None)
        if needs_function(logits, grad_loss):  # create_graph, torch.func: differentiable
            ctx.dlogits = None
            scale = grad_loss.unsqueeze(-1) if reduction == "none" else grad_loss
            g = _gradient(logits, targets, ignore_index, reduction, eps, extras)
            return (g * scale, *none)
        dlogits, ctx.dlogits = ctx.dlogits, None
        if dlogits is None:  # a second backward (retain_graph): compute it again
            dlogits = _cross_entropy_rows(
                logits, targets, ignore_index, reduction, eps, True, extras
            )[1]
        compiling = torch.compiler.is_compiling()
        # A loss backpropagated as is (grad 1) passes dlogits on untouched;
        # the check reads a CPU scalar only (on CUDA it would sync the host;
        # under torch.compile it would break the graph).
        if (
            not grad_loss.is_cuda
            and reduction != "none"
            and not compiling
            and float(grad_loss) == 1.0
        ):
            return (dlogits, *none)
        # "none": a gradient a row; "mean"/"sum": one scalar (shape (1,)).
        if not compiling:
            # Rows whose factor is 1 (loss.backward()) are left unread.
            _scale_rows(dlogits, grad_loss.to(dlogits.dtype).contiguous())
            return (dlogits, *none)
        scale = grad_loss[:, None] if reduction == "none" else grad_loss
        return (dlogits.mul_(scale), *none)

    @staticmethod
    def jvp(ctx, t_logits, *_):  # type: ignore[override]
        logits, targets = ctx.saved_tensors
        ignore_index, reduction, eps, extras = ctx.args
        if t_logits is None:
            shape = (logits.shape[0],) if reduction == "none" else (1,)
            return torch.zeros(shape, dtype=logits.dtype, device=logits.device)
        g = _gradient(logits, targets, ignore_index, reduction, eps, extras)
        tangent = (g * t_logits).sum(-1)
        return tangent if reduction == "none" else tangent.sum().reshape(1)

    @staticmethod
    def vmap(info, in_dims, logits, targets, ignore_index, reduction, eps, extras, holder):  # type: ignore[override]
        # Each batch element's rows, flat, as one "none" call; then each
        # element's reduction (the mean over its kept rows) by torch ops.
        (logits, targets), _ = leading(info, in_dims[:2], logits, targets)
        batch, rows, classes = logits.shape
        loss = CrossEntropyFn.apply(
            logits.reshape(-1, classes).contiguous(),
            targets.reshape(-1).contiguous(),
            ignore_index,
            "none",
            eps,
            extras,
            [],
        ).reshape(batch, rows)
        if reduction == "none":
            return loss, 0
        total = loss.sum(1, keepdim=True)
        if reduction == "sum":
            return total, 0
        kept = targets != ignore_index
        weight = extras[0]
        if weight is None:
            return total / kept.sum(1, keepdim=True).to(loss.dtype), 0
        w_t = weight.to(loss.dtype)[torch.where(kept, targets, torch.zeros_like(targets))]
        return total / (w_t * kept.to(loss.dtype)).sum(1, keepdim=True), 0


CrossEntropyFnEager = for_eager(CrossEntropyFn)
CrossEntropyFnCompiled = for_compile(CrossEntropyFn)
_FUNCTIONS = (CrossEntropyFn, CrossEntropyFnEager, CrossEntropyFnCompiled)


def _host_values(targets: torch.Tensor, shape: tuple) -> Any:
    """CPU `targets` as a numpy array of `shape`; under torch.func, all the
    values the transforms wrap (a vmapped tensor: every batch element's)."""
    if not _functorch.is_functorch_wrapped_tensor(targets):
        return targets.view(shape).numpy()
    with torch._C._DisableFuncTorch():
        while _functorch.is_functorch_wrapped_tensor(targets):
            targets = _functorch.get_unwrapped(targets)
        return targets.numpy()


def _soft_cross_entropy_unfused(
    input: torch.Tensor,
    target: torch.Tensor,
    reduction: str,
    eps: float,
    extras: tuple = NO_EXTRAS,
) -> torch.Tensor:
    """Cross-entropy with class-probability targets, as F.cross_entropy:
    -(q * w * log_softmax(input)).sum over classes, q = target smoothed by
    eps (w: torch's class weights, the mean over the rows as torch), plus
    z_loss lse^2 a row, softcap first. Our log_softmax kernel and torch ops
    (not fused); autograd follows: every derivative, in the input, the
    target and the weight."""
    dim = 0 if input.dim() == 1 else 1
    classes = input.shape[dim]
    weight, z_loss, cap = extras
    # 16-bit inputs in float32 throughout (log p included), rounded once at
    # the end: in the input's type each log p and q * w * log p would round
    # (torch's ops round too, in another order), a class's term at 2^9 by a
    # quarter, and weights of both signs cancel what is left.
    acc = torch.float32 if input.dtype in (torch.float16, torch.bfloat16) else input.dtype
    out_dtype = input.dtype
    input = input.to(acc)
    if cap:
        input = cap * torch.tanh(input / cap)
    q = target.to(acc)
    if eps != 0.0:
        q = q * (1.0 - eps) + eps / classes
    if weight is not None:
        shape = [1] * input.dim()
        shape[dim] = classes
        q = q * weight.to(acc).reshape(shape)
    loss = -(q * log_softmax(input, dim)).sum(dim)
    if z_loss:
        loss = loss + z_loss * torch.logsumexp(input, dim) ** 2
    if reduction == "sum":
        loss = loss.sum()
    elif reduction == "mean":
        loss = loss.sum() / (input.numel() / classes) if classes else loss.sum() / 0.0
    return loss.to(out_dtype)


def _soft_options(device: torch.device, eps: float, z_loss: float, weight: Any) -> torch.Tensor:
    """The soft-target kernels' float64 options on `device`
    (`validation.soft_cross_entropy_options`): (eps, z_loss), made once per
    (device, values), then the class weights joined on the device."""
    values = [eps, z_loss]
    head = cached(
        ("soft_cross_entropy", device, *values),
        lambda: torch.tensor(values, dtype=torch.float64, device=device),
    )
    if weight is None:
        return head
    return torch.cat([head, weight.detach().to(device=device, dtype=torch.float64)])


def _soft_rows(
    logits: torch.Tensor,
    probs: torch.Tensor,
    options: torch.Tensor,
    reduction: str,
    with_grad: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(loss, dlogits or None) of contiguous (rows, classes) `logits` and
    `probs` of their dtype, by the fused soft_cross_entropy op through the
    launch extension: the loss (1,) for "mean"/"sum", (rows,) for "none"."""
    rows = logits.shape[0]
    loss = torch.empty(
        (rows,) if reduction == "none" else (1,), dtype=logits.dtype, device=logits.device
    )
    dlogits = torch.empty_like(logits) if with_grad else None
    torch_launch.cross_entropy(loss, dlogits, logits, probs, options, reduction, soft=True)
    return loss, dlogits


def _soft_gradient(
    logits: torch.Tensor, probs: torch.Tensor, options: torch.Tensor, reduction: str
) -> torch.Tensor:
    """d loss / d logits of (rows, classes) `logits` by our softmax and
    torch ops, differentiable in the logits: (S + 2 z lse) softmax - q, q =
    ((1 - eps) p + eps / C) w, S = sum q (over the rows for "mean")."""
    classes = logits.shape[-1]
    eps, z_loss = (float(v) for v in options[:2].tolist())
    q = probs.to(logits.dtype) * (1.0 - eps) + eps / classes
    if options.shape[0] > 2:
        q = q * options[2:].to(logits.dtype)
    factor = q.sum(-1, keepdim=True)
    if z_loss:
        factor = factor + 2 * z_loss * torch.logsumexp(logits, -1, keepdim=True)
    g = softmax(logits, -1) * factor - q
    if reduction == "mean":
        g = g / logits.shape[0]
    return g


class SoftCrossEntropyFn(torch.autograd.Function):
    """Cross-entropy of (rows, classes) logits against class probabilities
    whose forward also writes the gradient (one fused pass); backward hands
    it on, scaled (in place). A second-order backward (create_graph)
    recomputes it with torch ops, differentiable. Callers take the
    unfused path for forward mode, torch.func and gradients in the target."""

    @staticmethod
    def forward(ctx: Any, logits, probs, options, reduction):  # type: ignore[override]
        loss, dlogits = _soft_rows(logits, probs, options, reduction, True)
        ctx.save_for_backward(logits, probs, options)
        ctx.dlogits = dlogits
        ctx.reduction = reduction
        return loss

    @staticmethod
    def backward(ctx: Any, grad_loss):  # type: ignore[override]
        logits, probs, options = ctx.saved_tensors
        reduction = ctx.reduction
        none = (None, None, None)
        if torch.is_grad_enabled():  # create_graph: differentiable
            ctx.dlogits = None
            scale = grad_loss.unsqueeze(-1) if reduction == "none" else grad_loss
            return (_soft_gradient(logits, probs, options, reduction) * scale, *none)
        dlogits, ctx.dlogits = ctx.dlogits, None
        if dlogits is None:  # a second backward (retain_graph): compute it again
            dlogits = _soft_rows(logits, probs, options, reduction, True)[1]
        if not grad_loss.is_cuda and reduction != "none" and float(grad_loss) == 1.0:
            return (dlogits, *none)
        _scale_rows(dlogits, grad_loss.to(dlogits.dtype).contiguous())
        return (dlogits, *none)


def _fused_soft(input: torch.Tensor, target: torch.Tensor, extras: tuple) -> bool:
    """Whether a probability-target call takes the fused op: the launch
    extension is there, no softcap, and nothing asks for what its
    first-order Function does not give (a gradient in the target or the
    weight, forward mode, torch.func, torch.compile)."""
    weight, _, cap = extras
    if cap or torch.compiler.is_compiling():
        return False
    if torch.is_grad_enabled() and (
        target.requires_grad or (weight is not None and weight.requires_grad)
    ):
        return False
    if forward_mode() or is_wrapped(input) or is_wrapped(target):
        return False
    return torch_launch.available(input.is_cuda)


def _soft_cross_entropy(
    input: torch.Tensor,
    target: torch.Tensor,
    reduction: str,
    eps: float,
    extras: tuple = NO_EXTRAS,
) -> torch.Tensor:
    """Cross-entropy with class-probability targets, as F.cross_entropy: by
    the fused soft_cross_entropy op (the forward writes d loss / d input,
    the first-order backward scales it) where `_fused_soft`, else by our
    log_softmax and torch ops (`_soft_cross_entropy_unfused`: softcap,
    gradients in the target, forward mode, torch.func, torch.compile)."""
    check_soft_targets(list(input.shape), list(target.shape))
    if not _fused_soft(input, target, extras):
        return _soft_cross_entropy_unfused(input, target, reduction, eps, extras)
    weight, z_loss, _ = extras
    logits = input.unsqueeze(0) if input.dim() == 1 else input
    probs = target.unsqueeze(0) if target.dim() == 1 else target
    if logits.dim() > 2:
        logits, probs = logits.movedim(1, -1), probs.movedim(1, -1)
    classes = logits.shape[-1]
    logits = logits.reshape(-1, classes).contiguous()
    probs = probs.detach().to(logits.dtype).reshape(-1, classes).contiguous()
    options = _soft_options(logits.device, eps, z_loss, weight)
    if logits.requires_grad and torch.is_grad_enabled():
        loss = SoftCrossEntropyFn.apply(logits, probs, options, reduction)
    else:
        loss, _ = _soft_rows(logits, probs, options, reduction, False)
    if reduction == "none":
        return loss.reshape(input.shape[:1] + input.shape[2:] if input.dim() > 1 else ())
    return loss.reshape(())


def check_no_legacy_reduction(size_average: bool | None, reduce: bool | None) -> None:
    """Raise ValueError unless torch's deprecated `size_average` and `reduce`
    are None (`cross_entropy` and `CrossEntropyLoss` take `reduction=`)."""
    if size_average is not None or reduce is not None:
        raise ValueError(
            "max_softmax: size_average and reduce are deprecated in torch; use reduction="
        )


def cross_entropy(
    input: torch.Tensor,
    target: torch.Tensor,
    weight: torch.Tensor | None = None,
    size_average: bool | None = None,
    ignore_index: int = -100,
    reduce: bool | None = None,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
    *,
    z_loss: float = 0.0,
    softcap: float | None = None,
    inplace_backward: bool = False,
) -> torch.Tensor:
    """`torch.nn.functional.cross_entropy(input, target, ...)` computed by
    our kernels, differentiable to any order, in forward mode and under
    `torch.func`. With class indices the loss is fused: the forward writes
    d loss / d input too, and the first-order backward only scales it.

    Args:
        input: Logits (C,), (N, C) or (N, C, d1, ...): classes on dim 1 (or
            0 for 1-D), as torch; float32/float16/bfloat16/float64, CPU or CUDA.
        target: Integer class indices, () / (N,) / (N, d1, ...); or class
            probabilities, a floating tensor shaped as `input` (the fused
            soft-target op, first-order; ignore_index does not apply, as
            torch; "mean" over the rows; softcap, a target that requires
            grad, forward mode and torch.func take our log_softmax and
            torch ops, not fused).
        weight: Class weights (C,), on the input's device, as torch (row loss
            w[t] (lse - x_t); with smoothing (1 - eps) of that plus eps / C
            sum_c w_c (lse - x_c); "mean" over the sum of w[t] of the kept
            rows). Not differentiated (a constant, as torch's use of it).
        size_average: Deprecated in torch; must be None.
        ignore_index: Target value whose rows add nothing and count for
            nothing in the mean.
        reduce: Deprecated in torch; must be None.
        reduction: "mean", "sum" or "none".
        label_smoothing: eps in [0, 1].
        z_loss: w >= 0: each kept row adds w * lse^2 (lse after the softcap;
            unweighted, and inside the "mean").
        softcap: c > 0 (None or 0: off): the logits become c * tanh(x / c)
            first (Gemma 2).
        inplace_backward: With class indices and logits requiring grad
            (outside torch.compile): the forward writes d loss / d input
            over the input's memory, as Liger does, saving a gradient-sized
            buffer. The input is then overwritten (it holds its gradient:
            nothing else may read it), the loss has first-order gradients
            only, and a second backward (retain_graph) raises RuntimeError.

    Returns:
        The loss in the input's dtype: 0-d for "mean"/"sum", the target's
        shape for "none".

    An out-of-range class index (not ignore_index) raises TargetIndexError
    (an IndexError and a ValueError) for CPU tensors; on CUDA it is not
    checked (that would sync with the host): its row's loss and gradient
    come out NaN, and so does a reduced loss.
    """
    check_no_legacy_reduction(size_average, reduce)
    reduction, ignore_index, eps = check_cross_entropy_options(
        reduction, ignore_index, label_smoothing
    )
    z_loss, cap = check_cross_entropy_extras(z_loss, softcap)
    if input.dtype not in DTYPES:
        raise TypeError(
            f"max_softmax: cross_entropy needs floating-point logits, got {input.dtype}"
        )
    if input.dim() == 0:
        raise ValueError("max_softmax: cross_entropy needs logits of rank >= 1, got a 0-d tensor")
    if target.device != input.device:
        raise ValueError(
            f"max_softmax: cross_entropy needs input and target on one device, "
            f"got {input.device} and {target.device}"
        )
    launching = input.is_cuda and torch_launch.available(cuda=True)
    check_device(input, "cross_entropy", launching)
    if weight is not None:
        if (
            not isinstance(weight, torch.Tensor)
            or weight.is_complex()
            or weight.dtype == torch.bool
        ):
            raise TypeError(
                f"max_softmax: cross_entropy weight must be a real tensor, got {weight!r}"
            )
        check_same_device("cross_entropy", "the weight", weight.device, input.device)
        check_class_weight(list(weight.shape), input.shape[0 if input.dim() == 1 else 1])
    extras = NO_EXTRAS if weight is None and not z_loss and not cap else (weight, z_loss, cap)
    if target.is_floating_point():
        return _soft_cross_entropy(input, target, reduction, eps, extras)
    if target.is_complex() or target.dtype == torch.bool:
        raise TypeError(
            f"max_softmax: cross_entropy needs integer class indices or floating class "
            f"probabilities as the target, got {target.dtype}"
        )
    # Classes last, rows flat: the kernels' (rows, classes) view. Autograd
    # follows the movedim/reshape (a copy only for (N, C, d1, ...)).
    logits = input.unsqueeze(0) if input.dim() == 1 else input
    if logits.dim() > 2:
        logits = logits.movedim(1, -1)
    expected = tuple(logits.shape[:-1])
    targets = target.reshape(1) if input.dim() == 1 and target.dim() == 0 else target
    if tuple(targets.shape) != expected:
        raise ValueError(
            f"max_softmax: cross_entropy target of shape {tuple(target.shape)} does not match "
            f"input of shape {tuple(input.shape)}"
        )
    classes = logits.shape[-1]
    logits = logits.reshape(-1, classes).contiguous()
    targets = targets.reshape(-1).to(torch.int64).contiguous()
    fn = pick(_FUNCTIONS, logits, targets)
    compiling = fn is TRACED or fn is _FUNCTIONS[2]
    if not input.is_cuda and not compiling:
        # On the host numpy checks in a fraction of torch's time (65536
        # targets: 41 vs 630 us); CUDA targets are not checked (a host sync).
        check_targets_in_range(_host_values(targets, expected), classes, ignore_index)
    if inplace_backward and (weight is not None or z_loss or cap):
        raise NotImplementedError(
            "max_softmax: cross_entropy(inplace_backward=True) takes no weight, z_loss or "
            "softcap yet; leave inplace_backward off for them"
        )
    if inplace_backward and logits.requires_grad and not compiling:
        loss = cross_entropy_inplace(logits, targets, ignore_index, reduction, eps)
    elif fn is None or fn is TRACED:
        loss, _ = _cross_entropy_rows(logits, targets, ignore_index, reduction, eps, False, extras)
    else:
        loss = fn.apply(logits, targets, ignore_index, reduction, eps, extras, [])
    if reduction == "none":
        return loss.reshape(target.shape)
    return loss.reshape(())
