"""Long rows split across blocks that stay resident and stream chunk after
chunk, two chunk buffers each: a chunk loads while the one before waits for
its row and is written.

In gpu_split_smem_rows a block holds one chunk: it loads it, then waits for
the rest of its row, then writes it and exits, so an SM whose blocks are
all waiting has no loads in flight. At 32 x 1M bfloat16 (2.3 waves of
blocks) Nsight Compute put a quarter of the warp stalls at that wait and
DRAM at 57% of peak (RESULTS, session 6). Here `2 x SMs` blocks loop:

1. take the next chunk's ticket and start its cp.async copy into the free
   buffer;
2. if the held chunk's row is complete, write the held chunk while the new
   one lands; otherwise reduce and publish the new chunk first;
3. fold the new chunk's pair (max, sum of exp(x - max)) and publish it,
   if step 2 has not; it becomes the held chunk.

A block never waits for a row while holding an unpublished chunk of that
row or an earlier one (step 2 publishes first unless the row is already
complete), and tickets go in row order, so a row can block progress only
if its chunks outnumber two per resident block: `SPLIT_SMEM_MAX_ROW_BYTES`
(8 MB) bounds rows as in gpu_split_smem_rows. Blocks that never start hold
no tickets, so any share of the GPU that fits one row is safe.

At 32 x 1M (RESULTS, session 7) this reaches 91% of a device copy in fp32
and 81% in bf16, against 84% and 80% for gpu_split_smem_rows in the same
run. Taking the next ticket earlier, before the write, measured slower: it
spreads a row's chunks over more time.
"""

from max.gpu import MAX_THREADS_PER_BLOCK_METADATA
from max.gpu.memory import AddressSpace, external_memory
from std.sys import size_of
from std.utils import StaticTuple

from .gpu_split_rows import row_ready, take_ticket, wait_for_row
from .gpu_split_smem_rows import (
    load_chunk,
    publish_chunk,
    smem_chunk,
    split_smem_chunk_bytes,
    split_smem_shared_bytes,
    write_row_chunk,
)
from .row_math import accum_dtype

# Threads a block, blocks an SM, 16-byte vectors a thread in each of a
# block's two buffers: 2 blocks x 2 buffers x 56 KB = 224 of the SM's
# 227 KB. One 1024-thread block an SM (same buffers) measured slower at
# 32 x 1M: bf16 2036 vs 2394 GB/s, fp32 2413 vs 2753 (RESULTS, s12a).
comptime SPLIT_STREAM_SM_THREADS = 1024
comptime SPLIT_STREAM_THREADS = 512
comptime SPLIT_STREAM_VECTORS = 7


def split_stream_shared_bytes(threads: Int, vectors: Int) -> Int:
    """Dynamic shared memory a block needs: two chunk buffers, each with
    its vector of padding (see `SmemChunk`)."""
    return 2 * split_smem_shared_bytes(threads, vectors)


@__llvm_metadata(
    MAX_THREADS_PER_BLOCK_METADATA=StaticTuple[Int32, 1](Int32(T)),
    `nvvm.minctasm`=SIMDLength(SPLIT_STREAM_SM_THREADS // T),
)
def split_stream_rows_kernel[
    dtype: DType,
    log_out: Bool,
    V: Int,
    T: Int,
    K: Int,
](
    dst: Pointer[Scalar[dtype], MutAnyOrigin],
    src: Pointer[Scalar[dtype], MutAnyOrigin],
    counters: Pointer[Int32, MutAnyOrigin],
    partials: Pointer[Scalar[accum_dtype[dtype]()], MutAnyOrigin],
    rows: Int64,
    n: Int64,
    aligned_flag: Int32,
):
    """Chunks of `split_smem_chunk_bytes(T, K)`, taken by ticket until all
    `rows * chunks` are written; any grid size works.

    Parameters:
        dtype: Element type.
        log_out: Write log-softmax instead of softmax.
        V: Elements per 16-byte vector of `dtype`.
        T: Threads per block.
        K: 16-byte vectors a thread in each buffer.

    Args:
        dst: Output rows.
        src: Input rows of `n` elements.
        counters: `1 + rows` zeroed counters: the ticket counter, then one
            arrival counter per row.
        partials: `rows * chunks * 2` accumulators, a (max, sum) per chunk.
        rows: Number of rows.
        n: Row length.
        aligned_flag: Nonzero when `src` and `dst` start 16-byte aligned.
    """
    comptime C = split_smem_chunk_bytes(T, K) // size_of[dtype]()
    var len = Int(n)
    var chunks = (len + C - 1) // C
    var total = Int(rows) * chunks
    var held_buf = external_memory[
        Scalar[dtype], address_space=AddressSpace.SHARED, alignment=16
    ]()
    # The second buffer starts past the first and its padding vector.
    var free_buf = held_buf.unsafe_offset(C + V)

    var ticket = take_ticket(counters)
    if ticket >= total:
        return
    var held = smem_chunk[V, C](ticket, len, chunks, aligned_flag)
    load_chunk[dtype, V, T, K](held, src, held_buf)
    publish_chunk[dtype, V, T, K](held, held_buf, counters, partials, chunks)

    while True:
        ticket = take_ticket(counters)
        var more = ticket < total
        var next = held
        var published = True
        if more:
            next = smem_chunk[V, C](ticket, len, chunks, aligned_flag)
            load_chunk[dtype, V, T, K](next, src, free_buf)
            published = False
            # Publish first when the held row still waits: this chunk may
            # be what it waits for.
            if not row_ready(counters, held.row, chunks):
                publish_chunk[dtype, V, T, K](
                    next, free_buf, counters, partials, chunks
                )
                published = True
        wait_for_row(counters, held.row, chunks)
        write_row_chunk[dtype, log_out, V, T](
            held, dst, held_buf, partials, chunks
        )
        if not more:
            return
        if not published:
            publish_chunk[dtype, V, T, K](
                next, free_buf, counters, partials, chunks
            )
        held = next
        var swap = held_buf
        held_buf = free_buf
        free_buf = swap
