"""Array-level functions: numpy (or any DLPack array) in, numpy out."""

from __future__ import annotations

from typing import Any

import numpy as np

from .dtypes import max_dtype, to_buffer, to_numpy
from .models import ModelKey, device, get_model, resolve_device
from .ops import VARIANTS
from .validation import canonical_shape, normalize_axis


def softmax(x: Any, axis: int = -1, *, device: str = "auto", variant: str = "auto") -> np.ndarray:
    """Softmax of array `x` along `axis`, computed by our Mojo kernels.

    Args:
        x: A numpy array or anything with `__dlpack__` / `__array__`, of
            dtype float32, float16, bfloat16 (ml_dtypes) or float64, rank >= 1.
        axis: Axis to normalise; negative counts from the end.
        device: "auto" (a GPU if MAX finds one, else the CPU), "cpu" or "gpu".
        variant: GPU kernel family, for benchmarks; "auto" picks by shape.

    Returns:
        A new numpy array of the same shape and dtype. Rows holding NaN or
        +inf, and rows of only -inf, come out NaN, as in SciPy. An empty
        array gives an empty array.
    """
    return _run("softmax", x, axis, device, variant)


def log_softmax(
    x: Any, axis: int = -1, *, device: str = "auto", variant: str = "auto"
) -> np.ndarray:
    """Log-softmax of array `x` along `axis`; arguments as for `softmax`."""
    return _run("log_softmax", x, axis, device, variant)


def as_array(x: Any) -> np.ndarray:
    """`x` as a numpy array, without copying where possible."""
    if isinstance(x, np.ndarray):
        return x
    if hasattr(x, "__dlpack__") and not hasattr(x, "__array__"):
        return np.from_dlpack(x)
    return np.asarray(x)


def _run(op: str, x: Any, axis: int, device_name: str, variant: str) -> np.ndarray:
    array = as_array(x)
    dtype = max_dtype(array.dtype)
    axis = normalize_axis(axis, array.ndim)
    if variant not in VARIANTS:
        raise ValueError(f"max_softmax: unknown variant {variant!r}; choose one of {VARIANTS}")
    kind = resolve_device(device_name)
    if array.size == 0:
        return np.empty(array.shape, dtype=array.dtype)
    model = get_model(ModelKey(op, dtype, kind, variant))
    view = np.ascontiguousarray(array).reshape(canonical_shape(array.shape, axis))
    buffer = to_buffer(view)
    if kind == "gpu":
        buffer = buffer.to(device("gpu"))
    (out,) = model.execute(buffer)
    return to_numpy(out).reshape(array.shape)
