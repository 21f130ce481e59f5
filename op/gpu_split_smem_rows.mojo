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
GPU at once: `SPLIT_SMEM_MAX_ROW_BYTES` (8 MB, 38 SMs' worth) bounds that;
longer rows go to the re-reading split, which needs no room at all.

The chunk steps (`SmemChunk`, `load_chunk`, `publish_chunk`, `write_row_chunk`)
are shared with the streaming split (gpu_split_stream_rows), whose
resident blocks run them on chunk after chunk.
"""

from max.gpu import MAX_THREADS_PER_BLOCK_METADATA, thread_idx
from max.gpu.memory import (
    AddressSpace,
    async_copy,
    async_copy_commit_group,
    async_copy_wait_all,
    async_copy_wait_group,
    external_memory,
)
from std.sys import size_of
from std.utils import StaticTuple
from std.utils.numerics import inf

from .gpu_reductions import block_max_sum
from .gpu_split_rows import (
    publish_pair,
    row_max_scale,
    take_ticket,
    wait_for_row,
)
from .row_math import (
    accum_dtype,
    epilogue,
    online_add,
)

# Threads of the blocks resident on an SM: their registers (40 each) and,
# with 9 vectors of 16 bytes a thread, their chunks (216 of the SM's 227 KB)
# fill it. 9 vectors (72 KB chunks) measured 1-5% faster than 8 at 32 x 1M
# (RESULTS, s10a/s10b): more of the rows on chip at once.
comptime SPLIT_SMEM_SM_THREADS = 1536
comptime SPLIT_SMEM_VECTORS = 9
# Threads a block: 512 (3 blocks an SM). 256-thread blocks (6 an SM, half
# the chunk) end sooner, which was to shorten the last wave, but measured
# slower at 32 x 1M: fp32 2389 vs 2527 GB/s (RESULTS, s9).
comptime SPLIT_SMEM_THREADS = 512
# Longest row, in bytes: its chunks must all be able to be resident at once
# (see the module docstring); 8 MB is under a third of what the GPU holds.
comptime SPLIT_SMEM_MAX_ROW_BYTES = 8 << 20


def split_smem_chunk_bytes(
    threads: Int, vectors: Int = SPLIT_SMEM_VECTORS
) -> Int:
    """Bytes of row a block of `threads` threads holds, `vectors` 16-byte
    vectors a thread."""
    return threads * vectors * 16


def split_smem_shared_bytes(
    threads: Int, vectors: Int = SPLIT_SMEM_VECTORS
) -> Int:
    """Dynamic shared memory for one chunk: the chunk plus one vector of
    padding that lines the chunk's 16-byte vectors up with its global ones.
    """
    return split_smem_chunk_bytes(threads, vectors) + 16


def split_smem_capacity(size: Int) -> Int:
    """Longest row (elements of `size` bytes) the kernel takes."""
    return SPLIT_SMEM_MAX_ROW_BYTES // size


# A chunk's buffer in shared memory (`external_memory`'s pointer type).
comptime SharedBuffer[dtype: DType] = Pointer[
    Scalar[dtype], MutUntrackedOrigin, address_space=AddressSpace.SHARED
]


@fieldwise_init
struct SmemChunk(ImplicitlyCopyable):
    """Where one chunk of a row lies, in global memory and in its shared
    memory buffer.

    Element e of the chunk lives at buffer[pad + e], so the chunk's aligned
    global vectors are aligned in shared memory too. Elements [0, head) and
    [head + nvec * V, count) go one by one; the `nvec` vectors between by
    cp.async. Unaligned buffers: the whole chunk is "head".
    """

    var row: Int
    """The chunk's row."""
    var index: Int
    """The chunk's place in its row."""
    var start: Int
    """Offset of its first element from the start of the tensor."""
    var count: Int
    """Elements in the chunk (the row's last chunk may be short)."""
    var pad: Int
    """Buffer elements before the chunk's first."""
    var head: Int
    """Elements before the first aligned vector."""
    var nvec: Int
    """Aligned 16-byte vectors."""


@always_inline
def smem_chunk[
    V: Int, C: Int
](ticket: Int, n: Int, chunks: Int, aligned_flag: Int32) -> SmemChunk:
    """The chunk with this ticket: chunk `ticket % chunks` of row `ticket //
    chunks`, rows of `n` elements cut into chunks of C."""
    var r = ticket // chunks
    var c = ticket % chunks
    var begin = c * C
    var count = min(n, begin + C) - begin
    var start = r * n + begin
    var pad = start % V if aligned_flag != 0 else 0
    var head = min((V - pad) % V, count) if aligned_flag != 0 else count
    return SmemChunk(r, c, start, count, pad, head, (count - head) // V)


@always_inline
def load_chunk[
    dtype: DType, V: Int, T: Int, K: Int
](
    chunk: SmemChunk,
    src: Pointer[Scalar[dtype], MutAnyOrigin],
    buf: SharedBuffer[dtype],
):
    """Start copying `chunk` (at most K vectors a thread) into `buf`.

    Vectors go by cp.async, all in flight at once without holding
    registers, one commit group per vector a thread copies, so that
    `chunk_pair` can start on a thread's first vector while the others are
    on their way. The few scalar elements are copied here. Each thread later
    reads back only what it copied, so no barrier is needed before
    `chunk_pair`; the caller makes sure no thread still reads `buf`.
    """
    var t = Int(thread_idx.x)
    var x = src.unsafe_offset(chunk.start)
    var body = buf.unsafe_offset(chunk.pad + chunk.head)
    var gx = x.unsafe_offset(chunk.head).unsafe_address_space_cast[
        AddressSpace.GLOBAL
    ]()
    comptime for k in range(K):
        var i = t + k * T
        if i < chunk.nvec:
            async_copy[16](gx.unsafe_offset(i * V), body.unsafe_offset(i * V))
        async_copy_commit_group()
    for e in range(t, chunk.head, T):
        buf[unsafe_offset=chunk.pad + e] = x[unsafe_offset=e]
    for e in range(chunk.head + chunk.nvec * V + t, chunk.count, T):
        buf[unsafe_offset=chunk.pad + e] = x[unsafe_offset=e]


@always_inline
def chunk_pair[
    dtype: DType, V: Int, T: Int, K: Int
](
    chunk: SmemChunk,
    buf: SharedBuffer[dtype],
) -> Tuple[
    Scalar[accum_dtype[dtype]()], Scalar[accum_dtype[dtype]()]
]:
    """The pair (max, sum of exp(x - max)) of a chunk `load_chunk` is
    copying into `buf`, reduced over the block; each vector is folded in as
    soon as its group has landed."""
    comptime acc = accum_dtype[dtype]()
    comptime assert acc.is_floating_point()
    var t = Int(thread_idx.x)
    var body = buf.unsafe_offset(chunk.pad + chunk.head)
    var m = -inf[acc]()
    var s = Scalar[acc](0)
    for e in range(t, chunk.head, T):
        (m, s) = online_add[acc, 1](
            m, s, buf[unsafe_offset=chunk.pad + e].cast[acc]()
        )
    for e in range(chunk.head + chunk.nvec * V + t, chunk.count, T):
        (m, s) = online_add[acc, 1](
            m, s, buf[unsafe_offset=chunk.pad + e].cast[acc]()
        )
    comptime for k in range(K):
        comptime if k < K - 1:
            async_copy_wait_group(Int32(K - 1 - k))
        else:
            async_copy_wait_all()
        var i = t + k * T
        if i < chunk.nvec:
            var v = body.unsafe_offset(i * V).unsafe_load[
                width=V, alignment=16
            ]()
            (m, s) = online_add[acc, V](m, s, v.cast[acc]())
    return block_max_sum[acc, T](m, s)


@always_inline
def publish_chunk[
    dtype: DType, V: Int, T: Int, K: Int
](
    chunk: SmemChunk,
    buf: SharedBuffer[dtype],
    counters: Pointer[Int32, MutAnyOrigin],
    partials: Pointer[Scalar[accum_dtype[dtype]()], MutAnyOrigin],
    chunks: Int,
):
    """Reduce the chunk `load_chunk` is copying into `buf` (`chunk_pair`)
    and publish its pair to its row."""
    var pair = chunk_pair[dtype, V, T, K](chunk, buf)
    publish_pair(
        counters, partials, chunk.row, chunks, chunk.index, pair[0], pair[1]
    )


@always_inline
def write_chunk[
    dtype: DType, log_out: Bool, V: Int, T: Int
](
    chunk: SmemChunk,
    dst: Pointer[Scalar[dtype], MutAnyOrigin],
    buf: SharedBuffer[dtype],
    row_max: Scalar[accum_dtype[dtype]()],
    scale: Scalar[accum_dtype[dtype]()],
):
    """Write softmax (or log-softmax) of the chunk held in `buf`, given its
    row's max and `row_scale`."""
    comptime acc = accum_dtype[dtype]()
    comptime assert acc.is_floating_point()
    var t = Int(thread_idx.x)
    var y = dst.unsafe_offset(chunk.start)
    var body = buf.unsafe_offset(chunk.pad + chunk.head)
    for i in range(t, chunk.nvec, T):
        var v = body.unsafe_offset(i * V).unsafe_load[width=V, alignment=16]()
        y.unsafe_offset(chunk.head + i * V).unsafe_store[alignment=16](
            epilogue[log_out, acc, V](v.cast[acc](), row_max, scale).cast[
                dtype
            ]()
        )
    for e in range(t, chunk.head, T):
        y[unsafe_offset=e] = epilogue[log_out, acc, 1](
            buf[unsafe_offset=chunk.pad + e].cast[acc](), row_max, scale
        ).cast[dtype]()
    for e in range(chunk.head + chunk.nvec * V + t, chunk.count, T):
        y[unsafe_offset=e] = epilogue[log_out, acc, 1](
            buf[unsafe_offset=chunk.pad + e].cast[acc](), row_max, scale
        ).cast[dtype]()


@always_inline
def write_row_chunk[
    dtype: DType, log_out: Bool, V: Int, T: Int
](
    chunk: SmemChunk,
    dst: Pointer[Scalar[dtype], MutAnyOrigin],
    buf: SharedBuffer[dtype],
    partials: Pointer[Scalar[accum_dtype[dtype]()], MutAnyOrigin],
    chunks: Int,
):
    """Fold the pairs of the chunk's row (all published), write the chunk."""
    comptime acc = accum_dtype[dtype]()
    comptime assert acc.is_floating_point()
    var terms = row_max_scale[acc, T, log_out](partials, chunk.row, chunks)
    write_chunk[dtype, log_out, V, T](chunk, dst, buf, terms[0], terms[1])


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
    """One chunk of `split_smem_chunk_bytes(T)` per block; `rows * chunks`
    blocks.

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
    comptime K = SPLIT_SMEM_VECTORS
    comptime C = split_smem_chunk_bytes(T) // size_of[dtype]()
    var len = Int(n)
    var chunks = (len + C - 1) // C
    var chunk = smem_chunk[V, C](
        take_ticket(counters), len, chunks, aligned_flag
    )
    var buf = external_memory[
        Scalar[dtype], address_space=AddressSpace.SHARED, alignment=16
    ]()
    load_chunk[dtype, V, T, K](chunk, src, buf)
    publish_chunk[dtype, V, T, K](chunk, buf, counters, partials, chunks)
    wait_for_row(counters, chunk.row, chunks)
    write_row_chunk[dtype, log_out, V, T](chunk, dst, buf, partials, chunks)
