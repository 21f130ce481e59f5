"""CPU kernels of the sharded (vocab-parallel) row ops: the statistics of
a slice of each row's classes, and the epilogue from the rows' global
statistics. Same outputs as gpu_sharded_rows.mojo (which documents the
layout); rows are split into tasks of whole rows (cpu_tasks).

The statistics take two SIMD sweeps of the slice (max; then exp and, with
label smoothing, the plain sum); the epilogue one sweep that reads the slice
and writes the output.
"""

from std.math import ceildiv
from std.sys import simd_width_of
from std.utils.numerics import inf, nan

from .cpu_tasks import items_per_task, run_tasks
from .cross_entropy_math import grad_of, smoothing_of, target_grad
from .gpu_sharded_rows import ROW_COLS, STATS_COLS
from .row_math import (
    accum_dtype,
    epilogue,
    exp_nan,
    online_sum_guard,
    row_scale,
    sum_shift,
)


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
    -inf, sum of x or 0) into `stats` (rows, STATS_COLS)."""
    comptime acc = accum_dtype[dtype]()
    comptime W = simd_width_of[acc]()
    var offset = Int64(options[unsafe_offset=0])
    var smoothing = with_target and options[unsafe_offset=2] != 0
    var rows_per_task = items_per_task(n)

    def task(k: Int) raises {imm}:
        for r in range(k * rows_per_task, min(rows, (k + 1) * rows_per_task)):
            var x = logits.unsafe_offset(r * n)
            var n_vec = n - n % W
            var mv = SIMD[acc, W](-inf[acc]())
            for j in range(0, n_vec, W):
                mv = max(
                    mv, x.unsafe_offset(j).unsafe_load[width=W]().cast[acc]()
                )
            var m = mv.reduce_max()
            for j in range(n_vec, n):
                m = max(m, x[unsafe_offset=j].cast[acc]())
            var shift = sum_shift[acc](m)
            var sv = SIMD[acc, W](0)
            var xv = SIMD[acc, W](0)
            for j in range(0, n_vec, W):
                var v = x.unsafe_offset(j).unsafe_load[width=W]().cast[acc]()
                sv += exp_nan[acc, W](v - shift)
                if smoothing:
                    xv += v
            var s = sv.reduce_add()
            var sx = xv.reduce_add()
            for j in range(n_vec, n):
                var v = x[unsafe_offset=j].cast[acc]()
                s += exp_nan[acc, 1](v - shift)
                if smoothing:
                    sx += v
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

    if rows > 0:
        run_tasks(task, ceildiv(rows, rows_per_task))


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
    comptime W = simd_width_of[acc]()
    comptime CE = op == "cross_entropy"
    var offset = Int64(options[unsafe_offset=0])
    var ignore_index = Int64(options[unsafe_offset=1])
    var eps = options[unsafe_offset=2].cast[acc]()
    var classes = Int64(options[unsafe_offset=3])
    var smooth = smoothing_of[acc](eps, Int(classes))
    var rows_per_task = items_per_task(n)

    def task(k: Int) raises {imm}:
        for r in range(k * rows_per_task, min(rows, (k + 1) * rows_per_task)):
            var x = logits.unsafe_offset(r * n)
            var y = output.unsafe_offset(r * n)
            var ri = row_in.unsafe_offset(r * ROW_COLS)
            var row_max = ri[unsafe_offset=0]
            # NaN where the row's max is +-inf, as the one-device kernels.
            var total_sum = online_sum_guard[acc](row_max, ri[unsafe_offset=1])
            var n_vec = n - n % W
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
                for j in range(0, n_vec, W):
                    var v = (
                        x.unsafe_offset(j).unsafe_load[width=W]().cast[acc]()
                    )
                    y.unsafe_offset(j).unsafe_store(
                        grad_of[acc, W](
                            exp_nan[acc, W](v - row_max), inv_s, smooth, scale
                        ).cast[dtype]()
                    )
                for j in range(n_vec, n):
                    var v = x[unsafe_offset=j].cast[acc]()
                    y[unsafe_offset=j] = grad_of[acc, 1](
                        exp_nan[acc, 1](v - row_max), inv_s, smooth, scale
                    ).cast[dtype]()
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
                comptime log_out = op == "log_softmax"
                var a = row_scale[log_out, acc](total_sum)
                for j in range(0, n_vec, W):
                    var v = (
                        x.unsafe_offset(j).unsafe_load[width=W]().cast[acc]()
                    )
                    y.unsafe_offset(j).unsafe_store(
                        epilogue[log_out, acc, W](
                            v, SIMD[acc, W](row_max), SIMD[acc, W](a)
                        ).cast[dtype]()
                    )
                for j in range(n_vec, n):
                    var v = x[unsafe_offset=j].cast[acc]()
                    y[unsafe_offset=j] = epilogue[log_out, acc, 1](
                        v, row_max, a
                    ).cast[dtype]()

    if rows > 0 and n > 0:
        run_tasks(task, ceildiv(rows, rows_per_task))
