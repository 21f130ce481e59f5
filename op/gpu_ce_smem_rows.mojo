"""The cross-entropy's op on chip: `CrossEntropyRow`, the fused
cross-entropy as a `RowOp` of the on-chip strategy (gpu_smem_rows'
`onchip_rows`), a row per block or per cluster of C blocks, read once, the
gradient written once from chip; its compile-time `terms` say what a row
folds and writes beside the plain loss (z-loss, the target's class weight,
or every extended option: a softcap and weighted smoothing).

`ce_kernel_for` (gpu_cross_entropy) gives it at least SPLIT_BELOW_ROWS
rows: a block a row to `smem_capacity(V)` (~74K fp32, ~148K 16-bit
classes), a cluster of two to `pair_capacity(V)` (gpu_ce_pair_rows); the
extended options (`launch_cross_entropy` with `n_options`) give it rows
with a gradient to a pair's capacity.
"""

from max.gpu import MAX_THREADS_PER_BLOCK_METADATA
from max.gpu.host import DeviceContext
from std.utils import StaticTuple
from std.utils.numerics import inf, nan

from .cross_entropy_math import (
    EXTENDED_OPTIONS,
    IGNORED,
    KEPT,
    NO_TERMS,
    OPTION_TERMS,
    WEIGHTED_TERMS,
    Z_TERMS,
    extended_p_factor,
    extended_row_loss,
    row_loss,
    smoothing_of,
    softcap_of,
    target_grad,
    target_kind,
)
from .gpu_ce_common import (
    CEArgs,
    CELaunchRows,
    CrossEntropyGrad,
    ce_options,
    fill_part,
    grad_scale,
    holds_exp,
    store_row_loss,
    target_owner,
)
from .gpu_ce_options_smem_rows import (
    SOFTCAP_AS_MAX,
    ClassWeights,
    OptionGrad,
    OptionSums,
    Softcap,
    hold_capped_exp,
    visit_held,
    write_capped_held,
)
from .gpu_launch import HeldRows, aligned_flag_of, held, in_global, kernel_arg
from .gpu_reductions import block_sum
from .gpu_smem_rows import (
    REG_CHUNKS,
    SMEM_HALF_THREADS,
    SMEM_THREADS,
    HELD_EXP_SHIFT,
    OnchipLaunch,
    cluster_exchange,
    load_part_max,
    onchip_rows,
    smem_min_blocks,
    sum_exp_held,
    write_held,
)
from .gpu_split_chunks import SharedBuffer
from .row_math import accum_dtype, exp_nan, vector_width
from .row_op import OnchipBlock, RowOp
from .row_part import RowPart


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
    for the gradient (`holds_exp`; the loss alone needs no second exp).
    """
    comptime acc = accum_dtype[dtype]()
    comptime if with_grad and holds_exp[dtype]():
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


# A row's accumulators for a cluster's exchanges, each in a 128-byte line of
# its own (float64: two): the parts' max, then their sums; under
# OPTION_TERMS, the max, the sums of exp and of the capped logits, and the
# weight sums.
comptime CE_CLUSTER_SLOTS = 64
comptime CE_OPTIONS_CLUSTER_SLOTS = 128


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

    OPTION_TERMS (with the gradient) reads every extended option (a weight
    a class where `has_weight`): the raw row's max, capped after; the sums
    of exp(y - max) and, with label smoothing, of u and u * y over the
    capped logits y (u: the class weights, else 1); the gradient divided by
    the weighted count for `mean`.

    16-bit rows keep exp(x - max) * 2^HELD_EXP_SHIFT on chip in place of
    the logits after the sums (`holds_exp`: computing exp twice kept the
    SM busy while HBM idled), so the gradient sweep computes no exp; under
    a softcap without smoothing every row holds its exps (times the chain
    factor, `hold_capped_exp`)."""

    comptime dtype = Self.dtype_
    comptime width = Self.V
    comptime threads = Self.T
    comptime cluster_slots = (
        CE_OPTIONS_CLUSTER_SLOTS if Self.terms
        == OPTION_TERMS else CE_CLUSTER_SLOTS
    )

    var dlogits: HeldRows[Self.dtype]
    """Gradient rows (`with_grad`)."""
    var logits: HeldRows[Self.dtype]
    """Logit rows."""
    var targets: Pointer[Int64, MutUntrackedOrigin]
    """A target class a row."""
    var options: Pointer[Float64, MutUntrackedOrigin]
    """(ignore_index, label smoothing) (`ce_options`), then with `terms`
    the extended options and their class weights."""
    var count: Pointer[Float64, MutUntrackedOrigin]
    """The (weighted) count of kept rows, for "mean"."""
    var row_losses: Pointer[
        Scalar[accum_dtype[Self.dtype_]()], MutUntrackedOrigin
    ]
    """Per-row losses in the accumulator type (`reduce`)."""
    var loss: HeldRows[Self.dtype]
    """Per-row losses (not `reduce`)."""
    var has_weight: Bool
    """`options` holds a weight a class (OPTION_TERMS)."""
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
    """The target logit (capped under a softcap)."""
    var z_loss: Scalar[accum_dtype[Self.dtype_]()]
    """The z-loss weight (`terms`)."""
    var cap: Scalar[accum_dtype[Self.dtype_]()]
    """The softcap (OPTION_TERMS; 0: none)."""
    var w_t: Scalar[accum_dtype[Self.dtype_]()]
    """The target's class weight (with weights; else 1)."""
    var holds: Bool
    """OPTION_TERMS with a softcap and no label smoothing: sweep 2 leaves
    each value's h on chip (`hold_capped_exp`)."""
    var cap_as_max: Bool
    """`holds`, and the cap stands in for the row's max: sweeps 1 and 2 in
    one (`SOFTCAP_AS_MAX`)."""
    var row_max: Scalar[accum_dtype[Self.dtype_]()]
    """The row's (capped) max."""
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
    def __init__(out self, args: CEArgs[Self.dtype], has_weight: Int32 = 0):
        """The op on the kernel's tensors (each taken out of `args` with
        `in_global`)."""
        comptime acc = accum_dtype[Self.dtype]()
        self.dlogits = held(in_global(args.dlogits))
        self.logits = held(in_global(args.logits))
        self.targets = held(in_global(args.targets))
        self.options = held(in_global(args.options))
        self.count = held(in_global(args.count))
        self.row_losses = held(in_global(args.row_losses))
        self.loss = held(in_global(args.loss))
        self.has_weight = has_weight != 0
        self.x = self.logits
        self.start = 0
        self.first = 0
        self.len_row = 0
        self.tgt = 0
        self.kind = 0
        self.eps = 0
        self.x_t = 0
        self.z_loss = 0
        self.cap = 0
        self.w_t = 1
        self.holds = False
        self.cap_as_max = False
        self.row_max = 0
        self.inv_s = 0
        self.value = 0
        self.regs = SIMD[Self.dtype, Self.V * REG_CHUNKS](0)
        self.edge = SIMD[acc, 2](-inf[acc]())

    @always_inline
    def _options(self) -> Pointer[Float64, MutAnyOrigin]:
        """The options as the kernels take them."""
        return rebind[Pointer[Float64, MutAnyOrigin]](self.options)

    @always_inline
    def _weights(self) -> Pointer[Float64, MutAnyOrigin]:
        """The class weights of the block's part (element 0's first)."""
        return self._options().unsafe_offset(EXTENDED_OPTIONS + self.first)

    @always_inline
    def begin(
        mut self, p: RowPart, row: Int, start: Int, first: Int, len_row: Int
    ) -> Bool:
        """Read the options and the row's target: only a kept row is folded
        (a row not kept loads nothing)."""
        comptime acc = accum_dtype[Self.dtype]()
        var options = self._options()
        self.start = start
        self.first = first
        self.len_row = len_row
        comptime if Self.terms == OPTION_TERMS:
            self.eps = options[unsafe_offset=1].cast[acc]()
            self.z_loss = options[unsafe_offset=2].cast[acc]()
            self.cap = options[unsafe_offset=3].cast[acc]()
            self.holds = self.eps == 0 and self.cap != 0
            comptime if (
                Self.dtype == DType.float32 or Self.dtype == DType.bfloat16
            ):
                self.cap_as_max = (
                    self.holds
                    and self.cap > 0
                    and self.cap <= Scalar[acc](SOFTCAP_AS_MAX)
                )
            self.tgt = self.targets[unsafe_offset=row]
            self.kind = target_kind(
                self.tgt, Int64(options[unsafe_offset=0]), len_row
            )
        else:
            self.x = self.logits.unsafe_offset(start - first)
            var opts = ce_options[acc](options)
            self.eps = opts[1]
            self.tgt = self.targets[unsafe_offset=row]
            self.kind = target_kind(self.tgt, opts[0], len_row)
        if self.kind != KEPT and self.kind != IGNORED:
            self.value = nan[acc]()
        comptime if Self.terms == Z_TERMS or Self.terms == WEIGHTED_TERMS:
            self.z_loss = options[unsafe_offset=2].cast[acc]()
            comptime if Self.terms == WEIGHTED_TERMS:
                if self.kind == KEPT:
                    self.w_t = options[
                        unsafe_offset=EXTENDED_OPTIONS + Int(self.tgt)
                    ].cast[acc]()
        return self.kind == KEPT

    @always_inline
    def _cluster_max[
        C: Int
    ](
        self,
        slots: Pointer[Scalar[accum_dtype[Self.dtype]()], MutAnyOrigin],
        rank: Int,
        t: Int,
        part_max: Scalar[accum_dtype[Self.dtype]()],
    ) -> Scalar[accum_dtype[Self.dtype]()]:
        """The row's max from its parts' (C > 1), in the first slots."""
        comptime if C > 1:
            return cluster_exchange[accum_dtype[Self.dtype](), C](
                slots, rank, t, part_max, 0
            )[0].reduce_max()
        return part_max

    @always_inline
    def _close_extended(
        mut self,
        s: Scalar[accum_dtype[Self.dtype]()],
        su: Scalar[accum_dtype[Self.dtype]()],
        suy: Scalar[accum_dtype[Self.dtype]()],
    ):
        """The row's loss and the gradient's factor (over the sum `s`)
        under extended options, from the row's sums (`su`, `suy`: only
        read with label smoothing)."""
        comptime acc = accum_dtype[Self.dtype]()
        self.value = extended_row_loss[acc](
            self.row_max,
            s,
            self.x_t,
            self.w_t,
            su,
            suy,
            self.eps,
            self.z_loss,
            self.len_row,
        )
        self.inv_s = (
            extended_p_factor[acc](
                self.row_max,
                s,
                self.w_t,
                su,
                self.eps,
                self.z_loss,
                self.len_row,
            )
            / s
        )

    @always_inline
    def fold[C: Int](mut self, p: RowPart, on: OnchipBlock[Self.dtype]):
        """Sweep 1 loads the part and its max; sweep 2 sums exp(x - max)
        and x (label smoothing) over the on-chip copy (`smem_row_stats`;
        OPTION_TERMS: `_fold_options`); then the row's loss."""
        var smem = on.smem
        var slots = kernel_arg(on.slots)
        var rank = on.rank
        comptime acc = accum_dtype[Self.dtype]()
        comptime assert acc.is_floating_point()
        comptime if Self.terms == OPTION_TERMS:
            self._fold_options[C](p, smem, slots, rank)
            return
        var x = kernel_arg(self.x)
        self.x_t = x[unsafe_offset=Int(self.tgt)].cast[acc]()
        var xp = x.unsafe_offset(self.first)
        self.row_max = self._cluster_max[C](
            slots,
            rank,
            p.t,
            load_part_max[Self.dtype, Self.V, Self.T](
                xp, smem, p, self.regs, self.edge
            ),
        )
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
            self._close_extended(sums[0], Scalar[acc](self.len_row), sums[1])

    @always_inline
    def _hold_capped_exp[
        loads: Bool
    ](
        mut self,
        xp: Pointer[Scalar[Self.dtype], MutAnyOrigin],
        smem: SharedBuffer[Self.dtype],
        p: RowPart,
    ) -> Scalar[accum_dtype[Self.dtype]()]:
        """`hold_capped_exp` of this row's part, under its softcap and
        `row_max`, into its registers and edge pair: sweep 2 without label
        smoothing (with `loads`, the part's first load too, where the cap
        stands in for the max)."""
        return hold_capped_exp[Self.V, Self.T, Self.dtype, loads](
            xp,
            smem,
            p,
            self.regs,
            self.edge,
            Softcap[accum_dtype[Self.dtype]()].of_cap(self.cap),
            self.row_max,
        )

    @always_inline
    def _fold_options[
        C: Int
    ](
        mut self,
        p: RowPart,
        smem: SharedBuffer[Self.dtype],
        slots: Pointer[Scalar[accum_dtype[Self.dtype]()], MutAnyOrigin],
        rank: Int,
    ):
        """`fold` under OPTION_TERMS: sweep 1 loads the part and its max
        (capped once the row's is known: the softcap is monotonic); sweep 2
        sums over the capped values on chip (`OptionSums`; without
        smoothing `hold_capped_exp`, which also loads the part where the
        cap stands in for the max); then the row's loss and the gradient's
        factor."""
        comptime acc = accum_dtype[Self.dtype]()
        var row = kernel_arg(self.logits).unsafe_offset(self.start - self.first)
        self.x_t = softcap_of[acc, 1](
            row[unsafe_offset=Int(self.tgt)].cast[acc](), self.cap
        )[0]
        if self.has_weight:
            self.w_t = self._options()[
                unsafe_offset=EXTENDED_OPTIONS + Int(self.tgt)
            ].cast[acc]()
        var xp = row.unsafe_offset(self.first)
        var smoothing = self.eps != 0
        var weighted = smoothing and self.has_weight
        var part_s = Scalar[acc](0)
        var part_su = Scalar[acc](0)
        var part_suy = Scalar[acc](0)
        if self.cap_as_max:
            self.row_max = self.cap
            part_s = self._hold_capped_exp[True](xp, smem, p)
        else:
            var raw_max = self._cluster_max[C](
                slots,
                rank,
                p.t,
                load_part_max[Self.dtype, Self.V, Self.T](
                    xp, smem, p, self.regs, self.edge
                ),
            )
            self.row_max = softcap_of[acc, 1](raw_max, self.cap)[0]
        if self.holds and not self.cap_as_max:
            part_s = self._hold_capped_exp[False](xp, smem, p)
        elif not self.holds:
            var sums = OptionSums[Self.dtype](
                Softcap[acc].of_cap(self.cap),
                self.row_max,
                smoothing,
                ClassWeights(weighted, self._weights()),
            )
            visit_held[Self.V, Self.T, OptionSums[Self.dtype], False](
                kernel_arg(self.dlogits),
                xp,
                smem,
                p,
                self.regs,
                self.edge,
                sums,
            )
            part_s = sums.s
            part_su = sums.su
            part_suy = sums.suy
        var s = block_sum[acc, Self.T](part_s)
        comptime if holds_exp[Self.dtype]():
            if self.holds:
                s *= Scalar[acc](2.0**-HELD_EXP_SHIFT)
        var suy = Scalar[acc](0)
        var su = Scalar[acc](self.len_row)
        if smoothing:
            suy = block_sum[acc, Self.T](part_suy)
            if weighted:
                su = block_sum[acc, Self.T](part_su)
        comptime if C > 1:
            var both = cluster_exchange[acc, C](
                slots.unsafe_offset(CE_OPTIONS_CLUSTER_SLOTS // 4),
                rank,
                p.t,
                s,
                suy,
            )
            s = both[0].reduce_add()
            suy = both[1].reduce_add()
            if weighted:
                su = cluster_exchange[acc, C](
                    slots.unsafe_offset(CE_OPTIONS_CLUSTER_SLOTS // 2),
                    rank,
                    p.t,
                    su,
                    0,
                )[0].reduce_add()
        self._close_extended(s, su, suy)

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
        """Sweep 3 (`with_grad`): the part's gradient from chip (under
        OPTION_TERMS `OptionGrad`, the target's entry included, unless the
        part holds its exps), then the target's entry by the thread that
        wrote it (its store came first in program order); a row not kept
        is filled (0 ignored, NaN for a bad target)."""
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
        var cap = Softcap[acc].of_cap(self.cap)
        var scale = grad_scale[acc, Self.mean](
            rebind[Pointer[Float64, MutAnyOrigin]](self.count)
        )
        var target_term = (1 - self.eps) * self.w_t
        var smooth = smoothing_of[acc](self.eps, self.len_row)
        # The target relative to the part: with C > 1 it may lie outside.
        var tgt: Int
        comptime if Self.terms == OPTION_TERMS:
            tgt = Int(self.tgt) - self.first
            var x = kernel_arg(self.logits).unsafe_offset(self.start)
            var grad = OptionGrad[Self.dtype](
                cap,
                self.row_max,
                self.inv_s,
                smooth,
                target_term,
                scale,
                -1 if self.holds else tgt,
                ClassWeights(self.has_weight, self._weights()),
            )
            if not self.holds:
                visit_held[Self.V, Self.T, OptionGrad[Self.dtype], True](
                    y, x, smem, p, self.regs, self.edge, grad
                )
                return
            var per_held = self.inv_s * scale
            comptime if holds_exp[Self.dtype]():
                per_held *= Scalar[acc](2.0**-HELD_EXP_SHIFT)
            write_capped_held[Self.V, Self.T, Self.dtype](
                y, x, smem, p, self.regs, self.edge, per_held, grad
            )
        else:
            write_held[
                Self.V,
                Self.T,
                CrossEntropyGrad[Self.dtype, holds_exp[Self.dtype]()],
            ](
                y,
                kernel_arg(self.x).unsafe_offset(self.first),
                smem,
                p,
                self.regs,
                self.edge,
                CrossEntropyGrad[Self.dtype, holds_exp[Self.dtype]()](
                    self.row_max, self.inv_s, smooth, scale
                ),
            )
            tgt = Int(self.tgt) - self.first
        comptime if C > 1:
            if tgt < 0 or tgt >= p.len:
                return
        if p.t == target_owner[Self.V, Self.T](tgt, p.head, p.tail_begin):
            y[unsafe_offset=tgt] = self._target_grad(smooth, scale)

    @always_inline
    def _target_grad(
        self,
        smooth: Scalar[accum_dtype[Self.dtype]()],
        scale: Scalar[accum_dtype[Self.dtype]()],
    ) -> Scalar[Self.dtype]:
        """The target's entry of the gradient, from its exact terms."""
        comptime acc = accum_dtype[Self.dtype]()
        var p_t = exp_nan[acc, 1](self.x_t - self.row_max) * self.inv_s
        comptime if Self.terms == NO_TERMS:
            return target_grad[acc](p_t, smooth, self.eps, scale).cast[
                Self.dtype
            ]()
        elif Self.terms == OPTION_TERMS:
            # Written here only where the part holds its exps: no label
            # smoothing; the softcap's chain factor scales the entry.
            return (
                (p_t - (1 - self.eps) * self.w_t)
                * scale
                * Softcap[acc].of_cap(self.cap).chain[1](self.x_t)
            ).cast[Self.dtype]()
        # p_t carries the terms' factor (in inv_s); the target loses
        # (1 - eps) w_t.
        return ((p_t - smooth - (1 - self.eps) * self.w_t) * scale).cast[
            Self.dtype
        ]()


@__llvm_metadata(
    MAX_THREADS_PER_BLOCK_METADATA=StaticTuple[Int32, 1](Int32(T)),
    `nvvm.minctasm`=SIMDLength(smem_min_blocks(T)),
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
    args: CEArgs[dtype],
    partials: Pointer[Scalar[accum_dtype[dtype]()], MutAnyOrigin],
    n: Int64,
    aligned_flag: Int32,
    has_weight: Int32,
):
    """Cross-entropy of rows of `n` classes (to `smem_capacity(V)` for
    C = 1, `cluster_capacity(V, 1, C)` for C > 1) held on chip, read once:
    `onchip_rows` of `CrossEntropyRow`, a row per cluster of C blocks of
    `T` threads. Arguments as `ce_block_kernel`; `partials`:
    `cluster_slots` a row (C > 1); `terms`: `CrossEntropyRow`'s;
    `has_weight`: whether `options` holds a weight a class, read under
    OPTION_TERMS only (every `terms` takes it: one kernel, one launch)."""
    var op = CrossEntropyRow[dtype, with_grad, mean, reduce, V, T, terms](
        args, has_weight
    )
    onchip_rows[C=C](op, partials, n, aligned_flag)


def launch_ce_parts[
    dtype: DType,
    with_grad: Bool,
    mean: Bool,
    reduce: Bool,
    C: Int,
    terms: Int = NO_TERMS,
](ctx: DeviceContext, op: CELaunchRows[dtype], has_weight: Int32 = 0) raises:
    """Launch `ce_smem_kernel` on `op`'s rows, C blocks a row, each with
    the shared memory its part needs, and the op's `cluster_slots`
    partials a row for C > 1 (`OnchipLaunch`); `terms`:
    `CrossEntropyRow`'s, `has_weight` read under OPTION_TERMS. Raises past
    the capacity."""
    comptime V = vector_width[dtype]()
    comptime slots = CrossEntropyRow[
        dtype, with_grad, mean, reduce, V, SMEM_THREADS, terms
    ].cluster_slots
    var launch = OnchipLaunch[dtype, C](
        ctx,
        "the cross-entropy on-chip kernel",
        op.rows,
        op.n,
        1,
        slots,
        "classes",
    )
    var aligned_flag = aligned_flag_of(op.aligned)
    var partials = launch.partials.ptr(in_global(op.args.row_losses))
    comptime for T in [SMEM_HALF_THREADS, SMEM_THREADS]:
        if launch.threads == T:
            launch.enqueue[
                ce_smem_kernel[dtype, with_grad, mean, reduce, V, T, C, terms],
                T,
            ](
                ctx,
                op.args,
                partials,
                Int64(op.n),
                aligned_flag,
                has_weight,
            )


# `launch_ce_parts` with a block a row (to `smem_capacity(V)`).
comptime launch_ce_smem[
    dtype: DType, with_grad: Bool, mean: Bool, reduce: Bool
] = launch_ce_parts[dtype, with_grad, mean, reduce, 1]
