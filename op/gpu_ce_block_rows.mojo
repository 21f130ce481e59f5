"""Cross-entropy rows of any length: `ce_block_kernel`, a block per row:
an online (max, sum) pass, then, with the gradient, a pass that re-reads
the row (mostly from L2) to write it. Loss-only reads the row once.

`ce_kernel_for` (gpu_cross_entropy) gives it the rows the other families
do not take (rows longer than theirs, or fewer) and, for the loss alone,
every row past the register plans: a loss needs no row held on chip.
Under the extended options (OPTION_TERMS: z-loss, softcap, class weights)
it takes the loss alone, few rows and rows past a pair's capacity; a
thread then folds its elements a block apart (`_options_row`), the
softcap and the class weights elementwise.
"""

from max.gpu import MAX_THREADS_PER_BLOCK_METADATA, block_idx, thread_idx
from max.gpu.host import DeviceContext
from std.sys import size_of
from std.utils import StaticTuple
from std.utils.numerics import nan

from .cross_entropy_math import (
    EXTENDED_OPTIONS,
    IGNORED,
    KEPT,
    NO_TERMS,
    OPTION_TERMS,
    OUT_OF_RANGE,
    extended_p_factor,
    extended_row_loss,
    row_loss,
    smoothing_of,
    softcap_chain,
    softcap_of,
    target_grad,
    target_kind,
)
from .gpu_ce_block_strategy import block_stats
from .gpu_ce_common import (
    CEArgs,
    CELaunchRows,
    CrossEntropyGrad,
    ce_options,
    grad_scale,
    target_owner,
)
from .gpu_launch import HeldRows, aligned_flag_of, held, in_global, kernel_arg
from .gpu_reductions import block_max_sum, block_sum
from .row_math import (
    accum_dtype,
    exp_nan,
    online_add,
    online_sum_guard,
    vector_width,
)
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
# Under OPTION_TERMS: threads a row, and elements a thread loads before it
# uses them.
comptime CE_OPTIONS_THREADS = 512
comptime CE_OPTIONS_UNROLL = 4


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
    g: CrossEntropyGrad[dtype, False],
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
            out = g.edge[V](
                x.unsafe_offset(head + i * V)
                .unsafe_load[width=V, alignment=16]()
                .cast[acc]()
            )
        y.unsafe_offset(head + i * V).unsafe_store[alignment=16](out)
    for e in range(t, head, T):
        y[unsafe_offset=e] = _scalar_grad(x, e, kind, fill, g)
    for e in range(tail_begin + t, p.len, T):
        y[unsafe_offset=e] = _scalar_grad(x, e, kind, fill, g)


@always_inline
def _scalar_grad[
    dtype: DType
](
    x: Pointer[Scalar[dtype], MutAnyOrigin],
    e: Int,
    kind: Int,
    fill: Scalar[dtype],
    g: CrossEntropyGrad[dtype, False],
) -> Scalar[dtype]:
    """The gradient of element `e` outside the row's vector body."""
    if kind != KEPT:
        return fill
    return g.edge[1](x[unsafe_offset=e].cast[accum_dtype[dtype]()]())[0]


@__llvm_metadata(MAX_THREADS_PER_BLOCK_METADATA=StaticTuple[Int32, 1](Int32(T)))
def ce_block_kernel[
    dtype: DType,
    with_grad: Bool,
    mean: Bool,
    reduce: Bool,
    V: Int,
    T: Int,
    U: Int,
    terms: Int = NO_TERMS,
](args: CEArgs[dtype], n: Int64, flag: Int32):
    """Cross-entropy of rows of any length, a block of T threads a row:
    online (max, sum of exp) over the row, then the gradient from a second
    read. Arguments as `ce_register_kernel`; `flag` is nonzero when the
    buffers start 16-byte aligned (each row then has a scalar head, an
    aligned vector body and a scalar tail, as in gpu_smem_rows). The first
    pass loads U vectors a thread at a time (`block_stats`).

    OPTION_TERMS: the extended options' row (`_options_row`), U elements a
    thread at a time, `flag` nonzero where `options` holds a weight a
    class."""
    comptime acc = accum_dtype[dtype]()
    comptime assert acc.is_floating_point()
    comptime if terms == OPTION_TERMS:
        _options_row[dtype, with_grad, mean, reduce, T, U](args, n, flag)
        return
    var t = Int(thread_idx.x)
    var row = Int(block_idx.x)
    var len = Int(n)
    var start = row * len
    var x = in_global(args.logits).unsafe_offset(start)
    var p = row_part[V, T](t, start, len, flag)
    var opts = ce_options[acc](in_global(args.options))
    var eps = opts[1]
    var tgt = in_global(args.targets)[unsafe_offset=row]
    var kind = target_kind(tgt, opts[0], len)
    var scale = grad_scale[acc, mean](in_global(args.count))
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
        args.store_loss[reduce](row, value)
    comptime if with_grad:
        var y = in_global(args.dlogits).unsafe_offset(start)
        var fill = Scalar[dtype](0) if kind == IGNORED else nan[dtype]()
        _write_grad[dtype, V, T](
            y,
            x,
            p,
            kind,
            fill,
            CrossEntropyGrad[dtype, False](row_max, inv_s, smooth, scale),
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
    terms: Int = NO_TERMS,
](ctx: DeviceContext, op: CELaunchRows[dtype], has_weight: Int32 = 0) raises:
    """Launch `ce_block_kernel` on `op`'s rows, a block of `T` threads a
    row (any length), its first pass `U` vectors a thread at a time; under
    OPTION_TERMS its flag is `has_weight`, else whether `op` is aligned."""
    comptime V = vector_width[dtype]()
    comptime kernel = ce_block_kernel[
        dtype, with_grad, mean, reduce, V, T, U, terms
    ]
    ctx.enqueue_function[kernel](
        op.args,
        Int64(op.n),
        has_weight if terms == OPTION_TERMS else aligned_flag_of(op.aligned),
        grid_dim=op.rows,
        block_dim=T,
    )


# ===----------------------------------------------------------------------=== #
# The extended options' row (OPTION_TERMS)
# ===----------------------------------------------------------------------=== #


@fieldwise_init
struct _OptionTerms[dtype: DType, T: Int]:
    """What a thread's elements of an extended options' row are folded or
    written with: the options, then (the gradient) the row's statistics;
    its elements lie T apart (`_gather`)."""

    var weights: HeldRows[DType.float64]
    """The class weights (read where `has_weight`)."""
    var has_weight: Int32
    """`options` holds a weight a class."""
    var eps: Scalar[accum_dtype[Self.dtype]()]
    """Label smoothing."""
    var cap: Scalar[accum_dtype[Self.dtype]()]
    """The softcap (0: none)."""
    var tgt: Int
    """The row's target."""
    var factor: Scalar[accum_dtype[Self.dtype]()]
    """What multiplies p in the gradient (`extended_p_factor`)."""
    var target_term: Scalar[accum_dtype[Self.dtype]()]
    """(1 - eps) w_t."""
    var g: CrossEntropyGrad[Self.dtype, False]
    """The row's max, 1 / its sum of exp(y - max), eps / V and the
    gradient's scale."""

    @always_inline
    def capped[
        W: Int
    ](self, x: Pointer[Scalar[Self.dtype], MutAnyOrigin], c: Int) -> SIMD[
        accum_dtype[Self.dtype](), W
    ]:
        """The capped logits of W of the thread's elements from `c`."""
        comptime acc = accum_dtype[Self.dtype]()
        return softcap_of[acc, W](
            _gather[Self.dtype, acc, W, Self.T](x, c), self.cap
        )

    @always_inline
    def weights_at[W: Int](self, c: Int) -> SIMD[accum_dtype[Self.dtype](), W]:
        """The class weights u of W of the thread's elements from `c` (1
        without weights)."""
        comptime acc = accum_dtype[Self.dtype]()
        var u = SIMD[acc, W](1)
        if self.has_weight != 0:
            u = _gather[DType.float64, acc, W, Self.T](
                kernel_arg(self.weights), c
            )
        return u


@always_inline
def _options_row[
    dtype: DType, with_grad: Bool, mean: Bool, reduce: Bool, T: Int, U: Int
](args: CEArgs[dtype], n: Int64, has_weight: Int32):
    """One row (block) of the extended cross-entropy: an online (max, sum
    of exp) pass over the capped logits (with, under label smoothing, the
    weighted sums the loss needs), its loss to `row_losses` (`reduce`) or
    `loss`, and `with_grad` its gradient from a second read."""
    comptime acc = accum_dtype[dtype]()
    comptime assert acc.is_floating_point()
    var t = Int(thread_idx.x)
    var row = Int(block_idx.x)
    var len = Int(n)
    var x = in_global(args.logits).unsafe_offset(row * len)
    var y_out = in_global(args.dlogits).unsafe_offset(row * len)
    var options = in_global(args.options)
    var ignore_index = Int64(options[unsafe_offset=0])
    var weights = options.unsafe_offset(EXTENDED_OPTIONS)
    var f = _OptionTerms[dtype, T](
        held(weights),
        has_weight,
        options[unsafe_offset=1].cast[acc](),
        0,
        0,
        0,
        0,
        CrossEntropyGrad[dtype, False](0, 0, 0, 1),
    )
    var z_loss = options[unsafe_offset=2].cast[acc]()
    f.cap = options[unsafe_offset=3].cast[acc]()
    var tgt = in_global(args.targets)[unsafe_offset=row]
    var kind = target_kind(tgt, ignore_index, len)
    if kind != KEPT:
        # Ignored: loss 0 and gradient 0; out of range: NaN (the host
        # cannot be told without a sync).
        var fill = Scalar[acc](0) if kind != OUT_OF_RANGE else nan[acc]()
        comptime if with_grad:
            for c in range(t, len, T):
                y_out[unsafe_offset=c] = fill.cast[dtype]()
        if t == 0:
            args.store_loss[reduce](row, fill)
        return
    var m = Scalar[acc](-1) / Scalar[acc](0)
    var s = Scalar[acc](0)
    var su = Scalar[acc](0)
    var suy = Scalar[acc](0)
    # U elements a thread are loaded before they are used (loads in
    # flight), then the rest one at a time.
    var c = t
    while c + (U - 1) * T < len:
        _stats_step[dtype, T, U](x, c, f, m, s, su, suy)
        c += U * T
    while c < len:
        _stats_step[dtype, T, 1](x, c, f, m, s, su, suy)
        c += T
    # The target's logit and weight are read before the block's first
    # barrier: the gradient may be written over the logits (in place), and
    # no thread writes before every thread has passed that barrier.
    var w_t = Scalar[acc](1)
    if has_weight != 0:
        w_t = weights[unsafe_offset=Int(tgt)].cast[acc]()
    var y_t = softcap_of[acc, 1](x[unsafe_offset=Int(tgt)].cast[acc](), f.cap)
    var stats = block_max_sum[acc, T](m, s)
    var row_max = stats[0]
    var row_sum = online_sum_guard[acc](row_max, stats[1])
    if f.eps != 0:
        su = block_sum[acc, T](su)
        suy = block_sum[acc, T](suy)
    if t == 0:
        var value = extended_row_loss[acc](
            row_max, row_sum, y_t, w_t, su, suy, f.eps, z_loss, len
        )
        args.store_loss[reduce](row, value)
    comptime if with_grad:
        var scale = grad_scale[acc, mean](in_global(args.count))
        f.factor = extended_p_factor[acc](
            row_max, row_sum, w_t, su, f.eps, z_loss, len
        )
        var inv_s = 1 / row_sum
        var smooth = f.eps / Scalar[acc](len)
        f.target_term = (1 - f.eps) * w_t
        f.tgt = Int(tgt)
        f.g = CrossEntropyGrad[dtype, False](row_max, inv_s, smooth, scale)
        var g_c = t
        while g_c + (U - 1) * T < len:
            _grad_step[dtype, T, U](y_out, x, g_c, f)
            g_c += U * T
        while g_c < len:
            _grad_step[dtype, T, 1](y_out, x, g_c, f)
            g_c += T


@always_inline
def _gather[
    dtype: DType, acc: DType, W: Int, T: Int
](p: Pointer[Scalar[dtype], MutAnyOrigin], c: Int) -> SIMD[acc, W]:
    """Elements c, c + T, ..., c + (W - 1) T of `p` (a thread's share,
    coalesced across the block), all loaded before any is used."""
    var v = SIMD[acc, W](0)
    comptime for k in range(W):
        v[k] = p[unsafe_offset=c + k * T].cast[acc]()
    return v


@always_inline
def _stats_step[
    dtype: DType, T: Int, W: Int
](
    x: Pointer[Scalar[dtype], MutAnyOrigin],
    c: Int,
    f: _OptionTerms[dtype, T],
    mut m: Scalar[accum_dtype[dtype]()],
    mut s: Scalar[accum_dtype[dtype]()],
    mut su: Scalar[accum_dtype[dtype]()],
    mut suy: Scalar[accum_dtype[dtype]()],
):
    """Fold W of a thread's elements from `c` into its online (max, sum of
    exp) pair and, under label smoothing, its weighted sums."""
    comptime acc = accum_dtype[dtype]()
    var y = f.capped[W](x, c)
    var pair = online_add[acc, W](m, s, y)
    m = pair[0]
    s = pair[1]
    if f.eps != 0:
        var u = f.weights_at[W](c)
        su += u.reduce_add()
        suy += (u * y).reduce_add()


@always_inline
def _grad_step[
    dtype: DType, T: Int, W: Int
](
    y_out: Pointer[Scalar[dtype], MutAnyOrigin],
    x: Pointer[Scalar[dtype], MutAnyOrigin],
    c: Int,
    f: _OptionTerms[dtype, T],
):
    """Write the gradient of W of a thread's elements from `c` (each read
    before it is written: in-place safe)."""
    comptime acc = accum_dtype[dtype]()
    var y = f.capped[W](x, c)
    var g = exp_nan[acc, W](y - f.g.row_max) * f.g.inv_s * f.factor
    if f.eps != 0:
        g -= f.weights_at[W](c) * f.g.smooth
    comptime for k in range(W):
        if c + k * T == f.tgt:
            g[k] = g[k] - f.target_term
    g = g * f.g.scale * softcap_chain[acc, W](y, f.cap)
    comptime for k in range(W):
        y_out[unsafe_offset=c + k * T] = g[k].cast[dtype]()
