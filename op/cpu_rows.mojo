"""Vectorized, multithreaded CPU softmax over a `(outer, n, inner)` view.

Contiguous rows (`inner == 1`) are split into tasks of whole rows; each row
takes three SIMD sweeps (max; exp and sum; scale). Rows along another axis
(`inner > 1`) are processed `W` columns at a time, so the SIMD lanes run
along the contiguous inner dimension and every load is still a vector load.
"""

from max.algorithm import sync_parallelize
from std.math import ceildiv
from std.sys import simd_width_of, size_of
from std.utils.numerics import inf

from .row_math import accum_dtype, epilogue, exp_lean, exp_nan, row_scale

# Enough elements per task that thread start-up is noise, few enough tasks
# that both cores stay busy on small batches.
comptime TASK_ELEMENTS = 1 << 15
# Terms summed in one accumulator before it is folded into the total.
comptime SUM_BLOCK = 1024


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
    comptime W = simd_width_of[acc]()
    var rows_per_task = max(1, TASK_ELEMENTS // max(n, 1))
    var tasks = ceildiv(rows, rows_per_task)
    var n_vec = n - n % W

    # Softmax parks the exps and rescales them in the last sweep instead of
    # computing exp twice: 32/64-bit types in dst; 16-bit types in a float32
    # scratch row per task (parking them in dst would round twice). The
    # 16-bit outputs need exps good to ~1e-6, not float32's 1e-7: exp_lean.
    comptime park_in_dst = not log_out and size_of[dtype]() >= 4
    comptime park_in_scratch = not log_out and size_of[dtype]() < 4

    def task(t: Int) raises {imm}:
        var scratch_row = List[Scalar[acc]](
            capacity=n if park_in_scratch else 0
        )
        var scratch = scratch_row.unsafe_ptr()
        for r in range(t * rows_per_task, min(rows, (t + 1) * rows_per_task)):
            var x = src.unsafe_offset(r * n)
            var y = dst.unsafe_offset(r * n)

            # A select, not `max`: one vmaxps instead of two instructions
            # that keep NaN out. NaN is left out either way (v > m is false);
            # a NaN in the row makes its sum, and so the row, NaN. Four
            # running maxima, so the sweep is not one chain of dependent maxes.
            var mv = SIMD[acc, 4 * W](-inf[acc]())
            var j4 = n_vec - n_vec % (4 * W)
            for j in range(0, j4, 4 * W):
                var v = (
                    x.unsafe_offset(j).unsafe_load[width=4 * W]().cast[acc]()
                )
                mv = v.gt(mv).select(v, mv)
            for j in range(j4, n_vec, W):
                var v = x.unsafe_offset(j).unsafe_load[width=W]().cast[acc]()
                var low = mv.slice[W]()
                mv = mv.insert(v.gt(low).select(v, low))
            var m = mv.reduce_max()
            for j in range(n_vec, n):
                m = max(m, x[unsafe_offset=j].cast[acc]())

            # Blocked summation: float32 lanes each add at most SUM_BLOCK / W
            # terms before folding into the row total, so a 1M-long row keeps
            # ~1e-6 relative error instead of ~1e-4.
            var s = Scalar[acc](0)
            for b in range(0, n_vec, SUM_BLOCK):
                var sv = SIMD[acc, W](0)
                for j in range(b, min(b + SUM_BLOCK, n_vec), W):
                    var d = (
                        x.unsafe_offset(j).unsafe_load[width=W]().cast[acc]()
                        - m
                    )
                    var e: SIMD[acc, W]
                    comptime if park_in_scratch:
                        e = rebind[SIMD[acc, W]](
                            exp_lean(rebind[SIMD[DType.float32, W]](d))
                        )
                    else:
                        e = exp_nan[acc, W](d)
                    comptime if park_in_dst:
                        y.unsafe_offset(j).unsafe_store(e.cast[dtype]())
                    elif park_in_scratch:
                        scratch.unsafe_offset(j).unsafe_store(e)
                    sv += e
                s += sv.reduce_add()
            for j in range(n_vec, n):
                var e = exp_nan[acc, 1](x[unsafe_offset=j].cast[acc]() - m)
                comptime if park_in_dst:
                    y[unsafe_offset=j] = e.cast[dtype]()
                elif park_in_scratch:
                    scratch[unsafe_offset=j] = e
                s += e

            var scale = row_scale[log_out, acc](s)
            for j in range(0, n_vec, W):
                comptime if park_in_dst:
                    var e = (
                        y.unsafe_offset(j).unsafe_load[width=W]().cast[acc]()
                    )
                    y.unsafe_offset(j).unsafe_store((e * scale).cast[dtype]())
                elif park_in_scratch:
                    var e = scratch.unsafe_offset(j).unsafe_load[width=W]()
                    y.unsafe_offset(j).unsafe_store((e * scale).cast[dtype]())
                else:
                    var v = (
                        x.unsafe_offset(j).unsafe_load[width=W]().cast[acc]()
                    )
                    y.unsafe_offset(j).unsafe_store(
                        epilogue[log_out, acc, W](v, m, scale).cast[dtype]()
                    )
            for j in range(n_vec, n):
                comptime if park_in_dst:
                    y[unsafe_offset=j] = (
                        y[unsafe_offset=j].cast[acc]() * scale
                    ).cast[dtype]()
                elif park_in_scratch:
                    y[unsafe_offset=j] = (
                        scratch[unsafe_offset=j] * scale
                    ).cast[dtype]()
                else:
                    var v = x[unsafe_offset=j].cast[acc]()
                    y[unsafe_offset=j] = epilogue[log_out, acc, 1](
                        v, m, scale
                    ).cast[dtype]()

        _ = scratch_row^

    sync_parallelize(task, tasks)


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

    def task(t: Int) raises {imm}:
        var o = t // col_blocks
        var i0 = (t % col_blocks) * W
        var base = o * n * inner + i0
        if i0 + W <= inner:
            _column_block[dtype, log_out, W](dst, src, base, n, inner)
        else:
            for i in range(i0, inner):
                _column_block[dtype, log_out, 1](
                    dst, src, base + i - i0, n, inner
                )

    sync_parallelize(task, outer * col_blocks)


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
