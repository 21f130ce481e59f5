"""GPU cross-entropy (and its gradient), fused: a row's logits are reduced
(max, sum of exp, and for label smoothing the sum) and its loss and
gradient written in one kernel.

Launches, in stream order, with no host synchronisation (so the op stays
capturable for device-graph replay):

1. "mean" only: `ce_count_kernel`, one block over the targets, counts the
   rows kept (target != ignore_index) into a float64 word: the gradient's
   scale 1 / count must be known before any gradient is written, and
   counting 8 bytes a row first is what keeps the logits read once.
2. The row kernel, choosing by rows and row length like the softmax
   table (`ce_kernel_for`, a `Strategy`; `CERows` launches each, and a
   forced `variant=` one), each family in a file of its own:
   - rows that a register plan holds (to 32K values, gpu_register_rows;
     to 256 threads a row where the smem kernel can take the rows):
     `ce_register_kernel` (gpu_ce_register_rows), the row in registers;
   - at least SPLIT_BELOW_ROWS rows to `smem_capacity(V)` (~74K fp32,
     ~148K 16-bit classes): `ce_smem_kernel` (gpu_ce_smem_rows), a block
     per row holding it on chip;
   - as many rows to `pair_capacity(V)` (~148K fp32, ~296K 16-bit
     classes): `ce_pair_kernel` (gpu_ce_pair_rows), a thread-block cluster
     of two such blocks a row;
   - longer rows, or fewer: `ce_block_kernel` (gpu_ce_block_rows), a block
     per row.
   The loss alone (no gradient) needs no row held: past the register plans
   it streams each row once through `ce_block_kernel`, four loads a thread
   in flight.
   A row's loss goes to a float32 (float64 for float64) workspace for
   "mean"/"sum", or straight to the output for "none". What the families
   share is in gpu_ce_common.
   Extended options (z-loss, softcap, class weights: `n_options` past
   PLAIN_OPTIONS) take the same families with the row's `terms`
   (`ExtendedLayout.terms`): many rows with a gradient on chip
   (`options_onchip_parts`), the rest `ce_block_kernel` under OPTION_TERMS;
   "mean" then counts the kept rows' class weights
   (`ce_count_kernel[weighted=True]`: torch divides by the sum of w[t]).
3. "mean"/"sum": `ce_reduce_kernel`, one block, sums the row losses in a
   fixed order (repeatable, unlike atomics) and divides by the count.

A target out of range that is not ignore_index cannot raise here without
a host sync: that row's loss and gradient are NaN, so a reduced loss is NaN
(the Python front doors check targets on the host where they are there).
Ignored and out-of-range rows skip the logits: nothing is loaded for them.
"""

from max.gpu import MAX_THREADS_PER_BLOCK_METADATA, thread_idx
from max.gpu.host import DeviceBuffer, DeviceContext
from std.utils import StaticTuple

from .cross_entropy_math import (
    EXTENDED_OPTIONS,
    KEPT,
    OPTION_TERMS,
    ExtendedLayout,
    PLAIN_OPTIONS,
    WEIGHTED_TERMS,
    Z_TERMS,
    extended_layout,
    target_kind,
)
from .dispatch import SPLIT_BELOW_ROWS, launch_register_strategy
from .gpu_ce_block_rows import (
    CE_BLOCK_LOSS_UNROLL,
    CE_BLOCK_THREADS,
    CE_BLOCK_UNROLL,
    CE_OPTIONS_THREADS,
    CE_OPTIONS_UNROLL,
    ce_block_loss_threads,
    launch_ce_block,
)
from .gpu_ce_pair_rows import launch_ce_pair
from .gpu_ce_register_rows import enqueue_ce_register
from .gpu_ce_smem_rows import launch_ce_parts, launch_ce_smem
from .gpu_ce_common import CEArgs, CELaunchRows
from .gpu_launch import HeldRows, aligned16, held, to_global
from .gpu_loss_sum import block_loss_sum
from .gpu_reductions import block_sum
from .gpu_register_rows import (
    MAX_ROW_REGISTERS,
    RegisterPlanKernel,
    plan_threads,
    register_plan,
)
from .gpu_smem_rows import pair_capacity, smem_capacity
from .row_math import accum_dtype, vector_width
from .variants import RowStrategies, Strategy, launch_strategy, no_strategy

# Threads of the one-block count and reduce kernels.
comptime CE_SMALL_THREADS = 1024
# Most threads a row of the register plans that many rows keep (rows to
# 4096 fp32, 8192 16-bit, 2048 float64 classes); longer rows go to the
# smem kernel (`ce_kernel_for`).
comptime CE_PLAN_THREADS = 256


# Launch bounds: without them ptxas may give a 1024-thread kernel more
# registers than a block has (CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES).
@__llvm_metadata(
    MAX_THREADS_PER_BLOCK_METADATA=StaticTuple[Int32, 1](
        Int32(CE_SMALL_THREADS)
    )
)
def ce_count_kernel[
    weighted: Bool
](
    count: Pointer[Float64, MutAnyOrigin],
    targets: Pointer[Int64, MutAnyOrigin],
    options: Pointer[Float64, MutAnyOrigin],
    rows: Int64,
    n: Int64,
    has_weight: Int32,
):
    """The "mean" count into `count[0]` (float64: exact to 2^53 rows), one
    block of CE_SMALL_THREADS. Plain options: the rows whose target is not
    ignore_index (`n` and `has_weight` unread). `weighted` (the extended
    options): the sum over kept rows of w[target] (1 without weights,
    `has_weight` zero); out-of-range targets add nothing (their rows are
    NaN)."""
    var t = Int(thread_idx.x)
    var ignore_index = Int64(options[unsafe_offset=0])
    var c = Float64(0)
    for r in range(t, Int(rows), CE_SMALL_THREADS):
        var tgt = targets[unsafe_offset=r]
        comptime if weighted:
            if target_kind(tgt, ignore_index, Int(n)) == KEPT:
                if has_weight != 0:
                    c += options[unsafe_offset=EXTENDED_OPTIONS + Int(tgt)]
                else:
                    c += 1
        else:
            if tgt != ignore_index:
                c += 1
    var total = block_sum[DType.float64, CE_SMALL_THREADS](c)
    if t == 0:
        count[unsafe_offset=0] = total


@__llvm_metadata(
    MAX_THREADS_PER_BLOCK_METADATA=StaticTuple[Int32, 1](
        Int32(CE_SMALL_THREADS)
    )
)
def ce_reduce_kernel[
    dtype: DType, mean: Bool
](
    loss: Pointer[Scalar[dtype], MutAnyOrigin],
    row_losses: Pointer[Scalar[accum_dtype[dtype]()], MutAnyOrigin],
    count: Pointer[Float64, MutAnyOrigin],
    rows: Int64,
):
    """`loss[0]` = the sum of the row losses (over the count for "mean":
    0 / 0 = NaN when every row is ignored, as torch); one block of
    CE_SMALL_THREADS, always the same order of additions
    (`block_loss_sum`, as the soft targets' reduce). The sum and the
    division are float64 whatever the row losses' type: a float32 sum of a
    million rows loses ~1e-4 of the loss (torch's fp32 loss is ~1e-7
    off), and this kernel reads a few MB at most."""
    comptime assert accum_dtype[dtype]().is_floating_point()
    var t = Int(thread_idx.x)
    var total = block_loss_sum[accum_dtype[dtype](), CE_SMALL_THREADS](
        t, row_losses, rows
    )
    if t == 0:
        comptime if mean:
            total = total / count[unsafe_offset=0]
        loss[unsafe_offset=0] = total.cast[dtype]()


struct CEWorkspace[dtype: DType, mean: Bool, reduce: Bool](Movable):
    """What a cross-entropy launch sequence (`launch_cross_entropy`)
    passes between its kernels: the
    "mean" count and the row losses, freed in stream order after them."""

    var count: DeviceBuffer[DType.float64]
    """One float64 word: the count ("mean") the gradient and loss divide by."""
    var row_losses: DeviceBuffer[accum_dtype[Self.dtype]()]
    """Row losses in the accumulator type, for the reduction ("none"
    writes them to the output instead and gets a placeholder)."""

    def __init__(out self, ctx: DeviceContext, rows: Int) raises:
        """Room for `rows` rows."""
        self.count = ctx.enqueue_create_buffer[DType.float64](1)
        self.row_losses = ctx.enqueue_create_buffer[accum_dtype[Self.dtype]()](
            max(rows, 1) if Self.reduce else 1
        )

    def count_ptr(self) -> Pointer[Float64, MutAnyOrigin]:
        """The count as the kernels take it."""
        return rebind[Pointer[Float64, MutAnyOrigin]](self.count.unsafe_ptr())

    def losses_ptr(
        self,
    ) -> Pointer[Scalar[accum_dtype[Self.dtype]()], MutAnyOrigin]:
        """The row losses as the kernels take them."""
        return rebind[Pointer[Scalar[accum_dtype[Self.dtype]()], MutAnyOrigin]](
            self.row_losses.unsafe_ptr()
        )

    def enqueue_reduce(
        self,
        ctx: DeviceContext,
        loss: Pointer[Scalar[Self.dtype], MutAnyOrigin],
        rows: Int,
    ) raises:
        """The sequence's last kernel: "mean"/"sum" reduce the row losses
        into `loss[0]` (`ce_reduce_kernel`); "none" enqueues nothing."""
        comptime if Self.reduce:
            comptime kernel = ce_reduce_kernel[Self.dtype, Self.mean]
            ctx.enqueue_function[kernel](
                loss,
                self.losses_ptr(),
                self.count_ptr(),
                Int64(rows),
                grid_dim=1,
                block_dim=CE_SMALL_THREADS,
            )


def options_onchip_parts(rows: Int, n: Int, V: Int) -> Int:
    """The blocks a row the on-chip op takes for `rows` rows of `n`
    classes with a gradient under extended options (1 or 2), or 0 where
    the block kernel should: too few rows to fill the GPU a row a block,
    or rows past a pair's capacity."""
    if rows < SPLIT_BELOW_ROWS:
        return 0
    if n <= smem_capacity(V):
        return 1
    if n <= pair_capacity(V):
        return 2
    return 0


def ce_kernel_for(
    rows: Int, n: Int, V: Int, with_grad: Bool = True
) -> Strategy:
    """The strategy `launch_cross_entropy` picks for `rows` rows of `n`
    classes: `REGISTER`, `SMEM`, `CLUSTER2` (the pair kernel) or `BLOCK`.

    The loss alone keeps the register plans that the gradient keeps and
    sends every other row to the block kernel, which reads a row once
    either way: holding it on chip (smem, pair) only delays the next
    row's loads (benchmarks/RESULTS.md, "Cross-entropy": the loss-only
    sweep).

    Where the smem kernel can take the rows (rows >= SPLIT_BELOW_ROWS, so
    a block a row fills the GPU twice over, and n <= `smem_capacity(V)`),
    register plans keep only rows of at most `CE_PLAN_THREADS` threads:
    the 512-thread plans get one block an SM (fp32: 102-128 registers a
    thread; 16-bit: capped at 64 and spilling), whose HBM idles while it
    reduces. The smem kernel runs two 512-thread blocks an SM at 64
    registers (to ~37K fp32 / ~74K 16-bit classes, then one of 1024
    threads), so it wins there, except on short rows (fp32 4096 classes),
    where 512 threads a row are too many (RESULTS, "Cross-entropy").
    Fewer rows keep every register plan (a row read once). Rows past the
    smem kernel's capacity, to `pair_capacity(V)` (~148K fp32, ~296K
    16-bit classes: Llama-3's 128256 fp32), go to `ce_pair_kernel` (a
    cluster of two blocks a row, read once) where there are as many rows,
    else to the block kernel (read twice).
    """
    var plan = register_plan(n, V, 0)
    if not with_grad:
        var many = rows >= SPLIT_BELOW_ROWS
        if plan >= 0 and (not many or plan_threads(plan) <= CE_PLAN_THREADS):
            return Strategy.REGISTER
        return Strategy.BLOCK
    if rows >= SPLIT_BELOW_ROWS and n <= smem_capacity(V):
        if plan >= 0 and plan_threads(plan) <= CE_PLAN_THREADS:
            return Strategy.REGISTER
        return Strategy.SMEM
    if plan >= 0:
        return Strategy.REGISTER
    if rows >= SPLIT_BELOW_ROWS and n <= pair_capacity(V):
        return Strategy.CLUSTER2
    return Strategy.BLOCK


struct CERows[dtype: DType, with_grad: Bool, mean: Bool, reduce: Bool](
    RegisterPlanKernel, RowStrategies
):
    """The cross-entropy rows with every buffer the row kernels take: its
    strategies "register", "smem", "pair" (`Strategy.CLUSTER2`) and
    "block"; for "register" also the plan kernel with its arguments
    (`launch_register_strategy`). Each row's loss goes to `row_losses` if
    `reduce`, else to `loss`; `with_grad`, its gradient to `dlogits`."""

    var r: CELaunchRows[Self.dtype]
    """The rows, as the launchers take them."""

    def __init__(
        out self,
        dlogits: HeldRows[Self.dtype],
        logits: HeldRows[Self.dtype],
        targets: HeldRows[DType.int64],
        options: HeldRows[DType.float64],
        count: HeldRows[DType.float64],
        row_losses: HeldRows[accum_dtype[Self.dtype]()],
        loss: HeldRows[Self.dtype],
        rows: Int,
        n: Int,
        aligned: Bool,
    ):
        """`rows` rows of `n` of these buffers (`CEArgs` says what each
        holds), `aligned` where logits and dlogits start 16-byte
        aligned."""
        var args = CEArgs[Self.dtype](
            to_global(dlogits),
            to_global(logits),
            to_global(targets),
            to_global(options),
            to_global(count),
            to_global(row_losses),
            to_global(loss),
        )
        self.r = CELaunchRows(args, rows, n, aligned)

    @staticmethod
    def op_name() -> String:
        """The op's name in error messages."""
        return "cross_entropy_with_grad" if Self.with_grad else "cross_entropy"

    @staticmethod
    def has(s: Strategy) -> Bool:
        """Strategies "register", "smem", "pair" (`CLUSTER2`), "block"."""
        return (
            s == Strategy.REGISTER
            or s == Strategy.SMEM
            or s == Strategy.CLUSTER2
            or s == Strategy.BLOCK
        )

    def auto(self, ctx: DeviceContext) raises -> Strategy:
        """`ce_kernel_for`."""
        return ce_kernel_for(
            self.r.rows, self.r.n, vector_width[Self.dtype](), Self.with_grad
        )

    def launch[s: Strategy](self, ctx: DeviceContext) raises:
        """Enqueue the row kernel of `s`."""
        comptime V = vector_width[Self.dtype]()
        comptime if s == Strategy.REGISTER:
            launch_register_strategy[V, MAX_ROW_REGISTERS](
                ctx, self, self.r.rows, self.r.n, Self.op_name()
            )
        elif s == Strategy.SMEM:
            launch_ce_smem[Self.dtype, Self.with_grad, Self.mean, Self.reduce](
                ctx, self.r
            )
        elif s == Strategy.CLUSTER2:
            launch_ce_pair[Self.dtype, Self.with_grad, Self.mean, Self.reduce](
                ctx, self.r
            )
        elif s == Strategy.BLOCK:
            # The loss alone streams the row with four loads a thread in
            # flight (CE_BLOCK_LOSS_UNROLL); with the gradient the first
            # pass keeps one (CE_BLOCK_UNROLL).
            comptime U = (
                CE_BLOCK_UNROLL if Self.with_grad else CE_BLOCK_LOSS_UNROLL
            )
            comptime T = (
                CE_BLOCK_THREADS if Self.with_grad else ce_block_loss_threads[
                    Self.dtype
                ]()
            )
            launch_ce_block[
                Self.dtype, Self.with_grad, Self.mean, Self.reduce, U, T
            ](ctx, self.r)
        else:
            no_strategy(Self.op_name())

    def enqueue[
        T: Int, K: Int
    ](self, ctx: DeviceContext, grid: Int, block: Int) raises:
        """Enqueue `ce_register_kernel` for T threads a row, K chunks a
        thread (`enqueue_ce_register`)."""
        enqueue_ce_register[
            Self.dtype, Self.with_grad, Self.mean, Self.reduce, T, K
        ](ctx, self.r, grid, block)


def launch_cross_entropy[
    dtype: DType,
    with_grad: Bool,
    reduction: StaticString,
    variant: StaticString = "auto",
](
    ctx: DeviceContext,
    loss: Pointer[Scalar[dtype], MutAnyOrigin],
    dlogits: Pointer[Scalar[dtype], MutAnyOrigin],
    logits: Pointer[Scalar[dtype], MutAnyOrigin],
    targets: Pointer[Int64, MutAnyOrigin],
    options: Pointer[Float64, MutAnyOrigin],
    rows: Int,
    n: Int,
    n_options: Int = PLAIN_OPTIONS,
) raises:
    """Enqueue the cross-entropy of `rows` rows of `n` logits (see the
    module docstring): the count ("mean"), the row kernel the row length
    picks (or `variant` forces: `CERows`), the reduction ("mean", "sum").
    Arguments as `cross_entropy_cpu`, with `options` on the device, of
    `n_options` float64 values: past PLAIN_OPTIONS, (ignore_index, eps,
    z_loss, softcap[, V class weights]) and hints (`extended_layout`),
    whose rows `_launch_extended_rows` picks (`variant` is the plain
    loss's)."""
    comptime mean = reduction == "mean"
    comptime reduce = reduction != "none"
    var extended = n_options > PLAIN_OPTIONS
    var layout = ExtendedLayout(False, 0)
    if extended:
        layout = extended_layout(n_options, n)
    var has_weight = Int32(1) if layout.weighted else Int32(0)
    var workspace = CEWorkspace[dtype, mean, reduce](ctx, rows)
    var count_ptr = workspace.count_ptr()
    var losses_ptr = workspace.losses_ptr()
    comptime if mean:
        # Extended options count the kept rows' class weights (torch
        # divides by the sum of w[t]); plain ones the rows kept.
        # `extended` is known at run time: one instance is picked, as the
        # entry points pick a dtype.
        comptime for weighted in [False, True]:
            if extended == weighted:
                ctx.enqueue_function[ce_count_kernel[weighted]](
                    count_ptr,
                    targets,
                    options,
                    Int64(rows),
                    Int64(n),
                    has_weight,
                    grid_dim=1,
                    block_dim=CE_SMALL_THREADS,
                )
    var op = CERows[dtype, with_grad, mean, reduce](
        held(dlogits),
        held(logits),
        held(targets),
        held(options),
        held(count_ptr),
        held(losses_ptr),
        held(loss),
        rows,
        n,
        aligned16(Int(logits), Int(dlogits)),
    )
    if rows > 0 and extended:
        _launch_extended_rows(op, ctx, layout.terms(), has_weight)
    elif rows > 0:
        launch_strategy[CERows[dtype, with_grad, mean, reduce], variant](
            op, ctx
        )
    workspace.enqueue_reduce(ctx, loss, rows)
    # Freed in stream order, after the kernels.
    _ = workspace^


def _launch_extended_rows[
    dtype: DType, with_grad: Bool, mean: Bool, reduce: Bool
](
    op: CERows[dtype, with_grad, mean, reduce],
    ctx: DeviceContext,
    terms: Int,
    has_weight: Int32,
) raises:
    """The row kernel of extended options holding `terms`: many rows with
    a gradient on chip (`options_onchip_parts`: scalar terms over the
    plain sweeps, OPTION_TERMS over their own), the rest, the loss alone
    included, `ce_block_kernel` under OPTION_TERMS."""
    var parts = 0
    comptime if with_grad:
        parts = options_onchip_parts(op.r.rows, op.r.n, vector_width[dtype]())
        comptime for C in [1, 2]:
            comptime for T in [Z_TERMS, WEIGHTED_TERMS, OPTION_TERMS]:
                if parts == C and terms == T:
                    launch_ce_parts[dtype, with_grad, mean, reduce, C, T](
                        ctx, op.r, has_weight
                    )
    if parts == 0:
        launch_ce_block[
            dtype,
            with_grad,
            mean,
            reduce,
            CE_OPTIONS_UNROLL,
            CE_OPTIONS_THREADS,
            OPTION_TERMS,
        ](ctx, op.r, has_weight)
