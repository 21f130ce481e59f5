"""Soft-target cross-entropy on chip: `SoftTargetRow`, a `RowOp` of the
on-chip strategy (gpu_smem_rows' `onchip_rows`), a block a row. The
logits and the probabilities are read once (each thread's first
`SOFT_REG_CHUNKS` vectors of each in registers, the rest of both rows in
dynamic shared memory by cp.async, the logits' part then the
probabilities'), the row's loss written once (`finish`) and, with the
gradient, d loss / d logits written once from chip (`write`).

`fold` takes the row's max over the held logits first, then (s, S, T)
(soft_target_math) over the held values with that max, so no running
statistic is rescaled. Rows to `smem_capacity(V, 2)` (~37K float32, ~74K
16-bit values); longer rows take the block-a-row kernel
(gpu_soft_cross_entropy).
"""

from max.gpu import MAX_THREADS_PER_BLOCK_METADATA
from max.gpu.memory import async_copy_wait_all
from std.utils import StaticTuple
from std.utils.numerics import inf

from .gpu_ce_common import store_row_loss
from .gpu_launch import (
    GlobalRows,
    HeldRows,
    KernelArgs,
    held,
    in_global,
    kernel_arg,
)
from .gpu_reductions import block_max, block_sum
from .gpu_smem_rows import (
    CLUSTER_SLOTS,
    REG_CHUNKS,
    onchip_rows,
    smem_min_blocks,
    start_row_copy,
)
from .gpu_split_chunks import SharedBuffer
from .row_math import accum_dtype, load_widened, online_sum_guard
from .row_op import OnchipBlock, RowOp
from .row_part import RowPart
from .soft_target_math import (
    SoftStats,
    SoftTargets,
    soft_grad,
    soft_p_factor,
    soft_scale,
)

# The logits and the probabilities share the forward's registers and
# shared memory.
comptime SOFT_TENSORS = 2
# 16-byte vectors of each tensor a thread holds in registers.
comptime SOFT_REG_CHUNKS = REG_CHUNKS // SOFT_TENSORS


@fieldwise_init
struct SoftRowsArgs[dtype: DType](KernelArgs):
    """The arguments every soft-target rows kernel takes (`soft_block_kernel`,
    `soft_smem_kernel`), passed as one by value; the launcher types each
    buffer's address as global memory (`to_global`), a kernel takes its
    pointers out with `in_global`."""

    comptime device_type: AnyType = Self

    var dlogits: GlobalRows[Self.dtype]
    """Gradient rows (unused without the gradient)."""
    var logits: GlobalRows[Self.dtype]
    """Logit rows."""
    var probs: GlobalRows[Self.dtype]
    """Probability rows."""
    var options: GlobalRows[DType.float64]
    """(eps, z_loss[, n class weights])."""
    var weighted: Int32
    """Nonzero when the options carry class weights."""
    var row_losses: GlobalRows[accum_dtype[Self.dtype]()]
    """A row loss a row, in the accumulator type (`reduce`)."""
    var loss: GlobalRows[Self.dtype]
    """A loss a row ("none")."""
    var rows: Int64
    """Number of rows."""
    var n: Int64
    """Row length."""

    @staticmethod
    def get_type_name() -> String:
        """The type's name, for kernel-argument error messages."""
        return "SoftRowsArgs"


struct SoftTargetRow[
    dtype_: DType,
    with_grad: Bool,
    mean: Bool,
    reduce: Bool,
    V: Int,
    T: Int,
](ImplicitlyCopyable, RowOp):
    """Soft-target cross-entropy of a row of logits and probabilities as a
    `RowOp` (a block a row): `fold` holds both on chip and folds the row's
    (m, s, S, T); `finish` writes its loss; `write` its gradient."""

    comptime dtype = Self.dtype_
    comptime width = Self.V
    comptime threads = Self.T
    comptime cluster_slots = CLUSTER_SLOTS
    comptime acc = accum_dtype[Self.dtype_]()
    comptime Sweep[writes: Bool] = SoftSweep[
        Self.dtype_,
        Self.with_grad,
        Self.mean,
        Self.reduce,
        Self.V,
        Self.T,
        writes,
    ]

    var dlogits: HeldRows[Self.dtype]
    """Gradient rows (unused without the gradient)."""
    var logits: HeldRows[Self.dtype]
    """Logit rows."""
    var probs: HeldRows[Self.dtype]
    """Probability rows."""
    var row_losses: HeldRows[Self.acc]
    """A row loss a row, in the accumulator type (`reduce`)."""
    var loss: HeldRows[Self.dtype]
    """A loss a row ("none")."""
    var targets: SoftTargets[Self.acc]
    """Label smoothing and class weights."""
    var z_loss: Scalar[Self.acc]
    """The z-loss' factor."""
    var scale: Scalar[Self.acc]
    """The reduction's factor on the gradient."""
    var start: Int
    """Element of the tensors where the row starts."""
    var regs_x: SIMD[Self.dtype, Self.V * SOFT_REG_CHUNKS]
    """The thread's first vectors of the logits."""
    var regs_p: SIMD[Self.dtype, Self.V * SOFT_REG_CHUNKS]
    """The thread's first vectors of the probabilities."""
    var edge_x: SIMD[accum_dtype[Self.dtype_](), 2]
    """The thread's head and tail logits (where `RowPart` says it has
    them)."""
    var edge_p: SIMD[accum_dtype[Self.dtype_](), 2]
    """The thread's head and tail probabilities."""
    var stats: SoftStats[Self.acc]
    """The row's (m, s, S, T) (its max alone until `fold` sums)."""

    @always_inline
    def __init__(
        out self,
        dlogits: Pointer[Scalar[Self.dtype], MutAnyOrigin],
        logits: Pointer[Scalar[Self.dtype], MutAnyOrigin],
        probs: Pointer[Scalar[Self.dtype], MutAnyOrigin],
        options: Pointer[Float64, MutAnyOrigin],
        weighted: Bool,
        row_losses: Pointer[Scalar[Self.acc], MutAnyOrigin],
        loss: Pointer[Scalar[Self.dtype], MutAnyOrigin],
        rows: Int,
        n: Int,
    ):
        """The op on these tensors and options."""
        self.dlogits = held(dlogits)
        self.logits = held(logits)
        self.probs = held(probs)
        self.row_losses = held(row_losses)
        self.loss = held(loss)
        self.targets = SoftTargets[Self.acc](options, weighted, n)
        self.z_loss = options[unsafe_offset=1].cast[Self.acc]()
        self.scale = soft_scale[Self.acc, Self.mean](rows)
        self.start = 0
        self.regs_x = SIMD[Self.dtype, Self.V * SOFT_REG_CHUNKS](0)
        self.regs_p = SIMD[Self.dtype, Self.V * SOFT_REG_CHUNKS](0)
        self.edge_x = SIMD[Self.acc, 2](0)
        self.edge_p = SIMD[Self.acc, 2](0)
        self.stats = SoftStats[Self.acc](0, 0, 0, 0)

    @always_inline
    def _p_part(
        self, p: RowPart, smem: SharedBuffer[Self.dtype]
    ) -> SharedBuffer[Self.dtype]:
        """Where the probabilities' shared part starts: after the logits',
        a whole number of 16-byte vectors."""
        return smem.unsafe_offset(
            max(0, p.nvec - SOFT_REG_CHUNKS * Self.T) * Self.V
        )

    @always_inline
    def visit_held[
        writes: Bool
    ](
        self,
        p: RowPart,
        smem: SharedBuffer[Self.dtype],
        mut vis: Self.Sweep[writes],
    ):
        """`vis` over the thread's held values in a fixed order: its
        register vectors, its shared-memory vectors, its edge pair, then
        a long head (unaligned rows) re-read from memory."""
        comptime acc = Self.acc
        comptime R = SOFT_REG_CHUNKS
        var sp = self._p_part(p, smem)
        comptime for k in range(R):
            var i = k * Self.T + p.t
            if i < p.nvec:
                vis.visit[Self.V](
                    self.regs_x.slice[Self.V, offset=k * Self.V]().cast[acc](),
                    self.regs_p.slice[Self.V, offset=k * Self.V]().cast[acc](),
                    p.head + i * Self.V,
                )
        for i in range(R * Self.T + p.t, p.nvec, Self.T):
            var at = (i - R * Self.T) * Self.V
            vis.visit[Self.V](
                load_widened[Self.V](smem, at),
                load_widened[Self.V](sp, at),
                p.head + i * Self.V,
            )
        if p.has_head:
            vis.visit[1](self.edge_x[0], self.edge_p[0], p.t)
        if p.has_tail:
            vis.visit[1](self.edge_x[1], self.edge_p[1], p.tail_begin + p.t)
        var rx = kernel_arg(self.logits).unsafe_offset(self.start)
        var rp = kernel_arg(self.probs).unsafe_offset(self.start)
        for e in range(p.lead, p.head, Self.T):
            vis.visit[1](
                rx[unsafe_offset=e].cast[acc](),
                rp[unsafe_offset=e].cast[acc](),
                e,
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
        """Load both rows on chip, then fold the row's max and, with it,
        (s, S, T) over the block (a block a row: C = 1)."""
        var smem = on.smem
        comptime assert C == 1, "soft targets hold a row a block"
        comptime acc = Self.acc
        comptime assert acc.is_floating_point()
        comptime R = SOFT_REG_CHUNKS
        var rx = kernel_arg(self.logits).unsafe_offset(self.start)
        var rp = kernel_arg(self.probs).unsafe_offset(self.start)
        start_row_copy[Self.dtype, Self.V, Self.T, R](
            rx, smem, p.t, p.head, p.nvec
        )
        start_row_copy[Self.dtype, Self.V, Self.T, R](
            rp, self._p_part(p, smem), p.t, p.head, p.nvec
        )
        var m = -inf[acc]()
        comptime for k in range(R):
            var i = k * Self.T + p.t
            if i < p.nvec:
                var at = p.head + i * Self.V
                var vx = rx.unsafe_offset(at).unsafe_load[
                    width=Self.V, alignment=16
                ]()
                var vp = rp.unsafe_offset(at).unsafe_load[
                    width=Self.V, alignment=16
                ]()
                self.regs_x = self.regs_x.insert[offset=k * Self.V](vx)
                self.regs_p = self.regs_p.insert[offset=k * Self.V](vp)
                m = max(m, vx.cast[acc]().reduce_max())
        if p.has_head:
            self.edge_x[0] = rx[unsafe_offset=p.t].cast[acc]()
            self.edge_p[0] = rp[unsafe_offset=p.t].cast[acc]()
            m = max(m, self.edge_x[0])
        if p.has_tail:
            self.edge_x[1] = rx[unsafe_offset=p.tail_begin + p.t].cast[acc]()
            self.edge_p[1] = rp[unsafe_offset=p.tail_begin + p.t].cast[acc]()
            m = max(m, self.edge_x[1])
        for e in range(p.lead, p.head, Self.T):
            m = max(m, rx[unsafe_offset=e].cast[acc]())
        async_copy_wait_all()
        for i in range(R * Self.T + p.t, p.nvec, Self.T):
            var v = smem.unsafe_offset((i - R * Self.T) * Self.V).unsafe_load[
                width=Self.V, alignment=16
            ]()
            m = max(m, v.cast[acc]().reduce_max())
        self.stats.m = block_max[acc, Self.T](m)
        var sums = Self.Sweep[False](self)
        self.visit_held(p, smem, sums)
        self.stats = block_sums[Self.T](sums.sums)

    @always_inline
    def finish(self, p: RowPart, row: Int, rank: Int):
        """Thread 0 writes the row's loss."""
        if p.t == 0:
            store_row_loss[Self.dtype, Self.reduce](
                kernel_arg(self.row_losses),
                kernel_arg(self.loss),
                row,
                self.stats.loss(self.z_loss),
            )

    @always_inline
    def write[C: Int](mut self, p: RowPart, smem: SharedBuffer[Self.dtype]):
        """With the gradient: the row's d loss / d logits from chip."""
        comptime if Self.with_grad:
            var grad = Self.Sweep[True](
                self,
                soft_p_factor[Self.acc](
                    self.stats.m, self.stats.s, self.stats.sum_q, self.z_loss
                ),
            )
            self.visit_held(p, smem, grad)


struct SoftSweep[
    dtype: DType,
    with_grad: Bool,
    mean: Bool,
    reduce: Bool,
    V: Int,
    T: Int,
    writes: Bool,
]:
    """A sweep over a thread's held values (`visit_held`): sums their
    (s, S, T) under the row's max, or (`writes`) writes their d loss /
    d logits."""

    comptime acc = accum_dtype[Self.dtype]()
    comptime Row = SoftTargetRow[
        Self.dtype, Self.with_grad, Self.mean, Self.reduce, Self.V, Self.T
    ]

    var row: Self.Row
    """The op (options, statistics)."""
    var p_factor: Scalar[Self.acc]
    """`soft_p_factor` of the row (`writes`)."""
    var sums: SoftStats[Self.acc]
    """The values' sums, under the row's max."""

    @always_inline
    def __init__(out self, row: Self.Row, p_factor: Scalar[Self.acc] = 0):
        """A sweep of `row`, nothing summed yet."""
        self.row = row
        self.p_factor = p_factor
        self.sums = SoftStats[Self.acc](row.stats.m, 0, 0, 0)

    @always_inline
    def visit[
        w: Int
    ](mut self, x: SIMD[Self.acc, w], p: SIMD[Self.acc, w], c: Int):
        """Add the terms of the w values at classes c ..< c + w (logits
        `x`, probabilities `p`), or write their gradient."""
        var q = self.row.targets.q[w](p, c)
        comptime if Self.writes:
            var g = soft_grad[Self.acc, w](
                x, q, self.row.stats.m, self.p_factor, self.row.scale
            ).cast[Self.dtype]()
            var y = kernel_arg(self.row.dlogits).unsafe_offset(
                self.row.start + c
            )
            comptime if w == 1:
                y[unsafe_offset=0] = g[0]
            else:
                y.unsafe_store[alignment=16](g)
        else:
            self.sums.add_held[w](x, q)


@always_inline
def block_sums[T: Int, acc: DType](part: SoftStats[acc]) -> SoftStats[acc]:
    """A row's statistics from every thread's part of a T-thread block,
    each under the row's max: the sums over the block."""
    return SoftStats[acc](
        part.m,
        online_sum_guard[acc](part.m, block_sum[acc, T](part.s)),
        block_sum[acc, T](part.sum_q),
        block_sum[acc, T](part.t),
    )


@__llvm_metadata(
    MAX_THREADS_PER_BLOCK_METADATA=StaticTuple[Int32, 1](Int32(T)),
    `nvvm.minctasm`=SIMDLength(smem_min_blocks(T)),
)
def soft_smem_kernel[
    dtype: DType, with_grad: Bool, mean: Bool, reduce: Bool, V: Int, T: Int
](args: SoftRowsArgs[dtype], aligned_flag: Int32):
    """Soft-target cross-entropy of rows of `n` (to `smem_capacity(V,
    2)`): `onchip_rows` of `SoftTargetRow`, a block of T threads a row.
    Arguments as `soft_block_kernel`; `aligned_flag` is nonzero when the
    logits, probabilities and gradient start 16-byte aligned."""
    var row_losses = in_global(args.row_losses)
    var op = SoftTargetRow[dtype, with_grad, mean, reduce, V, T](
        in_global(args.dlogits),
        in_global(args.logits),
        in_global(args.probs),
        in_global(args.options),
        args.weighted != 0,
        row_losses,
        in_global(args.loss),
        Int(args.rows),
        Int(args.n),
    )
    onchip_rows[C=1](op, row_losses, args.n, aligned_flag)
