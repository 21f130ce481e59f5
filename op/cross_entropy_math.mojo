"""Numerics of the fused cross-entropy, shared by its CPU and GPU kernels.

For a row x of V logits, target t and label smoothing eps (torch's
`F.cross_entropy` with class-index targets), with m = max(x) and
s = sum(exp(x - m)):

    loss = log(s) + (1 - eps) * (m - x[t]) + eps * (m - sum(x) / V)
    dlogits[c] = (exp(x[c] - m) / s - eps / V - (1 - eps) * [c == t]) * scale

(loss = logsumexp(x) - (1 - eps) x[t] - eps/V sum(x), written with
differences from the max so that x[t] == m gives log(s) exactly.) `scale`
is 1 for "sum" and "none", 1 / (rows kept) for "mean". Rows whose target
is `ignore_index` have loss 0 and gradient 0 and are not counted. A row
holding NaN or +inf, or only -inf, has a NaN loss and gradient, as in torch.

The kernels get `ignore_index` and `eps` at run time from a small float64
tensor, `options` = (ignore_index, eps), so one compiled model serves every
value; on the GPU the kernels read it on the device (no host sync).
"""

from std.math import exp, exp2, log, tanh
from std.sys import is_gpu, llvm_intrinsic

# What a row's target means (`target_kind`).
comptime KEPT = 0
comptime IGNORED = 1
comptime OUT_OF_RANGE = 2


@always_inline
def target_kind(t: Int64, ignore_index: Int64, n: Int) -> Int:
    """KEPT, IGNORED (t == ignore_index) or OUT_OF_RANGE (t outside [0, n))."""
    if t == ignore_index:
        return IGNORED
    if t < 0 or t >= Int64(n):
        return OUT_OF_RANGE
    return KEPT


def checked_target_kind(
    t: Int64, row: Int, ignore_index: Int64, n: Int
) raises -> Int:
    """`target_kind` of row `row`'s target `t`, raising (naming the row) for
    OUT_OF_RANGE: the CPU ops have the targets on the host, so a bad one
    stops the op before any output is written."""
    var kind = target_kind(t, ignore_index, n)
    if kind == OUT_OF_RANGE:
        raise Error(
            "max_softmax: cross_entropy target "
            + String(t)
            + " at row "
            + String(row)
            + " is out of range for "
            + String(n)
            + " classes (and is not ignore_index "
            + String(ignore_index)
            + ")"
        )
    return kind


@always_inline
def row_loss[
    acc: DType
](
    m: Scalar[acc],
    s: Scalar[acc],
    x_t: Scalar[acc],
    sum_x: Scalar[acc],
    eps: Scalar[acc],
    n: Int,
) -> Scalar[acc]:
    """The loss of one kept row from its max `m`, sum of exp(x - m) `s`,
    target logit `x_t` and (only read when eps != 0) logit sum `sum_x`."""
    comptime assert acc.is_floating_point()
    # Mojo's log does not keep NaN as NaN on the CPU.
    var log_s = s if s != s else log(s)
    var loss = log_s + (m - x_t)
    if eps != 0:
        # Not folded into the eps == 0 case: 0 * sum(x) is NaN for a row
        # holding -inf, where torch (no smoothing) gives a finite loss.
        loss = (
            log_s + (1 - eps) * (m - x_t) + eps * (m - sum_x / Scalar[acc](n))
        )
    return loss


@always_inline
def smoothing_of[acc: DType](eps: Scalar[acc], n: Int) -> Scalar[acc]:
    """eps / V: what every class's gradient loses to label smoothing."""
    return eps / Scalar[acc](max(n, 1))


@always_inline
def grad_of[
    acc: DType, w: Int
](
    e: SIMD[acc, w],
    inv_s: Scalar[acc],
    smooth: Scalar[acc],
    scale: Scalar[acc],
) -> SIMD[acc, w]:
    """The gradient of non-target classes from their exp(x - m) `e`: (e / s
    - eps / V) * scale. The target class then loses (1 - eps) * scale
    (`target_grad`)."""
    return (e * inv_s - smooth) * scale


@always_inline
def target_grad[
    acc: DType
](
    p_t: Scalar[acc],
    smooth: Scalar[acc],
    eps: Scalar[acc],
    scale: Scalar[acc],
) -> Scalar[acc]:
    """The target class's gradient from its probability `p_t`."""
    return (p_t - smooth - (1 - eps)) * scale


# The extended options (z-loss, softcap, class weights): `options` is then
# (ignore_index, eps, z_loss, softcap), then with class weights a weight a
# class w_0 .. w_{V-1} and WEIGHTS_MARK zeros, then 0-3 zeros of hints,
# float64. A length of 2 is the plain loss above (the kernels the options
# leave untouched). The device holds the values; the length is all the
# host sees without a sync, so what picks a kernel rides in it: whether
# there are weights (a length past MAX_UNWEIGHTED: the mark keeps every
# weighted length there, whatever V), and the hints, `HINT_NO_SOFTCAP` and
# `HINT_NO_WEIGHTED_SMOOTHING`, each set only where it holds, so the pass
# can take the plain kernel's code with scalar terms (`ExtendedLayout`).
# A length without hints runs the kernel that serves every option.
comptime PLAIN_OPTIONS = 2
comptime EXTENDED_OPTIONS = 4
comptime WEIGHTS_MARK = 4
comptime HINT_NO_SOFTCAP = 1
comptime HINT_NO_WEIGHTED_SMOOTHING = 2
comptime ALL_HINTS = HINT_NO_SOFTCAP | HINT_NO_WEIGHTED_SMOOTHING
comptime MAX_UNWEIGHTED = EXTENDED_OPTIONS + ALL_HINTS

# What a GPU row folds and writes beside the plain loss (a kernel's
# compile-time `terms`): nothing (NO_TERMS, PLAIN_OPTIONS); of extended
# options, their scalar terms alone, z-loss (Z_TERMS) or z-loss and the
# target's class weight (WEIGHTED_TERMS), over the plain loss's sweeps; or
# every option (OPTION_TERMS: a softcap, class weights inside the smoothing
# term), over sweeps of their own.
comptime NO_TERMS = 0
comptime Z_TERMS = 1
comptime WEIGHTED_TERMS = 2
comptime OPTION_TERMS = 3


@fieldwise_init
struct ExtendedLayout(ImplicitlyCopyable):
    """What the length of extended options says (`extended_layout`)."""

    var weighted: Bool
    """A class weight a class follows the four values."""
    var hints: Int
    """`HINT_*` bits: terms the options promise to leave out."""

    def terms(self) -> Int:
        """The terms the options hold: without a softcap and a class weight
        inside the smoothing term (both hints), only a row's scalars
        (Z_TERMS, WEIGHTED_TERMS: z-loss, the target's weight), which the
        plain on-chip sweeps take; else OPTION_TERMS."""
        if self.hints != ALL_HINTS:
            return OPTION_TERMS
        return WEIGHTED_TERMS if self.weighted else Z_TERMS


def extended_layout(n_options: Int, n: Int) raises -> ExtendedLayout:
    """Read `n_options`, the length of extended options for rows of `n`
    classes; raise unless it is a layout above: the check the CPU op and
    the GPU launch make before anything runs."""
    var hints = n_options - EXTENDED_OPTIONS
    var weighted = n_options > MAX_UNWEIGHTED
    if weighted:
        hints = n_options - EXTENDED_OPTIONS - n - WEIGHTS_MARK
    if hints < 0 or hints > ALL_HINTS:
        raise Error(
            "max_softmax: cross_entropy options must hold 4 values (and 0-3"
            " hints), or with class weights 4 + "
            + String(n)
            + " + 4 (and 0-3 hints), got "
            + String(n_options)
        )
    return ExtendedLayout(weighted, hints)


@always_inline
def softcap_of[
    acc: DType, w: Int
](x: SIMD[acc, w], cap: Scalar[acc]) -> SIMD[acc, w]:
    """Gemma 2's logit softcap, cap * tanh(x / cap), or x where cap is 0."""
    comptime assert acc.is_floating_point()
    if cap == 0:
        return x
    return exact_tanh[acc, w](x / cap) * cap


# Where `exact_tanh` leaves its polynomial for the exp form on the GPU.
# float32: z + z^3 P(z^2), P the cubic below, fitted for relative error on
# |z| <= 0.5 (1.5e-8 in exact arithmetic, 0.81 ulp in float32 FMA Horner
# form, by numpy emulation against float64), where the exp form, which
# loses about eps / |z|, is within 7.4 ulps (ex2.approx and rcp.approx
# emulated at their worst): 4.2 x 2^-24 absolute at most, where the Taylor
# series to z^13 with a switch at 0.1 reached 44 ulps (5.5 x 2^-24).
# float64 keeps that series (exact to its precision) to |z| = 0.1.
comptime TANH_POLY_F32 = 0.5
comptime TANH_SERIES_F64 = 0.1
comptime TANH_CUBIC_F32 = (
    Float32(-0.333331435918808),
    Float32(0.13325892388820648),
    Float32(-0.0530465692281723),
    Float32(0.01724393293261528),
)
comptime TWO_LOG2E = 2.8853900817779268


@always_inline
def _tanh_poly[
    acc: DType, w: Int
](z: SIMD[acc, w], s: SIMD[acc, w]) -> SIMD[acc, w]:
    """tanh(z) near 0 (s = z^2): the fitted cubic in float32 and narrower
    types, in float64 the Taylor series to z^13 (their errors: the comment
    above `TANH_POLY_F32`)."""
    var c: SIMD[acc, w]
    comptime if acc == DType.float64:
        c = SIMD[acc, w](21844.0 / 6081075.0)
        c = c * s - 1382.0 / 155925.0
        c = c * s + 62.0 / 2835.0
        c = c * s - 17.0 / 315.0
        c = c * s + 2.0 / 15.0
        c = c * s - 1.0 / 3.0
    else:
        c = SIMD[acc, w](TANH_CUBIC_F32[3].cast[acc]())
        c = c * s + TANH_CUBIC_F32[2].cast[acc]()
        c = c * s + TANH_CUBIC_F32[1].cast[acc]()
        c = c * s + TANH_CUBIC_F32[0].cast[acc]()
    return z + z * s * c


@always_inline
def exact_tanh[acc: DType, w: Int](z: SIMD[acc, w]) -> SIMD[acc, w]:
    """tanh to a few ulps on every target. The GPU's `tanh` is
    `tanh.approx.f32` (about 2^-11 relative: softcapped float32 gradients
    were ~2e-5 off torch's on the H100), float32 precision for float64 too;
    there it comes from an odd polynomial below |z| = `TANH_POLY_F32`
    (float64: `TANH_SERIES_F64`; `_tanh_poly`) and beyond it from the
    identity 1 - 2 / (e^2|z| + 1) (`_reciprocal`). A vector whose values
    all lie in the polynomial's range skips the exp form (its ex2 and rcp,
    the SFU's, and a dozen issue slots an element), as do the warps whose
    threads all do. The CPU's `tanh` is exact already."""
    comptime assert acc.is_floating_point()
    comptime if not is_gpu():
        return tanh(z)
    comptime bound = (
        TANH_SERIES_F64 if acc == DType.float64 else TANH_POLY_F32
    )
    var s = z * z
    var small = _tanh_poly[acc, w](z, s)
    # A NaN stays NaN on either path.
    if s.reduce_max() < Scalar[acc](bound * bound):
        return small
    var a = abs(z)
    var e: SIMD[acc, w]
    comptime if acc == DType.float32:
        e = exp2(a * Scalar[acc](TWO_LOG2E))
    else:
        e = exp(2 * a)
    var big = 1 - 2 * _reciprocal(e + 1)
    big = z.lt(0).select(-big, big)
    return s.lt(Scalar[acc](bound * bound)).select(small, big)


@always_inline
def _reciprocal[acc: DType, w: Int](d: SIMD[acc, w]) -> SIMD[acc, w]:
    """1 / d for d >= 1 on the GPU: float32 by `rcp.approx` (within an ulp,
    one instruction, where an IEEE division is a dozen with a slow path; the
    softcap takes two a logit), other types by division."""
    comptime if acc == DType.float32 and is_gpu():
        var r = SIMD[acc, w](0)
        comptime for k in range(w):
            r[k] = llvm_intrinsic[
                "llvm.nvvm.rcp.approx.ftz.f", Float32, has_side_effect=False
            ](rebind[Float32](d[k])).cast[acc]()
        return r
    return 1 / d


@always_inline
def softcap_chain[
    acc: DType, w: Int
](y: SIMD[acc, w], cap: Scalar[acc]) -> SIMD[acc, w]:
    """d softcap / dx at the capped value `y`: 1 - tanh^2 = 1 - (y / cap)^2
    (1 where cap is 0)."""
    if cap == 0:
        return SIMD[acc, w](1)
    var r = y / cap
    return 1 - r * r


@always_inline
def extended_row_loss[
    acc: DType
](
    m: Scalar[acc],
    s: Scalar[acc],
    y_t: Scalar[acc],
    w_t: Scalar[acc],
    su: Scalar[acc],
    suy: Scalar[acc],
    eps: Scalar[acc],
    z_loss: Scalar[acc],
    n: Int,
) -> Scalar[acc]:
    """The loss of one kept row under the extended options, from the capped
    logits y: max `m`, sum of exp(y - m) `s`, target logit `y_t`, the
    target's weight `w_t` and (only read when eps != 0) the weight sum `su`
    = sum_c w_c and `suy` = sum_c w_c y_c (w = 1 without weights):

        w_t (lse - y_t) (1 - eps) + eps / V sum_c w_c (lse - y_c)
            + z_loss lse^2,   lse = m + log(s)."""
    comptime assert acc.is_floating_point()
    var log_s = s if s != s else log(s)
    var loss = w_t * (log_s + (m - y_t))
    if eps != 0:
        loss = (1 - eps) * loss + eps / Scalar[acc](n) * (
            su * log_s + (su * m - suy)
        )
    return plus_z_loss[acc](loss, z_loss, m, log_s)


@always_inline
def plus_z_loss[
    acc: DType
](
    loss: Scalar[acc], z_loss: Scalar[acc], m: Scalar[acc], log_s: Scalar[acc]
) -> Scalar[acc]:
    """A row's `loss` plus its z-loss term z_loss lse^2 (lse = m + log_s,
    `log_s` the log of the row's sum of exp(x - m)): the one form of the
    term, for class-index and soft targets alike. Skipped for z_loss = 0,
    so a row whose lse is inf or NaN keeps its loss."""
    if z_loss != 0:
        var lse = m + log_s
        return loss + z_loss * lse * lse
    return loss


@always_inline
def extended_p_factor[
    acc: DType
](
    m: Scalar[acc],
    s: Scalar[acc],
    w_t: Scalar[acc],
    su: Scalar[acc],
    eps: Scalar[acc],
    z_loss: Scalar[acc],
    n: Int,
) -> Scalar[acc]:
    """What multiplies p_c in a kept row's gradient: (1 - eps) w_t
    + eps / V sum_c w_c + 2 z_loss lse. The gradient of class c is then
    (p_c * factor - eps / V w_c - [c == t] (1 - eps) w_t) * scale, times
    the softcap's chain factor."""
    comptime assert acc.is_floating_point()
    var a = (1 - eps) * w_t
    if eps != 0:
        a += eps / Scalar[acc](n) * su
    if z_loss != 0:
        var log_s = s if s != s else log(s)
        a += 2 * z_loss * (m + log_s)
    return a
