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

Each table gives a `Strategy` (variants.mojo); `ForwardRows` and
`BackwardRows` hold an op's buffers and launch each strategy it has, and
`launch_strategy` (variants.mojo) is the one switch for "auto" and a forced
`variant=`. `softmax_rows` takes the launcher of contiguous rows as a
compile-time parameter (`launch_variant`), so a model compiles only what
it can run. Each
family's launcher (grid, workspace, capacity check) sits beside its kernel.
"""

from max.gpu.host import DeviceContext

from .cpu_backward import softmax_backward_cpu
from .cpu_rows import softmax_cpu
from .gpu_backward_rows import (
    backward_plan_registers,
    backward_register_kernel_for,
    launch_backward_block,
    launch_backward_strided,
)
from .gpu_backward_smem_rows import SMEM_TENSORS, launch_backward_parts
from .gpu_backward_stream_rows import (
    BACKWARD_TENSORS,
    backward_stream_chunk,
    launch_backward_stream,
)
from .gpu_launch import aligned16, vector_flag_of
from .gpu_register_rows import (
    MAX_PLAN_THREADS,
    MAX_ROW_REGISTERS,
    WARP_THREADS,
    RegisterPlanKernel,
    launch_register_plan,
    launch_register_rows,
    plan_threads,
    register_capacity,
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
from .gpu_strided_rows import StridedLauncher, launch_strided_rows
from .row_math import vector_width
from .row_tensors import LaunchRows, RowTensors
from .variants import (
    RowStrategies,
    Strategy,
    launch_strategy,
    no_strategy,
    strategy_named,
)

comptime RowsLauncher[dtype: DType] = def(
    DeviceContext, LaunchRows[dtype]
) raises thin -> None
"""Launches one family on contiguous rows (their `src` is `a`, and `b`)."""

comptime ViewRows[dtype: DType] = def(
    RowTensors[dtype], Int, Int, Int
) raises thin -> None
"""Runs an op on the CPU over the (outer, n, inner) view of its tensors."""

# Fewer rows than this (two per H100 SM) cannot fill the GPU one block per
# row, so long rows are split across blocks instead.
comptime SPLIT_BELOW_ROWS = 264


def gpu_kernel_for(
    rows: Int, n: Int, V: Int, wide_warp: Bool = False
) -> Strategy:
    """The strategy "auto" picks for `rows` contiguous rows of `n`
    (`wide_warp`: rows that may take `WIDE_WARP_PLAN`, `wide_warp_rows`)."""
    var plan = register_plan(n, V, 0, wide_warp=wide_warp)
    if plan >= 0:
        return (
            Strategy.WARP if plan_threads(plan)
            <= WARP_THREADS else Strategy.BLOCK_ROWS
        )
    if rows >= SPLIT_BELOW_ROWS and n <= smem_capacity(V):
        return Strategy.SMEM
    if n <= on_chip_split_capacity(16 // V):
        return Strategy.SPLIT_STREAM
    return Strategy.SPLIT


def backward_kernel_for(rows: Int, n: Int, V: Int, chunk: Int) -> Strategy:
    """The backward strategy for `rows` contiguous rows of `n`: the
    forward's rules with both tensors held.

    Rows past one SM go to a cluster kernel, a part of the row on chip in
    each block: float32 and float64 (V <= 4) to `cluster_capacity(V, 2,
    4)`, four blocks a row (`CLUSTER4`); 16-bit rows to two blocks'
    capacity (`CLUSTER2`) where the split stream would fill its chunk
    slots (`chunk` elements of each tensor, `backward_stream_chunk`) under
    15/16. Four blocks ran float32 rows past one SM near copy speed, ahead
    of two blocks and the split stream; 16-bit rows that one block holds
    ran slower on four than on one, so 16-bit rows go to two blocks only
    where the stream would waste its slots (benchmarks/RESULTS.md,
    "Backward"). float64 follows float32."""
    if backward_register_fits(n, V):
        return Strategy.REGISTER
    if rows < SPLIT_BELOW_ROWS:
        return (
            Strategy.SPLIT_STREAM if n
            <= on_chip_split_capacity(16 // V) else Strategy.BLOCK
        )
    if n <= smem_capacity(V, SMEM_TENSORS):
        return Strategy.SMEM
    if V <= 4 and n <= cluster_capacity(V, SMEM_TENSORS, 4):
        return Strategy.CLUSTER4
    var slots = (n + chunk - 1) // chunk * chunk
    if n <= cluster_capacity(V, SMEM_TENSORS, 2) and 16 * n < 15 * slots:
        return Strategy.CLUSTER2
    if n <= on_chip_split_capacity(16 // V):
        return Strategy.SPLIT_STREAM
    return Strategy.BLOCK


def backward_register_fits(n: Int, V: Int) -> Bool:
    """Whether a register plan holds rows of `n` of both tensors at
    `BACKWARD_ROW_REGISTERS` registers each, as held."""
    return register_plan(n, V, 0, backward_plan_registers(V)) >= 0


def launch_register_strategy[
    V: Int, max_registers: Int, L: RegisterPlanKernel
](ctx: DeviceContext, kernel: L, rows: Int, n: Int, op_name: String) raises:
    """An op's "register" strategy: enqueue `kernel` on `rows` rows of `n`
    under the first register plan that holds them at `max_registers`
    32-bit registers of row values a thread (`register_plan`,
    `launch_register_plan`). Raises, naming `op_name`, where none does."""
    var plan = register_plan(n, V, 1, max_registers)
    if plan < 0:
        var limit = String("cannot hold rows of ")
        comptime if max_registers == MAX_ROW_REGISTERS:
            limit = (
                "handles rows up to "
                + String(register_capacity(V, 1, MAX_PLAN_THREADS))
                + " elements, got "
            )
        raise Error(
            "max_softmax: the "
            + op_name
            + " 'register' kernel "
            + limit
            + String(n)
        )
    launch_register_plan[V, max_registers, 1, MAX_PLAN_THREADS](
        ctx, kernel, plan, rows
    )


@fieldwise_init
struct ForwardRows[dtype: DType, log_out: Bool](RowStrategies):
    """Softmax (or log-softmax) of `rows` contiguous rows of `n`, from
    `src` into `dst`: its strategies "warp" and "block" (register plans),
    "smem", "split_stream", "split"."""

    @staticmethod
    def op_name() -> String:
        """The op's name in error messages."""
        return "log_softmax" if Self.log_out else "softmax"

    var r: LaunchRows[Self.dtype]
    """The rows: `src` (`a`, also `b`) into `dst`."""

    @staticmethod
    def has(s: Strategy) -> Bool:
        """Strategies "smem", "split_stream", "split" (and the register plans,
        named "warp" and "block")."""
        return (
            s == Strategy.SMEM
            or s == Strategy.SPLIT_STREAM
            or s == Strategy.SPLIT
        )

    @staticmethod
    def named(name: StaticString) -> Strategy:
        """The forward's variant names: "warp" and "block" are its register
        plans (`Strategy.WARP`, `Strategy.BLOCK_ROWS`)."""
        if name == "warp":
            return Strategy.WARP
        if name == "block":
            return Strategy.BLOCK_ROWS
        var s = strategy_named(name)
        return s if Self.has(s) else Strategy.NONE

    def auto(self, ctx: DeviceContext) raises -> Strategy:
        """`gpu_kernel_for`; a GPU too small to hold a row's chunks at once
        (a MIG slice) gets the kernel that needs no co-residency."""
        comptime V = vector_width[Self.dtype]()
        var r = self.r
        var s = gpu_kernel_for(
            r.rows,
            r.n,
            V,
            wide_warp_rows[Self.dtype](vector_flag_of(r.aligned, r.n, V)),
        )
        if s == Strategy.SPLIT_STREAM and not split_stream_fits[Self.dtype](
            ctx, r.n
        ):
            return Strategy.SPLIT
        return s

    def launch[s: Strategy](self, ctx: DeviceContext) raises:
        """Enqueue the rows under `s`."""
        var r = self.r
        comptime if s == Strategy.WARP or s == Strategy.BLOCK_ROWS:
            launch_register_rows[
                Self.dtype, Self.log_out, s == Strategy.BLOCK_ROWS
            ](ctx, r)
        elif s == Strategy.SMEM:
            launch_smem_rows[Self.dtype, Self.log_out](ctx, r)
        elif s == Strategy.SPLIT_STREAM:
            launch_split_stream[Self.dtype, Self.log_out](ctx, r)
        elif s == Strategy.SPLIT:
            launch_split_rows[Self.dtype, Self.log_out](ctx, r)
        else:
            no_strategy(Self.op_name())


def launch_variant[
    dtype: DType, log_out: Bool, variant: StaticString
](ctx: DeviceContext, r: LaunchRows[dtype]) raises:
    """Launch the forward on `r`'s rows under the strategy `variant` names
    ("auto": the table; "warp", "block", "smem", "split", "split_stream").
    Raises for another name and where the strategy cannot take rows of
    `n`."""
    launch_strategy[ForwardRows[dtype, log_out], variant](
        ForwardRows[dtype, log_out](r), ctx
    )


comptime launch_auto[dtype: DType, log_out: Bool] = launch_variant[
    dtype, log_out, "auto"
]
"""`launch_variant` with "auto": the strategy `gpu_kernel_for` picks."""


def run_view[
    target: StaticString,
    dtype: DType,
    cpu_rows: ViewRows[dtype],
    strided: StridedLauncher[dtype],
    launch_rows: RowsLauncher[dtype],
](
    ctx: DeviceContext, t: RowTensors[dtype], outer: Int, n: Int, inner: Int
) raises:
    """Run an op on the (outer, n, inner) view of its tensors `t` on
    `target`: the one route the forward and the backward share. Nothing
    runs for an empty view; on the CPU `cpu_rows`; on the GPU, rows along
    a non-last axis by columns (`strided`, `Strategy.STRIDED`), contiguous
    rows by `launch_rows`."""
    if outer * n * inner == 0:
        return
    comptime if target == "cpu":
        cpu_rows(t, outer, n, inner)
    elif target == "gpu":
        if inner != 1:
            strided(ctx, t, outer, n, inner)
        else:
            var aligned = aligned16(Int(t.dst), Int(t.a), Int(t.b))
            launch_rows(ctx, LaunchRows(t, outer, n, aligned))
    else:
        raise Error("max_softmax: unsupported target " + String(target))


comptime softmax_rows[
    target: StaticString,
    dtype: DType,
    log_out: Bool,
    launch_rows: RowsLauncher[dtype],
] = run_view[
    target,
    dtype,
    softmax_cpu[dtype, log_out],
    launch_strided_rows[dtype, log_out],
    launch_rows,
]
"""Softmax (or log-softmax) of the (outer, n, inner) view of `src` (`a`,
also `b`) into `dst` on `target` (`run_view`): contiguous GPU rows by
`launch_rows` (`launch_variant`)."""


@fieldwise_init
struct BackwardRows[dtype: DType, log_in: Bool](
    RegisterPlanKernel, RowStrategies
):
    """The gradient of `rows` contiguous rows of `n` into `dx`: its
    strategies "register", "smem", "cluster2", "cluster4", "split_stream",
    "block"; for "register" also the plan kernel with its arguments
    (`launch_register_plan`)."""

    @staticmethod
    def op_name() -> String:
        """The op's name in error messages."""
        return "log_softmax_backward" if Self.log_in else "softmax_backward"

    var r: LaunchRows[Self.dtype]
    """The rows: dx (`dst`) from y or log p (`a`) and dy (`b`)."""

    @staticmethod
    def has(s: Strategy) -> Bool:
        """Every strategy but the forward's register forms and "split"."""
        return s.kind == Strategy.SMEM.kind or (
            s == Strategy.REGISTER
            or s == Strategy.SPLIT_STREAM
            or s == Strategy.BLOCK
        )

    def auto(self, ctx: DeviceContext) raises -> Strategy:
        """`backward_kernel_for`; as the forward, a GPU too small for a
        row's chunks (a MIG slice) gets the block-per-row kernel."""
        var s = backward_kernel_for(
            self.r.rows,
            self.r.n,
            vector_width[Self.dtype](),
            backward_stream_chunk[Self.dtype](),
        )
        if s == Strategy.SPLIT_STREAM and not split_stream_fits[
            Self.dtype, BACKWARD_TENSORS
        ](ctx, self.r.n):
            return Strategy.BLOCK
        return s

    def launch[s: Strategy](self, ctx: DeviceContext) raises:
        """Enqueue the rows under `s`."""
        comptime if s == Strategy.REGISTER:
            comptime V = vector_width[Self.dtype]()
            launch_register_strategy[V, backward_plan_registers(V)](
                ctx, self, self.r.rows, self.r.n, Self.op_name()
            )
        elif s.kind == Strategy.SMEM.kind:
            # `form`: the blocks a row (SMEM, CLUSTER2, CLUSTER4).
            launch_backward_parts[Self.dtype, Self.log_in, s.form](ctx, self.r)
        elif s == Strategy.SPLIT_STREAM:
            launch_backward_stream[Self.dtype, Self.log_in](ctx, self.r)
        elif s == Strategy.BLOCK:
            launch_backward_block[Self.dtype, Self.log_in](ctx, self.r)
        else:
            no_strategy(Self.op_name())

    def enqueue[
        T: Int, K: Int
    ](self, ctx: DeviceContext, grid: Int, block: Int) raises:
        """Enqueue the register kernel for T threads a row, K chunks of each
        tensor a thread (`backward_register_kernel_for`)."""
        comptime kernel = backward_register_kernel_for[
            Self.dtype, Self.log_in, T, K
        ]
        var r = self.r
        ctx.enqueue_function[kernel](
            r.dst(),
            r.a(),
            r.b(),
            Int64(r.rows),
            Int64(r.n),
            vector_flag_of(r.aligned, r.n, vector_width[Self.dtype]()),
            grid_dim=grid,
            block_dim=block,
        )


def launch_backward_rows[
    dtype: DType, log_in: Bool, variant: StaticString
](ctx: DeviceContext, r: LaunchRows[dtype]) raises:
    """Launch the backward on `r`'s rows under the strategy `variant` names
    ("auto": `backward_kernel_for`)."""
    launch_strategy[BackwardRows[dtype, log_in], variant](
        BackwardRows[dtype, log_in](r), ctx
    )


comptime softmax_backward_rows[
    target: StaticString,
    dtype: DType,
    log_in: Bool,
    variant: StaticString = "auto",
] = run_view[
    target,
    dtype,
    softmax_backward_cpu[dtype, log_in],
    launch_backward_strided[dtype, log_in],
    launch_backward_rows[dtype, log_in, variant],
]
"""softmax_backward (or log_softmax_backward) of the (outer, n, inner) view
on `target`, dx (`dst`) from y or log p (`a`) and dy (`b`) (`run_view`):
contiguous GPU rows under `variant` (`launch_backward_rows`)."""
