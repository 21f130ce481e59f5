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
from op.gpu_cross_entropy import (
    CERows,
    CEWorkspace,
    ce_kernel_for,
    launch_cross_entropy,
)
from op.gpu_launch import held
from op.gpu_smem_rows import pair_capacity, smem_capacity
from op.row_math import accum_dtype, vector_width
from op.variants import Strategy
from sweep_inputs import filled_inputs, hashed_value, ptr
from sweep_timing import Sweep, has_arg, picks

comptime ITERS = 20
comptime REPS = 7
comptime INPUTS = 3
comptime CHECK_ROWS = 64
# A launch reads the logits once (the row losses are a rounding error).
comptime PASSES = 1.0
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


# The rows the row kernels take: the loss alone, "sum" (row losses only).
comptime LossRows[dtype: DType] = CERows[dtype, False, False, True]


def options_buffer(
    ctx: DeviceContext, eps: Float64
) raises -> DeviceBuffer[DType.float64]:
    """The options (IGNORE_INDEX, label smoothing `eps`) on the device."""
    var host = ctx.enqueue_create_host_buffer[DType.float64](2)
    ctx.synchronize()
    host[0] = Float64(IGNORE_INDEX)
    host[1] = eps
    var options = ctx.enqueue_create_buffer[DType.float64](2)
    ctx.enqueue_copy(options, host)
    ctx.synchronize()  # `host` is freed on return
    return options


struct Bench[dtype: DType](Movable):
    """A shape's device buffers: INPUTS logits buffers, a copy target, the
    targets, options, the op's workspace (count, row losses) and loss."""

    var srcs: List[DeviceBuffer[Self.dtype]]
    var dst: DeviceBuffer[Self.dtype]
    var targets: DeviceBuffer[DType.int64]
    var options: List[DeviceBuffer[DType.float64]]
    """Without label smoothing (timed and checked), and with 0.1 (checked)."""
    var workspace: CEWorkspace[Self.dtype, False, True]
    var loss: DeviceBuffer[Self.dtype]
    var rows: Int
    var n: Int

    def __init__(out self, ctx: DeviceContext, rows: Int, n: Int) raises:
        """The buffers of `rows` rows of `n` logits, filled."""
        self.srcs = filled_inputs[Self.dtype, LOGIT_RANGE](
            ctx, rows * n, INPUTS
        )
        var host_t = ctx.enqueue_create_host_buffer[DType.int64](rows)
        ctx.synchronize()
        for r in range(rows):
            host_t[r] = target_of(r, n)
        self.targets = ctx.enqueue_create_buffer[DType.int64](rows)
        ctx.enqueue_copy(self.targets, host_t)
        self.options = List[DeviceBuffer[DType.float64]]()
        self.options.append(options_buffer(ctx, 0.0))
        self.options.append(options_buffer(ctx, 0.1))
        self.workspace = CEWorkspace[Self.dtype, False, True](ctx, rows)
        ctx.enqueue_memset(self.workspace.count, Float64(1))
        self.loss = ctx.enqueue_create_buffer[Self.dtype](1)
        self.dst = ctx.enqueue_create_buffer[Self.dtype](rows * n)
        self.rows = rows
        self.n = n
        ctx.synchronize()


def launch[
    dtype: DType, family: StaticString, U: Int, T: Int
](
    ctx: DeviceContext,
    b: Bench[dtype],
    src: DeviceBuffer[dtype],
    options: DeviceBuffer[DType.float64],
) raises:
    """One loss-only, "sum" cross-entropy of `src` by `family` (row
    kernels: row losses only, through the op's own `CERows`), or its
    copy."""
    var x = ptr(src)
    var tg = rebind[Pointer[Int64, MutAnyOrigin]](b.targets.unsafe_ptr())
    var op = rebind[Pointer[Float64, MutAnyOrigin]](options.unsafe_ptr())
    comptime if family == "copy":
        ctx.enqueue_copy(b.dst, src)
    elif family == "dispatch":
        launch_cross_entropy[dtype, False, "sum"](
            ctx, ptr(b.loss), x, x, tg, op, b.rows, b.n
        )
    else:
        var rows = LossRows[dtype](
            held(x),
            held(x),
            held(tg),
            held(op),
            held(b.workspace.count_ptr()),
            held(b.workspace.losses_ptr()),
            held(ptr(b.loss)),
            b.rows,
            b.n,
            True,
        )
        comptime if family == "smem":
            rows.launch[Strategy.SMEM](ctx)
        elif family == "pair":
            rows.launch[Strategy.CLUSTER2](ctx)
        else:
            launch_ce_block[dtype, False, False, True, U, T](ctx, rows.r)


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
    ctx.enqueue_copy(out, b.workspace.row_losses)
    ctx.synchronize()
    var got = Float64(0)
    for r in range(CHECK_ROWS):
        got += out[r].cast[DType.float64]()
    return abs(got - want) / abs(want)


def time_config[
    dtype: DType, family: StaticString, U: Int = 1, T: Int = 0
](sweep: Sweep, b: Bench[dtype], want0: Float64, want1: Float64) raises:
    var ctx = sweep.ctx

    @__parameter
    def one(i: Int) raises:
        launch[dtype, family, U, T](ctx, b, b.srcs[i % INPUTS], b.options[0])

    @__parameter
    def check() raises -> String:
        comptime if family == "copy" or family == "dispatch":
            return "err0=- err1=-"
        else:
            var e0 = check_error[dtype, family, U, T](
                ctx, b, b.options[0], want0
            )
            var e1 = check_error[dtype, family, U, T](
                ctx, b, b.options[1], want1
            )
            return "err0=" + String(e0) + " err1=" + String(e1)

    var params = String("-")
    comptime if family == "block":
        params = "U=" + String(U) + " T=" + String(T)
    elif family == "dispatch":
        params = picks(
            ce_kernel_for(b.rows, b.n, vector_width[dtype](), with_grad=False)
        )
    sweep.line[dtype, family, one, check](b.rows, b.n, params, PASSES)


def sweep_shape[dtype: DType](sweep: Sweep, rows: Int, n: Int) raises:
    comptime V = vector_width[dtype]()
    var b = Bench[dtype](sweep.ctx, rows, n)
    var want0 = Float64(0)
    var want1 = Float64(0)
    if not sweep.once:
        want0 = reference_loss[dtype](n, 0.0)
        want1 = reference_loss[dtype](n, 0.1)
    time_config[dtype, "copy"](sweep, b, want0, want1)
    time_config[dtype, "dispatch"](sweep, b, want0, want1)
    if n <= smem_capacity(V):
        time_config[dtype, "smem"](sweep, b, want0, want1)
    if n <= pair_capacity(V):
        time_config[dtype, "pair"](sweep, b, want0, want1)
    comptime for T in [256, 512, 1024]:
        comptime for U in [1, 2, 4, 8]:
            time_config[dtype, "block", U, T](sweep, b, want0, want1)


def main() raises:
    var sweep = Sweep(ITERS, REPS)
    var shapes = [(16384, 32000), (4096, 128256), (8192, 50257)]
    if not has_arg("fp32"):
        for s in shapes:
            sweep_shape[DType.bfloat16](sweep, s[0], s[1])
    if not has_arg("bf16"):
        for s in shapes:
            sweep_shape[DType.float32](sweep, s[0], s[1])
