"""Softmax, log-softmax and cross-entropy of rows whose classes are split
over devices, in a MAX multi-device graph (vocab parallelism).

Each device holds a contiguous slice of the class axis, in device order
(slices may be uneven). Per device, our `sharded_row_stats` op reads the
slice once for each row's (max, sum of exp, target logit, sum of logits);
`ops.allgather` carries those few numbers a row to every device (MAX has no
all-reduce max); each device combines them in a fixed order (`combine_stats`)
and our `sharded_epilogue` op writes its slice of the output, or of the
cross-entropy gradient, in one more pass::

    from max.nn.comm import Signals
    devices = [DeviceRef.GPU(i) for i in range(2)]
    signals = Signals(devices=devices)
    with Graph("vp", input_types=[*shard_types, *signals.input_types()],
               custom_extensions=[max_softmax.KERNELS]) as g:
        shards = [v.tensor for v in g.inputs[:2]]
        buffers = [v.buffer for v in g.inputs[2:]]
        g.output(*max_softmax.ops.sharded_softmax(shards, buffers))
    model.execute(*shard_buffers, *signals.buffers())

With every slice on the CPU (or `signal_buffers=None` on one device) the
statistics are joined with `ops.concat` instead: the same combine without
collectives, which is what the CPU tests run.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from max.dtype import DType
from max.graph import BufferValue, DeviceRef, Graph, TensorType, TensorValue, ops
from max.graph.dim import Dim, StaticDim

from .kernels import is_kernel_library, kernel_library
from .validation import check_class_weight, check_cross_entropy_options, check_dtype

SHARDED_OPS = (
    "sharded_row_stats",
    "sharded_row_stats_into",
    "sharded_epilogue",
    "sharded_epilogue_into",
)
"""The Mojo ops of op/sharded_ops.mojo (not row ops of the registry)."""

STATS_COLS = 4
"""Per row and slice: max, sum of exp(x - max), target logit (-inf when the
target is in another slice), sum of logits."""

KINDS = ("softmax", "log_softmax", "cross_entropy")


def stats_dtype(dtype: DType) -> DType:
    """The type of the statistics: float64 for float64 logits, else float32."""
    return DType.float64 if dtype == DType.float64 else DType.float32


def _ensure_kernels_loaded() -> None:
    graph = Graph.current
    if not any(is_kernel_library(p) for p in graph.kernel_libraries_paths):
        graph._import_kernels([kernel_library()])


def shard_options(
    offset: int, classes: int, device: DeviceRef, ignore_index: int = -100, eps: float = 0.0
) -> TensorValue:
    """The ops' float64 (4,) options on `device`: (class offset of the
    slice, ignore_index, label smoothing, total classes)."""
    values = np.array([offset, ignore_index, eps, classes], dtype=np.float64)
    return ops.constant(values, DType.float64, device=device)


def _no_targets(device: DeviceRef) -> TensorValue:
    return ops.constant(np.zeros(1, dtype=np.int64), DType.int64, device=device)


def shard_row_stats(
    logits: TensorValue, targets: TensorValue | None, options: TensorValue, kind: str
) -> TensorValue:
    """`sharded_row_stats` of a (rows, n_shard) slice: (rows, 4) statistics.
    `targets` (int64 (rows,), global classes) is read for cross-entropy only."""
    _ensure_kernels_loaded()
    dev = logits.device
    (stats,) = ops.custom(
        name="sharded_row_stats",
        device=dev,
        values=[logits, _no_targets(dev) if targets is None else targets, options],
        out_types=[TensorType(stats_dtype(logits.dtype), [logits.shape[0], STATS_COLS], dev)],
        parameters={"kind": kind},
    )
    return stats.tensor


def shard_epilogue(
    logits: TensorValue,
    row_in: TensorValue,
    targets: TensorValue | None,
    options: TensorValue,
    kind: str,
) -> TensorValue:
    """`sharded_epilogue` of a (rows, n_shard) slice from the rows' global
    (max, sum, scale) `row_in` (rows, 3): softmax, log-softmax or the
    cross-entropy gradient of the slice."""
    _ensure_kernels_loaded()
    dev = logits.device
    (out,) = ops.custom(
        name="sharded_epilogue",
        device=dev,
        values=[logits, row_in, _no_targets(dev) if targets is None else targets, options],
        out_types=[TensorType(logits.dtype, logits.shape, dev)],
        parameters={"kind": kind},
    )
    return out.tensor


def combine_stats(
    gathered: TensorValue, parts: int, cols: int = STATS_COLS
) -> tuple[TensorValue, ...]:
    """Each row's global (max, sum of exp(x - max), target logit, sum of
    logits), each (rows, 1), from the (rows, cols * parts) statistics of
    every slice side by side (the first 4 of each slice's `cols` read),
    folded in slice order. A row whose max is +-inf
    (+inf, NaN, or only -inf) gets a NaN sum, as the one-device op.

    Maxima are taken pairwise with the elementwise `ops.max`: the reduction
    `ops.max(x, axis=...)` starts from the lowest finite value, so a column
    of -inf would come back as -3.4e38."""
    rows = gathered.shape[0]
    g = ops.reshape(gathered, [rows, parts, cols])

    def col(k: int, c: int) -> TensorValue:
        return ops.reshape(g[:, k, c], [rows, 1])

    big_m, x_t, sum_x = col(0, 0), col(0, 2), col(0, 3)
    for k in range(1, parts):
        big_m = ops.max(big_m, col(k, 0))
        x_t = ops.max(x_t, col(k, 2))
        sum_x = sum_x + col(k, 3)
    one = ops.constant(1.0, g.dtype, device=g.device)
    total = None
    for k in range(parts):
        m = col(k, 0)
        # exp(m - M), but exactly 1 where equal (a slice of only -inf in a
        # row of only -inf contributes its 0, not NaN).
        part = col(k, 1) * ops.where(ops.equal(m, big_m), one, ops.exp(m - big_m))
        total = part if total is None else total + part
    nan = ops.constant(float("nan"), g.dtype, device=g.device)
    total = ops.where(ops.is_inf(big_m), nan, total)
    return big_m, total, x_t, sum_x


def _gather(stats: list[TensorValue], signal_buffers: Sequence[BufferValue] | None) -> list:
    """Every slice's statistics side by side, (rows, cols * parts), on each device."""
    if len(stats) == 1:
        return stats
    on_cpu = all(s.device.device_type.value == "cpu" for s in stats)
    if signal_buffers is None or on_cpu:
        if len({str(s.device) for s in stats}) != 1:
            raise ValueError(
                "max_softmax: slices on several devices need signal_buffers "
                "(max.nn.comm.Signals) for ops.allgather"
            )
        joined = ops.concat(stats, axis=1)
        return [joined] * len(stats)
    return list(ops.allgather(stats, signal_buffers, axis=1))


def _flatten(shards: Sequence[TensorValue], axis: int) -> tuple[list[TensorValue], list, list[int]]:
    """The slices as (rows, n_shard) and the leading shape, checking that
    they share dtype and leading dims and that the class widths are static."""
    values = [TensorValue(s) for s in shards]
    if not values:
        raise ValueError("max_softmax: sharded ops need at least one slice")
    rank = values[0].rank
    if rank < 1 or axis not in (-1, rank - 1):
        raise ValueError(
            f"max_softmax: sharded ops split the last axis; got axis={axis} for rank {rank}"
        )
    dtype = values[0].dtype
    check_dtype(dtype)
    lead = list(values[0].shape[:-1])
    widths = []
    for i, v in enumerate(values):
        if v.dtype != dtype or v.rank != rank or list(v.shape[:-1]) != lead:
            raise ValueError(
                f"max_softmax: slice {i} is {v.dtype} {list(v.shape)}; every slice needs "
                f"dtype {dtype} and leading dims {lead}"
            )
        width = v.shape[-1]
        if not isinstance(width, StaticDim):
            raise ValueError(f"max_softmax: slice {i} needs a static class width, got {width}")
        widths.append(int(width))
    rows = Dim(1)
    for d in lead:
        rows = rows * d
    flat = [v if rank == 2 else ops.reshape(v, [rows, v.shape[-1]]) for v in values]
    return flat, lead, widths


def _offsets(widths: list[int]) -> list[int]:
    return [sum(widths[:i]) for i in range(len(widths))]


def _sharded_rows(
    kind: str, shards: Sequence[TensorValue], signal_buffers, axis: int
) -> list[TensorValue]:
    flat, lead, widths = _flatten(shards, axis)
    classes = sum(widths)
    opts = [shard_options(off, classes, v.device) for off, v in zip(_offsets(widths), flat)]
    stats = [shard_row_stats(v, None, o, kind) for v, o in zip(flat, opts)]
    outs = []
    for v, g, o in zip(flat, _gather(stats, signal_buffers), opts):
        big_m, total, _, _ = combine_stats(g, len(flat))
        row_in = ops.concat([big_m, total, total], axis=1)
        y = shard_epilogue(v, row_in, None, o, kind)
        outs.append(y if len(lead) == 1 else ops.reshape(y, [*lead, y.shape[-1]]))
    return outs


def sharded_softmax(
    shards: Sequence[TensorValue],
    signal_buffers: Sequence[BufferValue] | None,
    axis: int = -1,
) -> list[TensorValue]:
    """Softmax over the classes of rows split over devices: one slice of
    the last axis per device in, in class order (uneven widths are fine;
    they must be static), and each device's slice of the result out.

    Args:
        shards: One tensor per device, same dtype and leading dims.
        signal_buffers: `max.nn.comm.Signals(...)` buffers, one per device,
            for `ops.allgather`; None when every slice is on one device.
        axis: The split axis; only the last one (-1) is supported.
    """
    return _sharded_rows("softmax", shards, signal_buffers, axis)


def sharded_log_softmax(
    shards: Sequence[TensorValue],
    signal_buffers: Sequence[BufferValue] | None,
    axis: int = -1,
) -> list[TensorValue]:
    """Log-softmax over the classes of rows split over devices (as
    `sharded_softmax`)."""
    return _sharded_rows("log_softmax", shards, signal_buffers, axis)


def sharded_cross_entropy(
    shards: Sequence[TensorValue],
    targets: TensorValue | Sequence[TensorValue],
    signal_buffers: Sequence[BufferValue] | None,
    *,
    ignore_index: int = -100,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
    with_grad: bool = False,
    weight: TensorValue | Sequence[TensorValue] | None = None,
) -> list[TensorValue] | tuple[list[TensorValue], list[TensorValue]]:
    """Cross-entropy of rows whose logits are split over devices (as torch's
    `F.cross_entropy` with class-index targets, on the whole row).

    Args:
        shards: One (..., n_i) logits slice per device, in class order.
        targets: Global class indices (...,), integer: one tensor per device,
            or one tensor that is moved to each device.
        signal_buffers: As `sharded_softmax`.
        ignore_index: Target whose rows are left out (loss and gradient 0).
        reduction: "mean" (over rows kept), "sum" or "none".
        label_smoothing: In [0, 1].
        with_grad: Also return each device's d loss / d (its slice).
        weight: Class weights of the whole row, (classes,), floating: one
            tensor per device, or one that is moved to each device (as
            torch's `weight=`, which users hold whole; the targets are
            global, so w[t] needs no exchange). Row loss w[t] (lse - x_t);
            with smoothing (1 - eps) of that plus eps / C sum_c w_c (lse -
            x_c); "mean" divides by the sum of w[t] over the kept rows.

    Returns:
        The loss on every device (the same value; a scalar, or (...,) for
        "none"), and with `with_grad` also the gradient slices. A target
        outside [0, classes) that is not ignore_index gives a NaN loss and
        NaN gradient rows.
    """
    reduction, ignore_index, eps = check_cross_entropy_options(
        reduction, ignore_index, label_smoothing
    )
    flat, lead, widths = _flatten(shards, -1)
    classes = sum(widths)
    targets = _on_each_device(targets, flat)
    tgts = []
    for v, t in zip(flat, targets, strict=True):
        t = TensorValue(t)
        if not t.dtype.is_integral():
            raise TypeError(f"max_softmax: cross_entropy needs integer targets, got {t.dtype}")
        if list(t.shape) != lead:
            raise ValueError(f"max_softmax: targets {list(t.shape)} do not match logits {lead}")
        if t.dtype != DType.int64:
            t = ops.cast(t, DType.int64)
        tgts.append(t if len(lead) == 1 else ops.reshape(t, [v.shape[0]]))
    opts = [
        shard_options(off, classes, v.device, ignore_index, eps)
        for off, v in zip(_offsets(widths), flat)
    ]
    stats = [shard_row_stats(v, t, o, "cross_entropy") for v, t, o in zip(flat, tgts, opts)]
    if weight is not None:
        ws = _class_weights(weight, flat, classes)
        return _weighted_cross_entropy(
            flat,
            lead,
            widths,
            tgts,
            ws,
            stats,
            signal_buffers,
            ignore_index,
            eps,
            reduction,
            with_grad,
        )
    losses, grads = [], []
    for v, t, g, o in zip(flat, tgts, _gather(stats, signal_buffers), opts):
        loss, row_in = _loss_and_rows(g, len(flat), t, classes, ignore_index, eps, reduction)
        out_dtype = v.dtype
        if reduction == "none":
            losses.append(ops.reshape(ops.cast(loss, out_dtype), lead))
        else:
            losses.append(ops.cast(loss, out_dtype))
        if with_grad:
            d = shard_epilogue(v, row_in, t, o, "cross_entropy")
            grads.append(d if len(lead) == 1 else ops.reshape(d, [*lead, d.shape[-1]]))
    return (losses, grads) if with_grad else losses


def _on_each_device(value: TensorValue | Sequence[TensorValue], flat: list[TensorValue]) -> list:
    """One tensor per slice's device: `value` moved to each, or the
    sequence given."""
    if isinstance(value, TensorValue) or not isinstance(value, Sequence):
        one = TensorValue(value)
        return [one if one.device == v.device else ops.transfer_to(one, v.device) for v in flat]
    return list(value)


def _class_weights(weight, flat: list[TensorValue], classes: int) -> list[TensorValue]:
    """The class weights on each device, checked, in the statistics' dtype."""
    out = []
    for v, w in zip(flat, _on_each_device(weight, flat), strict=True):
        w = TensorValue(w)
        if not w.dtype.is_float():
            raise TypeError(f"max_softmax: cross_entropy weight must be floating, got {w.dtype}")
        check_class_weight(list(w.shape), classes)
        acc = stats_dtype(v.dtype)
        out.append(w if w.dtype == acc else ops.cast(w, acc))
    return out


def _weighted_cross_entropy(
    flat, lead, widths, tgts, ws, stats, signal_buffers, ignore_index, eps, reduction, with_grad
):
    """`sharded_cross_entropy` with class weights. The kernels see no
    weights: with smoothing each slice's sum of w_c x_c joins its statistics
    (one more column, the same gather); the loss is graph ops on the
    combined rows; the gradient is the epilogue (smoothing 0) with each
    row's scale times b = (1 - eps) w[t] + eps W / C, which writes
    scale b (p - [c == t]), plus, with smoothing, scale eps W / C at the
    target and -scale eps w_c / C (graph ops over the slice)."""
    classes = sum(widths)
    cols = STATS_COLS
    if eps != 0:
        cols += 1
        stats = [
            ops.concat(
                [s, ops.matmul(ops.cast(v, s.dtype), ops.reshape(w[off : off + n], [n, 1]))], 1
            )
            for s, v, w, off, n in zip(stats, flat, ws, _offsets(widths), widths)
        ]
    losses, grads = [], []
    gathered = _gather(stats, signal_buffers)
    for v, t, g, w, off in zip(flat, tgts, gathered, ws, _offsets(widths)):
        loss, d = _weighted_slice(
            v, t, g, w, off, len(flat), cols, classes, ignore_index, eps, reduction, with_grad
        )
        losses.append(ops.reshape(loss, lead) if reduction == "none" else loss)
        if with_grad:
            grads.append(d if len(lead) == 1 else ops.reshape(d, [*lead, d.shape[-1]]))
    return (losses, grads) if with_grad else losses


def _weighted_slice(
    v: TensorValue,
    t: TensorValue,
    g: TensorValue,
    w: TensorValue,
    off: int,
    parts: int,
    cols: int,
    classes: int,
    ignore_index: int,
    eps: float,
    reduction: str,
    with_grad: bool,
) -> tuple[TensorValue, TensorValue | None]:
    """One device's weighted loss (rows,) or scalar, and its gradient slice
    (rows, n) with `with_grad`, from the gathered statistics `g`."""
    acc, dev = g.dtype, g.device
    rows, n = t.shape[0], int(v.shape[-1])

    def c(value: float) -> TensorValue:
        return ops.constant(value, acc, device=dev)

    def ic(value: int) -> TensorValue:
        return ops.constant(value, DType.int64, device=dev)

    big_m, total, x_t, _ = combine_stats(g, parts, cols)
    t2 = ops.reshape(t, [rows, 1])
    kept = ops.not_equal(t2, ic(ignore_index))
    valid = ops.logical_and(ops.greater_equal(t2, ic(0)), ops.greater(ic(classes), t2))
    use = ops.logical_and(kept, valid)
    safe = ops.reshape(ops.where(use, t2, ic(0)), [rows])
    w_t = ops.where(use, ops.reshape(ops.gather(w, safe, axis=0), [rows, 1]), c(0.0))
    row = c(1 - eps) * w_t * (ops.log(total) + (big_m - x_t))
    smooth = c(0.0)
    if eps != 0:
        gg = ops.reshape(g, [rows, parts, cols])
        wx = ops.reshape(gg[:, 0, STATS_COLS], [rows, 1])
        for k in range(1, parts):
            wx = wx + ops.reshape(gg[:, k, STATS_COLS], [rows, 1])
        smooth = c(eps / classes) * ops.sum(w, axis=0)  # eps W / C, shape (1,)
        row = row + smooth * (big_m + ops.log(total)) - c(eps / classes) * wx
    row = ops.where(kept, ops.where(valid, row, c(float("nan"))), c(0.0))
    row = ops.reshape(row, [rows])
    scale = ops.broadcast_to(c(1.0), big_m.shape)
    if reduction == "none":
        loss = ops.cast(row, v.dtype)
    else:
        total_loss = ops.sum(row, axis=0)
        if reduction == "mean":
            denominator = ops.sum(ops.reshape(w_t, [rows]), axis=0)
            total_loss = total_loss / denominator
            scale = ops.broadcast_to(c(1.0) / denominator, big_m.shape)
        loss = ops.cast(ops.reshape(total_loss, []), v.dtype)
    if not with_grad:
        return loss, None
    b = c(1 - eps) * w_t + smooth
    opts = shard_options(off, classes, dev, ignore_index, 0.0)
    row_in = ops.concat([big_m, total, scale * b], axis=1)
    d = shard_epilogue(v, row_in, t, opts, "cross_entropy")
    if eps != 0:
        kept_scale = ops.where(kept, scale, c(0.0))
        cls = np.arange(off, off + n, dtype=np.int64).reshape(1, n)
        at_target = ops.where(
            ops.equal(ops.constant(cls, DType.int64, device=dev), t2), kept_scale * smooth, c(0.0)
        )
        per_class = kept_scale * c(eps / classes) * ops.reshape(w[off : off + n], [1, n])
        d = ops.cast(ops.cast(d, acc) + at_target - per_class, v.dtype)
    return loss, d


def _loss_and_rows(
    gathered: TensorValue,
    parts: int,
    targets: TensorValue,
    classes: int,
    ignore_index: int,
    eps: float,
    reduction: str,
) -> tuple[TensorValue, TensorValue]:
    """The loss (reduced, or (rows,) for "none") from the gathered
    statistics, and the epilogue's (rows, 3) (max, sum, scale)."""
    big_m, total, x_t, sum_x = combine_stats(gathered, parts)
    acc, dev = gathered.dtype, gathered.device

    def c(value: float) -> TensorValue:
        return ops.constant(value, acc, device=dev)

    row = ops.log(total) + (big_m - x_t)
    if eps != 0:
        row = ops.log(total) + c(1 - eps) * (big_m - x_t) + c(eps) * (big_m - sum_x / c(classes))
    t = ops.reshape(targets, [targets.shape[0], 1])

    def ic(value: int) -> TensorValue:
        return ops.constant(value, DType.int64, device=dev)

    kept = ops.not_equal(t, ic(ignore_index))
    valid = ops.logical_and(ops.greater_equal(t, ic(0)), ops.greater(ic(classes), t))
    row = ops.where(kept, ops.where(valid, row, c(float("nan"))), c(0.0))
    row = ops.reshape(row, [targets.shape[0]])
    if reduction == "none":
        return row, ops.concat([big_m, total, ops.broadcast_to(c(1.0), big_m.shape)], axis=1)
    loss = ops.sum(row, axis=0)
    scale = ops.broadcast_to(c(1.0), big_m.shape)
    if reduction == "mean":
        count = ops.sum(ops.cast(ops.reshape(kept, [targets.shape[0]]), acc), axis=0)
        loss = loss / count
        scale = ops.broadcast_to(c(1.0) / count, big_m.shape)
    return ops.reshape(loss, []), ops.concat([big_m, total, scale], axis=1)
