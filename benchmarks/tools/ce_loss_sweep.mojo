# Times the loss-only cross-entropy (with_grad=False, reduction "sum") of
# each row-kernel family at large shapes against a device copy, without MAX
# graphs: it builds on a machine without a GPU and runs in well under a
# minute on one.
#   mojo build -I . --target-accelerator sm_90 benchmarks/tools/ce_loss_sweep.mojo -o ce_loss_sweep
#   ./ce_loss_sweep            # on the GPU machine (MAX's libraries on
#                              # LD_LIBRARY_PATH)
#   ./ce_loss_sweep bf16       # one dtype only (or fp32)
#   ./ce_loss_sweep once       # each config launched once, no timing or
#                              # checks (for ncu); combines with bf16/fp32
# Families: "dispatch" (launch_cross_entropy: the count-free "sum" path, its
# row kernel as `ce_kernel_for` picks plus the reduce kernel), the row
# kernels alone ("smem" where n <= smem_capacity, "pair" where n <=
# pair_capacity, "block" at unroll U and threads T), and
# "copy".
# GB/s = 1 x logits bytes / median wall time of ITERS back-to-back launches
# (copy: 2 x bytes, read and write, so the figures compare), inputs rotated
# over 3 buffers larger than L2, label smoothing off. Each row kernel is
# then checked on the first CHECK_ROWS rows (a few ignored): the relative
# error of their summed loss against float64 on the host, without (err0)
# and with (err1) label smoothing 0.1.
from std.math import exp, log
from std.utils.numerics import inf

from max.gpu.host import DeviceBuffer, DeviceContext

from op.gpu_ce_block_rows import launch_ce_block
from op.gpu_ce_pair_rows import launch_ce_pair
from op.gpu_ce_smem_rows import launch_ce_smem
from op.gpu_cross_entropy import ce_kernel_for, launch_cross_entropy
from op.gpu_smem_rows import pair_capacity, smem_capacity
from op.row_math import accum_dtype, vector_width
from sweep_inputs import filled_inputs, hashed_value, ptr
from sweep_timing import has_arg, median_launch_us, print_result

comptime ITERS = 20
comptime REPS = 7
comptime INPUTS = 3
comptime CHECK_ROWS = 64
comptime IGNORE_INDEX = -100


# Logits: hashed values of [-16, 16).
comptime LOGIT_RANGE = 4


def logit_at[dtype: DType](e: Int, seed: Int) -> Scalar[dtype]:
    """Element `e` of input `seed` (`hashed_value`)."""
    return hashed_value[dtype, LOGIT_RANGE](e, seed)


def target_of(r: Int, n: Int) -> Int64:
    """Row `r`'s target: every 13th row (from row 5) ignored."""
    if r % 13 == 5:
        return Int64(IGNORE_INDEX)
    return Int64((r * 7919 + 13) % n)


def reference_loss[dtype: DType](n: Int, eps: Float64) -> Float64:
    """The summed loss of input 0's first CHECK_ROWS rows in float64."""
    var total = Float64(0)
    for r in range(CHECK_ROWS):
        var tgt = target_of(r, n)
        if tgt == Int64(IGNORE_INDEX):
            continue
        var m = -inf[DType.float64]()
        var sx = Float64(0)
        for c in range(n):
            var v = logit_at[dtype](r * n + c, 0).cast[DType.float64]()
            m = max(m, v)
            sx += v
        var s = Float64(0)
        for c in range(n):
            s += exp(logit_at[dtype](r * n + c, 0).cast[DType.float64]() - m)
        var x_t = logit_at[dtype](r * n + Int(tgt), 0).cast[DType.float64]()
        total += log(s) + (1 - eps) * (m - x_t) + eps * (m - sx / Float64(n))
    return total


@fieldwise_init
struct Bench[dtype: DType](Copyable):
    """A shape's device buffers: INPUTS logits buffers, a copy target, the
    targets, options (eps 0, and eps 0.1 for the check), the row losses."""

    var srcs: List[DeviceBuffer[Self.dtype]]
    var dst: DeviceBuffer[Self.dtype]
    var targets: DeviceBuffer[DType.int64]
    var options: DeviceBuffer[DType.float64]
    var smooth_options: DeviceBuffer[DType.float64]
    var count: DeviceBuffer[DType.float64]
    var row_losses: DeviceBuffer[accum_dtype[Self.dtype]()]
    var loss: DeviceBuffer[Self.dtype]
    var rows: Int
    var n: Int


def make_bench[
    dtype: DType
](ctx: DeviceContext, rows: Int, n: Int) raises -> Bench[dtype]:
    comptime acc = accum_dtype[dtype]()
    var srcs = filled_inputs[dtype, LOGIT_RANGE](ctx, rows * n, INPUTS)
    var host_t = ctx.enqueue_create_host_buffer[DType.int64](rows)
    var host_o = ctx.enqueue_create_host_buffer[DType.float64](2)
    var host_s = ctx.enqueue_create_host_buffer[DType.float64](2)
    ctx.synchronize()
    for r in range(rows):
        host_t[r] = target_of(r, n)
    host_o[0] = Float64(IGNORE_INDEX)
    host_o[1] = 0.0
    host_s[0] = Float64(IGNORE_INDEX)
    host_s[1] = 0.1
    var targets = ctx.enqueue_create_buffer[DType.int64](rows)
    ctx.enqueue_copy(targets, host_t)
    var options = ctx.enqueue_create_buffer[DType.float64](2)
    var smooth_options = ctx.enqueue_create_buffer[DType.float64](2)
    ctx.enqueue_copy(options, host_o)
    ctx.enqueue_copy(smooth_options, host_s)
    var count = ctx.enqueue_create_buffer[DType.float64](1)
    ctx.enqueue_memset(count, Float64(1))
    var row_losses = ctx.enqueue_create_buffer[acc](rows)
    var loss = ctx.enqueue_create_buffer[dtype](1)
    var dst = ctx.enqueue_create_buffer[dtype](rows * n)
    ctx.synchronize()
    return Bench[dtype](
        srcs^,
        dst,
        targets,
        options,
        smooth_options,
        count,
        row_losses,
        loss,
        rows,
        n,
    )


def launch[
    dtype: DType, family: StaticString, U: Int, T: Int
](
    ctx: DeviceContext,
    b: Bench[dtype],
    src: DeviceBuffer[dtype],
    options: DeviceBuffer[DType.float64],
) raises:
    """One loss-only, "sum" cross-entropy of `src` by `family` (row
    kernels: row losses only), or its copy."""
    comptime acc = accum_dtype[dtype]()
    var x = ptr(src)
    var tg = rebind[Pointer[Int64, MutAnyOrigin]](b.targets.unsafe_ptr())
    var op = rebind[Pointer[Float64, MutAnyOrigin]](options.unsafe_ptr())
    var cn = rebind[Pointer[Float64, MutAnyOrigin]](b.count.unsafe_ptr())
    var rl = rebind[Pointer[Scalar[acc], MutAnyOrigin]](
        b.row_losses.unsafe_ptr()
    )
    var lo = ptr(b.loss)
    comptime if family == "copy":
        ctx.enqueue_copy(b.dst, src)
    elif family == "dispatch":
        launch_cross_entropy[dtype, False, "sum"](
            ctx, lo, x, x, tg, op, b.rows, b.n
        )
    elif family == "smem":
        launch_ce_smem[dtype, False, False, True](
            ctx, x, x, tg, op, cn, rl, lo, b.rows, b.n, True
        )
    elif family == "pair":
        launch_ce_pair[dtype, False, False, True](
            ctx, x, x, tg, op, cn, rl, lo, b.rows, b.n, True
        )
    else:
        launch_ce_block[dtype, False, False, True, U, T](
            ctx, x, x, tg, op, cn, rl, lo, b.rows, b.n, True
        )


def check_error[
    dtype: DType, family: StaticString, U: Int, T: Int
](
    ctx: DeviceContext,
    b: Bench[dtype],
    options: DeviceBuffer[DType.float64],
    want: Float64,
) raises -> Float64:
    """Relative error of the summed row losses of input 0's first
    CHECK_ROWS rows against `want`."""
    comptime acc = accum_dtype[dtype]()
    launch[dtype, family, U, T](ctx, b, b.srcs[0], options)
    var out = ctx.enqueue_create_host_buffer[acc](b.rows)
    ctx.enqueue_copy(out, b.row_losses)
    ctx.synchronize()
    var got = Float64(0)
    for r in range(CHECK_ROWS):
        got += out[r].cast[DType.float64]()
    return abs(got - want) / abs(want)


def time_config[
    dtype: DType, family: StaticString, U: Int = 1, T: Int = 0
](
    ctx: DeviceContext,
    b: Bench[dtype],
    want0: Float64,
    want1: Float64,
    once: Bool,
) raises:
    launch[dtype, family, U, T](ctx, b, b.srcs[0], b.options)
    if once:
        ctx.synchronize()
        return

    @__parameter
    def one(i: Int) raises:
        launch[dtype, family, U, T](ctx, b, b.srcs[i % INPUTS], b.options)

    var us = median_launch_us[one](ctx, ITERS, REPS)
    var errs = String("err0=- err1=-")
    comptime if family != "copy" and family != "dispatch":
        errs = (
            "err0="
            + String(check_error[dtype, family, U, T](ctx, b, b.options, want0))
            + " err1="
            + String(
                check_error[dtype, family, U, T](
                    ctx, b, b.smooth_options, want1
                )
            )
        )
    var params = String("-")
    comptime if family == "block":
        params = "U=" + String(U) + " T=" + String(T)
    elif family == "dispatch":
        var s = ce_kernel_for(
            b.rows, b.n, vector_width[dtype](), with_grad=False
        )
        params = "picks=" + String(s.kind) + "/" + String(s.form)
    var passes = 2.0 if family == "copy" else 1.0
    print_result[dtype](b.rows, b.n, family + " " + params, us, passes, errs)


def sweep_shape[
    dtype: DType
](ctx: DeviceContext, rows: Int, n: Int, once: Bool) raises:
    comptime V = vector_width[dtype]()
    var b = make_bench[dtype](ctx, rows, n)
    var want0 = Float64(0)
    var want1 = Float64(0)
    if not once:
        want0 = reference_loss[dtype](n, 0.0)
        want1 = reference_loss[dtype](n, 0.1)
    time_config[dtype, "copy"](ctx, b, want0, want1, once)
    time_config[dtype, "dispatch"](ctx, b, want0, want1, once)
    if n <= smem_capacity(V):
        time_config[dtype, "smem"](ctx, b, want0, want1, once)
    if n <= pair_capacity(V):
        time_config[dtype, "pair"](ctx, b, want0, want1, once)
    comptime for T in [256, 512, 1024]:
        comptime for U in [1, 2, 4, 8]:
            time_config[dtype, "block", U, T](ctx, b, want0, want1, once)


def main() raises:
    var ctx = DeviceContext()
    var once = has_arg("once")
    var bf16 = not has_arg("fp32")
    var fp32 = not has_arg("bf16")
    if bf16:
        sweep_shape[DType.bfloat16](ctx, 16384, 32000, once)
        sweep_shape[DType.bfloat16](ctx, 4096, 128256, once)
        sweep_shape[DType.bfloat16](ctx, 8192, 50257, once)
    if fp32:
        sweep_shape[DType.float32](ctx, 16384, 32000, once)
        sweep_shape[DType.float32](ctx, 4096, 128256, once)
        sweep_shape[DType.float32](ctx, 8192, 50257, once)
