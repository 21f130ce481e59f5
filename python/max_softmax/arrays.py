"""Array-level functions: numpy (or any DLPack array) in, numpy out.

This is an edge: arguments are checked here, once. On the CPU every op
then runs through the launch extension (`launch.py`) on the arrays' memory,
with no graph compile and ~1 µs of host work; elsewhere (a GPU, or the
extension switched off or still building) the cached model runs on the
(outer, n, inner) view of the array.

Every function takes `out=`, a numpy array to write the result into (as
numpy's ufuncs): the way to avoid a fresh output's page faults call after
call. Without it, outputs of `POOLED_BYTES` and more come from
`host_pool`: blocks on 2 MiB pages, returned for reuse when the array is
freed, so a repeated large call writes to mapped pages instead of taking
fresh ones from the kernel.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np
from max.driver import Buffer

from . import eager, host_pool, launch
from .devices import device, device_kind, resolve_device
from .dtypes import DTYPE_NAMES, max_dtype, to_buffer, to_numpy
from .models import (
    ModelKey,
    cross_entropy_model,
    masked_model,
    row_op_model,
    soft_cross_entropy_model,
)
from .validation import (
    EMPTY_LOSS,
    canonical_shape,
    check_class_weight_array,
    check_cross_entropy_extras,
    check_cross_entropy_options,
    check_cross_entropy_shapes,
    check_dy_like,
    check_integer_targets,
    check_mask_dtype,
    check_masked_options,
    check_scale,
    check_soft_targets,
    check_targets_in_range,
    check_variant,
    cross_entropy_options,
    is_masked_call,
    mask_suffix,
    masked_flags,
    masked_options,
    masked_view,
    normalize_axis,
    soft_cross_entropy_options,
)

if TYPE_CHECKING:
    from max.experimental.tensor import Tensor


def softmax(
    x: Any,
    axis: int = -1,
    *,
    device: str = "auto",
    variant: str = "auto",
    scale: float | None = None,
    mask: Any = None,
    causal: bool = False,
    out: np.ndarray | None = None,
) -> np.ndarray | Tensor:
    """Softmax of array `x` along `axis`, computed by our Mojo kernels.

    Args:
        x: A numpy array or anything with `__dlpack__` / `__array__`, of
            dtype float32, float16, bfloat16 (ml_dtypes) or float64, rank >= 1.
        axis: Axis to normalise; negative counts from the end.
        device: "auto" (the first GPU if MAX finds one, else the CPU), "cpu",
            "gpu" (the first GPU, "gpu:0") or "gpu:N" (GPU N, torch's cuda:N).
        variant: GPU kernel family, for benchmarks; "auto" picks by shape.
        scale: Multiply x by this first (temperature T: 1 / T); a finite
            float, a run-time value (no recompile per scale).
        mask: An array broadcastable to x: boolean (True keeps, as torch's
            scaled_dot_product_attention) or floating (added after scaling;
            -inf drops).
        causal: Over the last two axes (L, n), row i keeps columns j <= i
            (torch's `is_causal`, top-left aligned), computed in the kernel.
        out: A numpy array of x's shape and dtype to write the result into
            (returned); it may be x itself. numpy inputs only.

    A `max.experimental.tensor.Tensor` gives a `Tensor` on its own device
    (see `max_softmax.eager`), scale, mask and causal included.

    Returns:
        A new numpy array of the same shape and dtype. Rows holding NaN or
        +inf, and rows of only -inf, come out NaN, as in SciPy. With scale,
        mask or causal a row with nothing kept (masked out, or only -inf)
        comes out 0. An empty array gives an empty array.
    """
    if is_masked_call(scale, mask, causal):
        return _run_masked("softmax", x, axis, device, variant, scale, mask, causal, out)
    return _run("softmax", x, axis, device, variant, out=out)


def log_softmax(
    x: Any,
    axis: int = -1,
    *,
    device: str = "auto",
    variant: str = "auto",
    scale: float | None = None,
    mask: Any = None,
    causal: bool = False,
    out: np.ndarray | None = None,
) -> np.ndarray | Tensor:
    """Log-softmax of array `x` along `axis`; arguments as for `softmax`. A
    row with nothing kept comes out -inf."""
    if is_masked_call(scale, mask, causal):
        return _run_masked("log_softmax", x, axis, device, variant, scale, mask, causal, out)
    return _run("log_softmax", x, axis, device, variant, out=out)


def softmax_backward(
    y: Any,
    dy: Any,
    axis: int = -1,
    *,
    device: str = "auto",
    scale: float | None = None,
    out: np.ndarray | None = None,
) -> np.ndarray | Tensor:
    """Gradient of softmax, dx = y * (dy - sum(dy * y, axis)), as numpy.

    Args:
        y: `softmax(x, axis)` (with any scale, mask, causal).
        dy: Gradient of the loss with respect to y (same shape and dtype).
        axis: The axis softmax was taken along.
        device: "auto", "cpu", "gpu" or "gpu:N", as for `softmax`.
        scale: The forward's scale; dx is multiplied by it. Masked
            positions (y = 0) get 0.
        out: A numpy array of y's shape and dtype to write dx into
            (returned); it may be y or dy.
    """
    value = check_scale("softmax_backward", scale)
    dx = _run("softmax_backward", y, axis, device, "auto", dy, out)
    return _scaled("softmax_backward", dx, value)


def log_softmax_backward(
    logp: Any,
    dy: Any,
    axis: int = -1,
    *,
    device: str = "auto",
    scale: float | None = None,
    out: np.ndarray | None = None,
) -> np.ndarray | Tensor:
    """Gradient of log-softmax, dx = dy - exp(logp) * sum(dy, axis), as numpy.

    Arguments as for `softmax_backward`, with `logp = log_softmax(x, axis)`.
    The formula applies as it is at masked positions (logp = -inf): dx =
    scale * dy there; the torch bridge gives 0 (the gradient of masked_fill).
    """
    value = check_scale("log_softmax_backward", scale)
    dx = _run("log_softmax_backward", logp, axis, device, "auto", dy, out)
    return _scaled("log_softmax_backward", dx, value)


def cross_entropy(
    logits: Any,
    targets: Any,
    *,
    ignore_index: int = -100,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
    weight: Any = None,
    z_loss: float = 0.0,
    softcap: float | None = None,
    device: str = "auto",
) -> np.ndarray:
    """Cross-entropy of `logits` against class indices or class
    probabilities `targets`, as `torch.nn.functional.cross_entropy` with
    classes on the last axis.

    Args:
        logits: A float32/float16/bfloat16/float64 array (..., classes).
        targets: Integer class indices, shaped `logits.shape[:-1]`; or
            class probabilities, a floating array shaped as `logits` (the
            fused soft-target op: ignore_index does not apply, "mean" is
            over the rows, weighted or not, and softcap is not taken).
        ignore_index: Target value whose rows add nothing and count for
            nothing in the mean.
        reduction: "mean" (over the rows kept: NaN if none is, as torch),
            "sum" or "none" (a loss a row, 0 for ignored rows).
        label_smoothing: eps in [0, 1], as torch's `label_smoothing`.
        weight: torch's class weights, an array (classes,): row loss
            w[t] (lse - x_t) ((1 - eps) of it plus eps / C sum_c w_c (lse -
            x_c) with smoothing); "mean" divides by the sum of w[t] over the
            kept rows.
        z_loss: w >= 0: each kept row adds w * lse^2 (lse after the softcap).
        softcap: c > 0 (None or 0: off): logits become c * tanh(x / c) first.
        device: "auto" (the first GPU if MAX finds one, else the CPU), "cpu",
            "gpu" (the first GPU, "gpu:0") or "gpu:N" (GPU N, torch's cuda:N).

    Returns:
        The loss in the logits' dtype: a 0-d array for "mean"/"sum",
        shaped `logits.shape[:-1]` for "none". MAX Tensor logits give
        Tensors on their device (`eager.run_cross_entropy`).

    Raises:
        ValueError: a target outside [0, classes) that is not
            `ignore_index` (checked on the host before anything runs), or
            targets of the wrong shape; TypeError for non-integer targets.
    """
    extras = (weight, z_loss, softcap)
    return _cross_entropy(
        logits, targets, ignore_index, reduction, label_smoothing, device, False, *extras
    )[0]


def cross_entropy_with_grad(
    logits: Any,
    targets: Any,
    *,
    ignore_index: int = -100,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
    weight: Any = None,
    z_loss: float = 0.0,
    softcap: float | None = None,
    device: str = "auto",
    out: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """`cross_entropy` and dlogits = d loss / d logits, from one fused pass
    over the logits (read once, gradient written once on the GPU's
    on-chip path).

    Arguments as `cross_entropy`, and `out`: a numpy array of the logits'
    shape and dtype to write dlogits into (returned as dlogits; it may be
    the logits themselves). Returns (loss, dlogits); dlogits has the
    shape and dtype of `logits`. For reduction "none" it is the gradient of
    the sum of the row losses (multiply row i by d total / d loss[i]).
    """
    extras = (weight, z_loss, softcap)
    loss, dlogits = _cross_entropy(
        logits,
        targets,
        ignore_index,
        reduction,
        label_smoothing,
        device,
        True,
        *extras,
        out=out,
    )
    return loss, dlogits


def _cross_entropy(
    logits: Any,
    targets: Any,
    ignore_index: int,
    reduction: str,
    label_smoothing: float,
    device_name: str,
    with_grad: bool,
    weight: Any = None,
    z_loss: float = 0.0,
    softcap: float | None = None,
    out: np.ndarray | None = None,
) -> list[Any]:
    if eager.is_max_tensor(logits):
        _check_tensor_options(device_name, "auto", out)
        if not eager.is_max_tensor(targets):
            targets = as_array(targets)
        if weight is not None and not eager.is_max_tensor(weight):
            weight = as_array(weight)
        return eager.run_cross_entropy(
            logits,
            targets,
            ignore_index,
            reduction,
            label_smoothing,
            with_grad,
            weight=weight,
            z_loss=z_loss,
            softcap=softcap,
        )
    array = as_array(logits)
    dtype = max_dtype(array.dtype)
    reduction, ignore_index, eps = check_cross_entropy_options(
        reduction, ignore_index, label_smoothing
    )
    z_loss, cap = check_cross_entropy_extras(z_loss, softcap)
    weight_array = None
    if weight is not None:
        weight_array = as_array(weight)
        check_class_weight_array(weight_array, array.shape[-1] if array.ndim else 0)
    target_array = as_array(targets)
    # Floating targets of the logits' rank are class probabilities; others
    # are checked (and refused) as class indices.
    soft = _is_floating(target_array) and target_array.ndim == array.ndim
    if soft:
        check_soft_targets(list(array.shape), list(target_array.shape))
        if cap:
            raise NotImplementedError(
                "max_softmax: softcap with class-probability targets runs in the torch "
                "bridge only (max_softmax.torch.cross_entropy)"
            )
    target_rows = target_array.shape[:-1] if soft else target_array.shape
    check_cross_entropy_shapes(list(array.shape), list(target_rows))
    classes = array.shape[-1]
    if not soft:
        check_integer_targets(target_array.dtype.kind in "iu", target_array.dtype)
        # The targets are on the host here: a bad one is an exception now,
        # before anything runs (the GPU kernel could only mark its row NaN).
        check_targets_in_range(target_array, classes, ignore_index)
    _check_out(out, array)
    kind = resolve_device(device_name)
    rows = int(np.prod(array.shape[:-1], dtype=np.int64))
    loss_shape = array.shape[:-1] if reduction == "none" else ()
    if rows == 0 or classes == 0:
        # Nothing to run (every row ignored when there are no classes):
        # torch's values for empty sums and means.
        empty = EMPTY_LOSS[reduction]
        result = [np.full(loss_shape, empty, dtype=array.dtype)]
        if not with_grad:
            return result
        if out is None:
            return [*result, np.zeros(array.shape, dtype=array.dtype)]
        out.fill(0)
        return [*result, out]
    logits = np.ascontiguousarray(array).reshape(rows, classes)
    if soft:
        # Class probabilities in the logits' dtype; "mean" over the rows.
        probs = np.ascontiguousarray(target_array, dtype=array.dtype).reshape(rows, classes)
        inputs = [logits, probs, soft_cross_entropy_options(eps, z_loss, weight_array)]
    else:
        inputs = [
            logits,
            np.ascontiguousarray(target_array, dtype=np.int64).reshape(rows),
            cross_entropy_options(ignore_index, eps, z_loss, cap, weight_array),
        ]
    if kind == "cpu" and launch.available_for_arrays():
        return _launch_cross_entropy(
            inputs, reduction, with_grad, loss_shape, array.shape, out, soft
        )
    model = soft_cross_entropy_model if soft else cross_entropy_model
    outs = _execute(model(with_grad, dtype, kind, reduction), inputs, kind)
    result = [to_numpy(outs[0]).reshape(loss_shape)]
    if with_grad:
        result.append(_deliver(to_numpy(outs[1]).reshape(array.shape), out))
    return result


def _is_floating(array: np.ndarray) -> bool:
    """Whether `array` holds floating values (bfloat16 included): class
    probabilities, as a cross-entropy target."""
    return array.dtype.kind == "f" or array.dtype.name == "bfloat16"


def as_array(x: Any) -> np.ndarray:
    """`x` as a numpy array in native byte order, without copying where possible."""
    if isinstance(x, np.ndarray):
        array = x
    elif hasattr(x, "__dlpack__") and not hasattr(x, "__array__"):
        array = np.from_dlpack(x)
    else:
        array = np.asarray(x)
    if not array.dtype.isnative:  # e.g. big-endian '>f4' from a file
        array = array.astype(array.dtype.newbyteorder("="))
    return array


def _run(
    op: str,
    x: Any,
    axis: int,
    device_name: str,
    variant: str,
    dy: Any = None,
    out: np.ndarray | None = None,
) -> Any:
    if eager.is_max_tensor(x):
        _check_tensor_options(device_name, variant, out)
        return eager.run(op, x, axis, dy)
    array = as_array(x)
    dtype = max_dtype(array.dtype)
    axis = normalize_axis(axis, array.ndim)
    arrays = [array]
    if dy is not None:
        arrays.append(as_array(dy))
        check_dy_like(op, array, arrays[1], lambda a: list(a.shape))
    _check_out(out, array)
    kind = resolve_device(device_name)
    check_variant(variant, device_kind(kind))
    if array.size == 0:
        return _empty_result(array, out)
    view = canonical_shape(array.shape, axis)
    if kind == "cpu" and launch.available_for_arrays():
        return _launch_rows(op, arrays, view, out)
    model = row_op_model(ModelKey(op, dtype, kind, variant))
    (result,) = _execute(model, [np.ascontiguousarray(a).reshape(view) for a in arrays], kind)
    return _deliver(to_numpy(result).reshape(array.shape), out)


_LAUNCH_CODES: dict[np.dtype, int] = {
    DTYPE_NAMES[name]: code for name, code in launch.DTYPE_CODES.items()
}
"""The launch extension's dtype codes by numpy dtype (a name lookup costs
more than the launch on the per-call path)."""


POOLED_BYTES = 8 << 20
"""Outputs of this many bytes and more come from `host_pool` (huge pages,
reused); smaller ones from numpy."""


def empty(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """An uninitialised C-contiguous host array: on a pooled huge-page block
    at `POOLED_BYTES` and more (`host_pool`), else from numpy."""
    if math.prod(shape) * dtype.itemsize < POOLED_BYTES:
        return np.empty(shape, dtype=dtype)
    return host_pool.empty(shape, dtype)


def _execute(model: Any, arrays: list[np.ndarray], kind: str) -> list[Buffer]:
    """`model`'s outputs for host `arrays` (C-contiguous), moved first to
    device `kind` where it is not the CPU: the cached-model path of every op."""
    buffers = [to_buffer(a) for a in arrays]
    if kind != "cpu":
        buffers = [b.to(device(kind)) for b in buffers]
    return model.execute(*buffers)


def _empty_result(array: np.ndarray, out: np.ndarray | None) -> np.ndarray:
    """The result of a row op on an empty `array`: `out` where given (there is
    nothing to write), else a new empty array of its shape and dtype."""
    return np.empty(array.shape, dtype=array.dtype) if out is None else out


def _check_out(out: Any, like: np.ndarray) -> None:
    """`out=`: a writeable numpy array of `like`'s shape and dtype."""
    if out is None:
        return
    if not isinstance(out, np.ndarray):
        raise TypeError(f"max_softmax: out= needs a numpy array, got {type(out).__name__}")
    if out.shape != like.shape or out.dtype != like.dtype:
        raise ValueError(
            f"max_softmax: out= must have the input's shape {like.shape} and dtype "
            f"{like.dtype}, got {out.shape} {out.dtype}"
        )
    if not out.flags.writeable:
        raise ValueError("max_softmax: out= is read-only")


def _destination(out: np.ndarray | None, inputs: list[np.ndarray]) -> np.ndarray:
    """Where a launch writes: `out` itself where it is C-contiguous and
    shares no memory with an input (the kernels take no overlap), else a
    new array (`_deliver` copies it into `out`)."""
    if out is not None and out.flags.c_contiguous:
        if not any(np.may_share_memory(out, a) for a in inputs):
            return out
    return empty(inputs[0].shape, inputs[0].dtype)


def _deliver(result: np.ndarray, out: np.ndarray | None) -> np.ndarray:
    """`result`, or `out` holding it."""
    if out is None or out is result:
        return result
    np.copyto(out, result)
    return out


def _launch_rows(
    op: str, arrays: list[np.ndarray], view: tuple[int, int, int], out: np.ndarray | None
) -> np.ndarray:
    """Row op `op` of host `arrays` (x, or y and dy) through the launch
    extension (`launch.py`): the row function MAX's op calls, on the arrays'
    memory, ~1 µs of host work where `Model.execute` costs 35-60 µs."""
    inputs = [np.ascontiguousarray(a) for a in arrays]
    dst = _destination(out, inputs)
    launch.run_rows(
        op,
        launch.cpu_context(),
        None,
        _LAUNCH_CODES[dst.dtype],
        dst.ctypes.data,
        [a.ctypes.data for a in inputs],
        *view,
    )
    return _deliver(dst.reshape(arrays[0].shape), out)


def _launch_cross_entropy(
    inputs: list[np.ndarray],
    reduction: str,
    with_grad: bool,
    loss_shape: tuple[int, ...],
    shape: tuple[int, ...],
    out: np.ndarray | None = None,
    soft: bool = False,
) -> list[np.ndarray]:
    """Cross-entropy of host (rows, classes) logits, (rows,) int64 targets
    and the float64 options (`cross_entropy_options`: plain or extended,
    passed to the extension as they are) through the launch extension, as
    `_launch_rows` runs the row ops; dlogits into `out` where given. With
    `soft`, the targets are class probabilities of the logits' shape and
    dtype, the options `soft_cross_entropy_options`."""
    logits = inputs[0]
    rows = logits.shape[0]
    loss = np.empty(rows if reduction == "none" else 1, dtype=logits.dtype)
    dlogits = _destination(out, inputs[: 2 if soft else 1]) if with_grad else None
    launch.run_cross_entropy(
        launch.cpu_context(),
        None,
        _LAUNCH_CODES[logits.dtype],
        reduction,
        loss.ctypes.data,
        None if dlogits is None else dlogits.ctypes.data,
        *[a.ctypes.data for a in inputs],
        *logits.shape,
        len(inputs[2]),
        soft,
    )
    if dlogits is None:
        return [loss.reshape(loss_shape)]
    return [loss.reshape(loss_shape), _deliver(dlogits.reshape(shape), out)]


def _check_tensor_options(device_name: str, variant: str, out: Any = None) -> None:
    """A MAX Tensor runs where it is, with the dispatch table, into a new
    Tensor."""
    if out is not None:
        raise ValueError("max_softmax: out= takes numpy arrays; a MAX Tensor gives a new Tensor")
    if device_name != "auto" or variant != "auto":
        raise ValueError(
            "max_softmax: a MAX Tensor runs on its own device with the dispatch "
            "table; leave device and variant at 'auto' (move it with .to(device))"
        )


def _scaled(op: str, dx: Any, value: float) -> Any:
    """dx * value (the checked scale), in place on the host in the
    accumulator type, rounded once (a MAX Tensor's dx is scaled in its
    graph)."""
    if value == 1.0:
        return dx
    if eager.is_max_tensor(dx):
        return eager.scaled(op, dx, value)
    if not dx.flags.writeable:
        dx = dx.copy()
    if dx.dtype in (np.float32, np.float64):
        np.multiply(dx, dx.dtype.type(value), out=dx)
        return dx
    dx[...] = (dx.astype(np.float32) * np.float32(value)).astype(dx.dtype)
    return dx


def additive_mask(op: str, mask: Any, dtype: np.dtype) -> np.ndarray:
    """A boolean (True keeps) or floating mask as the additive mask the
    kernels read, in `dtype`: 0 where kept, -inf where dropped."""
    array = as_array(mask)
    is_float = array.dtype.kind == "f" or array.dtype.name == "bfloat16"
    check_mask_dtype(op, array.dtype == np.bool_, is_float, array.dtype)
    if array.dtype == np.bool_:
        return np.where(array, 0.0, -np.inf).astype(dtype)
    return array.astype(dtype, copy=False)


def _run_masked(
    op: str,
    x: Any,
    axis: int,
    device_name: str,
    variant: str,
    scale: float | None,
    mask: Any,
    causal: bool,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """softmax / log_softmax with scale, mask, causal: the edge (checks
    once, the mask reduced to (mask_rows, n) rows, the axis moved last if
    it is not), then the launch extension on the CPU, else the masked
    model."""
    if eager.is_max_tensor(x):
        _check_tensor_options(device_name, variant, out)
        if mask is not None and not eager.is_max_tensor(mask):
            mask = as_array(mask)
        return eager.run_masked(op, x, axis, scale, mask, causal)
    array = as_array(x)
    dtype = max_dtype(array.dtype)
    axis = normalize_axis(axis, array.ndim)
    value, causal = check_masked_options(op, scale, causal, array.ndim, axis, variant)
    _check_out(out, array)
    kind = resolve_device(device_name)
    last = axis == array.ndim - 1
    work = array if last else np.moveaxis(array, axis, -1)
    m = np.zeros((1, 1), dtype=array.dtype)  # a placeholder the kernel does not read
    if mask is not None:
        m = additive_mask(op, mask, array.dtype)
        k = mask_suffix(op, list(array.shape), list(m.shape), last)
        if array.size == 0:
            return _empty_result(array, out)
        if not k:  # one mask row per row of x
            m = np.broadcast_to(m, array.shape)
            m = m if last else np.moveaxis(m, axis, -1)
        # k: the mask is x's last k dims (leading size-1 axes aside), so
        # (mask_rows, n) with row r of x reading mask row r % mask_rows.
        m = np.ascontiguousarray(m).reshape(-1, work.shape[-1])
    if array.size == 0:
        return _empty_result(array, out)
    view = masked_view(list(work.shape))
    flags = masked_flags(mask is not None, causal)
    options = np.array(masked_options(value, flags), dtype=np.float64)
    if kind == "cpu" and launch.available_for_arrays():
        x3 = np.ascontiguousarray(work)
        # The kernel writes the moved-axis layout; `out` takes it directly
        # only where the axis is already last.
        dst = _destination(out if last else None, [x3, m])
        launch.run_masked(
            f"{op}_masked",
            launch.cpu_context(),
            None,
            _LAUNCH_CODES[dst.dtype],
            flags,
            dst.ctypes.data,
            x3.ctypes.data,
            m.ctypes.data,
            options.ctypes.data,
            *view,
            m.shape[0],
        )
        result = dst.reshape(work.shape)
    else:
        model = masked_model(f"{op}_masked", dtype, kind)
        (y,) = _execute(model, [np.ascontiguousarray(work).reshape(view), m, options], kind)
        result = to_numpy(y).reshape(work.shape)
    if not last:
        result = np.moveaxis(result, -1, axis)
        return result.copy() if out is None else _deliver(result, out)
    return _deliver(result, out)
