"""The on-chip strategy: long rows kept in registers and shared memory,
read once, for every op (`onchip_rows`, generic over `RowOp`).

Rows too long for the register kernels but short enough for one SM (the
forward to ~74K float32 or ~149K 16-bit values; the backward's two
tensors half that) get a block of 512 or 1024 threads each
(`smem_threads_for`). The first sweep streams the row from global memory
once, in 16-byte vectors: each thread keeps its first `REG_CHUNKS` vectors
in registers, the rest of the row goes to dynamic shared memory (up to 227
KB) by cp.async (`start_row_copy`). The op's statistics are reduced over
the on-chip copy and its result written from it, so the row crosses HBM
once each way, as in the register kernels.

Rows past one SM, or whose halves fit two blocks an SM where a whole row
would need all of one, are split over a thread-block cluster of C such
blocks, a part each (`cluster_split`); the parts' statistics meet through
a line of global memory at a cluster barrier (`cluster_exchange`,
`cluster_total`), and each block writes its part from chip.

This file holds the strategy (`onchip_rows`, its sweeps and the launch
plan) and the softmax forward's op (`SoftmaxRow`, `smem_rows_kernel`);
the backward's and the cross-entropy's ops are in gpu_backward_smem_rows
and gpu_ce_smem_rows. Each row (or part) is laid out as a `RowPart`.
"""

from max.gpu import (
    MAX_THREADS_PER_BLOCK_METADATA,
    block_idx,
    thread_idx,
)
from max.gpu.host import DeviceBuffer, DeviceContext, Dim, FuncAttribute
from std.builtin.device_passable import DevicePassable
from max.gpu.memory import (
    AddressSpace,
    async_copy,
    async_copy_commit_group,
    async_copy_wait_all,
    external_memory,
)
from max.gpu.primitives.cluster import block_rank_in_cluster, cluster_sync
from std.math import exp2
from std.utils import StaticTuple
from std.utils.numerics import inf

from .gpu_launch import HeldRows, aligned_flag_of, held, kernel_arg
from .gpu_reductions import block_max, block_sum
from .gpu_split_chunks import SharedBuffer
from .row_math import (
    accum_dtype,
    epilogue,
    exp_nan,
    fold_pair,
    online_sum_guard,
    row_scale,
    sum_shift,
    vector_width,
)
from .row_op import OnchipBlock, RowOp
from .row_part import RowPart, cluster_split, row_part
from .row_tensors import LaunchRows, RowTensors, tensors_of

# Threads per row (or per part of a row, `smem_parts_for`): 1024 for rows
# that need most of an SM's shared memory; rows that leave room for two
# blocks an SM get 512, so one block's exp and
# reduction sweeps overlap the other's loads (with one block an SM, HBM
# idles while the block computes, and 16-bit rows have twice the compute
# per byte).
comptime SMEM_THREADS = 1024
comptime SMEM_HALF_THREADS = 512
# 16-byte vectors per thread held in registers (raw dtype: 16 registers).
comptime REG_CHUNKS = 4
# Dynamic shared memory for the row: an H100 block may have 227 KB (232448
# bytes) in all, and the block reductions' static slots need some of it.
comptime BLOCK_SMEM_BYTES = 232448
comptime STATIC_SMEM_BYTES = 1024
comptime SMEM_MAX_BYTES = BLOCK_SMEM_BYTES - STATIC_SMEM_BYTES
# What each of two blocks an SM may take.
comptime SMEM_HALF_BYTES = BLOCK_SMEM_BYTES // 2 - STATIC_SMEM_BYTES
# Blocks a float32 or float64 row too long for two blocks an SM is split
# over, a part each, in a thread-block cluster (`smem_parts_for`).
comptime SMEM_CLUSTER = 2
# Accumulators a row of the cluster kernels (this forward's pairs, the
# backward's sums) exchange through: a 128-byte line of their own (float64:
# two).
comptime CLUSTER_SLOTS = 32


def smem_bytes_for(n: Int, V: Int, threads: Int, tensors: Int = 1) -> Int:
    """Dynamic shared memory the rows of `n` of `tensors` tensors need
    beyond the registers of `threads` threads (`REG_CHUNKS` vectors a
    thread, shared between the tensors)."""
    return max(0, n // V - REG_CHUNKS // tensors * threads) * 16 * tensors


def smem_threads_for(n: Int, V: Int, tensors: Int = 1) -> Int:
    """Threads per row: 512 where two blocks fit an SM, else 1024."""
    if smem_bytes_for(n, V, SMEM_HALF_THREADS, tensors) <= SMEM_HALF_BYTES:
        return SMEM_HALF_THREADS
    return SMEM_THREADS


def smem_min_blocks(threads: Int) -> Int:
    """Blocks an SM must hold of an on-chip kernel of `threads` threads
    (its `nvvm.minctasm`): two of `SMEM_HALF_THREADS`, so that one block's
    sweeps overlap the other's loads; 1 (no demand) for `SMEM_THREADS`."""
    return 2 if threads == SMEM_HALF_THREADS else 1


def smem_capacity(V: Int, tensors: Int = 1) -> Int:
    """Longest row (elements) the kernels hold on chip, of each of
    `tensors` tensors."""
    return V * (
        REG_CHUNKS // tensors * SMEM_THREADS + SMEM_MAX_BYTES // 16 // tensors
    )


def cluster_capacity(V: Int, tensors: Int, parts: Int) -> Int:
    """Longest row (elements) a cluster of `parts` blocks holds on chip, a
    part each: `parts` blocks' `smem_capacity(V, tensors)`, less the
    rounding of the split (`cluster_split`)."""
    return parts * (smem_capacity(V, tensors) - 2 * V)


def pair_capacity(V: Int, tensors: Int = 1) -> Int:
    """`cluster_capacity` of two blocks (the cross-entropy's pair
    kernel)."""
    return cluster_capacity(V, tensors, 2)


@always_inline
def start_row_copy[
    dtype: DType, V: Int, T: Int, R: Int
](
    x: Pointer[Scalar[dtype], MutAnyOrigin],
    smem: SharedBuffer[dtype],
    t: Int,
    head: Int,
    nvec: Int,
):
    """Start copying thread `t`'s vectors of the row's aligned part (from
    `x + head`) past the first R a thread into `smem`, by cp.async: all of
    it in flight at once without holding registers, while the caller loads
    the register part. Each thread reads back only the vectors it copied,
    so waiting for its own copies is enough (no barrier)."""
    var gx = x.unsafe_offset(head).unsafe_address_space_cast[
        AddressSpace.GLOBAL
    ]()
    for i in range(R * T + t, nvec, T):
        async_copy[16](
            gx.unsafe_offset(i * V),
            smem.unsafe_offset((i - R * T) * V),
        )
    async_copy_commit_group()


@always_inline
def cluster_exchange[
    acc: DType, C: Int
](
    slots: Pointer[Scalar[acc], MutAnyOrigin],
    rank: Int,
    t: Int,
    a: Scalar[acc],
    b: Scalar[acc],
) -> Tuple[SIMD[acc, C], SIMD[acc, C]]:
    """Every block of a C-block cluster publishes (a, b) (thread 0, into
    `slots[2 * rank]`, `slots[2 * rank + 1]`) and gets all blocks' back,
    (a_0 .. a_C-1) and (b_0 .. b_C-1), after a cluster barrier (release /
    acquire: the others' stores are visible; a cluster's blocks are
    co-scheduled, so waiting cannot deadlock). `slots` has a 128-byte line
    to itself, read only after the barrier: no stale L1 copy."""
    if t == 0:
        slots[unsafe_offset=2 * rank] = a
        slots[unsafe_offset=2 * rank + 1] = b
    cluster_sync()
    var all_a = SIMD[acc, C]()
    var all_b = SIMD[acc, C]()
    comptime for r in range(C):
        all_a[r] = slots[unsafe_offset=2 * r]
    comptime for r in range(C):
        all_b[r] = slots[unsafe_offset=2 * r + 1]
    return (all_a, all_b)


@always_inline
def cluster_row_pair[
    acc: DType, C: Int
](
    slots: Pointer[Scalar[acc], MutAnyOrigin],
    rank: Int,
    t: Int,
    part_max: Scalar[acc],
    part_sum: Scalar[acc],
) -> Tuple[Scalar[acc], Scalar[acc]]:
    """The row's (max, sum of exp(x - max)) from the C blocks' part pairs
    of a cluster (`cluster_exchange`), folded in the same order in every
    block, so all parts use the same row terms."""
    var both = cluster_exchange[acc, C](slots, rank, t, part_max, part_sum)
    var m = both[0][0]
    var s = both[1][0]
    comptime for r in range(1, C):
        (m, s) = fold_pair[acc](m, s, both[0][r], both[1][r])
    return (m, s)


@always_inline
def load_part_max[
    dtype: DType, V: Int, T: Int
](
    x: Pointer[Scalar[dtype], MutAnyOrigin],
    smem: SharedBuffer[dtype],
    p: RowPart,
    mut regs: SIMD[dtype, V * REG_CHUNKS],
    mut edge: SIMD[accum_dtype[dtype](), 2],
) -> Scalar[accum_dtype[dtype]()]:
    """Sweep 1 of a one-tensor op: load the part `p` (from `x`) on chip
    and reduce its max over the block. Thread `p.t`'s vectors of the
    aligned body go to `regs` (its first `REG_CHUNKS`) and `smem` (the
    rest, copied first: `start_row_copy`); its head and tail elements to
    `edge`, whose other entries keep their -inf."""
    comptime acc = accum_dtype[dtype]()
    var t = p.t
    var head = p.head
    var nvec = p.nvec
    start_row_copy[dtype, V, T, REG_CHUNKS](x, smem, t, head, nvec)
    var m = -inf[acc]()
    comptime for k in range(REG_CHUNKS):
        var i = k * T + t
        if i < nvec:
            var v = x.unsafe_offset(head + i * V).unsafe_load[
                width=V, alignment=16
            ]()
            regs = regs.insert[offset=k * V](v)
            m = max(m, v.cast[acc]().reduce_max())
    async_copy_wait_all()
    for i in range(REG_CHUNKS * T + t, nvec, T):
        var v = smem.unsafe_offset((i - REG_CHUNKS * T) * V).unsafe_load[
            width=V, alignment=16
        ]()
        m = max(m, v.cast[acc]().reduce_max())
    if p.has_head:
        edge[0] = x[unsafe_offset=p.t].cast[acc]()
    if p.has_tail:
        edge[1] = x[unsafe_offset=p.tail_begin + p.t].cast[acc]()
    m = max(m, edge.reduce_max())
    for e in range(p.lead, p.head, T):
        m = max(m, x[unsafe_offset=e].cast[acc]())
    return block_max[acc, T](m)


# An op may keep exp(x - shift) * 2^HELD_EXP_SHIFT on chip in place of its
# values (`held_exp`, `sum_exp_held`): its last sweep then computes no exp
# (the cross-entropy's 16-bit rows; gpu_ce_smem_rows says why the shift).
comptime HELD_EXP_SHIFT = 15
comptime LOG2E = 1.4426950408889634


@always_inline
def held_exp[acc: DType, w: Int](d: SIMD[acc, w]) -> SIMD[acc, w]:
    """exp(d) * 2^HELD_EXP_SHIFT for d = x - max <= 0 (NaN stays NaN):
    one FMA and one `ex2.approx` an element on the GPU."""
    comptime assert acc.is_floating_point()
    return exp2(d.fma(Scalar[acc](LOG2E), Scalar[acc](HELD_EXP_SHIFT)))


@always_inline
def _exp_term[
    acc: DType, w: Int, holds_exp: Bool
](d: SIMD[acc, w]) -> SIMD[acc, w]:
    """`held_exp`(d) with `holds_exp`, else exp(d) (`exp_nan`)."""
    comptime if holds_exp:
        return held_exp[acc, w](d)
    return exp_nan[acc, w](d)


@always_inline
def sum_exp_held[
    dtype: DType, V: Int, T: Int, holds_exp: Bool, with_x: Bool
](
    x: Pointer[Scalar[dtype], MutAnyOrigin],
    smem: SharedBuffer[dtype],
    p: RowPart,
    mut regs: SIMD[dtype, V * REG_CHUNKS],
    edge: SIMD[accum_dtype[dtype](), 2],
    shift: Scalar[accum_dtype[dtype]()],
) -> Tuple[Scalar[accum_dtype[dtype]()], Scalar[accum_dtype[dtype]()]]:
    """Sweep 2 of a one-tensor op: thread `p.t`'s sums of exp(x - shift)
    and, `with_x`, of x over its part held on chip (`load_part_max`). -inf
    padding in `edge` adds exp(-inf) = 0 to the first unless the part is
    all -inf; the second leaves it out. With `holds_exp` it sums
    `held_exp`(x - shift) (2^HELD_EXP_SHIFT x the sum of exp) instead, and
    each held vector is overwritten by its held exps, in `dtype`."""
    comptime acc = accum_dtype[dtype]()
    comptime R = REG_CHUNKS
    var s = Scalar[acc](0)
    var sx = Scalar[acc](0)
    comptime for k in range(R):
        if k * T + p.t < p.nvec:
            var v = regs.slice[V, offset=k * V]().cast[acc]()
            var h = _exp_term[acc, V, holds_exp](v - shift)
            s += h.reduce_add()
            comptime if with_x:
                sx += v.reduce_add()
            comptime if holds_exp:
                regs = regs.insert[offset=k * V](h.cast[dtype]())
    for i in range(R * T + p.t, p.nvec, T):
        var at = smem.unsafe_offset((i - R * T) * V)
        var v = at.unsafe_load[width=V, alignment=16]().cast[acc]()
        var h = _exp_term[acc, V, holds_exp](v - shift)
        s += h.reduce_add()
        comptime if with_x:
            sx += v.reduce_add()
        comptime if holds_exp:
            at.unsafe_store[alignment=16](h.cast[dtype]())
    s += _exp_term[acc, 2, holds_exp](edge - shift).reduce_add()
    comptime if with_x:
        if p.has_head:
            sx += edge[0]
        if p.has_tail:
            sx += edge[1]
    for e in range(p.lead, p.head, T):
        var v = x[unsafe_offset=e].cast[acc]()
        s += _exp_term[acc, 1, holds_exp](v - shift)[0]
        comptime if with_x:
            sx += v
    return (s, sx)


trait HeldMap:
    """What `write_held` writes for each value of a one-tensor op's part
    held on chip."""

    comptime dtype: DType
    """Element type of the tensors."""

    def body[w: Int](self, v: SIMD[Self.dtype, w]) -> SIMD[Self.dtype, w]:
        """The result of w held vector elements, as held."""
        ...

    def edge[
        w: Int
    ](self, v: SIMD[accum_dtype[Self.dtype](), w]) -> SIMD[Self.dtype, w]:
        """The result of w head or tail elements, in the accumulator
        type."""
        ...


@always_inline
def write_held[
    V: Int, T: Int, F: HeldMap
](
    y: Pointer[Scalar[F.dtype], MutAnyOrigin],
    x: Pointer[Scalar[F.dtype], MutAnyOrigin],
    smem: SharedBuffer[F.dtype],
    p: RowPart,
    regs: SIMD[F.dtype, V * REG_CHUNKS],
    edge: SIMD[accum_dtype[F.dtype](), 2],
    f: F,
):
    """The last sweep of a one-tensor op: thread `p.t`'s results of its
    part (held by `load_part_max`) into `y`: the vectors in registers, then
    those in shared memory, the edge pair, and a long head re-read from
    `x`."""
    comptime acc = accum_dtype[F.dtype]()
    comptime for k in range(REG_CHUNKS):
        var i = k * T + p.t
        if i < p.nvec:
            y.unsafe_offset(p.head + i * V).unsafe_store[alignment=16](
                f.body[V](regs.slice[V, offset=k * V]())
            )
    for i in range(REG_CHUNKS * T + p.t, p.nvec, T):
        var v = smem.unsafe_offset((i - REG_CHUNKS * T) * V).unsafe_load[
            width=V, alignment=16
        ]()
        y.unsafe_offset(p.head + i * V).unsafe_store[alignment=16](f.body[V](v))
    var out = f.edge[2](edge)
    if p.has_head:
        y[unsafe_offset=p.t] = out[0]
    if p.has_tail:
        y[unsafe_offset=p.tail_begin + p.t] = out[1]
    for e in range(p.lead, p.head, T):
        y[unsafe_offset=e] = f.edge[1](x[unsafe_offset=e].cast[acc]())[0]


@always_inline
def cluster_total[
    acc: DType, C: Int
](
    slots: Pointer[Scalar[acc], MutAnyOrigin],
    rank: Int,
    t: Int,
    s: Scalar[acc],
) -> Scalar[acc]:
    """The row's sum from the C blocks' sums `s` of a cluster: thread 0
    publishes this block's into `slots[rank]`, and after a cluster barrier
    (as `cluster_exchange`) every thread adds all C, in the same order in
    every block, so all parts use the same total."""
    if t == 0:
        slots[unsafe_offset=rank] = s
    cluster_sync()
    var total = slots[unsafe_offset=0]
    comptime for r in range(1, C):
        total += slots[unsafe_offset=r]
    return total


@always_inline
def onchip_rows[
    Op: RowOp, C: Int
](
    mut op: Op,
    partials: Pointer[Scalar[accum_dtype[Op.dtype]()], MutAnyOrigin],
    n: Int64,
    aligned_flag: Int32,
):
    """The on-chip strategy, for any `RowOp`: rows of `n`, a row per
    cluster of C blocks of `Op.threads` threads (C = 1: a block a row),
    each block holding its part of the row (`cluster_split`) on chip, read
    once and written once. With C > 1 the parts' statistics meet through
    `partials` (`Op.cluster_slots` a row); `grid_dim.x` = C x rows.
    `aligned_flag` is nonzero when the tensors start 16-byte aligned."""
    comptime V = Op.width
    comptime T = Op.threads
    comptime assert 2 * C <= Op.cluster_slots
    var t = Int(thread_idx.x)
    var rank = 0
    comptime if C > 1:
        rank = Int(block_rank_in_cluster())
    var row = Int(block_idx.x) // C
    var len_row = Int(n)
    var first = 0
    var len = len_row
    comptime if C > 1:
        first = cluster_split[V, C](row * len_row, len_row, aligned_flag, rank)
        len = (
            cluster_split[V, C](row * len_row, len_row, aligned_flag, rank + 1)
            - first
        )
    var start = row * len_row + first
    var p = row_part[V, T](t, start, len, aligned_flag)
    var smem = external_memory[
        Scalar[Op.dtype], address_space=AddressSpace.SHARED, alignment=16
    ]()
    # The same for every block of the row: the reductions and cluster
    # barriers in `fold` are reached by every thread of the row or by none.
    if op.begin(p, row, start, first, len_row):
        op.fold[C](
            p,
            OnchipBlock(
                smem, held(partials.unsafe_offset(row * Op.cluster_slots)), rank
            ),
        )
    op.finish(p, row, rank)
    op.write[C](p, smem)


def onchip_part(n: Int, V: Int, C: Int) -> Int:
    """Most elements a block holds of a row of `n` split over C blocks."""
    return n if C == 1 else (n + C - 1) // C + 2 * V


def onchip_plan(
    kernel: String, n: Int, V: Int, tensors: Int, C: Int, unit: String
) raises -> Tuple[Int, Int]:
    """(threads, dynamic shared memory bytes) of each block of an on-chip
    launch on rows of `n` of `tensors` tensors, C blocks a row (each with
    the shared memory its part needs, `onchip_part`). Raises, naming
    `kernel` and counting in `unit`, past the capacity."""
    var capacity = smem_capacity(V, tensors) if C == 1 else cluster_capacity(
        V, tensors, C
    )
    if n > capacity:
        raise Error(
            "max_softmax: "
            + kernel
            + " handles rows up to "
            + String(capacity)
            + " "
            + unit
            + ", got "
            + String(n)
        )
    var part = onchip_part(n, V, C)
    var threads = smem_threads_for(part, V, tensors)
    return (threads, smem_bytes_for(part, V, threads, tensors))


struct ClusterPartials[acc: DType](Movable):
    """The rows' `slots` accumulators each for a kernel of C > 1 blocks a
    row (none for C = 1), freed in stream order after the kernel."""

    var buffer: Optional[DeviceBuffer[Self.acc]]
    """The accumulators, for C > 1."""

    def __init__(
        out self, ctx: DeviceContext, rows: Int, slots: Int, C: Int
    ) raises:
        """Room for `rows` rows of a kernel of C blocks a row."""
        self.buffer = None
        if C > 1:
            self.buffer = ctx.enqueue_create_buffer[Self.acc](rows * slots)

    def ptr[
        dtype: DType
    ](self, stand_in: Pointer[Scalar[dtype], MutAnyOrigin]) -> Pointer[
        Scalar[Self.acc], MutAnyOrigin
    ]:
        """The accumulators as the kernels take them; for C = 1, where the
        kernels never read them, `stand_in` (a pointer may not be null)."""
        if self.buffer:
            return rebind[Pointer[Scalar[Self.acc], MutAnyOrigin]](
                self.buffer.value().unsafe_ptr()
            )
        return stand_in.unsafe_bitcast[Scalar[Self.acc]]()


struct OnchipLaunch[dtype: DType, C: Int](Movable):
    """One launch of an on-chip kernel on `rows` rows, C blocks a row: its
    plan (`onchip_plan`), the cluster's partials and the launch geometry
    every op's on-chip kernel shares, so an op's launcher names only its
    kernel for each block size and that kernel's arguments."""

    var threads: Int
    """Threads a block (`SMEM_HALF_THREADS` or `SMEM_THREADS`)."""
    var smem_bytes: Int
    """Dynamic shared memory a block."""
    var rows: Int
    """Rows, a cluster of C blocks each."""
    var partials: ClusterPartials[accum_dtype[Self.dtype]()]
    """The partials of C > 1 (`slots` a row: the op's `cluster_slots`),
    kept until the launch is enqueued."""

    def __init__(
        out self,
        ctx: DeviceContext,
        kernel: String,
        rows: Int,
        n: Int,
        tensors: Int,
        slots: Int = CLUSTER_SLOTS,
        unit: String = "elements",
    ) raises:
        """Plan rows of `n` of `tensors` tensors; raises, naming `kernel`
        and the row's `unit`, past the capacity."""
        var plan = onchip_plan(
            kernel + " of " + String(Self.C) + " block(s) a row",
            n,
            vector_width[Self.dtype](),
            tensors,
            Self.C,
            unit,
        )
        self.threads = plan[0]
        self.smem_bytes = plan[1]
        self.rows = rows
        self.partials = ClusterPartials[accum_dtype[Self.dtype]()](
            ctx, rows, slots, Self.C
        )

    def enqueue[
        declared: TypeList[Trait=AnyType, ...],
        //,
        kernel: def(* args: * declared) thin -> None,
        T: Int,
        *Ts: DevicePassable,
    ](self, ctx: DeviceContext, *args: *Ts) raises:
        """Enqueue `kernel`, built for T threads a block, on `args`: a
        cluster of C blocks a row, each with the planned shared memory.
        `args` pass through as the kernel takes them, since the ops'
        kernels differ in their tensors."""
        ctx.enqueue_function[kernel](
            *args,
            grid_dim=Self.C * self.rows,
            block_dim=T,
            cluster_dim=Dim(Self.C),
            shared_mem_bytes=self.smem_bytes,
            func_attribute=FuncAttribute.MAX_DYNAMIC_SHARED_SIZE_BYTES(
                UInt32(self.smem_bytes)
            ),
        )


# ===----------------------------------------------------------------------=== #
# Softmax
# ===----------------------------------------------------------------------=== #


@fieldwise_init
struct SoftmaxWrite[dtype_: DType, log_out: Bool](HeldMap, ImplicitlyCopyable):
    """Softmax (log-softmax with `log_out`) of held values, given the row's
    max and `row_scale`."""

    comptime dtype = Self.dtype_

    var row_max: Scalar[accum_dtype[Self.dtype_]()]
    """The row's max."""
    var scale: Scalar[accum_dtype[Self.dtype_]()]
    """The row's `row_scale`."""

    @always_inline
    def body[w: Int](self, v: SIMD[Self.dtype, w]) -> SIMD[Self.dtype, w]:
        """Softmax of held vector elements."""
        return self.edge[w](v.cast[accum_dtype[Self.dtype]()]())

    @always_inline
    def edge[
        w: Int
    ](self, v: SIMD[accum_dtype[Self.dtype](), w]) -> SIMD[Self.dtype, w]:
        """Softmax of elements in the accumulator type."""
        return epilogue[Self.log_out, accum_dtype[Self.dtype](), w](
            v, self.row_max, self.scale
        ).cast[Self.dtype]()


struct SoftmaxRow[dtype_: DType, log_out: Bool, V: Int, T: Int](RowOp):
    """Softmax (log-softmax with `log_out`) of `src` into `dst` as a
    `RowOp`: it folds (max, sum of exp(x - max)); a cluster's parts sum
    around their own max and fold their pairs (`cluster_row_pair`)."""

    comptime dtype = Self.dtype_
    comptime width = Self.V
    comptime threads = Self.T
    comptime cluster_slots = CLUSTER_SLOTS

    var t: RowTensors[Self.dtype]
    """Output rows (`dst`) from input rows (`a`)."""
    var x: HeldRows[Self.dtype]
    """The block's part of its input row."""
    var y: HeldRows[Self.dtype]
    """The block's part of its output row."""
    var regs: SIMD[Self.dtype, Self.V * REG_CHUNKS]
    """The thread's first `REG_CHUNKS` vectors of the part."""
    var edge: SIMD[accum_dtype[Self.dtype_](), 2]
    """The thread's head and tail elements (-inf where it has none)."""
    var row_max: Scalar[accum_dtype[Self.dtype_]()]
    """The row's max."""
    var scale: Scalar[accum_dtype[Self.dtype_]()]
    """The row's `row_scale`."""

    @always_inline
    def __init__(out self, t: RowTensors[Self.dtype]):
        """The op on these tensors."""
        self.t = t
        self.x = t.a
        self.y = t.dst
        self.regs = SIMD[Self.dtype, Self.V * REG_CHUNKS](0)
        self.edge = SIMD[accum_dtype[Self.dtype](), 2](
            -inf[accum_dtype[Self.dtype]()]()
        )
        self.row_max = 0
        self.scale = 0

    @always_inline
    def begin(
        mut self, p: RowPart, row: Int, start: Int, first: Int, len_row: Int
    ) -> Bool:
        """Every row is folded."""
        self.x = self.t.a.unsafe_offset(start)
        self.y = self.t.dst.unsafe_offset(start)
        return True

    @always_inline
    def fold[C: Int](mut self, p: RowPart, on: OnchipBlock[Self.dtype]):
        """Sweep 1 loads the part and its max, sweep 2 sums exp over the
        on-chip copy; then the row's max and `row_scale`."""
        var smem = on.smem
        var slots = kernel_arg(on.slots)
        var rank = on.rank
        comptime acc = accum_dtype[Self.dtype]()
        comptime assert acc.is_floating_point()
        comptime V = Self.V
        comptime T = Self.T
        var x = kernel_arg(self.x)
        var part_max = load_part_max[Self.dtype, V, T](
            x, smem, p, self.regs, self.edge
        )
        # A cluster's part sums exp around its own max, shifted off -inf so
        # that a part of only -inf gives the pair (-inf, 0) (`sum_shift`);
        # one block holds the whole row and keeps the three-pass
        # algorithm's NaN for it.
        var shift = part_max
        comptime if C > 1:
            shift = sum_shift[acc](part_max)
        var s = sum_exp_held[Self.dtype, V, T, False, False](
            x, smem, p, self.regs, self.edge, shift
        )[0]
        self.row_max = part_max
        comptime if C > 1:
            var pair = cluster_row_pair[acc, C](
                slots, rank, p.t, part_max, block_sum[acc, T](s)
            )
            self.row_max = pair[0]
            self.scale = row_scale[Self.log_out, acc](
                online_sum_guard[acc](pair[0], pair[1])
            )
        else:
            self.scale = row_scale[Self.log_out, acc](block_sum[acc, T](s))

    @always_inline
    def write[C: Int](mut self, p: RowPart, smem: SharedBuffer[Self.dtype]):
        """Sweep 3: the part's softmax from chip."""
        write_held[Self.V, Self.T, SoftmaxWrite[Self.dtype, Self.log_out]](
            kernel_arg(self.y),
            kernel_arg(self.x),
            smem,
            p,
            self.regs,
            self.edge,
            SoftmaxWrite[Self.dtype, Self.log_out](self.row_max, self.scale),
        )


@__llvm_metadata(
    MAX_THREADS_PER_BLOCK_METADATA=StaticTuple[Int32, 1](Int32(T)),
    `nvvm.minctasm`=SIMDLength(smem_min_blocks(T)),
)
def smem_rows_kernel[
    dtype: DType, log_out: Bool, V: Int, T: Int, C: Int
](
    dst: Pointer[Scalar[dtype], MutAnyOrigin],
    src: Pointer[Scalar[dtype], MutAnyOrigin],
    partials: Pointer[Scalar[accum_dtype[dtype]()], MutAnyOrigin],
    n: Int64,
    aligned_flag: Int32,
):
    """Softmax (log-softmax with `log_out`) of rows of `n <=
    cluster_capacity(V, 1, C)` (`smem_capacity(V)` for C = 1) from `src`
    into `dst`: `onchip_rows` of `SoftmaxRow`, a row per cluster of C
    blocks of `T` threads (`smem_threads_for` of a part)."""
    var op = SoftmaxRow[dtype, log_out, V, T](tensors_of(dst, src, src))
    onchip_rows[C=C](op, partials, n, aligned_flag)


def smem_parts_for(n: Int, V: Int) -> Int:
    """Blocks a row of `n` (up to `smem_capacity(V)`) is split over: one
    while two blocks of the row fit an SM, else, for float32 and float64
    (V <= 4), a cluster of `SMEM_CLUSTER` blocks, a part each, so that an
    SM holds two parts and one block's sweeps overlap the other's loads
    (one 1024-thread block an SM leaves HBM idle while it computes). On
    the H100 two blocks beat one for float32 rows and four ran slower;
    16-bit rows gained nothing (benchmarks/RESULTS.md, `sweep cluster`)."""
    if V > 4 or smem_threads_for(n, V) == SMEM_HALF_THREADS:
        return 1
    # Halves that would still need 1024 threads (the last few hundred
    # values below the capacity) would sit one an SM: no overlap to gain.
    var half = (n + SMEM_CLUSTER - 1) // SMEM_CLUSTER + 2 * V
    if smem_threads_for(half, V) != SMEM_HALF_THREADS:
        return 1
    return SMEM_CLUSTER


def launch_smem_parts[
    dtype: DType, log_out: Bool, C: Int
](ctx: DeviceContext, r: LaunchRows[dtype]) raises:
    """Launch `smem_rows_kernel` on `r`'s rows, a row per cluster of C
    blocks (C = 1: a block a row), each with the shared memory its part
    needs (`OnchipLaunch`). Raises past the capacity."""
    comptime V = vector_width[dtype]()
    var launch = OnchipLaunch[dtype, C](
        ctx, "the on-chip rows kernel", r.rows, r.n, 1
    )
    comptime for T in [SMEM_HALF_THREADS, SMEM_THREADS]:
        if launch.threads == T:
            launch.enqueue[smem_rows_kernel[dtype, log_out, V, T, C], T](
                ctx,
                r.dst(),
                r.a(),
                launch.partials.ptr(r.a()),
                Int64(r.n),
                aligned_flag_of(r.aligned),
            )


def launch_smem_rows[
    dtype: DType, log_out: Bool
](ctx: DeviceContext, r: LaunchRows[dtype]) raises:
    """Launch `smem_rows_kernel` on `r`'s rows (`n <= smem_capacity`), a
    row per block or per cluster (`smem_parts_for`). Raises past
    `smem_capacity`."""
    comptime V = vector_width[dtype]()
    if r.n > smem_capacity(V):
        raise Error(
            "max_softmax: variant 'smem' handles rows up to "
            + String(smem_capacity(V))
            + " elements, got "
            + String(r.n)
        )
    if smem_parts_for(r.n, V) == 1:
        launch_smem_parts[dtype, log_out, 1](ctx, r)
    else:
        launch_smem_parts[dtype, log_out, SMEM_CLUSTER](ctx, r)
