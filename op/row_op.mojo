"""The row-op trait: what an op supplies to a strategy that holds its rows
on chip (the Mojo form of QuACK's `ReductionBase`).

A strategy owns the layout of the work: which block (or cluster of C
blocks) takes which row, each block's part of the row (`RowPart`,
`cluster_split`), the dynamic shared memory, and the order of the steps.
An op supplies the rest, as a `RowOp`:

- what it reads per element: one tensor (softmax, cross-entropy) or two
  (the backward's y and dy), set up per row in `begin`;
- the statistics it folds and how partial statistics combine, in `fold`:
  the forward's (max, sum of exp(x - max)), the backward's sum of dy * y
  (or of dy), the cross-entropy's (max, sum of exp, target logit, sum of
  logits); over the threads of a block by the `gpu_reductions`, over the
  C blocks of a cluster by `cluster_exchange` through `slots`;
- its epilogue: what it writes per row (`finish`: the cross-entropy's
  loss) and per element (`write`: y, dx, dlogits).

The strategy kernels are generic over the trait and every method is
`@always_inline`, with the vector width, block size and cluster size
compile-time parameters, so each instantiation compiles to the same
straight-line code as a kernel written out for that op. How an op holds
its part of the row (registers, shared memory, the edge pair) is the op's
own, where it matters for speed: the backward splits the registers
between its two tensors, and 16-bit cross-entropy rows keep exp(x - max)
on chip in place of the logits (gpu_ce_smem_rows).
"""

from .gpu_launch import HeldRows
from .gpu_split_chunks import SharedBuffer
from .row_math import accum_dtype
from .row_part import RowPart


@fieldwise_init
struct OnchipBlock[dtype: DType](ImplicitlyCopyable):
    """Where a block of the on-chip strategy keeps and meets its row, as
    `onchip_rows` hands it to a `RowOp`'s `fold` with the block's part:
    its dynamic shared memory and, for a cluster of C > 1 blocks, the
    row's slots and the block's rank in the cluster."""

    var smem: SharedBuffer[Self.dtype]
    """The block's dynamic shared memory."""
    var slots: HeldRows[accum_dtype[Self.dtype]()]
    """The row's cluster slots (`cluster_slots` accumulators)."""
    var rank: Int
    """The block's rank in its cluster (0 for C = 1)."""


trait RowOp:
    """An op whose rows a strategy kernel holds on chip, a row (or a part
    of one) per block of `threads` threads, `width` elements a 16-byte
    vector. Each method runs on every thread of the block; `fold` and
    `write` may reduce over the block (every thread must reach them)."""

    comptime dtype: DType
    """Element type of the tensors."""
    comptime width: Int
    """Elements per 16-byte vector of `dtype`."""
    comptime threads: Int
    """Threads per block."""
    comptime cluster_slots: Int
    """Accumulators a row its cluster's blocks exchange through (whole
    128-byte lines, `cluster_exchange`)."""

    def begin(
        mut self, p: RowPart, row: Int, start: Int, first: Int, len_row: Int
    ) -> Bool:
        """Set up row `row` (of `len_row` elements) whose part `p` this
        block holds, from element `first` of the row (element `start` of
        the tensors); whether its statistics are folded (a cross-entropy
        row not kept is not: the same for every block of the row)."""
        ...

    def fold[C: Int](mut self, p: RowPart, on: OnchipBlock[Self.dtype]):
        """Load the part `p` on chip (registers, then `on.smem`) and fold
        the row's statistics: over the block, then, with C > 1, over the C
        blocks of the cluster (this one is `on.rank`) through
        `on.slots`."""
        ...

    @always_inline
    def finish(self, p: RowPart, row: Int, rank: Int):
        """Write what the op writes once a row (thread 0 of rank 0): by
        default nothing."""
        pass

    def write[C: Int](mut self, p: RowPart, smem: SharedBuffer[Self.dtype]):
        """The epilogue: write the part's elements from chip."""
        ...


trait RegisterRowOp:
    """An op whose rows a register plan holds (`register_rows` in
    gpu_register_rows): `threads` threads a row, each holding its chunks of
    the row in registers (the op's own fields: one tensor or two, raw or
    widened), so every element is read once and written once. The strategy
    owns which thread takes which row and the rows past the last; the op
    supplies what it reads, folds and writes. Each method runs on every
    thread of a row's group (a past-the-end group with `len` 0); `fold`
    reduces over the group, so every thread must reach it."""

    comptime threads: Int
    """Threads a row: 8, 16 or a multiple of 32."""

    def begin(mut self, row: Int, len: Int):
        """Set up row `row`, of which `len` elements are read (0 for a group
        past the last row, which then reads and writes nothing)."""
        ...

    def fold(mut self, t: Int, vector_loads: Bool):
        """Load thread t's chunks of the row into registers (16-byte vectors
        where `vector_loads`, else coalesced scalars) and fold the row's
        statistics over the row's threads."""
        ...

    @always_inline
    def finish(self, live: Bool, row: Int, t: Int):
        """Write what the op writes once a row (where `live`: the row
        exists): by default nothing."""
        pass

    def write(self, t: Int, vector_loads: Bool):
        """The epilogue: write thread t's chunks of the output row."""
        ...


trait BlockRowOp:
    """An op whose rows the block strategy takes (`block_rows` in
    gpu_block_rows): a block of `threads` threads a row, of any length,
    each thread folding its share of the row (16-byte vectors of `width`
    elements, or elements) into the op's statistics (its own fields), the
    block combining them, then each thread reading its share again to
    write it. The strategy owns the stepping, the choice of vectors or
    elements and the loops; the op supplies what it reads, folds and
    writes. Each method runs on every thread of the block; `combine`
    reduces over the block, so every thread must reach it."""

    comptime threads: Int
    """Threads a row (the block)."""
    comptime width: Int
    """Elements per 16-byte vector of the op's dtype."""

    def begin(mut self, row: Int, len: Int) -> Int:
        """Set up row `row` (of `len` elements: its pointers, per-row
        options, empty statistics); return how many of its elements are
        folded (`len`, or a causal row's to its diagonal; the ROW_PARTS
        walk folds every element). Every element to `len` is written."""
        ...

    def fold_vector(mut self, e: Int):
        """Fold the aligned vector of elements [e, e + width) into the
        thread's statistics."""
        ...

    def fold_element(mut self, e: Int):
        """Fold element `e` into the thread's statistics."""
        ...

    def combine(mut self):
        """Combine the threads' statistics over the block (the
        `gpu_reductions` helper the statistics need) into what the write
        uses. Under the ROW_PARTS walk it is also called, with nothing
        folded, for a row that `folds` not: it then reduces nothing."""
        ...

    def write_vector(self, e: Int):
        """Write the aligned vector of elements [e, e + width) of the
        output row from the row's statistics."""
        ...

    def write_element(self, e: Int):
        """Write element `e` of the output row from the row's
        statistics."""
        ...

    @always_inline
    def folds(self) -> Bool:
        """Under the ROW_PARTS walk, whether the row is folded at all (the
        same on every thread of the block; a cross-entropy row whose target
        is ignored or out of range is not): by default always."""
        return True

    @always_inline
    def fold_part(mut self, p: RowPart):
        """Fold the thread's share `p` of the row under the ROW_PARTS
        walk: by default the body's vectors, then the head's and the
        tail's elements; an op overrides it to keep several loads in
        flight (the cross-entropy's `share_stats`)."""
        walk_part[write=False](self, p)

    @always_inline
    def store_row(mut self):
        """Under the ROW_PARTS walk, after `combine` and before the
        output: what the op writes once a row (the cross-entropy's loss):
        by default nothing."""
        pass

    @always_inline
    def finish(self, p: RowPart):
        """Under the ROW_PARTS walk, what the thread writes after its share
        `p` of the output row (the cross-entropy's target entry): by
        default nothing."""
        pass


@always_inline
def walk_part[Op: BlockRowOp, write: Bool](mut op: Op, p: RowPart):
    """Thread `p.t`'s share of a row laid out as a `RowPart` (the block
    strategy's ROW_PARTS walk): the body's aligned vectors, then the head's
    and the tail's elements, each folded or (`write`) written."""
    for i in range(p.t, p.nvec, Op.threads):
        var e = p.head + i * Op.width
        comptime if write:
            op.write_vector(e)
        else:
            op.fold_vector(e)
    for e in range(p.t, p.head, Op.threads):
        comptime if write:
            op.write_element(e)
        else:
            op.fold_element(e)
    for e in range(p.tail_begin + p.t, p.len, Op.threads):
        comptime if write:
            op.write_element(e)
        else:
            op.fold_element(e)
