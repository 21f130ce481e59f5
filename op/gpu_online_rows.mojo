"""Long rows that do not fit on chip: a block per row, two sweeps.

Sweep 1 reads the row once and keeps, per thread, an online pair
(running max, sum of exp(x - running max)), rescaling the sum whenever the
max grows; the pairs are combined across the block. Sweep 2 reads the row
again (often from L2) and writes the result. Loads are 16-byte vectors when
the row is aligned, scalar otherwise.
"""

from max.gpu import block_idx, thread_idx
from std.utils.numerics import inf

from .gpu_reductions import block_max_sum
from .row_math import (
    accum_dtype,
    epilogue,
    online_add,
    online_sum_guard,
    row_scale,
)

comptime ONLINE_THREADS = 1024


@always_inline
def online_pair[
    dtype: DType, V: Int, threads: Int
](
    x: Pointer[Scalar[dtype], MutAnyOrigin],
    begin: Int,
    end: Int,
    t: Int,
    vector_loads: Bool,
) -> Tuple[Scalar[accum_dtype[dtype]()], Scalar[accum_dtype[dtype]()]]:
    """This thread's online (max, sum) over x[begin:end], strided by block."""
    comptime acc = accum_dtype[dtype]()
    comptime assert acc.is_floating_point()
    var m = -inf[acc]()
    var s = Scalar[acc](0)
    if vector_loads:
        for e in range(begin + t * V, end, threads * V):
            var v = (
                x.unsafe_offset(e)
                .unsafe_load[width=V, alignment=16]()
                .cast[acc]()
            )
            var pair = online_add[acc, V](m, s, v)
            m = pair[0]
            s = pair[1]
    else:
        for e in range(begin + t, end, threads):
            var v = x[unsafe_offset=e].cast[acc]()
            var pair = online_add[acc, 1](m, s, v)
            m = pair[0]
            s = pair[1]
    return (m, s)


@always_inline
def normalize_range[
    dtype: DType, log_out: Bool, V: Int, threads: Int
](
    y: Pointer[Scalar[dtype], MutAnyOrigin],
    x: Pointer[Scalar[dtype], MutAnyOrigin],
    begin: Int,
    end: Int,
    t: Int,
    vector_loads: Bool,
    row_max: Scalar[accum_dtype[dtype]()],
    scale: Scalar[accum_dtype[dtype]()],
):
    """Write the epilogue for x[begin:end], strided by block."""
    comptime acc = accum_dtype[dtype]()
    comptime assert acc.is_floating_point()
    if vector_loads:
        for e in range(begin + t * V, end, threads * V):
            var v = (
                x.unsafe_offset(e)
                .unsafe_load[width=V, alignment=16]()
                .cast[acc]()
            )
            y.unsafe_offset(e).unsafe_store[alignment=16](
                epilogue[log_out, acc, V](v, row_max, scale).cast[dtype]()
            )
    else:
        for e in range(begin + t, end, threads):
            var v = x[unsafe_offset=e].cast[acc]()
            y[unsafe_offset=e] = epilogue[log_out, acc, 1](
                v, row_max, scale
            ).cast[dtype]()


def online_rows_kernel[
    dtype: DType, log_out: Bool, V: Int
](
    dst: Pointer[Scalar[dtype], MutAnyOrigin],
    src: Pointer[Scalar[dtype], MutAnyOrigin],
    n: Int64,
    vector_flag: Int32,
):
    """One block of `ONLINE_THREADS` per row, rows of any length.

    Parameters:
        dtype: Element type.
        log_out: Write log-softmax instead of softmax.
        V: Elements per 16-byte vector of `dtype`.

    Args:
        dst: Output rows.
        src: Input rows, `grid_dim.x` rows of `n` elements.
        n: Row length.
        vector_flag: Nonzero when rows are 16-byte aligned (n % V == 0).
    """
    comptime acc = accum_dtype[dtype]()
    comptime assert acc.is_floating_point()
    var vector_loads = vector_flag != 0
    var t = Int(thread_idx.x)
    var len = Int(n)
    var x = src.unsafe_offset(Int(block_idx.x) * len)
    var y = dst.unsafe_offset(Int(block_idx.x) * len)
    var pair = online_pair[dtype, V, ONLINE_THREADS](x, 0, len, t, vector_loads)
    var total = block_max_sum[acc, ONLINE_THREADS](pair[0], pair[1])
    var row_max = total[0]
    var scale = row_scale[log_out, acc](
        online_sum_guard[acc](row_max, total[1])
    )
    normalize_range[dtype, log_out, V, ONLINE_THREADS](
        y, x, 0, len, t, vector_loads, row_max, scale
    )
