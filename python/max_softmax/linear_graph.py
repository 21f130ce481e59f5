"""Fused linear + cross-entropy as MAX graph functions: `linear_cross_entropy`
and `linear_cross_entropy_with_grad`, for use inside a `with Graph(...)` block.

Over chunks of rows: logits_c = h_c W^T (+ bias) by MAX's `ops.matmul`, our
cross-entropy custom op (`ops.cross_entropy_rows`, reduction "none": a loss
a row and dlogits_c, unscaled), then dh_c = dlogits_c W and
dW += dlogits_c^T h_c (dW summed over chunks in float32, float64 for
float64), the mean's 1 / (rows kept) applied to the sums. Rows known at
build time are cut into static slices of `chunk_rows` (by default as many
as keep a chunk's logits within `CHUNK_BYTES`); symbolic rows make one
chunk. Which buffers the graph reuses is MAX's to decide. z_loss, softcap
and class weights (`class_weight=`) go to the cross-entropy op in its
options (its extended family), whose gradient carries them; with class
weights "mean" divides by the sum of the kept rows' target weights.
"""

from __future__ import annotations

from functools import reduce
from operator import mul

import numpy as np
from max.dtype import DType
from max.graph import DeviceRef, TensorValue, Value, ops
from max.graph.dim import Dim, StaticDim

from .ops import _cross_entropy_options, cross_entropy_rows
from .validation import (
    check_cross_entropy_options,
    check_dtype,
    check_integer_targets,
    check_linear_class_weight,
    check_linear_cross_entropy_dtypes,
    check_linear_cross_entropy_options,
    check_linear_cross_entropy_shapes,
)

CHUNK_BYTES = 256 * 2**20
"""Bytes of logits a chunk holds (its gradient as much again)."""


def _acc(dtype: DType) -> DType:
    return DType.float64 if dtype == DType.float64 else DType.float32


def _build(
    input: TensorValue,
    weight: TensorValue,
    target: TensorValue,
    bias: TensorValue | None,
    ignore_index: int,
    reduction: str,
    label_smoothing: float,
    z_loss: float,
    softcap: float | None,
    class_weight: TensorValue | np.ndarray | None,
    chunk_rows: int | None,
    with_grad: bool,
) -> list[TensorValue]:
    z_loss, cap = check_linear_cross_entropy_options(z_loss, softcap, chunk_rows)
    h, w, t = TensorValue(input), TensorValue(weight), TensorValue(target)
    b = None if bias is None else TensorValue(bias)
    check_dtype(h.dtype)
    check_linear_cross_entropy_dtypes(h.dtype, w.dtype, None if b is None else b.dtype)
    check_integer_targets(t.dtype.is_integral(), t.dtype.name)
    reduction, ignore_index, eps = check_cross_entropy_options(
        reduction, ignore_index, label_smoothing
    )
    shape = list(h.shape)
    check_linear_cross_entropy_shapes(
        shape, list(w.shape), None if b is None else list(b.shape), list(t.shape)
    )
    dtype, acc, device = h.dtype, _acc(h.dtype), h.device
    rows = reduce(mul, shape[:-1], Dim(1))
    h2 = ops.reshape(h, [rows, shape[-1]])
    t1 = ops.reshape(t if t.dtype == DType.int64 else ops.cast(t, DType.int64), [rows])
    wt = ops.transpose(w, 0, 1)
    classes = w.shape[0]
    cw = _class_weight(class_weight, classes, device)
    # The op's options: ops._cross_entropy_options reads the device and the
    # classes off a (..., V) value, here W^T in place of the logits.
    options = _cross_entropy_options(wt, ignore_index, eps, cw, z_loss, cap)
    if isinstance(rows, StaticDim):
        n = int(rows)
        if chunk_rows is None:
            per_row = int(classes) * dtype.size_in_bytes if isinstance(classes, StaticDim) else 1
            chunk_rows = max(1, CHUNK_BYTES // max(1, per_row * (2 if with_grad else 1)))
        ranges = [(lo, min(n, lo + chunk_rows)) for lo in range(0, n, chunk_rows)] or [(0, 0)]
    else:
        ranges = [None]
    losses, dhs = [], []
    dw = db = None
    for r in ranges:
        h_c = h2 if r is None or len(ranges) == 1 else h2[r[0] : r[1]]
        t_c = t1 if r is None or len(ranges) == 1 else t1[r[0] : r[1]]
        logits = ops.matmul(h_c, wt)
        if b is not None:
            logits = logits + b
        outs = cross_entropy_rows(logits, t_c, options, reduction="none", with_grad=with_grad)
        losses.append(outs[0])
        if not with_grad:
            continue
        g = outs[1]
        dhs.append(ops.cast(ops.matmul(g, w), acc))
        part = ops.cast(ops.matmul(ops.transpose(g, 0, 1), h_c), acc)
        dw = part if dw is None else dw + part
        if b is not None:
            col = ops.sum(ops.cast(g, acc), axis=0)
            db = col if db is None else db + col
    row_losses = ops.cast(losses[0] if len(losses) == 1 else ops.concat(losses, axis=0), acc)
    is_kept = ops.not_equal(t1, ops.constant(ignore_index, DType.int64, device))
    counts = ops.cast(is_kept, acc)
    if cw is not None:  # torch's divisor: the sum of the kept rows' target weights
        safe = ops.where(is_kept, t1, ops.constant(0, DType.int64, device))
        cw_acc = (
            ops.cast(cw, acc)
            if isinstance(cw, TensorValue)
            else ops.constant(cw.astype(np.float64), DType.float64, device).cast(acc)
        )
        counts = counts * ops.gather(cw_acc, safe, axis=0)
    kept = ops.sum(counts.reshape([rows, 1]), axis=0).reshape([])
    if reduction == "none":
        loss = ops.reshape(row_losses, shape[:-1])
        scale = None
    else:
        total = ops.sum(row_losses.reshape([rows, 1]), axis=0).reshape([])
        loss = total / kept if reduction == "mean" else total
        # Every row ignored: zero gradients (as torch), not 0 / 0.
        one = ops.constant(1, acc, device)
        zero = ops.constant(0, acc, device)
        scale = ops.where(ops.equal(kept, zero), one, kept) if reduction == "mean" else None
    if not with_grad:
        return [loss]

    def scaled(v: TensorValue) -> TensorValue:
        return ops.cast(v if scale is None else v / scale, dtype)

    dh = dhs[0] if len(dhs) == 1 else ops.concat(dhs, axis=0)
    out = [loss, ops.reshape(scaled(dh), shape), scaled(dw)]
    if b is not None:
        out.append(scaled(ops.reshape(db, [classes])))
    return out


def _class_weight(
    class_weight: TensorValue | np.ndarray | None, classes: Dim, device: DeviceRef
) -> TensorValue | np.ndarray | None:
    """`class_weight` checked: a graph value (V,) on the input's device, or
    a host array of real numbers (V,); None stays None."""
    if class_weight is None:
        return None
    static = int(classes) if isinstance(classes, StaticDim) else classes
    if isinstance(class_weight, (TensorValue, Value)):
        cw = TensorValue(class_weight)
        check_linear_class_weight(list(cw.shape), static)
        if not cw.dtype.is_float() and not cw.dtype.is_integral():
            raise TypeError(
                f"max_softmax: linear_cross_entropy class_weight must be real, got {cw.dtype.name}"
            )
        if cw.device != device:
            raise ValueError(
                "max_softmax: linear_cross_entropy needs class_weight on the input's device "
                f"({device}), got {cw.device}"
            )
        return cw
    array = np.asarray(class_weight)
    if array.dtype.kind not in "fiu":
        raise TypeError(
            f"max_softmax: linear_cross_entropy class_weight must be real, got {array.dtype}"
        )
    check_linear_class_weight(array.shape, static)
    return array


def linear_cross_entropy(
    input: TensorValue,
    weight: TensorValue,
    target: TensorValue,
    bias: TensorValue | None = None,
    *,
    ignore_index: int = -100,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
    z_loss: float = 0.0,
    softcap: float | None = None,
    class_weight: TensorValue | np.ndarray | None = None,
    chunk_rows: int | None = None,
) -> TensorValue:
    """Cross-entropy of the logits `input @ weight^T + bias` against class
    indices `target`, as `F.cross_entropy(F.linear(...), target)`, in chunks
    of rows (see the module docstring).

    Args:
        input: Hidden states (..., H), any float dtype; dims may be symbolic.
        weight: (V, H) in input's dtype, as `nn.Linear(H, V).weight`.
        target: Integer class indices shaped `input.shape[:-1]`, on the
            same device.
        bias: (V,) or None.
        ignore_index, reduction, label_smoothing: as `ops.cross_entropy`.
        z_loss: w >= 0: each kept row adds w * lse^2 (lse after the softcap),
            as `ops.cross_entropy`.
        softcap: c > 0 (None or 0: off): the logits become c * tanh(x / c)
            first.
        class_weight: Class weights (V,), a graph value on the input's
            device or a host array, as `ops.cross_entropy`'s `weight=`
            (named so here: `weight` is the linear layer's); "mean" divides
            by the sum of w[t] over the kept rows.
        chunk_rows: Rows a static chunk; None chooses by `CHUNK_BYTES`.

    Returns:
        The loss, float32 for 16-bit inputs (float64 for float64): a scalar
        for "mean"/"sum" ("mean" over the rows kept: NaN if none is),
        shaped `target` for "none".
    """
    return _build(
        input,
        weight,
        target,
        bias,
        ignore_index,
        reduction,
        label_smoothing,
        z_loss,
        softcap,
        class_weight,
        chunk_rows,
        False,
    )[0]


def linear_cross_entropy_with_grad(
    input: TensorValue,
    weight: TensorValue,
    target: TensorValue,
    bias: TensorValue | None = None,
    *,
    ignore_index: int = -100,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
    z_loss: float = 0.0,
    softcap: float | None = None,
    class_weight: TensorValue | np.ndarray | None = None,
    chunk_rows: int | None = None,
) -> list[TensorValue]:
    """`linear_cross_entropy` and its gradients: [loss, dinput, dweight] or,
    with a bias, [loss, dinput, dweight, dbias], in input's dtype and
    shapes. Arguments as `linear_cross_entropy`; for "none" the gradients
    are those of the sum of the row losses. With every row ignored, "mean"
    gives a NaN loss and zero gradients, as torch."""
    return _build(
        input,
        weight,
        target,
        bias,
        ignore_index,
        reduction,
        label_smoothing,
        z_loss,
        softcap,
        class_weight,
        chunk_rows,
        True,
    )
