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
from std.utils.numerics import inf, nan

from .cross_entropy_math import (
    IGNORED,
    KEPT,
    grad_of,
    row_loss,
    smoothing_of,
    target_grad,
    target_kind,
)
from .gpu_ce_common import ce_options, grad_scale, scalar_grad, target_owner
from .gpu_launch import aligned_flag_of
from .gpu_reductions import block_max_sum, block_sum
from .row_math import (
    accum_dtype,
    exp_diff,
    exp_nan,
    online_add,
    online_sum_guard,
    sum_shift,
    vector_width,
)

# Rows longer than the register plans: a block of this many threads a row.
comptime CE_BLOCK_THREADS = 512
# Vectors a thread loads before it uses them in the first (online) pass:
# 1 is a load, then its use, an iteration (`_online_pass`; more: `_fold_items`).
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
def fold_group[
    dtype: DType, W: Int, U: Int, smoothing: Bool
](
    raw: SIMD[dtype, U * W],
    mut m: Scalar[accum_dtype[dtype]()],
    mut s: Scalar[accum_dtype[dtype]()],
    mut sx: Scalar[accum_dtype[dtype]()],
):
    """Fold a group of U loaded items (`raw`, in the logits' type) into the
    online pair (`m`, `s`) and, `smoothing`, the plain sum `sx`: what
    `online_add` of the cast values does (one rescale for the group, values
    shifted by `sum_shift`), but with the max taken on the raw values (the
    cast is exact and keeps order, so it is the same max) and each item
    cast as it is used, so the U * W cast values need not all be live at
    once (16-bit U = 4 at 512 threads: 55 registers, against 75 with
    `online_add` of the whole group; U = 8 still takes ~125, one
    512-thread block an SM). The sharded statistics pass
    (gpu_sharded_rows) folds its groups with it too."""
    comptime acc = accum_dtype[dtype]()
    var new_m = max(m, raw.reduce_max().cast[acc]())
    var shift = sum_shift[acc](new_m)
    var xs = raw.slice[W]().cast[acc]()
    var e = exp_nan[acc, W](xs - shift)
    comptime for k in range(1, U):
        var v = raw.slice[W, offset=k * W]().cast[acc]()
        e += exp_nan[acc, W](v - shift)
        comptime if smoothing:
            xs += v
    s = s * exp_diff[acc, 1](m, new_m) + e.reduce_add()
    m = new_m
    comptime if smoothing:
        sx += xs.reduce_add()


@always_inline
def _fold_items[
    dtype: DType, W: Int, T: Int, U: Int, smoothing: Bool
](
    x: Pointer[Scalar[dtype], MutAnyOrigin],
    base: Int,
    count: Int,
    t: Int,
    mut m: Scalar[accum_dtype[dtype]()],
    mut s: Scalar[accum_dtype[dtype]()],
    mut sx: Scalar[accum_dtype[dtype]()],
):
    """Fold thread `t`'s items of `W` elements (16-byte vectors, or
    scalars), from `base + i * W` for i = t, t + T, ... < `count`, into its
    online pair (`m`, `s`) and, `smoothing`, its plain sum `sx`: U items at
    a time, the group's U loads issued before any is used (`fold_group`).

    With one load an iteration the loop-carried (m, s) waits on each load
    in turn, one 16-byte load a thread in flight; a group keeps U in flight
    and pays one rescale for U * W values. A last group of fewer than U
    items is loaded the same way (its missing items clamped to the range's
    last item, an address inside the row, then masked: -inf for the max
    and exp, 0 for the sum), so it too is one round trip rather than one
    an item."""
    comptime align = size_of[dtype]() * W
    var i = t
    while i + (U - 1) * T < count:
        var raw = SIMD[dtype, U * W]()
        comptime for k in range(U):
            raw = raw.insert[offset=k * W](
                x.unsafe_offset(base + (i + k * T) * W).unsafe_load[
                    width=W, alignment=align
                ]()
            )
        fold_group[dtype, W, U, smoothing](raw, m, s, sx)
        i += U * T
    if i < count:  # 1 to U - 1 items left
        var raw = SIMD[dtype, U * W](-inf[dtype]())
        var kept = SIMD[dtype, U * W](0)
        comptime for k in range(U - 1):
            var item = x.unsafe_offset(
                base + min(i + k * T, count - 1) * W
            ).unsafe_load[width=W, alignment=align]()
            var ok = i + k * T < count
            raw = raw.insert[offset=k * W](
                item if ok else SIMD[dtype, W](-inf[dtype]())
            )
            comptime if smoothing:
                kept = kept.insert[offset=k * W](
                    item if ok else SIMD[dtype, W](0)
                )
        var no_sum = Scalar[accum_dtype[dtype]()](0)
        fold_group[dtype, W, U, False](raw, m, s, no_sum)
        comptime if smoothing:
            sx += kept.cast[accum_dtype[dtype]()]().reduce_add()


@always_inline
def _online_pass[
    dtype: DType, V: Int, T: Int, U: Int, smoothing: Bool
](
    x: Pointer[Scalar[dtype], MutAnyOrigin],
    t: Int,
    head: Int,
    nvec: Int,
    tail_begin: Int,
    len: Int,
) -> Tuple[
    Scalar[accum_dtype[dtype]()],
    Scalar[accum_dtype[dtype]()],
    Scalar[accum_dtype[dtype]()],
]:
    """Thread `t`'s share of the row: its online (max, sum of exp) pair
    and, `smoothing`, its plain sum (for label smoothing; else 0).

    U = 1: one vector an iteration, then the scalar head and tail. U > 1:
    the vector body U vectors a group (`_fold_items`). With aligned
    buffers (a head and a tail under V elements: at most one element of
    each a thread) the thread's head and tail elements are loaded first,
    in flight with the body's loads, and folded last; unaligned buffers
    (the whole row a scalar head) fold each piece U items a group."""
    comptime acc = accum_dtype[dtype]()
    var m = -inf[acc]()
    var s = Scalar[acc](0)
    var sx = Scalar[acc](0)
    comptime if U == 1:
        for i in range(t, nvec, T):
            var v = (
                x.unsafe_offset(head + i * V)
                .unsafe_load[width=V, alignment=16]()
                .cast[acc]()
            )
            (m, s) = online_add[acc, V](m, s, v)
            comptime if smoothing:
                sx += v.reduce_add()
        for e in range(t, head, T):
            var v = x[unsafe_offset=e].cast[acc]()
            (m, s) = online_add[acc, 1](m, s, v)
            comptime if smoothing:
                sx += v
        for e in range(tail_begin + t, len, T):
            var v = x[unsafe_offset=e].cast[acc]()
            (m, s) = online_add[acc, 1](m, s, v)
            comptime if smoothing:
                sx += v
    else:
        if head <= T and len - tail_begin <= T:
            # Both loads in bounds (a kept row has len >= 1), masked after.
            var has_h = t < head
            var has_t = tail_begin + t < len
            var h = x[unsafe_offset=min(t, len - 1)].cast[acc]()
            var e = x[unsafe_offset=min(tail_begin + t, len - 1)].cast[acc]()
            _fold_items[dtype, V, T, U, smoothing](
                x.unsafe_offset(head), 0, nvec, t, m, s, sx
            )
            var edge = SIMD[acc, 2](
                h if has_h else -inf[acc](), e if has_t else -inf[acc]()
            )
            (m, s) = online_add[acc, 2](m, s, edge)
            comptime if smoothing:
                sx += (h if has_h else Scalar[acc](0)) + (
                    e if has_t else Scalar[acc](0)
                )
        else:
            _fold_items[dtype, 1, T, U, smoothing](x, 0, head, t, m, s, sx)
            _fold_items[dtype, V, T, U, smoothing](
                x.unsafe_offset(head), 0, nvec, t, m, s, sx
            )
            _fold_items[dtype, 1, T, U, smoothing](
                x, tail_begin, len - tail_begin, t, m, s, sx
            )
    return (m, s, sx)


@always_inline
def _write_grad[
    dtype: DType, V: Int, T: Int
](
    y: Pointer[Scalar[dtype], MutAnyOrigin],
    x: Pointer[Scalar[dtype], MutAnyOrigin],
    t: Int,
    head: Int,
    nvec: Int,
    tail_begin: Int,
    len: Int,
    kind: Int,
    fill: Scalar[dtype],
    row_max: Scalar[accum_dtype[dtype]()],
    inv_s: Scalar[accum_dtype[dtype]()],
    smooth: Scalar[accum_dtype[dtype]()],
    scale: Scalar[accum_dtype[dtype]()],
):
    """Thread `t`'s share of the row's gradient into `y` (`fill` for rows
    not kept), from a second read of the logits `x`: the vector body, then
    the scalar head and tail. The target's entry is fixed up after."""
    comptime acc = accum_dtype[dtype]()
    for i in range(t, nvec, T):
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
    for e in range(tail_begin + t, len, T):
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
    first pass loads U vectors a thread at a time (`_online_pass`)."""
    comptime acc = accum_dtype[dtype]()
    comptime assert acc.is_floating_point()
    var t = Int(thread_idx.x)
    var row = Int(block_idx.x)
    var len = Int(n)
    var start = row * len
    var x = logits.unsafe_offset(start)
    var head = min((V - start % V) % V, len) if aligned_flag != 0 else len
    var nvec = (len - head) // V
    var tail_begin = head + nvec * V
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
        # Without label smoothing the plain sum is not needed: a pass
        # without it (one add an element fewer). eps is the same for every
        # thread, so the reduction below stays uniform.
        var part: Tuple[Scalar[acc], Scalar[acc], Scalar[acc]]
        if eps != 0:
            part = _online_pass[dtype, V, T, U, True](
                x, t, head, nvec, tail_begin, len
            )
        else:
            part = _online_pass[dtype, V, T, U, False](
                x, t, head, nvec, tail_begin, len
            )
        var pair = block_max_sum[acc, T](part[0], part[1])
        row_max = pair[0]
        var row_sum = online_sum_guard[acc](pair[0], pair[1])
        var sum_x = block_sum[acc, T](part[2]) if eps != 0 else Scalar[acc](0)
        value = row_loss[acc](row_max, row_sum, x_t, sum_x, eps, len)
        inv_s = 1 / row_sum
    elif kind != IGNORED:
        value = nan[acc]()
    if t == 0:
        comptime if reduce:
            row_losses[unsafe_offset=row] = value
        else:
            loss[unsafe_offset=row] = value.cast[dtype]()
    comptime if with_grad:
        var y = dlogits.unsafe_offset(start)
        var fill = Scalar[dtype](0) if kind == IGNORED else nan[dtype]()
        _write_grad[dtype, V, T](
            y,
            x,
            t,
            head,
            nvec,
            tail_begin,
            len,
            kind,
            fill,
            row_max,
            inv_s,
            smooth,
            scale,
        )
        # The target's entry, by the thread that wrote it (its vector or
        # scalar store above came first in program order).
        if kind == KEPT:
            if t == target_owner[V, T](Int(tgt), head, tail_begin):
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
