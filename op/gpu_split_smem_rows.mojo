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
from .gpu_split_rows import publish_pair, row_pair, take_ticket, wait_for_row
from .row_math import (
    accum_dtype,
    epilogue,
    online_add,
    online_sum_guard,
    row_scale,
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


def split_smem_chunk_bytes(threads: Int) -> Int:
    """Bytes of row a block of `threads` threads holds."""
    return threads * SPLIT_SMEM_VECTORS * 16


def split_smem_shared_bytes(threads: Int) -> Int:
    """Dynamic shared memory a block needs: its chunk plus one vector of
    padding that lines the chunk's 16-byte vectors up with its global ones.
    """
    return split_smem_chunk_bytes(threads) + 16


def split_smem_capacity(size: Int) -> Int:
    """Longest row (elements of `size` bytes) the kernel takes."""
    return SPLIT_SMEM_MAX_ROW_BYTES // size


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
    comptime acc = accum_dtype[dtype]()
    comptime assert acc.is_floating_point()
    comptime C = split_smem_chunk_bytes(T) // size_of[dtype]()
    comptime K = SPLIT_SMEM_VECTORS
    var t = Int(thread_idx.x)
    var len = Int(n)
    var chunks = (len + C - 1) // C
    var ticket = take_ticket(counters)
    var r = ticket // chunks
    var c = ticket % chunks
    var begin = c * C
    var count = min(len, begin + C) - begin
    var start = r * len + begin
    var x = src.unsafe_offset(start)
    var y = dst.unsafe_offset(start)
    # Element e of the chunk lives at smem[pad + e], so the chunk's aligned
    # global vectors are aligned in shared memory too. Unaligned buffers:
    # the whole chunk is "head", scalar throughout.
    var pad = start % V if aligned_flag != 0 else 0
    var head = min((V - pad) % V, count) if aligned_flag != 0 else count
    var nvec = (count - head) // V
    var tail_begin = head + nvec * V
    var smem = external_memory[
        Scalar[dtype], address_space=AddressSpace.SHARED, alignment=16
    ]()
    var body = smem.unsafe_offset(pad + head)

    # Sweep 1: global -> shared memory by cp.async, every vector in flight
    # at once without holding registers, one commit group per vector a
    # thread copies. Each thread later reads back only the vectors it
    # copied, so waiting for its own groups is enough (no barrier), and
    # sweep 2 starts on a thread's first vector while the others are still
    # on their way.
    var gx = x.unsafe_offset(head).unsafe_address_space_cast[
        AddressSpace.GLOBAL
    ]()
    comptime for k in range(K):
        var i = t + k * T
        if i < nvec:
            async_copy[16](gx.unsafe_offset(i * V), body.unsafe_offset(i * V))
        async_copy_commit_group()
    var m = -inf[acc]()
    var s = Scalar[acc](0)
    for e in range(t, head, T):
        var v = x[unsafe_offset=e]
        smem[unsafe_offset=pad + e] = v
        (m, s) = online_add[acc, 1](m, s, v.cast[acc]())
    for e in range(tail_begin + t, count, T):
        var v = x[unsafe_offset=e]
        smem[unsafe_offset=pad + e] = v
        (m, s) = online_add[acc, 1](m, s, v.cast[acc]())

    # Sweep 2: the chunk's online pair (max, sum of exp(x - max)).
    comptime for k in range(K):
        comptime if k < K - 1:
            async_copy_wait_group(Int32(K - 1 - k))
        else:
            async_copy_wait_all()
        var i = t + k * T
        if i < nvec:
            var v = body.unsafe_offset(i * V).unsafe_load[
                width=V, alignment=16
            ]()
            (m, s) = online_add[acc, V](m, s, v.cast[acc]())
    var chunk = block_max_sum[acc, T](m, s)
    var chunk_max = chunk[0]
    var chunk_sum = chunk[1]

    publish_pair(counters, partials, r, chunks, c, chunk_max, chunk_sum)
    wait_for_row(counters, r, chunks)
    var total = row_pair[acc, T](partials, r, chunks)
    var row_max = total[0]
    var scale = row_scale[log_out, acc](
        online_sum_guard[acc](row_max, total[1])
    )

    # Sweep 3: write the chunk from shared memory.
    for i in range(t, nvec, T):
        var v = body.unsafe_offset(i * V).unsafe_load[width=V, alignment=16]()
        y.unsafe_offset(head + i * V).unsafe_store[alignment=16](
            epilogue[log_out, acc, V](v.cast[acc](), row_max, scale).cast[
                dtype
            ]()
        )
    for e in range(t, head, T):
        y[unsafe_offset=e] = epilogue[log_out, acc, 1](
            smem[unsafe_offset=pad + e].cast[acc](), row_max, scale
        ).cast[dtype]()
    for e in range(tail_begin + t, count, T):
        y[unsafe_offset=e] = epilogue[log_out, acc, 1](
            smem[unsafe_offset=pad + e].cast[acc](), row_max, scale
        ).cast[dtype]()
