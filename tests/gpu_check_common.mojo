"""What the GPU build checks (tests/gpu_*_check.mojo) share.

A check launches each kernel of a family on scratch device buffers, for
every dtype the ops take. Building it for sm_90 compiles every kernel (the
test, on a machine without a GPU); running it needs a GPU.
"""

from max.gpu.host import DeviceBuffer

comptime CHECK_DTYPES = [
    DType.float32,
    DType.float16,
    DType.bfloat16,
    DType.float64,
]
"""The element types a check compiles each kernel for: every one the ops
take."""


def ptr[
    dtype: DType
](buf: DeviceBuffer[dtype]) -> Pointer[Scalar[dtype], MutAnyOrigin]:
    """The buffer's device address, as the launchers take it."""
    return rebind[Pointer[Scalar[dtype], MutAnyOrigin]](buf.unsafe_ptr())
