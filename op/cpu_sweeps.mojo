"""The sweeps every CPU row kernel is made of, generic over what a sweep
does at each place: a row's max (`max_of`), a blocked sum of per-element
terms along a row (`blocked_sum`, `sum_of`) or down W columns
(`column_sum`), an elementwise pass (`each_piece`); and the one driver of
every CPU row op (`CpuRowOp`, the CPU's `RowOp`): whole contiguous rows
grouped into tasks (`each_row`), their values summed in float64 where an
op reduces them to one loss (`loss_rows`), or W columns at a time for rows
along another axis (`run_rows`).

A contiguous row of `count` elements goes in SIMD vectors of W, then a
scalar tail: the op's `term[w]`/`put[w]` is called with w == W in the
body and w == 1 in the tail, so an op may compute the tail differently
(the softmax sweeps use `exp_nan` there and `row_exp` in the body).
"""

from std.math import ceildiv
from std.sys import simd_width_of
from std.utils.numerics import inf

from .cpu_tasks import run_in_tasks
from .gpu_launch import HeldRows, held
from .row_math import accum_dtype

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


@fieldwise_init
struct TaskRow[acc: DType](ImplicitlyCopyable):
    """A contiguous row as a task hands it to a `CpuRowOp`."""

    var r: Int
    """The row."""
    var n: Int
    """Its length."""
    var next: Int
    """The row the task takes next (r itself at the task's last): what a
    sweep may prefetch."""
    var scratch: HeldRows[Self.acc]
    """The task's scratch row of n (where the op asks for one)."""

    @always_inline
    def start(self) -> Int:
        """The row's first element."""
        return self.r * self.n


trait CpuRowOp:
    """An op on whole contiguous rows, one at a time: the row's statistics
    (its sweeps), its epilogue, and the value it finishes the row with (a
    loss) in one `row`. The driver (`each_row`, `loss_rows`) owns which
    task takes which rows and the task's scratch row."""

    comptime acc: DType
    """The accumulator type."""
    comptime scratch_row: Bool
    """Whether `row` needs a scratch row of n accumulators."""

    def row(self, at: TaskRow[Self.acc]) -> Scalar[Self.acc]:
        """Row `at.r`: its sweeps and writes; what it finishes with (the
        row's loss), else 0."""
        ...


@always_inline
def _row_tasks[
    Op: CpuRowOp, keep: Bool
](op: Op, rows: Int, n: Int, values: HeldRows[Op.acc]) raises:
    """`op.row` of rows 0 ... rows - 1, whole rows grouped into tasks
    (`run_in_tasks`), each task with its own scratch row; where `keep`,
    row r's value into values[r]."""

    def task_rows(begin: Int, end: Int) raises {imm}:
        var scratch_row = List[Scalar[Op.acc]](
            capacity=n if Op.scratch_row else 0
        )
        var scratch = held(
            rebind[Pointer[Scalar[Op.acc], MutAnyOrigin]](
                scratch_row.unsafe_ptr()
            )
        )
        for r in range(begin, end):
            var value = op.row(
                TaskRow[Op.acc](r, n, r + 1 if r + 1 < end else r, scratch)
            )
            comptime if keep:
                values[unsafe_offset=r] = value
        _ = scratch_row^

    run_in_tasks(task_rows, rows, n)


def each_row[Op: CpuRowOp](op: Op, rows: Int, n: Int) raises:
    """`op.row` of every contiguous row of n elements, 0 ... rows - 1."""
    var none = List[Scalar[Op.acc]]()
    _row_tasks[Op, False](
        op,
        rows,
        n,
        held(rebind[Pointer[Scalar[Op.acc], MutAnyOrigin]](none.unsafe_ptr())),
    )
    _ = none^


def loss_rows[
    reduction: StaticString, dtype: DType, Op: CpuRowOp
](
    op: Op,
    loss: Pointer[Scalar[dtype], MutAnyOrigin],
    rows: Int,
    n: Int,
    kept: Float64,
) raises:
    """`op.row` of every row, its values the rows' losses: into `loss` a
    loss a row ("none"), else their sum ("sum"), divided by `kept`
    ("mean"). Summed in row order (repeatable bits) in float64 for every
    dtype: a float32 running total of 8192 rows loses ~20 bits' worth of
    the last row's precision, 100x torch's error."""
    var row_losses = List[Scalar[Op.acc]](length=rows, fill=0)
    _row_tasks[Op, True](
        op,
        rows,
        n,
        held(
            rebind[Pointer[Scalar[Op.acc], MutAnyOrigin]](
                row_losses.unsafe_ptr()
            )
        ),
    )
    comptime if reduction == "none":
        for r in range(rows):
            loss[unsafe_offset=r] = row_losses[r].cast[dtype]()
    else:
        var total = Float64(0)
        for r in range(rows):
            total += row_losses[r].cast[DType.float64]()
        comptime if reduction == "mean":
            total = total / kept
        loss[unsafe_offset=0] = total.cast[dtype]()
    _ = row_losses^


trait RowBlocks(ColumnBlocks, CpuRowOp):
    """An op on the rows of an `(outer, n, inner)` view: contiguous rows
    one at a time (`CpuRowOp`), or W columns at a time (`ColumnBlocks`)."""

    pass


def run_rows[
    W: Int, F: RowBlocks
](op: F, outer: Int, n: Int, inner: Int) raises:
    """Run `op` on every row of an `(outer, n, inner)` view along n: whole
    contiguous rows grouped into tasks (`each_row`), or W columns at a time
    (`run_column_blocks`)."""
    if inner != 1:
        run_column_blocks[W](op, outer, n, inner)
    else:
        each_row(op, outer, n)


@always_inline
def max_of[
    dtype: DType
](x: Pointer[Scalar[dtype], MutAnyOrigin], count: Int) -> Scalar[
    accum_dtype[dtype]()
]:
    """The largest of x[0:count], NaN left out (-inf if there is none)."""
    comptime acc = accum_dtype[dtype]()
    comptime W = simd_width_of[acc]()
    var n_vec = count - count % W
    # A select, not `max`: one vmaxps instead of two instructions that keep
    # NaN out. NaN is left out either way (v > m is false); a NaN in the row
    # makes its sum, and so the row, NaN. Four running maxima, so the sweep
    # is not one chain of dependent maxes.
    var mv = SIMD[acc, 4 * W](-inf[acc]())
    var j4 = n_vec - n_vec % (4 * W)
    for j in range(0, j4, 4 * W):
        var v = x.unsafe_offset(j).unsafe_load[width=4 * W]().cast[acc]()
        mv = v.gt(mv).select(v, mv)
    for j in range(j4, n_vec, W):
        var v = x.unsafe_offset(j).unsafe_load[width=W]().cast[acc]()
        var low = mv.slice[W]()
        mv = mv.insert(v.gt(low).select(v, low))
    var m = mv.reduce_max()
    for j in range(n_vec, count):
        var v = x[unsafe_offset=j].cast[acc]()
        m = v.gt(m).select(v, m)
    return m


@fieldwise_init
struct Values[dtype: DType](RowTerms):
    """The elements of a row, in the accumulator type."""

    comptime acc = accum_dtype[Self.dtype]()

    var x: HeldRows[Self.dtype]
    """The row."""

    @always_inline
    def term[w: Int](self, j: Int) -> SIMD[Self.acc, w]:
        """The w elements at j."""
        return self.x.unsafe_offset(j).unsafe_load[width=w]().cast[Self.acc]()


@always_inline
def sum_of[
    dtype: DType
](x: Pointer[Scalar[dtype], MutAnyOrigin], count: Int) -> Scalar[
    accum_dtype[dtype]()
]:
    """The sum of x[0:count] in the accumulator type, blocked as every sum
    of exps (label smoothing needs it)."""
    return blocked_sum[simd_width_of[accum_dtype[dtype]()]()](
        Values[dtype](held(x)), count
    )
