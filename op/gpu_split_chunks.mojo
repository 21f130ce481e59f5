"""The chunk steps of the split kernels that hold their chunks on chip.

A long row is cut into chunks; a block copies a chunk into a shared-memory
buffer (`load_chunks`: of one tensor, or of several into the parts of one
buffer, as the backward's y and dy), reduces it while the copy lands
(`fold_chunk` with a `ChunkVisitor`: the forward's pair (max, sum of
exp(x - max)) in `chunk_pair`, the backward's sum in
gpu_backward_stream_rows), and once its row's terms are known writes the
chunk's result from the buffer (`each_held`; the forward's `write_chunk`),
so the row crosses HBM once each way. The streaming split
(gpu_split_stream_rows) runs these steps on chunk after chunk.
"""

from max.gpu import thread_idx
from max.gpu.memory import (
    AddressSpace,
    async_copy,
    async_copy_commit_group,
    async_copy_wait_all,
    async_copy_wait_group,
)
from std.sys import size_of
from std.utils import StaticTuple
from std.utils.numerics import inf

from .gpu_launch import HeldRows, held
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


def chunk_part_elements[dtype: DType, T: Int, K: Int]() -> Int:
    """Elements from one tensor's part of a chunk buffer to the next: a
    kernel that streams several tensors' chunks (the backward's y and dy)
    keeps tensor j's part at buf + j * this."""
    return chunk_shared_bytes(T, K) // size_of[dtype]()


# Where a kernel's tensors are, for `load_chunks`.
comptime ChunkSources[dtype: DType, tensors: Int] = StaticTuple[
    HeldRows[dtype], tensors
]


@always_inline
def load_chunks[
    dtype: DType, V: Int, T: Int, K: Int, tensors: Int
](
    chunk: SmemChunk,
    srcs: ChunkSources[dtype, tensors],
    buf: SharedBuffer[dtype],
):
    """Start copying `chunk` of each of `tensors` tensors (at most K vectors
    a thread each) into its part of `buf` (`chunk_part_elements`).

    Vectors go by cp.async, all in flight at once without holding
    registers, one commit group per vector a thread copies, tensor after
    tensor, so that `fold_chunk` can start on a thread's first vector
    while the others are on their way: waiting until K - 1 - k groups are
    pending has vector k of the last tensor landed, and so of every
    tensor. The few scalar elements are copied here. Each thread later
    reads back only what it copied, so no barrier is needed before
    `fold_chunk`; the caller makes sure no thread still reads `buf`.
    """
    comptime part = chunk_part_elements[dtype, T, K]()
    var t = Int(thread_idx.x)
    comptime for j in range(tensors):
        var x = srcs[j].unsafe_offset(chunk.start)
        var to = buf.unsafe_offset(j * part + chunk.pad)
        var body = to.unsafe_offset(chunk.head)
        var gx = x.unsafe_offset(chunk.head).unsafe_address_space_cast[
            AddressSpace.GLOBAL
        ]()
        comptime for k in range(K):
            var i = t + k * T
            if i < chunk.nvec:
                async_copy[16](
                    gx.unsafe_offset(i * V), body.unsafe_offset(i * V)
                )
            async_copy_commit_group()
        for e in range(t, chunk.head, T):
            to[unsafe_offset=e] = x[unsafe_offset=e]
        for e in range(chunk.head + chunk.nvec * V + t, chunk.count, T):
            to[unsafe_offset=e] = x[unsafe_offset=e]


@always_inline
def load_chunk[
    dtype: DType, V: Int, T: Int, K: Int
](
    chunk: SmemChunk,
    src: Pointer[Scalar[dtype], MutAnyOrigin],
    buf: SharedBuffer[dtype],
):
    """`load_chunks` of one tensor."""
    load_chunks[dtype, V, T, K, 1](
        chunk, ChunkSources[dtype, 1](held(src)), buf
    )


trait ChunkVisitor:
    """What a sweep over a held chunk does at each of the calling thread's
    pieces: `visit[w](e)` for w elements. w == 1: a head or tail element,
    e counted from the chunk's first element; w == V: an aligned vector, e
    counted from the chunk's first aligned vector (element `head`), so
    that the sweeps' vector addresses stay a fixed base plus i * V."""

    def visit[w: Int](mut self, e: Int):
        """Take the w elements of the chunk at `e`."""
        ...


@always_inline
def fold_chunk[
    V: Int, T: Int, K: Int, F: ChunkVisitor
](chunk: SmemChunk, mut fold: F):
    """Visit the calling thread's pieces of a chunk `load_chunks` is
    copying, each vector as soon as its commit group has landed: the
    scalar head and tail (copied already) first."""
    var t = Int(thread_idx.x)
    for e in range(t, chunk.head, T):
        fold.visit[1](e)
    for e in range(chunk.head + chunk.nvec * V + t, chunk.count, T):
        fold.visit[1](e)
    comptime for k in range(K):
        comptime if k < K - 1:
            async_copy_wait_group(Int32(K - 1 - k))
        else:
            async_copy_wait_all()
        var i = t + k * T
        if i < chunk.nvec:
            fold.visit[V](i * V)


@always_inline
def each_held[V: Int, T: Int, F: ChunkVisitor](chunk: SmemChunk, mut sweep: F):
    """Visit the calling thread's pieces of a chunk that has landed:
    vectors, then head and tail."""
    var t = Int(thread_idx.x)
    for i in range(t, chunk.nvec, T):
        sweep.visit[V](i * V)
    for e in range(t, chunk.head, T):
        sweep.visit[1](e)
    for e in range(chunk.head + chunk.nvec * V + t, chunk.count, T):
        sweep.visit[1](e)


@fieldwise_init
struct HeldChunk[dtype: DType](ImplicitlyCopyable):
    """One tensor's chunk in its buffer, as the visitors read it."""

    var at: SharedBuffer[Self.dtype]
    """The chunk's element 0."""
    var body: SharedBuffer[Self.dtype]
    """Its first aligned vector (element `head`)."""

    @always_inline
    def __init__(out self, chunk: SmemChunk, part: SharedBuffer[Self.dtype]):
        """The chunk held in the buffer part that starts at `part`."""
        self.at = part.unsafe_offset(chunk.pad)
        self.body = self.at.unsafe_offset(chunk.head)

    @always_inline
    def values[w: Int](self, e: Int) -> SIMD[accum_dtype[Self.dtype](), w]:
        """The w elements at `e` (see `ChunkVisitor`), in the accumulator
        type."""
        comptime acc = accum_dtype[Self.dtype]()
        comptime if w == 1:
            return self.at[unsafe_offset=e].cast[acc]()
        else:
            return (
                self.body.unsafe_offset(e)
                .unsafe_load[width=w, alignment=16]()
                .cast[acc]()
            )


@fieldwise_init
struct OutChunk[dtype: DType](ImplicitlyCopyable):
    """Where a chunk's results go in global memory."""

    var at: HeldRows[Self.dtype]
    """The chunk's element 0."""
    var body: HeldRows[Self.dtype]
    """Its first aligned vector (element `head`)."""

    @always_inline
    def __init__(
        out self,
        chunk: SmemChunk,
        dst: Pointer[Scalar[Self.dtype], MutAnyOrigin],
    ):
        """The chunk's place in `dst`."""
        self.at = held(dst.unsafe_offset(chunk.start))
        self.body = self.at.unsafe_offset(chunk.head)

    @always_inline
    def store[w: Int](self, e: Int, v: SIMD[Self.dtype, w]):
        """Store w elements at `e` (see `ChunkVisitor`)."""
        comptime if w == 1:
            self.at[unsafe_offset=e] = v[0]
        else:
            self.body.unsafe_offset(e).unsafe_store[alignment=16](v)


struct PairFold[dtype: DType](ChunkVisitor):
    """Folds a held chunk into its pair (max, sum of exp(x - max))."""

    var x: HeldChunk[Self.dtype]
    """The chunk."""
    var m: Scalar[accum_dtype[Self.dtype]()]
    """Max so far."""
    var s: Scalar[accum_dtype[Self.dtype]()]
    """Sum of exp(x - m) so far."""

    @always_inline
    def __init__(out self, x: HeldChunk[Self.dtype]):
        """An empty pair over the chunk `x`."""
        self.x = x
        self.m = -inf[accum_dtype[Self.dtype]()]()
        self.s = 0

    @always_inline
    def visit[w: Int](mut self, e: Int):
        """Fold in the w elements at `e`."""
        (self.m, self.s) = online_add[accum_dtype[Self.dtype](), w](
            self.m, self.s, self.x.values[w](e)
        )


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
    copying into `buf`, reduced over the block."""
    comptime acc = accum_dtype[dtype]()
    comptime assert acc.is_floating_point()
    var fold = PairFold[dtype](HeldChunk[dtype](chunk, buf))
    fold_chunk[V, T, K](chunk, fold)
    return block_max_sum[acc, T](fold.m, fold.s)


@fieldwise_init
struct EpilogueWrite[dtype: DType, log_out: Bool](ChunkVisitor):
    """Writes softmax (or log-softmax) of a held chunk."""

    var x: HeldChunk[Self.dtype]
    """The chunk."""
    var y: OutChunk[Self.dtype]
    """Where it goes."""
    var row_max: Scalar[accum_dtype[Self.dtype]()]
    """The row's max."""
    var scale: Scalar[accum_dtype[Self.dtype]()]
    """The row's `row_scale`."""

    @always_inline
    def visit[w: Int](mut self, e: Int):
        """Write the w elements at `e`."""
        self.y.store[w](
            e,
            epilogue[Self.log_out, accum_dtype[Self.dtype](), w](
                self.x.values[w](e), self.row_max, self.scale
            ).cast[Self.dtype](),
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
    comptime assert accum_dtype[dtype]().is_floating_point()
    var sweep = EpilogueWrite[dtype, log_out](
        HeldChunk[dtype](chunk, buf),
        OutChunk[dtype](chunk, dst),
        row_max,
        scale,
    )
    each_held[V, T](chunk, sweep)
