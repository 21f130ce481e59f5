"""Graph-level functions: add our ops to the user's own `max.graph.Graph`.

They mirror `max.graph.ops.softmax`: call them inside a `with Graph(...)`
block on a `TensorValue` of any rank, on CPU or GPU::

    with Graph("model", input_types=[...], custom_extensions=[KERNELS]) as g:
        logits = ops.matmul(x, w)
        probs = max_softmax.ops.softmax(logits, axis=-1)

If the graph was created without `custom_extensions=[max_softmax.KERNELS]`,
the first call adds the kernel library to the current graph.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import reduce
from operator import mul

import numpy as np
from max.dtype import DType
from max.graph import Graph, TensorType, TensorValue, Value, ops
from max.graph.dim import Dim, StaticDim

from . import waits
from .devices import check_graph_device
from .kernels import is_kernel_library, kernel_library
from .validation import VARIANTS as VARIANTS  # re-exported: ops.VARIANTS
from .validation import (
    check_class_weight,
    check_class_weight_array,
    check_cross_entropy_extras,
    check_cross_entropy_options,
    check_cross_entropy_shapes,
    check_dtype,
    check_dy_like,
    check_integer_targets,
    check_mask_dtype,
    check_masked_options,
    check_same_device,
    check_scale,
    check_soft_targets,
    check_variant,
    cross_entropy_options,
    extended_tail,
    is_masked_call,
    mask_suffix,
    masked_flags,
    masked_options,
    normalize_axis,
    soft_cross_entropy_options,
)


def softmax(
    x: TensorValue,
    axis: int = -1,
    *,
    variant: str = "auto",
    scale: float | None = None,
    mask: TensorValue | np.ndarray | None = None,
    causal: bool = False,
) -> TensorValue:
    """Softmax of `x` along `axis`, computed by our Mojo kernels.

    Args:
        x: A floating-point tensor (float32, float16, bfloat16, float64) of
            rank >= 1 in the current graph; dims may be symbolic.
        axis: The axis to normalise; negative values count from the end.
        variant: GPU kernel family (see `VARIANTS`); "auto" picks by shape.
        scale: Multiply x by this first (temperature T: 1 / T); a finite
            float, baked into the graph as a constant.
        mask: Broadcastable to x: boolean (True keeps, as torch's
            scaled_dot_product_attention) or floating (added after
            scaling; -inf drops). A tensor of this graph on x's device, or
            a numpy array (a constant).
        causal: Over the last two axes (L, n), row i keeps columns j <= i
            (torch's `is_causal`, top-left aligned), computed in the kernel.

    With any of scale, mask, causal the fused masked op runs (one pass;
    along another axis than the last, x and the broadcast mask are moved
    there and back, and causal is an error). A row with nothing kept gives
    zeros. Without them the plain op runs, unchanged.

    Returns:
        A tensor of the shape, dtype and device of `x`.
    """
    if is_masked_call(scale, mask, causal):
        return _masked("softmax", x, axis, variant, scale, mask, causal)
    return _row_op("softmax", x, axis, variant)


def log_softmax(
    x: TensorValue,
    axis: int = -1,
    *,
    variant: str = "auto",
    scale: float | None = None,
    mask: TensorValue | np.ndarray | None = None,
    causal: bool = False,
) -> TensorValue:
    """Log-softmax of `x` along `axis`: x - max - log(sum(exp(x - max))).

    Same arguments and result as `softmax`; a row with nothing kept gives
    -inf everywhere (log of softmax's zeros).
    """
    if is_masked_call(scale, mask, causal):
        return _masked("log_softmax", x, axis, variant, scale, mask, causal)
    return _row_op("log_softmax", x, axis, variant)


def softmax_backward(
    y: TensorValue,
    dy: TensorValue,
    axis: int = -1,
    *,
    scale: float | None = None,
    variant: str = "auto",
) -> TensorValue:
    """Gradient of softmax: dx = y * (dy - sum(dy * y, axis)).

    Args:
        y: The output of `softmax(x, axis)` (with any scale, mask, causal).
        dy: The gradient of the loss with respect to `y`; same shape,
            dtype and device as `y`.
        axis: The axis softmax was taken along.
        scale: The forward's scale: dx is multiplied by it (a graph
            multiply after the op). Masked positions (y = 0) get 0.
        variant: GPU strategy (`BACKWARD_VARIANTS`); "auto" picks by shape.

    Returns:
        dx, the gradient with respect to `x`, shaped like `y`.
    """
    return _scaled(_row_op("softmax_backward", y, axis, variant, dy), "softmax_backward", scale)


def log_softmax_backward(
    logp: TensorValue,
    dy: TensorValue,
    axis: int = -1,
    *,
    scale: float | None = None,
    variant: str = "auto",
) -> TensorValue:
    """Gradient of log-softmax: dx = dy - exp(logp) * sum(dy, axis).

    Args:
        logp: The output of `log_softmax(x, axis)`.
        dy: The gradient of the loss with respect to `logp`.
        axis: The axis log_softmax was taken along.
        scale: The forward's scale: dx is multiplied by it (a graph
            multiply after the op). The formula is applied as it is: at a
            masked position (logp = -inf) dx = scale * dy; the torch bridge
            gives 0 there (the gradient of masked_fill).
        variant: GPU strategy (`BACKWARD_VARIANTS`); "auto" picks by shape.

    Returns:
        dx, the gradient with respect to `x`, shaped like `logp`.
    """
    return _scaled(
        _row_op("log_softmax_backward", logp, axis, variant, dy), "log_softmax_backward", scale
    )


def _scaled(dx: TensorValue, op: str, scale: float | None) -> TensorValue:
    """dx * scale, by a graph multiply (nothing for None or 1)."""
    value = check_scale(op, scale)
    if value == 1.0:
        return dx
    return ops.mul(dx, ops.constant(value, dx.dtype, device=dx.device))


def softmax_masked(
    x: TensorValue,
    mask: TensorValue,
    options: TensorValue,
    *,
    variant: str = "auto",
) -> TensorValue:
    """The fused masked softmax on its own view: `x` (outer, L, n), `mask`
    (mask_rows, n) additive in x's dtype (row r = o * L + i of x uses mask
    row r % mask_rows; a placeholder, not read, without MASK_FLAG),
    `options` a float64 tensor on x's device, `validation.masked_options`:
    the scale, then one zero per flag value, so its length 1 + flags says
    whether the mask is read (MASK_FLAG) and whether row i keeps only
    columns j <= i (CAUSAL_FLAG). Scale and flags are run-time values, so
    a model built on this with symbolic shapes (`models.masked_model`)
    serves every scale, mask and causal combination. The front doors
    (`softmax(..., mask=...)`) make this view; call it directly only to
    build such models. `variant`: the GPU strategy (`MASKED_VARIANTS`)."""
    return _masked_rows("softmax_masked", x, mask, options, variant)


def log_softmax_masked(
    x: TensorValue,
    mask: TensorValue,
    options: TensorValue,
    *,
    variant: str = "auto",
) -> TensorValue:
    """`softmax_masked`'s log-softmax twin; same arguments."""
    return _masked_rows("log_softmax_masked", x, mask, options, variant)


def _masked_rows(
    name: str,
    x: TensorValue,
    mask: TensorValue,
    options: TensorValue,
    variant: str = "auto",
) -> TensorValue:
    check_graph_device(x.device, f"the input of {name}")
    check_variant(variant, x.device.device_type.value, name)
    _ensure_kernels_loaded()
    (y,) = ops.custom(
        name=name,
        device=x.device,
        values=[x, mask, options],
        out_types=[TensorType(x.dtype, x.shape, x.device)],
        parameters=_variant(variant),
    )
    return y.tensor


def _product(dims: list) -> Dim:
    return reduce(mul, dims, Dim(1))


def _masked(
    op: str,
    x: TensorValue,
    axis: int,
    variant: str,
    scale: float | None,
    mask: TensorValue | np.ndarray | None,
    causal: bool,
    kernel: Callable[..., TensorValue] | None = None,
) -> TensorValue:
    """softmax / log_softmax with scale, mask, causal: the edge. Checks
    once, reduces the mask to (mask_rows, n) rows in x's dtype (booleans to
    0 / -inf), moves `axis` last if it is not, runs the fused op.

    `kernel(x, mask, options)` stages the fused op on its (outer, L, n)
    view, the flags in the options' length (`validation.masked_options`);
    by default `softmax_masked` / `log_softmax_masked` (MAX eager passes
    its declared `CustomOp` instead, `eager.run_masked`)."""
    x = TensorValue(x)
    check_dtype(x.dtype)
    check_graph_device(x.device, f"the input of {op}")
    shape = list(x.shape)
    axis = normalize_axis(axis, len(shape))
    value, causal = check_masked_options(op, scale, causal, len(shape), axis, variant)
    last = axis == len(shape) - 1
    # Along another axis: the same op on x (and the mask, broadcast) with
    # that axis moved last, and the result moved back (two transposes).
    perm = [d for d in range(len(shape)) if d != axis] + [axis]
    work = shape if last else [shape[d] for d in perm]
    m = None
    if mask is not None:
        m = mask if isinstance(mask, TensorValue) else _mask_value(mask, x)
        m = TensorValue(m)
        check_mask_dtype(op, m.dtype == DType.bool, m.dtype.is_float(), m.dtype.name)
        check_same_device(op, "the mask", m.device, x.device)
        k = mask_suffix(op, shape, list(m.shape), last)
        if m.dtype == DType.bool:
            m = ops.where(
                m,
                ops.constant(0.0, x.dtype, device=x.device),
                ops.constant(float("-inf"), x.dtype, device=x.device),
            )
        elif m.dtype != x.dtype:
            m = ops.cast(m, x.dtype)
        if k:
            m = ops.reshape(m, [_product(shape[len(shape) - k : -1]), shape[-1]])
        else:
            m = ops.broadcast_to(m, shape)
            if not last:
                m = ops.permute(m, perm)
            m = ops.reshape(m, [_product(work[:-1]), work[-1]])
    else:
        m = ops.constant(np.zeros((1, 1), dtype=np.float32), DType.float32, device=x.device)
        m = ops.cast(m, x.dtype)
    xw = x if last else ops.permute(x, perm)
    if len(work) == 1:
        view = [Dim(1), Dim(1), work[0]]
    else:
        view = [_product(work[:-2]), work[-2], work[-1]]
    flags = masked_flags(mask is not None, causal)
    options = ops.constant(
        np.array(masked_options(value, flags), dtype=np.float64), DType.float64, device=x.device
    )
    if kernel is None:
        kernel = log_softmax_masked if op == "log_softmax" else softmax_masked
    y = kernel(ops.reshape(xw, view), m, options)
    y = ops.reshape(y, work)
    if last:
        return y
    inverse = [perm.index(d) for d in range(len(shape))]
    return ops.permute(y, inverse)


def _mask_value(mask: np.ndarray, x: TensorValue) -> TensorValue:
    """A numpy mask as a constant of the graph on x's device (booleans stay
    boolean; floats in x's dtype)."""
    array = np.asarray(mask)
    if array.dtype == np.bool_:
        return ops.constant(array, DType.bool, device=x.device)
    if array.dtype.kind != "f":
        check_mask_dtype("softmax", False, False, array.dtype)
    return ops.cast(ops.constant(array.astype(np.float64), DType.float64, device=x.device), x.dtype)


def cross_entropy(
    logits: TensorValue,
    targets: TensorValue,
    *,
    ignore_index: int = -100,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
    weight: TensorValue | np.ndarray | None = None,
    z_loss: float = 0.0,
    softcap: float | None = None,
    variant: str = "auto",
) -> TensorValue:
    """Cross-entropy of `logits` (classes on the last axis) against class
    indices `targets`, as `torch.nn.functional.cross_entropy`.

    Args:
        logits: A floating-point tensor (..., classes); dims may be symbolic.
        targets: Integer class indices shaped like `logits` without its last
            axis, on the same device (cast to int64 in the graph); or class
            probabilities, a floating tensor shaped as `logits` (the fused
            soft_cross_entropy op: ignore_index and variant= do not apply,
            "mean" is over the rows, softcap is not taken).
        ignore_index: Target value whose rows add nothing and count for
            nothing in the mean.
        reduction: "mean" (over the rows kept; NaN if none is), "sum" or
            "none" (a loss a row, 0 for ignored rows).
        label_smoothing: eps in [0, 1]: the target is (1 - eps) one-hot plus
            eps / classes everywhere.
        weight: torch's class weights, (classes,) (a tensor on the logits'
            device, or an array): row loss w[t] (lse - x_t), with smoothing
            (1 - eps) w[t] (lse - x_t) + eps / C sum_c w_c (lse - x_c);
            "mean" divides by the sum of w[t] over the kept rows.
        z_loss: w >= 0: each kept row adds w * lse^2 (PaLM's z-loss; lse
            after the softcap), unweighted, inside the "mean" too.
        softcap: c > 0 (None or 0: off): the logits become c * tanh(x / c)
            before everything else (Gemma 2).
        variant: GPU strategy (`CROSS_ENTROPY_VARIANTS`); "auto" picks by
            shape.

    Returns:
        The loss in the logits' dtype: a scalar for "mean"/"sum", shaped
        `logits.shape[:-1]` for "none". On the GPU a target out of range
        that is not ignore_index makes its row's loss NaN (the kernel cannot
        raise without a host sync); on the CPU it raises at execution.
    """
    return _cross_entropy(
        logits,
        targets,
        ignore_index,
        reduction,
        label_smoothing,
        False,
        weight,
        z_loss,
        softcap,
        variant=variant,
    )[0]


def cross_entropy_with_grad(
    logits: TensorValue,
    targets: TensorValue,
    *,
    ignore_index: int = -100,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
    weight: TensorValue | np.ndarray | None = None,
    z_loss: float = 0.0,
    softcap: float | None = None,
    variant: str = "auto",
) -> tuple[TensorValue, TensorValue]:
    """`cross_entropy` and dlogits = d loss / d logits, fused: the kernels
    read the logits once and write the gradient once.

    Arguments as `cross_entropy`. For reduction "none", dlogits is the
    gradient of the sum of the row losses (scale each row by its incoming
    gradient). Returns (loss, dlogits), dlogits shaped and typed like `logits`.
    """
    loss, dlogits = _cross_entropy(
        logits,
        targets,
        ignore_index,
        reduction,
        label_smoothing,
        True,
        weight,
        z_loss,
        softcap,
        variant=variant,
    )
    return loss, dlogits


def cross_entropy_rows(
    logits: TensorValue,
    targets: TensorValue,
    options: TensorValue,
    *,
    reduction: str,
    with_grad: bool,
    variant: str = "auto",
) -> list[TensorValue]:
    """The cross-entropy op on its own view: (rows, classes) logits, (rows,)
    int64 targets and `options`, a float64 tensor on the logits' device:
    (ignore_index, label_smoothing), or the extended options (z-loss,
    softcap, class weights) laid out by `validation.cross_entropy_options`
    (`extended_layout` in op/cross_entropy_math.mojo), so that a model built on this
    (models.cross_entropy_model) serves every value of them. Returns [loss]
    or [loss, dlogits]; loss is (1,) for "mean"/"sum", (rows,) for "none".
    `variant`: the GPU strategy (`CROSS_ENTROPY_VARIANTS`)."""
    name = "cross_entropy_with_grad" if with_grad else "cross_entropy"
    check_variant(variant, logits.device.device_type.value, name)
    return _loss_op(name, logits, targets, options, reduction, with_grad, _variant(variant))


def _loss_op(
    name: str,
    logits: TensorValue,
    targets: TensorValue,
    options: TensorValue,
    reduction: str,
    with_grad: bool,
    parameters: dict[str, str],
) -> list[TensorValue]:
    """Loss op `name` (a cross-entropy of ours) of (rows, classes) `logits`,
    its targets and options: [loss] or [loss, dlogits], the loss (1,) for
    "mean"/"sum", (rows,) for "none"."""
    check_graph_device(logits.device, f"the logits of {name}")
    _ensure_kernels_loaded()
    rows = logits.shape[0]
    loss_type = TensorType(logits.dtype, [rows] if reduction == "none" else [1], logits.device)
    out_types = [loss_type]
    if with_grad:
        out_types.append(TensorType(logits.dtype, logits.shape, logits.device))
    outs = ops.custom(
        name=name,
        device=logits.device,
        values=[logits, targets, options],
        out_types=out_types,
        parameters={"reduction": reduction, **parameters},
    )
    return [v.tensor for v in outs]


def _cross_entropy(
    logits: TensorValue,
    targets: TensorValue,
    ignore_index: int,
    reduction: str,
    label_smoothing: float,
    with_grad: bool,
    weight: TensorValue | np.ndarray | None = None,
    z_loss: float = 0.0,
    softcap: float | None = None,
    rows_op: Callable[..., list[TensorValue]] | None = None,
    variant: str = "auto",
) -> list[TensorValue]:
    """Cross-entropy's edge: checks once, flattens to (rows, classes), runs
    `rows_op` (by default `cross_entropy_rows`; MAX eager passes its declared
    op, `eager.run_cross_entropy`; a forced `variant` needs the default) and
    shapes the results back."""
    logits, targets = TensorValue(logits), TensorValue(targets)
    check_dtype(logits.dtype)
    reduction, ignore_index, eps = check_cross_entropy_options(
        reduction, ignore_index, label_smoothing
    )
    shape = list(logits.shape)
    if targets.dtype.is_float() and len(targets.shape) == len(shape):
        if rows_op is not None or variant != "auto":
            raise ValueError(
                "max_softmax: class-probability targets take the graph's own "
                "soft_cross_entropy op (no variant=)"
            )
        return _soft_cross_entropy(
            logits, targets, reduction, eps, with_grad, weight, z_loss, softcap
        )
    check_cross_entropy_shapes(shape, list(targets.shape))
    check_integer_targets(targets.dtype.is_integral(), targets.dtype.name)
    check_same_device("cross_entropy", "targets", targets.device, logits.device, "the logits'")
    if targets.dtype != DType.int64:
        targets = ops.cast(targets, DType.int64)
    rows = reduce(mul, shape[:-1], Dim(1))
    view = len(shape) == 2
    logits2 = logits if view else ops.reshape(logits, [rows, shape[-1]])
    targets1 = targets if view else ops.reshape(targets, [rows])
    options = _cross_entropy_options(logits, ignore_index, eps, weight, z_loss, softcap)
    extra = _variant(variant)
    if rows_op is None:
        rows_op = cross_entropy_rows
    elif extra:
        raise ValueError("max_softmax: variant= needs the graph's own cross_entropy op")
    outs = rows_op(logits2, targets1, options, reduction=reduction, with_grad=with_grad, **extra)
    loss = ops.reshape(outs[0], shape[:-1] if reduction == "none" else [])
    if with_grad:
        return [loss, outs[1] if view else ops.reshape(outs[1], shape)]
    return [loss]


def soft_cross_entropy_rows(
    logits: TensorValue,
    probs: TensorValue,
    options: TensorValue,
    *,
    reduction: str,
    with_grad: bool = False,
) -> list[TensorValue]:
    """The soft-target cross-entropy op on its own view: (rows, classes)
    logits and class probabilities of one dtype, and `options`, a float64
    tensor on the logits' device (`validation.soft_cross_entropy_options`:
    eps, z_loss, then the class weights if any), so one model serves every
    value of them. Returns [loss] or [loss, dlogits]; loss is (1,) for
    "mean"/"sum", (rows,) for "none"."""
    name = "soft_cross_entropy_with_grad" if with_grad else "soft_cross_entropy"
    return _loss_op(name, logits, probs, options, reduction, with_grad, {})


def soft_cross_entropy_with_grad_rows(
    logits: TensorValue, probs: TensorValue, options: TensorValue, *, reduction: str
) -> list[TensorValue]:
    """`soft_cross_entropy_rows` with the gradient: [loss, dlogits]."""
    return soft_cross_entropy_rows(logits, probs, options, reduction=reduction, with_grad=True)


def _soft_cross_entropy(
    logits: TensorValue,
    probs: TensorValue,
    reduction: str,
    eps: float,
    with_grad: bool,
    weight: TensorValue | np.ndarray | None,
    z_loss: float,
    softcap: float | None,
) -> list[TensorValue]:
    """Cross-entropy against class probabilities `probs` shaped as the
    logits (classes last), by the fused soft_cross_entropy op; shapes the
    results back as `_cross_entropy`. The softcap is not fused here (the
    torch bridge runs it unfused): it raises."""
    shape = list(logits.shape)
    check_soft_targets(shape, list(probs.shape))
    check_same_device("cross_entropy", "targets", probs.device, logits.device, "the logits'")
    z_loss, cap = check_cross_entropy_extras(z_loss, softcap)
    if cap:
        raise NotImplementedError(
            "max_softmax: softcap with class-probability targets runs in the torch "
            "bridge only (max_softmax.torch.cross_entropy)"
        )
    if probs.dtype != logits.dtype:
        probs = ops.cast(probs, logits.dtype)
    if len(shape) == 0:
        check_cross_entropy_shapes(shape, [])
    rows = reduce(mul, shape[:-1], Dim(1))
    view = len(shape) == 2
    logits2 = logits if view else ops.reshape(logits, [rows, shape[-1]])
    probs2 = probs if view else ops.reshape(probs, [rows, shape[-1]])
    options = _soft_options(logits, eps, z_loss, weight)
    outs = soft_cross_entropy_rows(
        logits2, probs2, options, reduction=reduction, with_grad=with_grad
    )
    loss = ops.reshape(outs[0], shape[:-1] if reduction == "none" else [])
    if with_grad:
        return [loss, outs[1] if view else ops.reshape(outs[1], shape)]
    return [loss]


def _soft_options(
    logits: TensorValue, eps: float, z_loss: float, weight: TensorValue | np.ndarray | None
) -> TensorValue:
    """The soft-target options tensor on the logits' device
    (`validation.soft_cross_entropy_options`): (eps, z_loss[, weights])."""
    return _weighted_options(
        logits,
        weight,
        lambda array: soft_cross_entropy_options(eps, z_loss, array),
        [eps, z_loss],
    )


def _cross_entropy_options(
    logits: TensorValue,
    ignore_index: int,
    eps: float,
    weight: TensorValue | np.ndarray | None,
    z_loss: float,
    softcap: float | None,
) -> TensorValue:
    """The float64 options tensor on the logits' device
    (`validation.cross_entropy_options`)."""
    z_loss, cap = check_cross_entropy_extras(z_loss, softcap)
    return _weighted_options(
        logits,
        weight,
        lambda array: cross_entropy_options(ignore_index, eps, z_loss, cap, array),
        [ignore_index, eps, z_loss, cap],
        [0.0] * extended_tail(eps, cap, weighted=True),
    )


def _weighted_options(
    logits: TensorValue,
    weight: TensorValue | np.ndarray | None,
    host: Callable[[np.ndarray | None], np.ndarray],
    head: list[float],
    tail: list[float] | None = None,
) -> TensorValue:
    """An options tensor on the logits' device: `host(weights or None)`'s
    float64 values as a constant where the weight is absent or a host
    array; for a weight given as a graph value, the constant `head`, the
    weight cast in the graph, and the constant `tail`."""
    classes = logits.shape[-1]
    static_classes = int(classes) if isinstance(classes, StaticDim) else classes
    if weight is None or not isinstance(weight, (TensorValue, Value)):
        array = None
        if weight is not None:
            array = np.asarray(weight)
            check_class_weight_array(array, static_classes)
        return ops.constant(host(array), DType.float64, device=logits.device)
    weight = TensorValue(weight)
    check_class_weight(list(weight.shape), static_classes)
    check_same_device("cross_entropy", "the weight", weight.device, logits.device, "the logits'")
    parts = [
        ops.constant(np.array(head, dtype=np.float64), DType.float64, device=logits.device),
        ops.cast(weight, DType.float64),
    ]
    if tail:
        parts.append(
            ops.constant(np.array(tail, dtype=np.float64), DType.float64, device=logits.device)
        )
    return ops.concat(parts, axis=0)


def _row_op(
    name: str, x: TensorValue, axis: int, variant: str, dy: TensorValue | None = None
) -> TensorValue:
    x = TensorValue(x)
    check_dtype(x.dtype)
    if dy is not None:
        dy = TensorValue(dy)
        check_dy_like(name, x, dy)
    check_graph_device(x.device, f"the input of {name}")
    check_variant(variant, x.device.device_type.value, name)
    shape = list(x.shape)
    axis = normalize_axis(axis, len(shape))
    _ensure_kernels_loaded()

    # One (outer, n, inner) view for every rank and axis, so each
    # (op, dtype, device) compiles once. The reshapes are free.
    def product(dims: list[Dim]) -> Dim:
        return reduce(mul, dims, Dim(1))

    view = [product(shape[:axis]), shape[axis], product(shape[axis + 1 :])]
    canonical = len(shape) == 3 and axis == 1
    values = [v if canonical else ops.reshape(v, view) for v in ([x] if dy is None else [x, dy])]
    x3 = values[0]
    parameters = _variant(variant)
    (y3,) = ops.custom(
        name=name,
        device=x.device,
        values=values,
        out_types=[TensorType(x.dtype, x3.shape, x.device)],
        parameters=parameters or None,
    )
    y = y3.tensor
    return y if canonical else ops.reshape(y, shape)


def _variant(variant: str) -> dict[str, str]:
    """The op parameters that force `variant` (none for "auto": the
    registrations' default)."""
    return {} if variant == "auto" else {"variant": variant}


def _ensure_kernels_loaded() -> None:
    graph = Graph.current
    waits.user_graph(graph)  # its load will compile our ops: say so once
    if any(is_kernel_library(p) for p in graph.kernel_libraries_paths):
        return
    try:
        graph._import_kernels([kernel_library()])
    except Exception as err:  # pragma: no cover - depends on MAX internals
        raise RuntimeError(
            "max_softmax: could not add the kernel library to this graph; "
            "create it with Graph(..., custom_extensions=[max_softmax.KERNELS])"
        ) from err


from .linear_graph import (  # noqa: E402,F401
    linear_cross_entropy,
    linear_cross_entropy_with_grad,
)
from .sharded import sharded_cross_entropy, sharded_log_softmax, sharded_softmax  # noqa: E402,F401
