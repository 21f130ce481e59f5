# Times the register-rows softmax forward at short rows under every
# (threads a row, chunks a thread) plan that holds the row, in its instance
# for aligned rows only ("aligned") and in the one for any rows ("any"),
# against a device copy, without MAX graphs: which plan and instance move
# the bytes fastest? Builds without a GPU, runs in a minute on one.
#   mojo build -I . --target-accelerator sm_90 benchmarks/tools/register_plan_sweep.mojo -o register_plan_sweep
#   ./register_plan_sweep      # on the GPU machine (MAX's libraries on
#                              # LD_LIBRARY_PATH)
# GB/s = 2 x tensor bytes / median wall time of ITERS back-to-back launches
# (PDL on, as the op launches them), inputs and outputs rotated over
# INPUTS buffer pairs (a single output buffer instead would stay in L2 and
# read ~25% faster at 16 MB). "plan" marks what the dispatch runs: its plan
# in the instance `split_aligned` picks for aligned rows. "copy" is a
# driver copy (enqueue_copy), slower than a copy kernel at these sizes:
# compare the plans with each other. Each plan's row 0 must match a float64
# softmax (relative error under 1e-5, 16-bit 1e-2) or the sweep stops.
from std.math import ceildiv, exp
from std.sys import size_of

from max.gpu.host import DeviceBuffer, DeviceContext

from op.gpu_launch import held, vector_flag_of
from op.gpu_register_rows import (
    MAX_ROW_REGISTERS,
    NUM_PLANS,
    RegisterRows,
    block_threads,
    chunk_registers,
    plan_chunks,
    plan_threads,
    register_plan,
    split_aligned,
    wide_warp_rows,
)
from op.row_math import vector_width
from sweep_inputs import filled_inputs, hashed_value, ptr
from sweep_timing import median_launch_us, print_result

comptime ITERS = 40
comptime REPS = 7
comptime INPUTS = 8
# Inputs: hashed values of [-8, 8).
comptime RANGE = 3


@fieldwise_init
struct Bench[dtype: DType](Copyable):
    """A shape's INPUTS inputs (seed k) and as many outputs."""

    var xs: List[DeviceBuffer[Self.dtype]]
    var ys: List[DeviceBuffer[Self.dtype]]
    var rows: Int
    var n: Int


def make_bench[
    dtype: DType
](ctx: DeviceContext, rows: Int, n: Int) raises -> Bench[dtype]:
    var xs = filled_inputs[dtype, RANGE](ctx, rows * n, INPUTS)
    var ys = List[DeviceBuffer[dtype]]()
    for _ in range(INPUTS):
        ys.append(ctx.enqueue_create_buffer[dtype](rows * n))
    ctx.synchronize()
    return Bench[dtype](xs^, ys^, rows, n)


def launch[
    dtype: DType, T: Int, K: Int, aligned: Bool
](ctx: DeviceContext, b: Bench[dtype], k: Int) raises:
    """One softmax of input `k` into output `k` by plan (T, K), the aligned
    or the general instance; T = 0: a copy."""
    comptime if T == 0:
        ctx.enqueue_copy(b.ys[k], b.xs[k])
    else:
        comptime block = block_threads[T]()
        RegisterRows[dtype, False, True](
            held(ptr(b.ys[k])),
            held(ptr(b.xs[k])),
            b.rows,
            b.n,
            vector_flag_of(True, b.n, vector_width[dtype]()),
        ).enqueue_instance[T, K, aligned](
            ctx, ceildiv(b.rows, block // T), block
        )


def row0_error[
    dtype: DType
](ctx: DeviceContext, b: Bench[dtype]) raises -> Float64:
    """Largest relative error of output 0's row 0 against float64 softmax."""
    var out = ctx.enqueue_create_host_buffer[dtype](b.n)
    ctx.enqueue_copy(out, b.ys[0].create_sub_buffer[dtype](0, b.n))
    ctx.synchronize()
    var m = Float64(-1e300)
    for c in range(b.n):
        m = max(m, hashed_value[dtype, RANGE](c, 0).cast[DType.float64]())
    var s = Float64(0)
    for c in range(b.n):
        s += exp(hashed_value[dtype, RANGE](c, 0).cast[DType.float64]() - m)
    var worst = Float64(0)
    for c in range(b.n):
        var x = hashed_value[dtype, RANGE](c, 0).cast[DType.float64]()
        var want = exp(x - m) / s
        worst = max(worst, abs(out[c].cast[DType.float64]() - want) / want)
    return worst


def time_plan[
    dtype: DType, T: Int, K: Int, aligned: Bool = True
](ctx: DeviceContext, b: Bench[dtype]) raises:
    """Time plan (T, K) (T = 0: a copy) and print its GB/s; plans that
    cannot hold the row, or hold four times it, are skipped."""
    comptime V = vector_width[dtype]()
    comptime if T > 0:
        if T * V * K < b.n or T * V * K > 4 * b.n:
            return
        if aligned and b.n % V != 0:
            return  # the aligned instance must not see unaligned rows
    launch[dtype, T, K, aligned](ctx, b, 0)

    @__parameter
    def one(i: Int) raises:
        launch[dtype, T, K, aligned](ctx, b, i % INPUTS)

    var us = median_launch_us[one](ctx, ITERS, REPS)
    var name = String("copy")
    var err = String("err=-")
    comptime if T > 0:
        # The dispatch's plan for these (aligned) rows.
        var plan = register_plan(
            b.n, V, 1, wide_warp=wide_warp_rows[dtype](Int32(1))
        )
        name = "T=" + String(T) + " K=" + String(K)
        name += " aligned" if aligned else " any"
        if (
            plan_threads(plan) == T
            and plan_chunks(plan) == K
            and aligned == split_aligned[dtype]()
        ):
            name += " plan"
        launch[dtype, T, K, aligned](ctx, b, 0)
        var e = row0_error[dtype](ctx, b)
        if e > (1e-2 if size_of[dtype]() == 2 else 1e-5):
            raise Error(name + ": row 0 off by " + String(e))
        err = "err=" + String(e)
    print_result[dtype](b.rows, b.n, name, us, 2.0, err)


def sweep_shape[dtype: DType](ctx: DeviceContext, rows: Int, n: Int) raises:
    """Every plan of 8 to 512 threads a row and 1 to 16 chunks a thread
    (those the kernel's register budget allows) that holds a row of `n`,
    aligned instance; the dispatch's plan also in the general one."""
    var b = make_bench[dtype](ctx, rows, n)
    time_plan[dtype, 0, 0](ctx, b)
    comptime max_k = MAX_ROW_REGISTERS // chunk_registers(vector_width[dtype]())
    comptime for T in [8, 16, 32, 64, 128, 256, 512]:
        comptime for K in [1, 2, 4, 8, 16]:
            comptime if K <= max_k:
                time_plan[dtype, T, K](ctx, b)
    # The plan unaligned rows get, in the instance for any rows.
    var plan = register_plan(n, vector_width[dtype](), 1)
    comptime for i in range(NUM_PLANS):
        comptime if plan_chunks(i) <= max_k:
            if plan == i:
                time_plan[dtype, plan_threads(i), plan_chunks(i), False](ctx, b)


def main() raises:
    var ctx = DeviceContext()
    sweep_shape[DType.float32](ctx, 16384, 128)
    sweep_shape[DType.float32](ctx, 16384, 256)
    sweep_shape[DType.float32](ctx, 8192, 512)
    sweep_shape[DType.float32](ctx, 4096, 1024)
    sweep_shape[DType.float32](ctx, 8192, 1024)
    sweep_shape[DType.float32](ctx, 4096, 2048)
    sweep_shape[DType.float32](ctx, 4096, 4096)
    sweep_shape[DType.float32](ctx, 2048, 8192)
    sweep_shape[DType.bfloat16](ctx, 16384, 128)
    sweep_shape[DType.bfloat16](ctx, 4096, 1024)
