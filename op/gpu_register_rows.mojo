"""Short and medium rows held in registers: global memory is read once.

`threads` threads own one row; each holds `K` chunks of `V` elements in
registers, so a row of up to `threads * V * K` elements is loaded once,
reduced (max, then sum of exp) with warp shuffles, and written once.

- warp rows (`threads` = 8, 16 or 32): 16, 8 or 4 rows per block, a
  group of lanes per row reducing with shuffles, no shared memory and no
  barriers;
- block rows (`threads` = 64..512): warp shuffles, then a shared-memory
  combine across the row's warps; blocks of 128 threads hold several rows.

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
from .row_math import accum_dtype, exp_nan, row_scale

comptime MIN_BLOCK_THREADS = 128
# 32-bit registers of row values one thread may hold. With launch bounds of
# 512 threads the compiler may use 128 registers a thread; 64 for the row
# leaves room for addressing. (Without bounds, 64 values asked for more than
# a block has: CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES on the H100; counting
# float64 values as one register each spilled 8 KB a thread.)
comptime MAX_ROW_REGISTERS = 64


def chunk_registers(V: Int) -> Int:
    """32-bit registers one 16-byte chunk takes in the accumulator type: 4
    for float32 and for float64 (2 doubles), 8 for 16-bit types widened to
    float32."""
    return max(V, 4)


# (threads per row, chunks per thread) in the order dispatch tries them:
# short rows get 8 or 16 threads (several rows a warp, shuffles within each
# group) holding up to 4 chunks each, then a warp, then more threads with 4
# chunks (16 fp32 values) each, so short rows keep many rows and bytes in
# flight and long rows reach 512 x 64 values.
comptime NUM_PLANS = 11


def plan_threads(i: Int) -> Int:
    """Threads per row of register plan i: 8, 8, 8, 16, 32, ..., 512, 512, 512.
    """
    if i < 3:
        return 8
    if i < 9:
        return 16 << (i - 3)
    return 512


def plan_chunks(i: Int) -> Int:
    """Chunks (16-byte vectors) per thread of register plan i: 1, 2, 4, 4,
    ..., 4, 8, 16."""
    if i < 3:
        return 1 << i
    if i < 9:
        return 4
    return 4 << (i - 8)


def block_threads[threads: Int]() -> Int:
    """Threads per block for `threads` threads per row."""
    return max(threads, MIN_BLOCK_THREADS)


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
        threads: Threads per row, 8, 16 or a multiple of 32; a block holds
            `block_threads[threads]() / threads` rows.
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
    comptime assert chunk_registers(V) * K <= MAX_ROW_REGISTERS
    comptime assert threads % WARP_SIZE == 0 or WARP_SIZE % threads == 0
    comptime block = block_threads[threads]()
    var vector_loads = vector_flag != 0
    var t = Int(thread_idx.x) % threads
    var row = (
        Int(block_idx.x) * (block // threads) + Int(thread_idx.x) // threads
    )
    # Past the last row: a warp-sized group can leave; a larger group stays
    # for the block's barriers, a smaller one for its warp's shuffles, with
    # len = 0, so it loads and stores nothing.
    var len = Int(n)
    if row >= Int(rows):
        comptime if threads == WARP_SIZE:
            return
        len = 0
        row = 0
    var x = src.unsafe_offset(row * Int(n))
    var y = dst.unsafe_offset(row * Int(n))
    var vals = load_row_chunks[dtype, threads, V, K](
        x, len, t, vector_loads, -inf[acc]()
    )

    var row_max = block_max[acc, threads, block](vals.reduce_max())
    # Padding is -inf, so it adds exp(-inf) = 0 unless the whole row is -inf
    # (row_max == -inf), and that row is NaN anyway. The exps stay in
    # registers for the output: one exp an element, not two (what
    # `epilogue` computes, without recomputing it).
    var shifted = vals - row_max
    var exps = exp_nan[acc, V * K](shifted)
    var scale = row_scale[log_out, acc](
        block_sum[acc, threads, block](exps.reduce_add())
    )
    var out: SIMD[acc, V * K]
    comptime if log_out:
        out = shifted - scale
    else:
        out = exps * scale

    store_row_chunks[dtype, threads, V, K](y, out, len, t, vector_loads)


@always_inline
def load_row_chunks[
    dtype: DType, threads: Int, V: Int, K: Int
](
    x: Pointer[Scalar[dtype], MutAnyOrigin],
    len: Int,
    t: Int,
    vector_loads: Bool,
    pad: Scalar[accum_dtype[dtype]()],
) -> SIMD[accum_dtype[dtype](), V * K]:
    """Thread t's K chunks of a row of `len` (see the module docstring for
    which elements), in the accumulator type; `pad` past the row's end."""
    comptime acc = accum_dtype[dtype]()
    var vals = SIMD[acc, V * K](pad)
    comptime for k in range(K):
        var chunk = SIMD[acc, V](pad)
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
    return vals


@always_inline
def store_row_chunks[
    dtype: DType, threads: Int, V: Int, K: Int
](
    y: Pointer[Scalar[dtype], MutAnyOrigin],
    vals: SIMD[accum_dtype[dtype](), V * K],
    len: Int,
    t: Int,
    vector_loads: Bool,
):
    """Write thread t's K chunks back where `load_row_chunks` got them."""
    comptime for k in range(K):
        var chunk = vals.slice[V, offset=k * V]().cast[dtype]()
        if vector_loads:
            var e0 = (k * threads + t) * V
            if e0 < len:
                y.unsafe_offset(e0).unsafe_store[alignment=16](chunk)
        else:
            comptime for v in range(V):
                var e = (k * V + v) * threads + t
                if e < len:
                    y[unsafe_offset=e] = chunk[v]
