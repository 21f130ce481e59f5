"""Fused linear + cross-entropy on numpy arrays: `linear_cross_entropy` and
`linear_cross_entropy_with_grad`.

Over chunks of rows: logits_c = h_c W^T (+ bias) by numpy's matmul (in
float32 for 16-bit inputs, rounded to their dtype, as a GEMM with float32
accumulation gives them), then our fused `cross_entropy_with_grad` (loss a
row and dlogits_c), then dh_c = dlogits_c W and dW += dlogits_c^T h_c,
accumulated in float32 (float64 for float64) and rounded once at the end.
At most one chunk of logits (and its gradient) is held: `CHUNK_BYTES`.
z_loss, softcap and class weights (`class_weight=`) go to the
cross-entropy kernel (its extended family), whose gradient carries them.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .arrays import as_array, cross_entropy_with_grad
from .arrays import cross_entropy as _cross_entropy
from .dtypes import max_dtype
from .validation import (
    EMPTY_LOSS,
    check_cross_entropy_options,
    check_integer_targets,
    check_linear_class_weight,
    check_linear_cross_entropy_dtypes,
    check_linear_cross_entropy_options,
    check_linear_cross_entropy_shapes,
    check_targets_in_range,
)

CHUNK_BYTES = 256 * 2**20
"""Bytes of logits a chunk holds (its gradient as much again)."""


def _acc(dtype: np.dtype) -> np.dtype:
    """The accumulator type: float64 for float64, else float32."""
    return np.dtype(np.float64) if dtype == np.float64 else np.dtype(np.float32)


def _check(
    input: Any, weight: Any, target: Any, bias: Any, class_weight: Any = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None, np.ndarray | None]:
    """The arguments as arrays (class weights in float64), or raise."""
    h, w, t = as_array(input), as_array(weight), as_array(target)
    b = None if bias is None else as_array(bias)
    max_dtype(h.dtype)  # raises for a dtype the kernels do not take
    check_linear_cross_entropy_dtypes(h.dtype, w.dtype, None if b is None else b.dtype)
    check_integer_targets(t.dtype.kind in "iu", t.dtype)
    check_linear_cross_entropy_shapes(h.shape, w.shape, None if b is None else b.shape, t.shape)
    cw = None
    if class_weight is not None:
        cw = as_array(class_weight)
        if cw.dtype.kind not in "fiu":
            raise TypeError(
                f"max_softmax: linear_cross_entropy class_weight must be real, got {cw.dtype}"
            )
        check_linear_class_weight(cw.shape, w.shape[0])
        cw = cw.astype(np.float64)
    return h, w, t, b, cw


def _run(
    input: Any,
    weight: Any,
    target: Any,
    bias: Any,
    ignore_index: int,
    reduction: str,
    label_smoothing: float,
    z_loss: float,
    softcap: float | None,
    class_weight: Any,
    chunk_rows: int | None,
    device: str,
    with_grad: bool,
) -> list[Any]:
    z_loss, cap = check_linear_cross_entropy_options(z_loss, softcap, chunk_rows)
    h, w, t, b, cw = _check(input, weight, target, bias, class_weight)
    reduction, ignore_index, eps = check_cross_entropy_options(
        reduction, ignore_index, label_smoothing
    )
    dtype, acc = h.dtype, _acc(h.dtype)
    hidden, classes = h.shape[-1], w.shape[0]
    check_targets_in_range(t, classes, ignore_index)
    h2 = np.ascontiguousarray(h).reshape(-1, hidden)
    t1 = np.ascontiguousarray(t, dtype=np.int64).reshape(-1)
    rows = h2.shape[0]
    loss_shape = t.shape if reduction == "none" else ()
    # The GEMMs in the accumulator type (numpy has no bfloat16 matmul).
    hf, wf = h2.astype(acc, copy=False), w.astype(acc, copy=False)
    bf = None if b is None else b.astype(acc, copy=False)
    mask = t1 != ignore_index
    if cw is None:
        kept: float = int(np.count_nonzero(mask))
    else:  # torch's divisor: the sum of the kept rows' target weights
        kept = float(cw[np.where(mask, t1, 0)][mask].sum())
    alpha = (1.0 / kept if kept else 0.0) if reduction == "mean" else 1.0
    losses = np.zeros(rows, dtype=acc)
    dh = np.zeros((rows, hidden), dtype=acc) if with_grad else None
    dw = np.zeros((classes, hidden), dtype=acc) if with_grad else None
    db = np.zeros(classes, dtype=acc) if with_grad and b is not None else None
    if rows and classes:
        per_row = max(1, classes * dtype.itemsize * (2 if with_grad else 1))
        chunk = chunk_rows or max(1, CHUNK_BYTES // per_row)
        for lo in range(0, rows, chunk):
            hi = min(rows, lo + chunk)
            logits = hf[lo:hi] @ wf.T
            if bf is not None:
                logits += bf
            logits = logits.astype(dtype)
            options = {
                "ignore_index": ignore_index,
                "label_smoothing": eps,
                "weight": cw,
                "z_loss": z_loss,
                "softcap": cap,
                "device": device,
            }
            if not with_grad:
                losses[lo:hi] = _cross_entropy(logits, t1[lo:hi], reduction="none", **options)
                continue
            loss_c, g = cross_entropy_with_grad(logits, t1[lo:hi], reduction="none", **options)
            losses[lo:hi] = loss_c
            g = g.astype(acc)
            dh[lo:hi] = alpha * (g @ wf)
            dw += alpha * (g.T @ hf[lo:hi])
            if db is not None:
                db += alpha * g.sum(axis=0)
    if reduction == "none":
        loss = losses.reshape(loss_shape)
    elif rows == 0 or classes == 0:
        loss = np.asarray(EMPTY_LOSS[reduction], dtype=acc)
    else:
        total = losses.sum(dtype=np.float64)
        if reduction == "mean":
            total = total / kept if kept else np.nan
        loss = np.asarray(total, dtype=acc)
    if not with_grad:
        return [loss]
    out = [loss, dh.astype(dtype).reshape(h.shape), dw.astype(dtype)]
    if db is not None:
        out.append(db.astype(dtype))
    return out


def linear_cross_entropy(
    input: Any,
    weight: Any,
    target: Any,
    bias: Any = None,
    *,
    ignore_index: int = -100,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
    z_loss: float = 0.0,
    softcap: float | None = None,
    class_weight: Any = None,
    chunk_rows: int | None = None,
    device: str = "auto",
) -> np.ndarray:
    """Cross-entropy of the logits `input @ weight.T + bias` against class
    indices `target`, as `F.cross_entropy(F.linear(input, weight, bias),
    target)`, without holding all the logits (chunks of rows).

    Args:
        input: Hidden states (..., H), float32/float16/bfloat16/float64.
        weight: (V, H) in input's dtype, as `nn.Linear(H, V).weight`.
        target: Integer class indices shaped `input.shape[:-1]`.
        bias: (V,) or None.
        ignore_index, reduction, label_smoothing: as `max_softmax.cross_entropy`.
        z_loss: w >= 0: each kept row adds w * lse^2 (lse after the softcap),
            as `max_softmax.cross_entropy`.
        softcap: c > 0 (None or 0: off): the logits become c * tanh(x / c)
            first.
        class_weight: Class weights (V,), as `max_softmax.cross_entropy`'s
            `weight=` (torch's; named so here: `weight` is the linear
            layer's): "mean" divides by the sum of w[t] over the kept rows.
        chunk_rows: Rows a chunk; None chooses them by `CHUNK_BYTES`.
        device: Where the cross-entropy kernel runs: "auto", "cpu" or "gpu".

    Returns:
        The loss, float32 for 16-bit inputs (float64 for float64): 0-d for
        "mean"/"sum", shaped `target` for "none".
    """
    return _run(
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
        device,
        False,
    )[0]


def linear_cross_entropy_with_grad(
    input: Any,
    weight: Any,
    target: Any,
    bias: Any = None,
    *,
    ignore_index: int = -100,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
    z_loss: float = 0.0,
    softcap: float | None = None,
    class_weight: Any = None,
    chunk_rows: int | None = None,
    device: str = "auto",
) -> tuple[np.ndarray, ...]:
    """`linear_cross_entropy` and its gradients: (loss, dinput, dweight) or,
    with a bias, (loss, dinput, dweight, dbias), the gradients in input's
    dtype and shapes. Arguments as `linear_cross_entropy`; for reduction
    "none" the gradients are those of the sum of the row losses."""
    return tuple(
        _run(
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
            device,
            True,
        )
    )
