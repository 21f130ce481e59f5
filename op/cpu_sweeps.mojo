"""The sweeps every CPU row kernel is made of, generic over what a sweep
does at each place: a blocked sum of per-element terms along a row
(`blocked_sum`) or down W columns (`column_sum`), an elementwise pass
(`each_piece`), and the tasks that run an op's rows: whole contiguous rows,
or W columns at a time for rows along another axis (`run_rows`).

A contiguous row of `count` elements goes in SIMD vectors of W, then a
scalar tail: the op's `term[w]`/`put[w]` is called with w == W in the
body and w == 1 in the tail, so an op may compute the tail differently
(the softmax sweeps use `exp_nan` there and `row_exp` in the body).
"""

from std.math import ceildiv

from .cpu_tasks import run_in_tasks

# Terms summed in one accumulator before it is folded into the total:
# float32 lanes each add at most SUM_BLOCK / W terms, so a 1M-long row
# keeps ~1e-6 relative error instead of ~1e-4.
comptime SUM_BLOCK = 1024


trait RowTerms:
    """The per-element terms a sum sweeps over."""

    comptime acc: DType
    """The accumulator type."""

    def term[w: Int](self, j: Int) -> SIMD[Self.acc, w]:
        """The w terms at place j, after doing whatever else the sweep does
        there (park an exp, prefetch)."""
        ...


@always_inline
def blocked_sum[W: Int, F: RowTerms](terms: F, count: Int) -> Scalar[F.acc]:
    """The sum of the terms at 0, ..., count - 1 of a contiguous row: W
    lanes summed a `SUM_BLOCK` at a time, each block reduced into the total,
    then the tail one by one (a fixed order: repeatable bits)."""
    var n_vec = count - count % W
    var s = Scalar[F.acc](0)
    for b in range(0, n_vec, SUM_BLOCK):
        var part = SIMD[F.acc, W](0)
        for j in range(b, min(b + SUM_BLOCK, n_vec), W):
            part += terms.term[W](j)
        s += part.reduce_add()
    for j in range(n_vec, count):
        s += terms.term[1](j)[0]
    return s


@always_inline
def column_sum[w: Int, F: RowTerms](terms: F, count: Int) -> SIMD[F.acc, w]:
    """The sums down w adjacent columns: `terms.term[w](j)` is row j's w
    terms; summed a `SUM_BLOCK` of rows at a time, lane by lane."""
    var s = SIMD[F.acc, w](0)
    for b in range(0, count, SUM_BLOCK):
        var part = SIMD[F.acc, w](0)
        for j in range(b, min(b + SUM_BLOCK, count)):
            part += terms.term[w](j)
        s += part
    return s


trait RowPieces:
    """What an elementwise sweep does at each place."""

    def put[w: Int](self, j: Int):
        """Handle the w elements at place j (write them)."""
        ...


@always_inline
def each_piece[W: Int, F: RowPieces](pieces: F, count: Int):
    """`pieces.put[W]` over the vectors of a contiguous row of `count`, then
    `put[1]` over its tail."""
    var n_vec = count - count % W
    for j in range(0, n_vec, W):
        pieces.put[W](j)
    for j in range(n_vec, count):
        pieces.put[1](j)


trait ColumnBlocks:
    """An op on rows along an axis that is not the last: it takes w
    adjacent columns at a time, so its loads are still vector loads."""

    def columns[w: Int](self, base: Int, n: Int, stride: Int):
        """The op down the w columns whose first element is at `base`, `n`
        elements of stride `stride` each."""
        ...


def run_column_blocks[
    W: Int, F: ColumnBlocks
](op: F, outer: Int, n: Int, inner: Int) raises:
    """Run `op` on every row of an `(outer, n, inner)` view along n: W
    columns a time (the last block of each `outer` one by one), whole
    blocks grouped into tasks (`run_in_tasks`)."""
    var col_blocks = ceildiv(inner, W)

    def blocks(begin: Int, end: Int) raises {imm}:
        for item in range(begin, end):
            var o = item // col_blocks
            var i0 = (item % col_blocks) * W
            var base = o * n * inner + i0
            if i0 + W <= inner:
                op.columns[W](base, n, inner)
            else:
                for i in range(i0, inner):
                    op.columns[1](base + i - i0, n, inner)

    run_in_tasks(blocks, outer * col_blocks, n * W)


trait RowBlocks(ColumnBlocks):
    """An op on the rows of an `(outer, n, inner)` view: contiguous rows a
    task's range at a time, or W columns at a time (`ColumnBlocks`)."""

    def rows(self, begin: Int, end: Int, n: Int) raises:
        """The op on contiguous rows begin ... end - 1 of n elements each
        (one task: what it allocates, it allocates once)."""
        ...


def run_rows[
    W: Int, F: RowBlocks
](op: F, outer: Int, n: Int, inner: Int) raises:
    """Run `op` on every row of an `(outer, n, inner)` view along n: whole
    contiguous rows grouped into tasks (`run_in_tasks`), or W columns at a
    time (`run_column_blocks`)."""
    if inner != 1:
        run_column_blocks[W](op, outer, n, inner)
        return

    def task_rows(begin: Int, end: Int) raises {imm}:
        op.rows(begin, end, n)

    run_in_tasks(task_rows, outer, n)
