"""What the cross-entropy's on-chip op (gpu_ce_smem_rows'
`CrossEntropyRow`) folds and writes under OPTION_TERMS: a softcap, or class
weights inside the label smoothing term.

The raw logits stay on chip (registers, then shared memory:
`load_part_max`); the softcap is monotonic, so the row's capped max is the
cap of its max. Without label smoothing sweep 2 then replaces each logit by
exp(y - max) times the softcap's chain factor (`hold_capped_exp`), so
sweep 3 is a multiply an element (`write_capped_held`); with it, where the
gradient needs the chain factor apart, sweep 2 sums (`OptionSums`) and
sweep 3 recomputes the capped values from the logits (`OptionGrad`), each a
`HeldVisit` of the values held on chip (`visit_held`).
"""

from max.gpu.memory import async_copy_wait_all
from std.math import exp2

from .cross_entropy_math import exact_tanh, softcap_chain, softcap_of
from .gpu_ce_common import holds_exp
from .gpu_launch import HeldRows, held, kernel_arg
from .gpu_smem_rows import HELD_EXP_SHIFT, LOG2E, REG_CHUNKS, start_row_copy
from .gpu_split_chunks import SharedBuffer
from .row_math import accum_dtype, exp_nan
from .row_part import RowPart


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


# Lanes of a held vector the softcap's sweeps compute at once. A vector of
# V (8 for 16-bit rows) computed whole keeps every lane's tanh, exp and
# class weight live together, past the 64 registers a thread has at 1024
# resident threads: the kernels spilled. The math is elementwise, so the
# values are the same; the sums add W lanes at a time.
comptime HELD_LANES = 2


@always_inline
def _visit_vector[
    V: Int, F: HeldVisit
](mut f: F, e: Int, v: SIMD[accum_dtype[F.dtype](), V]) -> SIMD[F.dtype, V]:
    """`f.visit` on the vector at elements e .. e + V - 1, `HELD_LANES` at
    a time."""
    comptime W = min(V, HELD_LANES)
    var r = SIMD[F.dtype, V](0)
    comptime for h in range(V // W):
        r = r.insert[offset=h * W](
            f.visit[W](e + h * W, v.slice[W, offset=h * W]())
        )
    return r


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
    # Vector k * T + p.t at a constant offset from the thread's first: one
    # address for the four, not four kept through every sweep.
    var e0 = p.head + p.t * V
    var left = p.nvec - p.t
    comptime for k in range(R):
        if k * T < left:
            var r = _visit_vector[V](
                f, e0 + k * T * V, regs.slice[V, offset=k * V]().cast[acc]()
            )
            comptime if writes:
                y.unsafe_offset(e0 + k * T * V).unsafe_store[alignment=16](r)
    # The rest from shared memory, stepped by element: one induction value.
    var first_smem = p.head + R * T * V
    for e in range(e0 + R * T * V, p.head + p.nvec * V, T * V):
        var v = smem.unsafe_offset(e - first_smem).unsafe_load[
            width=V, alignment=16
        ]()
        var r = _visit_vector[V](f, e, v.cast[acc]())
        comptime if writes:
            y.unsafe_offset(e).unsafe_store[alignment=16](r)
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


struct ClassWeights(TrivialRegisterPassable):
    """The u of the label smoothing term that sweeps 2 and 3 read: the
    part's class weights where `weighted`, else 1 (the sweeps then skip
    the loads)."""

    var weighted: Bool
    """u is the class weights (else 1)."""
    var weights: HeldRows[DType.float64]
    """The part's class weights (its element 0's weight first)."""

    @always_inline
    def __init__(
        out self, weighted: Bool, weights: Pointer[Float64, MutAnyOrigin]
    ):
        """The part's u, from its class weights where `weighted`."""
        self.weighted = weighted
        self.weights = held(weights)

    @always_inline
    def at[acc: DType, w: Int](self, e: Int) -> SIMD[acc, w]:
        """Class weights e .. e + w - 1 (float64 on the device, any
        alignment)."""
        var weights = kernel_arg(self.weights)
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
# (`holds_exp` says why, and what the rounding costs: within one ulp of
# the output); the target's entry comes from its exact terms.


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

    @always_inline
    def hold[
        dtype: DType, w: Int
    ](self, x: SIMD[Self.acc, w], mut s: Scalar[Self.acc]) -> SIMD[dtype, w]:
        """h = exp(y - max) * (1 - tanh^2) at the raw logits `x`, in
        `dtype`, their exps added to `s`; `HELD_LANES` at a time."""
        comptime W = min(w, HELD_LANES)
        var h = SIMD[dtype, w](0)
        comptime for k in range(w // W):
            var ec = self.at[W](x.slice[W, offset=k * W]())
            s += ec[0].reduce_add()
            h = h.insert[offset=k * W]((ec[0] * ec[1]).cast[dtype]())
        return h


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
    sweep loads it (as `load_part_max` does), `row_max` then a bound of the
    capped logits rather than their max."""
    comptime acc = accum_dtype[dtype]()
    comptime R = REG_CHUNKS
    var f = CappedExp[acc, holds_exp[dtype]()].of(cap, row_max)
    var s = Scalar[acc](0)
    comptime if loads:
        start_row_copy[dtype, V, T, R](x, smem, p.t, p.head, p.nvec)
    var e0 = p.head + p.t * V
    var left = p.nvec - p.t
    comptime for k in range(R):
        if k * T < left:
            var v = regs.slice[V, offset=k * V]()
            comptime if loads:
                v = x.unsafe_offset(e0 + k * T * V).unsafe_load[
                    width=V, alignment=16
                ]()
            regs = regs.insert[offset=k * V](f.hold[dtype, V](v.cast[acc](), s))
    comptime if loads:
        async_copy_wait_all()
    var first_smem = p.head + R * T * V
    for e in range(e0 + R * T * V, p.head + p.nvec * V, T * V):
        var at = smem.unsafe_offset(e - first_smem)
        at.unsafe_store[alignment=16](
            f.hold[dtype, V](
                at.unsafe_load[width=V, alignment=16]().cast[acc](), s
            )
        )
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
    var e0 = p.head + p.t * V
    var left = p.nvec - p.t
    comptime for k in range(R):
        if k * T < left:
            var h = regs.slice[V, offset=k * V]().cast[acc]()
            y.unsafe_offset(e0 + k * T * V).unsafe_store[alignment=16](
                (h * per_held).cast[dtype]()
            )
    var first_smem = p.head + R * T * V
    for e in range(e0 + R * T * V, p.head + p.nvec * V, T * V):
        var h = smem.unsafe_offset(e - first_smem).unsafe_load[
            width=V, alignment=16
        ]()
        y.unsafe_offset(e).unsafe_store[alignment=16](
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
    var u: ClassWeights
    """The class weights (or 1)."""
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
        u: ClassWeights,
    ):
        """Empty sums for a row with these terms."""
        self.cap = cap
        self.row_max = row_max
        self.smoothing = smoothing
        self.u = u
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
            if self.u.weighted:
                var u = self.u.at[acc, w](e)
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
    var u: ClassWeights
    """The smoothing term's class weights (or 1)."""

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
        u: ClassWeights,
    ):
        """The gradient map of a row with these terms."""
        self.cap = cap
        self.row_max = row_max
        self.p_factor = p_factor
        self.smooth = smooth
        self.target_term = target_term
        self.scale = scale
        self.tgt = tgt
        self.u = u

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
            if self.u.weighted:
                g -= self.u.at[acc, w](e) * self.smooth
            else:
                g -= self.smooth
        if self.tgt >= e and self.tgt < e + w:
            comptime for k in range(w):
                if self.tgt == e + k:
                    g[k] -= self.target_term
        return (g * self.scale * self.cap.chain[w](y)).cast[Self.dtype]()
