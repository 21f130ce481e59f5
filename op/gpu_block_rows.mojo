"""The block strategy, generic over `BlockRowOp`: a block a row, of any
length. Each thread folds its share of the row into the op's statistics,
the block combines them, then each thread reads its share again (mostly
from L2) and writes it.

The `walk` steps a thread's share: ONE_LOOP and LOOP_A_PATH take 16-byte
vectors `T * V` elements apart from `t * V` where the rows are aligned
(`vector_flag` nonzero: n % V == 0 and the buffers start 16-byte
aligned), else elements `T` apart from `t`; ROW_PARTS takes the row by
address as a `RowPart` (a scalar head, an aligned vector body, a scalar
tail), the op folding its whole share at once (`fold_part`: the
cross-entropy keeps U loads a thread in flight), only rows it `folds`.
The backward (`BackwardBlockRow`, gpu_backward_rows), the masked softmax
(`MaskedBlockRow`, gpu_masked_rows), the soft-target cross-entropy
(`SoftBlockRow`, gpu_soft_cross_entropy: elements only, its row loss
stored in `combine`, its write pass the gradient's, empty without it) and
the cross-entropy (`CEBlockRow`, gpu_ce_block_rows: ROW_PARTS) run on it;
their kernels build the op from their arguments and call `block_rows`, so
launch bounds and argument lists stay the kernels' own.
"""

from max.gpu import block_idx, thread_idx

from .row_op import BlockRowOp, walk_part
from .row_part import row_part

comptime ONE_LOOP = 0
"""`block_rows` walk: each pass one loop whose stepping is chosen once and
which chooses vector or element at each step (the backward's)."""
comptime LOOP_A_PATH = 1
"""`block_rows` walk: a loop for vectors, another for elements (the masked
softmax's, the soft targets')."""
comptime ROW_PARTS = 2
"""`block_rows` walk: the row as a `RowPart` (the cross-entropy's): where
the row `folds`, the op folds its whole share (`fold_part`); `combine`,
`store_row`, then the write takes the body's vectors, the head's and the
tail's elements, then `finish`."""


@always_inline
def block_rows[
    Op: BlockRowOp, walk: Int
](mut op: Op, n: Int64, vector_flag: Int32):
    """Row `block_idx.x` (of `n` elements) of `op`: fold the thread's share
    to the row's fold limit, combine over the block, write the thread's
    share of the whole row.

    `walk` (ONE_LOOP, LOOP_A_PATH, ROW_PARTS) is how a share is stepped;
    the shapes compile to different machine code, so each op keeps the one
    its timings chose (benchmarks/RESULTS.md). Under ONE_LOOP and
    LOOP_A_PATH `vector_flag` says the rows are all vectors (n % V == 0,
    buffers 16-byte aligned); under ROW_PARTS that the buffers start
    aligned (`row_part`).
    """
    comptime T = Op.threads
    comptime V = Op.width
    var t = Int(thread_idx.x)
    var len = Int(n)
    var row = Int(block_idx.x)
    comptime if walk == ROW_PARTS:
        var start = row * len
        var p = row_part[V, T](t, start, len, vector_flag)
        # The whole row is folded (no op on this walk stops short).
        _ = op.begin(row, len)
        # `combine` in each arm rather than once after: inlined into each,
        # the op's own test of `folds` inside it is settled, so the row
        # takes one branch (two tests of it, the fold's loops between,
        # are not merged by the compiler).
        if op.folds():
            op.fold_part(p)
            op.combine()
        else:
            op.combine()
        op.store_row()
        walk_part[write=True](op, p)
        op.finish(p)
        return
    var limit = op.begin(row, len)
    var vector = vector_flag != 0
    comptime if walk == ONE_LOOP:
        var step = T * V if vector else T
        var first = t * V if vector else t
        _pass[write=False](op, first, limit, step, vector)
        op.combine()
        _pass[write=True](op, first, len, step, vector)
    else:
        if vector:
            _pass[write=False](op, t * V, limit, T * V, True)
        else:
            _pass[write=False](op, t, limit, T, False)
        op.combine()
        if vector:
            _pass[write=True](op, t * V, len, T * V, True)
        else:
            _pass[write=True](op, t, len, T, False)


@always_inline
def _pass[
    Op: BlockRowOp, write: Bool
](mut op: Op, first: Int, end: Int, step: Int, vector: Bool):
    """One pass over the thread's share [first, end), `step` apart: fold
    or (`write`) write a vector or an element at each step."""
    for e in range(first, end, step):
        comptime if write:
            if vector:
                op.write_vector(e)
            else:
                op.write_element(e)
        else:
            if vector:
                op.fold_vector(e)
            else:
                op.fold_element(e)
