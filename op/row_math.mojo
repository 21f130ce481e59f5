"""Numerics shared by every softmax kernel, CPU and GPU.

All kernels accumulate in `accum_dtype[dtype]()` (float32 for the 16-bit
types and float32, float64 for float64) and agree on these semantics, the
same as `scipy.special.softmax`:

- a row holding NaN or +inf is all NaN;
- a row of only -inf is all NaN;
- otherwise -inf entries give exactly 0 and huge finite values are fine,
  because the row max is subtracted before `exp`.
"""

from std.math import exp, floor, isnan, log
from std.sys import CompilationTarget, llvm_intrinsic, size_of
from std.sys.info import is_nvidia_gpu
from std.utils.numerics import inf, min_finite, nan


def accum_dtype[dtype: DType]() -> DType:
    """The type kernels compute in: float64 for float64, else float32."""
    comptime if dtype == DType.float64:
        return DType.float64
    else:
        return DType.float32


def vector_width[dtype: DType]() -> Int:
    """Elements in one 16-byte load of `dtype`."""
    return 16 // size_of[dtype]()


@always_inline
def load_widened[
    V: Int, dtype: DType
](p: Pointer[Scalar[dtype], address_space=_, ...], e: Int) -> SIMD[
    accum_dtype[dtype](), V
]:
    """The aligned 16-byte vector at `p + e` (global or shared memory),
    widened to the accumulation type: how the GPU sweeps read a vector
    they fold, written once so every sweep reads it the same way."""
    return (
        p.unsafe_offset(e)
        .unsafe_load[width=V, alignment=16]()
        .cast[accum_dtype[dtype]()]()
    )


@always_inline
def exp_nan[acc: DType, w: Int](x: SIMD[acc, w]) -> SIMD[acc, w]:
    """`exp(x)` that keeps NaN as NaN.

    Mojo's vectorized `exp` maps NaN to inf on the CPU; a NaN in a row must
    instead make its sum, and so the whole row, NaN. On NVIDIA GPUs `exp`
    of float32 is `ex2.approx`, which keeps NaN, so the check (two
    instructions an element, next to one for the exp) is left out.
    """
    comptime assert acc.is_floating_point()
    comptime if is_nvidia_gpu() and acc == DType.float32:
        return exp(x)
    return isnan(x).select(x, exp(x))


# 2^f on [0, 1): a degree-5 polynomial fitted for relative error (2.1e-7
# at most in float32 Horner form, checked against float64).
comptime EXP2_POLY = (
    Float32(1.0),
    Float32(0.6931532025337219),
    Float32(0.24015308916568756),
    Float32(0.05582703649997711),
    Float32(0.008989186026155949),
    Float32(0.001877413596957922),
)


@always_inline
def exp_lean[w: Int](x: SIMD[DType.float32, w]) -> SIMD[DType.float32, w]:
    """`exp(x)` for results that are rounded to 16 bits, in 10 vector
    instructions on AVX-512 (`exp` takes 14, with its NaN select 16).

    2^t with t = x·log2(e): a polynomial for the fraction, `vscalefps` for
    the power. Relative error ≤ 2.1e-7 from the polynomial plus t's rounding
    (≤ 2^-24·|t|·ln 2: 1e-6 at x = -16, where exp(x) is 1e-7), against
    2^-9 and 2^-11 for one ulp of bfloat16 and float16. NaN stays NaN
    (comparisons with NaN are false); -inf gives 2^-200, which is 0. Without
    AVX-512, and for widths other than 16, it is `exp_nan`.
    """
    comptime if CompilationTarget.has_avx512f() and w == 16:
        var t = x * Float32(1.4426950408889634)
        t = t.lt(-200).select(SIMD[DType.float32, w](-200), t)
        var n = floor(t)
        var f = t - n
        var p = SIMD[DType.float32, w](EXP2_POLY[5])
        comptime for k in range(4, -1, -1):
            p = p * f + EXP2_POLY[k]
        return llvm_intrinsic[
            "llvm.x86.avx512.mask.scalef.ps.512",
            SIMD[DType.float32, w],
            has_side_effect=False,
        ](p, n, SIMD[DType.float32, w](0), Int16(-1), Int32(4))
    return exp_nan[DType.float32, w](x)


@always_inline
def row_exp[acc: DType, W: Int, lean: Bool](d: SIMD[acc, W]) -> SIMD[acc, W]:
    """exp(d) for a row sweep: by `exp_lean` where `lean` (16-bit softmax,
    float32 inside), else by `exp_nan`."""
    comptime if lean:
        return rebind[SIMD[acc, W]](exp_lean(rebind[SIMD[DType.float32, W]](d)))
    return exp_nan[acc, W](d)


@always_inline
def exp_diff[
    acc: DType, w: Int
](a: SIMD[acc, w], b: SIMD[acc, w]) -> SIMD[acc, w]:
    """`exp(a - b)`, but exactly 1 where `a == b`.

    The online algorithm rescales its running sum by `exp(old_max -
    new_max)` and adds `exp(x - new_max)`. While the row has seen only
    -inf both are `exp(-inf - -inf) = exp(NaN)`; treating equal values as
    a difference of 0 keeps a row like [-inf, -inf, 1] finite. NaN never
    compares equal, so NaN still propagates.
    """
    comptime assert acc.is_floating_point()
    return a.eq(b).select(SIMD[acc, w](1), exp_nan[acc, w](a - b))


@always_inline
def sum_shift[acc: DType](m: Scalar[acc]) -> Scalar[acc]:
    """What exp is shifted by in a sum of exp(x - max) over values whose max
    is `m`: `m`, except that a max of -inf (only -inf seen, or NaN) shifts
    by the lowest finite value, so that its values give exp(-inf) = 0
    rather than exp(-inf - -inf) = NaN. Such a pair (-inf, 0) folds like
    any other (`fold_pair`); a max of +inf makes the row NaN anyway
    (`online_sum_guard`).
    """
    comptime assert acc.is_floating_point()
    return max(m, min_finite[acc]())


@always_inline
def online_add[
    acc: DType, w: Int
](m: Scalar[acc], s: Scalar[acc], v: SIMD[acc, w]) -> Tuple[
    Scalar[acc], Scalar[acc]
]:
    """Add values `v` to the online pair (max, sum of exp(x - max)).

    Only the one rescale a call goes through `exp_diff`; the values are
    shifted by `sum_shift`, which costs one instruction a call instead of
    a compare and a select an element.
    """
    var new_m = max(m, v.reduce_max())
    return (
        new_m,
        s * exp_diff[acc, 1](m, new_m)
        + exp_nan[acc, w](v - sum_shift[acc](new_m)).reduce_add(),
    )


@always_inline
def fold_pair[
    acc: DType
](
    m: Scalar[acc], s: Scalar[acc], part_m: Scalar[acc], part_s: Scalar[acc]
) -> Tuple[Scalar[acc], Scalar[acc]]:
    """Fold one online pair (max, sum of exp(x - max)) into another."""
    var new_m = max(m, part_m)
    return (
        new_m,
        s * exp_diff[acc, 1](m, new_m)
        + part_s * exp_diff[acc, 1](part_m, new_m),
    )


@always_inline
def online_sum_guard[
    acc: DType
](row_max: Scalar[acc], sum: Scalar[acc]) -> Scalar[acc]:
    """The online sum, made NaN where the three-pass algorithm gives NaN.

    With `exp_diff`, a row whose max is +inf (or only -inf) gets a finite
    sum; SciPy's three-pass softmax gives NaN there (inf - inf), so we do
    too.
    """
    if row_max == inf[acc]() or row_max == -inf[acc]():
        return nan[acc]()
    return sum


@always_inline
def row_scale[
    log_out: Bool, acc: DType, w: Int = 1
](sum: SIMD[acc, w]) -> SIMD[acc, w]:
    """What the epilogue needs from the row sum: 1/sum, or log(sum)."""
    comptime assert acc.is_floating_point()
    comptime if log_out:
        # Like exp, Mojo's log does not keep NaN as NaN on the CPU.
        return isnan(sum).select(sum, log(sum))
    else:
        return 1 / sum


@always_inline
def epilogue[
    log_out: Bool, acc: DType, w: Int
](x: SIMD[acc, w], row_max: SIMD[acc, w], scale: SIMD[acc, w]) -> SIMD[acc, w]:
    """Softmax: exp(x - max) / sum; log-softmax: (x - max) - log(sum).

    `scale` comes from `row_scale`. For log_softmax the max is subtracted
    before log(sum) so that x == max gives -log(sum) exactly, even when
    max is 1e30.
    """
    comptime assert acc.is_floating_point()
    comptime if log_out:
        return (x - row_max) - scale
    else:
        return exp_nan[acc, w](x - row_max) * scale


# Backward ops. With a = y (softmax) or log p (log-softmax), g = dy:
#   softmax_backward:     dx = y * (dy - sum(dy * y))
#   log_softmax_backward: dx = dy - exp(logp) * sum(dy)


@always_inline
def backward_term[
    log_in: Bool, acc: DType, w: Int
](a: SIMD[acc, w], g: SIMD[acc, w]) -> SIMD[acc, w]:
    """What the backward ops sum along the row: dy * y, or dy."""
    comptime if log_in:
        return g
    else:
        return g * a


@always_inline
def backward_out[
    log_in: Bool, acc: DType, w: Int
](a: SIMD[acc, w], g: SIMD[acc, w], s: SIMD[acc, w]) -> SIMD[acc, w]:
    """The gradient from a, dy and the row sum of `backward_term`."""
    comptime assert acc.is_floating_point()
    comptime if log_in:
        return g - exp_nan(a) * s
    else:
        return a * (g - s)


# Scaled, masked and causal softmax (softmax_masked, log_softmax_masked).
# Each value is z = x * scale + mask, or -inf where the additive mask is
# -inf (a dropped position: x there is not looked at, so a NaN or inf under
# the mask drops too). A row with nothing kept (its max is -inf) gives 0
# (softmax) or -inf (log-softmax) everywhere instead of NaN, as torch's
# attention does; NaN and +inf among the kept values still make the row NaN.


@always_inline
def masked_value[
    acc: DType, w: Int
](x: SIMD[acc, w], scale: Scalar[acc], mask: SIMD[acc, w]) -> SIMD[acc, w]:
    """`x * scale + mask`, or -inf where `mask` is -inf (dropped)."""
    comptime assert acc.is_floating_point()
    return mask.eq(-inf[acc]()).select(
        SIMD[acc, w](-inf[acc]()), x * scale + mask
    )


@always_inline
def masked_row_scale[
    log_out: Bool, acc: DType
](sum: Scalar[acc], row_max: Scalar[acc]) -> Scalar[acc]:
    """`row_scale`, but 0 for a row with nothing kept (its max is -inf):
    `masked_epilogue` then gives exp(-inf) * 0 = 0 for softmax and -inf - 0
    = -inf for log-softmax. (The sum is not the test: the CPU's vector exp
    of -inf is 4e-39, not 0.) A NaN sum (NaN kept: the CPU's max leaves it
    out) keeps the row NaN."""
    if row_max == -inf[acc]() and not isnan(sum):
        return 0
    return row_scale[log_out, acc](sum)


@always_inline
def masked_epilogue[
    log_out: Bool, acc: DType, w: Int
](z: SIMD[acc, w], shift: Scalar[acc], scale: Scalar[acc]) -> SIMD[acc, w]:
    """Softmax exp(z - shift) * scale, or log-softmax (z - shift) - scale,
    with `shift` = `sum_shift(row max)` and `scale` from `masked_row_scale`.
    """
    comptime assert acc.is_floating_point()
    comptime if log_out:
        return (z - shift) - scale
    else:
        return exp_nan[acc, w](z - shift) * scale
