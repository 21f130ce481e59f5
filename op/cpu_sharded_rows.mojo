"""CPU kernels of the sharded (vocab-parallel) row ops: the statistics of
a slice of each row's classes, and the epilogue from the rows' global
statistics. Same outputs as gpu_sharded_rows.mojo (which documents the
layout); rows are split into tasks of whole rows (`each_row`).

The statistics take two SIMD sweeps of the slice (max; then exp and, with
label smoothing, the plain sum); the epilogue one sweep that reads the slice
and writes the output.
"""

from std.sys import simd_width_of
from std.utils.numerics import inf, nan

from .cpu_rows import ExpTerms
from .cpu_sweeps import CpuRowOp, RowPieces, TaskRow, each_piece, each_row
from .cpu_sweeps import max_of, sum_of
from .cross_entropy_math import grad_of, smoothing_of, target_grad
from .gpu_launch import HeldRows, held, kernel_arg
from .gpu_sharded_rows import ROW_COLS, STATS_COLS
from .row_math import (
    accum_dtype,
    epilogue,
    exp_nan,
    online_sum_guard,
    row_scale,
    sum_shift,
)
from .row_tensors import RowTensors, tensors_of


def row_stats_cpu[
    dtype: DType, with_target: Bool
](
    stats: Pointer[Scalar[accum_dtype[dtype]()], MutAnyOrigin],
    logits: Pointer[Scalar[dtype], MutAnyOrigin],
    targets: Pointer[Int64, MutAnyOrigin],
    options: Pointer[Float64, MutAnyOrigin],
    rows: Int,
    n: Int,
) raises:
    """Each row's (max, sum of exp(x - sum_shift(max)), target logit or
    -inf, sum of x or 0) into `stats` (rows, STATS_COLS), by the sweeps of
    cpu_rows and cpu_cross_entropy."""
    each_row(
        SliceStats[dtype, with_target](
            held(stats),
            held(logits),
            held(targets),
            Int64(options[unsafe_offset=0]),
            with_target and options[unsafe_offset=2] != 0,
        ),
        rows,
        n,
    )


@fieldwise_init
struct SliceStats[dtype: DType, with_target: Bool](CpuRowOp):
    """The statistics of each row of a slice: a sweep for the max, one for
    the sum of exps, and with label smoothing one for the sum."""

    comptime acc = accum_dtype[Self.dtype]()
    comptime scratch_row = False

    var stats: HeldRows[Self.acc]
    """(rows, STATS_COLS) statistics."""
    var logits: HeldRows[Self.dtype]
    """The slice's logits."""
    var targets: HeldRows[DType.int64]
    """A class index a row (`with_target`)."""
    var offset: Int64
    """The slice's first class."""
    var smoothing: Bool
    """Whether to sum the logits (label smoothing)."""

    @always_inline
    def row(self, at: TaskRow[Self.acc]) -> Scalar[Self.acc]:
        """Row `at.r`'s statistics."""
        comptime acc = Self.acc
        var n = at.n
        var x = kernel_arg(self.logits).unsafe_offset(at.start())
        var m = max_of[Self.dtype](x, n)
        # The exps are summed, not parked: the output and scratch rows
        # ExpTerms takes are never touched (x and stats stand in).
        var s = ExpTerms[Self.dtype, False, False, False](
            held(x), self.stats, held(x), sum_shift[acc](m)
        ).sum(n)
        var sx = sum_of[Self.dtype](x, n) if self.smoothing else Scalar[acc](0)
        var x_t = -inf[acc]()
        comptime if Self.with_target:
            var local = self.targets[unsafe_offset=at.r] - self.offset
            if local >= 0 and local < Int64(n):
                x_t = x[unsafe_offset=Int(local)].cast[acc]()
        var out = self.stats.unsafe_offset(at.r * STATS_COLS)
        out[unsafe_offset=0] = m
        out[unsafe_offset=1] = s
        out[unsafe_offset=2] = x_t
        out[unsafe_offset=3] = sx
        return 0


def epilogue_cpu[
    dtype: DType, op: StaticString
](
    output: Pointer[Scalar[dtype], MutAnyOrigin],
    logits: Pointer[Scalar[dtype], MutAnyOrigin],
    row_in: Pointer[Scalar[accum_dtype[dtype]()], MutAnyOrigin],
    targets: Pointer[Int64, MutAnyOrigin],
    options: Pointer[Float64, MutAnyOrigin],
    rows: Int,
    n: Int,
) raises:
    """Softmax, log-softmax or the cross-entropy gradient (`op`) of each
    row of the slice from its global (max, sum, scale) in `row_in` (rows,
    ROW_COLS); the rules of `gpu_sharded_rows.epilogue_kernel`."""
    comptime assert (
        op == "softmax" or op == "log_softmax" or op == "cross_entropy"
    ), "op must be softmax, log_softmax or cross_entropy"
    comptime acc = accum_dtype[dtype]()
    var eps = options[unsafe_offset=2].cast[acc]()
    var classes = Int64(options[unsafe_offset=3])
    if n > 0:
        each_row(
            SliceEpilogue[dtype, op](
                tensors_of(output, logits, logits),
                held(row_in),
                held(targets),
                Int64(options[unsafe_offset=0]),
                Int64(options[unsafe_offset=1]),
                eps,
                classes,
                smoothing_of[acc](eps, Int(classes)),
            ),
            rows,
            n,
        )


@fieldwise_init
struct SliceEpilogue[dtype: DType, op: StaticString](CpuRowOp):
    """The epilogue of each row of a slice from its global statistics: one
    sweep reading the slice and writing the output."""

    comptime acc = accum_dtype[Self.dtype]()
    comptime scratch_row = False

    var t: RowTensors[Self.dtype]
    """The output (`dst`) and the slice's logits (`a`)."""
    var row_in: HeldRows[Self.acc]
    """(rows, ROW_COLS): each row's global max, sum and scale."""
    var targets: HeldRows[DType.int64]
    """A class index a row (cross-entropy)."""
    var offset: Int64
    """The slice's first class."""
    var ignore_index: Int64
    """The target of rows left out."""
    var eps: Scalar[Self.acc]
    """Label smoothing."""
    var classes: Int64
    """Classes over all slices."""
    var smooth: Scalar[Self.acc]
    """`smoothing_of` the rows."""

    @always_inline
    def row(self, at: TaskRow[Self.acc]) -> Scalar[Self.acc]:
        """Write row `at.r` of the slice."""
        comptime acc = Self.acc
        comptime W = simd_width_of[acc]()
        var n = at.n
        var x = kernel_arg(self.t.a).unsafe_offset(at.start())
        var y = kernel_arg(self.t.dst).unsafe_offset(at.start())
        var ri = self.row_in.unsafe_offset(at.r * ROW_COLS)
        var row_max = ri[unsafe_offset=0]
        # NaN where the row's max is +-inf, as the one-device kernels.
        var total_sum = online_sum_guard[acc](row_max, ri[unsafe_offset=1])
        comptime if Self.op == "cross_entropy":
            var scale = ri[unsafe_offset=2]
            var inv_s = 1 / total_sum
            var tgt = self.targets[unsafe_offset=at.r]
            if tgt == self.ignore_index or tgt < 0 or tgt >= self.classes:
                var fill = (
                    Scalar[Self.dtype](0) if tgt
                    == self.ignore_index else nan[Self.dtype]()
                )
                for j in range(n):
                    y[unsafe_offset=j] = fill
                return 0
            each_piece[W](
                SliceWrite[Self.dtype, Self.op](
                    held(y), held(x), row_max, inv_s, self.smooth, scale
                ),
                n,
            )
            var local = tgt - self.offset
            if local >= 0 and local < Int64(n):
                var x_t = x[unsafe_offset=Int(local)].cast[acc]()
                y[unsafe_offset=Int(local)] = target_grad[acc](
                    exp_nan[acc, 1](x_t - row_max) * inv_s,
                    self.smooth,
                    self.eps,
                    scale,
                ).cast[Self.dtype]()
        else:
            var a = row_scale[Self.op == "log_softmax", acc](total_sum)
            each_piece[W](
                SliceWrite[Self.dtype, Self.op](
                    held(y), held(x), row_max, a, 0, 0
                ),
                n,
            )
        return 0


@fieldwise_init
struct SliceWrite[dtype: DType, op: StaticString](RowPieces):
    """Writes a row of the slice from the row's global statistics: the
    cross-entropy gradient, or the softmax / log-softmax epilogue."""

    comptime acc = accum_dtype[Self.dtype]()

    var y: HeldRows[Self.dtype]
    """The output row."""
    var x: HeldRows[Self.dtype]
    """The slice's logits."""
    var row_max: Scalar[Self.acc]
    """The row's global max."""
    var a: Scalar[Self.acc]
    """1 / the row's sum (cross-entropy), else its `row_scale`."""
    var smooth: Scalar[Self.acc]
    """`smoothing_of` the row (cross-entropy)."""
    var scale: Scalar[Self.acc]
    """The reduction's factor (cross-entropy)."""

    @always_inline
    def put[w: Int](self, j: Int):
        """Write y at j."""
        comptime acc = Self.acc
        var v = self.x.unsafe_offset(j).unsafe_load[width=w]().cast[acc]()
        var out: SIMD[acc, w]
        comptime if Self.op == "cross_entropy":
            out = grad_of[acc, w](
                exp_nan[acc, w](v - self.row_max),
                self.a,
                self.smooth,
                self.scale,
            )
        else:
            out = epilogue[Self.op == "log_softmax", acc, w](
                v, SIMD[acc, w](self.row_max), SIMD[acc, w](self.a)
            )
        self.y.unsafe_offset(j).unsafe_store(out.cast[Self.dtype]())
