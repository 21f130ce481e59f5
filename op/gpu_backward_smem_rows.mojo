"""The backward's op on chip: `BackwardRow`, the softmax (log-softmax)
backward as a `RowOp` of the on-chip strategy (gpu_smem_rows'
`onchip_rows`), a row per block or per cluster of C blocks, y (or log p)
and dy read once, dx written once from chip: 3 transfers instead of the
block-per-row kernel's 5.

Rows too long for the backward's register plans (over 16K float32 or 32K
16-bit values) whose two tensors fit one SM together (to ~37K float32 or
~74K 16-bit values, e.g. bfloat16 50257: 201 KB of both) get a block of
512 or 1024 threads each; each thread keeps its first `REG_CHUNKS / 2`
vectors of each tensor in registers, the rest of both rows goes to
dynamic shared memory by cp.async, a's part then dy's. Rows past one SM
get a cluster of C such blocks a row (to `cluster_capacity(V, 2, C)`:
float32 to ~148K and float64 to ~74K with C = 4, 16-bit to ~148K with
C = 2, as dispatch.mojo's `backward_kernel_for` picks); the parts' sums
meet at a cluster barrier (`cluster_total`).
"""

from max.gpu import MAX_THREADS_PER_BLOCK_METADATA
from max.gpu.host import DeviceContext
from max.gpu.memory import async_copy_wait_all
from std.utils import StaticTuple

from .gpu_launch import aligned_flag_of, kernel_arg
from .gpu_reductions import block_sum
from .gpu_smem_rows import (
    CLUSTER_SLOTS,
    REG_CHUNKS,
    SMEM_HALF_THREADS,
    SMEM_THREADS,
    OnchipLaunch,
    cluster_total,
    onchip_rows,
    smem_min_blocks,
    start_row_copy,
)
from .gpu_split_chunks import SharedBuffer
from .row_math import (
    accum_dtype,
    backward_out,
    backward_term,
    load_widened,
    vector_width,
)
from .row_op import OnchipBlock, RowOp
from .row_part import RowPart
from .row_tensors import LaunchRows, RowTensors, tensors_of

# y (or log p) and dy share the forward's registers and shared memory.
comptime SMEM_TENSORS = 2
# 16-byte vectors of each tensor a thread holds in registers.
comptime BACKWARD_REG_CHUNKS = REG_CHUNKS // SMEM_TENSORS


@always_inline
def load_vector[
    dtype: DType, V: Int
](x: Pointer[Scalar[dtype], MutAnyOrigin], e: Int) -> SIMD[dtype, V]:
    """The aligned 16-byte vector at `x + e`."""
    return x.unsafe_offset(e).unsafe_load[width=V, alignment=16]()


@always_inline
def _sum_aligned_part[
    dtype: DType, log_in: Bool, V: Int, T: Int
](
    ra: Pointer[Scalar[dtype], MutAnyOrigin],
    rg: Pointer[Scalar[dtype], MutAnyOrigin],
    smem_a: SharedBuffer[dtype],
    smem_g: SharedBuffer[dtype],
    t: Int,
    head: Int,
    nvec: Int,
    mut regs_a: SIMD[dtype, V * BACKWARD_REG_CHUNKS],
    mut regs_g: SIMD[dtype, V * BACKWARD_REG_CHUNKS],
) -> Scalar[accum_dtype[dtype]()]:
    """Sweep 1 over the aligned part of both rows (from `ra + head`, `rg +
    head`): thread `t`'s first vectors of each into `regs_a` and `regs_g`,
    the rest into `smem_a` and `smem_g`, and the sum of their
    `backward_term`. The shared-memory part starts first (cp.async), so the
    register part lands while it streams in."""
    comptime acc = accum_dtype[dtype]()
    comptime R = BACKWARD_REG_CHUNKS
    start_row_copy[dtype, V, T, R](ra, smem_a, t, head, nvec)
    start_row_copy[dtype, V, T, R](rg, smem_g, t, head, nvec)
    var s = Scalar[acc](0)
    comptime for k in range(R):
        var i = k * T + t
        if i < nvec:
            var va = load_vector[dtype, V](ra, head + i * V)
            var vg = load_vector[dtype, V](rg, head + i * V)
            regs_a = regs_a.insert[offset=k * V](va)
            regs_g = regs_g.insert[offset=k * V](vg)
            s += backward_term[log_in, acc, V](
                va.cast[acc](), vg.cast[acc]()
            ).reduce_add()
    async_copy_wait_all()
    for i in range(R * T + t, nvec, T):
        var at = (i - R * T) * V
        s += backward_term[log_in, acc, V](
            load_widened[V](smem_a, at),
            load_widened[V](smem_g, at),
        ).reduce_add()
    return s


@always_inline
def _load_edges[
    dtype: DType
](
    ra: Pointer[Scalar[dtype], MutAnyOrigin],
    rg: Pointer[Scalar[dtype], MutAnyOrigin],
    p: RowPart,
    mut edge_a: SIMD[accum_dtype[dtype](), 2],
    mut edge_g: SIMD[accum_dtype[dtype](), 2],
):
    """Thread `p.t`'s element of each row's head (a head under V elements)
    into `[0]` of `edge_a` and `edge_g`, and of its tail into `[1]`; where
    it has none they keep their 0, which adds 0 to either sum (dy * y, or
    dy)."""
    comptime acc = accum_dtype[dtype]()
    if p.has_head:
        edge_a[0] = ra[unsafe_offset=p.t].cast[acc]()
        edge_g[0] = rg[unsafe_offset=p.t].cast[acc]()
    if p.has_tail:
        edge_a[1] = ra[unsafe_offset=p.tail_begin + p.t].cast[acc]()
        edge_g[1] = rg[unsafe_offset=p.tail_begin + p.t].cast[acc]()


@always_inline
def _write_aligned_part[
    dtype: DType, log_in: Bool, V: Int, T: Int
](
    rdx: Pointer[Scalar[dtype], MutAnyOrigin],
    regs_a: SIMD[dtype, V * BACKWARD_REG_CHUNKS],
    regs_g: SIMD[dtype, V * BACKWARD_REG_CHUNKS],
    smem_a: SharedBuffer[dtype],
    smem_g: SharedBuffer[dtype],
    t: Int,
    head: Int,
    nvec: Int,
    total: Scalar[accum_dtype[dtype]()],
):
    """Sweep 2 over the aligned part: thread `t`'s vectors of dx (from `rdx
    + head`), from the registers and shared memory `_sum_aligned_part`
    filled."""
    comptime acc = accum_dtype[dtype]()
    comptime R = BACKWARD_REG_CHUNKS
    comptime for k in range(R):
        var i = k * T + t
        if i < nvec:
            rdx.unsafe_offset(head + i * V).unsafe_store[alignment=16](
                backward_out[log_in, acc, V](
                    regs_a.slice[V, offset=k * V]().cast[acc](),
                    regs_g.slice[V, offset=k * V]().cast[acc](),
                    total,
                ).cast[dtype]()
            )
    for i in range(R * T + t, nvec, T):
        var at = (i - R * T) * V
        rdx.unsafe_offset(head + i * V).unsafe_store[alignment=16](
            backward_out[log_in, acc, V](
                load_widened[V](smem_a, at),
                load_widened[V](smem_g, at),
                total,
            ).cast[dtype]()
        )


@always_inline
def _write_scalar_parts[
    dtype: DType, log_in: Bool, T: Int
](
    rdx: Pointer[Scalar[dtype], MutAnyOrigin],
    ra: Pointer[Scalar[dtype], MutAnyOrigin],
    rg: Pointer[Scalar[dtype], MutAnyOrigin],
    edge_a: SIMD[accum_dtype[dtype](), 2],
    edge_g: SIMD[accum_dtype[dtype](), 2],
    p: RowPart,
    total: Scalar[accum_dtype[dtype]()],
):
    """Sweep 2 outside the aligned part: thread `p.t`'s elements of dx in
    the head and tail (from the edges `_load_edges` got) and, for a head of
    V elements or more, re-read element by element as `_sum_on_chip` read
    them."""
    comptime acc = accum_dtype[dtype]()
    var edges = backward_out[log_in, acc, 2](edge_a, edge_g, total).cast[
        dtype
    ]()
    if p.has_head:
        rdx[unsafe_offset=p.t] = edges[0]
    if p.has_tail:
        rdx[unsafe_offset=p.tail_begin + p.t] = edges[1]
    for e in range(p.lead, p.head, T):
        rdx[unsafe_offset=e] = backward_out[log_in, acc, 1](
            ra[unsafe_offset=e].cast[acc](),
            rg[unsafe_offset=e].cast[acc](),
            total,
        ).cast[dtype]()


struct BackwardRow[dtype_: DType, log_in: Bool, V: Int, T: Int](RowOp):
    """The softmax (log-softmax with `log_in`) backward of y (or log p) `a`
    and `dy` into `dx` as a `RowOp`: it folds the row's sum of
    `backward_term`; a cluster's parts add theirs (`cluster_total`).

    Both tensors' parts are held on chip: `BACKWARD_REG_CHUNKS` vectors of
    each a thread in registers (the forward's 16 registers of row values,
    shared), the rest in shared memory, a's part then dy's (`_dy_part`),
    so both are read once."""

    comptime dtype = Self.dtype_
    comptime width = Self.V
    comptime threads = Self.T
    comptime cluster_slots = CLUSTER_SLOTS

    var t: RowTensors[Self.dtype]
    """dx (`dst`) from y or log p (`a`) and dy (`b`)."""
    var start: Int
    """Element of the tensors where the block's part starts."""
    var regs_a: SIMD[Self.dtype, Self.V * BACKWARD_REG_CHUNKS]
    """The thread's first vectors of a's part."""
    var regs_g: SIMD[Self.dtype, Self.V * BACKWARD_REG_CHUNKS]
    """The thread's first vectors of dy's part."""
    var edge_a: SIMD[accum_dtype[Self.dtype_](), 2]
    """The thread's head and tail elements of a (0 where none)."""
    var edge_g: SIMD[accum_dtype[Self.dtype_](), 2]
    """The thread's head and tail elements of dy (0 where none)."""
    var total: Scalar[accum_dtype[Self.dtype_]()]
    """The row's sum of `backward_term`."""

    @always_inline
    def __init__(out self, t: RowTensors[Self.dtype]):
        """The op on these tensors."""
        self.t = t
        self.start = 0
        self.regs_a = SIMD[Self.dtype, Self.V * BACKWARD_REG_CHUNKS](0)
        self.regs_g = SIMD[Self.dtype, Self.V * BACKWARD_REG_CHUNKS](0)
        self.edge_a = SIMD[accum_dtype[Self.dtype](), 2](0)
        self.edge_g = SIMD[accum_dtype[Self.dtype](), 2](0)
        self.total = 0

    @always_inline
    def _dy_part(
        self, p: RowPart, smem: SharedBuffer[Self.dtype]
    ) -> SharedBuffer[Self.dtype]:
        """Where dy's shared part starts: after a's, a whole number of
        16-byte vectors."""
        return smem.unsafe_offset(
            max(0, p.nvec - BACKWARD_REG_CHUNKS * Self.T) * Self.V
        )

    @always_inline
    def begin(
        mut self, p: RowPart, row: Int, start: Int, first: Int, len_row: Int
    ) -> Bool:
        """Every row is folded."""
        self.start = start
        return True

    @always_inline
    def fold[C: Int](mut self, p: RowPart, on: OnchipBlock[Self.dtype]):
        """Sweep 1: load both parts on chip and sum their `backward_term`
        over the block, then over the cluster."""
        var smem = on.smem
        var slots = kernel_arg(on.slots)
        var rank = on.rank
        comptime acc = accum_dtype[Self.dtype]()
        comptime assert acc.is_floating_point()
        var ra = kernel_arg(self.t.a).unsafe_offset(self.start)
        var rg = kernel_arg(self.t.b).unsafe_offset(self.start)
        var s = _sum_aligned_part[Self.dtype, Self.log_in, Self.V, Self.T](
            ra,
            rg,
            smem,
            self._dy_part(p, smem),
            p.t,
            p.head,
            p.nvec,
            self.regs_a,
            self.regs_g,
        )
        _load_edges[Self.dtype](ra, rg, p, self.edge_a, self.edge_g)
        s += backward_term[Self.log_in, acc, 2](
            self.edge_a, self.edge_g
        ).reduce_add()
        for e in range(p.lead, p.head, Self.T):
            s += backward_term[Self.log_in, acc, 1](
                ra[unsafe_offset=e].cast[acc](),
                rg[unsafe_offset=e].cast[acc](),
            )
        self.total = block_sum[acc, Self.T](s)
        comptime if C > 1:
            self.total = cluster_total[acc, C](slots, rank, p.t, self.total)

    @always_inline
    def write[C: Int](mut self, p: RowPart, smem: SharedBuffer[Self.dtype]):
        """Sweep 2: the part's dx from chip, with the whole row's sum."""
        var rdx = kernel_arg(self.t.dst).unsafe_offset(self.start)
        _write_aligned_part[Self.dtype, Self.log_in, Self.V, Self.T](
            rdx,
            self.regs_a,
            self.regs_g,
            smem,
            self._dy_part(p, smem),
            p.t,
            p.head,
            p.nvec,
            self.total,
        )
        _write_scalar_parts[Self.dtype, Self.log_in, Self.T](
            rdx,
            kernel_arg(self.t.a).unsafe_offset(self.start),
            kernel_arg(self.t.b).unsafe_offset(self.start),
            self.edge_a,
            self.edge_g,
            p,
            self.total,
        )


@__llvm_metadata(
    MAX_THREADS_PER_BLOCK_METADATA=StaticTuple[Int32, 1](Int32(T)),
    `nvvm.minctasm`=SIMDLength(smem_min_blocks(T)),
)
def backward_smem_kernel[
    dtype: DType, log_in: Bool, V: Int, T: Int, C: Int
](
    dx: Pointer[Scalar[dtype], MutAnyOrigin],
    a: Pointer[Scalar[dtype], MutAnyOrigin],
    dy: Pointer[Scalar[dtype], MutAnyOrigin],
    partials: Pointer[Scalar[accum_dtype[dtype]()], MutAnyOrigin],
    n: Int64,
    aligned_flag: Int32,
):
    """The gradient of rows of `n` (to `smem_capacity(V, 2)` for C = 1,
    `cluster_capacity(V, 2, C)` for C > 1): `onchip_rows` of `BackwardRow`,
    a row per cluster of C blocks of `T` threads.

    Parameters:
        dtype: Element type.
        log_in: `a` holds log-softmax output (log_softmax_backward).
        V: Elements per 16-byte vector of `dtype`.
        T: Threads per block.
        C: Blocks a row (C > 1: a thread-block cluster).

    Args:
        dx: Output gradient rows.
        a: Forward output rows (y or log p).
        dy: Incoming gradient rows.
        partials: `CLUSTER_SLOTS` a row, for the cluster's exchange (C > 1).
        n: Row length.
        aligned_flag: Nonzero when dx, a and dy start 16-byte aligned.
    """
    var op = BackwardRow[dtype, log_in, V, T](tensors_of(dx, a, dy))
    onchip_rows[C=C](op, partials, n, aligned_flag)


def launch_backward_parts[
    dtype: DType, log_in: Bool, C: Int
](ctx: DeviceContext, r: LaunchRows[dtype]) raises:
    """Launch `backward_smem_kernel` on `r`'s rows (dx from a and dy), C
    blocks a row, each with the shared memory its part of both tensors
    needs and `CLUSTER_SLOTS` partials a row for C > 1 (`OnchipLaunch`).
    Raises past the capacity."""
    comptime V = vector_width[dtype]()
    var launch = OnchipLaunch[dtype, C](
        ctx, "the backward's on-chip kernel", r.rows, r.n, SMEM_TENSORS
    )
    comptime for T in [SMEM_HALF_THREADS, SMEM_THREADS]:
        if launch.threads == T:
            launch.enqueue[backward_smem_kernel[dtype, log_in, V, T, C], T](
                ctx,
                r.dst(),
                r.a(),
                r.b(),
                launch.partials.ptr(r.a()),
                Int64(r.n),
                aligned_flag_of(r.aligned),
            )
