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
def soft_q[
    acc: DType, w: Int
](
    p: SIMD[acc, w],
    weight: SIMD[acc, w],
    keep: Scalar[acc],
    smooth: Scalar[acc],
) -> SIMD[acc, w]:
    """q = (keep p + smooth) weight, keep = 1 - eps and smooth = eps / C."""
    return (p * keep + smooth) * weight


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
    var row = sum_q * log_s - t
    if z_loss != 0:
        var lse = m + log_s
        row += z_loss * lse * lse
    return row


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
