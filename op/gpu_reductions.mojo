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
def _group_reduce[
    acc: DType, group: Int, block: Int, is_max: Bool
](v: Scalar[acc]) -> Scalar[acc]:
    """Reduce over each aligned group of `group` threads in a `block`-thread
    block (group == block: the whole block; group <= 32: lanes of a warp,
    every lane of which must take part)."""
    comptime if group < WARP_SIZE:  # lanes of one warp: shuffles only
        comptime if is_max:
            return warp.lane_group_max[group](v)
        else:
            return warp.lane_group_sum[group](v)
    var w: Scalar[acc]
    comptime if is_max:
        w = warp.max(v)
    else:
        w = warp.sum(v)
    comptime if group == WARP_SIZE:
        return w
    else:
        comptime warps = group // WARP_SIZE
        var slots = stack_allocation[
            block // WARP_SIZE, Scalar[acc], address_space=AddressSpace.SHARED
        ]()
        var lane = Int(lane_id())
        var tid = Int(thread_idx.x)
        if lane == 0:
            slots[unsafe_offset=tid // WARP_SIZE] = w
        barrier()
        var first = (tid // group) * warps
        var r: Scalar[acc]
        comptime if is_max:
            r = (
                slots[unsafe_offset=first + lane] if lane
                < warps else -inf[acc]()
            )
        else:
            r = slots[unsafe_offset=first + lane] if lane < warps else Scalar[
                acc
            ](0)
        # Keep the slots until every warp has read them: the next reduction
        # may reuse this shared memory.
        barrier()
        comptime if is_max:
            return warp.max(r)
        else:
            return warp.sum(r)


@always_inline
def block_max[
    acc: DType, group: Int, block: Int = group
](v: Scalar[acc]) -> Scalar[acc]:
    """Max over each group of `group` threads (the block, or a warp)."""
    return _group_reduce[acc, group, block, True](v)


@always_inline
def block_sum[
    acc: DType, group: Int, block: Int = group
](v: Scalar[acc]) -> Scalar[acc]:
    """Sum over each group of `group` threads (the block, or a warp)."""
    return _group_reduce[acc, group, block, False](v)


@always_inline
def block_max_sum[
    acc: DType, threads: Int
](m: Scalar[acc], s: Scalar[acc]) -> Tuple[Scalar[acc], Scalar[acc]]:
    """Combine per-thread online pairs (max, sum of exp(x - max))."""
    var row_max = block_max[acc, threads](m)
    var row_sum = block_sum[acc, threads](s * exp_diff[acc, 1](m, row_max))
    return (row_max, row_sum)
