"""Baseline GPU softmax: a block per row, shared-memory tree reductions.

The classic design the project grew from, kept as the reference design, a
selectable variant (`variant="tree"`) so every faster kernel is measured
against it. Each
thread strides over the row, so any row length works; the row is read from
global memory three times (max, sum, write).
"""

from max.gpu import block_idx, thread_idx
from max.gpu.memory import AddressSpace
from max.gpu.sync import barrier
from std.memory import stack_allocation
from std.utils.numerics import inf

from ..row_math import accum_dtype, epilogue, exp_nan, row_scale

comptime TREE_THREADS = 256


@always_inline
def _tree_reduce[
    acc: DType, is_max: Bool
](
    slots: Pointer[
        Scalar[acc], MutUntrackedOrigin, address_space=AddressSpace.SHARED
    ],
    tid: Int,
) -> Scalar[acc]:
    var stride = TREE_THREADS // 2
    while stride > 0:
        if tid < stride:
            comptime if is_max:
                slots[unsafe_offset=tid] = max(
                    slots[unsafe_offset=tid], slots[unsafe_offset=tid + stride]
                )
            else:
                slots[unsafe_offset=tid] = (
                    slots[unsafe_offset=tid] + slots[unsafe_offset=tid + stride]
                )
        barrier()
        stride //= 2
    var r = slots[unsafe_offset=0]
    barrier()  # everyone has read slots[unsafe_offset=0] before it is reused
    return r


def tree_rows_kernel[
    dtype: DType, log_out: Bool
](
    dst: Pointer[Scalar[dtype], MutAnyOrigin],
    src: Pointer[Scalar[dtype], MutAnyOrigin],
    n: Int64,
):
    """One block of `TREE_THREADS` threads per contiguous row.

    Parameters:
        dtype: Element type.
        log_out: Write log-softmax instead of softmax.

    Args:
        dst: Output rows.
        src: Input rows, `grid_dim.x` rows of `n` elements.
        n: Row length.
    """
    comptime acc = accum_dtype[dtype]()
    comptime assert acc.is_floating_point()
    var slots = stack_allocation[
        TREE_THREADS, Scalar[acc], address_space=AddressSpace.SHARED
    ]()
    var tid = Int(thread_idx.x)
    var len = Int(n)
    var base = Int(block_idx.x) * len

    var m = -inf[acc]()
    for j in range(tid, len, TREE_THREADS):
        m = max(m, src[unsafe_offset=base + j].cast[acc]())
    slots[unsafe_offset=tid] = m
    barrier()
    var row_max = _tree_reduce[acc, True](slots, tid)

    var s = Scalar[acc](0)
    for j in range(tid, len, TREE_THREADS):
        s += exp_nan[acc, 1](src[unsafe_offset=base + j].cast[acc]() - row_max)
    slots[unsafe_offset=tid] = s
    barrier()
    var scale = row_scale[log_out, acc](_tree_reduce[acc, False](slots, tid))

    for j in range(tid, len, TREE_THREADS):
        var v = src[unsafe_offset=base + j].cast[acc]()
        dst[unsafe_offset=base + j] = epilogue[log_out, acc, 1](
            v, row_max, scale
        ).cast[dtype]()
