"""CPU kernels of the sharded (vocab-parallel) row ops: the statistics of
a slice of each row's classes, and the epilogue from the rows' global
statistics. Same outputs as gpu_sharded_rows.mojo (which documents the
layout); rows are split into tasks of whole rows (cpu_tasks).

The statistics take two SIMD sweeps of the slice (max; then exp and, with
label smoothing, the plain sum); the epilogue one sweep that reads the slice
and writes the output.
"""

from std.sys import simd_width_of
from std.utils.numerics import inf, nan

from .cpu_cross_entropy import _sum_of
from .cpu_rows import ExpTerms, _max_of
from .cpu_sweeps import RowPieces, each_piece
from .cpu_tasks import run_in_tasks
from .cross_entropy_math import grad_of, smoothing_of, target_grad
from .gpu_launch import HeldRows, held, kernel_arg
from .gpu_sharded_rows import ROW_COLS, STATS_COLS
from .sharded_ops import ShardedCall
from .row_math import (
    accum_dtype,
    epilogue,
    exp_nan,
    online_sum_guard,
    row_scale,
    sum_shift,
)


def row_stats_cpu[
    dtype: DType, kind: StaticString
](call: ShardedCall[dtype, kind, True]) raises:
    """Each row's (max, sum of exp(x - sum_shift(max)), target logit or
    -inf, sum of x or 0) of `call`'s slice into its output (rows,
    STATS_COLS), by the sweeps of cpu_rows and cpu_cross_entropy."""
    comptime with_target = kind == "cross_entropy"
    comptime acc = accum_dtype[dtype]()
    # The output's type is `acc` for the statistics (`ShardedCall.out_dtype`).
    var stats = rebind[Pointer[Scalar[acc], MutAnyOrigin]](
        kernel_arg(call.output)
    )
    var logits = kernel_arg(call.logits)
    var targets = kernel_arg(call.targets)
    var options = kernel_arg(call.options)
    var n = call.view.n
    var offset = Int64(options[unsafe_offset=0])
    var smoothing = with_target and options[unsafe_offset=2] != 0

    def task_rows(begin: Int, end: Int) raises {imm}:
        for r in range(begin, end):
            var x = logits.unsafe_offset(r * n)
            var m = _max_of[dtype](x, n)
            # The exps are summed, not parked: the output and scratch rows
            # ExpTerms takes are never touched (x and stats stand in).
            var s = ExpTerms[dtype, False, False, False](
                held(x), held(stats), held(x), sum_shift[acc](m)
            ).sum(n)
            var sx = _sum_of[dtype](x, n) if smoothing else Scalar[acc](0)
            var x_t = -inf[acc]()
            comptime if with_target:
                var local = targets[unsafe_offset=r] - offset
                if local >= 0 and local < Int64(n):
                    x_t = x[unsafe_offset=Int(local)].cast[acc]()
            var out = stats.unsafe_offset(r * STATS_COLS)
            out[unsafe_offset=0] = m
            out[unsafe_offset=1] = s
            out[unsafe_offset=2] = x_t
            out[unsafe_offset=3] = sx

    run_in_tasks(task_rows, call.view.outer, n)


def epilogue_cpu[
    dtype: DType, op: StaticString
](call: ShardedCall[dtype, op, False]) raises:
    """Softmax, log-softmax or the cross-entropy gradient (`op`) of each
    row of `call`'s slice from its global (max, sum, scale) in `row_in`
    (rows, ROW_COLS) into its output; the rules of
    `gpu_sharded_rows.epilogue_kernel`."""
    comptime assert (
        op == "softmax" or op == "log_softmax" or op == "cross_entropy"
    ), "op must be softmax, log_softmax or cross_entropy"
    comptime acc = accum_dtype[dtype]()
    comptime W = simd_width_of[acc]()
    comptime CE = op == "cross_entropy"
    var output = rebind[Pointer[Scalar[dtype], MutAnyOrigin]](
        kernel_arg(call.output)
    )
    var logits = kernel_arg(call.logits)
    var row_in = kernel_arg(call.row_in)
    var targets = kernel_arg(call.targets)
    var options = kernel_arg(call.options)
    var n = call.view.n
    var offset = Int64(options[unsafe_offset=0])
    var ignore_index = Int64(options[unsafe_offset=1])
    var eps = options[unsafe_offset=2].cast[acc]()
    var classes = Int64(options[unsafe_offset=3])
    var smooth = smoothing_of[acc](eps, Int(classes))

    def task_rows(begin: Int, end: Int) raises {imm}:
        for r in range(begin, end):
            var x = logits.unsafe_offset(r * n)
            var y = output.unsafe_offset(r * n)
            var ri = row_in.unsafe_offset(r * ROW_COLS)
            var row_max = ri[unsafe_offset=0]
            # NaN where the row's max is +-inf, as the one-device kernels.
            var total_sum = online_sum_guard[acc](row_max, ri[unsafe_offset=1])
            comptime if CE:
                var scale = ri[unsafe_offset=2]
                var inv_s = 1 / total_sum
                var tgt = targets[unsafe_offset=r]
                var fill = Scalar[dtype](0)
                var kept = True
                if tgt == ignore_index:
                    kept = False
                elif tgt < 0 or tgt >= classes:
                    kept = False
                    fill = nan[dtype]()
                if not kept:
                    for j in range(n):
                        y[unsafe_offset=j] = fill
                    continue
                each_piece[W](
                    SliceWrite[dtype, op](
                        held(y), held(x), row_max, inv_s, smooth, scale
                    ),
                    n,
                )
                var local = tgt - offset
                if local >= 0 and local < Int64(n):
                    var x_t = x[unsafe_offset=Int(local)].cast[acc]()
                    y[unsafe_offset=Int(local)] = target_grad[acc](
                        exp_nan[acc, 1](x_t - row_max) * inv_s,
                        smooth,
                        eps,
                        scale,
                    ).cast[dtype]()
            else:
                var a = row_scale[op == "log_softmax", acc](total_sum)
                each_piece[W](
                    SliceWrite[dtype, op](held(y), held(x), row_max, a, 0, 0),
                    n,
                )

    if n > 0:
        run_in_tasks(task_rows, call.view.outer, n)


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
