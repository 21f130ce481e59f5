"""GPU cross-entropy against class probabilities (soft targets), fused:
a row's logits and probabilities are read once for its statistics (max,
sum of exp, S, T: soft_target_math), its loss written once a row, and,
with the gradient, d loss / d logits written once.

Launches, in stream order, with no host synchronisation (the op stays
capturable for device-graph replay):

1. the rows: where both rows fit one SM (`smem_capacity(V, 2)`),
   `soft_smem_kernel` (gpu_soft_smem_rows: both read once, held on chip,
   the gradient written from there); longer rows `soft_block_kernel`, a
   block a row of any length: an online pass over both tensors for the
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
from .row_part import BlockRow
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
    threads a row: the statistics online over the row (each thread its
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
    var dlogits = in_global(args.dlogits)
    var logits = in_global(args.logits)
    var probs = in_global(args.probs)
    var options = in_global(args.options)
    var weighted = args.weighted
    var row_losses = in_global(args.row_losses)
    var loss = in_global(args.loss)
    var rows = args.rows
    var n = args.n
    comptime acc = accum_dtype[dtype]()
    comptime assert acc.is_floating_point()
    var r = BlockRow.of(n)
    var t = r.t
    var len = r.len
    var x = logits.unsafe_offset(r.start)
    var p = probs.unsafe_offset(r.start)
    var eps = options[unsafe_offset=0].cast[acc]()
    var z_loss = options[unsafe_offset=1].cast[acc]()
    var targets = SoftTargets[acc](options, weighted != 0, eps, len)
    var part = SoftStats[acc](Scalar[acc](-1) / Scalar[acc](0), 0, 0, 0)
    for j in range(t, len, T):
        var q = targets.q_at(p, j)
        part.add(x[unsafe_offset=j].cast[acc](), q)
    part.shift(block_max[acc, T](part.m))
    var stats = block_sums[T](part)
    if t == 0:
        store_row_loss[dtype, reduce](
            row_losses, loss, r.row, stats.loss(z_loss)
        )
    comptime if with_grad:
        var y = dlogits.unsafe_offset(r.start)
        var p_factor = stats.p_factor(z_loss)
        var scale = soft_scale[acc, mean](Int(rows))
        for j in range(t, len, T):
            var q = targets.q_at(p, j)
            y[unsafe_offset=j] = soft_grad[acc, 1](
                x[unsafe_offset=j].cast[acc](), q, stats.m, p_factor, scale
            )[0].cast[dtype]()


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
