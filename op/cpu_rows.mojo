"""Vectorized, multithreaded CPU softmax over a `(outer, n, inner)` view.

Contiguous rows (`inner == 1`) are split into tasks of whole rows; each row
takes three SIMD sweeps (max; exp and sum; scale). Fewer rows than four a
core, when long, are cut into chunks that run in parallel instead, their
(max, sum) pairs folded per row between two parallel phases. Rows along another axis
(`inner > 1`) are processed `W` columns at a time, so the SIMD lanes run
along the contiguous inner dimension and every load is still a vector load.
"""

from .cpu_tasks import items_per_task, run_tasks
from std.sys.info import num_logical_cores
from std.math import ceildiv
from std.sys import simd_width_of, size_of
from std.utils.numerics import inf

from .row_math import (
    accum_dtype,
    epilogue,
    exp_nan,
    fold_pair,
    online_sum_guard,
    row_exp,
    row_scale,
    sum_shift,
)

# Terms summed in one accumulator before it is folded into the total.
comptime SUM_BLOCK = 1024
# Elements of a row a task takes when few long rows are split across cores
# (256 KB of float32: the task's sweeps stay in L2).
comptime ROW_CHUNK = 1 << 16


def softmax_cpu[
    dtype: DType, log_out: Bool
](
    dst: Pointer[Scalar[dtype], MutAnyOrigin],
    src: Pointer[Scalar[dtype], MutAnyOrigin],
    outer: Int,
    n: Int,
    inner: Int,
) raises:
    """Softmax (or log-softmax) of every row of `src` into `dst`.

    Parameters:
        dtype: Element type of both tensors.
        log_out: Write log-softmax instead of softmax.

    Args:
        dst: Output, `outer * n * inner` elements, row-major.
        src: Input, same shape.
        outer: Product of the dims before the softmax axis.
        n: Length of the softmax axis.
        inner: Product of the dims after it.
    """
    if inner == 1:
        _contiguous_rows[dtype, log_out](dst, src, outer, n)
    else:
        _strided_rows[dtype, log_out](dst, src, outer, n, inner)


def _contiguous_rows[
    dtype: DType, log_out: Bool
](
    dst: Pointer[Scalar[dtype], MutAnyOrigin],
    src: Pointer[Scalar[dtype], MutAnyOrigin],
    rows: Int,
    n: Int,
) raises:
    comptime acc = accum_dtype[dtype]()
    comptime assert acc.is_floating_point()
    # Few long rows: a task per row would leave cores idle.
    if n >= 2 * ROW_CHUNK and rows < 4 * num_logical_cores():
        _split_rows[dtype, log_out](dst, src, rows, n)
        return
    var rows_per_task = items_per_task(n)
    var tasks = ceildiv(rows, rows_per_task)

    # Softmax parks the exps and rescales them in the last sweep instead of
    # computing exp twice: 32/64-bit types in dst; 16-bit types in a float32
    # scratch row per task (parking them in dst would round twice). The
    # 16-bit outputs need exps good to ~1e-6, not float32's 1e-7: exp_lean.
    comptime park_in_dst = not log_out and size_of[dtype]() >= 4
    comptime park_in_scratch = not log_out and size_of[dtype]() < 4
    comptime lean = park_in_scratch

    def task(t: Int) raises {imm}:
        var scratch_row = List[Scalar[acc]](
            capacity=n if park_in_scratch else 0
        )
        var scratch = rebind[Pointer[Scalar[acc], MutAnyOrigin]](
            scratch_row.unsafe_ptr()
        )
        for r in range(t * rows_per_task, min(rows, (t + 1) * rows_per_task)):
            var x = src.unsafe_offset(r * n)
            var y = dst.unsafe_offset(r * n)
            var m = _max_of[dtype](x, n)
            var s = _exp_sum[dtype, park_in_dst, park_in_scratch, lean](
                y, scratch, x, n, m
            )
            _write[dtype, log_out, park_in_dst, park_in_scratch, lean](
                y, scratch, x, n, m, row_scale[log_out, acc](s)
            )
        _ = scratch_row^

    run_tasks(task, tasks)


def _split_rows[
    dtype: DType, log_out: Bool
](
    dst: Pointer[Scalar[dtype], MutAnyOrigin],
    src: Pointer[Scalar[dtype], MutAnyOrigin],
    rows: Int,
    n: Int,
) raises:
    """Rows cut into chunks of `ROW_CHUNK` that run in parallel: each chunk's
    pair (max, sum of exp(x - max)), then each row's pairs folded, then each
    chunk written."""
    comptime acc = accum_dtype[dtype]()
    comptime assert acc.is_floating_point()
    var chunks = ceildiv(n, ROW_CHUNK)
    var tasks = rows * chunks
    # 32/64-bit softmax parks exp(x - chunk max) in dst and rescales it by
    # exp(chunk max - row max) / sum; 16-bit types compute exp again, lean.
    comptime park_in_dst = not log_out and size_of[dtype]() >= 4
    comptime lean = not log_out and size_of[dtype]() < 4
    var pairs_list = List[Scalar[acc]](length=2 * tasks, fill=0)
    var pairs = pairs_list.unsafe_ptr()
    var row_pairs_list = List[Scalar[acc]](length=2 * rows, fill=0)
    var row_pairs = row_pairs_list.unsafe_ptr()
    # Nothing parks in a scratch row here: the sweeps get an empty one.
    var empty = List[Scalar[acc]]()
    var no_scratch = rebind[Pointer[Scalar[acc], MutAnyOrigin]](
        empty.unsafe_ptr()
    )

    def chunk_pair(t: Int) raises {imm}:
        var c = t % chunks
        var begin = (t // chunks) * n + c * ROW_CHUNK
        var count = min(ROW_CHUNK, n - c * ROW_CHUNK)
        var m = _max_of[dtype](src.unsafe_offset(begin), count)
        var shift = sum_shift[acc](m)
        var s = _exp_sum[dtype, park_in_dst, False, lean](
            dst.unsafe_offset(begin),
            no_scratch,
            src.unsafe_offset(begin),
            count,
            shift,
        )
        pairs[unsafe_offset=2 * t] = m
        pairs[unsafe_offset=2 * t + 1] = s

    run_tasks(chunk_pair, tasks)

    # Each row's max and scale, folded once from its chunks' pairs.
    for r in range(rows):
        var row_max = -inf[acc]()
        var row_sum = Scalar[acc](0)
        for k in range(r * chunks, (r + 1) * chunks):
            (row_max, row_sum) = fold_pair[acc](
                row_max,
                row_sum,
                pairs[unsafe_offset=2 * k],
                pairs[unsafe_offset=2 * k + 1],
            )
        row_pairs[unsafe_offset=2 * r] = row_max
        row_pairs[unsafe_offset=2 * r + 1] = row_scale[log_out, acc](
            online_sum_guard[acc](row_max, row_sum)
        )

    def write_chunk(t: Int) raises {imm}:
        var r = t // chunks
        var c = t % chunks
        var begin = r * n + c * ROW_CHUNK
        var count = min(ROW_CHUNK, n - c * ROW_CHUNK)
        var row_max = row_pairs[unsafe_offset=2 * r]
        var scale = row_pairs[unsafe_offset=2 * r + 1]
        comptime if park_in_dst:
            # Parked exps are exp(x - sum_shift(chunk max)). A chunk whose
            # max is -inf parked zeros, which exp(-inf - row max) = 0 keeps;
            # one whose max is +inf (or a row of NaN) makes the scale NaN
            # anyway.
            scale = (
                exp_nan[acc, 1](pairs[unsafe_offset=2 * t] - row_max) * scale
            )
        _write[dtype, log_out, park_in_dst, False, lean](
            dst.unsafe_offset(begin),
            no_scratch,
            src.unsafe_offset(begin),
            count,
            row_max,
            scale,
        )

    run_tasks(write_chunk, tasks)
    _ = pairs_list^
    _ = row_pairs_list^
    _ = empty^


@always_inline
def _max_of[
    dtype: DType
](x: Pointer[Scalar[dtype], MutAnyOrigin], count: Int) -> Scalar[
    accum_dtype[dtype]()
]:
    """The largest of x[0:count], NaN left out (-inf if there is none)."""
    comptime acc = accum_dtype[dtype]()
    comptime W = simd_width_of[acc]()
    var n_vec = count - count % W
    # A select, not `max`: one vmaxps instead of two instructions that keep
    # NaN out. NaN is left out either way (v > m is false); a NaN in the row
    # makes its sum, and so the row, NaN. Four running maxima, so the sweep
    # is not one chain of dependent maxes.
    var mv = SIMD[acc, 4 * W](-inf[acc]())
    var j4 = n_vec - n_vec % (4 * W)
    for j in range(0, j4, 4 * W):
        var v = x.unsafe_offset(j).unsafe_load[width=4 * W]().cast[acc]()
        mv = v.gt(mv).select(v, mv)
    for j in range(j4, n_vec, W):
        var v = x.unsafe_offset(j).unsafe_load[width=W]().cast[acc]()
        var low = mv.slice[W]()
        mv = mv.insert(v.gt(low).select(v, low))
    var m = mv.reduce_max()
    for j in range(n_vec, count):
        var v = x[unsafe_offset=j].cast[acc]()
        m = v.gt(m).select(v, m)
    return m


@always_inline
def _exp_sum[
    dtype: DType, park_in_dst: Bool, park_in_scratch: Bool, lean: Bool
](
    y: Pointer[Scalar[dtype], MutAnyOrigin],
    scratch: Pointer[Scalar[accum_dtype[dtype]()], MutAnyOrigin],
    x: Pointer[Scalar[dtype], MutAnyOrigin],
    count: Int,
    m: Scalar[accum_dtype[dtype]()],
) -> Scalar[accum_dtype[dtype]()]:
    """Sum of exp(x - m) over x[0:count], each exp parked in y or scratch
    (`lean`: by `exp_lean`, for 16-bit softmax)."""
    comptime acc = accum_dtype[dtype]()
    comptime W = simd_width_of[acc]()
    var n_vec = count - count % W
    # Blocked summation: float32 lanes each add at most SUM_BLOCK / W terms
    # before folding into the total, so a 1M-long row keeps ~1e-6 relative
    # error instead of ~1e-4.
    var s = Scalar[acc](0)
    for b in range(0, n_vec, SUM_BLOCK):
        var sv = SIMD[acc, W](0)
        for j in range(b, min(b + SUM_BLOCK, n_vec), W):
            var e = row_exp[acc, W, lean](
                x.unsafe_offset(j).unsafe_load[width=W]().cast[acc]() - m
            )
            comptime if park_in_dst:
                y.unsafe_offset(j).unsafe_store(e.cast[dtype]())
            elif park_in_scratch:
                scratch.unsafe_offset(j).unsafe_store(e)
            sv += e
        s += sv.reduce_add()
    for j in range(n_vec, count):
        var e = exp_nan[acc, 1](x[unsafe_offset=j].cast[acc]() - m)
        comptime if park_in_dst:
            y[unsafe_offset=j] = e.cast[dtype]()
        elif park_in_scratch:
            scratch[unsafe_offset=j] = e
        s += e
    return s


@always_inline
def _write[
    dtype: DType,
    log_out: Bool,
    park_in_dst: Bool,
    park_in_scratch: Bool,
    lean: Bool,
](
    y: Pointer[Scalar[dtype], MutAnyOrigin],
    scratch: Pointer[Scalar[accum_dtype[dtype]()], MutAnyOrigin],
    x: Pointer[Scalar[dtype], MutAnyOrigin],
    count: Int,
    m: Scalar[accum_dtype[dtype]()],
    scale: Scalar[accum_dtype[dtype]()],
):
    """Write y[0:count]: the parked exps times `scale`, or the epilogue
    (`lean`: softmax's exp by `exp_lean`)."""
    comptime acc = accum_dtype[dtype]()
    comptime W = simd_width_of[acc]()
    var n_vec = count - count % W
    for j in range(0, n_vec, W):
        comptime if park_in_dst:
            var e = y.unsafe_offset(j).unsafe_load[width=W]().cast[acc]()
            y.unsafe_offset(j).unsafe_store((e * scale).cast[dtype]())
        elif park_in_scratch:
            var e = scratch.unsafe_offset(j).unsafe_load[width=W]()
            y.unsafe_offset(j).unsafe_store((e * scale).cast[dtype]())
        elif lean and not log_out:
            var v = x.unsafe_offset(j).unsafe_load[width=W]().cast[acc]()
            var e = row_exp[acc, W, lean](v - m)
            y.unsafe_offset(j).unsafe_store((e * scale).cast[dtype]())
        else:
            var v = x.unsafe_offset(j).unsafe_load[width=W]().cast[acc]()
            y.unsafe_offset(j).unsafe_store(
                epilogue[log_out, acc, W](v, m, scale).cast[dtype]()
            )
    for j in range(n_vec, count):
        comptime if park_in_dst:
            y[unsafe_offset=j] = (y[unsafe_offset=j].cast[acc]() * scale).cast[
                dtype
            ]()
        elif park_in_scratch:
            y[unsafe_offset=j] = (scratch[unsafe_offset=j] * scale).cast[
                dtype
            ]()
        else:
            var v = x[unsafe_offset=j].cast[acc]()
            y[unsafe_offset=j] = epilogue[log_out, acc, 1](v, m, scale).cast[
                dtype
            ]()


def _strided_rows[
    dtype: DType, log_out: Bool
](
    dst: Pointer[Scalar[dtype], MutAnyOrigin],
    src: Pointer[Scalar[dtype], MutAnyOrigin],
    outer: Int,
    n: Int,
    inner: Int,
) raises:
    comptime acc = accum_dtype[dtype]()
    comptime assert acc.is_floating_point()
    comptime W = simd_width_of[acc]()
    var col_blocks = ceildiv(inner, W)
    var items = outer * col_blocks
    var per_task = items_per_task(n * W)

    def task(t: Int) raises {imm}:
        for item in range(t * per_task, min(items, (t + 1) * per_task)):
            var o = item // col_blocks
            var i0 = (item % col_blocks) * W
            var base = o * n * inner + i0
            if i0 + W <= inner:
                _column_block[dtype, log_out, W](dst, src, base, n, inner)
            else:
                for i in range(i0, inner):
                    _column_block[dtype, log_out, 1](
                        dst, src, base + i - i0, n, inner
                    )

    run_tasks(task, ceildiv(items, per_task))


@always_inline
def _column_block[
    dtype: DType, log_out: Bool, w: Int
](
    dst: Pointer[Scalar[dtype], MutAnyOrigin],
    src: Pointer[Scalar[dtype], MutAnyOrigin],
    base: Int,
    n: Int,
    stride: Int,
):
    """Softmax down `w` adjacent columns of stride `stride` at once."""
    comptime acc = accum_dtype[dtype]()
    comptime assert acc.is_floating_point()
    var m = SIMD[acc, w](-inf[acc]())
    for j in range(n):
        m = max(
            m,
            src.unsafe_offset(base + j * stride)
            .unsafe_load[width=w]()
            .cast[acc](),
        )
    var s = SIMD[acc, w](0)
    for b in range(0, n, SUM_BLOCK):
        var part = SIMD[acc, w](0)  # blocked summation, as in _contiguous_rows
        for j in range(b, min(b + SUM_BLOCK, n)):
            var v = (
                src.unsafe_offset(base + j * stride)
                .unsafe_load[width=w]()
                .cast[acc]()
            )
            part += exp_nan[acc, w](v - m)
        s += part
    var scale = row_scale[log_out, acc, w](s)
    for j in range(n):
        var at = base + j * stride
        var v = src.unsafe_offset(at).unsafe_load[width=w]().cast[acc]()
        dst.unsafe_offset(at).unsafe_store(
            epilogue[log_out, acc, w](v, m, scale).cast[dtype]()
        )
