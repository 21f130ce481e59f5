"""max-softmax: a fast, exact softmax for MAX, written in Mojo.

- `max_softmax.ops.softmax(x, axis)`: add the op to your own MAX graph;
- `max_softmax.softmax(array, axis, device=...)`: numpy in, numpy out (a MAX
  eager `Tensor` in, a `Tensor` out: see `max_softmax.eager`);
- `max_softmax.KERNELS`: the Mojo package for `custom_extensions=[...]`.
"""

from . import eager, ops
from ._paths import KERNELS
from .arrays import log_softmax, log_softmax_backward, softmax, softmax_backward
from .devices import NoGPUError, gpu_available
from .validation import SUPPORTED_DTYPES, SoftmaxInputError

__all__ = [
    "KERNELS",
    "SUPPORTED_DTYPES",
    "NoGPUError",
    "SoftmaxInputError",
    "gpu_available",
    "log_softmax",
    "log_softmax_backward",
    "eager",
    "ops",
    "softmax",
    "softmax_backward",
]
