"""Backward rows split across resident blocks that stream chunks: the
forward's split stream (gpu_split_stream_rows) with two tensors a chunk.

Rows too long for one SM (float32 50257 holds 393 KB of y and dy), or too
few to fill the GPU a block a row, up to the forward's 8 MB a row (of each
tensor), run `stream_chunks` with `BackwardChunks`: a chunk of y (or log p)
and the same chunk of dy land in the two parts of one buffer, the chunk
publishes its partial sum of `backward_term` to its row, and once all of
the row's partial sums are published the chunk's dx is written from the
buffer. y and dy cross HBM once, dx once: 3 transfers, as the register
kernels, instead of the block-per-row kernel's 5.

The forward's blocks keep their threads, blocks an SM and bytes of buffer;
the buffer's vectors are split between the two tensors
(`split_stream_vectors[dtype, 2]`): 24 KB chunks of each float32 tensor,
12 KB of each 16-bit one.

A chunk publishes one 64-bit word, its sum as `sum_word` (never zero), so
the row's waiters poll the words themselves, as the forward's do its pairs.
"""

from max.gpu import thread_idx
from max.gpu.host import DeviceContext
from std.atomic import Ordering

from .gpu_launch import kernel_arg
from .gpu_reductions import block_sum
from .gpu_split_chunks import (
    ChunkSources,
    ChunkVisitor,
    HeldChunk,
    OutChunk,
    SharedBuffer,
    SmemChunk,
    chunk_part_elements,
    each_held,
    fold_chunk,
    load_chunks,
)
from .gpu_split_stream_rows import (
    PairWord,
    RowWords,
    StreamedChunks,
    count_arrival,
    launch_streamed,
    split_stream_blocks,
    split_stream_threads,
    split_stream_vectors,
    sum_word,
    wait_word,
    word_sum,
)
from .row_math import accum_dtype, backward_out, backward_term, vector_width
from .row_tensors import LaunchRows, RowTensors

# y (or log p) and dy: the tensors a backward chunk holds.
comptime BACKWARD_TENSORS = 2


def backward_stream_chunk[dtype: DType]() -> Int:
    """Elements of each tensor a backward chunk holds (6144 float32 or
    16-bit, 3072 float64): a row of n takes ceil(n / this) chunk slots,
    the last one part empty."""
    return (
        split_stream_threads[dtype]()
        * split_stream_vectors[dtype, BACKWARD_TENSORS]()
        * vector_width[dtype]()
    )


struct TermFold[dtype: DType, log_in: Bool](ChunkVisitor):
    """Sums `backward_term` over a held chunk of a and dy."""

    var a: HeldChunk[Self.dtype]
    """The chunk of the forward output (y or log p)."""
    var g: HeldChunk[Self.dtype]
    """The chunk of dy."""
    var s: Scalar[accum_dtype[Self.dtype]()]
    """The sum so far."""

    @always_inline
    def __init__(out self, a: HeldChunk[Self.dtype], g: HeldChunk[Self.dtype]):
        """An empty sum over the chunks `a` and `g`."""
        self.a = a
        self.g = g
        self.s = 0

    @always_inline
    def visit[w: Int](mut self, e: Int):
        """Add the terms of the w elements at `e`."""
        self.s += backward_term[Self.log_in, accum_dtype[Self.dtype](), w](
            self.a.values[w](e), self.g.values[w](e)
        ).reduce_add()


@fieldwise_init
struct GradientWrite[dtype: DType, log_in: Bool](ChunkVisitor):
    """Writes dx of a held chunk of a and dy, given its row's sum."""

    var a: HeldChunk[Self.dtype]
    """The chunk of the forward output (y or log p)."""
    var g: HeldChunk[Self.dtype]
    """The chunk of dy."""
    var dx: OutChunk[Self.dtype]
    """Where its gradient goes."""
    var total: Scalar[accum_dtype[Self.dtype]()]
    """The row's sum of `backward_term`."""

    @always_inline
    def visit[w: Int](mut self, e: Int):
        """Write dx of the w elements at `e`."""
        self.dx.store[w](
            e,
            backward_out[Self.log_in, accum_dtype[Self.dtype](), w](
                self.a.values[w](e), self.g.values[w](e), self.total
            ).cast[Self.dtype](),
        )


@always_inline
def held_pair[
    dtype: DType, T: Int, K: Int
](chunk: SmemChunk, buf: SharedBuffer[dtype]) -> Tuple[
    HeldChunk[dtype], HeldChunk[dtype]
]:
    """The chunk of a and of dy that `load_chunks` put in `buf`'s two
    parts."""
    return (
        HeldChunk[dtype](chunk, buf),
        HeldChunk[dtype](
            chunk, buf.unsafe_offset(chunk_part_elements[dtype, T, K]())
        ),
    )


@always_inline
def wait_row_sum[
    acc: DType, T: Int
](words: Pointer[UInt64, MutAnyOrigin], r: Int, chunks: Int) -> Scalar[acc]:
    """Row r's sum, once all its `chunks` partial sums are published: each
    thread polls its share of the words, all at once."""
    comptime assert acc.is_floating_point()
    var s = Scalar[acc](0)
    for i in range(Int(thread_idx.x), chunks, T):
        s += word_sum[acc](wait_word(words.unsafe_offset(r * chunks + i)))
    return block_sum[acc, T](s)


@fieldwise_init
struct BackwardChunks[dtype_: DType, log_in: Bool](StreamedChunks):
    """The chunks of softmax_backward (log_softmax_backward with `log_in`)
    of a and dy into dx: a chunk publishes its sum of `backward_term`."""

    comptime dtype = Self.dtype_
    comptime tensors = BACKWARD_TENSORS
    comptime words = 1

    var rows: RowTensors[Self.dtype]
    """dx (`dst`), y or log p (`a`) and dy (`b`)."""

    @always_inline
    def load[
        T: Int, K: Int
    ](self, chunk: SmemChunk, buf: SharedBuffer[Self.dtype]):
        """Start copying the chunk of a and of dy."""
        load_chunks[Self.dtype, vector_width[Self.dtype](), T, K, 2](
            chunk, ChunkSources[Self.dtype, 2](self.rows.a, self.rows.b), buf
        )

    @always_inline
    def publish[
        T: Int, K: Int
    ](self, chunk: SmemChunk, buf: SharedBuffer[Self.dtype], posted: RowWords):
        """Sum the chunk's terms and publish the sum."""
        comptime acc = accum_dtype[Self.dtype]()
        var parts = held_pair[Self.dtype, T, K](chunk, buf)
        var fold = TermFold[Self.dtype, Self.log_in](parts[0], parts[1])
        fold_chunk[vector_width[Self.dtype](), T, K](chunk, fold)
        var s = block_sum[acc, T](fold.s)
        if thread_idx.x == 0:
            PairWord.store[ordering=Ordering.RELAXED](
                kernel_arg(posted.words).unsafe_offset(
                    chunk.row * posted.chunks + chunk.index
                ),
                sum_word[acc](s),
            )
            count_arrival(kernel_arg(posted.counters), chunk.row)

    @always_inline
    def write[
        T: Int, K: Int
    ](self, chunk: SmemChunk, buf: SharedBuffer[Self.dtype], posted: RowWords):
        """Add up the row's sums, write the chunk's dx."""
        var parts = held_pair[Self.dtype, T, K](chunk, buf)
        var sweep = GradientWrite[Self.dtype, Self.log_in](
            parts[0],
            parts[1],
            OutChunk[Self.dtype](chunk, kernel_arg(self.rows.dst)),
            wait_row_sum[accum_dtype[Self.dtype](), T](
                kernel_arg(posted.words), chunk.row, posted.chunks
            ),
        )
        each_held[vector_width[Self.dtype](), T](chunk, sweep)


def launch_backward_stream[
    dtype: DType, log_in: Bool
](ctx: DeviceContext, r: LaunchRows[dtype]) raises:
    """Launch the backward `split_stream_kernel` on `r`'s rows (dx from a
    and dy) with the forward's blocks (`launch_streamed`). Raises unless
    the row fits (`check_on_chip_split`)."""
    comptime assert accum_dtype[dtype]().is_floating_point()
    launch_streamed[
        BackwardChunks[dtype, log_in],
        split_stream_threads[dtype](),
        split_stream_vectors[dtype, BACKWARD_TENSORS](),
        split_stream_blocks[dtype](),
    ](ctx, r, "backward split_stream")
