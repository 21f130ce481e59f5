"""Fused linear + cross-entropy for torch, and cross-entropy whose gradient
overwrites the logits.

    from max_softmax.torch import linear_cross_entropy
    loss = linear_cross_entropy(hidden, head.weight, target)  # F.linear + F.cross_entropy
    loss.backward()  # hidden.grad, head.weight.grad

`linear_cross_entropy` never holds all the logits. Over chunks of rows it
runs: logits_c = h_c W^T (+ bias) by torch's matmul (cuBLAS on CUDA); our
fused cross-entropy kernel writes the rows' losses and d loss / d logits_c
over logits_c, in place (one buffer reused chunk after chunk); then
dh_c = dlogits_c W and dW += dlogits_c^T h_c (dbias += the column sums),
with the mean's 1 / (rows kept) folded into the GEMMs' alpha. The forward
computes the gradients (as Liger's fused linear cross-entropy does) and the
backward only scales them by the incoming gradient; for reduction "none"
(a gradient a row, unknown in the forward) the backward runs the chunks
again.

Memory beyond the inputs, outputs and gradients: the chunk buffer(s),
`chunk_rows x V` logits each, sized by `chunk_bytes=` (default
`CHUNK_BYTES`; see `chunk_rows_for`),
plus a loss a row. On CUDA two buffers take turns so that chunk i's
cross-entropy (on MAX's queue, reached from a side stream) runs while
chunk i+1's logits GEMM runs on torch's stream (`overlap=True`); the
chunk is halved to keep the budget.

z_loss, softcap and class weights (`class_weight=`: `weight=` is the
linear layer's) run the extended cross-entropy terms (op/cpu_ce_options.mojo,
on the GPU op/gpu_cross_entropy.mojo's launch) through the launch extension as the plain
options do; its gradient carries the softcap's
1 - tanh^2 and the z-loss term, so the GEMMs after it are unchanged.

In place: every GPU kernel family of the cross-entropy (register, smem,
pair and block rows, op/gpu_ce_*.mojo, and the extended options' rows)
loads each element of a row, and the target's logit, before any thread
writes that element, so dlogits may be the logits' own memory. The plain
CPU kernel (op/cpu_cross_entropy.mojo) parks exp(x - max) in the gradient
row for float32/float64 and reads the target's logit (and, for label
smoothing, the row's sum) after, so there the gradient goes to a buffer of
its own (`inplace_safe`); 16-bit rows park in a scratch row and are safe,
and so is the extended CPU kernel (it reads the target's logit in its
first pass and each element before writing it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch.autograd.function import once_differentiable

from ..models import cross_entropy_into_model
from ..validation import (
    EMPTY_LOSS,
    check_cross_entropy_options,
    check_linear_class_weight,
    check_linear_cross_entropy_dtypes,
    check_linear_cross_entropy_options,
    check_linear_cross_entropy_shapes,
    check_targets_in_range,
)
from . import _buffers as torch_buffers
from . import _launch as torch_launch
from ._buffers import DTYPES
from ._options import options_tensor

CHUNK_BYTES = 512 * 2**20
"""The least default `chunk_bytes=` of `linear_cross_entropy`: bytes of
logits the chunk buffers hold in all (both buffers together where they take
turns): 512 MiB, 2048 rows of a bf16 128256-class head, against 4.2 GB for
the whole bf16 logits and their gradient at 8192 x 128256. Why not less:
each chunk's dW += dlogits_c^T h_c reads and writes all of dW (1 GB at
128256 x 4096 bf16) for 2 x rows x H x V flops, so below ~1024 rows a chunk
(bf16 on an H100: ~300 flops a byte) that GEMM turns memory-bound."""

CHUNK_LOGITS_SHARE = 8
"""Past `CHUNK_BYTES`, the default budget is 1 / CHUNK_LOGITS_SHARE of the
whole logits' bytes (up to `CHUNK_BYTES_MAX`): fewer chunks, so fewer dW
accumulations re-reading dW. At the Gemma-2 head (16384 x 2304 x 256000,
8.4 GB of bf16 logits) 1 GiB chunks took 89.4 ms against 512 MiB's 95.9
(H100, benchmarks/RESULTS.md). 1/8 of the logits stays under 1/16 of what
torch eager holds beyond its inputs (2.3-3.7 times the logits)."""

CHUNK_BYTES_MAX = 2**30
"""The most the default budget grows to: 2 GiB chunks gained only 1.2% more
at the Gemma-2 head for twice the memory."""


OVERLAP = False
"""The default `overlap=` of `linear_cross_entropy`: on CUDA, run chunk i's
cross-entropy beside chunk i+1's logits GEMM (two buffers). Off: on an H100
the chunks one after another in one buffer were 1-12% faster at all three
LM heads of benchmarks/RESULTS.md (the GEMMs already fill the GPU)."""

_ROW_ALIGN = 128
"""Chunks larger than this many rows are cut to a multiple of it (whole
GEMM tiles)."""


def inplace_safe(logits: torch.Tensor, extended: bool = False) -> bool:
    """Whether our cross-entropy kernel may write dlogits over `logits`
    (see the module docstring): on CUDA always, on the CPU for 16-bit types
    or under the `extended` options (z-loss, softcap, class weights)."""
    return logits.is_cuda or logits.element_size() < 4 or extended


def _options(
    device: torch.device,
    ignore_index: int,
    eps: float,
    z_loss: float = 0.0,
    cap: float = 0.0,
    class_weight: torch.Tensor | None = None,
) -> torch.Tensor:
    """The options tensor of a chunk's cross-entropy (`options_tensor`):
    (ignore_index, label_smoothing), or with z-loss, softcap or class
    weights (ignore_index, label_smoothing, z_loss, softcap[, weights])."""
    return options_tensor(device, ignore_index, eps, (class_weight, z_loss, cap))


def _extended(options: torch.Tensor) -> bool:
    """Whether `options` (of `_options`) asks for the extended family."""
    return options.numel() > 2


def cross_entropy_into(
    loss: torch.Tensor,
    dlogits: torch.Tensor | None,
    logits: torch.Tensor,
    targets: torch.Tensor,
    options: torch.Tensor,
    reduction: str,
) -> None:
    """Our cross-entropy of contiguous (rows, classes) `logits` against
    contiguous (rows,) int64 `targets` into `loss` ((1,), or (rows,) for
    "none") and, where given, `dlogits`, which may be `logits` itself where
    `inplace_safe(logits, _extended(options))`. By the launch extension
    where it is built, else by the op's
    destination-passing model on MAX buffer views; on CUDA ordered against
    torch's current stream either way, with no host wait. The caller has
    checked everything (as for torch/_launch.py)."""
    if torch_launch.available(logits.is_cuda):
        torch_launch.cross_entropy(loss, dlogits, logits, targets, options, reduction)
        return
    if torch_launch.fill_empty_cross_entropy(loss, dlogits, logits, reduction):
        return
    kind = torch_buffers.device_name(logits)  # "cpu", "gpu" or "gpu:N": its own device
    model = cross_entropy_into_model(dlogits is not None, DTYPES[logits.dtype], kind, reduction)
    head = (loss,) if dlogits is None else (loss, dlogits)
    buffers = [torch_buffers.view(t) for t in (*head, logits, targets, options)]
    if not logits.is_cuda:
        model.execute(*buffers)
        return
    stream = torch.cuda.current_stream(logits.device)
    torch_buffers.max_waits_for(stream)
    model.execute(*buffers)
    torch_buffers.waits_for_max(stream)


def _scale_by(grad: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """`grad` (a contiguous gradient) times the incoming gradient `factor`
    (one element), in place; rows left unread where the factor is 1 on
    CUDA (torch_launch.scale_rows), and not touched when a CPU factor is 1."""
    if not factor.is_cuda and not torch.compiler.is_compiling():
        if float(factor) == 1.0:
            return grad
        return grad.mul_(factor.to(grad.dtype))
    if torch_launch.available(cuda=True) and grad.numel() > 0:
        view = grad.view(-1, grad.shape[-1]) if grad.dim() > 1 else grad.view(1, -1)
        torch_launch.scale_rows(view, factor.to(grad.dtype).reshape(1).contiguous())
        return grad
    return grad.mul_(factor.to(grad.dtype))


# ---------------------------------------------------------------------------
# Cross-entropy with the gradient written over the logits (inplace_backward).


class _CrossEntropyInplace(torch.autograd.Function):
    """Cross-entropy whose forward writes d loss / d logits over the logits'
    memory (no second buffer); backward scales it in place and hands it on."""

    @staticmethod
    def forward(logits, targets, ignore_index, reduction, eps):  # type: ignore[override]
        rows, _ = logits.shape
        loss = torch.empty(
            (rows,) if reduction == "none" else (1,), dtype=logits.dtype, device=logits.device
        )
        options = _options(logits.device, ignore_index, eps)
        if inplace_safe(logits):
            cross_entropy_into(loss, logits, logits, targets, options, reduction)
        else:  # the CPU float32/float64 kernel reads the logits after writing
            dlogits = torch.empty_like(logits)
            cross_entropy_into(loss, dlogits, logits, targets, options, reduction)
            logits.copy_(dlogits)
        return loss

    @staticmethod
    def setup_context(ctx, inputs, output):  # type: ignore[override]
        logits, _, _, reduction, _ = inputs
        ctx.grad = logits.detach()  # the memory now holds d loss / d logits
        ctx.reduction = reduction

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_loss):  # type: ignore[override]
        dlogits, ctx.grad = ctx.grad, None
        if dlogits is None:
            raise RuntimeError(
                "max_softmax: cross_entropy(inplace_backward=True) overwrote the logits with "
                "their gradient: it cannot run backward twice (retain_graph)"
            )
        if ctx.reduction == "none":
            dlogits.mul_(grad_loss.to(dlogits.dtype)[:, None])
        else:
            _scale_by(dlogits, grad_loss)
        return dlogits, None, None, None, None


def cross_entropy_inplace(
    logits: torch.Tensor, targets: torch.Tensor, ignore_index: int, reduction: str, eps: float
) -> torch.Tensor:
    """Cross-entropy of contiguous (rows, classes) `logits` (requiring
    grad) against contiguous (rows,) int64 `targets`, the gradient written
    over the logits' memory: the loss, (1,) or (rows,) for "none", in the
    logits' dtype. The caller (`max_softmax.torch.cross_entropy` with
    `inplace_backward=True`) has checked the arguments. The logits hold
    d loss / d logits once this returns: nothing else may read them (an op
    that saved them for its own backward would read the gradient)."""
    if logits.numel() == 0:
        loss = torch.full(
            (logits.shape[0],) if reduction == "none" else (1,),
            EMPTY_LOSS[reduction],
            dtype=logits.dtype,
            device=logits.device,
        )
        return loss + 0 * logits.sum()
    return _CrossEntropyInplace.apply(logits, targets, ignore_index, reduction, eps)


# ---------------------------------------------------------------------------
# Fused linear + cross-entropy.


def chunk_rows_for(
    rows: int, classes: int, itemsize: int, buffers: int, chunk_bytes: int | None = None
) -> int:
    """Rows a chunk of `linear_cross_entropy` takes: as many as keep
    `buffers` chunk buffers of (rows, classes) logits within `chunk_bytes`
    (default `default_chunk_bytes`), at least 1, at most `rows`, cut to a
    multiple of 128 above 128."""
    per_row = max(1, classes * itemsize * buffers)
    if chunk_bytes is None:
        chunk_bytes = default_chunk_bytes(rows * classes * itemsize)
    c = max(1, chunk_bytes // per_row)
    if c > _ROW_ALIGN:
        c -= c % _ROW_ALIGN
    return max(1, min(c, rows))


def default_chunk_bytes(logits_bytes: int) -> int:
    """The chunk budget for logits of `logits_bytes` in all: `CHUNK_BYTES`,
    or 1 / `CHUNK_LOGITS_SHARE` of them where that is more, at most
    `CHUNK_BYTES_MAX`."""
    return max(CHUNK_BYTES, min(logits_bytes // CHUNK_LOGITS_SHARE, CHUNK_BYTES_MAX))


@dataclass(frozen=True)
class _Args:
    """The non-tensor arguments of one call."""

    ignore_index: int
    reduction: str
    eps: float
    chunk_rows: int | None
    kept: float
    chunk_bytes: int | None = None
    overlap: bool = False
    """Rows whose target is not ignore_index (for "mean"); with class
    weights, the sum of their targets' weights (torch's divisor)."""


@dataclass
class _State:
    """Gradients the forward computed, handed to the first backward."""

    grads: tuple | None = field(default=None)


def _acc(dtype: torch.dtype) -> torch.dtype:
    """The accumulator type of `dtype`: float64 for float64, else float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def _passes(
    h: torch.Tensor,
    w: torch.Tensor,
    b: torch.Tensor | None,
    targets: torch.Tensor,
    options: torch.Tensor,
    args: _Args,
    *,
    with_grad: bool,
    want: tuple[bool, bool, bool] = (False, False, False),
    alpha: float = 1.0,
    row_scale: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
    """The chunked linear + cross-entropy of (N, H) `h`, (V, H) `w`, (V,) `b`
    and (N,) int64 `targets` under the kernels' float64 `options`
    (`_options`): (row losses (N,) in h's dtype, dh, dw, db),
    the gradients those of `want` (dh, dw, db) when `with_grad`, of the sum
    of the row losses times `alpha` (and each row by `row_scale`)."""
    rows, _ = h.shape
    classes = w.shape[0]
    device, dtype = h.device, h.dtype
    losses = torch.empty((rows,), dtype=dtype, device=device)
    dh = torch.empty_like(h) if with_grad and want[0] else None
    dw = torch.empty_like(w) if with_grad and want[1] else None
    db = (
        torch.zeros((classes,), dtype=_acc(dtype), device=device) if with_grad and want[2] else None
    )
    inplace = inplace_safe(h, _extended(options))
    overlap = with_grad and args.overlap and h.is_cuda
    nbuf = 2 if overlap else 1
    chunk = args.chunk_rows or chunk_rows_for(
        rows,
        classes,
        h.element_size(),
        nbuf + (0 if inplace or not with_grad else 1),
        args.chunk_bytes,
    )
    chunk = max(1, min(chunk, rows))
    ranges = [(lo, min(rows, lo + chunk)) for lo in range(0, rows, chunk)]
    overlap = overlap and len(ranges) > 1
    nbuf = 2 if overlap else 1
    bufs = [torch.empty((chunk, classes), dtype=dtype, device=device) for _ in range(nbuf)]
    grad_buf = None if inplace or not with_grad else torch.empty_like(bufs[0])
    wt = w.t()
    first = [True]

    def logits_of(lo: int, hi: int, out: torch.Tensor) -> None:
        if b is None:
            torch.mm(h[lo:hi], wt, out=out)
        else:
            torch.addmm(b, h[lo:hi], wt, out=out)

    def cross_entropy_of(lo: int, hi: int, logits: torch.Tensor) -> torch.Tensor | None:
        g = None
        if with_grad:
            g = logits if grad_buf is None else grad_buf[: hi - lo]
        cross_entropy_into(losses[lo:hi], g, logits, targets[lo:hi], options, "none")
        return g

    def grads_of(lo: int, hi: int, g: torch.Tensor) -> None:
        if row_scale is not None:
            g.mul_(row_scale[lo:hi, None].to(dtype))
        if dh is not None:
            dh[lo:hi].addmm_(g, w, beta=0, alpha=alpha)
        if dw is not None:
            dw.addmm_(g.t(), h[lo:hi], beta=0 if first[0] else 1, alpha=alpha)
            first[0] = False
        if db is not None:
            db.add_(g.sum(0, dtype=db.dtype), alpha=alpha)

    if not overlap:
        for lo, hi in ranges:
            logits = bufs[0][: hi - lo]
            logits_of(lo, hi, logits)
            g = cross_entropy_of(lo, hi, logits)
            if g is not None:
                grads_of(lo, hi, g)
    else:
        main = torch.cuda.current_stream(device)
        side = _side_stream(device)
        pending: list[tuple[int, int, torch.Tensor, torch.cuda.Event]] = []
        for i, (lo, hi) in enumerate(ranges):
            logits = bufs[i % nbuf][: hi - lo]
            logits_of(lo, hi, logits)
            side.wait_stream(main)
            with torch.cuda.stream(side):
                g = cross_entropy_of(lo, hi, logits)
            done = torch.cuda.Event()
            done.record(side)
            pending.append((lo, hi, g, done))
            if len(pending) == nbuf:
                plo, phi, pg, pdone = pending.pop(0)
                main.wait_event(pdone)
                grads_of(plo, phi, pg)
        for plo, phi, pg, pdone in pending:
            main.wait_event(pdone)
            grads_of(plo, phi, pg)
        main.wait_stream(side)
    if dw is not None and first[0]:  # no rows: nothing was accumulated
        dw.zero_()
    return losses, dh, dw, None if db is None else db.to(dtype)


_side_streams: dict[torch.device, torch.cuda.Stream] = {}


def _side_stream(device: torch.device) -> torch.cuda.Stream:
    """The stream each device's chunk cross-entropies are queued from."""
    s = _side_streams.get(device)
    if s is None:
        s = _side_streams[device] = torch.cuda.Stream(device)
    return s


def _total(losses: torch.Tensor, args: _Args) -> torch.Tensor:
    """The loss from the row losses: 0-d float32 (float64 for float64) for
    "mean" (over the rows kept: NaN if none is) and "sum", (N,) for "none"."""
    acc = _acc(losses.dtype)
    if args.reduction == "none":
        return losses.to(acc)
    total = losses.sum(dtype=acc)
    if args.reduction == "mean":
        total = total / args.kept if args.kept else total * float("nan")
    return total


def _alpha(args: _Args) -> float:
    """The gradient's factor for the sum of row losses: 1 / kept for "mean"
    (0 where kept is 0: no row counts)."""
    if args.reduction != "mean":
        return 1.0
    return 1.0 / args.kept if args.kept else 0.0


class _LinearCrossEntropy(torch.autograd.Function):
    """Chunked linear + cross-entropy; for "mean"/"sum" the forward computes
    the gradients, backward scales them by the incoming gradient."""

    @staticmethod
    def forward(h, w, b, targets, options, args, want, state):  # type: ignore[override]
        if args.reduction == "none":
            losses = _passes(h, w, b, targets, options, args, with_grad=False)[0]
            return _total(losses, args)
        losses, dh, dw, db = _passes(
            h, w, b, targets, options, args, with_grad=True, want=want, alpha=_alpha(args)
        )
        state.grads = (dh, dw, db)
        return _total(losses, args)

    @staticmethod
    def setup_context(ctx, inputs, output):  # type: ignore[override]
        h, w, b, targets, options, args, want, state = inputs
        ctx.save_for_backward(h, w, b, targets, options)
        ctx.args, ctx.want, ctx.state = args, want, state

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_loss):  # type: ignore[override]
        h, w, b, targets, options = ctx.saved_tensors
        args, want = ctx.args, ctx.want
        if args.reduction == "none":
            _, dh, dw, db = _passes(
                h,
                w,
                b,
                targets,
                options,
                args,
                with_grad=True,
                want=want,
                row_scale=grad_loss.reshape(-1),
            )
        else:
            grads, ctx.state.grads = ctx.state.grads, None
            if grads is None:  # a second backward (retain_graph): run the chunks again
                grads = _passes(
                    h, w, b, targets, options, args, with_grad=True, want=want, alpha=_alpha(args)
                )[1:]
            dh, dw, db = (None if g is None else _scale_by(g, grad_loss) for g in grads)
        return dh, dw, db, None, None, None, None, None


def _check(
    input: torch.Tensor,
    weight: torch.Tensor,
    target: torch.Tensor,
    bias: torch.Tensor | None,
    class_weight: torch.Tensor | None = None,
) -> None:
    """Raise for arguments `linear_cross_entropy` cannot take."""
    named = (
        ("input", input),
        ("weight", weight),
        ("target", target),
        ("bias", bias),
        ("class_weight", class_weight),
    )
    for name, t in named:
        if t is not None and not isinstance(t, torch.Tensor):
            raise TypeError(f"max_softmax: linear_cross_entropy needs {name} as a torch.Tensor")
    if input.dtype not in DTYPES:
        raise TypeError(
            f"max_softmax: linear_cross_entropy needs a floating-point input, got {input.dtype}"
        )
    check_linear_cross_entropy_dtypes(
        input.dtype, weight.dtype, None if bias is None else bias.dtype
    )
    if target.is_floating_point() or target.is_complex() or target.dtype == torch.bool:
        raise TypeError(
            "max_softmax: linear_cross_entropy takes integer class indices as target, "
            f"got {target.dtype}"
        )
    if class_weight is not None and (class_weight.is_complex() or class_weight.dtype == torch.bool):
        raise TypeError(
            "max_softmax: linear_cross_entropy class_weight must be a real tensor, "
            f"got {class_weight.dtype}"
        )
    devices = {t.device for _, t in named if t is not None}
    if len(devices) != 1 or input.device.type not in ("cpu", "cuda"):
        raise ValueError(
            "max_softmax: linear_cross_entropy needs every tensor on one CPU or CUDA device, "
            f"got {sorted(str(d) for d in devices)}"
        )
    check_linear_cross_entropy_shapes(
        tuple(input.shape),
        tuple(weight.shape),
        None if bias is None else tuple(bias.shape),
        tuple(target.shape),
    )
    if class_weight is not None:
        check_linear_class_weight(tuple(class_weight.shape), weight.shape[0])


def _check_chunk_bytes(chunk_bytes: Any) -> int | None:
    """`chunk_bytes=` as an int >= 1, or None; else raise."""
    if chunk_bytes is None:
        return None
    if isinstance(chunk_bytes, bool) or not isinstance(chunk_bytes, int) or chunk_bytes < 1:
        raise ValueError(
            "max_softmax: linear_cross_entropy chunk_bytes must be an int >= 1, "
            f"got {chunk_bytes!r}"
        )
    return chunk_bytes


@torch.compiler.disable
def linear_cross_entropy(
    input: torch.Tensor,
    weight: torch.Tensor,
    target: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    ignore_index: int = -100,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
    z_loss: float = 0.0,
    softcap: float | None = None,
    class_weight: torch.Tensor | None = None,
    chunk_rows: int | None = None,
    chunk_bytes: int | None = None,
    overlap: bool | None = None,
) -> torch.Tensor:
    """`F.cross_entropy(F.linear(input, weight, bias), target, ...)` without
    ever holding all the logits: chunks of rows go through torch's matmul
    and our fused cross-entropy kernel (see the module docstring),
    differentiable with respect to input, weight and bias.

    Args:
        input: Hidden states (..., H), float32/float16/bfloat16/float64,
            CPU or CUDA.
        weight: (V, H) in input's dtype, as `nn.Linear(H, V).weight`.
        target: Integer class indices shaped `input.shape[:-1]`.
        bias: (V,) or None.
        ignore_index: Target value whose rows add nothing and count for
            nothing in the mean.
        reduction: "mean", "sum" or "none".
        label_smoothing: eps in [0, 1], as torch.
        z_loss: w >= 0: each kept row adds w * lse^2 (lse after the
            softcap; unweighted by class_weight, inside the "mean"), as
            `max_softmax.torch.cross_entropy`'s z_loss.
        softcap: c > 0 (None or 0: off): the logits become c * tanh(x / c)
            before everything else (Gemma 2).
        class_weight: Class weights (V,) on the input's device, as
            `F.cross_entropy`'s `weight=` (named so here: `weight` is the
            linear layer's): row loss w[t] (lse - x_t) (with smoothing as
            torch), "mean" over the sum of w[t] of the kept rows. A
            constant: not differentiated.
        chunk_rows: Rows a chunk; None chooses them by `chunk_bytes`.
        chunk_bytes: Bytes of logits the chunk buffers hold in all (None:
            `default_chunk_bytes`: 512 MiB, or 1/8 of the whole logits
            where that is more, at most 1 GiB; smaller chunks make each
            chunk's dW GEMM memory-bound).
        overlap: On CUDA, run chunk i's cross-entropy beside chunk i+1's
            logits GEMM, two buffers in the same bytes (None: `OVERLAP`,
            off: 1-12% slower on an H100, benchmarks/RESULTS.md).

    Returns:
        The loss: 0-d for "mean"/"sum", the target's shape for "none"; in
        float32 for 16-bit inputs (as Liger and Cut Cross-Entropy return
        it), else in input's dtype. Row losses are computed in float32 and
        rounded to input's dtype; the reduction sums them in float32.

    For "mean" the count of kept rows (with class weights, the sum of
    their weights) is read to the host once (a sync on CUDA). z_loss,
    softcap and class weights run the extended cross-entropy kernel
    through the launch extension, as the plain loss. The gradients are
    computed in the forward whenever input, weight or bias requires grad;
    dweight accumulates over chunks in weight's dtype (cuBLAS accumulates
    each chunk in float32).
    A target out of range (not ignore_index) raises ValueError for CPU
    tensors; on CUDA its row's loss and gradient come out NaN.
    """
    z_loss, cap = check_linear_cross_entropy_options(z_loss, softcap, chunk_rows)
    _check(input, weight, target, bias, class_weight)
    reduction, ignore_index, eps = check_cross_entropy_options(
        reduction, ignore_index, label_smoothing
    )
    chunk_bytes = _check_chunk_bytes(chunk_bytes)
    overlap = OVERLAP if overlap is None else bool(overlap)
    if input.is_cuda and not torch_launch.available(cuda=True):
        torch_buffers.check_cuda_device(input)
    hidden = input.shape[-1]
    classes = weight.shape[0]
    h = input.reshape(-1, hidden).contiguous()
    w = weight.contiguous()
    b = None if bias is None else bias.contiguous()
    targets = target.reshape(-1).to(torch.int64).contiguous()
    rows = h.shape[0]
    if not input.is_cuda:
        check_targets_in_range(targets.numpy(), classes, ignore_index)
    kept: float = rows
    if reduction == "mean":  # on CUDA a host sync, once
        mask = targets != ignore_index
        if class_weight is None:
            kept = int(mask.sum())
        else:
            safe = torch.where(mask, targets, torch.zeros_like(targets))
            cw = class_weight.detach().to(torch.float64)
            kept = float((cw[safe] * mask).sum())
    args = _Args(ignore_index, reduction, eps, chunk_rows, kept, chunk_bytes, overlap)
    want = tuple(
        t is not None and t.requires_grad and torch.is_grad_enabled() for t in (input, weight, bias)
    )
    if rows == 0 or classes == 0:
        return _empty(input, weight, bias, target, reduction)
    options = _options(h.device, ignore_index, eps, z_loss, cap, class_weight)
    if any(want):
        loss = _LinearCrossEntropy.apply(h, w, b, targets, options, args, want, _State())
    else:
        with torch.no_grad():
            loss = _total(_passes(h, w, b, targets, options, args, with_grad=False)[0], args)
    return loss.reshape(target.shape) if reduction == "none" else loss


def _empty(
    input: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    target: torch.Tensor,
    reduction: str,
) -> torch.Tensor:
    """The loss with no rows or no classes (torch's empty sum and mean),
    connected to the inputs so that backward gives zero gradients."""
    acc = _acc(input.dtype)
    shape = tuple(target.shape) if reduction == "none" else ()
    loss = torch.full(shape, EMPTY_LOSS[reduction], dtype=acc, device=input.device)
    zero = input.sum() * 0 + weight.sum() * 0
    if bias is not None:
        zero = zero + bias.sum() * 0
    return loss + zero.to(acc)
