"""GPU kernels of the sharded (vocab-parallel) row ops: the statistics pass
and the epilogue over one device's slice of each row's classes.

A row's classes are split over devices; each holds a (rows, n_shard) slice.
`row_stats_kernel` reads the slice once, a block a row, and writes each row's
(max, sum of exp(x - shift), target logit or -inf, sum of x) (`STATS_COLS`,
in the accumulator type; shift = `sum_shift(max)`). The caller gathers those
from every device and combines them (python/max_softmax/sharded.py,
torch/parallel.py) into each row's global (max, sum, scale);
`epilogue_kernel` then writes softmax, log-softmax or the cross-entropy
gradient of the slice in one vectorized grid-stride pass over (row, chunk)
items. Neither kernel synchronises with the host: both stay capturable.

Options (a float64 (4,) tensor on the device, read by the kernels):
(class offset of this slice, ignore_index, label smoothing eps, total classes V).
"""

from max.gpu import (
    MAX_THREADS_PER_BLOCK_METADATA,
    block_idx,
    grid_dim,
    thread_idx,
)
from max.gpu.host import DeviceContext
from std.math import ceildiv
from std.sys import size_of
from std.utils import StaticTuple
from std.utils.numerics import inf, nan

from .cross_entropy_math import grad_of, smoothing_of, target_grad
from .gpu_ce_block_strategy import block_stats
from .gpu_launch import aligned16, aligned_flag_of
from .row_math import (
    accum_dtype,
    epilogue,
    exp_nan,
    online_sum_guard,
    row_scale,
    vector_width,
)
from .row_part import BlockRow, aligned_head

comptime STATS_COLS = 4
"""Per-row statistics of a slice: max, sum of exp, target logit, sum of x."""

comptime ROW_COLS = 3
"""Per-row inputs of the epilogue: global max, global sum of exp, gradient
scale (cross-entropy only; 0 or anything for softmax)."""

comptime STATS_UNROLL = 4
"""Vectors a thread has in flight in the statistics pass (as the
loss-only cross-entropy block kernel, gpu_ce_block_rows)."""

comptime EPILOGUE_THREADS = 256
comptime EPILOGUE_UNROLL = 4
"""An epilogue item is EPILOGUE_THREADS * EPILOGUE_UNROLL vectors of a row."""

comptime EPILOGUE_BLOCKS = 1056
"""Epilogue blocks at most (8 per SM on an H100); they stride over items."""


def stats_threads[dtype: DType]() -> Int:
    """Threads a row in the statistics pass: 256 for 16-bit types, else
    512, so one vector a thread covers 2048 elements either way."""
    return 256 if size_of[dtype]() <= 2 else 512


@__llvm_metadata(MAX_THREADS_PER_BLOCK_METADATA=StaticTuple[Int32, 1](Int32(T)))
def row_stats_kernel[
    dtype: DType, with_target: Bool, V: Int, T: Int, U: Int
](
    stats: Pointer[Scalar[accum_dtype[dtype]()], MutAnyOrigin],
    logits: Pointer[Scalar[dtype], MutAnyOrigin],
    targets: Pointer[Int64, MutAnyOrigin],
    options: Pointer[Float64, MutAnyOrigin],
    n: Int64,
    aligned_flag: Int32,
):
    """A block of T threads a row: the row's STATS_COLS statistics into
    `stats[row]`. `with_target`: the target logit (the target, a global
    class index, minus the slice's offset, when it lies in the slice; else
    -inf) and, when eps != 0, the sum of x; without it those are -inf and 0.
    """
    comptime acc = accum_dtype[dtype]()
    comptime assert acc.is_floating_point()
    var r = BlockRow.of(n)
    var x = logits.unsafe_offset(r.start)
    var p = r.part[V, T](aligned_flag)
    var x_t = -inf[acc]()
    var smoothing = False
    comptime if with_target:
        var local = targets[unsafe_offset=r.row] - Int64(
            options[unsafe_offset=0]
        )
        if local >= 0 and local < Int64(r.len):
            # Loaded before the reductions' barriers, in flight with the row.
            x_t = x[unsafe_offset=Int(local)].cast[acc]()
        smoothing = options[unsafe_offset=2] != 0
    # `smoothing` is the same for the whole block: the reductions are
    # reached by every thread.
    var got = block_stats[dtype, V, T, U, False, False](x, p, smoothing)
    if r.t == 0:
        var out = stats.unsafe_offset(r.row * STATS_COLS)
        out[unsafe_offset=0] = got[0]
        out[unsafe_offset=1] = got[1]
        out[unsafe_offset=2] = x_t
        out[unsafe_offset=3] = got[2]


def launch_row_stats[
    dtype: DType, with_target: Bool
](
    ctx: DeviceContext,
    stats: Pointer[Scalar[accum_dtype[dtype]()], MutAnyOrigin],
    logits: Pointer[Scalar[dtype], MutAnyOrigin],
    targets: Pointer[Int64, MutAnyOrigin],
    options: Pointer[Float64, MutAnyOrigin],
    rows: Int,
    n: Int,
) raises:
    """Launch `row_stats_kernel`, a block a row. Nothing runs for no rows;
    a row of no classes gets (-inf, 0, -inf, 0)."""
    if rows == 0:
        return
    comptime V = vector_width[dtype]()
    comptime T = stats_threads[dtype]()
    comptime kernel = row_stats_kernel[dtype, with_target, V, T, STATS_UNROLL]
    ctx.enqueue_function[kernel](
        stats,
        logits,
        targets,
        options,
        Int64(n),
        aligned_flag_of(aligned16(Int(logits), 0)),
        grid_dim=rows,
        block_dim=T,
    )


@always_inline
def _finish[
    dtype: DType, op: StaticString, W: Int
](
    v: SIMD[dtype, W],
    row_max: Scalar[accum_dtype[dtype]()],
    a: Scalar[accum_dtype[dtype]()],
    smooth: Scalar[accum_dtype[dtype]()],
    scale: Scalar[accum_dtype[dtype]()],
) -> SIMD[accum_dtype[dtype](), W]:
    """One item's output: softmax / log-softmax by the row epilogue (`a`
    from `row_scale`), or the cross-entropy gradient of non-target classes
    (`a` = 1 / sum)."""
    comptime acc = accum_dtype[dtype]()
    var xs = v.cast[acc]()
    comptime if op == "cross_entropy":
        return grad_of[acc, W](exp_nan[acc, W](xs - row_max), a, smooth, scale)
    else:
        return epilogue[op == "log_softmax", acc, W](
            xs, SIMD[acc, W](row_max), SIMD[acc, W](a)
        )


@__llvm_metadata(MAX_THREADS_PER_BLOCK_METADATA=StaticTuple[Int32, 1](Int32(T)))
def epilogue_kernel[
    dtype: DType, op: StaticString, V: Int, T: Int, U: Int
](
    output: Pointer[Scalar[dtype], MutAnyOrigin],
    logits: Pointer[Scalar[dtype], MutAnyOrigin],
    row_in: Pointer[Scalar[accum_dtype[dtype]()], MutAnyOrigin],
    targets: Pointer[Int64, MutAnyOrigin],
    options: Pointer[Float64, MutAnyOrigin],
    rows: Int64,
    n: Int64,
    aligned_flag: Int32,
):
    """Softmax, log-softmax (`op`) or the cross-entropy gradient of the
    slice, from each row's global (max, sum, scale) in `row_in`.

    Items are (row, chunk of T * U vectors of its body) pairs, walked
    grid-stride; chunk 0 also writes the row's scalar head and tail. For
    cross-entropy a row whose target is ignore_index gets 0, one whose
    target is outside [0, V) NaN, and the target's class (when in the
    slice) (p - eps / V - (1 - eps)) * scale."""
    comptime acc = accum_dtype[dtype]()
    comptime assert acc.is_floating_point()
    comptime CE = op == "cross_entropy"
    comptime CH = T * U
    var t = Int(thread_idx.x)
    var len = Int(n)
    var chunks = max(1, ceildiv(len, CH * V))
    var total = Int(rows) * chunks
    var offset = Int64(options[unsafe_offset=0])
    var ignore_index = Int64(options[unsafe_offset=1])
    var eps = options[unsafe_offset=2].cast[acc]()
    var classes = Int64(options[unsafe_offset=3])
    var smooth = smoothing_of[acc](eps, Int(classes))
    var item = Int(block_idx.x)
    while item < total:
        var row = item // chunks
        var c = item - row * chunks
        var start = row * len
        var x = logits.unsafe_offset(start)
        var y = output.unsafe_offset(start)
        var head = aligned_head[V](start, len, aligned_flag)
        var nvec = (len - head) // V
        var tail_begin = head + nvec * V
        var r = row_in.unsafe_offset(row * ROW_COLS)
        var row_max = r[unsafe_offset=0]
        # NaN where the row's max is +-inf, as the one-device kernels.
        var total_sum = online_sum_guard[acc](row_max, r[unsafe_offset=1])
        var a: Scalar[acc]
        comptime if CE:
            a = 1 / total_sum
        else:
            a = row_scale[op == "log_softmax", acc](total_sum)
        var scale = Scalar[acc](0)
        var fill = Scalar[dtype](0)
        var kept = True
        var local = -1  # the target's index in the slice, or -1
        comptime if CE:
            scale = r[unsafe_offset=2]
            var tgt = targets[unsafe_offset=row]
            if tgt == ignore_index:
                kept = False
            elif tgt < 0 or tgt >= classes:
                kept = False
                fill = nan[dtype]()
            elif tgt >= offset and tgt < offset + Int64(len):
                local = Int(tgt - offset)
        var end = min((c + 1) * CH, nvec)
        var first = c * CH + t
        # The thread's (up to) U vectors of the chunk are all loaded before
        # any store: U loads in flight, which stores to a buffer the
        # compiler cannot tell apart from the input would otherwise stop.
        var raw = SIMD[dtype, U * V](0)
        if kept:
            comptime for k in range(U):
                if first + k * T < end:
                    raw = raw.insert[offset=k * V](
                        x.unsafe_offset(head + (first + k * T) * V).unsafe_load[
                            width=V, alignment=16
                        ]()
                    )
        comptime for k in range(U):
            var i = first + k * T
            if i < end:
                var e0 = head + i * V
                var out = SIMD[dtype, V](fill)
                if kept:
                    var v = raw.slice[V, offset=k * V]()
                    var g = _finish[dtype, op, V](v, row_max, a, smooth, scale)
                    comptime if CE:
                        var d = local - e0
                        if d >= 0 and d < V:
                            # Lane by lane with constant indices: a dynamic
                            # index into a vector goes through local memory.
                            comptime for j in range(V):
                                if j == d:
                                    g[j] = target_grad[acc](
                                        exp_nan[acc, 1](
                                            v[j].cast[acc]() - row_max
                                        )
                                        * a,
                                        smooth,
                                        eps,
                                        scale,
                                    )
                    out = g.cast[dtype]()
                y.unsafe_offset(e0).unsafe_store[alignment=16](out)
        if c == 0:
            for k in range(t, head + len - tail_begin, T):
                var e = k if k < head else tail_begin + (k - head)
                var out = fill
                if kept:
                    var v = x[unsafe_offset=e]
                    var g = _finish[dtype, op, 1](v, row_max, a, smooth, scale)
                    comptime if CE:
                        if e == local:
                            g = target_grad[acc](
                                exp_nan[acc, 1](v.cast[acc]() - row_max) * a,
                                smooth,
                                eps,
                                scale,
                            )
                    out = g.cast[dtype]()
                y[unsafe_offset=e] = out
        item += Int(grid_dim.x)


def launch_epilogue[
    dtype: DType, op: StaticString
](
    ctx: DeviceContext,
    output: Pointer[Scalar[dtype], MutAnyOrigin],
    logits: Pointer[Scalar[dtype], MutAnyOrigin],
    row_in: Pointer[Scalar[accum_dtype[dtype]()], MutAnyOrigin],
    targets: Pointer[Int64, MutAnyOrigin],
    options: Pointer[Float64, MutAnyOrigin],
    rows: Int,
    n: Int,
) raises:
    """Launch `epilogue_kernel`: a block an item up to EPILOGUE_BLOCKS.
    Nothing runs for an empty slice."""
    comptime assert (
        op == "softmax" or op == "log_softmax" or op == "cross_entropy"
    ), "op must be softmax, log_softmax or cross_entropy"
    if rows == 0 or n == 0:
        return
    comptime V = vector_width[dtype]()
    comptime T = EPILOGUE_THREADS
    comptime U = EPILOGUE_UNROLL
    var items = rows * max(1, ceildiv(n, T * U * V))
    comptime kernel = epilogue_kernel[dtype, op, V, T, U]
    ctx.enqueue_function[kernel](
        output,
        logits,
        row_in,
        targets,
        options,
        Int64(rows),
        Int64(n),
        aligned_flag_of(aligned16(Int(output), Int(logits))),
        grid_dim=min(items, EPILOGUE_BLOCKS),
        block_dim=T,
    )
