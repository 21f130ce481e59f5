"""Array-level functions: numpy (or any DLPack array) in, numpy out.

This is an edge: arguments are checked here, once, then the cached model
(models.row_op_model) runs on the (outer, n, inner) view of the array.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from . import eager
from .devices import device, resolve_device
from .dtypes import max_dtype, to_buffer, to_numpy
from .models import ModelKey, row_op_model
from .validation import canonical_shape, check_dy_like, check_variant, normalize_axis

if TYPE_CHECKING:
    from max.experimental.tensor import Tensor


def softmax(
    x: Any, axis: int = -1, *, device: str = "auto", variant: str = "auto"
) -> np.ndarray | Tensor:
    """Softmax of array `x` along `axis`, computed by our Mojo kernels.

    Args:
        x: A numpy array or anything with `__dlpack__` / `__array__`, of
            dtype float32, float16, bfloat16 (ml_dtypes) or float64, rank >= 1.
        axis: Axis to normalise; negative counts from the end.
        device: "auto" (a GPU if MAX finds one, else the CPU), "cpu" or "gpu".
        variant: GPU kernel family, for benchmarks; "auto" picks by shape.

    A `max.experimental.tensor.Tensor` gives a `Tensor` on its own device
    (see `max_softmax.eager`).

    Returns:
        A new numpy array of the same shape and dtype. Rows holding NaN or
        +inf, and rows of only -inf, come out NaN, as in SciPy. An empty
        array gives an empty array.
    """
    return _run("softmax", x, axis, device, variant)


def log_softmax(
    x: Any, axis: int = -1, *, device: str = "auto", variant: str = "auto"
) -> np.ndarray | Tensor:
    """Log-softmax of array `x` along `axis`; arguments as for `softmax`."""
    return _run("log_softmax", x, axis, device, variant)


def softmax_backward(
    y: Any, dy: Any, axis: int = -1, *, device: str = "auto"
) -> np.ndarray | Tensor:
    """Gradient of softmax, dx = y * (dy - sum(dy * y, axis)), as numpy.

    Args:
        y: `softmax(x, axis)`.
        dy: Gradient of the loss with respect to y (same shape and dtype).
        axis: The axis softmax was taken along.
        device: "auto", "cpu" or "gpu".
    """
    return _run("softmax_backward", y, axis, device, "auto", dy)


def log_softmax_backward(
    logp: Any, dy: Any, axis: int = -1, *, device: str = "auto"
) -> np.ndarray | Tensor:
    """Gradient of log-softmax, dx = dy - exp(logp) * sum(dy, axis), as numpy.

    Arguments as for `softmax_backward`, with `logp = log_softmax(x, axis)`.
    """
    return _run("log_softmax_backward", logp, axis, device, "auto", dy)


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


def _run(op: str, x: Any, axis: int, device_name: str, variant: str, dy: Any = None) -> Any:
    if eager.is_max_tensor(x):
        if device_name != "auto" or variant != "auto":
            raise ValueError(
                "max_softmax: a MAX Tensor runs on its own device with the dispatch "
                "table; leave device and variant at 'auto' (move it with .to(device))"
            )
        return eager.run(op, x, axis, dy)
    array = as_array(x)
    dtype = max_dtype(array.dtype)
    axis = normalize_axis(axis, array.ndim)
    arrays = [array]
    if dy is not None:
        arrays.append(as_array(dy))
        check_dy_like(op, array, arrays[1], lambda a: list(a.shape))
    kind = resolve_device(device_name)
    check_variant(variant, kind)
    if array.size == 0:
        return np.empty(array.shape, dtype=array.dtype)
    model = row_op_model(ModelKey(op, dtype, kind, variant))
    view = canonical_shape(array.shape, axis)
    buffers = [to_buffer(np.ascontiguousarray(a).reshape(view)) for a in arrays]
    if kind == "gpu":
        buffers = [b.to(device("gpu")) for b in buffers]
    (out,) = model.execute(*buffers)
    return to_numpy(out).reshape(array.shape)
