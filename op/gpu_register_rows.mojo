"""Short and medium rows held in registers: global memory is read once.

`threads` threads own one row; each holds `K` chunks of `V` elements in
registers, so a row of up to `threads * V * K` elements is loaded once,
reduced (max, then sum of exp) with warp shuffles, and written once.

- warp rows (`threads == 32`): several rows per block, one per warp, no
  shared memory and no barriers;
- block rows (`threads == ROW_BLOCK_THREADS`): one row per block, warp
  shuffles then a shared-memory combine across warps.

Rows whose length is a multiple of `V` (and whose base is 16-byte aligned)
use 16-byte vector loads: thread t's chunk k is elements
[(k*threads + t)*V, +V). Other rows use the same registers with scalar,
still coalesced, loads: element (k*V + v)*threads + t.
"""

from max.gpu import (
    MAX_THREADS_PER_BLOCK_METADATA,
    WARP_SIZE,
    block_idx,
    thread_idx,
)
from std.utils import StaticTuple
from std.utils.numerics import inf

from .gpu_reductions import block_max, block_sum
from .row_math import accum_dtype, epilogue, exp_nan, row_scale

comptime ROW_BLOCK_THREADS = 512
comptime WARPS_PER_BLOCK = 4
# Row values one thread keeps in registers. With launch bounds of 512
# threads the compiler may use 128 registers a thread; 64 values fit with
# room for addressing. (Without bounds, K=16 asked for more than a block
# has: CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES on the H100.)
comptime MAX_VALUES_PER_THREAD = 64


def block_threads[threads: Int]() -> Int:
    """Threads per block for `threads` threads per row."""
    return threads if threads > WARP_SIZE else WARP_SIZE * WARPS_PER_BLOCK


@__llvm_metadata(
    MAX_THREADS_PER_BLOCK_METADATA=StaticTuple[Int32, 1](
        Int32(block_threads[threads]())
    )
)
def register_rows_kernel[
    dtype: DType,
    log_out: Bool,
    threads: Int,
    V: Int,
    K: Int,
](
    dst: Pointer[Scalar[dtype], MutAnyOrigin],
    src: Pointer[Scalar[dtype], MutAnyOrigin],
    rows: Int64,
    n: Int64,
    vector_flag: Int32,
):
    """Softmax of rows of length `n <= threads * V * K`.

    Parameters:
        dtype: Element type.
        log_out: Write log-softmax instead of softmax.
        threads: Threads per row: `WARP_SIZE` or the whole block.
        V: Elements per chunk (a 16-byte vector of `dtype`).
        K: Chunks per thread.

    Args:
        dst: Output rows.
        src: Input rows.
        rows: Number of rows.
        n: Row length.
        vector_flag: Nonzero when row starts are 16-byte aligned (n % V == 0).
    """
    comptime acc = accum_dtype[dtype]()
    comptime assert acc.is_floating_point()
    comptime assert V * K <= MAX_VALUES_PER_THREAD
    var vector_loads = vector_flag != 0
    comptime rows_per_block = 1 if threads > WARP_SIZE else WARPS_PER_BLOCK
    var t = Int(thread_idx.x) % threads
    var row = Int(block_idx.x) * rows_per_block + Int(thread_idx.x) // threads
    # Whole warps (warp rows) or the whole block (block rows) leave together,
    # so the shuffles and barriers below stay uniform.
    if row >= Int(rows):
        return
    var len = Int(n)
    var x = src.unsafe_offset(row * len)
    var y = dst.unsafe_offset(row * len)

    var vals = SIMD[acc, V * K](-inf[acc]())
    comptime for k in range(K):
        var chunk = SIMD[acc, V](-inf[acc]())
        if vector_loads:
            var e0 = (k * threads + t) * V
            if e0 < len:
                chunk = (
                    x.unsafe_offset(e0)
                    .unsafe_load[width=V, alignment=16]()
                    .cast[acc]()
                )
        else:
            comptime for v in range(V):
                var e = (k * V + v) * threads + t
                if e < len:
                    chunk[v] = x[unsafe_offset=e].cast[acc]()
        vals = vals.insert[offset=k * V](chunk)

    var row_max = block_max[acc, threads](vals.reduce_max())
    # Padding is -inf, so it adds exp(-inf) = 0 unless the whole row is -inf
    # (row_max == -inf), and that row is NaN anyway.
    var sum = block_sum[acc, threads](
        exp_nan[acc, V * K](vals - row_max).reduce_add()
    )
    var scale = row_scale[log_out, acc](sum)
    var out = epilogue[log_out, acc, V * K](vals, row_max, scale)

    comptime for k in range(K):
        var chunk = out.slice[V, offset=k * V]().cast[dtype]()
        if vector_loads:
            var e0 = (k * threads + t) * V
            if e0 < len:
                y.unsafe_offset(e0).unsafe_store[alignment=16](chunk)
        else:
            comptime for v in range(V):
                var e = (k * V + v) * threads + t
                if e < len:
                    y[unsafe_offset=e] = chunk[v]
