"""Vocab-parallel softmax, log-softmax and cross-entropy over torch.distributed.

Each rank of a process group holds a contiguous slice of the class axis, in
rank order; slices may be uneven. The widths are exchanged once per (group,
local width) and cached. A call:

1. reads the local slice once (our `sharded_row_stats` op) for each row's
   (max, sum of exp(x - max), target logit if in this slice, sum of logits);
2. gathers those rows x 4 numbers from every rank with one collective
   (`all_gather_into_tensor` on NCCL, `all_gather` on gloo) and combines
   them on every rank in rank order, so every rank gets the same result;
3. writes the output slice in one more pass (our `sharded_epilogue` op).

Cross-entropy returns the same loss on every rank; its gradient is d loss /
d (this rank's logits), as Megatron's. Its forward is steps 1-2 (the loss
needs no pass over the logits once the statistics are combined); its
backward is step 3, writing (softmax - eps/V - (1 - eps)[c == t]) * scale
with the incoming gradient folded into the scale: no communication, one
read and one write of the slice. Softmax / log-softmax backward exchange
the per-row sum of dy * y (or of dy) with one all_reduce.

Class weights (`weight=`, the whole (classes,) vector on every rank, as
torch's `F.cross_entropy` takes it) ride on the same kernels: the forward
gathers one more column (sum of w_c x_c over the slice, with label
smoothing only) in the same collective, the backward scales the
epilogue's rows by w[t] and adds the smoothing's per-class term in torch
ops.

Where the kernels run: the launch extension's `sharded_row_stats` /
`sharded_epilogue` entries once it is built (on CUDA it builds in the
background on first use; `MAX_SOFTMAX_LAUNCH=extension` waits for it);
until then our ops through a MAX graph (`Model.execute` on buffer views of
the tensors, on any device); dtypes our kernels lack go through the same
math in torch ops. `backend()` says which one a tensor gets. The
functions are opaque to torch.compile: a graph break
(`torch.compiler.disable`).
"""

from __future__ import annotations

import threading
from typing import Any

import torch
import torch.distributed as dist

from ..validation import (
    check_class_weight,
    check_cross_entropy_extras,
    check_cross_entropy_options,
    check_same_device,
)

KIND_CODES = {"softmax": 0, "log_softmax": 1, "cross_entropy": 2}
"""The `kind` argument of the launch extension's sharded entries."""

STATS_COLS = 4

__all__ = [
    "backend",
    "vocab_parallel_cross_entropy",
    "vocab_parallel_log_softmax",
    "vocab_parallel_softmax",
]


# ---------------------------------------------------------------------------
# The group: widths, offsets, the gather
# ---------------------------------------------------------------------------

_widths: dict[tuple[Any, int], tuple[int, ...]] = {}
_widths_lock = threading.Lock()


def _group_key(group: Any) -> Any:
    return "WORLD" if group is None else group


def class_widths(local: int, group: Any, device: torch.device) -> tuple[int, ...]:
    """Every rank's class width, in rank order: exchanged once per (group,
    local width) with one all_gather, then cached."""
    key = (_group_key(group), local)
    widths = _widths.get(key)
    if widths is not None:
        return widths
    world = dist.get_world_size(group)
    mine = torch.tensor([local], dtype=torch.int64, device=device)
    if _is_nccl(group):
        out = torch.empty(world, dtype=torch.int64, device=device)
        dist.all_gather_into_tensor(out, mine, group=group)
        widths = tuple(int(w) for w in out.tolist())
    else:
        parts = [torch.empty_like(mine) for _ in range(world)]
        dist.all_gather(parts, mine, group=group)
        widths = tuple(int(p.item()) for p in parts)
    with _widths_lock:
        _widths[key] = widths
    return widths


def _is_nccl(group: Any) -> bool:
    return dist.get_backend(group) == "nccl"


def _gather_stats(stats: torch.Tensor, group: Any) -> torch.Tensor:
    """Every rank's (rows, 4) statistics as (world, rows, 4), in rank order."""
    world = dist.get_world_size(group)
    if world == 1:
        return stats.unsqueeze(0)
    if _is_nccl(group):
        out = torch.empty((world, *stats.shape), dtype=stats.dtype, device=stats.device)
        dist.all_gather_into_tensor(out, stats, group=group)
        return out
    parts = [torch.empty_like(stats) for _ in range(world)]
    dist.all_gather(parts, stats, group=group)
    return torch.stack(parts)


def combine_stats(g: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Each row's global (max, sum of exp(x - max), target logit, sum of
    logits), each (rows,), from the gathered (world, rows, 4) statistics,
    folded in rank order. A row whose max is +-inf gets a NaN sum."""
    m, s, x_t, sum_x = g.unbind(-1)
    big_m = m.amax(0)
    weight = torch.where(m == big_m, torch.ones_like(m), torch.exp(m - big_m))
    total = (s * weight).sum(0)
    total = torch.where(torch.isinf(big_m), torch.full_like(total, float("nan")), total)
    return big_m, total, x_t.amax(0), sum_x.sum(0)


# ---------------------------------------------------------------------------
# The local kernels: launch extension, MAX graph, or torch ops
# ---------------------------------------------------------------------------


def _acc(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


_options: dict[tuple, torch.Tensor] = {}


def _options_for(offset: int, ignore: int, eps: float, classes: int, device) -> torch.Tensor:
    """The ops' float64 (4,) options on `device`, made once per value."""
    key = (offset, ignore, eps, classes, str(device))
    opts = _options.get(key)
    if opts is None:
        opts = torch.tensor([offset, ignore, eps, classes], dtype=torch.float64, device=device)
        if len(_options) > 256:
            _options.clear()
        _options[key] = opts
    return opts


_entries: dict[bool, tuple[Any, Any] | None] = {}


def _extension_entries(cuda: bool) -> tuple[Any, Any] | None:
    """The launch extension's (sharded_row_stats, sharded_epilogue), or None
    (not built yet, failed, or an extension without these entries)."""
    if cuda in _entries:
        return _entries[cuda]
    from .. import launch

    if not launch.available(cuda):  # on CUDA it builds in the background meanwhile
        return None
    try:
        found = launch.function("sharded_row_stats"), launch.function("sharded_epilogue")
    except ValueError:
        found = None
    _entries[cuda] = found
    return found


_FORCED = None  # tests and the bench may pin a backend: "extension", "graph", "torch"


def backend(t: torch.Tensor) -> str:
    """Which path runs the local kernels for tensors like `t`: "extension",
    "graph" or "torch" (see the module docstring)."""
    if _FORCED is not None:
        return _FORCED
    if t.dtype not in (torch.float32, torch.float16, torch.bfloat16, torch.float64):
        return "torch"
    if _extension_entries(t.is_cuda) is not None:
        return "extension"
    return "graph"


def _device_name(t: torch.Tensor) -> str:
    from ._buffers import device_name

    return device_name(t)


def _local_stats(x: torch.Tensor, t: torch.Tensor, opts: torch.Tensor, kind: str) -> torch.Tensor:
    """(rows, 4) statistics of the (rows, n) slice `x`."""
    out = torch.empty((x.shape[0], STATS_COLS), dtype=_acc(x.dtype), device=x.device)
    if x.shape[0] == 0:
        return out
    how = backend(x)
    if how == "torch":
        return _torch_stats(x, t, opts, kind)
    # log-softmax's statistics are softmax's: one kernel instance, one model.
    kind = "cross_entropy" if kind == "cross_entropy" else "softmax"
    if how == "extension":
        _launch_entry(0, x, kind, out, [x, t, opts])
    else:
        _graph_run("sharded_row_stats_into", kind, x.dtype, out, [x, t, opts])
    return out


def _local_epilogue(
    x: torch.Tensor, row_in: torch.Tensor, t: torch.Tensor, opts: torch.Tensor, kind: str
) -> torch.Tensor:
    """The (rows, n) output of `kind` from the rows' (max, sum, scale)."""
    out = torch.empty_like(x)
    if x.numel() == 0:
        return out
    how = backend(x)
    if how == "torch":
        return _torch_epilogue(x, row_in, t, opts, kind)
    if how == "extension":
        _launch_entry(1, x, kind, out, [x, row_in, t, opts])
    else:
        _graph_run("sharded_epilogue_into", kind, x.dtype, out, [x, row_in, t, opts])
    return out


def _launch_entry(which: int, x: torch.Tensor, kind: str, out, inputs) -> None:
    from .. import launch
    from ._launch import DTYPE_CODES, _context_and_stream

    fn = _extension_entries(x.is_cuda)[which]
    ctx, stream = _context_and_stream(x)
    launch.call(
        fn,
        ctx,
        stream,
        DTYPE_CODES[x.dtype],
        KIND_CODES[kind],
        out.data_ptr(),
        *[i.data_ptr() for i in inputs],
        x.shape[0],
        x.shape[1],
    )


def _graph_model(name: str, kind: str, dtype: torch.dtype, device: str):
    from max.dtype import DType
    from max.graph import BufferType, TensorType, ops

    from ..models import build_graph, compiled, device_ref
    from ._buffers import DTYPES

    md = DTYPES[dtype]
    acc = DType.float64 if md == DType.float64 else DType.float32
    ref = device_ref(device)
    rows_n = TensorType(md, ["rows", "n"], device=ref)
    tail = [TensorType(DType.int64, ["t"], device=ref), TensorType(DType.float64, [4], device=ref)]
    if name == "sharded_row_stats_into":
        types = [BufferType(acc, ["rows", STATS_COLS], device=ref), rows_n, *tail]
    else:
        types = [BufferType(md, ["rows", "n"], device=ref), rows_n]
        types += [TensorType(acc, ["rows", 3], device=ref), *tail]

    def body(*values):
        ops.inplace_custom(
            name=name, device=ref, values=list(values), out_types=[], parameters={"kind": kind}
        )
        return []

    return compiled(
        (name, kind, md, device),
        device,
        lambda: build_graph(
            f"max_softmax_{name}_{kind}_{md.name}_{device.replace(':', '')}", types, body
        ),
        f"{name} ({kind}) {md.name}",
    )


def _graph_run(name: str, kind: str, dtype: torch.dtype, out, inputs) -> None:
    from ._graph_path import execute

    execute(_graph_model(name, kind, dtype, _device_name(out)), (out, *inputs))


def _torch_stats(x, t, opts, kind) -> torch.Tensor:
    """`sharded_row_stats` in torch ops (the fallback; the same numbers)."""
    xf = x.to(_acc(x.dtype))
    m = xf.amax(-1) if x.shape[1] else torch.full_like(xf[:, 0], float("-inf"))
    lowest = torch.finfo(xf.dtype).min
    s = torch.exp(xf - m.clamp_min(lowest).unsqueeze(-1)).sum(-1)
    x_t = torch.full_like(m, float("-inf"))
    sum_x = torch.zeros_like(m)
    if kind == "cross_entropy":
        local = t - int(opts[0].item())
        inside = (local >= 0) & (local < x.shape[1])
        picked = xf.gather(1, local.clamp(0, max(x.shape[1] - 1, 0)).unsqueeze(1)).squeeze(1)
        x_t = torch.where(inside, picked, x_t)
        sum_x = xf.sum(-1)
    return torch.stack([m, s, x_t, sum_x], dim=1)


def _torch_epilogue(x, row_in, t, opts, kind) -> torch.Tensor:
    """`sharded_epilogue` in torch ops (the fallback)."""
    xf = x.to(_acc(x.dtype))
    big_m, total, scale = (c.unsqueeze(1) for c in row_in.unbind(1))
    if kind == "log_softmax":
        return ((xf - big_m) - torch.log(total)).to(x.dtype)
    p = torch.exp(xf - big_m) / total
    if kind == "softmax":
        return p.to(x.dtype)
    offset, ignore, eps, classes = opts.tolist()
    g = (p - eps / classes) * scale
    local = t - int(offset)
    inside = (local >= 0) & (local < x.shape[1])
    rows = torch.nonzero(inside).squeeze(1)
    g[rows, local[rows]] -= (1 - eps) * scale[rows, 0]
    bad = (t < 0) | (t >= int(classes))
    g = torch.where(bad.unsqueeze(1), torch.full_like(g, float("nan")), g)
    g = torch.where((t == int(ignore)).unsqueeze(1), torch.zeros_like(g), g)
    return g.to(x.dtype)


# ---------------------------------------------------------------------------
# The autograd functions
# ---------------------------------------------------------------------------


def _check_float(x: torch.Tensor, what: str) -> None:
    if x.dtype not in (torch.float32, torch.float16, torch.bfloat16, torch.float64):
        raise TypeError(f"max_softmax: {what} must be a floating-point tensor, got {x.dtype}")


def _check_group(group: Any) -> None:
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("max_softmax: vocab-parallel ops need torch.distributed initialised")
    _ = group  # a bad group raises in torch's own calls


def _rows_view(x: torch.Tensor) -> torch.Tensor:
    return x.reshape(-1, x.shape[-1]).contiguous()


class _RowOp(torch.autograd.Function):
    """Vocab-parallel softmax / log-softmax over the last axis."""

    @staticmethod
    def forward(x: torch.Tensor, kind: str, group: Any) -> torch.Tensor:
        x2 = _rows_view(x)
        widths = class_widths(x2.shape[1], group, x.device)
        offset = sum(widths[: dist.get_rank(group)])
        opts = _options_for(offset, -100, 0.0, sum(widths), x.device)
        no_targets = torch.zeros(1, dtype=torch.int64, device=x.device)
        stats = _local_stats(x2, no_targets, opts, kind)
        big_m, total, _, _ = combine_stats(_gather_stats(stats, group))
        row_in = torch.stack([big_m, total, total], dim=1).contiguous()
        return _local_epilogue(x2, row_in, no_targets, opts, kind).reshape(x.shape)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple, output: torch.Tensor) -> None:
        _, kind, group = inputs
        ctx.kind, ctx.group = kind, group
        ctx.save_for_backward(output)

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor) -> tuple:
        (a,) = ctx.saved_tensors
        acc = _acc(a.dtype)
        af, gf = a.to(acc), dy.to(acc)
        if ctx.kind == "softmax":
            part = (gf * af).sum(-1, keepdim=True)
            dist.all_reduce(part, group=ctx.group)
            dx = af * (gf - part)
        else:
            part = gf.sum(-1, keepdim=True)
            dist.all_reduce(part, group=ctx.group)
            dx = gf - torch.exp(af) * part
        return dx.to(a.dtype), None, None


def _row_op(x: torch.Tensor, dim: int, group: Any, kind: str) -> torch.Tensor:
    _check_float(x, "x")
    _check_group(group)
    if x.dim() == 0:
        raise ValueError("max_softmax: vocab-parallel ops need a tensor of rank >= 1")
    dim = dim % x.dim()
    last = dim == x.dim() - 1
    xt = x if last else x.movedim(dim, -1)
    y = _RowOp.apply(xt, kind, group)
    return y if last else y.movedim(-1, dim)


@torch.compiler.disable
def vocab_parallel_softmax(x: torch.Tensor, dim: int = -1, group: Any = None) -> torch.Tensor:
    """This rank's slice of the softmax of rows whose classes (axis `dim`)
    are split over the ranks of `group` (default: the world), in rank order.

    Args:
        x: This rank's slice: float32, float16, bfloat16 or float64, any
            device torch.distributed serves (NCCL on CUDA, gloo on the CPU).
        dim: The class axis.
        group: A torch.distributed process group, or None for the world.

    Returns:
        A tensor like `x`. Its backward all-reduces the per-row sum of dy * y.
    """
    return _row_op(x, dim, group, "softmax")


@torch.compiler.disable
def vocab_parallel_log_softmax(x: torch.Tensor, dim: int = -1, group: Any = None) -> torch.Tensor:
    """This rank's slice of the log-softmax of rows split over `group` (as
    `vocab_parallel_softmax`); its backward all-reduces the per-row sum of dy."""
    return _row_op(x, dim, group, "log_softmax")


class _CrossEntropy(torch.autograd.Function):
    """Vocab-parallel cross-entropy: forward = statistics + one gather; the
    backward writes the gradient in one pass, with no communication."""

    @staticmethod
    def forward(
        logits: torch.Tensor,
        target: torch.Tensor,
        group: Any,
        ignore_index: int,
        reduction: str,
        eps: float,
        z_loss: float,
        weight: torch.Tensor | None,
    ) -> tuple[torch.Tensor, ...]:
        x2 = _rows_view(logits)
        t1 = target.reshape(-1).to(torch.int64).contiguous()
        widths = class_widths(x2.shape[1], group, logits.device)
        classes = sum(widths)
        offset = sum(widths[: dist.get_rank(group)])
        if not t1.is_cuda:
            bad = (t1 != ignore_index) & ((t1 < 0) | (t1 >= classes))
            if bool(bad.any()):
                row = int(torch.nonzero(bad)[0, 0])
                raise ValueError(
                    f"max_softmax: cross_entropy target {int(t1[row])} at row {row} is out of "
                    f"range for {classes} classes (and is not ignore_index {ignore_index})"
                )
        if weight is not None:
            check_class_weight(list(weight.shape), classes)
        opts = _options_for(offset, ignore_index, eps, classes, logits.device)
        stats = _local_stats(x2, t1, opts, "cross_entropy")
        kept = t1 != ignore_index
        valid = (t1 >= 0) & (t1 < classes)
        if weight is None:
            big_m, total, x_t, sum_x = combine_stats(_gather_stats(stats, group))
            row = torch.log(total) + (big_m - x_t)
            if eps != 0:
                row = torch.log(total) + (1 - eps) * (big_m - x_t) + eps * (big_m - sum_x / classes)
            denominator = kept.sum().to(row.dtype)
        else:
            w = weight.to(stats.dtype)
            if eps != 0:
                # sum_c w_c x_c of the slice: one more column in the same gather.
                local_w = w[offset : offset + x2.shape[1]]
                stats = torch.cat([stats, (x2.to(stats.dtype) @ local_w).unsqueeze(1)], 1)
            gathered = _gather_stats(stats, group)
            big_m, total, x_t, _ = combine_stats(gathered[..., :STATS_COLS])
            w_t = _target_weight(w, t1, kept & valid)
            row = (1 - eps) * w_t * (torch.log(total) + (big_m - x_t))
            if eps != 0:
                lse = big_m + torch.log(total)
                row = row + eps / classes * (w.sum() * lse - gathered[..., STATS_COLS].sum(0))
            denominator = w_t.sum()
        if z_loss != 0:
            row = row + z_loss * (big_m + torch.log(total)) ** 2
        nan = torch.full_like(row, float("nan"))
        row = torch.where(kept, torch.where(valid, row, nan), torch.zeros_like(row))
        if reduction == "none":
            loss = row.reshape(target.shape)
        elif reduction == "sum":
            loss = row.sum()
        else:
            loss = row.sum() / denominator
        return loss.to(logits.dtype), big_m, total, denominator

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple, output: tuple) -> None:
        logits, target, group, ignore_index, reduction, eps, z_loss, weight = inputs
        _, big_m, total, denominator = output
        ctx.mark_non_differentiable(big_m, total, denominator)
        ctx.set_materialize_grads(False)
        ctx.reduction, ctx.shape = reduction, logits.shape
        ctx.opts = (ignore_index, eps, group, z_loss)
        ctx.save_for_backward(logits, target, big_m, total, denominator, weight)

    @staticmethod
    def backward(ctx: Any, dloss: torch.Tensor | None, *_: Any) -> tuple:
        logits, target, big_m, total, denominator, weight = ctx.saved_tensors
        if dloss is None:
            return (None,) * 8
        ignore_index, eps, group, z_loss = ctx.opts
        x2 = _rows_view(logits)
        t1 = target.reshape(-1).to(torch.int64).contiguous()
        widths = class_widths(x2.shape[1], group, logits.device)
        offset = sum(widths[: dist.get_rank(group)])
        classes = sum(widths)
        scale = dloss.to(big_m.dtype).reshape(-1).expand(big_m.shape[0])
        if ctx.reduction == "mean":
            scale = scale / denominator
        if weight is not None:
            grad = _weighted_grad(x2, t1, big_m, total, scale, weight, offset, classes, ctx.opts)
            return grad.reshape(ctx.shape), *(None,) * 7
        opts = _options_for(offset, ignore_index, eps, classes, logits.device)
        if z_loss != 0:
            # d (z lse^2) = 2 z lse softmax: the epilogue's softmax term
            # exp(x - max) / sum, grown by (1 + 2 z lse), is exp(x - max)
            # over a smaller sum; the smoothing and target terms keep theirs.
            total = total / (1 + 2 * z_loss * (big_m + torch.log(total)))
        row_in = torch.stack([big_m, total, scale], dim=1).contiguous()
        grad = _local_epilogue(x2, row_in, t1, opts, "cross_entropy")
        return grad.reshape(ctx.shape), *(None,) * 7


def _target_weight(w: torch.Tensor, t: torch.Tensor, use: torch.Tensor) -> torch.Tensor:
    """w[t] where `use` (kept rows with a valid target), else 0."""
    return torch.where(
        use, w[torch.where(use, t, torch.zeros_like(t))], torch.zeros_like(t, dtype=w.dtype)
    )


def _weighted_grad(x2, t1, big_m, total, scale, weight, offset, classes, options) -> torch.Tensor:
    """d loss / d (this slice) with class weights. Per row, with b = (1 -
    eps) w[t] + eps W / C + 2 z lse (W = sum of the weights):
    scale (b p - (1 - eps) w[t] [c == t] - eps w_c / C). The epilogue
    (smoothing 0) writes scale b (p - [c == t]), ignored rows 0 and bad
    targets NaN; torch ops add the rest: scale (b - (1 - eps) w[t]) at the
    target (rows x 1 numbers) and, with smoothing, -scale eps w_c / C (one
    more pass over the slice)."""
    ignore_index, eps, _, z_loss = options
    w = weight.to(big_m.dtype)
    kept = t1 != ignore_index
    w_t = _target_weight(w, t1, kept & (t1 >= 0) & (t1 < classes))
    b = (1 - eps) * w_t
    if eps != 0:
        b = b + eps * w.sum() / classes
    if z_loss != 0:
        b = b + 2 * z_loss * (big_m + torch.log(total))
    opts = _options_for(offset, ignore_index, 0.0, classes, x2.device)
    row_in = torch.stack([big_m, total, scale * b], dim=1).contiguous()
    grad = _local_epilogue(x2, row_in, t1, opts, "cross_entropy")
    n = x2.shape[1]
    if n == 0:
        return grad
    kept_scale = torch.where(kept, scale, torch.zeros_like(scale))
    if eps != 0 or z_loss != 0:
        local = t1 - offset
        inside = (local >= 0) & (local < n)
        fix = torch.where(inside, kept_scale * (b - (1 - eps) * w_t), torch.zeros_like(b))
        grad.scatter_add_(1, local.clamp(0, n - 1).unsqueeze(1), fix.unsqueeze(1).to(grad.dtype))
    if eps != 0:
        # In the statistics' dtype: the per-class term may be below float16's range.
        grad.sub_(torch.outer(kept_scale * (eps / classes), w[offset : offset + n]))
    return grad


@torch.compiler.disable
def vocab_parallel_cross_entropy(
    logits: torch.Tensor,
    target: torch.Tensor,
    group: Any = None,
    *,
    ignore_index: int = -100,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
    z_loss: float = 0.0,
    softcap: float | None = None,
    weight: torch.Tensor | None = None,
) -> torch.Tensor:
    """Cross-entropy of rows whose classes are split over the ranks of
    `group`, as `F.cross_entropy(whole_logits, target, ...)`, with the
    z-loss and softcap of `max_softmax.torch.cross_entropy`.

    Args:
        logits: This rank's (..., n_rank) slice of the logits (classes last),
            the slices in rank order (uneven widths are fine).
        target: (...,) global class indices, the same on every rank.
        group: A torch.distributed process group, or None for the world.
        ignore_index: Target whose rows are left out.
        reduction: "mean" (over rows kept), "sum" or "none".
        label_smoothing: In [0, 1].
        z_loss: w >= 0: each kept row adds w * lse^2 of the whole row (lse
            after the softcap; inside the "mean"). No extra pass.
        softcap: c > 0 (None or 0: off): the logits become c * tanh(x / c)
            first (Gemma 2), by torch ops on this rank's slice: one more
            read and write of it each way.
        weight: Class weights of the whole row, (classes,), the same
            vector on every rank and on the logits' device (as torch's
            `weight=`; the targets are global too, so w[t] needs no
            exchange). Row loss w[t] (lse - x_t); with smoothing (1 - eps)
            of that plus eps / C sum_c w_c (lse - x_c); "mean" divides by
            the sum of w[t] over the kept rows; the z-loss stays
            unweighted. Not differentiated.

    Returns:
        The loss, the same on every rank, in the logits' dtype. Its gradient
        with respect to `logits` is d loss / d (this rank's slice). A target
        outside [0, classes) that is not `ignore_index` raises on the CPU
        and gives NaN on CUDA (no host sync).
    """
    reduction, ignore_index, eps = check_cross_entropy_options(
        reduction, ignore_index, label_smoothing
    )
    z_loss, cap = check_cross_entropy_extras(z_loss, softcap)
    _check_float(logits, "logits")
    _check_group(group)
    if logits.dim() == 0:
        raise ValueError("max_softmax: cross_entropy needs logits with a class axis")
    if target.shape != logits.shape[:-1]:
        raise ValueError(
            f"max_softmax: target shape {tuple(target.shape)} does not match logits "
            f"{tuple(logits.shape)} without its class axis"
        )
    if target.dtype.is_floating_point or target.dtype == torch.bool:
        raise TypeError(f"max_softmax: target must hold integer class indices, got {target.dtype}")
    if weight is not None:
        # Floating, as torch's F.cross_entropy requires of its weight.
        if not isinstance(weight, torch.Tensor) or not weight.is_floating_point():
            raise TypeError(
                f"max_softmax: cross_entropy weight must be a floating-point tensor, got {weight!r}"
            )
        check_same_device("cross_entropy", "the weight", weight.device, logits.device)
        weight = weight.detach()
    if cap != 0:
        logits = torch.tanh(logits / cap) * cap
    loss, *_ = _CrossEntropy.apply(
        logits, target, group, ignore_index, reduction, eps, z_loss, weight
    )
    return loss
