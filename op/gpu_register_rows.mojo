"""Short and medium rows held in registers: global memory is read once.

`threads` threads own one row; each holds `K` chunks of `V` elements in
registers, so a row of up to `threads * V * K` elements is loaded once,
reduced (max, then sum of exp) with warp shuffles, and written once.

- warp rows (`threads` = 8, 16 or 32): 16, 8 or 4 rows per block, a
  group of lanes per row reducing with shuffles, no shared memory and no
  barriers;
- block rows (`threads` = 64..512): warp shuffles, then a shared-memory
  combine across the row's warps; blocks of 128 threads hold several rows.

Rows whose length is a multiple of `V` (and whose base is 16-byte aligned)
use 16-byte vector loads: thread t's chunk k is elements
[(k*threads + t)*V, +V). Other rows use the same registers with scalar,
still coalesced, loads: element (k*V + v)*threads + t.

The register plans (threads a row, chunks a thread) are listed here;
`register_plan` picks one for a row length, and `launch_register_plan`
enqueues the compiled instance of a plan for this forward kernel
(`launch_register_rows`) and for the backward one (gpu_backward_rows)
alike.

Programmatic Dependent Launch (PDL, sm_90+), behind `PDL`: each launch of
this kernel in a stream (or a replayed CUDA graph) pays ~1.5-2 us of gap
between kernels, a quarter to a half of a small softmax's run time. Launched
with the "programmatic stream serialization" attribute, the kernel may be
scheduled while its predecessor still runs; it waits (`griddepcontrol.wait`)
before touching global memory, then at once lets its own successor be
scheduled (`griddepcontrol.launch_dependents`), which in turn waits in its
own `wait` for this grid to finish. Both are decided by the target the op
is compiled for: below sm_90 (and on AMD) the instructions compile to
nothing and the attribute list is empty, so a build without an sm_90
target runs without PDL.
"""

from max.gpu import (
    MAX_THREADS_PER_BLOCK_METADATA,
    WARP_SIZE,
    block_idx,
    thread_idx,
)
from max.gpu.host import DeviceContext
from max.gpu.primitives.grid_controls import (
    PDLLevel,
    launch_dependent_grids,
    pdl_launch_attributes,
    wait_on_dependent_grids,
)
from std.math import ceildiv
from std.sys import size_of
from std.utils import StaticTuple
from std.utils.numerics import inf

from .gpu_launch import HeldRows, held, kernel_arg, vector_flag_of
from .gpu_reductions import block_max, block_sum
from .row_math import accum_dtype, epilogue, exp_nan, row_scale, vector_width
from .row_op import RegisterRowOp
from .row_tensors import LaunchRows

comptime WARP_THREADS = 32
# Most threads a row: the last plans' 512.
comptime MAX_PLAN_THREADS = 512
comptime MIN_BLOCK_THREADS = 128
# 32-bit registers of row values one thread may hold. With launch bounds of
# 512 threads the compiler may use 128 registers a thread; 64 for the row
# leaves room for addressing. (Without bounds, 64 values asked for more than
# a block has: CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES on the H100; counting
# float64 values as one register each spilled 8 KB a thread.)
comptime MAX_ROW_REGISTERS = 64
# Whether `launch_register_rows` launches with Programmatic Dependent Launch
# (see the module docstring) unless told: scheduling the next kernel while
# this one runs hides most of a short launch's start-up, with the same bits
# (figures: benchmarks/RESULTS.md).
comptime PDL = True
# The launch attribute level of `PDL`, for kernels that follow it.
comptime PDL_LEVEL = PDLLevel.ON if PDL else PDLLevel.OFF


def chunk_registers(V: Int) -> Int:
    """32-bit registers one 16-byte chunk takes in the accumulator type: 4
    for float32 and for float64 (2 doubles), 8 for 16-bit types widened to
    float32.

    The backward kernel holds its rows widened. The forward kernel holds
    them raw (4 registers a chunk) but its plans are chosen by this
    widened count too: the plan table was timed with it
    (benchmarks/RESULTS.md).
    """
    return max(V, 4)


# (threads per row, chunks per thread) in the order `register_plan` tries them:
# short rows get 8 or 16 threads (several rows a warp, shuffles within each
# group) holding up to 4 chunks each, then a warp, then more threads with 4
# chunks (16 fp32 values) each, so short rows keep many rows and bytes in
# flight and long rows reach 512 x 64 values.
comptime NUM_PLANS = 11
# One more plan, after the table: a warp a row holding 8 chunks (1024
# fp32), for the forward's aligned 4-byte rows only (`register_plan`'s
# `wide_warp`). In its aligned-only instance it takes 55-58 registers and
# holds 32 rows of 1024 an SM, more rows in flight than plan (64, 4), which
# it outran (benchmarks/RESULTS.md). Compiled for any rows it held both load
# paths' values (120-128 registers), so unaligned rows keep (64, 4).
comptime WIDE_WARP_PLAN = NUM_PLANS


def plan_threads(i: Int) -> Int:
    """Threads per row of register plan i: 8, 8, 8, 16, 32, ..., 512, 512, 512;
    32 for `WIDE_WARP_PLAN`."""
    if i < 3:
        return 8
    if i < 9:
        return 16 << (i - 3)
    if i == WIDE_WARP_PLAN:
        return WARP_THREADS
    return 512


def plan_chunks(i: Int) -> Int:
    """Chunks (16-byte vectors) per thread of register plan i: 1, 2, 4, 4,
    ..., 4, 8, 16; 8 for `WIDE_WARP_PLAN`."""
    if i < 3:
        return 1 << i
    if i < 9:
        return 4
    if i == WIDE_WARP_PLAN:
        return 8
    return 4 << (i - 8)


def register_plan(
    n: Int,
    V: Int,
    min_threads: Int,
    max_registers: Int = MAX_ROW_REGISTERS,
    wide_warp: Bool = False,
) -> Int:
    """First register plan that holds a row of `n` with at least
    `min_threads` threads per row and at most `max_registers` 32-bit
    registers of row values a thread, else -1. With `wide_warp` (the
    forward's aligned 4-byte rows, `wide_warp_rows`), `WIDE_WARP_PLAN`
    comes right after the warp plans."""
    for i in range(NUM_PLANS):
        var threads = plan_threads(i)
        var k = plan_chunks(i)
        if threads < min_threads or chunk_registers(V) * k > max_registers:
            continue
        if (
            wide_warp
            and threads > WARP_THREADS
            and min_threads <= WARP_THREADS
            and chunk_registers(V) * plan_chunks(WIDE_WARP_PLAN)
            <= max_registers
            and n <= wide_warp_capacity(V)
        ):
            return WIDE_WARP_PLAN
        if n <= threads * V * k:
            return i
    return -1


def wide_warp_capacity(V: Int) -> Int:
    """Longest row `WIDE_WARP_PLAN` holds: 1024 fp32."""
    return plan_threads(WIDE_WARP_PLAN) * V * plan_chunks(WIDE_WARP_PLAN)


def wide_warp_dtype[dtype: DType]() -> Bool:
    """Whether the forward compiles `WIDE_WARP_PLAN` for `dtype`: 4-byte
    elements (measured for fp32), which have an aligned-only instance."""
    return size_of[dtype]() == 4 and split_aligned[dtype]()


def wide_warp_rows[dtype: DType](vector_flag: Int32) -> Bool:
    """Whether the forward may run `WIDE_WARP_PLAN` on these rows: a
    `wide_warp_dtype`, rows aligned (`vector_flag`), so its aligned-only
    instance."""
    return wide_warp_dtype[dtype]() and vector_flag != 0


def register_capacity(
    V: Int, min_threads: Int, max_threads: Int, wide_warp: Bool = False
) -> Int:
    """Longest row a register plan with threads in the range can hold (with
    `wide_warp`, `WIDE_WARP_PLAN` too)."""
    var best = 0
    if wide_warp and min_threads <= WARP_THREADS <= max_threads:
        best = wide_warp_capacity(V)
    for i in range(NUM_PLANS):
        var threads = plan_threads(i)
        var k = plan_chunks(i)
        if (
            min_threads <= threads <= max_threads
            and chunk_registers(V) * k <= MAX_ROW_REGISTERS
        ):
            best = max(best, threads * V * k)
    return best


def split_aligned[dtype: DType]() -> Bool:
    """Whether the forward compiles a second, aligned-only instance of each
    plan for `dtype` (`register_rows_kernel`'s `aligned`), launched where
    the rows are aligned.

    The scalar path beside each vector load made the compiler hold both:
    fp32 plans took 60-72 registers with it, 32-40 without (ptxas, sm_90a),
    and the freed registers keep more rows in flight. 16-bit plans are
    already held to 64 registers by `min_blocks_per_sm` and gained nothing,
    so 16-bit types keep one instance (figures: benchmarks/RESULTS.md).
    """
    return size_of[dtype]() >= 4


def block_threads[threads: Int]() -> Int:
    """Threads per block for `threads` threads per row."""
    return max(threads, MIN_BLOCK_THREADS)


def min_blocks_per_sm[dtype: DType, threads: Int, K: Int]() -> Int:
    """Blocks of the register kernel an SM must be able to hold.

    16-bit rows move half the bytes per element, so an SM needs twice the
    elements in flight to keep HBM busy. Plans of at most 4 chunks a thread
    (16 registers of raw row values) ask for 1024 resident threads, which
    caps them at 64 registers; at 8 chunks that cap spills. Otherwise (1)
    the compiler chooses, and it took 80-128 registers.
    """
    if size_of[dtype]() == 2 and 4 * K <= 16:
        return max(1, 1024 // block_threads[threads]())
    return 1


@__llvm_metadata(
    MAX_THREADS_PER_BLOCK_METADATA=StaticTuple[Int32, 1](
        Int32(block_threads[threads]())
    ),
    `nvvm.minctasm`=SIMDLength(min_blocks_per_sm[dtype, threads, K]()),
)
def register_rows_kernel[
    dtype: DType,
    log_out: Bool,
    threads: Int,
    V: Int,
    K: Int,
    pdl: Bool,
    aligned: Bool,
](
    dst: Pointer[Scalar[dtype], MutAnyOrigin],
    src: Pointer[Scalar[dtype], MutAnyOrigin],
    rows: Int64,
    n: Int64,
    vector_flag: Int32,
):
    """Softmax of rows of length `n <= threads * V * K`.

    Parameters:
        dtype: Element type.
        log_out: Write log-softmax instead of softmax.
        threads: Threads per row, 8, 16 or a multiple of 32; a block holds
            `block_threads[threads]() / threads` rows.
        V: Elements per chunk (a 16-byte vector of `dtype`).
        K: Chunks per thread.
        pdl: Launched with Programmatic Dependent Launch: wait for the
            previous grid, then let the next one be scheduled.
        aligned: Compiled for aligned rows only (`vector_flag` must be
            nonzero): without the scalar path beside each vector load the
            compiler keeps about half the registers (`split_aligned`).

    Args:
        dst: Output rows.
        src: Input rows.
        rows: Number of rows.
        n: Row length.
        vector_flag: Nonzero when row starts are 16-byte aligned (n % V == 0).
    """
    comptime assert chunk_registers(V) * K <= MAX_ROW_REGISTERS
    comptime assert threads % WARP_SIZE == 0 or WARP_SIZE % threads == 0
    var op = SoftmaxRegisterRow[dtype, log_out, threads, V, K](dst, src, n)
    register_rows[pdl=pdl, aligned=aligned](op, rows, n, vector_flag)


@always_inline
def register_rows[
    Op: RegisterRowOp, pdl: Bool, aligned: Bool
](mut op: Op, rows: Int64, n: Int64, vector_flag: Int32):
    """The register strategy, for any `RegisterRowOp`: rows of `n`, a group
    of `Op.threads` threads a row (`block_threads` a block, so several rows
    a block for short rows), each thread holding its chunks of the row in
    registers (`load_row_chunks`), read once and written once.

    Parameters:
        Op: The op: what it reads, folds and writes.
        pdl: Launched with Programmatic Dependent Launch (`pdl_start`).
        aligned: Compiled for aligned rows only (`vector_path`).

    Args:
        op: The op on its tensors.
        rows: Number of rows.
        n: Row length.
        vector_flag: Nonzero when row starts are 16-byte aligned (n % V == 0).
    """
    comptime threads = Op.threads
    comptime block = block_threads[threads]()
    pdl_start[pdl]()
    var vector_loads = vector_path[aligned](vector_flag)
    var t = Int(thread_idx.x) % threads
    var row = (
        Int(block_idx.x) * (block // threads) + Int(thread_idx.x) // threads
    )
    # Past the last row: a warp-sized group can leave; a larger group stays
    # for the block's barriers, a smaller one for its warp's shuffles, with
    # len = 0, so it loads and stores nothing.
    var len = Int(n)
    var live = row < Int(rows)
    if not live:
        comptime if threads == WARP_SIZE:
            return
        len = 0
        row = 0
    op.begin(row, len)
    op.fold(t, vector_loads)
    op.finish(live, row, t)
    op.write(t, vector_loads)


@always_inline
def held_max_sum[
    dtype: DType, threads: Int, V: Int, K: Int
](raw: SIMD[dtype, V * K]) -> Tuple[
    Scalar[accum_dtype[dtype]()], Scalar[accum_dtype[dtype]()]
]:
    """The row's (max, sum of exp(x - max)) from the chunks its threads
    hold in their own dtype, each widened in turn, reduced over the row's
    threads. Padding is -inf, so it adds exp(-inf) = 0 unless the whole row
    is -inf (max -inf), and that row is NaN anyway."""
    comptime acc = accum_dtype[dtype]()
    comptime block = block_threads[threads]()
    var m = -inf[acc]()
    comptime for k in range(K):
        m = max(m, raw.slice[V, offset=k * V]().cast[acc]().reduce_max())
    var row_max = block_max[acc, threads, block](m)
    var s = Scalar[acc](0)
    comptime for k in range(K):
        s += exp_nan[acc, V](
            raw.slice[V, offset=k * V]().cast[acc]() - row_max
        ).reduce_add()
    return (row_max, block_sum[acc, threads, block](s))


struct SoftmaxRegisterRow[dtype: DType, log_out: Bool, T: Int, V: Int, K: Int](
    RegisterRowOp
):
    """Softmax (log-softmax with `log_out`) of `src` into `dst` as a
    `RegisterRowOp`: K chunks of V a thread, held in their own dtype (a
    16-bit row takes half the registers it would widened, so twice the
    rows, and bytes in flight, fit an SM), widened a chunk at a time; it
    folds (max, sum of exp(x - max))."""

    comptime threads = Self.T

    var dst: HeldRows[Self.dtype]
    """Output rows."""
    var src: HeldRows[Self.dtype]
    """Input rows."""
    var n: Int
    """Row length."""
    var x: HeldRows[Self.dtype]
    """This group's input row."""
    var y: HeldRows[Self.dtype]
    """This group's output row."""
    var len: Int
    """Elements of the row read (0 past the last row)."""
    var raw: SIMD[Self.dtype, Self.V * Self.K]
    """The thread's chunks of the row."""
    var row_max: Scalar[accum_dtype[Self.dtype]()]
    """The row's max."""
    var scale: Scalar[accum_dtype[Self.dtype]()]
    """The row's `row_scale`."""

    @always_inline
    def __init__(
        out self,
        dst: Pointer[Scalar[Self.dtype], MutAnyOrigin],
        src: Pointer[Scalar[Self.dtype], MutAnyOrigin],
        n: Int64,
    ):
        """The op on these tensors, rows of `n`."""
        self.dst = held(dst)
        self.src = held(src)
        self.n = Int(n)
        self.x = self.src
        self.y = self.dst
        self.len = 0
        self.raw = SIMD[Self.dtype, Self.V * Self.K](0)
        self.row_max = 0
        self.scale = 0

    @always_inline
    def begin(mut self, row: Int, len: Int):
        """The row's input and output."""
        self.x = self.src.unsafe_offset(row * self.n)
        self.y = self.dst.unsafe_offset(row * self.n)
        self.len = len

    @always_inline
    def fold(mut self, t: Int, vector_loads: Bool):
        """Load the chunks (-inf past the row), then the row's max and
        `row_scale`."""
        comptime acc = accum_dtype[Self.dtype]()
        comptime assert acc.is_floating_point()
        self.raw = load_row_chunks[
            Self.dtype, Self.T, Self.V, Self.K, Self.dtype
        ](kernel_arg(self.x), self.len, t, vector_loads, -inf[Self.dtype]())
        var pair = held_max_sum[Self.dtype, Self.T, Self.V, Self.K](self.raw)
        self.row_max = pair[0]
        self.scale = row_scale[Self.log_out, acc](pair[1])

    @always_inline
    def write(self, t: Int, vector_loads: Bool):
        """The chunks' softmax, where they were read."""
        comptime acc = accum_dtype[Self.dtype]()
        var out = SIMD[Self.dtype, Self.V * Self.K](0)
        comptime for k in range(Self.K):
            out = out.insert[offset=k * Self.V](
                epilogue[Self.log_out, acc, Self.V](
                    self.raw.slice[Self.V, offset=k * Self.V]().cast[acc](),
                    self.row_max,
                    self.scale,
                ).cast[Self.dtype]()
            )
        store_row_chunks[Self.dtype, Self.T, Self.V, Self.K, Self.dtype](
            kernel_arg(self.y), out, self.len, t, vector_loads
        )


@always_inline
def pdl_start[pdl: Bool]():
    """A register-row kernel's first step under Programmatic Dependent
    Launch (nothing without `pdl`). Launched early, this grid may run beside
    the previous one: wait for it to finish (its writes visible) before
    reading or writing any global memory, every thread (none has left yet).
    Then let the next grid be scheduled: its blocks take free slots and wait
    in their own `wait` until this grid has finished, so neither its reads
    of our output nor its writes over our input can race."""
    comptime if pdl:
        wait_on_dependent_grids()
        launch_dependent_grids()


@always_inline
def vector_path[aligned: Bool](vector_flag: Int32) -> Bool:
    """Whether a thread takes the 16-byte vector path: always in an instance
    compiled for aligned rows only (no scalar path to hold registers for),
    else where `vector_flag` says the rows are aligned."""
    comptime if aligned:
        return True
    return vector_flag != 0


@always_inline
def load_row_chunks[
    dtype: DType, threads: Int, V: Int, K: Int, reg: DType
](
    x: Pointer[Scalar[dtype], MutAnyOrigin],
    len: Int,
    t: Int,
    vector_loads: Bool,
    pad: Scalar[reg],
) -> SIMD[reg, V * K]:
    """Thread t's K chunks of a row of `len` (see the module docstring for
    which elements), as `reg` (the row's dtype or the accumulator type);
    `pad` past the row's end."""
    var vals = SIMD[reg, V * K](pad)
    comptime for k in range(K):
        var chunk = SIMD[reg, V](pad)
        if vector_loads:
            var e0 = (k * threads + t) * V
            if e0 < len:
                chunk = (
                    x.unsafe_offset(e0)
                    .unsafe_load[width=V, alignment=16]()
                    .cast[reg]()
                )
        else:
            comptime for v in range(V):
                var e = (k * V + v) * threads + t
                if e < len:
                    chunk[v] = x[unsafe_offset=e].cast[reg]()
        vals = vals.insert[offset=k * V](chunk)
    return vals


@always_inline
def store_row_chunks[
    dtype: DType, threads: Int, V: Int, K: Int, reg: DType
](
    y: Pointer[Scalar[dtype], MutAnyOrigin],
    vals: SIMD[reg, V * K],
    len: Int,
    t: Int,
    vector_loads: Bool,
):
    """Write thread t's K chunks back where `load_row_chunks` got them."""
    comptime for k in range(K):
        var chunk = vals.slice[V, offset=k * V]().cast[dtype]()
        if vector_loads:
            var e0 = (k * threads + t) * V
            if e0 < len:
                y.unsafe_offset(e0).unsafe_store[alignment=16](chunk)
        else:
            comptime for v in range(V):
                var e = (k * V + v) * threads + t
                if e < len:
                    y[unsafe_offset=e] = chunk[v]


trait RegisterPlanKernel:
    """A kernel over rows held in registers, with its arguments: what
    `launch_register_plan` enqueues once it knows the plan."""

    def enqueue[
        T: Int, K: Int
    ](self, ctx: DeviceContext, grid: Int, block: Int) raises:
        """Enqueue the kernel's instance for T threads a row and K chunks a
        thread, on `grid` blocks of `block` threads."""
        ...


trait AlignedInstances:
    """A register-row kernel compiled twice where `split_aligned` says so:
    for any rows and for aligned rows only."""

    def enqueue_instance[
        T: Int, K: Int, aligned: Bool
    ](self, ctx: DeviceContext, grid: Int, block: Int) raises:
        """Enqueue the instance for aligned rows or for any rows."""
        ...


def enqueue_split_aligned[
    dtype: DType, T: Int, K: Int, L: AlignedInstances
](
    kernel: L, vector_flag: Int32, ctx: DeviceContext, grid: Int, block: Int
) raises:
    """Enqueue `kernel`'s aligned-only instance where `dtype` has one
    (`split_aligned`) and the rows are aligned, else its instance for any
    rows: the one place that makes that choice."""
    comptime if split_aligned[dtype]():
        if vector_flag != 0:
            kernel.enqueue_instance[T, K, True](ctx, grid, block)
            return
    kernel.enqueue_instance[T, K, False](ctx, grid, block)


def launch_register_plan[
    V: Int,
    max_registers: Int,
    min_threads: Int,
    max_threads: Int,
    L: RegisterPlanKernel,
    wide_warp: Bool = False,
](ctx: DeviceContext, kernel: L, plan: Int, rows: Int) raises:
    """Enqueue `kernel` over `rows` rows for register plan `plan` (from
    `register_plan`): the one place that turns a run-time plan into its
    compiled instance, for the forward and the backward kernel alike.

    Only plans of `min_threads` to `max_threads` threads a row and at most
    `max_registers` registers of row values a thread are compiled, and
    `WIDE_WARP_PLAN` only with `wide_warp`; `plan` must be one of them.
    """
    comptime for i in range(NUM_PLANS + 1):
        comptime T = plan_threads(i)
        comptime K = plan_chunks(i)
        comptime if (
            (i < NUM_PLANS or wide_warp)
            and chunk_registers(V) * K <= max_registers
            and min_threads <= T <= max_threads
        ):
            if plan == i:
                comptime block = block_threads[T]()
                kernel.enqueue[T, K](ctx, ceildiv(rows, block // T), block)
                return
    raise Error(
        "max_softmax: register plan " + String(plan) + " is not compiled here"
    )


@fieldwise_init
struct RegisterRows[dtype: DType, log_out: Bool, pdl: Bool](
    AlignedInstances, RegisterPlanKernel
):
    """`register_rows_kernel` with its arguments: softmax (or log-softmax)
    of `rows` rows of `n` from `src` into `dst`, launched with PDL if
    `pdl`."""

    var dst: HeldRows[Self.dtype]
    """Output rows."""
    var src: HeldRows[Self.dtype]
    """Input rows."""
    var rows: Int
    """Number of rows."""
    var n: Int
    """Row length."""
    var vector_flag: Int32
    """`vector_flag` of the buffers and `n`."""

    def enqueue[
        T: Int, K: Int
    ](self, ctx: DeviceContext, grid: Int, block: Int) raises:
        """Enqueue `register_rows_kernel` for T threads a row, K chunks a
        thread."""
        comptime if T == plan_threads(WIDE_WARP_PLAN) and K == plan_chunks(
            WIDE_WARP_PLAN
        ):
            # Only its aligned-only instance is compiled (`register_plan`
            # picks it for aligned rows alone).
            if not wide_warp_rows[Self.dtype](self.vector_flag):
                raise Error(
                    "max_softmax: the wide warp plan needs aligned rows"
                )
            self.enqueue_instance[T, K, True](ctx, grid, block)
            return
        enqueue_split_aligned[Self.dtype, T, K](
            self, self.vector_flag, ctx, grid, block
        )

    def enqueue_instance[
        T: Int, K: Int, aligned: Bool
    ](self, ctx: DeviceContext, grid: Int, block: Int) raises:
        """Enqueue the kernel's instance for aligned rows or for any rows."""
        comptime V = vector_width[Self.dtype]()
        comptime kernel = register_rows_kernel[
            Self.dtype, Self.log_out, T, V, K, Self.pdl, aligned
        ]
        # The PDL attribute where the kernel waits for it: an empty list
        # (a plain launch) without `pdl` or below sm_90.
        ctx.enqueue_function[kernel](
            kernel_arg(self.dst),
            kernel_arg(self.src),
            Int64(self.rows),
            Int64(self.n),
            self.vector_flag,
            grid_dim=grid,
            block_dim=block,
            attributes=pdl_launch_attributes(
                PDLLevel.ON if Self.pdl else PDLLevel.OFF
            ),
        )


def launch_register_rows[
    dtype: DType, log_out: Bool, block_rows: Bool, pdl: Bool = PDL
](ctx: DeviceContext, r: LaunchRows[dtype]) raises:
    """Launch `register_rows_kernel` on `r`'s rows (`src` is `a`): variant
    "warp" (8 to 32 threads a row; to 1024 fp32 for aligned rows,
    `WIDE_WARP_PLAN`) or, with `block_rows`, "block" (64 to 512); with
    Programmatic Dependent Launch if `pdl`. Raises if no plan of those
    threads holds a row of `n`."""
    comptime V = vector_width[dtype]()
    comptime min_threads = 2 * WARP_THREADS if block_rows else 1
    comptime max_threads = MAX_PLAN_THREADS if block_rows else WARP_THREADS
    var n = r.n
    var vector_flag = vector_flag_of(r.aligned, n, V)
    var wide = wide_warp_rows[dtype](vector_flag)
    var plan = register_plan(n, V, min_threads, wide_warp=wide)
    if plan < 0 or plan_threads(plan) > max_threads:
        raise Error(
            "max_softmax: variant '"
            + ("block" if block_rows else "warp")
            + "' handles rows up to "
            + String(register_capacity(V, min_threads, max_threads, wide))
            + " elements, got "
            + String(n)
        )
    launch_register_plan[
        V,
        MAX_ROW_REGISTERS,
        min_threads,
        max_threads,
        wide_warp=wide_warp_dtype[dtype](),
    ](
        ctx,
        RegisterRows[dtype, log_out, pdl](
            r.tensors.dst, r.tensors.a, r.rows, n, vector_flag
        ),
        plan,
        r.rows,
    )
