"""GPU cross-entropy against class probabilities (soft targets), fused:
a row's logits and probabilities are read once for its statistics (max,
sum of exp, S, T: soft_target_math), its loss written once a row, and,
with the gradient, d loss / d logits written once.

Launches, in stream order, with no host synchronisation (the op stays
capturable for device-graph replay):

1. the rows: where both rows fit one SM (`smem_capacity(V, 2)`),
   `soft_smem_kernel` (gpu_soft_smem_rows: both read once, held on chip,
   the gradient written from there); longer rows `soft_block_kernel`, a
   block a row of any length (the block strategy, `block_rows` over
   `SoftBlockRow`): an online pass over both tensors for the
   statistics, then, with the gradient, a second pass that re-reads the
   row (mostly from L2) to write it. Each row's loss goes to the output
   ("none") or to a workspace in the accumulator type;
2. for "mean" and "sum": `soft_reduce_kernel`, one block summing the row
   losses in float64 in a fixed order, over the rows for "mean" (torch's
   rule for probability targets, weighted or not).
"""

from max.gpu import MAX_THREADS_PER_BLOCK_METADATA, thread_idx
from max.gpu.host import DeviceContext
from std.utils import StaticTuple

from .gpu_ce_common import store_row_loss
from .gpu_block_rows import LOOP_A_PATH, block_rows
from .gpu_launch import (
    HeldRows,
    aligned16,
    aligned_flag_of,
    in_global,
    kernel_arg,
    to_global,
)
from .gpu_loss_sum import block_loss_sum
from .gpu_reductions import block_max
from .gpu_smem_rows import (
    SMEM_HALF_THREADS,
    SMEM_THREADS,
    OnchipLaunch,
    smem_capacity,
)
from .gpu_soft_smem_rows import (
    SOFT_TENSORS,
    SoftRowsArgs,
    block_sums,
    soft_smem_kernel,
)
from .row_math import accum_dtype, vector_width
from .row_op import BlockRowOp
from .soft_cross_entropy_ops import SoftCrossEntropyCall
from .soft_target_math import (
    SoftStats,
    SoftTargets,
    soft_grad,
    soft_scale,
    soft_weighted,
)

comptime SOFT_BLOCK_THREADS = 512
"""Threads a row of `soft_block_kernel`."""

comptime SOFT_REDUCE_THREADS = 1024
"""Threads of the one block of `soft_reduce_kernel`."""


@__llvm_metadata(MAX_THREADS_PER_BLOCK_METADATA=StaticTuple[Int32, 1](Int32(T)))
def soft_block_kernel[
    dtype: DType, with_grad: Bool, mean: Bool, reduce: Bool, T: Int
](args: SoftRowsArgs[dtype]):
    """Soft-target cross-entropy of rows of any length, a block of T
    threads a row: the block strategy (`block_rows`, gpu_block_rows) over
    `SoftBlockRow`: the statistics online over the row (each thread its
    strided elements, then the block's), the row's loss by thread 0, then
    the gradient from a second read.

    Parameters:
        dtype: Element type of logits, probabilities, loss and gradient.
        with_grad: Also write d loss / d logits.
        mean: Divide the gradient by the rows.
        reduce: Row losses to `row_losses` ("mean", "sum"), else to `loss`.
        T: Threads a row.

    Args:
        args: The tensors, options and sizes (`SoftRowsArgs`).
    """
    var op = SoftBlockRow[dtype, with_grad, mean, reduce, T](args)
    # Elements only (vector_flag 0), as this kernel has always read: the
    # launcher checks no alignment, and a constant flag leaves the element
    # loops alone in the machine code.
    block_rows[walk=LOOP_A_PATH](op, args.n, 0)


struct SoftBlockRow[
    dtype: DType, with_grad: Bool, mean: Bool, reduce: Bool, T_: Int
](BlockRowOp):
    """Soft-target cross-entropy of a row of logits and probabilities as a
    `BlockRowOp`, element by element: an online fold of the row's
    (m, s, S, T), the block's statistics and the row's loss in `combine`,
    then, with the gradient, d loss / d logits from a second read."""

    comptime threads = Self.T_
    comptime width = 1
    """One element: the rows are read by element (the kernel passes
    vector_flag 0), so a "vector" is an element and its path the
    element's."""
    comptime acc = accum_dtype[Self.dtype]()

    var args: SoftRowsArgs[Self.dtype]
    """The kernel's tensors, options and sizes, as it took them."""
    var start: Int
    """Element of the tensors where the block's row starts."""
    var row: Int
    """The block's row."""
    var targets: SoftTargets[Self.acc]
    """Label smoothing and class weights (`begin`)."""
    var z_loss: Scalar[Self.acc]
    """The z-loss' factor (`begin`)."""
    var stats: SoftStats[Self.acc]
    """The thread's online (m, s, S, T), then (`combine`) the row's."""
    var grad: Tuple[Scalar[Self.acc], Scalar[Self.acc]]
    """The gradient's p factor and reduction scale (`with_grad`)."""

    @always_inline
    def __init__(out self, args: SoftRowsArgs[Self.dtype]):
        """The op on the kernel's arguments; nothing is read yet."""
        comptime assert Self.acc.is_floating_point()
        self.args = args
        self.start = 0
        self.row = 0
        self.targets = SoftTargets[Self.acc](
            in_global(args.options), False, 0, 1
        )
        self.z_loss = 0
        self.stats = SoftStats[Self.acc](0, 0, 0, 0)
        self.grad = (Scalar[Self.acc](0), Scalar[Self.acc](0))

    @always_inline
    def begin(mut self, row: Int, len: Int) -> Int:
        """The row; eps and z_loss (read here, after the thread and row, as
        the kernel always has: an earlier read schedules differently);
        empty statistics (max -inf)."""
        self.row = row
        self.start = row * len
        var options = in_global(self.args.options)
        var eps = options[unsafe_offset=0].cast[Self.acc]()
        self.z_loss = options[unsafe_offset=1].cast[Self.acc]()
        self.targets = SoftTargets[Self.acc](
            options, self.args.weighted != 0, eps, len
        )
        self.stats = SoftStats[Self.acc](
            Scalar[Self.acc](-1) / Scalar[Self.acc](0), 0, 0, 0
        )
        return len

    @always_inline
    def _x(self, e: Int) -> Scalar[Self.acc]:
        """The row's logit e."""
        var x = in_global(self.args.logits).unsafe_offset(self.start)
        return x[unsafe_offset=e].cast[Self.acc]()

    @always_inline
    def _q(self, e: Int) -> Scalar[Self.acc]:
        """The row's target q at class e."""
        var p = in_global(self.args.probs).unsafe_offset(self.start)
        return self.targets.q_at(p, e)

    @always_inline
    def fold_vector(mut self, e: Int):
        """Element `e` (width 1: the element path)."""
        self.fold_element(e)

    @always_inline
    def fold_element(mut self, e: Int):
        """Fold the element's (x, q) into the thread's statistics."""
        var q = self._q(e)
        self.stats.add(self._x(e), q)

    @always_inline
    def combine(mut self):
        """The row's statistics under its max; thread 0 stores the row's
        loss (`store_row_loss`)."""
        self.stats.shift(block_max[Self.acc, Self.T_](self.stats.m))
        self.stats = block_sums[Self.T_](self.stats)
        if thread_idx.x == 0:
            store_row_loss[Self.dtype, Self.reduce](
                in_global(self.args.row_losses),
                in_global(self.args.loss),
                self.row,
                self.stats.loss(self.z_loss),
            )
        comptime if Self.with_grad:
            self.grad = (
                self.stats.p_factor(self.z_loss),
                soft_scale[Self.acc, Self.mean](Int(self.args.rows)),
            )

    @always_inline
    def write_vector(self, e: Int):
        """Element `e` (width 1: the element path)."""
        self.write_element(e)

    @always_inline
    def write_element(self, e: Int):
        """The element's gradient (`with_grad`; without it nothing is
        written and the pass compiles to nothing)."""
        comptime if Self.with_grad:
            var q = self._q(e)
            var y = in_global(self.args.dlogits).unsafe_offset(self.start)
            y[unsafe_offset=e] = soft_grad[Self.acc, 1](
                self._x(e), q, self.stats.m, self.grad[0], self.grad[1]
            )[0].cast[Self.dtype]()


@__llvm_metadata(
    MAX_THREADS_PER_BLOCK_METADATA=StaticTuple[Int32, 1](
        Int32(SOFT_REDUCE_THREADS)
    )
)
def soft_reduce_kernel[
    dtype: DType, mean: Bool
](
    loss: Pointer[Scalar[dtype], MutAnyOrigin],
    row_losses: Pointer[Scalar[accum_dtype[dtype]()], MutAnyOrigin],
    rows: Int64,
):
    """`loss[0]` = the sum of the row losses (over the rows for "mean"),
    one block in a fixed order, summed and divided in float64."""
    comptime assert accum_dtype[dtype]().is_floating_point()
    var t = Int(thread_idx.x)
    var total = block_loss_sum[accum_dtype[dtype](), SOFT_REDUCE_THREADS](
        t, row_losses, rows
    )
    if t == 0:
        comptime if mean:
            total = total / Float64(rows)
        loss[unsafe_offset=0] = total.cast[dtype]()


def launch_soft_cross_entropy[
    dtype: DType, with_grad: Bool, reduction: StaticString
](
    ctx: DeviceContext, call: SoftCrossEntropyCall[dtype, with_grad, reduction]
) raises:
    """Queue `call`'s rows on `ctx`, then for "mean"/"sum" the
    reduction."""
    comptime acc = accum_dtype[dtype]()
    comptime mean = reduction == "mean"
    comptime reduce = reduction != "none"
    var rows = call.view.outer
    var n = call.view.n
    var weighted = soft_weighted(call.options.count, n)
    var row_losses = ctx.enqueue_create_buffer[acc](
        max(rows, 1) if reduce else 1
    )
    var losses = rebind[HeldRows[acc]](row_losses.unsafe_ptr())
    var args = SoftRowsArgs[dtype](
        to_global(call.dlogits),
        to_global(call.logits),
        to_global(call.targets),
        to_global(call.options.values),
        Int32(1 if weighted else 0),
        to_global(losses),
        to_global(call.loss),
        Int64(rows),
        Int64(n),
    )
    if rows == 0 or n == 0:
        raise Error("max_softmax: soft_cross_entropy needs rows and classes")
    if n <= smem_capacity(vector_width[dtype](), SOFT_TENSORS):
        # A block a row with the shared memory its part of both tensors
        # needs (`OnchipLaunch`), of 512 or 1024 threads.
        var aligned = aligned16(
            Int(call.logits), Int(call.targets), Int(call.dlogits)
        )
        var launch = OnchipLaunch[dtype, 1](
            ctx, "soft cross-entropy's on-chip kernel", rows, n, SOFT_TENSORS
        )
        comptime V = vector_width[dtype]()
        comptime for T in [SMEM_HALF_THREADS, SMEM_THREADS]:
            if launch.threads == T:
                launch.enqueue[
                    soft_smem_kernel[dtype, with_grad, mean, reduce, V, T], T
                ](ctx, args, aligned_flag_of(aligned))
    else:
        comptime T = SOFT_BLOCK_THREADS
        comptime kernel = soft_block_kernel[dtype, with_grad, mean, reduce, T]
        ctx.enqueue_function[kernel](
            args,
            grid_dim=rows,
            block_dim=T,
        )
    comptime if reduce:
        comptime reduce_kernel = soft_reduce_kernel[dtype, mean]
        ctx.enqueue_function[reduce_kernel](
            kernel_arg(call.loss),
            kernel_arg(losses),
            Int64(rows),
            grid_dim=1,
            block_dim=SOFT_REDUCE_THREADS,
        )
    _ = row_losses^
