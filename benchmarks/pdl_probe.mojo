# Times the register-rows softmax (gpu_register_rows, the table's kernel
# for these shapes) launched back to back with Programmatic Dependent Launch
# off and on, against a device copy, without MAX graphs: it builds on a
# machine without a GPU and runs in seconds on one.
#   mojo build -I . --target-accelerator sm_90 benchmarks/pdl_probe.mojo -o pdl_probe
#   LD_LIBRARY_PATH=$HOME/site/modular/lib ./pdl_probe   # on the GPU machine
# PDL is a compile-time choice, so both instances are built and the two
# modes alternate (off, on) for ROUNDS rounds a shape; each round's figure
# is the median of REPS timings of ITERS back-to-back launches, inputs
# rotated over buffers twice the L2 in all. GB/s = 2 x tensor bytes / us.
# Before timing, row 0 of each mode's output is checked against a float64
# softmax, and a chain of dependent launches (each reads the previous one's
# output and overwrites the one before's input) must give the same bits in
# both modes.
from std.math import ceildiv, exp
from std.sys import size_of

from max.gpu.host import DeviceBuffer, DeviceContext, HostBuffer

from op.dispatch import gpu_kernel_for
from op.gpu_register_rows import launch_register_rows, wide_warp_rows
from op.row_math import vector_width
from sweep_timing import median_launch_us

comptime ITERS = 20
comptime REPS = 7
comptime ROUNDS = 5
comptime CHAIN = 8
# Input and output buffers rotated over, in all: twice the H100's 50 MB L2.
comptime ROTATE_BYTES = 100 << 20
comptime MAX_INPUTS = 16
# Modes: a device copy, the kernel without PDL, with PDL.
comptime COPY = 0
comptime OFF = 1
comptime ON = 2


def mode_name(mode: Int) -> String:
    if mode == COPY:
        return "copy"
    return "pdl_off" if mode == OFF else "pdl_on"


def xorshift_fill[
    dtype: DType
](host: HostBuffer[dtype], count: Int, seed: UInt64):
    """Values in [-12, 12): fresh random input, never zeros."""
    var s = seed * 0x9E3779B97F4A7C15 + 1
    for i in range(count):
        s ^= s << 13
        s ^= s >> 7
        s ^= s << 17
        var u = Float64(s >> 11) / Float64(UInt64(1) << 53)
        host[i] = Scalar[dtype]((u * 24.0 - 12.0).cast[dtype]())


def ptr[
    dtype: DType
](buf: DeviceBuffer[dtype]) -> Pointer[Scalar[dtype], MutAnyOrigin]:
    return rebind[Pointer[Scalar[dtype], MutAnyOrigin]](buf.unsafe_ptr())


def launch[
    dtype: DType, mode: Int
](
    ctx: DeviceContext,
    dst: DeviceBuffer[dtype],
    src: DeviceBuffer[dtype],
    rows: Int,
    n: Int,
    block_rows: Bool,
) raises:
    comptime if mode == COPY:
        ctx.enqueue_copy(dst, src)
    else:
        comptime pdl = mode == ON
        if block_rows:
            launch_register_rows[dtype, False, True, pdl](
                ctx, ptr(dst), ptr(src), rows, n, True
            )
        else:
            launch_register_rows[dtype, False, False, pdl](
                ctx, ptr(dst), ptr(src), rows, n, True
            )


def row0_error[
    dtype: DType
](
    ctx: DeviceContext, dst: DeviceBuffer[dtype], src: HostBuffer[dtype], n: Int
) raises -> Float64:
    """Largest relative error of row 0 against float64 softmax."""
    var out = ctx.enqueue_create_host_buffer[dtype](n)
    ctx.enqueue_copy(out, dst)
    ctx.synchronize()
    var m = Float64(src[0].cast[DType.float64]())
    for i in range(n):
        m = max(m, Float64(src[i].cast[DType.float64]()))
    var s = Float64(0)
    for i in range(n):
        s += exp(Float64(src[i].cast[DType.float64]()) - m)
    var worst = Float64(0)
    for i in range(n):
        var want = exp(Float64(src[i].cast[DType.float64]()) - m) / s
        var got = Float64(out[i].cast[DType.float64]())
        worst = max(worst, abs(got - want) / want)
    return worst


def chain[
    dtype: DType, mode: Int
](
    ctx: DeviceContext,
    src: DeviceBuffer[dtype],
    a: DeviceBuffer[dtype],
    b: DeviceBuffer[dtype],
    rows: Int,
    n: Int,
    block_rows: Bool,
    count: Int,
) raises -> HostBuffer[dtype]:
    """CHAIN dependent launches src -> a -> b -> a ..., a and b zeroed
    first: from the second on, each reads what the one before wrote and
    overwrites what the one before read. The last output, on the host."""
    ctx.enqueue_memset(a, Scalar[dtype](0))
    ctx.enqueue_memset(b, Scalar[dtype](0))
    launch[dtype, mode](ctx, a, src, rows, n, block_rows)
    for i in range(1, CHAIN):
        if i % 2 == 1:
            launch[dtype, mode](ctx, b, a, rows, n, block_rows)
        else:
            launch[dtype, mode](ctx, a, b, rows, n, block_rows)
    var out = ctx.enqueue_create_host_buffer[dtype](count)
    comptime if CHAIN % 2 == 0:
        ctx.enqueue_copy(out, b)
    else:
        ctx.enqueue_copy(out, a)
    ctx.synchronize()
    return out


def time_mode[
    dtype: DType, mode: Int
](
    ctx: DeviceContext,
    dsts: List[DeviceBuffer[dtype]],
    srcs: List[DeviceBuffer[dtype]],
    rows: Int,
    n: Int,
    block_rows: Bool,
) raises -> Float64:
    """Median over REPS of the time a launch of ITERS back to back, in us."""

    @__parameter
    def one(i: Int) raises:
        var k = i % len(srcs)
        launch[dtype, mode](ctx, dsts[k], srcs[k], rows, n, block_rows)

    return median_launch_us[one](ctx, ITERS, REPS)


def median(var xs: List[Float64]) -> Float64:
    sort(xs)
    return xs[len(xs) // 2]


def report(
    dtype: DType,
    rows: Int,
    n: Int,
    name: String,
    what: String,
    us: Float64,
    bytes: Int,
):
    print(
        String(dtype),
        String(rows) + "x" + String(n),
        name,
        what,
        "us=" + String(us),
        "GB/s=" + String(2.0 * Float64(bytes) / us / 1e3),
    )


def probe_shape[dtype: DType](ctx: DeviceContext, rows: Int, n: Int) raises:
    # The family the dispatch picks for these (aligned) rows.
    var family = gpu_kernel_for(
        rows, n, vector_width[dtype](), wide_warp_rows[dtype](Int32(1))
    )
    if family != "warp" and family != "block":
        raise Error("pdl_probe: " + String(n) + " is not a register row")
    var block_rows = family == "block"
    var count = rows * n
    var bytes = count * size_of[dtype]()
    var inputs = max(3, min(MAX_INPUTS, ceildiv(ROTATE_BYTES, 2 * bytes)))
    var dsts = List[DeviceBuffer[dtype]]()
    var srcs = List[DeviceBuffer[dtype]]()
    var host0 = ctx.enqueue_create_host_buffer[dtype](count)
    ctx.synchronize()
    # The last fill stays in host0: fill input 0 last, so it is checked.
    for _ in range(inputs):
        srcs.append(ctx.enqueue_create_buffer[dtype](count))
        dsts.append(ctx.enqueue_create_buffer[dtype](count))
    for k in reversed(range(inputs)):
        xorshift_fill(host0, count, UInt64(k + 1 + rows))
        ctx.enqueue_copy(srcs[k], host0)
        ctx.synchronize()

    # Each mode's own output, from zeros, against float64; then the chain.
    ctx.enqueue_memset(dsts[0], Scalar[dtype](0))
    launch[dtype, OFF](ctx, dsts[0], srcs[0], rows, n, block_rows)
    var err_off = row0_error(ctx, dsts[0], host0, n)
    ctx.enqueue_memset(dsts[0], Scalar[dtype](0))
    launch[dtype, ON](ctx, dsts[0], srcs[0], rows, n, block_rows)
    var err_on = row0_error(ctx, dsts[0], host0, n)
    var c_off = chain[dtype, OFF](
        ctx, srcs[0], dsts[1], dsts[2], rows, n, block_rows, count
    )
    var c_on = chain[dtype, ON](
        ctx, srcs[0], dsts[1], dsts[2], rows, n, block_rows, count
    )
    var differ = 0
    for i in range(count):
        if c_off[i] != c_on[i]:
            differ += 1
    print(
        String(dtype),
        String(rows) + "x" + String(n),
        family,
        "inputs=" + String(inputs),
        "err_off=" + String(err_off),
        "err_on=" + String(err_on),
        "chain_differ=" + String(differ),
    )

    # Warm every instance, then alternate.
    _ = time_mode[dtype, COPY](ctx, dsts, srcs, rows, n, block_rows)
    _ = time_mode[dtype, OFF](ctx, dsts, srcs, rows, n, block_rows)
    _ = time_mode[dtype, ON](ctx, dsts, srcs, rows, n, block_rows)
    var copy_us = List[Float64]()
    var off_us = List[Float64]()
    var on_us = List[Float64]()
    for r in range(ROUNDS):
        var c = time_mode[dtype, COPY](ctx, dsts, srcs, rows, n, block_rows)
        var a = time_mode[dtype, OFF](ctx, dsts, srcs, rows, n, block_rows)
        var b = time_mode[dtype, ON](ctx, dsts, srcs, rows, n, block_rows)
        copy_us.append(c)
        off_us.append(a)
        on_us.append(b)
        print(
            String(dtype),
            String(rows) + "x" + String(n),
            "round=" + String(r),
            "copy_us=" + String(c),
            "off_us=" + String(a),
            "on_us=" + String(b),
        )
    var c = median(copy_us^)
    var a = median(off_us^)
    var b = median(on_us^)
    report(dtype, rows, n, "copy", "median", c, bytes)
    report(dtype, rows, n, "pdl_off", "median", a, bytes)
    report(dtype, rows, n, "pdl_on", "median", b, bytes)
    print(
        String(dtype),
        String(rows) + "x" + String(n),
        "pdl_saves_us=" + String(a - b),
        "on/off=" + String(b / a),
    )


def main() raises:
    var ctx = DeviceContext()
    print("device:", ctx.name())
    comptime for dtype in [DType.float32, DType.bfloat16]:
        probe_shape[dtype](ctx, 16384, 128)
        probe_shape[dtype](ctx, 4096, 1024)
        probe_shape[dtype](ctx, 4096, 4096)
