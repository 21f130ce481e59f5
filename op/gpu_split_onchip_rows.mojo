"""Few very long rows, split across blocks and read from HBM once.

`gpu_split_rows` reads each row twice (partials, then normalise), so it
cannot pass 2/3 of the copy roof. Here each block keeps its chunk of
`ONCHIP_CHUNK_THREADS` x 32 register values on chip while the blocks of
its row exchange their (max, sum) pairs through global memory:

1. a block takes a ticket (one atomic add); ticket = row * chunks + chunk,
   so blocks take their work in the order they start running;
2. it loads its chunk into registers and reduces it to a pair, which it
   publishes, then counts itself in its row's arrival counter (release);
3. it waits until the counter reaches `chunks` (acquire), folds the row's
   pairs and writes its chunk from registers.

Only blocks of the same row wait for each other, and the ticket order means
every lower ticket is already running: as long as one row's chunks can all
be resident at once (dispatch keeps `chunks <= SM count`, and a block asks
for half an SM at most), the rows ahead always finish and free their slots,
so this cannot deadlock. Rows with more chunks use `gpu_split_rows`.
"""

from max.gpu import (
    MAX_THREADS_PER_BLOCK_METADATA,
    block_idx,
    thread_idx,
)
from max.gpu.memory import AddressSpace
from max.gpu.sync import barrier
from std.atomic import Atomic, Ordering
from std.memory import stack_allocation
from std.utils import StaticTuple
from std.utils.numerics import inf

from .gpu_register_rows import (
    chunk_registers,
    load_row_chunks,
    store_row_chunks,
)
from .gpu_reductions import block_max, block_max_sum, block_sum
from .row_math import (
    accum_dtype,
    epilogue,
    exp_diff,
    fold_pair,
    online_sum_guard,
    row_scale,
)

comptime ONCHIP_CHUNK_THREADS = 512
# 32-bit registers of row values a thread holds: with about as many again
# for the rest, two blocks fit an SM (65,536 registers), so one block can
# load while the other waits for its row.
comptime ONCHIP_ROW_REGISTERS = 16


def onchip_vectors(V: Int) -> Int:
    """16-byte vectors a thread holds: 8 for float32 and float64, 4 for the
    16-bit types (widened to float32, they take twice the registers)."""
    return ONCHIP_ROW_REGISTERS // chunk_registers(V)


def onchip_chunk(V: Int) -> Int:
    """Elements of a row one block holds."""
    return ONCHIP_CHUNK_THREADS * onchip_vectors(V) * V


@__llvm_metadata(
    MAX_THREADS_PER_BLOCK_METADATA=StaticTuple[Int32, 1](
        Int32(ONCHIP_CHUNK_THREADS)
    ),
    `nvvm.minctasm`=SIMDLength(2),
)
def split_onchip_kernel[
    dtype: DType, log_out: Bool, V: Int
](
    dst: Pointer[Scalar[dtype], MutAnyOrigin],
    src: Pointer[Scalar[dtype], MutAnyOrigin],
    counters: Pointer[Int32, MutAnyOrigin],
    partials: Pointer[Scalar[accum_dtype[dtype]()], MutAnyOrigin],
    n: Int64,
    chunks: Int64,
    vector_flag: Int32,
):
    """One chunk of one row per block; `rows * chunks` blocks in all.

    Parameters:
        dtype: Element type.
        log_out: Write log-softmax instead of softmax.
        V: Elements per 16-byte vector of `dtype`.

    Args:
        dst: Output rows.
        src: Input rows of `n` elements.
        counters: `1 + rows` zeroed counters: the ticket counter, then one
            arrival counter per row.
        partials: `rows * chunks * 2` accumulators, a (max, sum) per chunk.
        n: Row length.
        chunks: Blocks per row, `ceil(n / onchip_chunk(V))`.
        vector_flag: Nonzero when rows are 16-byte aligned (n % V == 0).
    """
    comptime acc = accum_dtype[dtype]()
    comptime assert acc.is_floating_point()
    comptime T = ONCHIP_CHUNK_THREADS
    comptime K = onchip_vectors(V)
    comptime CHUNK = T * K * V
    comptime device = Atomic[Int32, scope="device"]
    var t = Int(thread_idx.x)
    var n_chunks = Int(chunks)

    # 1. Which chunk: tickets follow the order blocks start, not block_idx.
    var slot = stack_allocation[1, Int32, address_space=AddressSpace.SHARED]()
    if t == 0:
        slot[] = device.fetch_add[ordering=Ordering.RELAXED](counters, 1)
    barrier()
    var ticket = Int(slot[])
    var r = ticket // n_chunks
    var c = ticket % n_chunks
    var begin = r * Int(n) + c * CHUNK
    var len = min(Int(n) - c * CHUNK, CHUNK)

    # 2. The chunk into registers and its pair. Padding is -inf: it adds
    # exp(-inf) = 0, or (exp_diff) 1 where the whole chunk is -inf, a
    # finite sum that folding scales by exp(-inf - row max) = 0; NaN
    # elements still make the sum NaN.
    var vals = load_row_chunks[dtype, T, V, K](
        src.unsafe_offset(begin), len, t, vector_flag != 0, -inf[acc]()
    )
    var m = block_max[acc, T](vals.reduce_max())
    var s = block_sum[acc, T](
        exp_diff[acc, V * K](vals, SIMD[acc, V * K](m)).reduce_add()
    )
    var arrivals = counters.unsafe_offset(1 + r)
    if t == 0:
        partials[unsafe_offset=(r * n_chunks + c) * 2] = m
        partials[unsafe_offset=(r * n_chunks + c) * 2 + 1] = s
        # Release: the pair is visible before the count that announces it.
        _ = device.fetch_add[ordering=Ordering.RELEASE](arrivals, 1)
        while Int(device.load[ordering=Ordering.ACQUIRE](arrivals)) < n_chunks:
            continue
    barrier()

    # 3. The row's pairs (L2-hot, a few hundred bytes), then the chunk.
    var row_m = -inf[acc]()
    var row_s = Scalar[acc](0)
    for i in range(t, n_chunks, T):
        var at = (r * n_chunks + i) * 2
        var folded = fold_pair[acc](
            row_m,
            row_s,
            partials[unsafe_offset=at],
            partials[unsafe_offset=at + 1],
        )
        row_m = folded[0]
        row_s = folded[1]
    var total = block_max_sum[acc, T](row_m, row_s)
    var row_max = total[0]
    var scale = row_scale[log_out, acc](
        online_sum_guard[acc](row_max, total[1])
    )
    var out = epilogue[log_out, acc, V * K](vals, row_max, scale)
    store_row_chunks[dtype, T, V, K](
        dst.unsafe_offset(begin), out, len, t, vector_flag != 0
    )
