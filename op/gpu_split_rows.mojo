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
from max.gpu.host import DeviceContext
from std.sys import size_of
from std.utils import StaticTuple
from std.utils.numerics import inf

from .gpu_launch import vector_flag_of
from .gpu_reductions import block_max_sum
from .gpu_split_workspace import (
    publish_pair,
    row_max_scale,
    split_counters,
    take_ticket,
    wait_for_row,
)
from .row_math import (
    accum_dtype,
    epilogue,
    load_widened,
    online_add,
    vector_width,
)
from .row_tensors import LaunchRows

comptime SPLIT_THREADS = 512
comptime SPLIT_CHUNK = 16384
# Bytes of rows between a row's partial items and its normalize items. The
# input read meanwhile (this window) plus the output written meanwhile
# (about as much) stay inside the 50 MB L2. The blocks resident on an H100
# hold more than that in flight (4 x 132 blocks x 64 KB = 33 MB), so some
# normalize blocks wait for their row's partials: about two thirds of a
# device copy at 32 x 1M (benchmarks/DECISIONS.md, 'long rows'), which is
# why rows up to 8 MB go to the streaming split.
comptime L2_WINDOW_BYTES = 16 << 20


# The two sweeps over a range of a row.


@always_inline
def online_pair[
    dtype: DType, V: Int, threads: Int
](
    x: Pointer[Scalar[dtype], MutAnyOrigin],
    begin: Int,
    end: Int,
    t: Int,
    vector_loads: Bool,
) -> Tuple[Scalar[accum_dtype[dtype]()], Scalar[accum_dtype[dtype]()]]:
    """This thread's online (max, sum) over x[begin:end], strided by block."""
    comptime acc = accum_dtype[dtype]()
    comptime assert acc.is_floating_point()
    var m = -inf[acc]()
    var s = Scalar[acc](0)
    if vector_loads:
        for e in range(begin + t * V, end, threads * V):
            var v = load_widened[V](x, e)
            var pair = online_add[acc, V](m, s, v)
            m = pair[0]
            s = pair[1]
    else:
        for e in range(begin + t, end, threads):
            var v = x[unsafe_offset=e].cast[acc]()
            var pair = online_add[acc, 1](m, s, v)
            m = pair[0]
            s = pair[1]
    return (m, s)


@always_inline
def normalize_range[
    dtype: DType, log_out: Bool, V: Int, threads: Int
](
    y: Pointer[Scalar[dtype], MutAnyOrigin],
    x: Pointer[Scalar[dtype], MutAnyOrigin],
    begin: Int,
    end: Int,
    t: Int,
    vector_loads: Bool,
    row_max: Scalar[accum_dtype[dtype]()],
    scale: Scalar[accum_dtype[dtype]()],
):
    """Write the epilogue for x[begin:end], strided by block."""
    comptime acc = accum_dtype[dtype]()
    comptime assert acc.is_floating_point()
    if vector_loads:
        for e in range(begin + t * V, end, threads * V):
            var v = load_widened[V](x, e)
            y.unsafe_offset(e).unsafe_store[alignment=16](
                epilogue[log_out, acc, V](v, row_max, scale).cast[dtype]()
            )
    else:
        for e in range(begin + t, end, threads):
            var v = x[unsafe_offset=e].cast[acc]()
            y[unsafe_offset=e] = epilogue[log_out, acc, 1](
                v, row_max, scale
            ).cast[dtype]()


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


def launch_split_rows[
    dtype: DType, log_out: Bool
](ctx: DeviceContext, r: LaunchRows[dtype]) raises:
    """Launch `split_rows_kernel` on `r`'s rows (any length, any GPU): two
    items a chunk, after zeroing its counters."""
    comptime acc = accum_dtype[dtype]()
    comptime assert acc.is_floating_point()
    comptime V = vector_width[dtype]()
    var chunks = split_chunks(r.n)
    var counters = split_counters(ctx, r.rows)
    var partials = ctx.enqueue_create_buffer[acc](r.rows * chunks * 2)
    comptime kernel = split_rows_kernel[dtype, log_out, V]
    ctx.enqueue_function[kernel](
        r.dst(),
        r.a(),
        rebind[Pointer[Int32, MutAnyOrigin]](counters.unsafe_ptr()),
        rebind[Pointer[Scalar[acc], MutAnyOrigin]](partials.unsafe_ptr()),
        Int64(r.rows),
        Int64(r.n),
        Int64(split_lag(r.rows, r.n * size_of[dtype]())),
        vector_flag_of(r.aligned, r.n, V),
        grid_dim=2 * r.rows * chunks,
        block_dim=SPLIT_THREADS,
    )
    # The buffers are freed in stream order, after the kernel.
    _ = counters^
    _ = partials^
