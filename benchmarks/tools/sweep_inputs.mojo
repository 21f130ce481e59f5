"""Inputs the kernel sweeps (backward_sweep, ce_loss_sweep) fill on the GPU
and recompute on the host: hashed values each dtype holds exactly."""

from std.sys import size_of

from max.gpu import block_idx, thread_idx
from max.gpu.host import DeviceBuffer, DeviceContext

comptime FILL_THREADS = 256
comptime FILL_BLOCKS = 132 * 16


@always_inline
def hashed_value[
    dtype: DType, log2_range: Int
](e: Int, seed: Int) -> Scalar[dtype]:
    """Element `e` of input `seed`, the same on host and device: a
    splitmix64 hash made into a value of [-2^log2_range, 2^log2_range) that
    `dtype` holds exactly (8 bits for the 16-bit types, 24 for float32 and
    float64), so no rounding or FMA contraction can differ between the
    two."""
    comptime bits = 8 if size_of[dtype]() == 2 else 24
    var z = UInt64(e) + UInt64(seed + 1) * 0x9E3779B97F4A7C15
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
    z = (z ^ (z >> 27)) * 0x94D049BB133111EB
    z ^= z >> 31
    var k = Int(z >> UInt64(64 - bits)) - (1 << (bits - 1))
    return (Float32(k) * Float32(2.0 ** (log2_range + 1 - bits))).cast[dtype]()


def fill_kernel[
    dtype: DType, log2_range: Int
](x: Pointer[Scalar[dtype], MutAnyOrigin], count: Int64, seed: Int64):
    """`x[e] = hashed_value(e, seed)` for e < count, grid-stride."""
    var stride = FILL_BLOCKS * FILL_THREADS
    for e in range(
        Int(block_idx.x) * FILL_THREADS + Int(thread_idx.x), Int(count), stride
    ):
        x[unsafe_offset=e] = hashed_value[dtype, log2_range](e, Int(seed))


def ptr[
    dtype: DType
](buf: DeviceBuffer[dtype]) -> Pointer[Scalar[dtype], MutAnyOrigin]:
    """The buffer's device address, as the kernels take it."""
    return rebind[Pointer[Scalar[dtype], MutAnyOrigin]](buf.unsafe_ptr())


def filled[
    dtype: DType, log2_range: Int
](ctx: DeviceContext, count: Int, seed: Int) raises -> DeviceBuffer[dtype]:
    """A new buffer of `count` elements, `hashed_value(e, seed)` each."""
    var buf = ctx.enqueue_create_buffer[dtype](count)
    ctx.enqueue_function[fill_kernel[dtype, log2_range]](
        ptr(buf),
        Int64(count),
        Int64(seed),
        grid_dim=FILL_BLOCKS,
        block_dim=FILL_THREADS,
    )
    return buf


def filled_inputs[
    dtype: DType, log2_range: Int
](
    ctx: DeviceContext, count: Int, inputs: Int, seed: Int = 0, step: Int = 1
) raises -> List[DeviceBuffer[dtype]]:
    """`inputs` new buffers of `count` elements (`filled`), buffer k of seed
    `seed + k * step`: the inputs a sweep rotates over, more bytes than L2
    holds."""
    var bufs = List[DeviceBuffer[dtype]]()
    for k in range(inputs):
        bufs.append(filled[dtype, log2_range](ctx, count, seed + k * step))
    return bufs^
