"""The cross-entropy under the extended options (z-loss, softcap, class
weights) on chip: `CrossEntropyOptionsRow`, a `RowOp` of the on-chip
strategy (gpu_smem_rows' `onchip_rows`), a row per block or per cluster of
two, read once and its gradient written once from chip.

The block kernel of gpu_ce_options_rows reads a row twice: a row of an LM
head (32K-256K classes) is too long for the L2 to keep it between the
passes of every resident block, so its gradient cost three passes over
HBM. Here the raw logits stay on chip (registers, then shared memory:
`load_part_max`); the softcap is monotonic, so the row's capped max is the
cap of its max. Without label smoothing sweep 2 then replaces each logit by
exp(y - max) times the softcap's chain factor (`hold_capped_exp`), so
sweep 3 is a multiply an element; with it, where the gradient needs the
chain factor apart, sweep 3 recomputes the capped values from the logits.

`launch_cross_entropy_options` (gpu_ce_options_rows) sends rows with a
gradient here when there are at least SPLIT_BELOW_ROWS of them, up to
`pair_capacity(V)` classes (~148K fp32, ~296K 16-bit).
"""

from max.gpu import MAX_THREADS_PER_BLOCK_METADATA
from max.gpu.host import DeviceContext
from max.gpu.memory import async_copy_wait_all
from std.math import exp2
from std.sys import size_of
from std.utils import StaticTuple
from std.utils.numerics import inf, nan

from .cross_entropy_math import (
    EXTENDED_OPTIONS,
    IGNORED,
    exact_tanh,
    KEPT,
    extended_p_factor,
    extended_row_loss,
    smoothing_of,
    softcap_chain,
    softcap_of,
    target_kind,
)
from .dispatch import SPLIT_BELOW_ROWS
from .gpu_ce_common import fill_part, grad_scale, target_owner
from .gpu_launch import HeldRows, aligned_flag_of, held, kernel_arg
from .gpu_reductions import block_sum
from .gpu_smem_rows import (
    HELD_EXP_SHIFT,
    REG_CHUNKS,
    SMEM_HALF_THREADS,
    SMEM_THREADS,
    OnchipLaunch,
    cluster_exchange,
    LOG2E,
    load_part_max,
    start_row_copy,
    onchip_rows,
    pair_capacity,
    smem_capacity,
)
from .gpu_split_chunks import SharedBuffer
from .row_math import accum_dtype, exp_nan
from .row_op import RowOp
from .row_part import RowPart

# A row's accumulators for a cluster's exchanges: the parts' max, their
# sums of exp and of the capped logits, and their weight sums, each in a
# 128-byte line of its own (float64: two).
comptime CE_OPTIONS_CLUSTER_SLOTS = 128


def options_onchip_parts(rows: Int, n: Int, V: Int) -> Int:
    """The blocks a row `CrossEntropyOptionsRow` takes for `rows` rows of
    `n` classes (1 or 2), or 0 where the block kernel should: too few rows
    to fill the GPU a row a block, or rows past a pair's capacity."""
    if rows < SPLIT_BELOW_ROWS:
        return 0
    if n <= smem_capacity(V):
        return 1
    if n <= pair_capacity(V):
        return 2
    return 0


trait HeldVisit:
    """What `visit_held` does with each value of a part held on chip, told
    where the value sits in the part: the sums of sweep 2, the gradient of
    sweep 3."""

    comptime dtype: DType
    """Element type of the tensors."""

    def visit[
        w: Int
    ](mut self, e: Int, v: SIMD[accum_dtype[Self.dtype](), w]) -> SIMD[
        Self.dtype, w
    ]:
        """Visit elements e .. e + w - 1 of the part, whose values are `v`;
        what to write there (when the sweep writes)."""
        ...


@always_inline
def visit_held[
    V: Int, T: Int, F: HeldVisit, writes: Bool
](
    y: Pointer[Scalar[F.dtype], MutAnyOrigin],
    x: Pointer[Scalar[F.dtype], MutAnyOrigin],
    smem: SharedBuffer[F.dtype],
    p: RowPart,
    regs: SIMD[F.dtype, V * REG_CHUNKS],
    edge: SIMD[accum_dtype[F.dtype](), 2],
    mut f: F,
):
    """Thread `p.t`'s values of its part (held by `load_part_max`), each
    with its place in the part: the vectors in registers, then those in
    shared memory, the edge pair, a long head re-read from `x`; `writes`,
    what `f` returns goes to the same place of `y`."""
    comptime acc = accum_dtype[F.dtype]()
    comptime R = REG_CHUNKS
    comptime for k in range(R):
        var i = k * T + p.t
        if i < p.nvec:
            var r = f.visit[V](
                p.head + i * V, regs.slice[V, offset=k * V]().cast[acc]()
            )
            comptime if writes:
                y.unsafe_offset(p.head + i * V).unsafe_store[alignment=16](r)
    for i in range(R * T + p.t, p.nvec, T):
        var v = smem.unsafe_offset((i - R * T) * V).unsafe_load[
            width=V, alignment=16
        ]()
        var r = f.visit[V](p.head + i * V, v.cast[acc]())
        comptime if writes:
            y.unsafe_offset(p.head + i * V).unsafe_store[alignment=16](r)
    if p.has_head:
        var r = f.visit[1](p.t, SIMD[acc, 1](edge[0]))
        comptime if writes:
            y[unsafe_offset=p.t] = r[0]
    if p.has_tail:
        var r = f.visit[1](p.tail_begin + p.t, SIMD[acc, 1](edge[1]))
        comptime if writes:
            y[unsafe_offset=p.tail_begin + p.t] = r[0]
    for e in range(p.lead, p.head, T):
        var r = f.visit[1](e, SIMD[acc, 1](x[unsafe_offset=e].cast[acc]()))
        comptime if writes:
            y[unsafe_offset=e] = r[0]


@always_inline
def _weights_at[
    acc: DType, w: Int
](weights: Pointer[Float64, MutAnyOrigin], e: Int) -> SIMD[acc, w]:
    """Class weights e .. e + w - 1 (float64 on the device, any alignment)."""
    var u = SIMD[acc, w](0)
    comptime for k in range(w):
        u[k] = weights[unsafe_offset=e + k].cast[acc]()
    return u


@fieldwise_init
struct Softcap[acc: DType](ImplicitlyCopyable):
    """The softcap c * tanh(x / c) of sweeps 2 and 3 (`exact_tanh`), with
    1 / c taken once a row: a division an element (twice for the gradient)
    cost more issue slots than the tanh and exp together. float64 keeps
    `softcap_of`'s exact division."""

    var cap: Scalar[Self.acc]
    """The softcap (0: none)."""
    var inv_cap: Scalar[Self.acc]
    """1 / cap (0 where cap is 0)."""

    @staticmethod
    @always_inline
    def of_cap(cap: Scalar[Self.acc]) -> Self:
        """The softcap `cap` (0: none)."""
        return Self(cap, 1 / cap if cap != 0 else Scalar[Self.acc](0))

    @always_inline
    def apply[w: Int](self, x: SIMD[Self.acc, w]) -> SIMD[Self.acc, w]:
        """cap * tanh(x / cap), or x without a cap."""
        comptime assert Self.acc.is_floating_point()
        comptime if Self.acc == DType.float64:
            return softcap_of[Self.acc, w](x, self.cap)
        if self.cap == 0:
            return x
        return exact_tanh[Self.acc, w](x * self.inv_cap) * self.cap

    @always_inline
    def chain[w: Int](self, y: SIMD[Self.acc, w]) -> SIMD[Self.acc, w]:
        """d softcap / dx at the capped value y: 1 - (y / cap)^2."""
        comptime if Self.acc == DType.float64:
            return softcap_chain[Self.acc, w](y, self.cap)
        if self.cap == 0:
            return SIMD[Self.acc, w](1)
        var r = y * self.inv_cap
        return 1 - r * r


# Without label smoothing a kept row's gradient is p_c * factor * scale *
# chain_c for every class but the target, so with a softcap sweep 2 keeps
# h_c = exp(y_c - max) * chain_c on chip in place of the logit
# (`hold_capped_exp`) and sweep 3 is one multiply an element
# (`write_capped_held`): the softcap and the exp once a logit, where
# recomputing them from the held logits made the sweeps compute-bound
# (16-bit rows at ~42% of the plain kernel's speed). 16-bit rows hold
# 2^HELD_EXP_SHIFT h in their own type, as the plain kernel holds its exps
# (gpu_ce_smem_rows says why, and what the rounding costs: within one ulp
# of the output); the target's entry comes from its exact terms.


@always_inline
def _holds_shifted[dtype: DType]() -> Bool:
    """Whether held values carry 2^HELD_EXP_SHIFT: 16-bit rows."""
    return size_of[dtype]() == 2


@fieldwise_init
struct CappedExp[acc: DType, shifted: Bool](ImplicitlyCopyable):
    """exp(y - max) (2^HELD_EXP_SHIFT times it with `shifted`) and the
    chain factor 1 - tanh^2 at y = cap * tanh(x / cap) of a row with a
    softcap: one tanh for both, and in float32 the exponent in one FMA,
    tanh * cap log2(e) + (shift - max log2(e)). Its rounded constant moves
    every exp of the row by the same factor (|log error| <= 2^-24 x (shift
    + |max| log2(e)), ~1e-6 at cap 30), which p = e / sum cancels; the
    loss keeps it, ~100 times below float32's tolerance."""

    var cap: Softcap[Self.acc]
    """The softcap (not 0)."""
    var row_max: Scalar[Self.acc]
    """The row's capped max."""
    var scale: Scalar[Self.acc]
    """cap * log2(e)."""
    var bias: Scalar[Self.acc]
    """shift - max * log2(e) (shift: HELD_EXP_SHIFT with `shifted`)."""

    @staticmethod
    @always_inline
    def of(cap: Softcap[Self.acc], row_max: Scalar[Self.acc]) -> Self:
        """The map of a row with softcap `cap` and capped max `row_max`."""
        var shift = Scalar[Self.acc](HELD_EXP_SHIFT if Self.shifted else 0)
        return Self(
            cap,
            row_max,
            cap.cap * Scalar[Self.acc](LOG2E),
            shift - row_max * Scalar[Self.acc](LOG2E),
        )

    @always_inline
    def at[
        w: Int
    ](self, x: SIMD[Self.acc, w]) -> Tuple[
        SIMD[Self.acc, w], SIMD[Self.acc, w]
    ]:
        """(exp(y - max), 1 - tanh^2) at the raw logits `x`."""
        comptime assert Self.acc.is_floating_point()
        comptime if Self.acc == DType.float64:
            var y = self.cap.apply[w](x)
            return (
                exp_nan[Self.acc, w](y - self.row_max),
                self.cap.chain[w](y),
            )
        var t = exact_tanh[Self.acc, w](x * self.cap.inv_cap)
        return (exp2(t.fma(self.scale, self.bias)), 1 - t * t)


# A softcap bounds every capped logit by |cap|, so exp(y - cap) may stand
# in for exp(y - max) (`hold_capped_exp` with `loads`): sweep 1 then loads
# and computes at once, with no max to wait for, while its copies into
# shared memory are in flight. Up to cap = SOFTCAP_AS_MAX, exp(y - cap) >=
# exp(-2 cap) stays a normal float32 (ex2.approx flushes below 2^-126);
# float16's range is too short for it (float16 rows, and longer caps, fold
# the max first).
comptime SOFTCAP_AS_MAX = 40.0


@always_inline
def hold_capped_exp[
    V: Int, T: Int, dtype: DType, loads: Bool
](
    x: Pointer[Scalar[dtype], MutAnyOrigin],
    smem: SharedBuffer[dtype],
    p: RowPart,
    mut regs: SIMD[dtype, V * REG_CHUNKS],
    mut edge: SIMD[accum_dtype[dtype](), 2],
    cap: Softcap[accum_dtype[dtype]()],
    row_max: Scalar[accum_dtype[dtype]()],
) -> Scalar[accum_dtype[dtype]()]:
    """Sweep 2 without label smoothing: thread `p.t`'s sum of exp(y -
    `row_max`) over its part (2^HELD_EXP_SHIFT times it for 16-bit rows),
    each value held on chip replaced by its h (the vectors in `dtype`, the
    edge pair in the accumulator type); a long head re-read from `x` is
    only summed. The part is held by `load_part_max`, or with `loads` this
    sweep loads it (as `load_row`), `row_max` then a bound of the capped
    logits rather than their max."""
    comptime acc = accum_dtype[dtype]()
    comptime R = REG_CHUNKS
    var f = CappedExp[acc, _holds_shifted[dtype]()].of(cap, row_max)
    var s = Scalar[acc](0)
    comptime if loads:
        start_row_copy[dtype, V, T, R](x, smem, p.t, p.head, p.nvec)
    comptime for k in range(R):
        var i = k * T + p.t
        if i < p.nvec:
            var v = regs.slice[V, offset=k * V]()
            comptime if loads:
                v = x.unsafe_offset(p.head + i * V).unsafe_load[
                    width=V, alignment=16
                ]()
            var ec = f.at[V](v.cast[acc]())
            s += ec[0].reduce_add()
            regs = regs.insert[offset=k * V]((ec[0] * ec[1]).cast[dtype]())
    comptime if loads:
        async_copy_wait_all()
    for i in range(R * T + p.t, p.nvec, T):
        var at = smem.unsafe_offset((i - R * T) * V)
        var ec = f.at[V](at.unsafe_load[width=V, alignment=16]().cast[acc]())
        s += ec[0].reduce_add()
        at.unsafe_store[alignment=16]((ec[0] * ec[1]).cast[dtype]())
    comptime for j in range(2):
        if p.has_head if j == 0 else p.has_tail:
            var v = edge[j]
            comptime if loads:
                v = x[unsafe_offset=p.t if j == 0 else p.tail_begin + p.t].cast[
                    acc
                ]()
            var ec = f.at[1](SIMD[acc, 1](v))
            s += ec[0][0]
            edge[j] = ec[0][0] * ec[1][0]
    for e in range(p.lead, p.head, T):
        s += f.at[1](SIMD[acc, 1](x[unsafe_offset=e].cast[acc]()))[0][0]
    return s


@always_inline
def write_capped_held[
    V: Int, T: Int, dtype: DType
](
    y: Pointer[Scalar[dtype], MutAnyOrigin],
    x: Pointer[Scalar[dtype], MutAnyOrigin],
    smem: SharedBuffer[dtype],
    p: RowPart,
    regs: SIMD[dtype, V * REG_CHUNKS],
    edge: SIMD[accum_dtype[dtype](), 2],
    per_held: Scalar[accum_dtype[dtype]()],
    mut grad: OptionGrad[dtype],
):
    """Sweep 3 after `hold_capped_exp`: thread `p.t`'s gradient of its
    part, a held h times `per_held` (factor / sum * scale, over
    2^HELD_EXP_SHIFT for 16-bit rows), a long head recomputed from `x` by
    `grad`. The target's entry is left to the caller."""
    comptime acc = accum_dtype[dtype]()
    comptime R = REG_CHUNKS
    comptime for k in range(R):
        var i = k * T + p.t
        if i < p.nvec:
            var h = regs.slice[V, offset=k * V]().cast[acc]()
            y.unsafe_offset(p.head + i * V).unsafe_store[alignment=16](
                (h * per_held).cast[dtype]()
            )
    for i in range(R * T + p.t, p.nvec, T):
        var h = smem.unsafe_offset((i - R * T) * V).unsafe_load[
            width=V, alignment=16
        ]()
        y.unsafe_offset(p.head + i * V).unsafe_store[alignment=16](
            (h.cast[acc]() * per_held).cast[dtype]()
        )
    if p.has_head:
        y[unsafe_offset=p.t] = (edge[0] * per_held).cast[dtype]()
    if p.has_tail:
        y[unsafe_offset=p.tail_begin + p.t] = (edge[1] * per_held).cast[dtype]()
    for e in range(p.lead, p.head, T):
        y[unsafe_offset=e] = grad.visit[1](
            e, SIMD[acc, 1](x[unsafe_offset=e].cast[acc]())
        )[0]


struct OptionSums[dtype_: DType](HeldVisit):
    """Sweep 2: a thread's sum of exp(y - max) over its capped values y
    and, with label smoothing, its sums of u and u * y (u: the class
    weights, 1 without)."""

    comptime dtype = Self.dtype_

    var cap: Softcap[accum_dtype[Self.dtype_]()]
    """The softcap."""
    var row_max: Scalar[accum_dtype[Self.dtype_]()]
    """The row's capped max."""
    var smoothing: Bool
    """Label smoothing is on: the u sums are wanted."""
    var weighted: Bool
    """u is the class weights (else 1)."""
    var weights: HeldRows[DType.float64]
    """The part's class weights (its element 0's weight first)."""
    var s: Scalar[accum_dtype[Self.dtype_]()]
    """Sum of exp(y - max)."""
    var su: Scalar[accum_dtype[Self.dtype_]()]
    """Sum of u (weighted only)."""
    var suy: Scalar[accum_dtype[Self.dtype_]()]
    """Sum of u * y."""

    @always_inline
    def __init__(
        out self,
        cap: Softcap[accum_dtype[Self.dtype_]()],
        row_max: Scalar[accum_dtype[Self.dtype_]()],
        smoothing: Bool,
        weighted: Bool,
        weights: Pointer[Float64, MutAnyOrigin],
    ):
        """Empty sums for a row with these terms."""
        self.cap = cap
        self.row_max = row_max
        self.smoothing = smoothing
        self.weighted = weighted
        self.weights = held(weights)
        self.s = 0
        self.su = 0
        self.suy = 0

    @always_inline
    def visit[
        w: Int
    ](mut self, e: Int, v: SIMD[accum_dtype[Self.dtype](), w]) -> SIMD[
        Self.dtype, w
    ]:
        """Fold w values into the sums (nothing is written)."""
        comptime acc = accum_dtype[Self.dtype]()
        var y = self.cap.apply[w](v)
        self.s += exp_nan[acc, w](y - self.row_max).reduce_add()
        if self.smoothing:
            if self.weighted:
                var u = _weights_at[acc, w](kernel_arg(self.weights), e)
                self.su += u.reduce_add()
                self.suy += (u * y).reduce_add()
            else:
                self.suy += y.reduce_add()
        return SIMD[Self.dtype, w](0)


struct OptionGrad[dtype_: DType](HeldVisit):
    """Sweep 3: the gradient of a kept row's logits,
    (p_c * factor - eps / V * u_c - [c == t] (1 - eps) w_t) * scale, times
    the softcap's chain factor (`extended_p_factor`)."""

    comptime dtype = Self.dtype_

    var cap: Softcap[accum_dtype[Self.dtype_]()]
    """The softcap."""
    var row_max: Scalar[accum_dtype[Self.dtype_]()]
    """The row's capped max."""
    var p_factor: Scalar[accum_dtype[Self.dtype_]()]
    """1 / sum of exp(y - max), times what multiplies p_c."""
    var smooth: Scalar[accum_dtype[Self.dtype_]()]
    """eps / V."""
    var target_term: Scalar[accum_dtype[Self.dtype_]()]
    """(1 - eps) w_t."""
    var scale: Scalar[accum_dtype[Self.dtype_]()]
    """The gradient's scale (`grad_scale`)."""
    var tgt: Int
    """The target's element of the part (may lie outside it)."""
    var weighted: Bool
    """The smoothing term takes the class weights (else 1)."""
    var weights: HeldRows[DType.float64]
    """The part's class weights (its element 0's weight first)."""

    @always_inline
    def __init__(
        out self,
        cap: Softcap[accum_dtype[Self.dtype_]()],
        row_max: Scalar[accum_dtype[Self.dtype_]()],
        p_factor: Scalar[accum_dtype[Self.dtype_]()],
        smooth: Scalar[accum_dtype[Self.dtype_]()],
        target_term: Scalar[accum_dtype[Self.dtype_]()],
        scale: Scalar[accum_dtype[Self.dtype_]()],
        tgt: Int,
        weighted: Bool,
        weights: Pointer[Float64, MutAnyOrigin],
    ):
        """The gradient map of a row with these terms."""
        self.cap = cap
        self.row_max = row_max
        self.p_factor = p_factor
        self.smooth = smooth
        self.target_term = target_term
        self.scale = scale
        self.tgt = tgt
        self.weighted = weighted
        self.weights = held(weights)

    @always_inline
    def visit[
        w: Int
    ](mut self, e: Int, v: SIMD[accum_dtype[Self.dtype](), w]) -> SIMD[
        Self.dtype, w
    ]:
        """The gradient of elements e .. e + w - 1."""
        comptime acc = accum_dtype[Self.dtype]()
        var y = self.cap.apply[w](v)
        var g = exp_nan[acc, w](y - self.row_max) * self.p_factor
        if self.smooth != 0:
            if self.weighted:
                g -= (
                    _weights_at[acc, w](kernel_arg(self.weights), e)
                    * self.smooth
                )
            else:
                g -= self.smooth
        if self.tgt >= e and self.tgt < e + w:
            comptime for k in range(w):
                if self.tgt == e + k:
                    g[k] -= self.target_term
        return (g * self.scale * self.cap.chain[w](y)).cast[Self.dtype]()


struct CrossEntropyOptionsRow[
    dtype_: DType, mean: Bool, reduce: Bool, V: Int, T: Int
](RowOp):
    """Fused cross-entropy with its gradient under the extended options
    (`options`: ignore_index, label smoothing, z_loss, softcap, then a
    weight a class where `has_weight`) as a `RowOp`: it folds the raw
    row's max (capped after), then the sums of exp(y - max) and, with
    label smoothing, of u and u * y over the capped logits y; writes the
    row's loss (`extended_row_loss`: to `row_losses` with `reduce`, else
    `loss`) and dlogits (`mean`: divided by the weighted count). A
    cluster's parts exchange their max first, then their sums."""

    comptime dtype = Self.dtype_
    comptime width = Self.V
    comptime threads = Self.T
    comptime cluster_slots = CE_OPTIONS_CLUSTER_SLOTS

    var dlogits: HeldRows[Self.dtype]
    """Gradient rows."""
    var logits: HeldRows[Self.dtype]
    """Logit rows."""
    var targets: Pointer[Int64, MutUntrackedOrigin]
    """A target class a row."""
    var options: Pointer[Float64, MutUntrackedOrigin]
    """The extended options, then the class weights (`has_weight`)."""
    var count: Pointer[Float64, MutUntrackedOrigin]
    """The (weighted) count of kept rows, for "mean"."""
    var row_losses: Pointer[
        Scalar[accum_dtype[Self.dtype_]()], MutUntrackedOrigin
    ]
    """Per-row losses in the accumulator type (`reduce`)."""
    var loss: HeldRows[Self.dtype]
    """Per-row losses (not `reduce`)."""
    var has_weight: Bool
    """`options` holds a weight a class."""
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
    var z_loss: Scalar[accum_dtype[Self.dtype_]()]
    """The z-loss weight."""
    var cap: Scalar[accum_dtype[Self.dtype_]()]
    """The softcap (0: none)."""
    var w_t: Scalar[accum_dtype[Self.dtype_]()]
    """The target's class weight (1 without weights)."""
    var y_t: Scalar[accum_dtype[Self.dtype_]()]
    """The target's capped logit."""
    var holds: Bool
    """A softcap and no label smoothing: sweep 2 leaves each value's h
    on chip (`hold_capped_exp`)."""
    var cap_as_max: Bool
    """`holds`, and the cap stands in for the row's max: sweeps 1 and
    2 in one (`SOFTCAP_AS_MAX`)."""
    var row_max: Scalar[accum_dtype[Self.dtype_]()]
    """The row's capped max."""
    var p_factor: Scalar[accum_dtype[Self.dtype_]()]
    """What multiplies exp(y - max) in the gradient (1 / sum included)."""
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
        has_weight: Int32,
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
        self.has_weight = has_weight != 0
        self.start = 0
        self.first = 0
        self.len_row = 0
        self.tgt = 0
        self.kind = 0
        self.eps = 0
        self.z_loss = 0
        self.cap = 0
        self.w_t = 1
        self.y_t = 0
        self.holds = False
        self.cap_as_max = False
        self.row_max = 0
        self.p_factor = 0
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
        """Read the options and the row's target: only a kept row is
        folded (a row not kept loads nothing)."""
        comptime acc = accum_dtype[Self.dtype]()
        var options = self._options()
        self.start = start
        self.first = first
        self.len_row = len_row
        self.eps = options[unsafe_offset=1].cast[acc]()
        self.z_loss = options[unsafe_offset=2].cast[acc]()
        self.cap = options[unsafe_offset=3].cast[acc]()
        self.holds = self.eps == 0 and self.cap != 0
        comptime if Self.dtype == DType.float32 or Self.dtype == DType.bfloat16:
            self.cap_as_max = (
                self.holds
                and self.cap > 0
                and self.cap <= Scalar[acc](SOFTCAP_AS_MAX)
            )
        self.tgt = self.targets[unsafe_offset=row]
        self.kind = target_kind(
            self.tgt, Int64(options[unsafe_offset=0]), len_row
        )
        if self.kind != KEPT and self.kind != IGNORED:
            self.value = nan[acc]()
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
        """Sweep 1 loads the part and its max (capped once the row's is
        known: the softcap is monotonic); sweep 2 sums over the capped
        values on chip (`OptionSums`; without smoothing
        `hold_capped_exp`, which also loads the part where the cap stands
        in for the max); then the row's loss and the gradient's factor."""
        comptime acc = accum_dtype[Self.dtype]()
        comptime assert acc.is_floating_point()
        var row = kernel_arg(self.logits).unsafe_offset(self.start - self.first)
        var options = self._options()
        self.y_t = softcap_of[acc, 1](
            row[unsafe_offset=Int(self.tgt)].cast[acc](), self.cap
        )[0]
        if self.has_weight:
            self.w_t = options[
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
            part_s = hold_capped_exp[Self.V, Self.T, Self.dtype, True](
                xp,
                smem,
                p,
                self.regs,
                self.edge,
                Softcap[acc].of_cap(self.cap),
                self.row_max,
            )
        else:
            var raw_max = load_part_max[Self.dtype, Self.V, Self.T](
                xp, smem, p, self.regs, self.edge
            )
            comptime if C > 1:
                raw_max = cluster_exchange[acc, C](
                    slots, rank, p.t, raw_max, 0
                )[0].reduce_max()
            self.row_max = softcap_of[acc, 1](raw_max, self.cap)[0]
        if self.holds and not self.cap_as_max:
            part_s = hold_capped_exp[Self.V, Self.T, Self.dtype, False](
                xp,
                smem,
                p,
                self.regs,
                self.edge,
                Softcap[acc].of_cap(self.cap),
                self.row_max,
            )
        elif not self.holds:
            var sums = OptionSums[Self.dtype](
                Softcap[acc].of_cap(self.cap),
                self.row_max,
                smoothing,
                weighted,
                self._weights(),
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
        comptime if _holds_shifted[Self.dtype]():
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
        self.value = extended_row_loss[acc](
            self.row_max,
            s,
            self.y_t,
            self.w_t,
            su,
            suy,
            self.eps,
            self.z_loss,
            self.len_row,
        )
        self.p_factor = (
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
    def finish(self, p: RowPart, row: Int, rank: Int):
        """The row's loss, by thread 0 of rank 0."""
        if p.t == 0 and rank == 0:
            comptime if Self.reduce:
                self.row_losses[unsafe_offset=row] = self.value
            else:
                self.loss[unsafe_offset=row] = self.value.cast[Self.dtype]()

    @always_inline
    def write[C: Int](mut self, p: RowPart, smem: SharedBuffer[Self.dtype]):
        """Sweep 3: the part's gradient from chip (`OptionGrad`, the
        target's entry included); a row not kept is filled (0 ignored,
        NaN for a bad target)."""
        comptime acc = accum_dtype[Self.dtype]()
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
        var tgt = Int(self.tgt) - self.first
        var x = kernel_arg(self.logits).unsafe_offset(self.start)
        var grad = OptionGrad[Self.dtype](
            cap,
            self.row_max,
            self.p_factor,
            smoothing_of[acc](self.eps, self.len_row),
            target_term,
            scale,
            -1 if self.holds else tgt,
            self.has_weight,
            self._weights(),
        )
        if not self.holds:
            visit_held[Self.V, Self.T, OptionGrad[Self.dtype], True](
                y, x, smem, p, self.regs, self.edge, grad
            )
            return
        var per_held = self.p_factor * scale
        comptime if _holds_shifted[Self.dtype]():
            per_held *= Scalar[acc](2.0**-HELD_EXP_SHIFT)
        write_capped_held[Self.V, Self.T, Self.dtype](
            y, x, smem, p, self.regs, self.edge, per_held, grad
        )
        # The target's entry from its exact terms, by the thread that
        # wrote it (its store came first in program order); with C > 1 it
        # may lie outside the part.
        comptime if C > 1:
            if tgt < 0 or tgt >= p.len:
                return
        if p.t == target_owner[Self.V, Self.T](tgt, p.head, p.tail_begin):
            var e_t = exp_nan[acc, 1](self.y_t - self.row_max)[0]
            y[unsafe_offset=tgt] = (
                (e_t * self.p_factor - target_term)
                * scale
                * cap.chain[1](self.y_t)[0]
            ).cast[Self.dtype]()


@__llvm_metadata(
    MAX_THREADS_PER_BLOCK_METADATA=StaticTuple[Int32, 1](Int32(T)),
    `nvvm.minctasm`=SIMDLength(2 if T == SMEM_HALF_THREADS else 1),
)
def ce_options_smem_kernel[
    dtype: DType,
    mean: Bool,
    reduce: Bool,
    V: Int,
    T: Int,
    C: Int,
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
    has_weight: Int32,
):
    """The extended cross-entropy and its gradient of rows of `n` classes
    held on chip, read once: `onchip_rows` of `CrossEntropyOptionsRow`, a
    row per cluster of C blocks of `T` threads. `partials`:
    `CE_OPTIONS_CLUSTER_SLOTS` a row (C > 1)."""
    var op = CrossEntropyOptionsRow[dtype, mean, reduce, V, T](
        dlogits, logits, targets, options, count, row_losses, loss, has_weight
    )
    onchip_rows[C=C](op, partials, n, aligned_flag)


def launch_ce_options_parts[
    dtype: DType, mean: Bool, reduce: Bool, V: Int, C: Int
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
    has_weight: Int32,
) raises:
    """Launch `ce_options_smem_kernel` on `rows` rows of `n`, C blocks a
    row, each with the shared memory its part needs (`OnchipLaunch`).
    Raises past the capacity."""
    var launch = OnchipLaunch[dtype, C](
        ctx,
        "the cross-entropy options on-chip kernel",
        rows,
        n,
        1,
        CE_OPTIONS_CLUSTER_SLOTS,
        "classes",
    )
    comptime for T in [SMEM_HALF_THREADS, SMEM_THREADS]:
        if launch.threads == T:
            launch.enqueue[
                ce_options_smem_kernel[dtype, mean, reduce, V, T, C], T
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
                has_weight,
            )
