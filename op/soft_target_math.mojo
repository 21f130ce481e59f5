"""Cross-entropy against class probabilities (soft targets): the row math
every target shares, and the options' layout.

Per row of C classes, with label smoothing eps and class weights w (1
without): q_j = ((1 - eps) p_j + eps / C) w_j, S = sum_j q_j. The loss is
S lse - sum_j q_j x_j + z lse^2 and d loss / d x_j = (S + 2 z lse)
softmax_j - q_j. A row's statistics are (m, s, S, T): the max of x, the sum
of exp(x - m), S, and T = sum_j q_j (x_j - m), so the loss is S log s - T
+ z lse^2: each q_j (x_j - m) is the term torch sums (q times log-softmax
but for the row's constant), with no cancellation between S lse and
sum q x for large logits.

`options` is float64 on the op's device: (eps, z_loss), then the C class
weights where weighted (length SOFT_OPTIONS + C). The host knows the
length without a sync, so it tells whether the kernels read weights.
"""

from std.math import log

from .cross_entropy_math import plus_z_loss
from .gpu_launch import HeldRows, held, kernel_arg
from .row_math import exp_nan

comptime SOFT_OPTIONS = 2
"""Options before the class weights: eps, z_loss."""


def soft_weighted(n_options: Int, n: Int) raises -> Bool:
    """Whether options of length `n_options` carry class weights for rows
    of `n`: SOFT_OPTIONS values, or those and `n` weights; anything else
    raises."""
    if n_options == SOFT_OPTIONS:
        return False
    if n_options == SOFT_OPTIONS + n:
        return True
    raise Error(
        t"max_softmax: soft_cross_entropy options hold {SOFT_OPTIONS} values"
        t" (eps, z_loss) and optionally {n} class weights, got {n_options}"
    )


@always_inline
def soft_scale[acc: DType, mean: Bool](rows: Int) -> Scalar[acc]:
    """The reduction's factor on the gradient: 1 / rows for "mean"."""
    comptime if mean:
        return Scalar[acc](1) / Scalar[acc](rows)
    return Scalar[acc](1)


struct SoftTargets[acc: DType](ImplicitlyCopyable):
    """What every target reads of the options to make a row's targets q
    from its probabilities (`q`, `q_at`): label smoothing and class
    weights."""

    var weights: HeldRows[DType.float64]
    """The class weights (read where `weighted`)."""
    var weighted: Bool
    """Whether the options carry class weights."""
    var keep: Scalar[Self.acc]
    """1 - eps."""
    var smooth: Scalar[Self.acc]
    """eps / C."""

    @always_inline
    def __init__(
        out self,
        options: Pointer[Float64, MutAnyOrigin],
        weighted: Bool,
        eps: Scalar[Self.acc],
        n: Int,
    ):
        """The targets of rows of `n` under `options` (eps, z_loss[, n
        class weights]), `eps` their first value as the caller read it (a
        caller that reads the options itself keeps one read of eps)."""
        self.weights = held(options.unsafe_offset(SOFT_OPTIONS))
        self.weighted = weighted
        self.keep = 1 - eps
        self.smooth = eps / Scalar[Self.acc](n)

    @always_inline
    def __init__(
        out self,
        options: Pointer[Float64, MutAnyOrigin],
        weighted: Bool,
        n: Int,
    ):
        """The targets of rows of `n` under `options` (eps, z_loss[, n
        class weights])."""
        self.weights = held(options.unsafe_offset(SOFT_OPTIONS))
        self.weighted = weighted
        var eps = options[unsafe_offset=0].cast[Self.acc]()
        self.keep = 1 - eps
        self.smooth = eps / Scalar[Self.acc](n)

    @always_inline
    def weight[w: Int](self, c: Int) -> SIMD[Self.acc, w]:
        """The class weights at classes c ..< c + w (1 unweighted)."""
        var weight = SIMD[Self.acc, w](1)
        if self.weighted:
            weight = (
                kernel_arg(self.weights)
                .unsafe_offset(c)
                .unsafe_load[width=w]()
                .cast[Self.acc]()
            )
        return weight

    @always_inline
    def _q[
        w: Int
    ](self, p: SIMD[Self.acc, w], weight: SIMD[Self.acc, w]) -> SIMD[
        Self.acc, w
    ]:
        """q = (keep p + smooth) weight."""
        return (p * self.keep + self.smooth) * weight

    @always_inline
    def q[w: Int](self, p: SIMD[Self.acc, w], c: Int) -> SIMD[Self.acc, w]:
        """The targets q of the w probabilities at classes c ..< c + w:
        (keep p + smooth) weight, keep = 1 - eps and smooth = eps / C."""
        return self._q[w](p, self.weight[w](c))

    @always_inline
    def q_at[
        dtype: DType
    ](self, p: Pointer[Scalar[dtype], MutAnyOrigin], c: Int) -> Scalar[
        Self.acc
    ]:
        """The target q at class c of a row (`p` its probabilities), the
        weight read before the probability."""
        var weight = self.weight[1](c)
        return self._q[1](p[unsafe_offset=c].cast[Self.acc](), weight)[0]


@always_inline
def soft_row_loss[
    acc: DType
](
    m: Scalar[acc],
    s: Scalar[acc],
    sum_q: Scalar[acc],
    t: Scalar[acc],
    z_loss: Scalar[acc],
) -> Scalar[acc]:
    """A row's loss from its statistics: S log s - T (+ z lse^2)."""
    comptime assert acc.is_floating_point()
    var log_s = log(s)
    return plus_z_loss[acc](sum_q * log_s - t, z_loss, m, log_s)


@always_inline
def soft_p_factor[
    acc: DType
](
    m: Scalar[acc], s: Scalar[acc], sum_q: Scalar[acc], z_loss: Scalar[acc]
) -> Scalar[acc]:
    """What softmax_j is multiplied by in the gradient, over s (so the
    gradient is exp(x_j - m) times this, less q_j): (S + 2 z lse) / s."""
    comptime assert acc.is_floating_point()
    var factor = sum_q
    if z_loss != 0:
        factor += 2 * z_loss * (m + log(s))
    return factor / s


@always_inline
def soft_grad[
    acc: DType, w: Int
](
    x: SIMD[acc, w],
    q: SIMD[acc, w],
    m: Scalar[acc],
    p_factor: Scalar[acc],
    scale: Scalar[acc],
) -> SIMD[acc, w]:
    """d loss / d x: (exp(x - m) p_factor - q) scale."""
    return (exp_nan[acc, w](x - m) * p_factor - q) * scale


@fieldwise_init
struct SoftStats[acc: DType](ImplicitlyCopyable):
    """A row's statistics, or a part's: the max m, s = sum of exp(x - m),
    S = sum of q and T = sum of q (x - m)."""

    var m: Scalar[Self.acc]
    """The max (-inf before any element)."""
    var s: Scalar[Self.acc]
    """Sum of exp(x - m)."""
    var sum_q: Scalar[Self.acc]
    """S."""
    var t: Scalar[Self.acc]
    """T."""

    @always_inline
    def shift(mut self, m_to: Scalar[Self.acc]):
        """Move s and T to the max `m_to` (>= m): s exp(m - m_to),
        T + S (m - m_to). A part with nothing in it (s = 0, S = 0) keeps
        its sums (its max may be -inf)."""
        soft_shift[Self.acc](self.m, m_to, self.s, self.sum_q, self.t)
        self.m = m_to

    @always_inline
    def add(mut self, x: Scalar[Self.acc], q: Scalar[Self.acc]):
        """Fold one element (x, q) in online: a larger x moves s and T to
        it first."""
        soft_add[Self.acc](x, q, self.m, self.s, self.sum_q, self.t)

    @always_inline
    def add_held[w: Int](mut self, x: SIMD[Self.acc, w], q: SIMD[Self.acc, w]):
        """Add the terms of w elements (x, q) under the row's max m."""
        var d = x - self.m
        self.s += exp_nan[Self.acc, w](d).reduce_add()
        self.sum_q += q.reduce_add()
        self.t += (q * d).reduce_add()

    @always_inline
    def loss(self, z_loss: Scalar[Self.acc]) -> Scalar[Self.acc]:
        """The row's loss (`soft_row_loss`)."""
        return soft_row_loss[Self.acc](
            self.m, self.s, self.sum_q, self.t, z_loss
        )

    @always_inline
    def p_factor(self, z_loss: Scalar[Self.acc]) -> Scalar[Self.acc]:
        """The row's `soft_p_factor`."""
        return soft_p_factor[Self.acc](self.m, self.s, self.sum_q, z_loss)


@always_inline
def soft_shift[
    acc: DType
](
    m_from: Scalar[acc],
    m_to: Scalar[acc],
    mut s: Scalar[acc],
    sum_q: Scalar[acc],
    mut t: Scalar[acc],
):
    """Move a part's sum of exp `s` and its T from its max `m_from` to the
    row's `m_to` (>= m_from): s exp(m_from - m_to), T + S (m_from - m_to).
    A part with nothing in it (s = 0, S = 0) stays as it is (its max may
    be -inf)."""
    if m_from != m_to:
        if s != 0:
            s = s * exp_nan[acc, 1](m_from - m_to)
        if sum_q != 0:
            t += sum_q * (m_from - m_to)


@always_inline
def soft_add[
    acc: DType
](
    x: Scalar[acc],
    q: Scalar[acc],
    mut m: Scalar[acc],
    mut s: Scalar[acc],
    mut sum_q: Scalar[acc],
    mut t: Scalar[acc],
):
    """Fold one element (x, q) into running statistics (online: a larger x
    moves s and T to it first)."""
    if x > m:
        soft_shift[acc](m, x, s, sum_q, t)
        m = x
    s += exp_nan[acc, 1](x - m)
    sum_q += q
    t += q * (x - m)
