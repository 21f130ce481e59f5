"""Vectorized, multithreaded CPU cross-entropy against class probabilities
(soft targets), fused: the loss and, with it, d loss / d logits.

Rows are split into tasks of whole rows (`loss_rows_in_tasks`). A row takes a
sweep for its max (the logits only), one for its statistics (s, S, T of
soft_target_math, logits and probabilities read together, W lanes summed
`SUM_BLOCK` at a time as cpu_sweeps' `blocked_sum`), then, with the
gradient, one sweep writing it (both read again, from cache for rows that
fit it). Row losses are summed in float64 for "mean" and "sum"
(`reduce_row_losses`).
"""

from std.sys import simd_width_of

from .cpu_cross_entropy import LossRow, loss_rows_in_tasks
from .cpu_rows import _max_of
from .cpu_sweeps import SUM_BLOCK, RowPieces, each_piece
from .gpu_launch import HeldRows, held, kernel_arg
from .row_math import accum_dtype, exp_nan, online_sum_guard
from .soft_cross_entropy_ops import SoftCrossEntropyCall
from .soft_target_math import (
    SoftTargets,
    soft_grad,
    soft_p_factor,
    soft_row_loss,
    soft_scale,
    soft_weighted,
)


def soft_cross_entropy_cpu[
    dtype: DType, with_grad: Bool, reduction: StaticString
](call: SoftCrossEntropyCall[dtype, with_grad, reduction]) raises:
    """Cross-entropy of `call`'s (rows, n) logits against as many rows of
    class probabilities, `options` (eps, z_loss[, n class weights])
    (soft_target_math) on the host.

    Parameters:
        dtype: Element type of logits, probabilities, loss and gradient.
        with_grad: Also write d loss / d logits into `dlogits`.
        reduction: "mean" (over the rows, torch's rule for probability
            targets), "sum" (one loss) or "none" (a loss a row).
    """
    comptime acc = accum_dtype[dtype]()
    comptime assert acc.is_floating_point()
    var rows = call.view.outer
    var n = call.view.n
    var options = kernel_arg(call.options.values)
    var shared = SoftRow[dtype](
        SoftTargets[acc](options, soft_weighted(call.options.count, n), n),
        options[unsafe_offset=1].cast[acc](),
        soft_scale[acc, reduction == "mean"](rows),
        n,
    )
    var probs = kernel_arg(call.targets)

    def loss_of_row(row: LossRow[dtype]) {imm} -> Scalar[acc]:
        return shared.run[with_grad](row, probs.unsafe_offset(row.index * n))

    loss_rows_in_tasks(loss_of_row, call, Float64(rows))


@fieldwise_init
struct SoftRow[dtype: DType](ImplicitlyCopyable):
    """What every row shares: the options and the reduction's scale."""

    comptime acc = accum_dtype[Self.dtype]()
    comptime W = simd_width_of[Self.acc]()

    var targets: SoftTargets[Self.acc]
    """Label smoothing and class weights."""
    var z_loss: Scalar[Self.acc]
    """The z-loss' factor."""
    var scale: Scalar[Self.acc]
    """The reduction's factor on the gradient (1 / rows for "mean")."""
    var n: Int
    """Classes."""

    @always_inline
    def q[
        w: Int
    ](self, p: Pointer[Scalar[Self.dtype], MutAnyOrigin], j: Int) -> SIMD[
        Self.acc, w
    ]:
        """The w targets q at class j."""
        return self.targets.q[w](
            p.unsafe_offset(j).unsafe_load[width=w]().cast[Self.acc](), j
        )

    @always_inline
    def run[
        with_grad: Bool
    ](
        self,
        row: LossRow[Self.dtype],
        p: Pointer[Scalar[Self.dtype], MutAnyOrigin],
    ) -> Scalar[Self.acc]:
        """`row`'s loss against the probabilities `p`; with the gradient,
        its gradient row."""
        comptime acc = Self.acc
        comptime W = Self.W
        var x = kernel_arg(row.logits)
        var n = self.n
        var m = _max_of[Self.dtype](x, n)
        var n_vec = n - n % W
        var s = Scalar[acc](0)
        var sum_q = Scalar[acc](0)
        var t = Scalar[acc](0)
        for b in range(0, n_vec, SUM_BLOCK):
            var sv = SIMD[acc, W](0)
            var qv = SIMD[acc, W](0)
            var tv = SIMD[acc, W](0)
            for j in range(b, min(b + SUM_BLOCK, n_vec), W):
                var d = (
                    x.unsafe_offset(j).unsafe_load[width=W]().cast[acc]() - m
                )
                var q = self.q[W](p, j)
                sv += exp_nan[acc, W](d)
                qv += q
                tv += q * d
            s += sv.reduce_add()
            sum_q += qv.reduce_add()
            t += tv.reduce_add()
        for j in range(n_vec, n):
            var d = x[unsafe_offset=j].cast[acc]() - m
            var q = self.q[1](p, j)[0]
            s += exp_nan[acc, 1](d)
            sum_q += q
            t += q * d
        s = online_sum_guard[acc](m, s)
        comptime if with_grad:
            each_piece[W](
                SoftGradWrite[Self.dtype](
                    self,
                    row.dlogits,
                    row.logits,
                    held(p),
                    m,
                    soft_p_factor[acc](m, s, sum_q, self.z_loss),
                ),
                n,
            )
        return soft_row_loss[acc](m, s, sum_q, t, self.z_loss)


@fieldwise_init
struct SoftGradWrite[dtype: DType](RowPieces):
    """Writes a row's gradient (exp(x - m) p_factor - q) scale."""

    comptime acc = accum_dtype[Self.dtype]()

    var row: SoftRow[Self.dtype]
    """The options."""
    var y: HeldRows[Self.dtype]
    """The gradient row."""
    var x: HeldRows[Self.dtype]
    """The logits row."""
    var p: HeldRows[Self.dtype]
    """The probabilities row."""
    var m: Scalar[Self.acc]
    """The row's max."""
    var p_factor: Scalar[Self.acc]
    """`soft_p_factor` of the row."""

    @always_inline
    def put[w: Int](self, j: Int):
        """Write the gradient at j."""
        var xv = kernel_arg(self.x).unsafe_offset(j).unsafe_load[width=w]()
        var g = soft_grad[Self.acc, w](
            xv.cast[Self.acc](),
            self.row.q[w](kernel_arg(self.p), j),
            self.m,
            self.p_factor,
            self.row.scale,
        )
        kernel_arg(self.y).unsafe_offset(j).unsafe_store(g.cast[Self.dtype]())
