"""Long rows split across blocks, in one launch that reads HBM about once.

With 1-64 rows of a million elements, a block per row leaves most of the
GPU idle, and rows past the on-chip kernel's capacity cannot be held by one
block. Here row r is cut into chunks of `SPLIT_CHUNK` elements and the
launch runs two kinds of work item, a block each:

- partial (r, c): the online pair (max, sum of exp(x - max)) of chunk c of
  row r goes to a scratch buffer, then the block counts itself in row r's
  arrival counter (release);
- normalize (r, c): wait until row r's counter reaches `chunks` (acquire),
  fold the row's pairs (a few hundred floats) and write chunk c.

A block takes its item by ticket (one atomic add), so items start in
ticket order. The order interleaves the two kinds so that row r's
normalize items come `lag` rows after its partial items, `lag` rows being
about `L2_WINDOW_BYTES`: long enough that row r's partials have finished,
short enough that its chunks are still in the 50 MB L2 when they are read
again. HBM then sees one read and one write, as in the on-chip kernels.

A normalize item waits only for partial items, which hold lower tickets
(so they are already running) and never wait themselves: any grid size and
any share of the GPU is safe, no co-residency is needed.
"""

from max.gpu import MAX_THREADS_PER_BLOCK_METADATA, thread_idx
from max.gpu.memory import AddressSpace
from max.gpu.sync import barrier
from std.atomic import Atomic, Ordering
from std.memory import stack_allocation
from std.utils import StaticTuple
from std.utils.numerics import inf

from .gpu_online_rows import normalize_range, online_pair
from .gpu_reductions import block_max_sum
from .row_math import accum_dtype, fold_pair, online_sum_guard, row_scale

comptime SPLIT_THREADS = 512
comptime SPLIT_CHUNK = 16384
# Bytes of rows between a row's partial items and its normalize items. The
# input read meanwhile (this window) plus the output written meanwhile
# (about as much) stay inside the 50 MB L2. The blocks resident on an H100
# hold more than that in flight (4 x 132 blocks x 64 KB = 33 MB), so some
# normalize blocks wait for their row's partials (RESULTS: 65% of copy at
# 32 x 1M).
comptime L2_WINDOW_BYTES = 16 << 20


# The pieces both split kernels share: tickets, per-chunk pairs, arrivals.
# counters[0] is the ticket counter, counters[1 + r] row r's arrivals;
# partials holds a (max, sum) per chunk, row-major.
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
        var folded = fold_pair[acc](
            m,
            s,
            shared.load[ordering=Ordering.RELAXED](at),
            shared.load[ordering=Ordering.RELAXED](at.unsafe_offset(1)),
        )
        m = folded[0]
        s = folded[1]
    return block_row_terms[acc, T, log_out](m, s)


@always_inline
def split_chunks(n: Int) -> Int:
    """Chunks (items of each kind) per row of length `n`."""
    return (n + SPLIT_CHUNK - 1) // SPLIT_CHUNK


def split_lag(rows: Int, row_bytes: Int) -> Int:
    """Rows between a row's partial and normalize items (1 to rows)."""
    return max(1, min(rows, L2_WINDOW_BYTES // max(row_bytes, 1)))


@always_inline
def split_item(
    ticket: Int, rows: Int, chunks: Int, lag: Int
) -> Tuple[Bool, Int, Int]:
    """(normalize?, row, chunk) of the item with this ticket.

    Tickets go in units of `chunks` items: partial units of rows 0..lag-1,
    then normalize(0), partial(lag), normalize(1), partial(lag + 1), ...,
    and the last `lag` normalize units.
    """
    var unit = ticket // chunks
    var c = ticket % chunks
    if unit < lag:
        return (False, unit, c)
    var v = unit - lag
    var paired = rows - lag
    if v < 2 * paired:
        if v % 2 == 0:
            return (True, v // 2, c)
        return (False, lag + v // 2, c)
    return (True, paired + v - 2 * paired, c)


@__llvm_metadata(
    MAX_THREADS_PER_BLOCK_METADATA=StaticTuple[Int32, 1](Int32(SPLIT_THREADS))
)
def split_rows_kernel[
    dtype: DType, log_out: Bool, V: Int
](
    dst: Pointer[Scalar[dtype], MutAnyOrigin],
    src: Pointer[Scalar[dtype], MutAnyOrigin],
    counters: Pointer[Int32, MutAnyOrigin],
    partials: Pointer[Scalar[accum_dtype[dtype]()], MutAnyOrigin],
    rows: Int64,
    n: Int64,
    lag: Int64,
    vector_flag: Int32,
):
    """One work item per block; `2 * rows * split_chunks(n)` blocks.

    Parameters:
        dtype: Element type.
        log_out: Write log-softmax instead of softmax.
        V: Elements per 16-byte vector of `dtype`.

    Args:
        dst: Output rows.
        src: Input rows of `n` elements.
        counters: `1 + rows` zeroed counters: the ticket counter, then one
            arrival counter per row.
        partials: `rows * chunks * 2` accumulators, a (max, sum) per chunk.
        rows: Number of rows.
        n: Row length.
        lag: `split_lag(rows, row bytes)`.
        vector_flag: Nonzero when rows are 16-byte aligned (n % V == 0).
    """
    comptime acc = accum_dtype[dtype]()
    comptime assert acc.is_floating_point()
    comptime T = SPLIT_THREADS
    var t = Int(thread_idx.x)
    var len = Int(n)
    var chunks = split_chunks(len)
    var vector_loads = vector_flag != 0

    var item = split_item(take_ticket(counters), Int(rows), chunks, Int(lag))
    var r = item[1]
    var c = item[2]
    var x = src.unsafe_offset(r * len)
    var begin = c * SPLIT_CHUNK
    var end = min(len, begin + SPLIT_CHUNK)

    if not item[0]:  # partial
        var pair = online_pair[dtype, V, T](x, begin, end, t, vector_loads)
        var total = block_max_sum[acc, T](pair[0], pair[1])
        publish_pair(counters, partials, r, chunks, c, total[0], total[1])
        return

    wait_for_row(counters, r, chunks)
    var terms = row_max_scale[acc, T, log_out](partials, r, chunks)
    normalize_range[dtype, log_out, V, T](
        dst.unsafe_offset(r * len),
        x,
        begin,
        end,
        t,
        vector_loads,
        terms[0],
        terms[1],
    )
