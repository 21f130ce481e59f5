# Times the softmax backward's long-row families at large shapes against a
# device copy, without MAX graphs: it builds on a machine without a GPU and
# runs in under a minute on one.
#   mojo build -I . --target-accelerator sm_90 benchmarks/tools/backward_sweep.mojo -o backward_sweep
#   ./backward_sweep           # on the GPU machine (MAX's libraries on
#                              # LD_LIBRARY_PATH)
#   ./backward_sweep once      # each config launched once, no timing or
#                              # checks (for ncu)
# Families: "dispatch" (launch_backward_rows "auto": what the op runs), the row
# kernels alone ("smem" where n <= smem_capacity, "cluster2" / "cluster4"
# where n <= cluster_capacity, "stream" where the split stream takes the
# row) and "copy".
# GB/s = 3 x tensor bytes / median wall time of ITERS back-to-back launches
# (y and dy read, dx written; copy: 2 x bytes, read and write), inputs
# rotated over 3 buffer pairs larger than L2. Each row kernel is then
# checked on the first CHECK_ROWS rows of input 0: the largest error of dx
# against float64 on the host, over the largest |dx|.

from max.gpu.host import DeviceBuffer, DeviceContext

from op.dispatch import backward_kernel_for, launch_backward_rows
from op.gpu_backward_smem_rows import SMEM_TENSORS, launch_backward_parts
from op.gpu_backward_stream_rows import (
    backward_stream_chunk,
    launch_backward_stream,
)
from op.gpu_smem_rows import cluster_capacity, smem_capacity
from op.gpu_split_workspace import on_chip_split_capacity
from op.row_math import vector_width
from op.row_tensors import LaunchRows
from sweep_inputs import filled_inputs, hashed_value, ptr
from sweep_timing import Sweep, picks

comptime ITERS = 20
comptime REPS = 7
comptime INPUTS = 3
comptime CHECK_ROWS = 16
# A launch reads y and dy and writes dx.
comptime PASSES = 3.0


# y and dy: hashed values of [-1, 1).
comptime RANGE = 0


def value_at[dtype: DType](e: Int, seed: Int) -> Scalar[dtype]:
    """Element `e` of buffer `seed` (`hashed_value`)."""
    return hashed_value[dtype, RANGE](e, seed)


@fieldwise_init
struct Bench[dtype: DType](Copyable):
    """A shape's device buffers: INPUTS (y, dy) pairs (y's buffers are
    seeds 2k, dy's 2k + 1) and dx, which the copy also targets."""

    var ys: List[DeviceBuffer[Self.dtype]]
    var dys: List[DeviceBuffer[Self.dtype]]
    var dx: DeviceBuffer[Self.dtype]
    var rows: Int
    var n: Int


def make_bench[
    dtype: DType
](ctx: DeviceContext, rows: Int, n: Int) raises -> Bench[dtype]:
    var ys = filled_inputs[dtype, RANGE](ctx, rows * n, INPUTS, 0, 2)
    var dys = filled_inputs[dtype, RANGE](ctx, rows * n, INPUTS, 1, 2)
    var dx = ctx.enqueue_create_buffer[dtype](rows * n)
    ctx.synchronize()
    return Bench[dtype](ys^, dys^, dx, rows, n)


def launch[
    dtype: DType, family: StaticString
](ctx: DeviceContext, b: Bench[dtype], k: Int) raises:
    """One softmax backward of input pair `k` by `family`, or its copy."""
    var r = LaunchRows(
        ptr(b.dx), ptr(b.ys[k]), ptr(b.dys[k]), b.rows, b.n, True
    )
    comptime if family == "copy":
        ctx.enqueue_copy(b.dx, b.ys[k])
    elif family == "dispatch":
        launch_backward_rows[dtype, False, "auto"](ctx, r)
    elif family == "smem":
        launch_backward_parts[dtype, False, 1](ctx, r)
    elif family == "cluster2":
        launch_backward_parts[dtype, False, 2](ctx, r)
    elif family == "cluster4":
        launch_backward_parts[dtype, False, 4](ctx, r)
    else:
        launch_backward_stream[dtype, False](ctx, r)


def check_error[
    dtype: DType, family: StaticString
](ctx: DeviceContext, b: Bench[dtype]) raises -> Float64:
    """The largest |dx - dx64| over the largest |dx64| in input 0's first CHECK_ROWS rows,
    dx64 = y * (dy - sum(dy * y)) in float64 on the host."""
    launch[dtype, family](ctx, b, 0)
    var out = ctx.enqueue_create_host_buffer[dtype](CHECK_ROWS * b.n)
    ctx.enqueue_copy(out, b.dx.create_sub_buffer[dtype](0, CHECK_ROWS * b.n))
    ctx.synchronize()
    var worst = Float64(0)
    var biggest = Float64(0)
    for r in range(CHECK_ROWS):
        var s = Float64(0)
        for c in range(b.n):
            var e = r * b.n + c
            s += (
                value_at[dtype](e, 0).cast[DType.float64]()
                * value_at[dtype](e, 1).cast[DType.float64]()
            )
        for c in range(b.n):
            var e = r * b.n + c
            var y = value_at[dtype](e, 0).cast[DType.float64]()
            var want = y * (value_at[dtype](e, 1).cast[DType.float64]() - s)
            worst = max(worst, abs(out[e].cast[DType.float64]() - want))
            biggest = max(biggest, abs(want))
    return worst / biggest


def time_config[
    dtype: DType, family: StaticString
](sweep: Sweep, b: Bench[dtype]) raises:
    var ctx = sweep.ctx

    @__parameter
    def one(i: Int) raises:
        launch[dtype, family](ctx, b, i % INPUTS)

    @__parameter
    def check() raises -> String:
        comptime if family == "copy":
            return "err=-"
        else:
            return "err=" + String(check_error[dtype, family](ctx, b))

    var params = String("-")
    comptime if family == "dispatch":
        params = picks(
            backward_kernel_for(
                b.rows,
                b.n,
                vector_width[dtype](),
                backward_stream_chunk[dtype](),
            )
        )
    sweep.line[dtype, family, one, check](b.rows, b.n, params, PASSES)


def sweep_shape[dtype: DType](sweep: Sweep, rows: Int, n: Int) raises:
    comptime V = vector_width[dtype]()
    var b = make_bench[dtype](sweep.ctx, rows, n)
    time_config[dtype, "copy"](sweep, b)
    time_config[dtype, "dispatch"](sweep, b)
    if n <= smem_capacity(V, SMEM_TENSORS):
        time_config[dtype, "smem"](sweep, b)
    if n <= cluster_capacity(V, SMEM_TENSORS, 2):
        time_config[dtype, "cluster2"](sweep, b)
    if n <= cluster_capacity(V, SMEM_TENSORS, 4):
        time_config[dtype, "cluster4"](sweep, b)
    if n <= on_chip_split_capacity(16 // V):
        time_config[dtype, "stream"](sweep, b)


def main() raises:
    var sweep = Sweep(ITERS, REPS)
    for s in [(4096, 65536), (8192, 50257), (4096, 40000), (2048, 131072)]:
        sweep_shape[DType.float32](sweep, s[0], s[1])
    for s in [(8192, 50257), (4096, 65536), (2048, 131072), (2048, 262144)]:
        sweep_shape[DType.bfloat16](sweep, s[0], s[1])
