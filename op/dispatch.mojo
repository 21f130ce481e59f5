"""The one place that decides which kernel runs for which shape.

Every op sees its tensor as (outer, n, inner): softmax runs along n. On the
GPU, contiguous rows (inner == 1) are dispatched by row length n, in units
of V = elements per 16-byte vector (4 for float32, 8 for 16-bit types):

| rows of length n          | kernel (file)                            |
|---------------------------|------------------------------------------|
| n <= 32*V*K, K=1,2,4,8    | warp rows, in registers (gpu_register_rows) |
| n <= 512*V*K, V*K <= 64   | block rows, in registers (gpu_register_rows) |
| longer, rows < 264        | split rows across blocks (gpu_split_rows) |
| longer, more rows         | online block per row (gpu_online_rows)   |
| inner > 1 (any n)         | a thread per column (gpu_strided_rows)   |

`variant` forces one family ("tree", "warp", "block", "online", "split")
so benchmarks and tests can run each; "auto" follows the table.
"""

from max.gpu.host import DeviceContext
from std.math import ceildiv

from .cpu_rows import softmax_cpu
from .gpu_online_rows import ONLINE_THREADS, online_rows_kernel
from .gpu_register_rows import (
    MAX_VALUES_PER_THREAD,
    ROW_BLOCK_THREADS,
    WARPS_PER_BLOCK,
    register_rows_kernel,
)
from .gpu_split_rows import (
    SPLIT_THREADS,
    grid_chunks,
    split_normalize_kernel,
    split_partials_kernel,
)
from .gpu_strided_rows import STRIDED_THREADS, strided_rows_kernel
from .gpu_tree_rows import TREE_THREADS, tree_rows_kernel
from .row_math import accum_dtype, vector_width

comptime WARP_THREADS = 32
comptime WARP_MAX_K = 8
# Fewer rows than this (two per H100 SM) cannot fill the GPU one block per
# row, so long rows are split across blocks instead.
comptime SPLIT_BELOW_ROWS = 264


def gpu_kernel_for(rows: Int, n: Int, V: Int) -> String:
    """The kernel family "auto" picks for `rows` contiguous rows of `n`."""
    if chunks_per_thread(n, WARP_THREADS, V, WARP_MAX_K) > 0:
        return "warp"
    if chunks_per_thread(n, ROW_BLOCK_THREADS, V, block_max_k(V)) > 0:
        return "block"
    if rows < SPLIT_BELOW_ROWS:
        return "split"
    return "online"


def block_max_k(V: Int) -> Int:
    """Largest K the block-rows kernel is instantiated with for vector width V.
    """
    return min(16, MAX_VALUES_PER_THREAD // V)


def chunks_per_thread(n: Int, threads: Int, V: Int, max_k: Int) -> Int:
    """Smallest power of two K <= max_k with n <= threads * V * K, else 0."""
    var k = 1
    while k <= max_k:
        if n <= threads * V * k:
            return k
        k *= 2
    return 0


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
    # Bool is not DevicePassable: the flag travels as an Int32.
    var vector_flag = Int32(1) if n % V == 0 else Int32(0)
    var family = String(variant)
    if family == "auto":
        family = gpu_kernel_for(rows, n, V)

    if family == "tree":
        comptime kernel = tree_rows_kernel[dtype, log_out]
        ctx.enqueue_function[kernel](
            dst, src, Int64(n), grid_dim=rows, block_dim=TREE_THREADS
        )
    elif family == "warp":
        var k = chunks_per_thread(n, WARP_THREADS, V, WARP_MAX_K)
        if k == 0:
            raise Error(
                "max_softmax: variant 'warp' handles rows up to "
                + String(WARP_THREADS * V * WARP_MAX_K)
                + " elements, got "
                + String(n)
            )
        comptime for K in [1, 2, 4, 8]:
            if k == K:
                comptime kernel = register_rows_kernel[
                    dtype, log_out, WARP_THREADS, V, K
                ]
                ctx.enqueue_function[kernel](
                    dst,
                    src,
                    Int64(rows),
                    Int64(n),
                    vector_flag,
                    grid_dim=ceildiv(rows, WARPS_PER_BLOCK),
                    block_dim=WARP_THREADS * WARPS_PER_BLOCK,
                )
    elif family == "block":
        # K >= 2: a row that fits K=1 would have gone to warp rows.
        var k = max(
            2, chunks_per_thread(n, ROW_BLOCK_THREADS, V, block_max_k(V))
        )
        if chunks_per_thread(n, ROW_BLOCK_THREADS, V, block_max_k(V)) == 0:
            raise Error(
                "max_softmax: variant 'block' handles rows up to "
                + String(ROW_BLOCK_THREADS * V * block_max_k(V))
                + " elements, got "
                + String(n)
            )
        comptime for K in [2, 4, 8, 16]:
            comptime if V * K <= MAX_VALUES_PER_THREAD:
                if k == K:
                    comptime kernel = register_rows_kernel[
                        dtype, log_out, ROW_BLOCK_THREADS, V, K
                    ]
                    ctx.enqueue_function[kernel](
                        dst,
                        src,
                        Int64(rows),
                        Int64(n),
                        vector_flag,
                        grid_dim=rows,
                        block_dim=ROW_BLOCK_THREADS,
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
    elif family == "split":
        comptime acc = accum_dtype[dtype]()
        comptime assert acc.is_floating_point()
        var chunks = Int(grid_chunks(Int64(n)))
        var partials = ctx.enqueue_create_buffer[acc](rows * chunks * 2)
        var partials_ptr = rebind[Pointer[Scalar[acc], MutAnyOrigin]](
            partials.unsafe_ptr()
        )
        comptime first = split_partials_kernel[dtype, V]
        ctx.enqueue_function[first](
            partials_ptr,
            src,
            Int64(n),
            vector_flag,
            grid_dim=(chunks, rows),
            block_dim=SPLIT_THREADS,
        )
        comptime second = split_normalize_kernel[dtype, log_out, V]
        ctx.enqueue_function[second](
            dst,
            src,
            partials_ptr,
            Int64(n),
            vector_flag,
            grid_dim=(chunks, rows),
            block_dim=SPLIT_THREADS,
        )
        _ = partials^
    else:
        raise Error("max_softmax: unknown variant '" + family + "'")
