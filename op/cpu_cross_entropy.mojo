"""Vectorized, multithreaded CPU cross-entropy (and its gradient), fused.

Rows are split into tasks of whole rows (`loss_rows`). A row takes
the SIMD sweeps of softmax there (max; exp and sum, the exps parked in the
gradient row, or for 16-bit types in a float32 scratch row), then, with the
gradient, one sweep writing (p - eps/V) * scale: the logits are read twice
and the gradient written once, never read back from memory other than the
parked exps. Without the gradient nothing is written but the loss.

Targets are on the host here, so they are checked before any row runs: an
out-of-range target (not `ignore_index`) raises, naming the row.
"""

from std.sys import simd_width_of, size_of

from .cpu_rows import ExpTerms
from .cpu_sweeps import CpuRowOp, RowPieces, TaskRow, each_piece, loss_rows
from .cpu_sweeps import max_of, sum_of
from .gpu_launch import HeldRows, held, kernel_arg
from .cross_entropy_math import (
    IGNORED,
    checked_target_kind,
    grad_of,
    row_loss,
    smoothing_of,
    target_grad,
)
from .row_math import accum_dtype, exp_nan
from .row_tensors import RowTensors, tensors_of


def cross_entropy_cpu[
    dtype: DType, with_grad: Bool, reduction: StaticString
](
    loss: Pointer[Scalar[dtype], MutAnyOrigin],
    dlogits: Pointer[Scalar[dtype], MutAnyOrigin],
    logits: Pointer[Scalar[dtype], MutAnyOrigin],
    targets: Pointer[Int64, MutAnyOrigin],
    ignore_index: Int64,
    eps: Float64,
    rows: Int,
    n: Int,
) raises:
    """Cross-entropy of `rows` rows of `n` logits against `targets`.

    Parameters:
        dtype: Element type of logits, loss and gradient.
        with_grad: Also write d loss / d logits into `dlogits`.
        reduction: "mean", "sum" (one loss) or "none" (a loss a row).

    Args:
        loss: One element ("mean", "sum") or `rows` ("none").
        dlogits: `rows * n` elements (unused without the gradient).
        logits: `rows * n` elements, row-major.
        targets: `rows` class indices.
        ignore_index: Target value whose rows are left out.
        eps: Label smoothing, in [0, 1].
        rows: Number of rows.
        n: Classes (row length).
    """
    comptime acc = accum_dtype[dtype]()
    comptime assert acc.is_floating_point()
    var kept = kept_targets(targets, rows, ignore_index, n)
    # 1 / 0 = inf for "mean" over no kept rows: every row is then ignored
    # and gets a zero gradient, so the inf is never used.
    var scale = Scalar[acc](1) / Scalar[acc](
        kept
    ) if reduction == "mean" else Scalar[acc](1)
    loss_rows[reduction](
        CrossEntropyRows[dtype, with_grad](
            tensors_of(dlogits, logits, logits),
            held(targets),
            ignore_index,
            Scalar[acc](eps),
            scale,
        ),
        loss,
        rows,
        n,
        kept,
    )


def kept_targets(
    targets: Pointer[Int64, MutAnyOrigin],
    rows: Int,
    ignore_index: Int64,
    n: Int,
    weights: Optional[HeldRows[DType.float64]] = None,
) raises -> Float64:
    """The rows whose target is not `ignore_index`, each counted by its
    class weight where there are `weights`: what "mean" divides by
    (torch's rule). Checked first and serially: a target out of range
    raises, naming its row, before any output is written."""
    var kept = Float64(0)
    for r in range(rows):
        var t = targets[unsafe_offset=r]
        if checked_target_kind(t, r, ignore_index, n) != IGNORED:
            kept += weights.value()[unsafe_offset=Int(t)] if weights else 1
    return kept


@fieldwise_init
struct CrossEntropyRows[dtype: DType, with_grad: Bool](CpuRowOp):
    """Cross-entropy rows: the sweeps of softmax (max; exp and sum, the
    exps parked in the gradient row or, for 16-bit types, in the task's
    float32 scratch row), then, with the gradient, one sweep writing it."""

    comptime acc = accum_dtype[Self.dtype]()
    comptime scratch_row = Self.with_grad and size_of[Self.dtype]() < 4

    var t: RowTensors[Self.dtype]
    """The gradient (`dst`) and the logits (`a`)."""
    var targets: HeldRows[DType.int64]
    """A class index a row."""
    var ignore_index: Int64
    """The target of rows left out."""
    var eps: Scalar[Self.acc]
    """Label smoothing."""
    var scale: Scalar[Self.acc]
    """The reduction's factor."""

    @always_inline
    def row(self, at: TaskRow[Self.acc]) -> Scalar[Self.acc]:
        """One row's loss (0 if ignored); with the gradient, its gradient
        row."""
        comptime acc = Self.acc
        comptime W = simd_width_of[acc]()
        var n = at.n
        var y = kernel_arg(self.t.dst).unsafe_offset(at.start())
        var x = kernel_arg(self.t.a).unsafe_offset(at.start())
        var t = self.targets[unsafe_offset=at.r]
        var eps = self.eps
        if t == self.ignore_index:
            comptime if Self.with_grad:
                for j in range(0, n - n % W, W):
                    y.unsafe_offset(j).unsafe_store(SIMD[Self.dtype, W](0))
                for j in range(n - n % W, n):
                    y[unsafe_offset=j] = 0
            return 0
        # 32/64-bit types park exp(x - m) in the gradient row, 16-bit types
        # in the float32 scratch row (parking them in y would round twice),
        # by the lean exp (16-bit outputs need ~1e-6, see cpu_rows).
        comptime park_in_dst = Self.with_grad and size_of[Self.dtype]() >= 4
        comptime park_in_scratch = Self.scratch_row
        comptime lean = size_of[Self.dtype]() < 4
        var m = max_of[Self.dtype](x, n)
        var s = ExpTerms[Self.dtype, park_in_dst, park_in_scratch, lean](
            held(y), at.scratch, held(x), m
        ).sum(n)
        var x_t = x[unsafe_offset=Int(t)].cast[acc]()
        var sum_x = sum_of[Self.dtype](x, n) if eps != 0 else Scalar[acc](0)
        comptime if Self.with_grad:
            var inv_s = 1 / s
            var smooth = smoothing_of[acc](eps, n)
            each_piece[W](
                GradWrite[Self.dtype, park_in_dst, not park_in_dst](
                    ExpTerms[Self.dtype, park_in_dst, not park_in_dst, False](
                        held(y), at.scratch, held(x), m
                    ),
                    inv_s,
                    smooth,
                    self.scale,
                ),
                n,
            )
            y[unsafe_offset=Int(t)] = target_grad[acc](
                exp_nan[acc, 1](x_t - m) * inv_s, smooth, eps, self.scale
            ).cast[Self.dtype]()
        return row_loss[acc](m, s, x_t, sum_x, eps, n)


@fieldwise_init
struct GradWrite[dtype: DType, park_in_dst: Bool, park_in_scratch: Bool](
    RowPieces
):
    """Writes a gradient row (p - eps/V) * scale from the exps parked in it
    (`park_in_dst`) or in a float32 scratch row (`park_in_scratch`), else
    from exp(x - m)."""

    comptime acc = accum_dtype[Self.dtype]()

    var row: ExpTerms[Self.dtype, Self.park_in_dst, Self.park_in_scratch, False]
    """The gradient row (`y`), where the exps are parked, and the max."""
    var inv_s: Scalar[Self.acc]
    """1 / the row's sum of exps."""
    var smooth: Scalar[Self.acc]
    """`smoothing_of` the row."""
    var scale: Scalar[Self.acc]
    """The reduction's factor."""

    @always_inline
    def put[w: Int](self, j: Int):
        """Write the gradient at j."""
        var e = self.row.value[w](j)
        comptime if not (Self.park_in_dst or Self.park_in_scratch):
            e = exp_nan[Self.acc, w](e - self.row.m)
        self.row.y.unsafe_offset(j).unsafe_store(
            grad_of[Self.acc, w](e, self.inv_s, self.smooth, self.scale).cast[
                Self.dtype
            ]()
        )
