"""Warp-shuffle and block-wide reductions shared by the GPU kernels.

A block reduction is a warp-shuffle reduction, one shared-memory slot per
warp, then every warp reduces those slots itself, so all threads end with
the result and no broadcast round-trip is needed.
"""

from max.gpu import WARP_SIZE, lane_id, thread_idx
from max.gpu.memory import AddressSpace
from max.gpu.sync import barrier
import max.gpu.primitives.warp as warp
from std.memory import stack_allocation
from std.utils.numerics import inf

from .row_math import exp_diff


@always_inline
def block_max[acc: DType, threads: Int](v: Scalar[acc]) -> Scalar[acc]:
    """Max over the `threads` threads of the block (or over a warp)."""
    var w = warp.max(v)
    comptime if threads <= WARP_SIZE:
        return w
    else:
        comptime warps = threads // WARP_SIZE
        var slots = stack_allocation[
            warps, Scalar[acc], address_space=AddressSpace.SHARED
        ]()
        var lane = Int(lane_id())
        if lane == 0:
            slots[unsafe_offset=Int(thread_idx.x) // WARP_SIZE] = w
        barrier()
        var r = slots[unsafe_offset=lane] if lane < warps else -inf[acc]()
        # Keep the slots until every warp has read them: the next reduction
        # may reuse this shared memory.
        barrier()
        return warp.max(r)


@always_inline
def block_sum[acc: DType, threads: Int](v: Scalar[acc]) -> Scalar[acc]:
    """Sum over the `threads` threads of the block (or over a warp)."""
    var w = warp.sum(v)
    comptime if threads <= WARP_SIZE:
        return w
    else:
        comptime warps = threads // WARP_SIZE
        var slots = stack_allocation[
            warps, Scalar[acc], address_space=AddressSpace.SHARED
        ]()
        var lane = Int(lane_id())
        if lane == 0:
            slots[unsafe_offset=Int(thread_idx.x) // WARP_SIZE] = w
        barrier()
        var r = slots[unsafe_offset=lane] if lane < warps else Scalar[acc](0)
        barrier()
        return warp.sum(r)


@always_inline
def block_max_sum[
    acc: DType, threads: Int
](m: Scalar[acc], s: Scalar[acc]) -> Tuple[Scalar[acc], Scalar[acc]]:
    """Combine per-thread online pairs (max, sum of exp(x - max))."""
    var row_max = block_max[acc, threads](m)
    var row_sum = block_sum[acc, threads](s * exp_diff[acc, 1](m, row_max))
    return (row_max, row_sum)
