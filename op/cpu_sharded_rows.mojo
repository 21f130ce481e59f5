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

from .cpu_cross_entropy import GradWrite
from .cpu_rows import ExpTerms
from .cpu_sweeps import CpuRowOp, TaskRow, each_piece, each_row, max_of, sum_of
from .cross_entropy_math import smoothing_of, target_grad
from .gpu_launch import HeldRows, held, kernel_arg
from .gpu_sharded_rows import ROW_COLS, STATS_COLS
from .row_math import (
    accum_dtype,
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
        SliceRows[dtype, "stats", with_target](
            tensors_of(logits, logits, logits),
            held(stats),
            held(targets),
            held(options),
        ),
        rows,
        n,
    )


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
    if n > 0:
        each_row(
            SliceRows[dtype, op](
                tensors_of(output, logits, logits),
                held(row_in),
                held(targets),
                held(options),
            ),
            rows,
            n,
        )


@fieldwise_init
struct SliceRows[dtype: DType, op: StaticString, with_target: Bool = True](
    CpuRowOp
):
    """A row of a slice: its statistics ("stats": a sweep for the max, one
    for the sum of exps, with label smoothing one for the sum), or its
    epilogue from the row's global statistics (one sweep
    reading the slice and writing the output)."""

    comptime acc = accum_dtype[Self.dtype]()
    comptime scratch_row = False

    var t: RowTensors[Self.dtype]
    """The output (`dst`) and the slice's logits (`a`)."""
    var stats: HeldRows[Self.acc]
    """(rows, STATS_COLS) statistics out, or (rows, ROW_COLS) global ones
    in."""
    var targets: HeldRows[DType.int64]
    """A class index a row (cross-entropy)."""
    var options: HeldRows[DType.float64]
    """The slice's options (gpu_sharded_rows)."""

    @always_inline
    def row(self, at: TaskRow[Self.acc]) -> Scalar[Self.acc]:
        """Row `at.r`'s statistics or output."""
        comptime if Self.op == "stats":
            self.stats_row(at)
        else:
            self.write_row(at)
        return 0

    @always_inline
    def stats_row(self, at: TaskRow[Self.acc]):
        """Row `at.r`'s (max, sum of exps, target logit, sum)."""
        comptime acc = Self.acc
        var n = at.n
        var x = kernel_arg(self.t.a).unsafe_offset(at.start())
        var offset = Int64(self.options[unsafe_offset=0])
        var m = max_of[Self.dtype](x, n)
        # The exps are summed, not parked: the output and scratch rows
        # ExpTerms takes are never touched (x and stats stand in).
        var s = ExpTerms[Self.dtype, False, False, False](
            held(x), self.stats, held(x), sum_shift[acc](m)
        ).sum(n)
        var sx = Scalar[acc](0)
        var x_t = -inf[acc]()
        comptime if Self.with_target:
            if self.options[unsafe_offset=2] != 0:
                sx = sum_of[Self.dtype](x, n)
            var local = self.targets[unsafe_offset=at.r] - offset
            if local >= 0 and local < Int64(n):
                x_t = x[unsafe_offset=Int(local)].cast[acc]()
        var out = self.stats.unsafe_offset(at.r * STATS_COLS)
        out[unsafe_offset=0] = m
        out[unsafe_offset=1] = s
        out[unsafe_offset=2] = x_t
        out[unsafe_offset=3] = sx

    @always_inline
    def write_row(self, at: TaskRow[Self.acc]):
        """Row `at.r` of the output from its global statistics."""
        comptime acc = Self.acc
        comptime W = simd_width_of[acc]()
        var n = at.n
        var x = kernel_arg(self.t.a).unsafe_offset(at.start())
        var y = kernel_arg(self.t.dst).unsafe_offset(at.start())
        var ri = self.stats.unsafe_offset(at.r * ROW_COLS)
        var row = ExpTerms[Self.dtype, False, False, False](
            held(y), at.scratch, held(x), ri[unsafe_offset=0]
        )
        # NaN where the row's max is +-inf, as the one-device kernels.
        var total_sum = online_sum_guard[acc](row.m, ri[unsafe_offset=1])
        comptime if Self.op != "cross_entropy":
            row.write[Self.op == "log_softmax"](
                n, row_scale[Self.op == "log_softmax", acc](total_sum)
            )
        else:
            var ignore_index = Int64(self.options[unsafe_offset=1])
            var eps = self.options[unsafe_offset=2].cast[acc]()
            var classes = Int64(self.options[unsafe_offset=3])
            var scale = ri[unsafe_offset=2]
            var inv_s = 1 / total_sum
            var tgt = self.targets[unsafe_offset=at.r]
            if tgt == ignore_index or tgt < 0 or tgt >= classes:
                var fill = (
                    Scalar[Self.dtype](0) if tgt
                    == ignore_index else nan[Self.dtype]()
                )
                for j in range(n):
                    y[unsafe_offset=j] = fill
                return
            var smooth = smoothing_of[acc](eps, Int(classes))
            each_piece[W](
                GradWrite[Self.dtype, False, False](row, inv_s, smooth, scale),
                n,
            )
            var local = tgt - Int64(self.options[unsafe_offset=0])
            if local >= 0 and local < Int64(n):
                var x_t = x[unsafe_offset=Int(local)].cast[acc]()
                y[unsafe_offset=Int(local)] = target_grad[acc](
                    exp_nan[acc, 1](x_t - row.m) * inv_s, smooth, eps, scale
                ).cast[Self.dtype]()
