"""Long rows split across blocks that stay resident and stream chunk after
chunk, two chunk buffers each: a chunk loads while the one before waits for
its row and is written.

A block that held one chunk would load it, wait for the rest of its row,
then write it and exit, so an SM whose blocks all wait has no loads in
flight: at 32 x 1M bfloat16 a quarter of the warp stalls sat at that wait
and DRAM at 57% of peak (benchmarks/DECISIONS.md, 'long rows'). Here a
few blocks an SM loop:

1. take the next chunk's ticket, learn whether the held chunk's row is
   complete, and start the new chunk's cp.async copy into the free buffer;
2. if the held chunk's row is complete, write the held chunk while the new
   one lands; otherwise reduce and publish the new chunk first;
3. fold the new chunk's pair (max, sum of exp(x - max)) and publish it,
   if step 2 has not; it becomes the held chunk.

A block never waits for a row while holding an unpublished chunk of that
row or an earlier one (step 2 publishes first unless the row is already
complete), and tickets go in row order, so a row can block progress only
if its chunks outnumber two per resident block: `ON_CHIP_SPLIT_MAX_ROW_BYTES`
(8 MB) bounds rows, and the launcher checks the GPU holds that many blocks
(`check_on_chip_split`). Blocks that never start hold no tickets.

Each chunk costs a block two round trips to L2 besides its data (three more
round trips measured 3-4% slower at 32 x 1M):

- the ticket (an atomic add) and the held row's arrival count go out
  together (`ticket_and_row_ready`);
- pairs are published as 64-bit words that stay zero until written, so a
  block waiting for its row polls the pairs themselves, every thread one
  pair at once (`wait_row_terms`), instead of polling a counter and then
  reading the pairs.

At 32 x 1M this reaches 94% of a device copy in fp32 and 88% in bf16
(benchmarks/DECISIONS.md, 'long rows').

One kernel (`split_stream_kernel`, the loop `stream_chunks`) and one
launcher (`launch_streamed`) serve every op, generic over what a chunk
holds, publishes and writes, a `StreamedChunks`: here softmax
(`SoftmaxChunks`), in gpu_backward_stream_rows the backward ops, whose
chunks hold two tensors and publish one sum.
"""

from max.gpu import MAX_THREADS_PER_BLOCK_METADATA, thread_idx
from max.gpu.host import DeviceContext, FuncAttribute
from max.gpu.memory import AddressSpace, external_memory
from max.gpu.sync import barrier
from std.atomic import Atomic, Ordering
from std.memory import bitcast, stack_allocation
from std.sys import size_of
from std.utils import StaticTuple
from std.utils.numerics import inf, nan

from .gpu_launch import HeldRows, aligned_flag_of, held, kernel_arg
from .gpu_split_chunks import (
    SharedBuffer,
    SmemChunk,
    chunk_bytes,
    chunk_pair,
    chunk_shared_bytes,
    load_chunk,
    smem_chunk,
    write_chunk,
)
from .gpu_split_workspace import (
    DeviceCounter,
    block_row_terms,
    check_on_chip_split,
    pairs_offset,
    split_counters,
    split_stream_room,
)
from .row_math import accum_dtype, fold_pair, vector_width
from .row_tensors import LaunchRows, RowTensors


# Threads a block, 16-byte vectors a thread in each of a block's two
# buffers, blocks an SM; `benchmarks/tools/split_stream_sweep.mojo` times others.
# 16-bit types: 4 blocks of 256 threads with 24 KB buffers (196 of the SM's
# 227 KB) beat 2 of 512 with 56 KB buffers by 3% at 32 x 1M, 4% at
# 128 x 65536 and 9% at 4 x 1M (about even at 64 x 50257): more blocks hide
# each other's waits. Float32 keeps 2 x 512 x 56 KB, 3% faster at 16 x 2M
# and 11% at 64 x 50257 (benchmarks/DECISIONS.md, 'long rows').
def split_stream_threads[dtype: DType]() -> Int:
    """Threads a block."""
    return 256 if size_of[dtype]() == 2 else 512


def split_stream_vectors[dtype: DType, tensors: Int = 1]() -> Int:
    """16-byte vectors a thread copies into each of its block's buffers, of
    each of `tensors` input tensors: the forward's bytes of buffer split
    between them."""
    return (6 if size_of[dtype]() == 2 else 7) // tensors


def split_stream_blocks[dtype: DType]() -> Int:
    """Blocks resident on an SM (registers are capped to fit them)."""
    return 4 if size_of[dtype]() == 2 else 2


def split_stream_shared_bytes(threads: Int, vectors: Int) -> Int:
    """Dynamic shared memory a block needs for each input tensor: two chunk
    buffers, each with its vector of padding (see `SmemChunk`)."""
    return 2 * chunk_shared_bytes(threads, vectors)


@always_inline
def ticket_and_row_ready(
    counters: Pointer[Int32, MutAnyOrigin], row: Int, chunks: Int
) -> Tuple[Int, Bool]:
    """The block's next ticket, and whether all `chunks` pairs of `row` have
    been published (a hint: `wait_row_terms` reads the pairs themselves).
    Thread 0 sends both requests before waiting for either: one round trip
    to L2, one barrier."""
    var slots = stack_allocation[2, Int32, address_space=AddressSpace.SHARED]()
    if thread_idx.x == 0:
        var ticket = DeviceCounter.fetch_add[ordering=Ordering.RELAXED](
            counters, 1
        )
        var arrived = DeviceCounter.load[ordering=Ordering.RELAXED](
            counters.unsafe_offset(1 + row)
        )
        slots[unsafe_offset=0] = ticket
        slots[unsafe_offset=1] = arrived
    barrier()
    # Thread 0 writes the slots again only after the block's next barrier.
    return (Int(slots[unsafe_offset=0]), Int(slots[unsafe_offset=1]) >= chunks)


# Published pairs: 64-bit words, zero until written (the launcher zeroes
# them with the counters). A float32 pair is one word, the bits of max and
# sum, never zero once written: a finite max has sum >= 1, and -inf and NaN
# have nonzero bits. A float64 pair is two words: max, then the complement
# of the sum's bits (sum 0 is possible), written with release after max and
# read with acquire before it.
comptime PairWord = Atomic[UInt64, scope="device"]


def pair_words[acc: DType]() -> Int:
    """64-bit words one published pair takes."""
    return 1 if acc == DType.float32 else 2


@always_inline
def sum_word[acc: DType](s: Scalar[acc]) -> UInt64:
    """A sum as a published word, never zero: the complement of its float64
    bits, with one NaN for every NaN (no other float64's complement is
    zero)."""
    comptime assert acc.is_floating_point()
    var v = s if s == s else nan[acc]()
    return ~bitcast[DType.uint64](v.cast[DType.float64]())


@always_inline
def word_sum[acc: DType](word: UInt64) -> Scalar[acc]:
    """The sum `sum_word` published as `word`."""
    return bitcast[DType.float64](~word).cast[acc]()


@always_inline
def count_arrival(counters: Pointer[Int32, MutAnyOrigin], r: Int):
    """Count a published chunk in row r's arrivals (the hint
    `ticket_and_row_ready` reads)."""
    _ = DeviceCounter.fetch_add[ordering=Ordering.RELAXED](
        counters.unsafe_offset(1 + r), 1
    )


@always_inline
def publish_packed_pair[
    acc: DType
](
    counters: Pointer[Int32, MutAnyOrigin],
    pairs: Pointer[UInt64, MutAnyOrigin],
    r: Int,
    chunks: Int,
    c: Int,
    chunk_max: Scalar[acc],
    chunk_sum: Scalar[acc],
):
    """Thread 0 publishes chunk c's pair to row r and counts it in the row's
    arrivals."""
    comptime assert acc.is_floating_point()
    if thread_idx.x == 0:
        var at = pairs.unsafe_offset((r * chunks + c) * pair_words[acc]())
        comptime if acc == DType.float32:
            var word = UInt64(bitcast[DType.uint32](chunk_max)) | (
                UInt64(bitcast[DType.uint32](chunk_sum)) << 32
            )
            PairWord.store[ordering=Ordering.RELAXED](at, word)
        else:
            PairWord.store[ordering=Ordering.RELAXED](
                at, bitcast[DType.uint64](chunk_max.cast[DType.float64]())
            )
            PairWord.store[ordering=Ordering.RELEASE](
                at.unsafe_offset(1), sum_word[acc](chunk_sum)
            )
        count_arrival(counters, r)


@always_inline
def wait_word[
    ordering: Ordering = Ordering.RELAXED
](at: Pointer[UInt64, MutAnyOrigin]) -> UInt64:
    """The word at `at`, once published (nonzero)."""
    var word = PairWord.load[ordering=ordering](at)
    while word == 0:
        word = PairWord.load[ordering=ordering](at)
    return word


@always_inline
def read_packed_pair[
    acc: DType
](at: Pointer[UInt64, MutAnyOrigin]) -> Tuple[Scalar[acc], Scalar[acc]]:
    """Wait for the pair at `at` to be published, and return it."""
    comptime assert acc.is_floating_point()
    comptime if acc == DType.float32:
        var word = wait_word(at)
        return (
            bitcast[acc](UInt32(word & 0xFFFFFFFF)),
            bitcast[acc](UInt32(word >> 32)),
        )
    else:
        var sum_at = at.unsafe_offset(1)
        var sum_bits = wait_word[Ordering.ACQUIRE](sum_at)
        var max_word = PairWord.load[ordering=Ordering.RELAXED](at)
        return (
            bitcast[DType.float64](max_word).cast[acc](),
            word_sum[acc](sum_bits),
        )


@always_inline
def wait_row_terms[
    acc: DType, T: Int, log_out: Bool
](pairs: Pointer[UInt64, MutAnyOrigin], r: Int, chunks: Int) -> Tuple[
    Scalar[acc], Scalar[acc]
]:
    """Row r's max and `row_scale`, once all its `chunks` pairs are
    published: each thread polls its share of the pairs, all at once."""
    comptime assert acc.is_floating_point()
    var m = -inf[acc]()
    var s = Scalar[acc](0)
    for i in range(Int(thread_idx.x), chunks, T):
        var pair = read_packed_pair[acc](
            pairs.unsafe_offset((r * chunks + i) * pair_words[acc]())
        )
        (m, s) = fold_pair[acc](m, s, pair[0], pair[1])
    return block_row_terms[acc, T, log_out](m, s)


struct RowWords(ImplicitlyCopyable):
    """Where the chunks of a split stream meet: the counters (the ticket
    counter, then each row's arrivals), the 64-bit words every chunk
    publishes and the chunks a row. `stream_chunks` hands the same three
    to each `StreamedChunks` step, so they travel as one value."""

    var counters: HeldRows[DType.int32]
    """`1 + rows` counters (`kernel_arg` gives them back)."""
    var words: HeldRows[DType.uint64]
    """`rows * chunks * R.words` words (`kernel_arg` gives them back)."""
    var chunks: Int
    """Chunks a row."""

    @always_inline
    def __init__(
        out self,
        counters: Pointer[Int32, MutAnyOrigin],
        words: Pointer[UInt64, MutAnyOrigin],
        chunks: Int,
    ):
        """The kernel's counters and words, rows of `chunks` chunks."""
        self.counters = held(counters)
        self.words = held(words)
        self.chunks = chunks


trait StreamedChunks(Deinitable):
    """What `stream_chunks` does with the chunks it streams: the forward
    and the backward ops differ only in the tensors a chunk holds, what a
    chunk publishes for its row and how a chunk is written once its row's
    terms are known; tickets, buffers and the order of the steps are
    `stream_chunks`'s."""

    comptime dtype: DType
    """Element type of the tensors."""
    comptime tensors: Int
    """Input tensors a chunk holds, each its part of a buffer
    (`chunk_part_elements`)."""
    comptime words: Int
    """64-bit words a chunk publishes, zero until written."""

    def load[
        T: Int, K: Int
    ](self, chunk: SmemChunk, buf: SharedBuffer[Self.dtype]):
        """Start copying the chunk of each input into `buf`."""
        ...

    def publish[
        T: Int, K: Int
    ](self, chunk: SmemChunk, buf: SharedBuffer[Self.dtype], posted: RowWords):
        """Reduce the chunk `load` is copying, publish its words and count
        it in its row's arrivals."""
        ...

    def write[
        T: Int, K: Int
    ](self, chunk: SmemChunk, buf: SharedBuffer[Self.dtype], posted: RowWords):
        """Wait for the words of the chunk's row, then write the chunk."""
        ...

    def __init__(out self, var rows: RowTensors[Self.dtype]):
        """The op on the kernel's tensors."""
        ...


@always_inline
def stream_chunks[
    R: StreamedChunks, T: Int, K: Int
](
    op: R,
    counters: Pointer[Int32, MutAnyOrigin],
    words: Pointer[UInt64, MutAnyOrigin],
    rows: Int64,
    n: Int64,
    aligned_flag: Int32,
):
    """The body of a split-stream kernel: chunks of `chunk_bytes(T, K)` of
    each tensor, taken by ticket until all `rows * chunks` are written (see
    the module docstring); any grid size works."""
    comptime V = vector_width[R.dtype]()
    comptime C = chunk_bytes(T, K) // size_of[R.dtype]()
    var len = Int(n)
    var chunks = (len + C - 1) // C
    var total = Int(rows) * chunks
    var held_buf = external_memory[
        Scalar[R.dtype], address_space=AddressSpace.SHARED, alignment=16
    ]()
    # The second buffer starts past the first's parts and their padding.
    var free_buf = held_buf.unsafe_offset(R.tensors * (C + V))

    var posted = RowWords(counters, words, chunks)
    var first = ticket_and_row_ready(counters, 0, chunks)
    if first[0] >= total:
        return
    var held = smem_chunk[V, C](first[0], len, chunks, aligned_flag)
    op.load[T, K](held, held_buf)
    op.publish[T, K](held, held_buf, posted)

    while True:
        var got = ticket_and_row_ready(counters, held.row, chunks)
        var more = got[0] < total
        var next = held
        var published = True
        if more:
            next = smem_chunk[V, C](got[0], len, chunks, aligned_flag)
            op.load[T, K](next, free_buf)
            published = False
            # Publish first when the held row still waits: this chunk may
            # be what it waits for.
            if not got[1]:
                op.publish[T, K](next, free_buf, posted)
                published = True
        op.write[T, K](held, held_buf, posted)
        if not more:
            return
        if not published:
            op.publish[T, K](next, free_buf, posted)
        held = next
        var swap = held_buf
        held_buf = free_buf
        free_buf = swap


@fieldwise_init
struct SoftmaxChunks[dtype_: DType, log_out: Bool](StreamedChunks):
    """Softmax (log-softmax with `log_out`) of `a` into `dst`: a chunk
    publishes its pair (max, sum of exp(x - max))."""

    comptime dtype = Self.dtype_
    comptime tensors = 1
    comptime words = pair_words[accum_dtype[Self.dtype_]()]()

    var rows: RowTensors[Self.dtype]
    """The input rows (`a`) and output rows (`dst`)."""

    @always_inline
    def load[
        T: Int, K: Int
    ](self, chunk: SmemChunk, buf: SharedBuffer[Self.dtype]):
        """Start copying the chunk of `src`."""
        load_chunk[Self.dtype, vector_width[Self.dtype](), T, K](
            chunk, kernel_arg(self.rows.a), buf
        )

    @always_inline
    def publish[
        T: Int, K: Int
    ](self, chunk: SmemChunk, buf: SharedBuffer[Self.dtype], posted: RowWords):
        """Reduce the chunk to its pair and publish it."""
        var pair = chunk_pair[Self.dtype, vector_width[Self.dtype](), T, K](
            chunk, buf
        )
        publish_packed_pair[accum_dtype[Self.dtype]()](
            kernel_arg(posted.counters),
            kernel_arg(posted.words),
            chunk.row,
            posted.chunks,
            chunk.index,
            pair[0],
            pair[1],
        )

    @always_inline
    def write[
        T: Int, K: Int
    ](self, chunk: SmemChunk, buf: SharedBuffer[Self.dtype], posted: RowWords):
        """Fold the row's pairs, write the chunk's softmax."""
        var terms = wait_row_terms[accum_dtype[Self.dtype](), T, Self.log_out](
            kernel_arg(posted.words), chunk.row, posted.chunks
        )
        write_chunk[Self.dtype, Self.log_out, vector_width[Self.dtype](), T](
            chunk, kernel_arg(self.rows.dst), buf, terms[0], terms[1]
        )


@__llvm_metadata(
    MAX_THREADS_PER_BLOCK_METADATA=StaticTuple[Int32, 1](Int32(T)),
    `nvvm.minctasm`=SIMDLength(B),
)
def split_stream_kernel[
    R: StreamedChunks, T: Int, K: Int, B: Int
](
    dst: Pointer[Scalar[R.dtype], MutAnyOrigin],
    a: Pointer[Scalar[R.dtype], MutAnyOrigin],
    b: Pointer[Scalar[R.dtype], MutAnyOrigin],
    counters: Pointer[Int32, MutAnyOrigin],
    words: Pointer[UInt64, MutAnyOrigin],
    rows: Int64,
    n: Int64,
    aligned_flag: Int32,
):
    """The split stream of op R (`stream_chunks`): chunks of
    `chunk_bytes(T, K)` of each input tensor.

    Parameters:
        R: The op: softmax (`SoftmaxChunks`) or a backward
            (`BackwardChunks`).
        T: Threads per block.
        K: 16-byte vectors a thread of each input tensor in each buffer.
        B: Blocks resident on an SM (registers are capped to fit them).

    Args:
        dst: Output rows.
        a: Input rows of `n` elements (the forward's x; the backward's y
            or log p).
        b: The second input's rows (the backward's dy); `a` again for
            one-input ops.
        counters: `1 + rows` zeroed counters: the ticket counter, then one
            arrival counter per row.
        words: `rows * chunks * R.words` zeroed 64-bit words, what each
            chunk publishes.
        rows: Number of rows.
        n: Row length.
        aligned_flag: Nonzero when every tensor starts 16-byte aligned.
    """
    stream_chunks[R, T, K](
        R(RowTensors(held(dst), held(a), held(b))),
        counters,
        words,
        rows,
        n,
        aligned_flag,
    )


def split_stream_fits[
    dtype: DType, tensors: Int = 1
](ctx: DeviceContext, n: Int) raises -> Bool:
    """Whether this GPU holds all chunks of a row of `n` at once in the
    table's split_stream blocks for `tensors` input tensors (a MIG slice
    may not)."""
    var room = split_stream_room[
        dtype,
        split_stream_threads[dtype](),
        split_stream_vectors[dtype, tensors](),
        split_stream_blocks[dtype](),
    ](ctx, n)
    return room[0] <= room[1]


def launch_streamed[
    R: StreamedChunks, T: Int, K: Int, B: Int
](ctx: DeviceContext, r: LaunchRows[R.dtype], variant: String) raises:
    """Launch `split_stream_kernel` of op R on `r`'s rows after zeroing its
    counters and words: blocks of T threads, B resident an SM, each with
    two buffers of K 16-byte vectors a thread of each input tensor. Raises,
    naming `variant`, unless the row fits (`check_on_chip_split`)."""
    var room = split_stream_room[R.dtype, T, K, B](ctx, r.n)
    var chunks = room[0]
    check_on_chip_split[R.dtype](ctx, variant, r.n, chunks, room[1])
    var counters = split_counters(ctx, r.rows, r.rows * chunks * R.words)
    var base = counters.unsafe_ptr()
    var smem_bytes = R.tensors * split_stream_shared_bytes(T, K)
    ctx.enqueue_function[split_stream_kernel[R, T, K, B]](
        r.dst(),
        r.a(),
        r.b(),
        rebind[Pointer[Int32, MutAnyOrigin]](base),
        rebind[Pointer[UInt64, MutAnyOrigin]](
            base.unsafe_offset(pairs_offset(r.rows)).unsafe_bitcast[UInt64]()
        ),
        Int64(r.rows),
        Int64(r.n),
        aligned_flag_of(r.aligned),
        # Every block resident at once: half the chunk slots.
        grid_dim=min(r.rows * chunks, room[1] // 2),
        block_dim=T,
        shared_mem_bytes=smem_bytes,
        func_attribute=FuncAttribute.MAX_DYNAMIC_SHARED_SIZE_BYTES(
            UInt32(smem_bytes)
        ),
    )
    # The buffer is freed in stream order, after the kernel.
    _ = counters^


def launch_split_stream[
    dtype: DType,
    log_out: Bool,
    T: Int = split_stream_threads[dtype](),
    K: Int = split_stream_vectors[dtype](),
    B: Int = split_stream_blocks[dtype](),
](ctx: DeviceContext, r: LaunchRows[dtype]) raises:
    """Launch the softmax `split_stream_kernel` on `r`'s rows (see
    `launch_streamed`). The defaults are the table's
    (`split_stream_threads`/`_vectors`/`_blocks`);
    benchmarks/tools/split_stream_sweep.mojo times others."""
    comptime assert accum_dtype[dtype]().is_floating_point()
    launch_streamed[SoftmaxChunks[dtype, log_out], T, K, B](
        ctx, r, "split_stream"
    )
