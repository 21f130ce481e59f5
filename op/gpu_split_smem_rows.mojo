"""Long rows split across blocks, each chunk held in shared memory: read once.

32 rows of a million float32 values (128 MB) fit neither one block per row
nor the 50 MB L2, so the re-reading split (gpu_split_rows) moves three
tensors through HBM. Here row r is cut into chunks of `SPLIT_SMEM_BYTES`
and each chunk is a block that

1. loads its chunk into shared memory (the row's only read) and reduces
   the chunk's pair (max, sum of exp(x - max)) from there;
2. publishes the pair and counts itself in row r's arrival counter
   (release);
3. waits for the row's other chunks (acquire), folds their pairs into the
   row's max and sum;
4. writes its chunk from shared memory.

Three blocks fit an SM (3 x 64 KB), so about 25 MB of rows are on chip at
once: enough to keep HBM busy while some blocks wait for their row.

Blocks take chunks by ticket, in row order, and publish before they wait,
so the only row that can hold blocks waiting is the one holding the lowest
ticket not yet taken. Progress then needs room for one row's chunks on the
GPU at once: `SPLIT_SMEM_MAX_CHUNKS` (128 blocks, 43 SMs' worth) bounds
that; longer rows go to the re-reading split, which needs no room at all.
"""

from max.gpu import MAX_THREADS_PER_BLOCK_METADATA, thread_idx
from max.gpu.memory import (
    AddressSpace,
    async_copy,
    async_copy_commit_group,
    async_copy_wait_all,
    external_memory,
)
from std.sys import size_of
from std.utils import StaticTuple
from std.utils.numerics import inf

from .gpu_reductions import block_max, block_sum
from .gpu_split_rows import publish_pair, row_pair, take_ticket, wait_for_row
from .row_math import (
    accum_dtype,
    epilogue,
    exp_nan,
    row_scale,
    online_sum_guard,
)

comptime SPLIT_SMEM_THREADS = 512
# Bytes of row a block holds; three blocks (and their 1536 threads) an SM.
comptime SPLIT_SMEM_BYTES = 65536
comptime SPLIT_SMEM_BLOCKS_PER_SM = 3
# Dynamic shared memory per block: a chunk plus one vector of padding that
# lines the chunk's 16-byte vectors up with its global ones.
comptime SPLIT_SMEM_SHARED_BYTES = SPLIT_SMEM_BYTES + 16
# Chunks a row may have: all of a row's blocks must be able to be resident
# at once (see the module docstring).
comptime SPLIT_SMEM_MAX_CHUNKS = 128


def split_smem_chunk(size: Int) -> Int:
    """Elements per chunk for elements of `size` bytes."""
    return SPLIT_SMEM_BYTES // size


def split_smem_chunks(n: Int, size: Int) -> Int:
    """Chunks per row of `n` elements of `size` bytes."""
    var c = split_smem_chunk(size)
    return (n + c - 1) // c


@__llvm_metadata(
    MAX_THREADS_PER_BLOCK_METADATA=StaticTuple[Int32, 1](
        Int32(SPLIT_SMEM_THREADS)
    ),
    `nvvm.minctasm`=SIMDLength(SPLIT_SMEM_BLOCKS_PER_SM),
)
def split_smem_rows_kernel[
    dtype: DType, log_out: Bool, V: Int
](
    dst: Pointer[Scalar[dtype], MutAnyOrigin],
    src: Pointer[Scalar[dtype], MutAnyOrigin],
    counters: Pointer[Int32, MutAnyOrigin],
    partials: Pointer[Scalar[accum_dtype[dtype]()], MutAnyOrigin],
    n: Int64,
    aligned_flag: Int32,
):
    """One chunk per block; `rows * split_smem_chunks(n)` blocks.

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
        aligned_flag: Nonzero when `src` and `dst` start 16-byte aligned,
            so element offsets alone decide which loads are aligned.
    """
    comptime acc = accum_dtype[dtype]()
    comptime assert acc.is_floating_point()
    comptime T = SPLIT_SMEM_THREADS
    comptime C = SPLIT_SMEM_BYTES // size_of[dtype]()
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

    # Sweep 1: global -> shared memory, and the chunk max. The body goes by
    # cp.async, every vector of it in flight at once without holding
    # registers; each thread later reads back only the vectors it copied,
    # so waiting for its own copies is enough (no barrier).
    var gx = x.unsafe_offset(head).unsafe_address_space_cast[
        AddressSpace.GLOBAL
    ]()
    for i in range(t, nvec, T):
        async_copy[16](gx.unsafe_offset(i * V), body.unsafe_offset(i * V))
    async_copy_commit_group()
    var m = -inf[acc]()
    for e in range(t, head, T):
        var v = x[unsafe_offset=e]
        smem[unsafe_offset=pad + e] = v
        m = max(m, v.cast[acc]())
    for e in range(tail_begin + t, count, T):
        var v = x[unsafe_offset=e]
        smem[unsafe_offset=pad + e] = v
        m = max(m, v.cast[acc]())
    async_copy_wait_all()
    for i in range(t, nvec, T):
        var v = body.unsafe_offset(i * V).unsafe_load[width=V, alignment=16]()
        m = max(m, v.cast[acc]().reduce_max())
    var chunk_max = block_max[acc, T](m)

    # Sweep 2: the chunk's sum of exp. A chunk of only -inf (and NaN) has
    # max -inf: shifting by 0 gives its pair (-inf, 0), or NaN with a NaN.
    var shift = chunk_max if abs(chunk_max) < inf[acc]() else Scalar[acc](0)
    var s = Scalar[acc](0)
    for i in range(t, nvec, T):
        var v = body.unsafe_offset(i * V).unsafe_load[width=V, alignment=16]()
        s += exp_nan[acc, V](v.cast[acc]() - shift).reduce_add()
    for e in range(t, head, T):
        s += exp_nan[acc, 1](smem[unsafe_offset=pad + e].cast[acc]() - shift)
    for e in range(tail_begin + t, count, T):
        s += exp_nan[acc, 1](smem[unsafe_offset=pad + e].cast[acc]() - shift)
    var chunk_sum = block_sum[acc, T](s)

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
