"""A row, or one block's part of a row, as the on-chip kernels lay it out.

Rows need not start 16-byte aligned (GPT-2's 50257-long rows mostly do
not). A row (or part) is a scalar head up to its first aligned element, an
aligned vector body, and a scalar tail (`RowPart`). A head under V
elements and the tail sit in the registers of the threads that load them;
a longer head (unaligned buffers: the whole row) is read element by
element. A row a cluster of C blocks shares is cut by `cluster_split`, so
every part but the first starts aligned.
"""

from max.gpu import block_idx, thread_idx


@fieldwise_init
struct RowPart(ImplicitlyCopyable):
    """Thread `t`'s share of a row (or part) of `len` elements of a
    T-thread block: a scalar head, `nvec` aligned vectors (vector i by
    thread i % T), a scalar tail. Head element `t` (a head under V) and
    tail element `tail_begin + t` are the thread's edge pair; a longer
    head is the thread's elements from `lead` on, T apart."""

    var t: Int
    """The thread."""
    var head: Int
    """Elements before the vector body."""
    var nvec: Int
    """16-byte vectors of the body."""
    var tail_begin: Int
    """First element of the tail."""
    var len: Int
    """Elements of the row or part."""
    var has_head: Bool
    """The thread holds head element `t` in its edge pair's [0]."""
    var has_tail: Bool
    """The thread holds tail element `tail_begin + t` in its edge pair's
    [1]."""
    var lead: Int
    """First element of a long head the thread reads element by element
    (past `head` where the head is under V elements)."""


@always_inline
def aligned_head[V: Int](start: Int, len: Int, aligned_flag: Int32) -> Int:
    """The scalar head of the `len` elements from element `start`: those
    before the first 16-byte aligned one (V elements a vector) of buffers
    that start aligned where `aligned_flag` is nonzero, else all `len`."""
    return min((V - start % V) % V, len) if aligned_flag != 0 else len


@always_inline
def row_part[
    V: Int, T: Int
](t: Int, start: Int, len: Int, aligned_flag: Int32) -> RowPart:
    """Thread `t`'s `RowPart` of the `len` elements from element `start`
    of buffers that start 16-byte aligned where `aligned_flag` is nonzero
    (else the whole row is head: scalar throughout); V elements a 16-byte
    vector."""
    var head = aligned_head[V](start, len, aligned_flag)
    var nvec = (len - head) // V
    var tail_begin = head + nvec * V
    return RowPart(
        t,
        head,
        nvec,
        tail_begin,
        len,
        t < head and head < V,
        tail_begin + t < len,
        t + (T if head < V else 0),
    )


@always_inline
def cluster_split[
    V: Int, parts: Int
](start: Int, len: Int, aligned_flag: Int32, r: Int) -> Int:
    """Where part `r` (0 to `parts`) begins when a cluster of `parts`
    blocks splits the row of `len` from element `start`: part 0 takes the
    scalar head and each part an equal share (rounded up) of the aligned
    vectors, the last one the scalar tail too, so every part but the first
    starts 16-byte aligned; unaligned buffers split in equal parts. Each
    part has at most (len + parts - 1) / parts + 2V elements."""
    if aligned_flag == 0:
        return min(r * ((len + parts - 1) // parts), len)
    if r == parts:
        return len
    var head = aligned_head[V](start, len, aligned_flag)
    var nvec = (len - head) // V
    return (0 if r == 0 else head) + min(
        r * ((nvec + parts - 1) // parts), nvec
    ) * V


@fieldwise_init
struct BlockRow(ImplicitlyCopyable):
    """The row a block of a block-a-row kernel takes (block i, row i) of
    rows of `len` elements, and this thread of it."""

    var t: Int
    """The thread."""
    var row: Int
    """The row."""
    var len: Int
    """Elements a row."""
    var start: Int
    """Element of the tensors where the row starts."""

    @staticmethod
    @always_inline
    def of(n: Int64) -> BlockRow:
        """This block's row of rows of `n`, and this thread."""
        var t = Int(thread_idx.x)
        var row = Int(block_idx.x)
        var len = Int(n)
        return BlockRow(t, row, len, row * len)

    @always_inline
    def part[V: Int, T: Int](self, aligned_flag: Int32) -> RowPart:
        """This thread's `RowPart` of the row (`row_part`)."""
        return row_part[V, T](self.t, self.start, self.len, aligned_flag)
