"""CPU cross-entropy under the extended options (z-loss, softcap, class
weights), multithreaded over whole rows as cpu_cross_entropy: a pass over
the capped logits for the row's max, sum of exp and (label smoothing) the
weighted sums, then, with the gradient, one pass writing it. The plain
loss (options of length 2) never comes here.

`options` is (ignore_index, eps, z_loss, softcap[, V class weights]) and
hints the CPU does not need, on the host; see cross_entropy_math for the
layout and the row math.
"""

from .cpu_cross_entropy import kept_targets
from .cpu_sweeps import CpuRowOp, TaskRow, loss_rows
from .cross_entropy_math import (
    EXTENDED_OPTIONS,
    extended_layout,
    extended_p_factor,
    extended_row_loss,
    softcap_chain,
    softcap_of,
)
from .gpu_launch import HeldRows, held
from .row_math import accum_dtype, exp_nan, online_sum_guard
from .row_tensors import RowTensors, tensors_of


def cross_entropy_options_cpu[
    dtype: DType, with_grad: Bool, reduction: StaticString
](
    loss: Pointer[Scalar[dtype], MutAnyOrigin],
    dlogits: Pointer[Scalar[dtype], MutAnyOrigin],
    logits: Pointer[Scalar[dtype], MutAnyOrigin],
    targets: Pointer[Int64, MutAnyOrigin],
    options: Pointer[Float64, MutAnyOrigin],
    n_options: Int,
    rows: Int,
    n: Int,
) raises:
    """Cross-entropy of `rows` rows of `n` logits against `targets` under
    the `n_options` extended options; arguments as `cross_entropy_cpu`.
    "mean" divides by the sum over kept rows of w[target] (torch's rule)."""
    comptime acc = accum_dtype[dtype]()
    comptime assert acc.is_floating_point()
    var has_weight = extended_layout(n_options, n).weighted
    var weights = held(options.unsafe_offset(EXTENDED_OPTIONS))
    var kept = kept_targets(
        targets,
        rows,
        Int64(options[unsafe_offset=0]),
        n,
        Optional(weights) if has_weight else None,
    )
    var scale = Scalar[acc](1 / kept) if reduction == "mean" else Scalar[acc](1)
    loss_rows[reduction](
        OptionsRows[dtype, with_grad](
            tensors_of(dlogits, logits, logits),
            held(targets),
            held(options),
            has_weight,
            scale,
        ),
        loss,
        rows,
        n,
        kept,
    )


@fieldwise_init
struct OptionsRows[dtype: DType, with_grad: Bool](CpuRowOp):
    """Cross-entropy rows under the extended options: a pass over the
    capped logits for the row's max, one for its sum of exp and (label
    smoothing) the weighted sums, then, with the gradient, one writing
    it."""

    comptime acc = accum_dtype[Self.dtype]()
    comptime scratch_row = False

    var t: RowTensors[Self.dtype]
    """The gradient (`dst`) and the logits (`a`)."""
    var targets: HeldRows[DType.int64]
    """A class index a row."""
    var options: HeldRows[DType.float64]
    """(ignore_index, eps, z_loss, softcap[, V class weights])."""
    var has_weight: Bool
    """Whether the options hold class weights."""
    var scale: Scalar[Self.acc]
    """The reduction's factor."""

    @always_inline
    def row(self, at: TaskRow[Self.acc]) -> Scalar[Self.acc]:
        """One row's loss (0 if ignored); with the gradient, its gradient
        row."""
        comptime acc = Self.acc
        var n = at.n
        var y_out = self.t.dst.unsafe_offset(at.start())
        var x = self.t.a.unsafe_offset(at.start())
        var t = self.targets[unsafe_offset=at.r]
        var options = self.options
        var has_weight = self.has_weight
        var weights = options.unsafe_offset(EXTENDED_OPTIONS)
        if t == Int64(options[unsafe_offset=0]):
            comptime if Self.with_grad:
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
                var u = weights[unsafe_offset=c].cast[
                    acc
                ]() if has_weight else 1
                sum_u += u.cast[DType.float64]()
                sum_uy += (u * y).cast[DType.float64]()
        var s = online_sum_guard[acc](m, sum.cast[acc]())
        var su = sum_u.cast[acc]()
        var suy = sum_uy.cast[acc]()
        var w_t = weights[unsafe_offset=Int(t)].cast[acc]() if has_weight else 1
        var y_t = softcap_of[acc, 1](x[unsafe_offset=Int(t)].cast[acc](), cap)
        comptime if Self.with_grad:
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
                    g * self.scale * softcap_chain[acc, 1](y, cap)
                ).cast[Self.dtype]()
        return extended_row_loss[acc](m, s, y_t, w_t, su, suy, eps, z_loss, n)
