"""numpy <-> MAX element types, including bfloat16 (which numpy lacks)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
from max.driver import Buffer
from max.dtype import DType

from .devices import device

BFLOAT16 = np.dtype(ml_dtypes.bfloat16)

_FROM_NUMPY: dict[np.dtype, DType] = {
    np.dtype(np.float32): DType.float32,
    np.dtype(np.float16): DType.float16,
    np.dtype(np.float64): DType.float64,
    BFLOAT16: DType.bfloat16,
}

DTYPE_NAMES: dict[str, np.dtype] = {
    "float32": np.dtype(np.float32),
    "float16": np.dtype(np.float16),
    "bfloat16": BFLOAT16,
    "float64": np.dtype(np.float64),
}
"""The dtype names the command line and benchmarks accept."""


def max_dtype(dtype: np.dtype) -> DType:
    """The MAX DType of a numpy dtype; raises TypeError if unsupported."""
    try:
        return _FROM_NUMPY[np.dtype(dtype)]
    except KeyError:
        names = ", ".join(DTYPE_NAMES)
        raise TypeError(
            f"max_softmax: softmax needs a floating-point array ({names}), got {np.dtype(dtype)}"
        ) from None


def to_buffer(array: np.ndarray) -> Buffer:
    """A host Buffer sharing `array`'s memory (array must be C-contiguous)."""
    if array.dtype == BFLOAT16:
        # DLPack has no bfloat16 from numpy: move the bits as uint16.
        return Buffer.from_numpy(array.view(np.uint16)).view(DType.bfloat16, array.shape)
    return Buffer.from_numpy(array)


def to_numpy(buffer: Buffer) -> np.ndarray:
    """A numpy array with `buffer`'s contents (copied to the host if needed)."""
    if not buffer.device.is_host:
        buffer = buffer.to(device("cpu"))
    if buffer.dtype == DType.bfloat16:
        # The shape is given: MAX cannot deduce it for a 0-d buffer (a loss).
        return buffer.view(DType.uint16, buffer.shape).to_numpy().view(BFLOAT16)
    return buffer.to_numpy()
