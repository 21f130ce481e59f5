"""The cross-entropy's op on chip: `CrossEntropyRow`, the fused
cross-entropy as a `RowOp` of the on-chip strategy (gpu_smem_rows'
`onchip_rows`), a row per block or per cluster of C blocks, read once, the
gradient written once from chip.

`ce_kernel_for` (gpu_cross_entropy) gives it at least SPLIT_BELOW_ROWS
rows: a block a row to `smem_capacity(V)` (~74K fp32, ~148K 16-bit
classes), a cluster of two to `pair_capacity(V)` (gpu_ce_pair_rows).
"""

from max.gpu import MAX_THREADS_PER_BLOCK_METADATA
from max.gpu.host import DeviceContext
from std.sys import size_of
from std.utils import StaticTuple
from std.utils.numerics import inf, nan

from .cross_entropy_math import (
    EXTENDED_OPTIONS,
    IGNORED,
    KEPT,
    extended_p_factor,
    extended_row_loss,
    grad_of,
    row_loss,
    smoothing_of,
    target_grad,
    target_kind,
)
from .gpu_ce_common import (
    ce_options,
    fill_part,
    grad_scale,
    store_row_loss,
    target_owner,
)
from .gpu_launch import HeldRows, aligned_flag_of, held, kernel_arg
from .gpu_reductions import block_sum
from .gpu_smem_rows import (
    REG_CHUNKS,
    SMEM_HALF_THREADS,
    SMEM_THREADS,
    HELD_EXP_SHIFT,
    OnchipLaunch,
    HeldMap,
    cluster_exchange,
    load_part_max,
    onchip_rows,
    sum_exp_held,
    write_held,
)
from .gpu_split_chunks import SharedBuffer
from .row_math import accum_dtype, exp_nan, vector_width
from .row_op import RowOp
from .row_part import RowPart

# 16-bit rows on chip: after sweep 2, `CrossEntropyRow` keeps exp(x - max)
# * 2^HELD_EXP_SHIFT (`held_exp`) in place of each logit, in the logits' own
# type, so the gradient sweep computes no exp (`_holds_exp`). The shift
# keeps float16's full precision down to exp(x - max) = 2^-29 (subnormals
# to 2^-39), below which a float16 gradient is subnormal or 0 anyway; the
# largest value, 2^15, stays under float16's 65504. bfloat16 holds any exp,
# rounded to 8 bits: without label smoothing the gradient, rounded again, is
# within one bfloat16 ulp of the correctly rounded value (~74% equal on
# normal logits), float16 within one float16 ulp; with smoothing, entries
# where p ~ eps / V nearly cancel and keep the held exp's absolute error (up
# to 2^-9 x eps / V x scale in bfloat16), many ulps of a result near 0.


@always_inline
def _holds_exp[dtype: DType]() -> Bool:
    """Whether `CrossEntropyRow` holds exp(x - max) instead of the logits
    after sweep 2: 16-bit rows, where two exps a value (one for the sum,
    one for the gradient) kept the SM busy while HBM idled (78-81% of copy
    against float32's 96%)."""
    return size_of[dtype]() == 2


@always_inline
def smem_row_stats[
    dtype: DType, with_grad: Bool, V: Int, T: Int
](
    x: Pointer[Scalar[dtype], MutAnyOrigin],
    smem: SharedBuffer[dtype],
    p: RowPart,
    mut regs: SIMD[dtype, V * REG_CHUNKS],
    edge: SIMD[accum_dtype[dtype](), 2],
    row_max: Scalar[accum_dtype[dtype]()],
    eps: Scalar[accum_dtype[dtype]()],
) -> Tuple[Scalar[accum_dtype[dtype]()], Scalar[accum_dtype[dtype]()]]:
    """Sweep 2 of `CrossEntropyRow` and its block reductions: the row's sum
    of exp(x - max) and, with label smoothing (`eps` != 0, the same for
    every thread), its sum of x. 16-bit rows hold their exps from here on
    for the gradient (`_holds_exp`; the loss alone needs no second exp).
    """
    comptime acc = accum_dtype[dtype]()
    comptime if with_grad and _holds_exp[dtype]():
        # The sum of x only with smoothing: two loops, not a select a value.
        var part = (Scalar[acc](0), Scalar[acc](0))
        if eps != 0:
            part = sum_exp_held[dtype, V, T, True, True](
                x, smem, p, regs, edge, row_max
            )
        else:
            part = sum_exp_held[dtype, V, T, True, False](
                x, smem, p, regs, edge, row_max
            )
        var row_sum = block_sum[acc, T](part[0]) * Scalar[acc](
            2.0**-HELD_EXP_SHIFT
        )
        var sum_x = block_sum[acc, T](part[1]) if eps != 0 else Scalar[acc](0)
        return (row_sum, sum_x)
    var part = sum_exp_held[dtype, V, T, False, True](
        x, smem, p, regs, edge, row_max
    )
    var row_sum = block_sum[acc, T](part[0])
    var sum_x = block_sum[acc, T](part[1]) if eps != 0 else Scalar[acc](0)
    return (row_sum, sum_x)


struct CrossEntropyGrad[dtype_: DType, holds_exp: Bool](HeldMap):
    """The gradient of held logits, (exp(x - max) / sum - eps / V) *
    scale; with `holds_exp`, the held body values are `held_exp`s already
    and each takes one FMA."""

    comptime dtype = Self.dtype_

    var row_max: Scalar[accum_dtype[Self.dtype_]()]
    """The row's max."""
    var inv_s: Scalar[accum_dtype[Self.dtype_]()]
    """1 / the row's sum of exp(x - max)."""
    var smooth: Scalar[accum_dtype[Self.dtype_]()]
    """eps / V (`smoothing_of`)."""
    var scale: Scalar[accum_dtype[Self.dtype_]()]
    """The gradient's scale (`grad_scale`)."""
    var per_held: Scalar[accum_dtype[Self.dtype_]()]
    """scale / sum / 2^HELD_EXP_SHIFT: a held exp's factor."""
    var shift: Scalar[accum_dtype[Self.dtype_]()]
    """-eps / V * scale."""

    @always_inline
    def __init__(
        out self,
        row_max: Scalar[accum_dtype[Self.dtype_]()],
        inv_s: Scalar[accum_dtype[Self.dtype_]()],
        smooth: Scalar[accum_dtype[Self.dtype_]()],
        scale: Scalar[accum_dtype[Self.dtype_]()],
    ):
        """The map of a row with these terms."""
        comptime acc = accum_dtype[Self.dtype_]()
        self.row_max = row_max
        self.inv_s = inv_s
        self.smooth = smooth
        self.scale = scale
        self.per_held = 0
        self.shift = 0
        comptime if Self.holds_exp:
            self.per_held = inv_s * Scalar[acc](2.0**-HELD_EXP_SHIFT) * scale
            self.shift = -smooth * scale

    @always_inline
    def body[w: Int](self, v: SIMD[Self.dtype, w]) -> SIMD[Self.dtype, w]:
        """The gradient of held body values."""
        comptime if Self.holds_exp:
            return (
                v.cast[accum_dtype[Self.dtype]()]()
                .fma(self.per_held, self.shift)
                .cast[Self.dtype]()
            )
        return self.edge[w](v.cast[accum_dtype[Self.dtype]()]())

    @always_inline
    def edge[
        w: Int
    ](self, v: SIMD[accum_dtype[Self.dtype](), w]) -> SIMD[Self.dtype, w]:
        """The gradient of logits in the accumulator type."""
        comptime acc = accum_dtype[Self.dtype]()
        return grad_of[acc, w](
            exp_nan[acc, w](v - self.row_max),
            self.inv_s,
            self.smooth,
            self.scale,
        ).cast[Self.dtype]()


# A row's accumulators for a cluster's exchanges: the parts' max, then
# their sums, each in a 128-byte line of its own (float64: two).
comptime CE_CLUSTER_SLOTS = 64

# The scalar terms `CrossEntropyRow` may take from extended options without
# a softcap or weighted smoothing (`ExtendedLayout.scalar_terms`): none
# (the plain loss), z-loss, or z-loss and the target's class weight.
comptime NO_TERMS = 0
comptime Z_TERMS = 1
comptime WEIGHTED_TERMS = 2


struct CrossEntropyRow[
    dtype_: DType,
    with_grad: Bool,
    mean: Bool,
    reduce: Bool,
    V: Int,
    T: Int,
    terms: Int = NO_TERMS,
](RowOp):
    """Fused cross-entropy of `logits` rows against class `targets` as a
    `RowOp`: it folds the row's max, then the sums of exp(x - max) and
    (label smoothing) of x, and the target logit; writes the row's loss
    (`row_losses` with `reduce`, else `loss`) and, `with_grad`, dlogits
    (`mean`: scaled by 1 / `count`). A cluster's parts exchange their max
    first, then sum around the row's (`cluster_exchange`).

    `terms` (Z_TERMS, WEIGHTED_TERMS) reads extended options whose only
    terms are a row's scalars: z-loss adds z lse^2 to the loss and 2 z lse
    to what multiplies p in the gradient; the target's class weight w_t
    scales its row (`extended_row_loss`, `extended_p_factor`, with the
    smoothing term unweighted). The sweeps are the plain loss's.

    16-bit rows keep exp(x - max) * 2^HELD_EXP_SHIFT on chip in place of
    the logits after the sums (`_holds_exp`: computing exp twice kept the
    SM busy while HBM idled), so the gradient sweep computes no exp."""

    comptime dtype = Self.dtype_
    comptime width = Self.V
    comptime threads = Self.T
    comptime cluster_slots = CE_CLUSTER_SLOTS

    var dlogits: HeldRows[Self.dtype]
    """Gradient rows (`with_grad`)."""
    var logits: HeldRows[Self.dtype]
    """Logit rows."""
    var targets: Pointer[Int64, MutUntrackedOrigin]
    """A target class a row."""
    var options: Pointer[Float64, MutUntrackedOrigin]
    """(ignore_index, label smoothing) (`ce_options`)."""
    var count: Pointer[Float64, MutUntrackedOrigin]
    """Rows kept, for "mean"."""
    var row_losses: Pointer[
        Scalar[accum_dtype[Self.dtype_]()], MutUntrackedOrigin
    ]
    """Per-row losses in the accumulator type (`reduce`)."""
    var loss: HeldRows[Self.dtype]
    """Per-row losses (not `reduce`)."""
    var x: HeldRows[Self.dtype]
    """The row's logits."""
    var start: Int
    """Element of the tensors where the block's part starts."""
    var first: Int
    """Element of the row where the block's part starts."""
    var len_row: Int
    """Classes a row."""
    var tgt: Int64
    """The row's target."""
    var kind: Int
    """`target_kind` of the row's target."""
    var eps: Scalar[accum_dtype[Self.dtype_]()]
    """Label smoothing."""
    var x_t: Scalar[accum_dtype[Self.dtype_]()]
    """The target logit."""
    var z_loss: Scalar[accum_dtype[Self.dtype_]()]
    """The z-loss weight (`terms`)."""
    var w_t: Scalar[accum_dtype[Self.dtype_]()]
    """The target's class weight (WEIGHTED_TERMS; else 1)."""
    var row_max: Scalar[accum_dtype[Self.dtype_]()]
    """The row's max."""
    var inv_s: Scalar[accum_dtype[Self.dtype_]()]
    """1 / the row's sum of exp(x - max) (with `terms`, times what
    multiplies p in the gradient)."""
    var value: Scalar[accum_dtype[Self.dtype_]()]
    """The row's loss."""
    var regs: SIMD[Self.dtype, Self.V * REG_CHUNKS]
    """The thread's first `REG_CHUNKS` vectors of the part."""
    var edge: SIMD[accum_dtype[Self.dtype_](), 2]
    """The thread's head and tail elements (-inf where it has none)."""

    @always_inline
    def __init__(
        out self,
        dlogits: Pointer[Scalar[Self.dtype], MutAnyOrigin],
        logits: Pointer[Scalar[Self.dtype], MutAnyOrigin],
        targets: Pointer[Int64, MutAnyOrigin],
        options: Pointer[Float64, MutAnyOrigin],
        count: Pointer[Float64, MutAnyOrigin],
        row_losses: Pointer[Scalar[accum_dtype[Self.dtype]()], MutAnyOrigin],
        loss: Pointer[Scalar[Self.dtype], MutAnyOrigin],
    ):
        """The op on these tensors."""
        comptime acc = accum_dtype[Self.dtype]()
        self.dlogits = held(dlogits)
        self.logits = held(logits)
        self.targets = rebind[Pointer[Int64, MutUntrackedOrigin]](targets)
        self.options = rebind[Pointer[Float64, MutUntrackedOrigin]](options)
        self.count = rebind[Pointer[Float64, MutUntrackedOrigin]](count)
        self.row_losses = rebind[Pointer[Scalar[acc], MutUntrackedOrigin]](
            row_losses
        )
        self.loss = held(loss)
        self.x = self.logits
        self.start = 0
        self.first = 0
        self.len_row = 0
        self.tgt = 0
        self.kind = 0
        self.eps = 0
        self.x_t = 0
        self.z_loss = 0
        self.w_t = 1
        self.row_max = 0
        self.inv_s = 0
        self.value = 0
        self.regs = SIMD[Self.dtype, Self.V * REG_CHUNKS](0)
        self.edge = SIMD[acc, 2](-inf[acc]())

    @always_inline
    def begin(
        mut self, p: RowPart, row: Int, start: Int, first: Int, len_row: Int
    ) -> Bool:
        """Read the row's target: only a kept row is folded (a row not kept
        loads nothing)."""
        comptime acc = accum_dtype[Self.dtype]()
        self.start = start
        self.first = first
        self.len_row = len_row
        self.x = self.logits.unsafe_offset(start - first)
        var options = rebind[Pointer[Float64, MutAnyOrigin]](self.options)
        var opts = ce_options[acc](options)
        self.eps = opts[1]
        self.tgt = self.targets[unsafe_offset=row]
        self.kind = target_kind(self.tgt, opts[0], len_row)
        if self.kind != KEPT and self.kind != IGNORED:
            self.value = nan[acc]()
        comptime if Self.terms != NO_TERMS:
            self.z_loss = options[unsafe_offset=2].cast[acc]()
            comptime if Self.terms == WEIGHTED_TERMS:
                if self.kind == KEPT:
                    self.w_t = options[
                        unsafe_offset=EXTENDED_OPTIONS + Int(self.tgt)
                    ].cast[acc]()
        return self.kind == KEPT

    @always_inline
    def fold[
        C: Int
    ](
        mut self,
        p: RowPart,
        smem: SharedBuffer[Self.dtype],
        slots: Pointer[Scalar[accum_dtype[Self.dtype]()], MutAnyOrigin],
        rank: Int,
    ):
        """Sweep 1 loads the part and its max; sweep 2 sums exp(x - max)
        and x (label smoothing) over the on-chip copy (`smem_row_stats`);
        then the row's loss."""
        comptime acc = accum_dtype[Self.dtype]()
        comptime assert acc.is_floating_point()
        var x = kernel_arg(self.x)
        self.x_t = x[unsafe_offset=Int(self.tgt)].cast[acc]()
        var xp = x.unsafe_offset(self.first)
        self.row_max = load_part_max[Self.dtype, Self.V, Self.T](
            xp, smem, p, self.regs, self.edge
        )
        comptime if C > 1:
            self.row_max = cluster_exchange[acc, C](
                slots, rank, p.t, self.row_max, 0
            )[0].reduce_max()
        var sums = smem_row_stats[Self.dtype, Self.with_grad, Self.V, Self.T](
            xp, smem, p, self.regs, self.edge, self.row_max, self.eps
        )
        comptime if C > 1:
            var both = cluster_exchange[acc, C](
                slots.unsafe_offset(CE_CLUSTER_SLOTS // 2),
                rank,
                p.t,
                sums[0],
                sums[1],
            )
            sums = (both[0].reduce_add(), both[1].reduce_add())
        comptime if Self.terms == NO_TERMS:
            self.value = row_loss[acc](
                self.row_max, sums[0], self.x_t, sums[1], self.eps, self.len_row
            )
            self.inv_s = 1 / sums[0]
        else:
            # Unweighted smoothing: the sum of the weights is V.
            var su = Scalar[acc](self.len_row)
            self.value = extended_row_loss[acc](
                self.row_max,
                sums[0],
                self.x_t,
                self.w_t,
                su,
                sums[1],
                self.eps,
                self.z_loss,
                self.len_row,
            )
            self.inv_s = (
                extended_p_factor[acc](
                    self.row_max,
                    sums[0],
                    self.w_t,
                    su,
                    self.eps,
                    self.z_loss,
                    self.len_row,
                )
                / sums[0]
            )

    @always_inline
    def finish(self, p: RowPart, row: Int, rank: Int):
        """The row's loss, by thread 0 of rank 0."""
        if p.t == 0 and rank == 0:
            store_row_loss[Self.dtype, Self.reduce](
                kernel_arg(self.row_losses),
                kernel_arg(self.loss),
                row,
                self.value,
            )

    @always_inline
    def write[C: Int](mut self, p: RowPart, smem: SharedBuffer[Self.dtype]):
        """Sweep 3 (`with_grad`): the part's gradient from chip, then the
        target's entry by the thread that wrote it (its store came first in
        program order); a row not kept is filled (0 ignored, NaN for a bad
        target)."""
        comptime acc = accum_dtype[Self.dtype]()
        comptime if not Self.with_grad:
            return
        var y = kernel_arg(self.dlogits).unsafe_offset(self.start)
        if self.kind != KEPT:
            var fill = (
                Scalar[Self.dtype](0) if self.kind
                == IGNORED else nan[Self.dtype]()
            )
            fill_part[Self.dtype, Self.V, Self.T](y, p, fill)
            return
        var scale = grad_scale[acc, Self.mean](
            rebind[Pointer[Float64, MutAnyOrigin]](self.count)
        )
        var smooth = smoothing_of[acc](self.eps, self.len_row)
        write_held[
            Self.V,
            Self.T,
            CrossEntropyGrad[Self.dtype, _holds_exp[Self.dtype]()],
        ](
            y,
            kernel_arg(self.x).unsafe_offset(self.first),
            smem,
            p,
            self.regs,
            self.edge,
            CrossEntropyGrad[Self.dtype, _holds_exp[Self.dtype]()](
                self.row_max, self.inv_s, smooth, scale
            ),
        )
        # The target relative to the part: with C > 1 it may lie outside.
        var tgt = Int(self.tgt) - self.first
        comptime if C > 1:
            if tgt < 0 or tgt >= p.len:
                return
        if p.t == target_owner[Self.V, Self.T](tgt, p.head, p.tail_begin):
            var p_t = exp_nan[acc, 1](self.x_t - self.row_max) * self.inv_s
            comptime if Self.terms == NO_TERMS:
                y[unsafe_offset=tgt] = target_grad[acc](
                    p_t, smooth, self.eps, scale
                ).cast[Self.dtype]()
            else:
                # p_t carries the terms' factor (in inv_s); the target
                # loses (1 - eps) w_t.
                y[unsafe_offset=tgt] = (
                    (p_t - smooth - (1 - self.eps) * self.w_t) * scale
                ).cast[Self.dtype]()


@__llvm_metadata(
    MAX_THREADS_PER_BLOCK_METADATA=StaticTuple[Int32, 1](Int32(T)),
    `nvvm.minctasm`=SIMDLength(2 if T == SMEM_HALF_THREADS else 1),
)
def ce_smem_kernel[
    dtype: DType,
    with_grad: Bool,
    mean: Bool,
    reduce: Bool,
    V: Int,
    T: Int,
    C: Int,
    terms: Int = NO_TERMS,
](
    dlogits: Pointer[Scalar[dtype], MutAnyOrigin],
    logits: Pointer[Scalar[dtype], MutAnyOrigin],
    targets: Pointer[Int64, MutAnyOrigin],
    options: Pointer[Float64, MutAnyOrigin],
    count: Pointer[Float64, MutAnyOrigin],
    row_losses: Pointer[Scalar[accum_dtype[dtype]()], MutAnyOrigin],
    loss: Pointer[Scalar[dtype], MutAnyOrigin],
    partials: Pointer[Scalar[accum_dtype[dtype]()], MutAnyOrigin],
    n: Int64,
    aligned_flag: Int32,
):
    """Cross-entropy of rows of `n` classes (to `smem_capacity(V)` for
    C = 1, `cluster_capacity(V, 1, C)` for C > 1) held on chip, read once:
    `onchip_rows` of `CrossEntropyRow`, a row per cluster of C blocks of
    `T` threads. Arguments as `ce_block_kernel`; `partials`:
    `CE_CLUSTER_SLOTS` a row (C > 1); `terms`: `CrossEntropyRow`'s."""
    var op = CrossEntropyRow[dtype, with_grad, mean, reduce, V, T, terms](
        dlogits, logits, targets, options, count, row_losses, loss
    )
    onchip_rows[C=C](op, partials, n, aligned_flag)


def launch_ce_parts[
    dtype: DType,
    with_grad: Bool,
    mean: Bool,
    reduce: Bool,
    C: Int,
    terms: Int = NO_TERMS,
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
    """Launch `ce_smem_kernel` on `rows` rows of `n`, C blocks a row, each
    with the shared memory its part needs, and
    `CE_CLUSTER_SLOTS` partials a row for C > 1 (`OnchipLaunch`); `terms`:
    `CrossEntropyRow`'s (extended options of scalar terms). Raises past the
    capacity."""
    comptime V = vector_width[dtype]()
    var launch = OnchipLaunch[dtype, C](
        ctx,
        "the cross-entropy on-chip kernel",
        rows,
        n,
        1,
        CE_CLUSTER_SLOTS,
        "classes",
    )
    comptime for T in [SMEM_HALF_THREADS, SMEM_THREADS]:
        if launch.threads == T:
            launch.enqueue[
                ce_smem_kernel[dtype, with_grad, mean, reduce, V, T, C, terms],
                T,
            ](
                ctx,
                dlogits,
                logits,
                targets,
                options,
                count,
                row_losses,
                loss,
                launch.partials.ptr(row_losses),
                Int64(n),
                aligned_flag_of(aligned),
            )


# `launch_ce_parts` with a block a row (to `smem_capacity(V)`).
comptime launch_ce_smem[
    dtype: DType, with_grad: Bool, mean: Bool, reduce: Bool
] = launch_ce_parts[dtype, with_grad, mean, reduce, 1]
