"""A row's statistics from a block of T threads, written once: the
online (max, sum of exp) pair and, for label smoothing, the plain sum of
a row of any length, each thread folding its share of the row (scalar
head, aligned vector body, scalar tail: `RowPart`) U loads in flight,
then one block reduction.

`CEBlockRow` (gpu_ce_block_rows) folds a thread's share (`share_stats`)
and combines the block's (`combine_stats`) as the block strategy's two
steps, then builds a row's loss and, with the gradient, re-reads the row;
`row_stats_kernel` (gpu_sharded_rows) takes both at once (`block_stats`)
and writes them out for the other devices to combine. The two differ only
in how a thread's last items are read (`masked_tails`).
"""

from std.sys import size_of
from std.utils.numerics import inf

from .gpu_reductions import block_max_sum, block_sum
from .row_math import (
    accum_dtype,
    exp_diff,
    exp_nan,
    online_add,
    online_sum_guard,
    sum_shift,
)
from .row_part import RowPart


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
    512-thread block an SM)."""
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
def fold_items[
    dtype: DType, W: Int, T: Int, U: Int, smoothing: Bool, masked: Bool
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
    and pays one rescale for U * W values. The fewer than U items left are
    folded one by one, or, `masked`, loaded as one more group (the missing
    items clamped to the range's last item, an address inside the row,
    then masked: -inf for the max and exp, 0 for the sum), one round trip
    rather than one an item."""
    comptime acc = accum_dtype[dtype]()
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
    comptime if masked:
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
            var no_sum = Scalar[acc](0)
            fold_group[dtype, W, U, False](raw, m, s, no_sum)
            comptime if smoothing:
                sx += kept.cast[acc]().reduce_add()
    else:
        while i < count:
            var v = (
                x.unsafe_offset(base + i * W)
                .unsafe_load[width=W, alignment=align]()
                .cast[acc]()
            )
            (m, s) = online_add[acc, W](m, s, v)
            comptime if smoothing:
                sx += v.reduce_add()
            i += T


@always_inline
def thread_stats[
    dtype: DType, V: Int, T: Int, U: Int, smoothing: Bool, masked_tails: Bool
](x: Pointer[Scalar[dtype], MutAnyOrigin], p: RowPart) -> Tuple[
    Scalar[accum_dtype[dtype]()],
    Scalar[accum_dtype[dtype]()],
    Scalar[accum_dtype[dtype]()],
]:
    """Thread `p.t`'s share of the row `x`: its online (max, sum of exp)
    pair and, `smoothing`, its plain sum (else 0).

    U = 1: one vector an iteration, then the scalar head and tail. U > 1:
    each piece U items a group (`fold_items`). `masked_tails`: a last
    group of fewer than U items is one masked group, and with aligned
    buffers (a head and a tail under V elements: at most one element of
    each a thread) the thread's head and tail elements are loaded first,
    in flight with the body's loads, and folded last."""
    comptime acc = accum_dtype[dtype]()
    var t = p.t
    var head = p.head
    var nvec = p.nvec
    var tail_begin = p.tail_begin
    var len = p.len
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
        if masked_tails and head <= T and len - tail_begin <= T:
            # Both loads in bounds (a kept row has len >= 1), masked after.
            var has_h = t < head
            var has_t = tail_begin + t < len
            var h = x[unsafe_offset=min(t, len - 1)].cast[acc]()
            var e = x[unsafe_offset=min(tail_begin + t, len - 1)].cast[acc]()
            fold_items[dtype, V, T, U, smoothing, masked_tails](
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
            fold_items[dtype, 1, T, U, smoothing, masked_tails](
                x, 0, head, t, m, s, sx
            )
            fold_items[dtype, V, T, U, smoothing, masked_tails](
                x.unsafe_offset(head), 0, nvec, t, m, s, sx
            )
            fold_items[dtype, 1, T, U, smoothing, masked_tails](
                x, tail_begin, len - tail_begin, t, m, s, sx
            )
    return (m, s, sx)


@always_inline
def share_stats[
    dtype: DType, V: Int, T: Int, U: Int, masked_tails: Bool
](
    x: Pointer[Scalar[dtype], MutAnyOrigin], p: RowPart, smoothing: Bool
) -> Tuple[
    Scalar[accum_dtype[dtype]()],
    Scalar[accum_dtype[dtype]()],
    Scalar[accum_dtype[dtype]()],
]:
    """Thread `p.t`'s `thread_stats` of the row `x`, with the plain sum
    where `smoothing` (a runtime flag: without it the pass skips the sum,
    one add an element fewer)."""
    comptime acc = accum_dtype[dtype]()
    var part: Tuple[Scalar[acc], Scalar[acc], Scalar[acc]]
    if smoothing:
        part = thread_stats[dtype, V, T, U, True, masked_tails](x, p)
    else:
        part = thread_stats[dtype, V, T, U, False, masked_tails](x, p)
    return part


@always_inline
def combine_stats[
    acc: DType, T: Int, guarded: Bool
](part: Tuple[Scalar[acc], Scalar[acc], Scalar[acc]], smoothing: Bool) -> Tuple[
    Scalar[acc], Scalar[acc], Scalar[acc]
]:
    """The row's (max, sum of exp(x - `sum_shift(max)`), sum of x (0 unless
    `smoothing`)) from every thread's `share_stats` `part` of the T-thread
    block; `guarded`, the sum as a row's own result takes it
    (`online_sum_guard`: NaN where the max is +-inf), else as a part of a
    row for a later combine. `smoothing` must be the same for the whole
    block (the block reductions are reached by every thread)."""
    var pair = block_max_sum[acc, T](part[0], part[1])
    var row_sum = pair[1]
    comptime if guarded:
        row_sum = online_sum_guard[acc](pair[0], pair[1])
    var sum_x = block_sum[acc, T](part[2]) if smoothing else Scalar[acc](0)
    return (pair[0], row_sum, sum_x)


@always_inline
def block_stats[
    dtype: DType, V: Int, T: Int, U: Int, masked_tails: Bool, guarded: Bool
](
    x: Pointer[Scalar[dtype], MutAnyOrigin], p: RowPart, smoothing: Bool
) -> Tuple[
    Scalar[accum_dtype[dtype]()],
    Scalar[accum_dtype[dtype]()],
    Scalar[accum_dtype[dtype]()],
]:
    """The row `x`'s statistics (`combine_stats`) from every thread of the
    T-thread block, each its `share_stats`."""
    return combine_stats[accum_dtype[dtype](), T, guarded](
        share_stats[dtype, V, T, U, masked_tails](x, p, smoothing), smoothing
    )
