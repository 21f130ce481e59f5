"""Cross-entropy rows of any length: `ce_block_kernel`, a block per row:
an online (max, sum) pass, then, with the gradient, a pass that re-reads
the row (mostly from L2) to write it. Loss-only reads the row once.

`ce_kernel_for` (gpu_cross_entropy) gives it the rows the other families
do not take (rows longer than theirs, or fewer) and, for the loss alone,
every row past the register plans: a loss needs no row held on chip.
"""

from max.gpu import MAX_THREADS_PER_BLOCK_METADATA, block_idx, thread_idx
from max.gpu.host import DeviceContext
from std.sys import size_of
from std.utils import StaticTuple
from std.utils.numerics import nan

from .cross_entropy_math import (
    IGNORED,
    KEPT,
    grad_of,
    row_loss,
    smoothing_of,
    target_grad,
    target_kind,
)
from .gpu_ce_block_strategy import block_stats
from .gpu_ce_common import (
    ce_options,
    grad_scale,
    scalar_grad,
    store_row_loss,
    target_owner,
)
from .gpu_launch import aligned_flag_of
from .row_math import accum_dtype, exp_nan, vector_width
from .row_part import RowPart, row_part

# Rows longer than the register plans: a block of this many threads a row.
comptime CE_BLOCK_THREADS = 512
# Vectors a thread loads before it uses them in the first (online) pass:
# 1 is a load, then its use, an iteration (`thread_stats`; more:
# `fold_items`, gpu_ce_block_strategy).
comptime CE_BLOCK_UNROLL = 1
# Loss-only rows (no gradient: the logits read once) keep four loads a
# thread in flight, at `ce_block_loss_threads`: enough to cover HBM latency
# with a block of a row, where more threads or U = 8 (16-bit: ~125
# registers) leave one block an SM and lose (benchmarks/RESULTS.md,
# "Cross-entropy", the loss-only sweep).
comptime CE_BLOCK_LOSS_UNROLL = 4


def ce_block_loss_threads[dtype: DType]() -> Int:
    """Threads a row for loss-only rows (with CE_BLOCK_LOSS_UNROLL): 256
    for 16-bit types, else 512, so one vector a thread covers 2048
    elements of a row either way (float64 is unmeasured)."""
    return 256 if size_of[dtype]() <= 2 else 512


@always_inline
def _write_grad[
    dtype: DType, V: Int, T: Int
](
    y: Pointer[Scalar[dtype], MutAnyOrigin],
    x: Pointer[Scalar[dtype], MutAnyOrigin],
    p: RowPart,
    kind: Int,
    fill: Scalar[dtype],
    row_max: Scalar[accum_dtype[dtype]()],
    inv_s: Scalar[accum_dtype[dtype]()],
    smooth: Scalar[accum_dtype[dtype]()],
    scale: Scalar[accum_dtype[dtype]()],
):
    """Thread `p.t`'s share of the row's gradient into `y` (`fill` for rows
    not kept), from a second read of the logits `x`: the vector body, then
    the scalar head and tail. The target's entry is fixed up after."""
    comptime acc = accum_dtype[dtype]()
    var t = p.t
    var head = p.head
    var tail_begin = p.tail_begin
    for i in range(t, p.nvec, T):
        var out = SIMD[dtype, V](fill)
        if kind == KEPT:
            var v = (
                x.unsafe_offset(head + i * V)
                .unsafe_load[width=V, alignment=16]()
                .cast[acc]()
            )
            out = grad_of[acc, V](
                exp_nan[acc, V](v - row_max), inv_s, smooth, scale
            ).cast[dtype]()
        y.unsafe_offset(head + i * V).unsafe_store[alignment=16](out)
    for e in range(t, head, T):
        y[unsafe_offset=e] = scalar_grad[dtype](
            x, e, kind, fill, row_max, inv_s, smooth, scale
        )
    for e in range(tail_begin + t, p.len, T):
        y[unsafe_offset=e] = scalar_grad[dtype](
            x, e, kind, fill, row_max, inv_s, smooth, scale
        )


@__llvm_metadata(MAX_THREADS_PER_BLOCK_METADATA=StaticTuple[Int32, 1](Int32(T)))
def ce_block_kernel[
    dtype: DType,
    with_grad: Bool,
    mean: Bool,
    reduce: Bool,
    V: Int,
    T: Int,
    U: Int,
](
    dlogits: Pointer[Scalar[dtype], MutAnyOrigin],
    logits: Pointer[Scalar[dtype], MutAnyOrigin],
    targets: Pointer[Int64, MutAnyOrigin],
    options: Pointer[Float64, MutAnyOrigin],
    count: Pointer[Float64, MutAnyOrigin],
    row_losses: Pointer[Scalar[accum_dtype[dtype]()], MutAnyOrigin],
    loss: Pointer[Scalar[dtype], MutAnyOrigin],
    n: Int64,
    aligned_flag: Int32,
):
    """Cross-entropy of rows of any length, a block of T threads a row:
    online (max, sum of exp) over the row, then the gradient from a second
    read. Arguments as `ce_register_kernel`; `aligned_flag` is nonzero when
    the buffers start 16-byte aligned (each row then has a scalar head,
    an aligned vector body and a scalar tail, as in gpu_smem_rows). The
    first pass loads U vectors a thread at a time (`block_stats`)."""
    comptime acc = accum_dtype[dtype]()
    comptime assert acc.is_floating_point()
    var t = Int(thread_idx.x)
    var row = Int(block_idx.x)
    var len = Int(n)
    var start = row * len
    var x = logits.unsafe_offset(start)
    var p = row_part[V, T](t, start, len, aligned_flag)
    var opts = ce_options[acc](options)
    var eps = opts[1]
    var tgt = targets[unsafe_offset=row]
    var kind = target_kind(tgt, opts[0], len)
    var scale = grad_scale[acc, mean](count)
    var smooth = smoothing_of[acc](eps, len)
    # kind is the same for the whole block, so the reductions inside the
    # branch are reached by every thread or by none.
    var value = Scalar[acc](0)
    var row_max = Scalar[acc](0)
    var inv_s = Scalar[acc](0)
    var x_t = Scalar[acc](0)
    if kind == KEPT:
        # The target's logit first: loaded after the block reduction (past
        # its barriers, which no load is moved over) it would be one more
        # round trip at the end of each row.
        x_t = x[unsafe_offset=Int(tgt)].cast[acc]()
        # eps is the same for every thread: the block's reductions stay
        # uniform.
        var stats = block_stats[dtype, V, T, U, True, True](x, p, eps != 0)
        row_max = stats[0]
        var row_sum = stats[1]
        var sum_x = stats[2]
        value = row_loss[acc](row_max, row_sum, x_t, sum_x, eps, len)
        inv_s = 1 / row_sum
    elif kind != IGNORED:
        value = nan[acc]()
    if t == 0:
        store_row_loss[dtype, reduce](row_losses, loss, row, value)
    comptime if with_grad:
        var y = dlogits.unsafe_offset(start)
        var fill = Scalar[dtype](0) if kind == IGNORED else nan[dtype]()
        _write_grad[dtype, V, T](
            y, x, p, kind, fill, row_max, inv_s, smooth, scale
        )
        # The target's entry, by the thread that wrote it (its vector or
        # scalar store above came first in program order).
        if kind == KEPT:
            if t == target_owner[V, T](Int(tgt), p.head, p.tail_begin):
                y[unsafe_offset=Int(tgt)] = target_grad[acc](
                    exp_nan[acc, 1](x_t - row_max) * inv_s, smooth, eps, scale
                ).cast[dtype]()


def launch_ce_block[
    dtype: DType,
    with_grad: Bool,
    mean: Bool,
    reduce: Bool,
    U: Int,
    T: Int,
](
    ctx: DeviceContext,
    dlogits: Pointer[Scalar[dtype], MutAnyOrigin],
    logits: Pointer[Scalar[dtype], MutAnyOrigin],
    targets: Pointer[Int64, MutAnyOrigin],
    options: Pointer[Float64, MutAnyOrigin],
    count: Pointer[Float64, MutAnyOrigin],
    row_losses: Pointer[Scalar[accum_dtype[dtype]()], MutAnyOrigin],
    loss: Pointer[Scalar[dtype], MutAnyOrigin],
    rows: Int,
    n: Int,
    aligned: Bool,
) raises:
    """Launch `ce_block_kernel` on `rows` rows of `n`, a block of `T`
    threads a row (any length), its first pass `U` vectors a thread at a
    time."""
    comptime V = vector_width[dtype]()
    comptime kernel = ce_block_kernel[dtype, with_grad, mean, reduce, V, T, U]
    ctx.enqueue_function[kernel](
        dlogits,
        logits,
        targets,
        options,
        count,
        row_losses,
        loss,
        Int64(n),
        aligned_flag_of(aligned),
        grid_dim=rows,
        block_dim=T,
    )
