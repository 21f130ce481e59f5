"""Few very long rows: each row split across many blocks.

With 1-64 rows of a million elements, a block per row leaves most of the
GPU idle. Here row r is cut into chunks of `SPLIT_CHUNK` elements, one block
each (grid = chunks x rows):

1. `split_partials_kernel`: each block writes its chunk's online pair
   (max, sum of exp(x - max)) to a small scratch buffer;
2. `split_normalize_kernel`: each block combines its row's pairs (a few
   hundred floats, from L2) and normalises its own chunk.
"""

from max.gpu import block_idx, thread_idx
from std.utils.numerics import inf

from .gpu_online_rows import normalize_range, online_pair
from .gpu_reductions import block_max_sum
from .row_math import accum_dtype, fold_pair, online_sum_guard, row_scale

comptime SPLIT_THREADS = 512
comptime SPLIT_CHUNK = 16384


def split_partials_kernel[
    dtype: DType, V: Int
](
    partials: Pointer[Scalar[accum_dtype[dtype]()], MutAnyOrigin],
    src: Pointer[Scalar[dtype], MutAnyOrigin],
    n: Int64,
    vector_flag: Int32,
):
    """Block (c, r) stores the online pair of chunk c of row r.

    Args:
        partials: `rows * chunks * 2` accumulators: (max, sum) per chunk.
        src: Input rows of `n` elements.
        n: Row length.
        vector_flag: Nonzero when rows are 16-byte aligned (n % V == 0).
    """
    comptime acc = accum_dtype[dtype]()
    comptime assert acc.is_floating_point()
    var vector_loads = vector_flag != 0
    var t = Int(thread_idx.x)
    var c = Int(block_idx.x)
    var r = Int(block_idx.y)
    var len = Int(n)
    var x = src.unsafe_offset(r * len)
    var begin = c * SPLIT_CHUNK
    var pair = online_pair[dtype, V, SPLIT_THREADS](
        x, begin, min(len, begin + SPLIT_CHUNK), t, vector_loads
    )
    var total = block_max_sum[acc, SPLIT_THREADS](pair[0], pair[1])
    if t == 0:
        var at = (r * Int(grid_chunks(n)) + c) * 2
        partials[unsafe_offset=at] = total[0]
        partials[unsafe_offset=at + 1] = total[1]


def split_normalize_kernel[
    dtype: DType, log_out: Bool, V: Int
](
    dst: Pointer[Scalar[dtype], MutAnyOrigin],
    src: Pointer[Scalar[dtype], MutAnyOrigin],
    partials: Pointer[Scalar[accum_dtype[dtype]()], MutAnyOrigin],
    n: Int64,
    vector_flag: Int32,
):
    """Block (c, r) combines row r's pairs and writes chunk c of row r."""
    comptime acc = accum_dtype[dtype]()
    comptime assert acc.is_floating_point()
    var vector_loads = vector_flag != 0
    var t = Int(thread_idx.x)
    var c = Int(block_idx.x)
    var r = Int(block_idx.y)
    var len = Int(n)
    var chunks = Int(grid_chunks(n))

    var m = -inf[acc]()
    var s = Scalar[acc](0)
    for i in range(t, chunks, SPLIT_THREADS):
        var folded = fold_pair[acc](
            m,
            s,
            partials[unsafe_offset=(r * chunks + i) * 2],
            partials[unsafe_offset=(r * chunks + i) * 2 + 1],
        )
        m = folded[0]
        s = folded[1]
    var total = block_max_sum[acc, SPLIT_THREADS](m, s)
    var row_max = total[0]
    var scale = row_scale[log_out, acc](
        online_sum_guard[acc](row_max, total[1])
    )

    var begin = c * SPLIT_CHUNK
    normalize_range[dtype, log_out, V, SPLIT_THREADS](
        dst.unsafe_offset(r * len),
        src.unsafe_offset(r * len),
        begin,
        min(len, begin + SPLIT_CHUNK),
        t,
        vector_loads,
        row_max,
        scale,
    )


@always_inline
def grid_chunks(n: Int64) -> Int64:
    """Chunks (blocks) per row of length `n`."""
    return (n + SPLIT_CHUNK - 1) // SPLIT_CHUNK
