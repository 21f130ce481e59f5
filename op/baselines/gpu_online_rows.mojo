"""Baseline for long rows: a block per row, two sweeps.

The long-row kernel before the on-chip ones (gpu_smem_rows,
gpu_split_stream_rows), kept as a selectable variant (`variant="online"`)
to measure them against. Sweep 1 reads the row once and keeps, per thread,
an online pair (running max, sum of exp(x - running max)), rescaling the
sum whenever the max grows; the pairs are combined across the block. Sweep
2 reads the row again (often from L2) and writes the result. Loads are
16-byte vectors when the row is aligned, scalar otherwise. Both sweeps are
gpu_split_rows' (`online_pair`, `normalize_range`), run over whole rows.
"""

from max.gpu import block_idx, thread_idx

from ..gpu_reductions import block_max_sum
from ..gpu_split_rows import normalize_range, online_pair
from ..row_math import accum_dtype, online_sum_guard, row_scale

comptime ONLINE_THREADS = 1024


def online_rows_kernel[
    dtype: DType, log_out: Bool, V: Int
](
    dst: Pointer[Scalar[dtype], MutAnyOrigin],
    src: Pointer[Scalar[dtype], MutAnyOrigin],
    n: Int64,
    vector_flag: Int32,
):
    """One block of `ONLINE_THREADS` per row, rows of any length: softmax
    (log-softmax with `log_out`) of `src`'s `grid_dim.x` rows of `n` into
    `dst`, V elements a 16-byte vector of `dtype`, read as vectors where
    `vector_flag` says the rows are 16-byte aligned (n % V == 0)."""
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
