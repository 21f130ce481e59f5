"""Cross-entropy rows of any length: `ce_block_kernel`, a block per row:
an online (max, sum) pass, then, with the gradient, a pass that re-reads
the row (mostly from L2) to write it. Loss-only reads the row once.

The plain rows run on the block strategy (`block_rows`, gpu_block_rows,
its ROW_PARTS walk: a row by address as a scalar head, an aligned vector
body and a scalar tail) over `CEBlockRow`, whose statistics pass
(`share_stats`, gpu_ce_block_strategy, shared with the sharded
statistics) keeps U loads a thread in flight.

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
from .gpu_block_rows import ROW_PARTS, block_rows
from .gpu_ce_block_strategy import combine_stats, share_stats
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
from .row_op import BlockRowOp
from .row_part import BlockRow, RowPart

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
    the block strategy (`block_rows`, gpu_block_rows, its ROW_PARTS walk)
    over `CEBlockRow`. Arguments as `ce_register_kernel`; `flag` is
    nonzero when the buffers start 16-byte aligned (each row then has a
    scalar head, an aligned vector body and a scalar tail, as in
    gpu_smem_rows).

    OPTION_TERMS: the extended options' row (`_options_row`), U elements a
    thread at a time, `flag` nonzero where `options` holds a weight a
    class."""
    comptime if terms == OPTION_TERMS:
        _options_row[dtype, with_grad, mean, reduce, T, U](args, n, flag)
        return
    var op = CEBlockRow[dtype, with_grad, mean, reduce, V, T, U](args)
    block_rows[walk=ROW_PARTS](op, n, flag)


struct CEBlockRow[
    dtype: DType,
    with_grad: Bool,
    mean: Bool,
    reduce: Bool,
    V_: Int,
    T_: Int,
    U: Int,
](BlockRowOp):
    """Class-index cross-entropy of a row as a `BlockRowOp` (ROW_PARTS
    walk): a kept row's target logit and the thread's online (max, sum of
    exp) over its `RowPart`, U vectors a thread at a time (`share_stats`);
    the row's loss (`combine`), stored by thread 0 (`store_row`); then,
    with the gradient, d loss / d logits from a second read, the target's
    entry by the thread that wrote it (`finish`).

    The row's kind (kept, ignored, out of range) is the same for the whole
    block, so the reductions under `kind == KEPT` are reached by every
    thread or by none."""

    comptime threads = Self.T_
    comptime width = Self.V_
    comptime acc = accum_dtype[Self.dtype]()

    var args: CEArgs[Self.dtype]
    """The kernel's tensors, options and sizes, as it took them."""
    var r: BlockRow
    """The block's row, this thread, the row's length and where it starts
    (`begin`)."""
    var y: HeldRows[Self.dtype]
    """The row's gradient (`store_row`, with the gradient)."""
    var tgt: Int64
    """The row's target."""
    var kind: Int
    """KEPT, IGNORED or OUT_OF_RANGE (`target_kind`), the same on every
    thread of the block."""
    var eps: Scalar[Self.acc]
    """Label smoothing (the same on every thread: the plain sum's
    reduction is reached by all or none)."""
    var scale: Scalar[Self.acc]
    """The gradient's scale (`grad_scale`)."""
    var smooth: Scalar[Self.acc]
    """eps / V (`smoothing_of`)."""
    var part: Tuple[Scalar[Self.acc], Scalar[Self.acc], Scalar[Self.acc]]
    """The thread's (max, sum of exp, sum of x) (a kept row)."""
    var value: Scalar[Self.acc]
    """The row's loss (`combine`)."""
    var row_max: Scalar[Self.acc]
    """The row's max (a kept row; else 0)."""
    var inv_s: Scalar[Self.acc]
    """1 / the row's sum of exp(x - max) (a kept row; else 0)."""
    var x_t: Scalar[Self.acc]
    """The target's logit (a kept row)."""
    var g: CrossEntropyGrad[Self.dtype, False]
    """The row's gradient map (`store_row`)."""
    var fill: Scalar[Self.dtype]
    """The gradient of a row not kept: 0 ignored, NaN out of range."""

    @always_inline
    def __init__(out self, args: CEArgs[Self.dtype]):
        """The op on the kernel's arguments; nothing is read yet."""
        comptime assert Self.acc.is_floating_point()
        self.args = args
        self.r = BlockRow(0, 0, 0, 0)
        self.y = held(in_global(args.dlogits))
        self.tgt = 0
        self.kind = IGNORED
        self.eps = 0
        self.scale = 0
        self.smooth = 0
        self.part = (
            Scalar[Self.acc](0),
            Scalar[Self.acc](0),
            Scalar[Self.acc](0),
        )
        self.value = 0
        self.row_max = 0
        self.inv_s = 0
        self.x_t = 0
        self.g = CrossEntropyGrad[Self.dtype, False](0, 0, 0, 0)
        self.fill = 0

    @always_inline
    def _x(self) -> Pointer[Scalar[Self.dtype], MutAnyOrigin]:
        """The row's logits."""
        return in_global(self.args.logits).unsafe_offset(self.r.start)

    @always_inline
    def begin(mut self, row: Int, len: Int) -> Int:
        """The row, its target and options; every element is folded."""
        self.r = BlockRow(Int(thread_idx.x), row, len, row * len)
        var opts = ce_options[Self.acc](in_global(self.args.options))
        self.eps = opts[1]
        self.tgt = in_global(self.args.targets)[unsafe_offset=row]
        self.kind = target_kind(self.tgt, opts[0], len)
        self.scale = grad_scale[Self.acc, Self.mean](in_global(self.args.count))
        self.smooth = smoothing_of[Self.acc](self.eps, len)
        return len

    @always_inline
    def fold_vector(mut self, e: Int):
        """Not reached: `fold_part` folds the whole share."""
        pass

    @always_inline
    def fold_element(mut self, e: Int):
        """Not reached: `fold_part` folds the whole share."""
        pass

    @always_inline
    def folds(self) -> Bool:
        """A kept row (the whole block's: the reductions under it are
        reached by every thread or by none)."""
        return self.kind == KEPT

    @always_inline
    def fold_part(mut self, p: RowPart):
        """The target's logit, then the thread's statistics (`share_stats`,
        U loads in flight; eps is the same for every thread, so the
        block's reductions stay uniform)."""
        # The target's logit first: loaded after the block reduction (past
        # its barriers, which no load is moved over) it would be one more
        # round trip at the end of each row.
        var x = self._x()
        self.x_t = x[unsafe_offset=Int(self.tgt)].cast[Self.acc]()
        self.part = share_stats[Self.dtype, Self.V_, Self.T_, Self.U, True](
            x, p, self.eps != 0
        )

    @always_inline
    def combine(mut self):
        """A kept row's statistics, loss and 1 / sum; else its loss
        without them (0 ignored, NaN out of range)."""
        if self.kind == KEPT:
            var stats = combine_stats[Self.acc, Self.T_, True](
                self.part, self.eps != 0
            )
            self.row_max = stats[0]
            var row_sum = stats[1]
            self.value = row_loss[Self.acc](
                self.row_max, row_sum, self.x_t, stats[2], self.eps, self.r.len
            )
            self.inv_s = 1 / row_sum
        elif self.kind != IGNORED:
            self.value = nan[Self.acc]()

    @always_inline
    def store_row(mut self):
        """The row's loss, by thread 0; with the gradient, its map and the
        fill of a row not kept (0 ignored, NaN out of range)."""
        if self.r.t == 0:
            self.args.store_loss[Self.reduce](self.r.row, self.value)
        comptime if Self.with_grad:
            self.y = held(
                in_global(self.args.dlogits).unsafe_offset(self.r.start)
            )
            self.g = CrossEntropyGrad[Self.dtype, False](
                self.row_max, self.inv_s, self.smooth, self.scale
            )
            self.fill = (
                Scalar[Self.dtype](0) if self.kind
                == IGNORED else nan[Self.dtype]()
            )

    @always_inline
    def write_vector(self, e: Int):
        """The aligned vector's gradient (`with_grad`; without it nothing
        is written and the pass compiles to nothing)."""
        comptime if Self.with_grad:
            var out = SIMD[Self.dtype, Self.V_](self.fill)
            if self.kind == KEPT:
                out = self.g.edge[Self.V_](
                    self._x()
                    .unsafe_offset(e)
                    .unsafe_load[width=Self.V_, alignment=16]()
                    .cast[Self.acc]()
                )
            kernel_arg(self.y).unsafe_offset(e).unsafe_store[alignment=16](out)

    @always_inline
    def write_element(self, e: Int):
        """The head's or tail's element's gradient (`with_grad`)."""
        comptime if Self.with_grad:
            var out = self.fill
            if self.kind == KEPT:
                out = self.g.edge[1](
                    self._x()[unsafe_offset=e].cast[Self.acc]()
                )[0]
            kernel_arg(self.y)[unsafe_offset=e] = out

    @always_inline
    def finish(self, p: RowPart):
        """The target's entry, by the thread that wrote it (its vector or
        element store came first in program order)."""
        comptime if Self.with_grad:
            if self.kind == KEPT:
                var tgt = Int(self.tgt)
                if p.t == target_owner[Self.V_, Self.T_](
                    tgt, p.head, p.tail_begin
                ):
                    kernel_arg(self.y)[unsafe_offset=tgt] = target_grad[
                        Self.acc
                    ](
                        exp_nan[Self.acc, 1](self.x_t - self.row_max)
                        * self.inv_s,
                        self.smooth,
                        self.eps,
                        self.scale,
                    ).cast[
                        Self.dtype
                    ]()


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
    `loss`, and `with_grad` its gradient from a second read.

    Not an op on `block_rows`: both passes, the fold and the gradient,
    load U elements a thread before using them (`_gather`), and the
    strategy's write loops take one vector or element at a time, so on it
    the op would own every loop."""
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
