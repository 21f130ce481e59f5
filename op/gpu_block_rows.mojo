"""The block strategy, generic over `BlockRowOp`: a block a row, of any
length. Each thread folds its share of the row into the op's statistics,
the block combines them, then each thread reads its share again (mostly
from L2) and writes it.

A thread's share is 16-byte vectors `T * V` elements apart from `t * V`
where the rows are aligned (`vector_flag` nonzero: n % V == 0 and the
buffers start 16-byte aligned), else elements `T` apart from `t`. The
backward (`BackwardBlockRow`, gpu_backward_rows), the masked softmax
(`MaskedBlockRow`, gpu_masked_rows) and the soft-target cross-entropy
(`SoftBlockRow`, gpu_soft_cross_entropy: elements only, its row loss
stored in `combine`, its write pass the gradient's, empty without it)
run on it; their kernels build the op from their arguments and call
`block_rows`, so launch bounds and argument lists stay the kernels' own.

The cross-entropy's block kernel (`ce_block_kernel`, gpu_ce_block_rows)
does not: its rows are laid out by address as a `RowPart` (a scalar head,
an aligned vector body, a scalar tail) rather than vectors or scalars by
one flag, and its statistics pass (`block_stats`, shared with the sharded
statistics) keeps U loads a thread in flight.
"""

from max.gpu import block_idx, thread_idx

from .row_op import BlockRowOp


@always_inline
def block_rows[
    Op: BlockRowOp, one_loop: Bool
](mut op: Op, n: Int64, vector_flag: Int32):
    """Row `block_idx.x` (of `n` elements) of `op`: fold the thread's share
    to the row's fold limit, combine over the block, write the thread's
    share of the whole row.

    `one_loop`: each pass is one loop whose stepping is chosen once and
    which chooses vector or element at each step (the backward's);
    otherwise a loop a path (the masked softmax's). The two shapes compile
    to different machine code, so each op keeps the one its timings chose
    (benchmarks/RESULTS.md).
    """
    comptime T = Op.threads
    comptime V = Op.width
    var t = Int(thread_idx.x)
    var len = Int(n)
    var limit = op.begin(Int(block_idx.x), len)
    var vector = vector_flag != 0
    comptime if one_loop:
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
