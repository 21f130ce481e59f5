# Times gpu_split_stream_rows at several (threads T, vectors K, blocks an SM
# B) against a device copy, without MAX graphs: it builds on a machine
# without a GPU and runs in seconds on one.
#   mojo build -I . --target-accelerator sm_90 benchmarks/tools/split_stream_sweep.mojo -o sweep
#   ./sweep            # on the GPU machine (MAX's libraries on LD_LIBRARY_PATH)
#   ./sweep once       # bf16 32 x 1M, each config launched once (for ncu)
#   ./sweep long       # 32 x 1M and 64 x 512K, more block shapes
#   ./sweep cluster    # gpu_smem_rows a row a block or a cluster of 2 or 4
#   ./sweep smem       # gpu_smem_rows against a copy at its shapes (a kernel
#                      # A/B: build once with -I . and once with an older tree)
# GB/s = 2 x tensor bytes / median wall time of ITERS back-to-back launches
# (each with its counter memset), inputs rotated over 3 buffers larger than
# L2. Row 0 of each output is checked against a float64 softmax first.
from std.math import exp
from std.sys import argv

from max.gpu.host import DeviceBuffer, DeviceContext, HostBuffer

from op.gpu_smem_rows import launch_smem_parts, launch_smem_rows
from op.gpu_split_stream_rows import launch_split_stream
from op.row_tensors import LaunchRows
from sweep_inputs import ptr
from sweep_timing import print_result, timed_us

comptime ITERS = 20
comptime REPS = 7
comptime INPUTS = 3


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


def launch[
    dtype: DType, T: Int, K: Int, B: Int
](
    ctx: DeviceContext,
    dst: DeviceBuffer[dtype],
    src: DeviceBuffer[dtype],
    rows: Int,
    n: Int,
) raises:
    var r = LaunchRows(ptr(dst), ptr(src), ptr(src), rows, n, True)
    comptime if T == 0:
        ctx.enqueue_copy(dst, src)
    elif K == -1:
        launch_smem_rows[dtype, False](ctx, r)
    elif K == -2:
        launch_smem_parts[dtype, False, B](ctx, r)
    else:
        launch_split_stream[dtype, False, T, K, B](ctx, r)


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


def time_config[
    dtype: DType, T: Int, K: Int, B: Int
](
    ctx: DeviceContext,
    name: String,
    dsts: List[DeviceBuffer[dtype]],
    srcs: List[DeviceBuffer[dtype]],
    host0: HostBuffer[dtype],
    rows: Int,
    n: Int,
    once: Bool,
) raises:
    @__parameter
    def one(i: Int) raises:
        launch[dtype, T, K, B](ctx, dsts[i % INPUTS], srcs[i % INPUTS], rows, n)

    var us = timed_us[one](ctx, once, ITERS, REPS)
    if not us:
        return
    # dsts[0] was last written from srcs[0], as by the first launch.
    var err = Float64(0)
    comptime if T != 0:
        err = row0_error(ctx, dsts[0], host0, n)
    var config = (
        name + " T=" + String(T) + " K=" + String(K) + " B=" + String(B)
    )
    print_result[dtype](rows, n, config, us.value(), 2.0, "err=" + String(err))


def sweep_shape[
    dtype: DType
](
    ctx: DeviceContext,
    rows: Int,
    n: Int,
    once: Bool = False,
    smem: Bool = False,
    more: Bool = False,
    cluster: Bool = False,
) raises:
    var dsts = List[DeviceBuffer[dtype]]()
    var srcs = List[DeviceBuffer[dtype]]()
    var host0 = ctx.enqueue_create_host_buffer[dtype](rows * n)
    ctx.synchronize()
    for k in range(INPUTS):
        xorshift_fill(host0, rows * n, UInt64(k + 1 + rows))
        var src = ctx.enqueue_create_buffer[dtype](rows * n)
        ctx.enqueue_copy(src, host0)
        ctx.synchronize()
        srcs.append(src)
        dsts.append(ctx.enqueue_create_buffer[dtype](rows * n))
    # host0 now holds input INPUTS - 1; check against that buffer's output.
    var last = INPUTS - 1
    var d = List[DeviceBuffer[dtype]]()
    var s = List[DeviceBuffer[dtype]]()
    for k in range(INPUTS):
        d.append(dsts[(k + last) % INPUTS])
        s.append(srcs[(k + last) % INPUTS])
    time_config[dtype, 0, 0, 0](ctx, "copy", d, s, host0, rows, n, once)
    if smem:
        time_config[dtype, 1, -1, 0](ctx, "smem", d, s, host0, rows, n, once)
        return
    if cluster:
        comptime for C in [1, 2, 4]:
            time_config[dtype, 1, -2, C](
                ctx, "smem C=" + String(C), d, s, host0, rows, n, once
            )
        return
    # The table's configs (T, K, B) first (see split_stream_threads/_vectors/
    # _blocks), then, with `more`, others worth a look.
    comptime TABLE = [(512, 7, 2), (256, 6, 4), (512, 4, 2), (384, 6, 3)]
    comptime MORE = [
        (256, 4, 6),
        (128, 6, 8),
        (256, 7, 4),
        (128, 12, 4),
        (256, 3, 8),
    ]
    comptime for c in TABLE:
        time_config[dtype, c[0], c[1], c[2]](
            ctx, "stream", d, s, host0, rows, n, once
        )
    if not more:
        return
    comptime for c in MORE:
        time_config[dtype, c[0], c[1], c[2]](
            ctx, "stream", d, s, host0, rows, n, once
        )


def main() raises:
    var ctx = DeviceContext()
    if len(argv()) > 1 and argv()[1] == "once":
        sweep_shape[DType.bfloat16](ctx, 32, 1 << 20, True)
        return
    if len(argv()) > 1 and argv()[1] == "long":
        comptime for dtype in [DType.bfloat16, DType.float32]:
            sweep_shape[dtype](ctx, 32, 1 << 20, more=True)
            sweep_shape[dtype](ctx, 64, 1 << 19, more=True)
            sweep_shape[dtype](ctx, 32, 1 << 20, more=True)
        return
    if len(argv()) > 1 and argv()[1] == "cluster":
        comptime for _ in range(2):
            sweep_shape[DType.float32](ctx, 4096, 65536, cluster=True)
            sweep_shape[DType.float32](ctx, 8192, 50257, cluster=True)
            sweep_shape[DType.float32](ctx, 4096, 40000, cluster=True)
            sweep_shape[DType.bfloat16](ctx, 4096, 131072, cluster=True)
            sweep_shape[DType.bfloat16](ctx, 4096, 100000, cluster=True)
        return
    if len(argv()) > 1 and argv()[1] == "smem":
        comptime for dtype in [DType.bfloat16, DType.float32]:
            sweep_shape[dtype](ctx, 4096, 65536, smem=True)
            sweep_shape[dtype](ctx, 8192, 50257, smem=True)
            sweep_shape[dtype](ctx, 4096, 16384, smem=True)
            sweep_shape[dtype](ctx, 1024, 30000, smem=True)
        return
    comptime for dtype in [DType.bfloat16, DType.float32]:
        sweep_shape[dtype](ctx, 32, 1 << 20)
        sweep_shape[dtype](ctx, 16, 1 << 21)
        sweep_shape[dtype](ctx, 64, 50257)
        sweep_shape[dtype](ctx, 64, 50257)
        sweep_shape[dtype](ctx, 4, 1 << 20)
        sweep_shape[dtype](ctx, 200, 40000)
        sweep_shape[dtype](ctx, 32, 1 << 20)
