"""The one place that decides which kernel runs for which shape.

Every op sees its tensor as (outer, n, inner): softmax runs along n. On the
GPU, contiguous rows (inner == 1) are dispatched by row length n, in units
of V = elements per 16-byte vector (4 for float32, 8 for 16-bit types):

| rows of length n          | kernel (file)                            |
|---------------------------|------------------------------------------|
| n <= 32*V*4 (32*V*8 for aligned fp32 rows) | 8-32 lanes a row, in registers (gpu_register_rows) |
| n <= 512*64 values        | block rows, 64-512 threads a row, in registers |
| rows >= 264, n <= ~74K fp32 / ~149K 16-bit | block per row, on chip in registers + shared memory; fp32/fp64 rows that need a whole SM, to ~74K less a few hundred: a cluster of two 512-thread blocks, half each (gpu_smem_rows) |
| fewer rows, or longer, to 8 MB a row | rows split across resident blocks that stream chunks (56 KB fp32, 24 KB 16-bit) through two shared-memory buffers, read once (gpu_split_stream_rows) |
| rows over 8 MB            | rows split across blocks, one launch, re-read from L2 (gpu_split_rows) |
| inner > 1 (any n)         | a thread per column (gpu_strided_rows)   |

The backward ops (`backward_kernel_for`) take the same designs with both
tensors (y or log p, and dy) held, each read once:

| rows of length n          | backward kernel (file)                   |
|---------------------------|------------------------------------------|
| n <= 16K fp32/fp64, 32K 16-bit | register plans, 32 registers of each tensor held (16-bit held raw) (gpu_backward_rows) |
| rows >= 264, n <= ~37K fp32 / ~74K 16-bit | block per row, both tensors on chip (gpu_backward_smem_rows) |
| rows >= 264, n <= ~148K fp32 / ~74K fp64 | a cluster of four blocks a row, a quarter each on chip (gpu_backward_smem_rows) |
| rows >= 264, 16-bit n <= ~148K, the split stream's chunks under 15/16 full | a cluster of two blocks a row, half each on chip (gpu_backward_smem_rows) |
| fewer rows, or longer, to 8 MB a row | the split stream with both tensors' chunks (24 KB fp32, 12 KB 16-bit each) (gpu_backward_stream_rows) |
| rows over 8 MB            | block per row, reading the row twice (gpu_backward_rows) |

`softmax_rows` takes the launcher of contiguous rows as a compile-time
parameter: `launch_auto` (this table) for "auto", or a forced family
(variants.mojo, and the baselines' own ops in baselines/), so a model
compiles only the families it can run. Each family's launcher (grid,
workspace, capacity check) sits beside its kernel.
"""

from max.gpu.host import DeviceContext

from .cpu_backward import softmax_backward_cpu
from .cpu_rows import softmax_cpu
from .gpu_backward_rows import (
    backward_register_fits,
    launch_backward_block,
    launch_backward_register,
    launch_backward_strided,
)
from .gpu_backward_smem_rows import (
    SMEM_TENSORS,
    launch_backward_cluster,
    launch_backward_smem,
)
from .gpu_backward_stream_rows import (
    BACKWARD_TENSORS,
    backward_stream_chunk,
    launch_backward_stream,
)
from .gpu_launch import aligned16, vector_flag_of
from .gpu_register_rows import (
    WARP_THREADS,
    launch_register_rows,
    plan_threads,
    register_plan,
    wide_warp_rows,
)
from .gpu_smem_rows import (
    cluster_capacity,
    launch_smem_rows,
    smem_capacity,
)
from .gpu_split_rows import launch_split_rows
from .gpu_split_stream_rows import launch_split_stream, split_stream_fits
from .gpu_split_workspace import on_chip_split_capacity
from .gpu_strided_rows import launch_strided_rows
from .row_math import vector_width

comptime RowsLauncher[dtype: DType] = def(
    DeviceContext,
    Pointer[Scalar[dtype], MutAnyOrigin],
    Pointer[Scalar[dtype], MutAnyOrigin],
    Int,
    Int,
    Bool,
) raises thin -> None
"""Launches one family on (ctx, dst, src, rows, n, aligned): contiguous rows."""

# Fewer rows than this (two per H100 SM) cannot fill the GPU one block per
# row, so long rows are split across blocks instead.
comptime SPLIT_BELOW_ROWS = 264


def gpu_kernel_for(
    rows: Int, n: Int, V: Int, wide_warp: Bool = False
) -> String:
    """The kernel family "auto" picks for `rows` contiguous rows of `n`
    (`wide_warp`: rows that may take `WIDE_WARP_PLAN`, `wide_warp_rows`)."""
    var plan = register_plan(n, V, 0, wide_warp=wide_warp)
    if plan >= 0:
        return "warp" if plan_threads(plan) <= WARP_THREADS else "block"
    if rows >= SPLIT_BELOW_ROWS and n <= smem_capacity(V):
        return "smem"
    if n <= on_chip_split_capacity(16 // V):
        return "split_stream"
    return "split"


def backward_kernel_for(rows: Int, n: Int, V: Int, chunk: Int) -> String:
    """The backward kernel family for `rows` contiguous rows of `n`: the
    forward's rules with both tensors held.

    Rows past one SM go to a cluster kernel, a part of the row on chip in
    each block: float32 and float64 (V <= 4) to `cluster_capacity(V, 2,
    4)`, four blocks a row ("cluster4"); 16-bit rows to two blocks'
    capacity ("cluster2") where the split stream would fill its chunk slots
    (`chunk` elements of each tensor, `backward_stream_chunk`) under 15/16.
    On the H100 (benchmarks/backward_sweep.mojo) four blocks ran float32
    40000-131072 at 99-101% of copy against two blocks' 86-101% and the
    split stream's 89-98% (H200: 90-97%, 77-96%, 75-90%), but 16-bit 50257
    and 65536 at 79-89% (H200: 62-65%) where one block a row runs at 100%:
    16-bit rows keep the earlier rule. float64 follows float32 (not
    timed)."""
    if backward_register_fits(n, V):
        return "register"
    if rows < SPLIT_BELOW_ROWS:
        return (
            "split_stream" if n <= on_chip_split_capacity(16 // V) else "block"
        )
    if n <= smem_capacity(V, SMEM_TENSORS):
        return "smem"
    if V <= 4 and n <= cluster_capacity(V, SMEM_TENSORS, 4):
        return "cluster4"
    var slots = (n + chunk - 1) // chunk * chunk
    if n <= cluster_capacity(V, SMEM_TENSORS, 2) and 16 * n < 15 * slots:
        return "cluster2"
    if n <= on_chip_split_capacity(16 // V):
        return "split_stream"
    return "block"


def softmax_rows[
    target: StaticString,
    dtype: DType,
    log_out: Bool,
    launch_rows: RowsLauncher[dtype],
](
    ctx: DeviceContext,
    dst: Pointer[Scalar[dtype], MutAnyOrigin],
    src: Pointer[Scalar[dtype], MutAnyOrigin],
    outer: Int,
    n: Int,
    inner: Int,
) raises:
    """Run softmax (or log-softmax) of the (outer, n, inner) view on `target`:
    on the GPU along a non-last axis by columns, contiguous rows by
    `launch_rows` (`launch_auto`, or a forced family)."""
    if outer * n * inner == 0:
        return
    comptime if target == "cpu":
        softmax_cpu[dtype, log_out](dst, src, outer, n, inner)
    elif target == "gpu":
        if inner != 1:
            launch_strided_rows[dtype, log_out](ctx, dst, src, outer, n, inner)
        else:
            launch_rows(ctx, dst, src, outer, n, aligned16(Int(src), Int(dst)))
    else:
        raise Error("max_softmax: unsupported target " + String(target))


def launch_auto[
    dtype: DType, log_out: Bool
](
    ctx: DeviceContext,
    dst: Pointer[Scalar[dtype], MutAnyOrigin],
    src: Pointer[Scalar[dtype], MutAnyOrigin],
    rows: Int,
    n: Int,
    aligned: Bool,
) raises:
    """Launch the family `gpu_kernel_for` picks for `rows` rows of `n`."""
    comptime V = vector_width[dtype]()
    var family = gpu_kernel_for(
        rows, n, V, wide_warp_rows[dtype](vector_flag_of(aligned, n, V))
    )
    # A GPU too small to hold a row's chunks at once (a MIG slice) gets
    # the kernel that needs no co-residency.
    if family == "split_stream" and not split_stream_fits[dtype](ctx, n):
        family = "split"
    if family == "warp":
        launch_register_rows[dtype, log_out, False](
            ctx, dst, src, rows, n, aligned
        )
    elif family == "block":
        launch_register_rows[dtype, log_out, True](
            ctx, dst, src, rows, n, aligned
        )
    elif family == "smem":
        launch_smem_rows[dtype, log_out](ctx, dst, src, rows, n, aligned)
    elif family == "split_stream":
        launch_split_stream[dtype, log_out](ctx, dst, src, rows, n, aligned)
    else:
        launch_split_rows[dtype, log_out](ctx, dst, src, rows, n, aligned)


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
        if inner != 1:
            launch_backward_strided[dtype, log_in](
                ctx, dx, a, dy, outer, n, inner
            )
        else:
            launch_backward_auto[dtype, log_in](
                ctx, dx, a, dy, outer, n, aligned16(Int(dx), Int(a), Int(dy))
            )
    else:
        raise Error("max_softmax: unsupported target " + String(target))


def launch_backward_auto[
    dtype: DType, log_in: Bool
](
    ctx: DeviceContext,
    dx: Pointer[Scalar[dtype], MutAnyOrigin],
    a: Pointer[Scalar[dtype], MutAnyOrigin],
    dy: Pointer[Scalar[dtype], MutAnyOrigin],
    rows: Int,
    n: Int,
    aligned: Bool,
) raises:
    """Launch the family `backward_kernel_for` picks for `rows` rows of `n`."""
    var family = backward_kernel_for(
        rows, n, vector_width[dtype](), backward_stream_chunk[dtype]()
    )
    # As in the forward: a GPU too small for a row's chunks (a MIG slice).
    if family == "split_stream" and not split_stream_fits[
        dtype, BACKWARD_TENSORS
    ](ctx, n):
        family = "block"
    if family == "register":
        launch_backward_register[dtype, log_in](
            ctx, dx, a, dy, rows, n, aligned
        )
    elif family == "smem":
        launch_backward_smem[dtype, log_in](ctx, dx, a, dy, rows, n, aligned)
    elif family == "cluster4":
        launch_backward_cluster[dtype, log_in, 4](
            ctx, dx, a, dy, rows, n, aligned
        )
    elif family == "cluster2":
        launch_backward_cluster[dtype, log_in, 2](
            ctx, dx, a, dy, rows, n, aligned
        )
    elif family == "split_stream":
        launch_backward_stream[dtype, log_in](ctx, dx, a, dy, rows, n, aligned)
    else:
        launch_backward_block[dtype, log_in](ctx, dx, a, dy, rows, n, aligned)
