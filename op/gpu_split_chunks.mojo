"""The chunk steps of the split kernels that hold their chunks on chip.

A long row is cut into chunks; a block copies a chunk into a shared-memory
buffer (`load_chunk`), reduces it to its pair (max, sum of exp(x - max))
while the copy lands (`chunk_pair`), and once its row's max and sum are
known writes the chunk's softmax from the buffer (`write_chunk`), so the
row crosses HBM once each way. The streaming split (gpu_split_stream_rows)
runs these steps on chunk after chunk; the split_smem baseline
(baselines/gpu_split_smem_rows) runs them once a block.
"""

from max.gpu import thread_idx
from max.gpu.memory import (
    AddressSpace,
    async_copy,
    async_copy_commit_group,
    async_copy_wait_all,
    async_copy_wait_group,
)
from std.utils.numerics import inf

from .gpu_reductions import block_max_sum
from .row_math import accum_dtype, epilogue, online_add


def chunk_bytes(threads: Int, vectors: Int) -> Int:
    """Bytes of row a block of `threads` threads holds, `vectors` 16-byte
    vectors a thread."""
    return threads * vectors * 16


def chunk_shared_bytes(threads: Int, vectors: Int) -> Int:
    """Shared memory for one chunk: the chunk plus one vector of padding
    that lines the chunk's 16-byte vectors up with its global ones (see
    `SmemChunk`)."""
    return chunk_bytes(threads, vectors) + 16


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
