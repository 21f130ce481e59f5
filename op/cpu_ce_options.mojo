"""CPU cross-entropy under the extended options (z-loss, softcap, class
weights), multithreaded over whole rows as cpu_cross_entropy: a pass over
the capped logits for the row's max, sum of exp and (label smoothing) the
weighted sums, then, with the gradient, one pass writing it.
`cross_entropy_cpu` checks the targets and sends the rows here for more
than PLAIN_OPTIONS options; the plain loss never comes here.

`options` is (ignore_index, eps, z_loss, softcap[, V class weights]) and
hints the CPU does not need, on the host; see cross_entropy_math for the
layout and the row math.
"""

from .cpu_cross_entropy import LossRow, loss_rows_in_tasks
from .cross_entropy_math import (
    EXTENDED_OPTIONS,
    extended_p_factor,
    extended_row_loss,
    softcap_chain,
    softcap_of,
)
from .cross_entropy_ops import CrossEntropyCall
from .gpu_launch import kernel_arg
from .row_math import accum_dtype, exp_nan, online_sum_guard


def cross_entropy_options_rows[
    dtype: DType, with_grad: Bool, reduction: StaticString
](
    call: CrossEntropyCall[dtype, with_grad, reduction],
    has_weight: Bool,
    kept: Float64,
) raises:
    """The rows of `cross_entropy_cpu` under extended options, its targets
    checked: `has_weight` whether the options hold class weights, `kept`
    the sum over kept rows of w[target] (1 without weights), what "mean"
    divides by."""
    comptime acc = accum_dtype[dtype]()
    var n = call.view.n
    var targets = call.class_indices()
    var options = kernel_arg(call.options.values)
    var scale = Scalar[acc](1 / kept) if reduction == "mean" else Scalar[acc](1)

    def loss_of_row(row: LossRow[dtype]) {imm} -> Scalar[acc]:
        return _row[dtype, with_grad](
            row, targets[unsafe_offset=row.index], options, has_weight, scale, n
        )

    loss_rows_in_tasks(loss_of_row, call, kept)


@always_inline
def _row[
    dtype: DType, with_grad: Bool
](
    row: LossRow[dtype],
    t: Int64,
    options: Pointer[Float64, MutAnyOrigin],
    has_weight: Bool,
    scale: Scalar[accum_dtype[dtype]()],
    n: Int,
) -> Scalar[accum_dtype[dtype]()]:
    """`row`'s loss against class `t` (0 if ignored); with the gradient,
    its gradient row."""
    comptime acc = accum_dtype[dtype]()
    var y_out = kernel_arg(row.dlogits)
    var x = kernel_arg(row.logits)
    var weights = options.unsafe_offset(EXTENDED_OPTIONS)
    if t == Int64(options[unsafe_offset=0]):
        comptime if with_grad:
            for c in range(n):
                y_out[unsafe_offset=c] = 0
        return 0
    var eps = options[unsafe_offset=1].cast[acc]()
    var z_loss = options[unsafe_offset=2].cast[acc]()
    var cap = options[unsafe_offset=3].cast[acc]()
    # Two sweeps, the sums in float64: one float32 running sum of a row's
    # 32K exps drifted the mean loss 10x past torch's error. The softcap is
    # monotonic, so the capped max is the cap of the raw max.
    var raw_max = Scalar[acc](-1) / Scalar[acc](0)
    for c in range(n):
        raw_max = max(raw_max, x[unsafe_offset=c].cast[acc]())
    var m = softcap_of[acc, 1](raw_max, cap)
    var sum = Float64(0)
    var sum_u = Float64(0)
    var sum_uy = Float64(0)
    for c in range(n):
        var y = softcap_of[acc, 1](x[unsafe_offset=c].cast[acc](), cap)
        sum += exp_nan[acc, 1](y - m).cast[DType.float64]()
        if eps != 0:
            var u = weights[unsafe_offset=c].cast[acc]() if has_weight else 1
            sum_u += u.cast[DType.float64]()
            sum_uy += (u * y).cast[DType.float64]()
    var s = online_sum_guard[acc](m, sum.cast[acc]())
    var su = sum_u.cast[acc]()
    var suy = sum_uy.cast[acc]()
    var w_t = weights[unsafe_offset=Int(t)].cast[acc]() if has_weight else 1
    var y_t = softcap_of[acc, 1](x[unsafe_offset=Int(t)].cast[acc](), cap)
    comptime if with_grad:
        var factor = extended_p_factor[acc](m, s, w_t, su, eps, z_loss, n)
        var inv_s = 1 / s
        var smooth = eps / Scalar[acc](n)
        for c in range(n):
            var y = softcap_of[acc, 1](x[unsafe_offset=c].cast[acc](), cap)
            var g = exp_nan[acc, 1](y - m) * inv_s * factor
            if eps != 0:
                var u = weights[unsafe_offset=c].cast[
                    acc
                ]() if has_weight else 1
                g -= smooth * u
            if c == Int(t):
                g -= (1 - eps) * w_t
            y_out[unsafe_offset=c] = (
                g * scale * softcap_chain[acc, 1](y, cap)
            ).cast[dtype]()
    return extended_row_loss[acc](m, s, y_t, w_t, su, suy, eps, z_loss, n)
