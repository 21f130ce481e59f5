"""The float64 SciPy reference and the per-dtype tolerances, in one place.

Tests, the `softmax` command and the benchmark's pre-timing check all judge
results with `compare`, so "correct" means the same thing everywhere.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.special

# (rtol, atol) per op and dtype: a few units in the last place of the
# output type, since 16-bit outputs are rounded once from float32 math.
# float64 allows 1e-10: Mojo's float64 exp is good to ~1e-11, not 1 ulp.
TOLERANCES: dict[tuple[str, str], tuple[float, float]] = {
    ("softmax", "float64"): (1e-10, 1e-14),
    ("softmax", "float32"): (2e-5, 1e-7),
    ("softmax", "float16"): (2e-3, 1e-6),
    ("softmax", "bfloat16"): (1.6e-2, 1e-6),
    ("log_softmax", "float64"): (1e-10, 1e-10),
    ("log_softmax", "float32"): (1e-5, 2e-5),
    ("log_softmax", "float16"): (2e-3, 4e-3),
    ("log_softmax", "bfloat16"): (1.6e-2, 3e-2),
    # Backward ops: relative to the size of the terms each dx subtracts
    # (backward_error_scale); dx can cancel to ~0, so the absolute term
    # carries the low-precision types.
    ("softmax_backward", "float64"): (1e-10, 1e-12),
    ("softmax_backward", "float32"): (1e-4, 1e-6),
    ("softmax_backward", "float16"): (1e-2, 1e-3),
    ("softmax_backward", "bfloat16"): (5e-2, 8e-3),
    ("log_softmax_backward", "float64"): (1e-10, 1e-10),
    ("log_softmax_backward", "float32"): (1e-4, 1e-5),
    ("log_softmax_backward", "float16"): (1e-2, 1e-2),
    ("log_softmax_backward", "bfloat16"): (5e-2, 6e-2),
}


def backward_reference(op: str, a: np.ndarray, dy: np.ndarray, axis: int) -> np.ndarray:
    """The analytic gradient in float64 from the forward output `a` (y or
    log p, as the op got it) and `dy`."""
    a64 = np.asarray(a).astype(np.float64)
    g64 = np.asarray(dy).astype(np.float64)
    if op == "softmax_backward":
        return a64 * (g64 - np.sum(g64 * a64, axis=axis, keepdims=True))
    return g64 - np.exp(a64) * np.sum(g64, axis=axis, keepdims=True)


def backward_error_scale(op: str, a: np.ndarray, dy: np.ndarray, axis: int) -> np.ndarray:
    """What a backward result's error is relative to: the terms it subtracts.

    dx = dy - p * sum(dy) (log-softmax) or y * (dy - sum(dy * y)) cancels
    where p * sum(dy) is close to dy; the row sum of a million dy is ~1e3
    and any float32 implementation gets it to ~1e-7 of sum(|dy|), so the
    error is bounded by eps * (|dy| + p * sum(|dy|)), not by eps * |dx|.
    """
    a64 = np.asarray(a).astype(np.float64)
    g64 = np.abs(np.asarray(dy).astype(np.float64))
    with np.errstate(invalid="ignore", over="ignore"):
        if op == "softmax_backward":
            return np.abs(a64) * (g64 + np.sum(g64 * np.abs(a64), axis=axis, keepdims=True))
        return g64 + np.exp(a64) * np.sum(g64, axis=axis, keepdims=True)


def compare_backward(
    op: str, got: np.ndarray, a: np.ndarray, dy: np.ndarray, axis: int
) -> Comparison:
    """Compare a backward op's `got` with the float64 gradient of (a, dy)."""
    return compare(
        op,
        got,
        a,
        axis,
        ref=backward_reference(op, a, dy, axis),
        scale=backward_error_scale(op, a, dy, axis),
    )


def reference(op: str, x: np.ndarray, axis: int) -> np.ndarray:
    """SciPy's softmax / log_softmax of `x` computed in float64.

    One deliberate difference: SciPy's log_softmax of a row holding +inf is
    -inf at the finite entries (while its softmax of that row is all NaN);
    ours, like torch, is NaN on the whole row, so log_softmax == log(softmax).
    """
    x64 = np.asarray(x).astype(np.float64)
    if x64.size == 0:  # SciPy's max over an empty axis raises
        return x64
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        if op == "softmax":
            return scipy.special.softmax(x64, axis=axis)
        out = scipy.special.log_softmax(x64, axis=axis)
    has_inf = np.any(x64 == np.inf, axis=axis, keepdims=True)
    return np.where(has_inf, np.nan, out)


@dataclass
class Comparison:
    """How far a result is from the reference."""

    ok: bool
    max_abs_err: float
    max_rel_err: float
    nan_mismatches: int
    rtol: float
    atol: float


def compare(
    op: str,
    got: np.ndarray,
    x: np.ndarray,
    axis: int,
    ref: np.ndarray | None = None,
    scale: np.ndarray | None = None,
) -> Comparison:
    """Compare `got` with the float64 reference of `x` under our tolerances
    (or with `ref`, for the backward ops, whose reference needs dy too);
    `rtol` applies to `scale` (default: |reference|) element by element."""
    if ref is None:
        ref = reference(op, x, axis)
    rtol, atol = TOLERANCES[(op, np.dtype(x.dtype).name)]
    # Judge against the reference as the output type can hold it: a float32
    # log_softmax of [3.4e38, -3.4e38] is -inf at the second entry, since
    # -6.8e38 overflows float32.
    with np.errstate(over="ignore", invalid="ignore"):
        ref = np.asarray(ref).astype(np.asarray(got).dtype).astype(np.float64)
    g = np.asarray(got).astype(np.float64)
    nan_mismatch = int(np.count_nonzero(np.isnan(g) != np.isnan(ref)))
    both = ~np.isnan(ref) & ~np.isnan(g)
    same_inf = both & (g == ref)  # -inf == -inf in log_softmax of -inf entries
    with np.errstate(invalid="ignore", divide="ignore"):
        diff = np.where(same_inf, 0.0, np.abs(g - ref))
        diff = np.where(both, diff, 0.0)
        size = np.abs(ref) if scale is None else np.maximum(np.abs(ref), scale)
        scale = np.where(both & ~same_inf, size, 1.0)
        rel = np.where(scale > 0, diff / scale, diff)
    ok = nan_mismatch == 0 and bool(np.all(diff <= atol + rtol * scale))
    return Comparison(
        ok=ok,
        max_abs_err=float(diff.max(initial=0.0)),
        max_rel_err=float(rel.max(initial=0.0)),
        nan_mismatches=nan_mismatch,
        rtol=rtol,
        atol=atol,
    )


CROSS_ENTROPY_TOLERANCES: dict[str, float] = {
    "float64": 1e-10,
    "float32": 2e-5,
    "float16": 2e-3,
    "bfloat16": 1.6e-2,
}
"""rtol per logits dtype for cross-entropy's loss and dlogits, with an
absolute term of rtol x the largest reference value (each is rounded once
to the output type; a gradient entry may cancel to ~0)."""


def _rows_and_targets(
    logits: np.ndarray, targets: np.ndarray, ignore_index: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The cross-entropy references' view of their arguments: the logits x
    in float64, x as (rows, classes), the rows kept (target not
    ignore_index), the targets with ignored ones read as class 0, and the
    row indices."""
    x = np.asarray(logits).astype(np.float64)
    t1 = np.asarray(targets).reshape(-1)
    kept = t1 != ignore_index
    return x, x.reshape(-1, x.shape[-1]), kept, np.where(kept, t1, 0), np.arange(len(t1))


def _reduced(
    loss: np.ndarray,
    grad: np.ndarray,
    shape: tuple[int, ...],
    reduction: str,
    count: float,
    grad_count: float,
) -> tuple[np.ndarray, np.ndarray]:
    """The cross-entropy references' (loss, d loss / d logits) of the row
    losses `loss` and (rows, classes) `grad` under `reduction`: "mean"
    divides the summed loss by `count` and the gradient by `grad_count`
    (each reference says what stands there when nothing is kept), "none"
    keeps the rows in `shape[:-1]`."""
    if reduction == "mean":
        with np.errstate(all="ignore"):
            return loss.sum() / count, (grad / grad_count).reshape(shape)
    if reduction == "sum":
        return loss.sum(), grad.reshape(shape)
    return loss.reshape(shape[:-1]), grad.reshape(shape)


def cross_entropy_reference(
    logits: np.ndarray,
    targets: np.ndarray,
    ignore_index: int = -100,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
    weight: np.ndarray | None = None,
    z_loss: float = 0.0,
    softcap: float | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """torch.nn.functional.cross_entropy (class indices, classes on the
    last axis) in float64: (loss, d loss / d logits). For "none" the
    gradient is that of sum(loss); "mean" over the rows kept (a NaN loss and
    a zero gradient if none, as torch). With `weight`, `z_loss` or
    `softcap`: `cross_entropy_options_reference`."""
    if weight is not None or z_loss or softcap:
        return cross_entropy_options_reference(
            logits, targets, ignore_index, reduction, label_smoothing, weight, z_loss, softcap
        )
    x, x2, kept, safe, rows = _rows_and_targets(logits, targets, ignore_index)
    eps = label_smoothing
    classes = x.shape[-1]
    with np.errstate(all="ignore"):
        m = x2.max(axis=-1, keepdims=True)
        # (x - m) - log s, not x - (m + log s): at |m| ~ 1e38 even float64
        # rounds m + log s back to m.
        logp = (x2 - m) - np.log(np.exp(x2 - m).sum(axis=-1, keepdims=True))
        loss = -logp[rows, safe]
        if eps:
            loss = (1 - eps) * loss - eps / classes * logp.sum(axis=-1)
        loss = np.where(kept, loss, 0.0)
        grad = np.exp(logp) - eps / classes
        grad[rows, safe] -= 1 - eps
        grad = np.where(kept[:, None], grad, 0.0)
    # Every row ignored: the mean's loss is 0 / 0 = NaN, the gradient
    # (zeros, as each ignored row's) stays 0, as torch's.
    count = kept.sum()
    return _reduced(loss, grad, x.shape, reduction, count, max(count, 1))


def cross_entropy_options_reference(
    logits: np.ndarray,
    targets: np.ndarray,
    ignore_index: int,
    reduction: str,
    label_smoothing: float,
    weight: np.ndarray | None,
    z_loss: float,
    softcap: float | None,
) -> tuple[np.ndarray, np.ndarray]:
    """Cross-entropy in float64 with class weights (torch's rules), z-loss
    (w lse^2 a kept row, lse after the softcap) and softcap (c tanh(x / c)
    first): (loss, d loss / d logits), written term by term from the
    definition (no shared code with the kernels' algebra)."""
    x, x2, kept, safe, rows = _rows_and_targets(logits, targets, ignore_index)
    eps = label_smoothing
    classes = x.shape[-1]
    y = softcap * np.tanh(x2 / softcap) if softcap else x2
    w = np.ones(classes) if weight is None else np.asarray(weight, dtype=np.float64)
    with np.errstate(all="ignore"):
        m = y.max(axis=-1, keepdims=True)
        lse = m + np.log(np.exp(y - m).sum(axis=-1, keepdims=True))
        nll = lse - y  # (rows, classes): lse - y_c
        p = np.exp(y - lse)
        w_t = w[safe]
        loss = (1 - eps) * w_t * nll[rows, safe] + eps / classes * (nll * w).sum(-1)
        loss = loss + z_loss * lse[:, 0] ** 2
        loss = np.where(kept, loss, 0.0)
        # d loss / d y, then the softcap's chain rule.
        onehot = np.zeros_like(y)
        onehot[rows, safe] = 1.0
        grad = (1 - eps) * w_t[:, None] * (p - onehot) + eps / classes * (w.sum() * p - w)
        grad = grad + 2 * z_loss * lse * p
        if softcap:
            grad = grad * (1 - np.tanh(x2 / softcap) ** 2)
        grad = np.where(kept[:, None], grad, 0.0)
    count = np.where(kept, w_t, 0.0).sum()
    return _reduced(loss, grad, x.shape, reduction, count, count if count else 1.0)


def soft_cross_entropy_reference(
    logits: np.ndarray,
    probs: np.ndarray,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
    weight: np.ndarray | None = None,
    z_loss: float = 0.0,
) -> tuple[np.ndarray, np.ndarray]:
    """torch.nn.functional.cross_entropy with class-probability targets
    (classes on the last axis) in float64: (loss, d loss / d logits), from
    the definition: q = ((1 - eps) p + eps / C) w, row loss -sum q
    log_softmax(x) + z_loss lse^2; "mean" over the rows (weighted or not,
    as torch); for "none" the gradient is that of sum(loss)."""
    x = np.asarray(logits).astype(np.float64)
    x2 = x.reshape(-1, x.shape[-1])
    p = np.asarray(probs).astype(np.float64).reshape(x2.shape)
    classes = x.shape[-1]
    eps = label_smoothing
    w = np.ones(classes) if weight is None else np.asarray(weight, dtype=np.float64)
    q = ((1 - eps) * p + eps / classes) * w
    with np.errstate(all="ignore"):
        m = x2.max(axis=-1, keepdims=True)
        log_s = np.log(np.exp(x2 - m).sum(axis=-1, keepdims=True))
        logp = (x2 - m) - log_s
        lse = (m + log_s)[:, 0]
        loss = -(q * logp).sum(axis=-1) + z_loss * lse**2
        sum_q = q.sum(axis=-1, keepdims=True)
        grad = np.exp(logp) * (sum_q + 2 * z_loss * lse[:, None]) - q
    rows = x2.shape[0]
    return _reduced(loss, grad, x.shape, reduction, rows, max(rows, 1))


def compare_cross_entropy(
    got_loss: np.ndarray,
    got_grad: np.ndarray,
    want_loss: np.ndarray,
    want_grad: np.ndarray,
    dtype: str,
) -> tuple[bool, float, float]:
    """Whether a cross-entropy (loss, dlogits) matches the float64 reference
    under `CROSS_ENTROPY_TOLERANCES[dtype]`: (ok, loss error, dlogits error),
    each error the largest |got - want| over the largest |want| (NaNs must
    match)."""
    tol = CROSS_ENTROPY_TOLERANCES[dtype]
    ok, errs = True, []
    for got, want in ((got_loss, want_loss), (got_grad, want_grad)):
        g = np.asarray(got).astype(np.float64)
        w = np.asarray(want).astype(np.float64)
        if g.shape != w.shape or not np.array_equal(np.isnan(g), np.isnan(w)):
            ok = False
            errs.append(float("inf"))
            continue
        finite = np.abs(w[np.isfinite(w)])
        size = max(float(finite.max()) if finite.size else 0.0, 1e-30)
        with np.errstate(invalid="ignore"):
            same = np.isnan(w) | (g == w)  # NaNs, and equal infinities
            diff = np.where(same, 0.0, np.abs(g - w))
        ok = ok and bool(np.all(diff <= tol * size + tol * np.abs(np.where(same, 0.0, w))))
        errs.append(float(diff.max(initial=0.0)) / size)
    return ok, errs[0], errs[1]


def masked_reference(
    op: str,
    x: np.ndarray,
    axis: int = -1,
    scale: float | None = None,
    mask: np.ndarray | None = None,
    causal: bool = False,
) -> np.ndarray:
    """softmax / log_softmax of `x * scale + mask` in float64, with
    torch's semantics for attention masks: a boolean mask keeps True, a
    floating mask is added (rounded to x's dtype first, as the kernels read
    it; -inf drops), causal keeps j <= i over the last two axes (top-left
    aligned, torch.ones(L, S).tril()). A dropped position is dropped
    whatever x holds there; a row with nothing kept gives 0 (softmax) or
    -inf (log_softmax); NaN or +inf among the kept values makes the row NaN.
    `x * scale + mask` itself is formed in the kernels' compute dtype
    (float32 for 32- and 16-bit x, float64 for float64), as torch's
    `x * scale + mask` would be: past float32's range it is +-inf, and a
    kept +inf makes the row NaN.
    """
    x = np.asarray(x)
    acc = np.float64 if x.dtype == np.float64 else np.float32
    with np.errstate(over="ignore", invalid="ignore"):
        z = x.astype(acc) * acc(1.0 if scale is None else float(scale))
    keep = np.ones(x.shape, dtype=bool)
    if mask is not None:
        m = np.asarray(mask)
        if m.dtype == np.bool_:
            keep &= np.broadcast_to(m, x.shape)
        else:
            m_acc = np.broadcast_to(m.astype(x.dtype).astype(acc), x.shape)
            keep &= m_acc != -np.inf
            with np.errstate(invalid="ignore", over="ignore"):
                z = z + np.where(keep, m_acc, acc(0.0))
    z = z.astype(np.float64)
    if causal:
        rows, cols = x.shape[-2:]
        keep &= np.tril(np.ones((rows, cols), dtype=bool))
    z = np.where(keep, z, -np.inf)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        mx = np.max(z, axis=axis, keepdims=True)
        empty = mx == -np.inf
        shift = np.where(empty, 0.0, mx)
        e = np.exp(z - shift)
        s = np.sum(e, axis=axis, keepdims=True)
        if op == "softmax":
            return np.where(empty, 0.0, e / s)
        return np.where(empty, -np.inf, z - shift - np.log(s))
