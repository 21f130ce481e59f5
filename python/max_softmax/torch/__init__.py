"""PyTorch bridge: our Mojo kernels on `torch.Tensor`s, with autograd.

    from max_softmax.torch import softmax, log_softmax, Softmax, cross_entropy
    y = softmax(x, dim=-1)          # instead of torch.softmax(x, dim=-1)
    loss = F.nll_loss(log_softmax(logits, dim=-1), target); loss.backward()
    loss = cross_entropy(logits, target); loss.backward()  # fused, F.cross_entropy

Runs on CPU and CUDA tensors; dtype and device follow the input, like
`torch.softmax`. The backward passes use our `softmax_backward` /
`log_softmax_backward` ops. Needs the `[torch]` extra; `import max_softmax`
works without torch.

A call is lean: torch allocates the output, and the op's destination-passing
model (`models.into_model`, one per (op, dtype, device), every shape) writes
into it through MAX buffer views of the tensors' memory that are made once
and reused (`torch_buffers`), with no copy, no host synchronisation and no
dispatcher between. On CUDA, with `MAX_SOFTMAX_TORCH_REPLAY=1`, a call that
recurs on the same memory replays a captured device graph (`torch_replay`).
Under `torch.compile` the op is a registered torch custom op
(`max_softmax::<op>`, opaque to the compiler) around the same call.
"""

from __future__ import annotations

from typing import Any

import torch

from ..models import cross_entropy_into_model, into_model, masked_into_model
from ..registry import OPS, op_spec
from ..validation import (
    EMPTY_LOSS,
    check_cross_entropy_options,
    check_mask_dtype,
    check_masked_options,
    check_targets_in_range,
    is_masked_call,
    mask_suffix,
    masked_view,
    normalize_axis,
)
from . import _buffers as torch_buffers
from . import _launch as torch_launch
from . import _replay as torch_replay
from ._buffers import DTYPES


def _call(name: str, out: torch.Tensor, *inputs: torch.Tensor) -> None:
    """Write op `name` of (outer, n, inner) tensors `inputs` into `out`: by
    the launch extension (torch_launch), else by its destination-passing
    model or a replay of its captured graph (MAX_SOFTMAX_TORCH_LAUNCH=graph)."""
    if torch_launch.available(out.is_cuda):
        outer, n, inner = out.shape
        torch_launch.run(name, out, *inputs, outer=outer, n=n, inner=inner)
        return
    model = into_model(name, DTYPES[out.dtype], "gpu" if out.is_cuda else "cpu")
    _execute(model, (out, *inputs), replay_key=name)


def _execute(model: Any, tensors: tuple[torch.Tensor, ...], replay_key: str | None = None) -> None:
    """Run `model` on reused buffer views of `tensors` (torch_buffers); on
    CUDA ordered against torch's stream on the device, and replayed where
    `replay_key` is given and replay is on."""
    first = tensors[0]
    if not first.is_cuda:
        model.execute(*(torch_buffers.view(t) for t in tensors))
        return
    stream = torch.cuda.current_stream(first.device)
    torch_buffers.max_waits_for(stream)
    replay = replay_key is not None and torch_replay.enabled() and torch_replay.CACHE.active
    if not (replay and torch_replay.CACHE.run(model, replay_key, tensors, torch_buffers.view)):
        model.execute(*(torch_buffers.view(t) for t in tensors))
    torch_buffers.waits_for_max(stream)


def _register(name: str) -> object:
    """Op `name` as a torch custom op mutating its first argument, for
    torch.compile (whose tracer cannot see into MAX). torch reads the op's
    schema from the signature, so each arity gets its own."""
    if op_spec(name).arity == 1:

        def run1(out: torch.Tensor, x: torch.Tensor) -> None:
            _call(name, out, x)

        fn = run1
    else:

        def run2(out: torch.Tensor, a: torch.Tensor, dy: torch.Tensor) -> None:
            _call(name, out, a, dy)

        fn = run2
    return torch.library.custom_op(f"max_softmax::{name}", fn, mutates_args=("out",))


# Registered at import, not on first use: torch.compile(fullgraph=True) must
# not trace their construction. Kernels still compile lazily, on first call.
_TORCH_OPS = {name: _register(name) for name, spec in OPS.items() if spec.kind == "row"}


def _dims(shape: torch.Size, dim: int) -> tuple[int, int, int]:
    """The (outer, n, inner) dims of `shape` along `dim` (>= 0), without
    numpy: this is the bridge's per-call path."""
    outer = 1
    for s in shape[:dim]:
        outer *= s
    inner = 1
    for s in shape[dim + 1 :]:
        inner *= s
    return outer, shape[dim], inner


def _canonical(t: torch.Tensor, dim: int) -> torch.Tensor:
    """A contiguous (outer, n, inner) view of `t` along `dim`."""
    return t.contiguous().view(*_dims(t.shape, dim))


_plans: dict[tuple, torch_launch.Launcher] = {}
"""Launches of the bridge's row ops by (op, dim, shape, dtype, device) of
the first tensor, made once that call passed `_run`'s checks: a repeated
call (a training step's forward and backward) skips straight to the launch."""

PLAN_LIMIT = 4096
"""Plans kept at most: past it they are dropped and remade as calls come (a
model whose shapes never repeat must not grow the table without end)."""


def _run(name: str, dim: int, *tensors: torch.Tensor) -> torch.Tensor:
    """Row op `name` of `tensors` along `dim` into a new tensor. Later
    tensors (a backward's dy, from autograd) must be like the first; the
    checks run once per shape, dtype and device (`_plans` then launches)."""
    first = tensors[0]
    launch = _plans.get((name, dim, first.shape, first.dtype, first.device))
    if launch is not None and not torch.compiler.is_compiling():
        out = torch.empty_like(first, memory_format=torch.contiguous_format)
        launch(out, *[t if t.is_contiguous() else t.contiguous() for t in tensors])
        return out
    return _run_checked(name, dim, *tensors)


def _run_checked(name: str, dim: int, *tensors: torch.Tensor) -> torch.Tensor:
    """`_run` for a call no plan covers: check, run, and keep a plan for the
    launch path."""
    first = tensors[0]
    if first.dtype not in DTYPES:
        raise TypeError(f"max_softmax: softmax needs a floating-point tensor, got {first.dtype}")
    axis = normalize_axis(dim, first.dim())
    for t in tensors[1:]:
        if (t.shape, t.dtype, t.device) != (first.shape, first.dtype, first.device):
            raise ValueError(
                f"max_softmax: {name} needs tensors of one shape, dtype and device: got "
                f"{t.dtype}{list(t.shape)} on {t.device} for {first.dtype}{list(first.shape)} "
                f"on {first.device}"
            )
    if first.device.type not in ("cpu", "cuda"):
        raise ValueError(f"max_softmax: no {name} for tensors on {first.device}")
    # The launch path runs on any CUDA device (MAX's Accelerator(index));
    # the graph path on cuda:0 only.
    launching = torch_launch.available(first.is_cuda)
    if first.is_cuda and not launching:
        torch_buffers.check_cuda_device(first)
    out = torch.empty_like(first, memory_format=torch.contiguous_format)
    if first.numel() == 0:
        return out
    if launching and not torch.compiler.is_compiling():
        # Raw addresses and dims: no (outer, n, inner) views to make.
        launch = torch_launch.launcher(name, first, *_dims(first.shape, axis))
        launch(out, *[t.detach().contiguous() for t in tensors])
        if len(_plans) >= PLAN_LIMIT:
            _plans.clear()
        _plans[(name, dim, first.shape, first.dtype, first.device)] = launch
        return out
    views = [_canonical(t.detach(), axis) for t in tensors]
    out3 = out.view(views[0].shape)
    if torch.compiler.is_compiling():  # the tracer sees a torch custom op
        _TORCH_OPS[name](out3, *views)
    else:  # eager: no dispatcher between
        _call(name, out3, *views)
    return out


def _differentiable(forward: str) -> type[torch.autograd.Function]:
    """An autograd Function running op `forward`, whose gradient is its
    backward op (registry) applied to the saved output and the incoming gradient."""
    backward = op_spec(forward).backward

    class RowOp(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x: torch.Tensor, dim: int) -> torch.Tensor:
            out = _run(forward, dim, x)
            ctx.save_for_backward(out)
            ctx.dim = dim
            return out

        @staticmethod
        def backward(ctx, dy: torch.Tensor):
            (out,) = ctx.saved_tensors
            return _run(backward, ctx.dim, out, dy), None

    RowOp.__name__ = RowOp.__qualname__ = f"MaxSoftmax_{forward}"
    return RowOp


_Softmax = _differentiable("softmax")
_LogSoftmax = _differentiable("log_softmax")


def _needs_grad(x: torch.Tensor) -> bool:
    """Whether autograd must record this call (else the Function's ~10 µs
    of bookkeeping a call is skipped)."""
    return x.requires_grad and torch.is_grad_enabled()


def softmax(
    x: torch.Tensor,
    dim: int = -1,
    *,
    scale: float | None = None,
    mask: torch.Tensor | None = None,
    causal: bool = False,
) -> torch.Tensor:
    """`torch.softmax(x, dim)` computed by our kernels, differentiable.

    With `scale`, `mask` (boolean, True keeps, or floating, added after
    scaling; broadcastable to x) or `causal` (over the last two dims, row i
    keeps columns j <= i): the softmax of `x * scale + mask`, fused in one
    kernel; a row with nothing kept gives zeros. Gradients flow to x only
    (masked positions get 0), not to a floating mask.
    """
    if is_masked_call(scale, mask, causal):
        return _masked("softmax", x, dim, scale, mask, causal)
    return _Softmax.apply(x, dim) if _needs_grad(x) else _run("softmax", dim, x)


def log_softmax(
    x: torch.Tensor,
    dim: int = -1,
    *,
    scale: float | None = None,
    mask: torch.Tensor | None = None,
    causal: bool = False,
) -> torch.Tensor:
    """`torch.log_softmax(x, dim)` computed by our kernels, differentiable.

    `scale`, `mask`, `causal` as for `softmax`; a row with nothing kept
    gives -inf, and masked positions (output -inf) get gradient 0, as
    `masked_fill(~mask, -inf)` followed by torch's log_softmax.
    """
    if is_masked_call(scale, mask, causal):
        return _masked("log_softmax", x, dim, scale, mask, causal)
    return _LogSoftmax.apply(x, dim) if _needs_grad(x) else _run("log_softmax", dim, x)


# Scaled, masked and causal softmax: the fused masked ops (op/masked_softmax_ops),
# run by their own destination-passing models (models.masked_into_model) on
# an (outer, L, n) view of x, a (mask_rows, n) additive mask and a float64
# (scale,) options tensor.

_small_tensors: dict[tuple, torch.Tensor] = {}


def _cached(key: tuple, make: Any) -> torch.Tensor:
    """A small tensor made once per key (on CUDA a fresh one would cost a
    copy from the host every call)."""
    t = _small_tensors.get(key)
    if t is None:
        t = make()
        if len(_small_tensors) >= 64:
            _small_tensors.clear()
        _small_tensors[key] = t
    return t


def _call_masked(
    out: torch.Tensor,
    x: torch.Tensor,
    mask: torch.Tensor,
    options: torch.Tensor,
    log_out: bool,
    has_mask: bool,
    causal: bool,
) -> None:
    op = "log_softmax_masked" if log_out else "softmax_masked"
    kind = "gpu" if out.is_cuda else "cpu"
    model = masked_into_model(op, DTYPES[out.dtype], kind, has_mask, causal)
    _execute(model, (out, x, mask, options))


@torch.library.custom_op("max_softmax::softmax_masked", mutates_args=("out",))
def _masked_op(
    out: torch.Tensor,
    x: torch.Tensor,
    mask: torch.Tensor,
    options: torch.Tensor,
    log_out: bool,
    has_mask: bool,
    causal: bool,
) -> None:
    """The masked op as a torch custom op, for torch.compile."""
    _call_masked(out, x, mask, options, log_out, has_mask, causal)


def _run_masked(
    x: torch.Tensor, mask: torch.Tensor | None, value: float, log_out: bool, causal: bool
) -> torch.Tensor:
    """The masked op on `x` along its last dim with `mask` already (rows, n)."""
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    if x.numel() == 0:
        return out
    x3 = x.detach().contiguous().view(masked_view(list(x.shape)))
    options = _cached(
        ("options", x.device, value),
        lambda: torch.tensor([value], dtype=torch.float64, device=x.device),
    )
    m = mask
    if m is None:
        m = _cached(
            ("no mask", x.device, x.dtype),
            lambda: torch.zeros((1, 1), dtype=x.dtype, device=x.device),
        )
    out3 = out.view(x3.shape)
    if torch.compiler.is_compiling():
        _masked_op(out3, x3, m, options, log_out, mask is not None, causal)
    else:
        _call_masked(out3, x3, m, options, log_out, mask is not None, causal)
    return out


class _MaskedFn(torch.autograd.Function):
    """The masked op, differentiable in x: dx = scale * the backward op of
    the output; log-softmax's masked positions (-inf) get 0."""

    @staticmethod
    def forward(ctx, x, mask, value, log_out, causal):  # type: ignore[override]
        out = _run_masked(x, mask, value, log_out, causal)
        ctx.save_for_backward(out)
        ctx.args = (value, log_out)
        return out

    @staticmethod
    def backward(ctx, dy):  # type: ignore[override]
        (out,) = ctx.saved_tensors
        value, log_out = ctx.args
        name = "log_softmax_backward" if log_out else "softmax_backward"
        dx = _run(name, -1, out, dy)
        if value != 1.0:
            dx.mul_(value)
        if log_out:  # dropped positions: the gradient of masked_fill, 0
            dx.masked_fill_(out == float("-inf"), 0.0)
        return dx, None, None, None, None


def _masked(
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
    if x.device.type not in ("cpu", "cuda"):
        raise ValueError(f"max_softmax: no {op} for tensors on {x.device}")
    if x.is_cuda:
        torch_buffers.check_cuda_device(x)
    dim = normalize_axis(dim, x.dim())
    value, causal = check_masked_options(op, scale, causal, x.dim(), dim)
    last = dim == x.dim() - 1
    work = x if last else x.movedim(dim, -1)
    m = None
    if mask is not None:
        if not isinstance(mask, torch.Tensor):
            raise TypeError(f"max_softmax: {op} needs the mask as a torch.Tensor, got {type(mask)}")
        check_mask_dtype(op, mask.dtype == torch.bool, mask.is_floating_point(), mask.dtype)
        if mask.device != x.device:
            raise ValueError(
                f"max_softmax: {op} needs the mask on the input's device ({x.device}), "
                f"got {mask.device}"
            )
        k = mask_suffix(op, list(x.shape), list(mask.shape), last)
        m = mask.detach()
        if m.dtype == torch.bool:
            zero = torch.zeros((), dtype=x.dtype, device=x.device)
            m = torch.where(m, zero, torch.full_like(zero, float("-inf")))
        else:
            m = m.to(x.dtype)
        if not k:  # one mask row per row of x
            m = m.expand(x.shape)
            m = m if last else m.movedim(dim, -1)
        m = m.contiguous().reshape(-1, x.shape[-1] if last else x.shape[dim])
    log_out = op == "log_softmax"
    if _needs_grad(x):
        y = _MaskedFn.apply(work, m, value, log_out, causal)
    else:
        y = _run_masked(work, m, value, log_out, causal)
    return y if last else y.movedim(-1, dim)


class Softmax(torch.nn.Module):
    """Drop-in for `torch.nn.Softmax(dim)`."""

    def __init__(self, dim: int = -1):
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Softmax of `x` along `self.dim`."""
        return softmax(x, self.dim)


# Cross-entropy: a loss op with two outputs (loss, dlogits), int64 targets
# and a float64 options tensor (ignore_index, label_smoothing), run by its
# own destination-passing models (models.cross_entropy_into_model).


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
    kind = "gpu" if logits.is_cuda else "cpu"
    _execute(cross_entropy_into_model(with_grad, DTYPES[logits.dtype], kind, reduction), tensors)


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


def _options(device: torch.device, ignore_index: int, eps: float) -> torch.Tensor:
    """The (ignore_index, label_smoothing) float64 tensor the kernels read,
    made once per (device, values)."""
    return _cached(
        ("cross_entropy", device, ignore_index, eps),
        lambda: torch.tensor([ignore_index, eps], dtype=torch.float64, device=device),
    )


def _cross_entropy_rows(
    logits: torch.Tensor,
    targets: torch.Tensor,
    ignore_index: int,
    reduction: str,
    eps: float,
    with_grad: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(loss, dlogits or None) of contiguous (rows, classes) `logits` and
    (rows,) int64 `targets`: the loss (1,) for "mean"/"sum", (rows,) for
    "none"."""
    rows, classes = logits.shape
    loss = torch.empty(
        (rows,) if reduction == "none" else (1,), dtype=logits.dtype, device=logits.device
    )
    dlogits = torch.empty_like(logits) if with_grad else None
    if rows == 0 or classes == 0:
        loss.fill_(EMPTY_LOSS[reduction])
        if dlogits is not None:
            dlogits.zero_()
        return loss, dlogits
    options = _options(logits.device, ignore_index, eps)
    # Without the gradient the op ignores `dlogits`: any tensor will do.
    grad_out = dlogits if dlogits is not None else loss
    if torch.compiler.is_compiling():
        _cross_entropy_op(loss, grad_out, logits, targets, options, reduction, with_grad)
    else:
        head = (loss, grad_out) if with_grad else (loss,)
        _call_cross_entropy(reduction, with_grad, (*head, logits, targets, options))
    return loss, dlogits


class _CrossEntropy(torch.autograd.Function):
    """Cross-entropy whose forward also writes the gradient (one fused pass
    over the logits); backward hands that gradient on, scaled in place."""

    @staticmethod
    def forward(ctx, logits, targets, ignore_index, reduction, eps):  # type: ignore[override]
        loss, dlogits = _cross_entropy_rows(logits, targets, ignore_index, reduction, eps, True)
        ctx.save_for_backward(logits, targets)
        # Held outside save_for_backward: the first backward gives it away
        # (scaled in place, or as it is), so torch's version check on saved
        # tensors would refuse a second backward that never reads it.
        ctx.dlogits = dlogits
        ctx.args = (ignore_index, reduction, eps)
        return loss

    @staticmethod
    def backward(ctx, grad_loss):  # type: ignore[override]
        logits, targets = ctx.saved_tensors
        ignore_index, reduction, eps = ctx.args
        dlogits, ctx.dlogits = ctx.dlogits, None
        if dlogits is None:  # a second backward (retain_graph): compute it again
            dlogits = _cross_entropy_rows(logits, targets, ignore_index, reduction, eps, True)[1]
        none = (None, None, None, None)
        # A loss backpropagated as is (grad 1) passes dlogits on untouched;
        # the check reads a CPU scalar only (on CUDA it would sync the host;
        # under torch.compile it would break the graph).
        if (
            not grad_loss.is_cuda
            and reduction != "none"
            and not torch.compiler.is_compiling()
            and float(grad_loss) == 1.0
        ):
            return (dlogits, *none)
        # "none": a gradient a row; "mean"/"sum": one scalar (shape (1,)).
        if (
            dlogits.is_cuda
            and torch_launch.available(cuda=True)
            and not torch.compiler.is_compiling()
        ):
            # Rows whose factor is 1 (loss.backward()) are left unread.
            factor = grad_loss.to(dlogits.dtype).contiguous()
            torch_launch.scale_rows(dlogits, factor)
            return (dlogits, *none)
        scale = grad_loss[:, None] if reduction == "none" else grad_loss
        return (dlogits.mul_(scale), *none)


def cross_entropy(
    input: torch.Tensor,
    target: torch.Tensor,
    weight: torch.Tensor | None = None,
    size_average: bool | None = None,
    ignore_index: int = -100,
    reduce: bool | None = None,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
) -> torch.Tensor:
    """`torch.nn.functional.cross_entropy(input, target, ...)` computed by
    our fused kernels, differentiable: the forward writes d loss / d input
    too, and backward only scales it.

    Args:
        input: Logits (C,), (N, C) or (N, C, d1, ...): classes on dim 1 (or
            0 for 1-D), as torch; float32/float16/bfloat16/float64, CPU or CUDA.
        target: Integer class indices, (), (N,) or (N, d1, ...).
        weight: Not supported (must be None).
        size_average: Deprecated in torch; must be None.
        ignore_index: Target value whose rows add nothing and count for
            nothing in the mean.
        reduce: Deprecated in torch; must be None.
        reduction: "mean", "sum" or "none".
        label_smoothing: eps in [0, 1].

    Returns:
        The loss in the input's dtype: 0-d for "mean"/"sum", the target's
        shape for "none".

    An out-of-range target (not ignore_index) raises ValueError for CPU
    tensors; on CUDA it is not checked (that would sync with the host):
    its row's loss and gradient come out NaN, and so does a reduced loss.
    """
    if weight is not None:
        raise NotImplementedError("max_softmax: cross_entropy takes no class weights (weight=)")
    if size_average is not None or reduce is not None:
        raise ValueError(
            "max_softmax: size_average and reduce are deprecated in torch; use reduction="
        )
    reduction, ignore_index, eps = check_cross_entropy_options(
        reduction, ignore_index, label_smoothing
    )
    if input.dtype not in DTYPES:
        raise TypeError(
            f"max_softmax: cross_entropy needs floating-point logits, got {input.dtype}"
        )
    if target.is_floating_point() or target.is_complex() or target.dtype == torch.bool:
        raise NotImplementedError(
            "max_softmax: cross_entropy takes integer class indices, not class probabilities"
        )
    if input.device.type not in ("cpu", "cuda") or target.device != input.device:
        raise ValueError(
            f"max_softmax: cross_entropy needs input and target on one CPU or CUDA device, "
            f"got {input.device} and {target.device}"
        )
    if input.is_cuda and not torch_launch.available(cuda=True):
        torch_buffers.check_cuda_device(input)
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
    if not input.is_cuda and not torch.compiler.is_compiling():
        # On the host numpy checks in a fraction of torch's time (65536
        # targets: 41 vs 630 us); CUDA targets are not checked (a host sync).
        check_targets_in_range(targets.view(expected).numpy(), classes, ignore_index)
    if _needs_grad(logits):
        loss = _CrossEntropy.apply(logits, targets, ignore_index, reduction, eps)
    else:
        loss, _ = _cross_entropy_rows(logits.detach(), targets, ignore_index, reduction, eps, False)
    if reduction == "none":
        return loss.reshape(target.shape)
    return loss.reshape(())
