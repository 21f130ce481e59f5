"""Long rows split across blocks, each chunk held in shared memory: read once.

32 rows of a million float32 values (128 MB) fit neither one block per row
nor the 50 MB L2, so the re-reading split (gpu_split_rows) moves three
tensors through HBM. Here row r is cut into chunks of 72 KB and each chunk
is a block that

1. loads its chunk into shared memory (the row's only read) and reduces
   the chunk's pair (max, sum of exp(x - max)) from there;
2. publishes the pair and counts itself in row r's arrival counter
   (release);
3. waits for the row's other chunks (acquire), folds their pairs into the
   row's max and sum;
4. writes its chunk from shared memory.

Three blocks of 512 threads fit an SM (3 x 72 KB), so about 28 MB of rows
are on chip at once: enough to keep HBM busy while some blocks wait for
their row.

Blocks take chunks by ticket, in row order, and publish before they wait,
so the only row that can hold blocks waiting is the one holding the lowest
ticket not yet taken. Progress then needs room for one row's chunks on the
GPU at once: `ON_CHIP_SPLIT_MAX_ROW_BYTES` (8 MB, 38 SMs' worth) bounds
that; longer rows go to the re-reading split, which needs no room at all.

The split baseline the streaming split (gpu_split_stream_rows) replaced,
kept as a selectable variant (`variant="split_smem"`); both run the chunk
steps of gpu_split_chunks.
"""

from max.gpu import MAX_THREADS_PER_BLOCK_METADATA
from max.gpu.host import DeviceContext, FuncAttribute
from max.gpu.memory import AddressSpace, external_memory
from std.math import ceildiv
from std.sys import size_of
from std.utils import StaticTuple

from ..gpu_launch import aligned_flag_of
from ..gpu_split_chunks import (
    chunk_bytes,
    chunk_pair,
    chunk_shared_bytes,
    load_chunk,
    smem_chunk,
    write_chunk,
)
from ..gpu_split_workspace import (
    check_on_chip_split,
    multiprocessors,
    publish_pair,
    row_max_scale,
    split_counters,
    take_ticket,
    wait_for_row,
)
from ..row_math import accum_dtype, vector_width
from ..row_tensors import LaunchRows

# Threads of the blocks resident on an SM: their registers (40 each) and,
# with 9 vectors of 16 bytes a thread, their chunks (216 of the SM's 227 KB)
# fill it. 9 vectors (72 KB chunks) measured 1-5% faster than 8 at 32 x 1M:
# more of the rows on chip at once (see benchmarks/RESULTS.md, 'GPU few
# long rows').
comptime SPLIT_SMEM_SM_THREADS = 1536
comptime SPLIT_SMEM_VECTORS = 9
# Threads a block: 512 (3 blocks an SM). 256-thread blocks (6 an SM, half
# the chunk) end sooner, which was to shorten the last wave, but measured
# slower at 32 x 1M: fp32 2389 vs 2527 GB/s (see benchmarks/RESULTS.md,
# 'GPU few long rows').
comptime SPLIT_SMEM_THREADS = 512


@__llvm_metadata(
    MAX_THREADS_PER_BLOCK_METADATA=StaticTuple[Int32, 1](Int32(T)),
    `nvvm.minctasm`=SIMDLength(SPLIT_SMEM_SM_THREADS // T),
)
def split_smem_rows_kernel[
    dtype: DType,
    log_out: Bool,
    V: Int,
    T: Int,
](
    dst: Pointer[Scalar[dtype], MutAnyOrigin],
    src: Pointer[Scalar[dtype], MutAnyOrigin],
    counters: Pointer[Int32, MutAnyOrigin],
    partials: Pointer[Scalar[accum_dtype[dtype]()], MutAnyOrigin],
    n: Int64,
    aligned_flag: Int32,
):
    """One chunk of `chunk_bytes(T, SPLIT_SMEM_VECTORS)` per block;
    `rows * chunks` blocks.

    Parameters:
        dtype: Element type.
        log_out: Write log-softmax instead of softmax.
        V: Elements per 16-byte vector of `dtype`.
        T: Threads per block.

    Args:
        dst: Output rows.
        src: Input rows of `n` elements.
        counters: `1 + rows` zeroed counters: the ticket counter, then one
            arrival counter per row.
        partials: `rows * chunks * 2` accumulators, a (max, sum) per chunk.
        n: Row length.
        aligned_flag: Nonzero when `src` and `dst` start 16-byte aligned,
            so element offsets alone decide which loads are aligned.
    """
    comptime acc = accum_dtype[dtype]()
    comptime assert acc.is_floating_point()
    comptime K = SPLIT_SMEM_VECTORS
    comptime C = chunk_bytes(T, K) // size_of[dtype]()
    var len = Int(n)
    var chunks = (len + C - 1) // C
    var chunk = smem_chunk[V, C](
        take_ticket(counters), len, chunks, aligned_flag
    )
    var buf = external_memory[
        Scalar[dtype], address_space=AddressSpace.SHARED, alignment=16
    ]()
    load_chunk[dtype, V, T, K](chunk, src, buf)
    var pair = chunk_pair[dtype, V, T, K](chunk, buf)
    publish_pair(
        counters, partials, chunk.row, chunks, chunk.index, pair[0], pair[1]
    )
    wait_for_row(counters, chunk.row, chunks)
    var terms = row_max_scale[acc, T, log_out](partials, chunk.row, chunks)
    write_chunk[dtype, log_out, V, T](chunk, dst, buf, terms[0], terms[1])


def launch_split_smem_rows[
    dtype: DType,
    log_out: Bool,
    T: Int = SPLIT_SMEM_THREADS,
](ctx: DeviceContext, r: LaunchRows[dtype]) raises:
    """Launch `split_smem_rows_kernel` on `r`'s rows with blocks of T
    threads: one per chunk, after zeroing its counters. Raises unless the row fits
    (`check_on_chip_split`)."""
    comptime acc = accum_dtype[dtype]()
    comptime assert acc.is_floating_point()
    comptime V = vector_width[dtype]()
    var rows = r.rows
    var n = r.n
    var chunks = ceildiv(
        n * size_of[dtype](), chunk_bytes(T, SPLIT_SMEM_VECTORS)
    )
    # A chunk a block, SPLIT_SMEM_SM_THREADS // T blocks an SM.
    check_on_chip_split[dtype](
        ctx,
        "split_smem",
        n,
        chunks,
        multiprocessors(ctx) * (SPLIT_SMEM_SM_THREADS // T),
    )
    var counters = split_counters(ctx, rows)
    var partials = ctx.enqueue_create_buffer[acc](rows * chunks * 2)
    comptime kernel = split_smem_rows_kernel[dtype, log_out, V, T]
    var smem_bytes = chunk_shared_bytes(T, SPLIT_SMEM_VECTORS)
    ctx.enqueue_function[kernel](
        r.dst(),
        r.a(),
        rebind[Pointer[Int32, MutAnyOrigin]](counters.unsafe_ptr()),
        rebind[Pointer[Scalar[acc], MutAnyOrigin]](partials.unsafe_ptr()),
        Int64(n),
        aligned_flag_of(r.aligned),
        grid_dim=rows * chunks,
        block_dim=T,
        shared_mem_bytes=smem_bytes,
        func_attribute=FuncAttribute.MAX_DYNAMIC_SHARED_SIZE_BYTES(
            UInt32(smem_bytes)
        ),
    )
    # The buffers are freed in stream order, after the kernel.
    _ = counters^
    _ = partials^
