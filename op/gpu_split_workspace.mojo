"""What the split kernels share besides their chunks: the workspace through
which the blocks of a row meet, and the limits of the kernels that hold a
split row on chip.

The workspace is one Int32 buffer that one memset zeroes before the launch
(`split_counters`): counters[0] is the ticket counter, counters[1 + r] row
r's arrival counter, then, from `pairs_offset(rows)`, the 64-bit words of
the streaming split's packed pairs. The re-reading split keeps its pairs, a
(max, sum) per chunk, row-major, in a second buffer of accumulators
(`publish_pair`, `row_max_scale`).

The kernel that holds a split row on chip (gpu_split_stream_rows) needs
all of a row's chunks resident at once: rows are
limited to `ON_CHIP_SPLIT_MAX_ROW_BYTES`, and `check_on_chip_split` refuses
rows with more chunks than the GPU holds.
"""

from max.gpu import thread_idx
from max.gpu.host import DeviceAttribute, DeviceBuffer, DeviceContext
from max.gpu.memory import AddressSpace
from max.gpu.sync import barrier
from std.atomic import Atomic, Ordering
from std.math import ceildiv
from std.memory import stack_allocation
from std.sys import size_of
from std.utils.numerics import inf

from .gpu_reductions import block_max_sum
from .gpu_split_chunks import chunk_bytes
from .row_math import fold_pair, online_sum_guard, row_scale

# Longest row, in bytes, of the kernels that hold a split row on chip: its
# chunks must all be able to be resident at once; 8 MB is under a third of
# what an H100 holds. Longer rows go to the re-reading split.
comptime ON_CHIP_SPLIT_MAX_ROW_BYTES = 8 << 20


def on_chip_split_capacity(size: Int) -> Int:
    """Longest row (elements of `size` bytes) the on-chip split kernels
    take."""
    return ON_CHIP_SPLIT_MAX_ROW_BYTES // size


# Device side: tickets, per-chunk pairs, arrivals. DeviceCounter: the
# atomics on the Int32 counters, at device scope.
comptime DeviceCounter = Atomic[Int32, scope="device"]


@always_inline
def take_ticket(counters: Pointer[Int32, MutAnyOrigin]) -> Int:
    """The block's ticket: blocks start work in ticket order, which block
    indices do not promise."""
    var slot = stack_allocation[1, Int32, address_space=AddressSpace.SHARED]()
    if thread_idx.x == 0:
        slot[] = DeviceCounter.fetch_add[ordering=Ordering.RELAXED](counters, 1)
    barrier()
    return Int(slot[])


@always_inline
def publish_pair[
    acc: DType
](
    counters: Pointer[Int32, MutAnyOrigin],
    partials: Pointer[Scalar[acc], MutAnyOrigin],
    r: Int,
    chunks: Int,
    c: Int,
    chunk_max: Scalar[acc],
    chunk_sum: Scalar[acc],
):
    """Store chunk c's pair, then count it in row r's arrivals."""
    if thread_idx.x == 0:
        partials[unsafe_offset=(r * chunks + c) * 2] = chunk_max
        partials[unsafe_offset=(r * chunks + c) * 2 + 1] = chunk_sum
        # Release: the pair is visible before the count announcing it.
        _ = DeviceCounter.fetch_add[ordering=Ordering.RELEASE](
            counters.unsafe_offset(1 + r), 1
        )


@always_inline
def wait_for_row(counters: Pointer[Int32, MutAnyOrigin], r: Int, chunks: Int):
    """Block until all `chunks` pairs of row r are published."""
    if thread_idx.x == 0:
        var arrivals = counters.unsafe_offset(1 + r)
        while (
            Int(DeviceCounter.load[ordering=Ordering.ACQUIRE](arrivals))
            < chunks
        ):
            continue
    barrier()


@always_inline
def block_row_terms[
    acc: DType, T: Int, log_out: Bool
](m: Scalar[acc], s: Scalar[acc]) -> Tuple[Scalar[acc], Scalar[acc]]:
    """A row's max and `row_scale` (NaN where the three-pass algorithm gives
    NaN) from each of a block of T threads' share of the row's pairs."""
    var total = block_max_sum[acc, T](m, s)
    return (
        total[0],
        row_scale[log_out, acc](online_sum_guard[acc](total[0], total[1])),
    )


@always_inline
def row_max_scale[
    acc: DType, T: Int, log_out: Bool
](partials: Pointer[Scalar[acc], MutAnyOrigin], r: Int, chunks: Int) -> Tuple[
    Scalar[acc], Scalar[acc]
]:
    """Row r's max and `row_scale` (NaN where the three-pass algorithm gives
    NaN), folded from its chunks' pairs by a block of T threads (after
    `wait_for_row`)."""
    # Pairs are read at device scope, past L1: this SM's L1 may hold a
    # stale line of them from an earlier block of a neighbouring row.
    comptime shared = Atomic[Scalar[acc], scope="device"]
    var t = Int(thread_idx.x)
    var m = -inf[acc]()
    var s = Scalar[acc](0)
    for i in range(t, chunks, T):
        var at = partials.unsafe_offset((r * chunks + i) * 2)
        (m, s) = fold_pair[acc](
            m,
            s,
            shared.load[ordering=Ordering.RELAXED](at),
            shared.load[ordering=Ordering.RELAXED](at.unsafe_offset(1)),
        )
    return block_row_terms[acc, T, log_out](m, s)


# Host side: the workspace and the on-chip splits' checks.


def split_counters(
    ctx: DeviceContext, rows: Int, pair_words: Int = 0
) raises -> DeviceBuffer[DType.int32]:
    """Zeroed counters of the split kernels: the ticket counter, then one
    arrival counter per row, then (from `pairs_offset(rows)`) `pair_words`
    64-bit words for packed pairs. One memset zeroes them all."""
    var size = 1 + rows
    if pair_words > 0:
        size = pairs_offset(rows) + 2 * pair_words
    var counters = ctx.enqueue_create_buffer[DType.int32](size)
    ctx.enqueue_memset(counters, 0)
    return counters^


def pairs_offset(rows: Int) -> Int:
    """Int32 offset of the packed pairs after the counters: 8-byte aligned."""
    return (2 + rows) // 2 * 2


def check_on_chip_split[
    dtype: DType
](ctx: DeviceContext, variant: String, n: Int, chunks: Int, slots: Int) raises:
    """Raise unless rows of `n` fit the kernels that hold a split row on chip
    (split_smem, split_stream): up to `ON_CHIP_SPLIT_MAX_ROW_BYTES`, and no
    more than `slots` chunks a row, the chunks this GPU holds at once (a
    row whose chunks cannot all be held would wait forever)."""
    if n > on_chip_split_capacity(size_of[dtype]()):
        raise Error(
            "max_softmax: variant '"
            + variant
            + "' handles rows up to "
            + String(on_chip_split_capacity(size_of[dtype]()))
            + " elements, got "
            + String(n)
        )
    if chunks > slots:
        raise Error(
            "max_softmax: variant '"
            + variant
            + "' needs the "
            + String(chunks)
            + " chunks of a row of "
            + String(n)
            + " on chip at once; this GPU holds "
            + String(slots)
        )


def multiprocessors(ctx: DeviceContext) raises -> Int:
    """Streaming multiprocessors of this GPU (or of its share of one)."""
    return ctx.get_attribute(DeviceAttribute.MULTIPROCESSOR_COUNT)


def split_stream_room[
    dtype: DType, T: Int, K: Int, B: Int
](ctx: DeviceContext, n: Int) raises -> Tuple[Int, Int]:
    """The chunks a row of `n` takes in split_stream with blocks of T
    threads and K vectors a thread, and the chunks this GPU holds at once:
    two for each of its resident blocks, B an SM."""
    return (
        ceildiv(n * size_of[dtype](), chunk_bytes(T, K)),
        2 * multiprocessors(ctx) * B,
    )
