"""max-softmax: a fast, exact softmax for MAX, written in Mojo.

- `max_softmax.ops.softmax(x, axis)`: add the op to your own MAX graph;
- `max_softmax.softmax(array, axis, device=...)`: numpy in, numpy out (a MAX
  eager `Tensor` in, a `Tensor` out: see `max_softmax.eager`);
- `max_softmax.cross_entropy(logits, targets, ...)` and
  `cross_entropy_with_grad` (loss and dlogits, fused), numpy in and out;
- `max_softmax.KERNELS`: the kernel library for `custom_extensions=[...]`
  (precompiled on first use, then cached; `KERNEL_SOURCES` is its source).
"""

from __future__ import annotations

from pathlib import Path

from . import eager, ops
from .arrays import (
    cross_entropy,
    cross_entropy_with_grad,
    log_softmax,
    log_softmax_backward,
    softmax,
    softmax_backward,
)
from .devices import NoGPUError, gpu_available
from .kernels import KERNEL_SOURCES, kernel_library
from .linear import linear_cross_entropy, linear_cross_entropy_with_grad
from .validation import SUPPORTED_DTYPES, SoftmaxInputError

__all__ = [
    "KERNELS",
    "KERNEL_SOURCES",
    "SUPPORTED_DTYPES",
    "NoGPUError",
    "SoftmaxInputError",
    "cross_entropy",
    "cross_entropy_with_grad",
    "eager",
    "gpu_available",
    "kernel_library",
    "linear_cross_entropy",
    "linear_cross_entropy_with_grad",
    "log_softmax",
    "log_softmax_backward",
    "ops",
    "softmax",
    "softmax_backward",
]


def __getattr__(name: str) -> Path:
    # KERNELS is looked up lazily: the first access precompiles the library
    # (~3 s, once per version), which `import max_softmax` need not pay.
    if name == "KERNELS":
        return kernel_library()
    raise AttributeError(f"module 'max_softmax' has no attribute {name!r}")
