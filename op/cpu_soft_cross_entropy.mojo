"""Vectorized, multithreaded CPU cross-entropy against class probabilities
(soft targets), fused: the loss and, with it, d loss / d logits.

Rows are split into tasks of whole rows (`loss_rows`). A row takes a
sweep for its max (the logits only), one for its statistics (s, S, T of
soft_target_math, logits and probabilities read together, W lanes summed
`SUM_BLOCK` at a time as cpu_sweeps' `blocked_sum`), then, with the
gradient, one sweep writing it (both read again, from cache for rows that
fit it). Row losses are summed in float64 for "mean" and "sum".
"""

from std.sys import simd_width_of

from .cpu_sweeps import SUM_BLOCK, CpuRowOp, RowPieces, TaskRow, each_piece
from .cpu_sweeps import loss_rows, max_of
from .gpu_launch import HeldRows, held, kernel_arg
from .row_math import accum_dtype, exp_nan, online_sum_guard
from .row_tensors import RowTensors, tensors_of
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
](
    loss: Pointer[Scalar[dtype], MutAnyOrigin],
    dlogits: Pointer[Scalar[dtype], MutAnyOrigin],
    logits: Pointer[Scalar[dtype], MutAnyOrigin],
    probs: Pointer[Scalar[dtype], MutAnyOrigin],
    options: Pointer[Float64, MutAnyOrigin],
    n_options: Int,
    rows: Int,
    n: Int,
) raises:
    """Cross-entropy of `rows` rows of `n` logits against as many rows of
    class probabilities.

    Parameters:
        dtype: Element type of logits, probabilities, loss and gradient.
        with_grad: Also write d loss / d logits into `dlogits`.
        reduction: "mean" (over the rows, torch's rule for probability
            targets), "sum" (one loss) or "none" (a loss a row).

    Args:
        loss: One element ("mean", "sum") or `rows` ("none").
        dlogits: `rows * n` elements (unused without the gradient).
        logits: `rows * n` elements, row-major.
        probs: `rows * n` elements, row-major.
        options: (eps, z_loss[, n class weights]) (soft_target_math).
        n_options: Their count.
        rows: Number of rows.
        n: Classes (row length).
    """
    comptime acc = accum_dtype[dtype]()
    comptime assert acc.is_floating_point()
    loss_rows[reduction](
        SoftRow[dtype, with_grad](
            tensors_of(dlogits, logits, probs),
            SoftTargets[acc](options, soft_weighted(n_options, n), n),
            options[unsafe_offset=1].cast[acc](),
            soft_scale[acc, reduction == "mean"](rows),
        ),
        loss,
        rows,
        n,
        Float64(rows),
    )


@fieldwise_init
struct SoftRow[dtype: DType, with_grad: Bool](CpuRowOp, ImplicitlyCopyable):
    """Soft-target cross-entropy rows: a sweep for the max, one for the
    statistics, then, with the gradient, one writing it."""

    comptime acc = accum_dtype[Self.dtype]()
    comptime scratch_row = False
    comptime W = simd_width_of[Self.acc]()

    var t: RowTensors[Self.dtype]
    """The gradient (`dst`), the logits (`a`) and the probabilities
    (`b`)."""
    var targets: SoftTargets[Self.acc]
    """Label smoothing and class weights."""
    var z_loss: Scalar[Self.acc]
    """The z-loss' factor."""
    var scale: Scalar[Self.acc]
    """The reduction's factor on the gradient (1 / rows for "mean")."""

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
    def row(self, at: TaskRow[Self.acc]) -> Scalar[Self.acc]:
        """One row's loss; with the gradient, its gradient row."""
        comptime acc = Self.acc
        comptime W = Self.W
        var n = at.n
        var y = kernel_arg(self.t.dst).unsafe_offset(at.start())
        var x = kernel_arg(self.t.a).unsafe_offset(at.start())
        var p = kernel_arg(self.t.b).unsafe_offset(at.start())
        var m = max_of[Self.dtype](x, n)
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
        comptime if Self.with_grad:
            each_piece[W](
                SoftGradWrite[Self.dtype, Self.with_grad](
                    self,
                    held(y),
                    held(x),
                    held(p),
                    m,
                    soft_p_factor[acc](m, s, sum_q, self.z_loss),
                ),
                n,
            )
        return soft_row_loss[acc](m, s, sum_q, t, self.z_loss)


@fieldwise_init
struct SoftGradWrite[dtype: DType, with_grad: Bool](RowPieces):
    """Writes a row's gradient (exp(x - m) p_factor - q) scale."""

    comptime acc = accum_dtype[Self.dtype]()

    var row: SoftRow[Self.dtype, Self.with_grad]
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
