"""The one place that decides which kernel runs for which shape.

Every op sees its tensor as (outer, n, inner): softmax runs along n. On the
GPU, contiguous rows (inner == 1) are dispatched by row length n, in units
of V = elements per 16-byte vector (4 for float32, 8 for 16-bit types):

| rows of length n          | kernel (file)                            |
|---------------------------|------------------------------------------|
| n <= 32*V*4               | 8-32 lanes a row, in registers (gpu_register_rows) |
| n <= 512*64 values        | block rows, 64-512 threads a row, in registers |
| rows >= 264, n <= ~74K fp32 / ~149K 16-bit | block per row, on chip in registers + shared memory (gpu_smem_rows) |
| fewer rows, or longer, to 8 MB a row | rows split across resident blocks that stream chunks (56 KB fp32, 24 KB 16-bit) through two shared-memory buffers, read once (gpu_split_stream_rows) |
| rows over 8 MB            | rows split across blocks, one launch, re-read from L2 (gpu_split_rows) |
| inner > 1 (any n)         | a thread per column (gpu_strided_rows)   |

`variant` forces one family ("tree", "warp", "block", "smem", "online",
"split_smem", "split_stream", "split") so benchmarks and tests can run
each; "auto" follows the table.
The online kernel (a block per row, reading it twice) is a baseline now,
and so is split_smem (a block a chunk, which waits for its row holding it).
"""

from max.gpu.host import (
    DeviceAttribute,
    DeviceBuffer,
    DeviceContext,
    FuncAttribute,
)
from std.math import ceildiv
from std.sys import size_of

from .cpu_backward import softmax_backward_cpu
from .cpu_rows import softmax_cpu
from .gpu_backward_rows import (
    BACKWARD_STRIDED_THREADS,
    BACKWARD_ROW_REGISTERS,
    backward_register_kernel,
    backward_rows_kernel,
    backward_strided_kernel,
)
from .gpu_online_rows import ONLINE_THREADS, online_rows_kernel
from .gpu_register_rows import (
    MAX_ROW_REGISTERS,
    NUM_PLANS,
    block_threads,
    chunk_registers,
    plan_chunks,
    plan_threads,
    register_rows_kernel,
)
from .gpu_smem_rows import (
    SMEM_HALF_THREADS,
    SMEM_THREADS,
    smem_bytes_for,
    smem_capacity,
    smem_rows_kernel,
    smem_threads_for,
)
from .gpu_split_smem_rows import (
    SPLIT_SMEM_SM_THREADS,
    SPLIT_SMEM_THREADS,
    split_smem_capacity,
    split_smem_chunk_bytes,
    split_smem_rows_kernel,
    split_smem_shared_bytes,
)
from .gpu_split_stream_rows import (
    pair_words,
    split_stream_blocks,
    split_stream_rows_kernel,
    split_stream_shared_bytes,
    split_stream_threads,
    split_stream_vectors,
)
from .gpu_split_rows import (
    SPLIT_THREADS,
    split_chunks,
    split_lag,
    split_rows_kernel,
)
from .gpu_strided_rows import STRIDED_THREADS, strided_rows_kernel
from .gpu_tree_rows import TREE_THREADS, tree_rows_kernel
from .row_math import accum_dtype, vector_width

comptime WARP_THREADS = 32
# Fewer rows than this (two per H100 SM) cannot fill the GPU one block per
# row, so long rows are split across blocks instead.
comptime SPLIT_BELOW_ROWS = 264


def gpu_kernel_for(rows: Int, n: Int, V: Int) -> String:
    """The kernel family "auto" picks for `rows` contiguous rows of `n`."""
    var plan = register_plan(n, V, 0)
    if plan >= 0:
        return "warp" if plan_threads(plan) <= WARP_THREADS else "block"
    if rows >= SPLIT_BELOW_ROWS and n <= smem_capacity(V):
        return "smem"
    if n <= split_smem_capacity(16 // V):
        return "split_stream"
    return "split"


def register_plan(
    n: Int, V: Int, min_threads: Int, max_registers: Int = MAX_ROW_REGISTERS
) -> Int:
    """First register plan (see gpu_register_rows) that holds a row of `n`
    with at least `min_threads` threads per row and at most `max_registers`
    32-bit registers of row values a thread, else -1."""
    for i in range(NUM_PLANS):
        var threads = plan_threads(i)
        var k = plan_chunks(i)
        if threads < min_threads or chunk_registers(V) * k > max_registers:
            continue
        if n <= threads * V * k:
            return i
    return -1


def register_capacity(V: Int, min_threads: Int, max_threads: Int) -> Int:
    """Longest row a register plan with threads in the range can hold."""
    var best = 0
    for i in range(NUM_PLANS):
        var threads = plan_threads(i)
        var k = plan_chunks(i)
        if (
            min_threads <= threads <= max_threads
            and chunk_registers(V) * k <= MAX_ROW_REGISTERS
        ):
            best = max(best, threads * V * k)
    return best


def _aligned16(a: Int, b: Int, c: Int = 0) -> Bool:
    """Whether every address given is 16-byte aligned: vector loads need it,
    and a torch view may start anywhere."""
    return (a | b | c) % 16 == 0


def _vector_flag(aligned: Bool, n: Int, V: Int) -> Int32:
    """1 where every row starts 16-byte aligned (buffers aligned, n % V ==
    0), else 0. Bool is not DevicePassable: the flags travel as Int32."""
    return Int32(1) if aligned and n % V == 0 else Int32(0)


def softmax_rows[
    target: StaticString,
    dtype: DType,
    log_out: Bool,
    variant: StaticString,
](
    ctx: DeviceContext,
    dst: Pointer[Scalar[dtype], MutAnyOrigin],
    src: Pointer[Scalar[dtype], MutAnyOrigin],
    outer: Int,
    n: Int,
    inner: Int,
) raises:
    """Run softmax (or log-softmax) of the (outer, n, inner) view on `target`.
    """
    if outer * n * inner == 0:
        return
    comptime if target == "cpu":
        softmax_cpu[dtype, log_out](dst, src, outer, n, inner)
    elif target == "gpu":
        _launch_gpu[dtype, log_out, variant](ctx, dst, src, outer, n, inner)
    else:
        raise Error("max_softmax: unsupported target " + String(target))


def _launch_gpu[
    dtype: DType, log_out: Bool, variant: StaticString
](
    ctx: DeviceContext,
    dst: Pointer[Scalar[dtype], MutAnyOrigin],
    src: Pointer[Scalar[dtype], MutAnyOrigin],
    outer: Int,
    n: Int,
    inner: Int,
) raises:
    comptime V = vector_width[dtype]()
    if inner != 1:
        comptime kernel = strided_rows_kernel[dtype, log_out]
        ctx.enqueue_function[kernel](
            dst,
            src,
            Int64(outer),
            Int64(n),
            Int64(inner),
            grid_dim=ceildiv(outer * inner, STRIDED_THREADS),
            block_dim=STRIDED_THREADS,
        )
        return

    var rows = outer
    var aligned = _aligned16(Int(src), Int(dst))
    var vector_flag = _vector_flag(aligned, n, V)
    var family = String(variant)
    if family == "auto":
        family = gpu_kernel_for(rows, n, V)
        # A GPU too small to hold a row's chunks at once (a MIG slice) gets
        # the kernel that needs no co-residency.
        if family == "split_stream" and not _split_stream_fits[dtype](ctx, n):
            family = "split"

    if family == "tree":
        comptime kernel = tree_rows_kernel[dtype, log_out]
        ctx.enqueue_function[kernel](
            dst, src, Int64(n), grid_dim=rows, block_dim=TREE_THREADS
        )
    elif family == "warp" or family == "block":
        # "warp": 8 to 32 threads per row; "block": 64 to 512.
        var min_threads = 1 if family == "warp" else 2 * WARP_THREADS
        var max_threads = WARP_THREADS if family == "warp" else 512
        var plan = register_plan(n, V, min_threads)
        if plan < 0 or plan_threads(plan) > max_threads:
            raise Error(
                "max_softmax: variant '"
                + family
                + "' handles rows up to "
                + String(register_capacity(V, min_threads, max_threads))
                + " elements, got "
                + String(n)
            )
        comptime for i in range(NUM_PLANS):
            comptime T = plan_threads(i)
            comptime K = plan_chunks(i)
            comptime if chunk_registers(V) * K <= MAX_ROW_REGISTERS:
                if plan == i:
                    comptime kernel = register_rows_kernel[
                        dtype, log_out, T, V, K
                    ]
                    comptime block = block_threads[T]()
                    ctx.enqueue_function[kernel](
                        dst,
                        src,
                        Int64(rows),
                        Int64(n),
                        vector_flag,
                        grid_dim=ceildiv(rows, block // T),
                        block_dim=block,
                    )
    elif family == "smem":
        if n > smem_capacity(V):
            raise Error(
                "max_softmax: variant 'smem' handles rows up to "
                + String(smem_capacity(V))
                + " elements, got "
                + String(n)
            )
        var threads = smem_threads_for(n, V)
        var smem_bytes = smem_bytes_for(n, V, threads)
        comptime for T in [SMEM_HALF_THREADS, SMEM_THREADS]:
            if threads == T:
                comptime kernel = smem_rows_kernel[dtype, log_out, V, T]
                ctx.enqueue_function[kernel](
                    dst,
                    src,
                    Int64(n),
                    Int32(1) if aligned else Int32(0),
                    grid_dim=rows,
                    block_dim=T,
                    shared_mem_bytes=smem_bytes,
                    func_attribute=FuncAttribute.MAX_DYNAMIC_SHARED_SIZE_BYTES(
                        UInt32(smem_bytes)
                    ),
                )
    elif family == "online":
        comptime kernel = online_rows_kernel[dtype, log_out, V]
        ctx.enqueue_function[kernel](
            dst,
            src,
            Int64(n),
            vector_flag,
            grid_dim=rows,
            block_dim=ONLINE_THREADS,
        )
    elif family == "split_smem":
        _launch_split_smem[dtype, log_out, SPLIT_SMEM_THREADS](
            ctx, dst, src, rows, n, aligned
        )
    elif family == "split_stream":
        launch_split_stream[
            dtype,
            log_out,
            split_stream_threads[dtype](),
            split_stream_vectors[dtype](),
            split_stream_blocks[dtype](),
        ](ctx, dst, src, rows, n, aligned)
    elif family == "split":
        comptime acc = accum_dtype[dtype]()
        comptime assert acc.is_floating_point()
        var chunks = split_chunks(n)
        var counters = _split_counters(ctx, rows)
        var partials = ctx.enqueue_create_buffer[acc](rows * chunks * 2)
        comptime kernel = split_rows_kernel[dtype, log_out, V]
        ctx.enqueue_function[kernel](
            dst,
            src,
            rebind[Pointer[Int32, MutAnyOrigin]](counters.unsafe_ptr()),
            rebind[Pointer[Scalar[acc], MutAnyOrigin]](partials.unsafe_ptr()),
            Int64(rows),
            Int64(n),
            Int64(split_lag(rows, n * size_of[dtype]())),
            vector_flag,
            grid_dim=2 * rows * chunks,
            block_dim=SPLIT_THREADS,
        )
        # The buffers are freed in stream order, after the kernel.
        _ = counters^
        _ = partials^
    else:
        raise Error("max_softmax: unknown variant '" + family + "'")


def _split_counters(
    ctx: DeviceContext, rows: Int, pair_words: Int = 0
) raises -> DeviceBuffer[DType.int32]:
    """Zeroed counters of the split kernels: the ticket counter, then one
    arrival counter per row, then (from `_pairs_offset(rows)`) `pair_words`
    64-bit words for packed pairs. One memset zeroes them all."""
    var size = 1 + rows
    if pair_words > 0:
        size = _pairs_offset(rows) + 2 * pair_words
    var counters = ctx.enqueue_create_buffer[DType.int32](size)
    ctx.enqueue_memset(counters, 0)
    return counters^


def _pairs_offset(rows: Int) -> Int:
    """Int32 offset of the packed pairs after the counters: 8-byte aligned."""
    return (2 + rows) // 2 * 2


def _check_on_chip_split[
    dtype: DType
](ctx: DeviceContext, variant: String, n: Int, chunks: Int, slots: Int) raises:
    """Raise unless rows of `n` fit the kernels that hold a split row on chip
    (split_smem, split_stream): up to `SPLIT_SMEM_MAX_ROW_BYTES`, and no
    more than `slots` chunks a row, the chunks this GPU holds at once (a
    row whose chunks cannot all be held would wait forever)."""
    if n > split_smem_capacity(size_of[dtype]()):
        raise Error(
            "max_softmax: variant '"
            + variant
            + "' handles rows up to "
            + String(split_smem_capacity(size_of[dtype]()))
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


def _multiprocessors(ctx: DeviceContext) raises -> Int:
    """Streaming multiprocessors of this GPU (or of its share of one)."""
    return ctx.get_attribute(DeviceAttribute.MULTIPROCESSOR_COUNT)


def _split_stream_room[
    dtype: DType, T: Int, K: Int, B: Int
](ctx: DeviceContext, n: Int) raises -> Tuple[Int, Int]:
    """The chunks a row of `n` takes in split_stream with blocks of T
    threads and K vectors a thread, and the chunks this GPU holds at once:
    two for each of its resident blocks, B an SM."""
    return (
        ceildiv(n * size_of[dtype](), split_smem_chunk_bytes(T, K)),
        2 * _multiprocessors(ctx) * B,
    )


def _split_stream_fits[dtype: DType](ctx: DeviceContext, n: Int) raises -> Bool:
    """Whether this GPU holds all chunks of a row of `n` at once in the
    table's split_stream blocks."""
    var room = _split_stream_room[
        dtype,
        split_stream_threads[dtype](),
        split_stream_vectors[dtype](),
        split_stream_blocks[dtype](),
    ](ctx, n)
    return room[0] <= room[1]


def _launch_split_smem[
    dtype: DType,
    log_out: Bool,
    T: Int,
](
    ctx: DeviceContext,
    dst: Pointer[Scalar[dtype], MutAnyOrigin],
    src: Pointer[Scalar[dtype], MutAnyOrigin],
    rows: Int,
    n: Int,
    aligned: Bool,
) raises:
    """Launch gpu_split_smem_rows with blocks of T threads: one per chunk,
    after zeroing its counters."""
    comptime acc = accum_dtype[dtype]()
    comptime assert acc.is_floating_point()
    comptime V = vector_width[dtype]()
    var chunks = ceildiv(n * size_of[dtype](), split_smem_chunk_bytes(T))
    # A chunk a block, SPLIT_SMEM_SM_THREADS // T blocks an SM.
    _check_on_chip_split[dtype](
        ctx,
        "split_smem",
        n,
        chunks,
        _multiprocessors(ctx) * (SPLIT_SMEM_SM_THREADS // T),
    )
    var counters = _split_counters(ctx, rows)
    var partials = ctx.enqueue_create_buffer[acc](rows * chunks * 2)
    comptime kernel = split_smem_rows_kernel[dtype, log_out, V, T]
    var smem_bytes = split_smem_shared_bytes(T)
    ctx.enqueue_function[kernel](
        dst,
        src,
        rebind[Pointer[Int32, MutAnyOrigin]](counters.unsafe_ptr()),
        rebind[Pointer[Scalar[acc], MutAnyOrigin]](partials.unsafe_ptr()),
        Int64(n),
        Int32(1) if aligned else Int32(0),
        grid_dim=rows * chunks,
        block_dim=T,
        shared_mem_bytes=smem_bytes,
        func_attribute=FuncAttribute.MAX_DYNAMIC_SHARED_SIZE_BYTES(
            UInt32(smem_bytes)
        ),
    )
    # The buffers are freed in stream order, after the kernel.
    _ = counters^
    _ = partials^


def launch_split_stream[
    dtype: DType,
    log_out: Bool,
    T: Int,
    K: Int,
    B: Int,
](
    ctx: DeviceContext,
    dst: Pointer[Scalar[dtype], MutAnyOrigin],
    src: Pointer[Scalar[dtype], MutAnyOrigin],
    rows: Int,
    n: Int,
    aligned: Bool,
) raises:
    """Launch gpu_split_stream_rows after zeroing its counters and pairs:
    blocks of T threads, B resident an SM, each with two buffers of K
    16-byte vectors a thread. Public so that
    benchmarks/split_stream_sweep.mojo can time other (T, K, B) than
    `split_stream_threads`/`_vectors`/`_blocks`."""
    comptime acc = accum_dtype[dtype]()
    comptime assert acc.is_floating_point()
    comptime V = vector_width[dtype]()
    var room = _split_stream_room[dtype, T, K, B](ctx, n)
    var chunks = room[0]
    _check_on_chip_split[dtype](ctx, "split_stream", n, chunks, room[1])
    var counters = _split_counters(ctx, rows, rows * chunks * pair_words[acc]())
    var base = counters.unsafe_ptr()
    var smem_bytes = split_stream_shared_bytes(T, K)
    comptime kernel = split_stream_rows_kernel[dtype, log_out, V, T, K, B]
    ctx.enqueue_function[kernel](
        dst,
        src,
        rebind[Pointer[Int32, MutAnyOrigin]](base),
        rebind[Pointer[UInt64, MutAnyOrigin]](
            base.unsafe_offset(_pairs_offset(rows)).unsafe_bitcast[UInt64]()
        ),
        Int64(rows),
        Int64(n),
        Int32(1) if aligned else Int32(0),
        # Every block resident at once: half the chunk slots.
        grid_dim=min(rows * chunks, room[1] // 2),
        block_dim=T,
        shared_mem_bytes=smem_bytes,
        func_attribute=FuncAttribute.MAX_DYNAMIC_SHARED_SIZE_BYTES(
            UInt32(smem_bytes)
        ),
    )
    # The buffer is freed in stream order, after the kernel.
    _ = counters^


# Backward rows too long for the register plans: a block per row.
comptime BACKWARD_BLOCK_THREADS = 512


def softmax_backward_rows[
    target: StaticString, dtype: DType, log_in: Bool
](
    ctx: DeviceContext,
    dx: Pointer[Scalar[dtype], MutAnyOrigin],
    a: Pointer[Scalar[dtype], MutAnyOrigin],
    dy: Pointer[Scalar[dtype], MutAnyOrigin],
    outer: Int,
    n: Int,
    inner: Int,
) raises:
    """Run softmax_backward (or log_softmax_backward) of the (outer, n,
    inner) view on `target`."""
    if outer * n * inner == 0:
        return
    comptime if target == "cpu":
        softmax_backward_cpu[dtype, log_in](dx, a, dy, outer, n, inner)
    elif target == "gpu":
        comptime V = vector_width[dtype]()
        if inner != 1:
            comptime kernel = backward_strided_kernel[dtype, log_in]
            ctx.enqueue_function[kernel](
                dx,
                a,
                dy,
                Int64(outer),
                Int64(n),
                Int64(inner),
                grid_dim=ceildiv(outer * inner, BACKWARD_STRIDED_THREADS),
                block_dim=BACKWARD_STRIDED_THREADS,
            )
            return
        var vector_flag = _vector_flag(
            _aligned16(Int(dx), Int(a), Int(dy)), n, V
        )
        var plan = register_plan(n, V, 0, BACKWARD_ROW_REGISTERS)
        if plan >= 0:
            comptime for i in range(NUM_PLANS):
                comptime T = plan_threads(i)
                comptime K = plan_chunks(i)
                comptime if chunk_registers(V) * K <= BACKWARD_ROW_REGISTERS:
                    if plan == i:
                        comptime kernel = backward_register_kernel[
                            dtype, log_in, T, V, K
                        ]
                        comptime block = block_threads[T]()
                        ctx.enqueue_function[kernel](
                            dx,
                            a,
                            dy,
                            Int64(outer),
                            Int64(n),
                            vector_flag,
                            grid_dim=ceildiv(outer, block // T),
                            block_dim=block,
                        )
        else:
            comptime kernel = backward_rows_kernel[
                dtype, log_in, BACKWARD_BLOCK_THREADS, V
            ]
            ctx.enqueue_function[kernel](
                dx,
                a,
                dy,
                Int64(n),
                vector_flag,
                grid_dim=outer,
                block_dim=BACKWARD_BLOCK_THREADS,
            )
    else:
        raise Error("max_softmax: unsupported target " + String(target))
