"""Backward rows kept on chip, both tensors: a block a row reads y (or
log p) and dy once.

Rows too long for the backward's register plans (over 16K float32 or 32K
16-bit values) whose two tensors fit one SM together (to ~37K float32 or
~74K 16-bit values, e.g. bfloat16 50257: 201 KB of both) get a block of
512 or 1024 threads each, as the forward's gpu_smem_rows: each thread
keeps its first `REG_CHUNKS / 2` vectors of each tensor in registers (the
forward's 16 registers of row values), the rest of both rows goes to
dynamic shared memory by cp.async (`start_row_copy`), a's part then dy's.
The row sum of `backward_term` is reduced over the on-chip copy and dx
written from it: 3 transfers instead of the block-per-row kernel's 5.

Rows past one SM get `backward_cluster_kernel`, the cross-entropy's
`ce_pair_kernel` design widened to C blocks: a thread-block cluster of such
blocks a row, each holding its part of both rows on chip (to
`cluster_capacity(V, 2, C)`: float32 to ~148K and float64 to ~74K with
C = 4, 16-bit to ~148K with C = 2, as dispatch.mojo's `backward_kernel_for`
picks); the parts' sums meet through a line of global memory at a cluster
barrier, and each block writes its part of dx from chip. Still 3 transfers.

Rows need not start 16-byte aligned: as in the forward, each row is a
scalar head up to its first aligned element, an aligned vector body, and a
scalar tail, the head and tail (under V elements each) kept in the
registers of the threads that load them.
"""

from max.gpu import MAX_THREADS_PER_BLOCK_METADATA, block_idx, thread_idx
from max.gpu.host import DeviceContext, Dim, FuncAttribute
from max.gpu.memory import AddressSpace, async_copy_wait_all, external_memory
from max.gpu.primitives.cluster import block_rank_in_cluster, cluster_sync
from std.utils import StaticTuple

from .gpu_launch import aligned_flag_of
from .gpu_reductions import block_sum
from .gpu_smem_rows import (
    CLUSTER_SLOTS,
    REG_CHUNKS,
    SMEM_HALF_THREADS,
    SMEM_THREADS,
    cluster_capacity,
    cluster_split,
    smem_bytes_for,
    smem_capacity,
    smem_threads_for,
    start_row_copy,
)
from .row_math import accum_dtype, backward_out, backward_term, vector_width

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
    smem_a: Pointer[
        Scalar[dtype], MutUntrackedOrigin, address_space=AddressSpace.SHARED
    ],
    smem_g: Pointer[
        Scalar[dtype], MutUntrackedOrigin, address_space=AddressSpace.SHARED
    ],
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
            smem_a.unsafe_offset(at)
            .unsafe_load[width=V, alignment=16]()
            .cast[acc](),
            smem_g.unsafe_offset(at)
            .unsafe_load[width=V, alignment=16]()
            .cast[acc](),
        ).reduce_add()
    return s


@always_inline
def _load_edges[
    dtype: DType, V: Int
](
    ra: Pointer[Scalar[dtype], MutAnyOrigin],
    rg: Pointer[Scalar[dtype], MutAnyOrigin],
    t: Int,
    len: Int,
    head: Int,
    tail_begin: Int,
    mut edge_a: SIMD[accum_dtype[dtype](), 2],
    mut edge_g: SIMD[accum_dtype[dtype](), 2],
):
    """Thread `t`'s element of each row's head (before its first 16-byte
    boundary, when that is under V elements) into `[0]` of `edge_a` and
    `edge_g`, and of its tail (after the last whole vector) into `[1]`;
    where it has none they keep their 0, which adds 0 to either sum (dy *
    y, or dy)."""
    comptime acc = accum_dtype[dtype]()
    if t < head and head < V:
        edge_a[0] = ra[unsafe_offset=t].cast[acc]()
        edge_g[0] = rg[unsafe_offset=t].cast[acc]()
    if tail_begin + t < len:
        edge_a[1] = ra[unsafe_offset=tail_begin + t].cast[acc]()
        edge_g[1] = rg[unsafe_offset=tail_begin + t].cast[acc]()


@always_inline
def _add_scalar_head[
    dtype: DType, log_in: Bool, V: Int, T: Int
](
    ra: Pointer[Scalar[dtype], MutAnyOrigin],
    rg: Pointer[Scalar[dtype], MutAnyOrigin],
    t: Int,
    head: Int,
    s: Scalar[accum_dtype[dtype]()],
) -> Scalar[accum_dtype[dtype]()]:
    """`s` plus thread `t`'s `backward_term` over a head of V elements or
    more (the whole row when the buffers are unaligned), element by
    element past the first, which `_load_edges` holds."""
    comptime acc = accum_dtype[dtype]()
    var sum = s
    for e in range(t + (T if head < V else 0), head, T):
        sum += backward_term[log_in, acc, 1](
            ra[unsafe_offset=e].cast[acc](), rg[unsafe_offset=e].cast[acc]()
        )
    return sum


@always_inline
def _write_aligned_part[
    dtype: DType, log_in: Bool, V: Int, T: Int
](
    rdx: Pointer[Scalar[dtype], MutAnyOrigin],
    regs_a: SIMD[dtype, V * BACKWARD_REG_CHUNKS],
    regs_g: SIMD[dtype, V * BACKWARD_REG_CHUNKS],
    smem_a: Pointer[
        Scalar[dtype], MutUntrackedOrigin, address_space=AddressSpace.SHARED
    ],
    smem_g: Pointer[
        Scalar[dtype], MutUntrackedOrigin, address_space=AddressSpace.SHARED
    ],
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
                smem_a.unsafe_offset(at)
                .unsafe_load[width=V, alignment=16]()
                .cast[acc](),
                smem_g.unsafe_offset(at)
                .unsafe_load[width=V, alignment=16]()
                .cast[acc](),
                total,
            ).cast[dtype]()
        )


@always_inline
def _write_scalar_parts[
    dtype: DType, log_in: Bool, V: Int, T: Int
](
    rdx: Pointer[Scalar[dtype], MutAnyOrigin],
    ra: Pointer[Scalar[dtype], MutAnyOrigin],
    rg: Pointer[Scalar[dtype], MutAnyOrigin],
    edge_a: SIMD[accum_dtype[dtype](), 2],
    edge_g: SIMD[accum_dtype[dtype](), 2],
    t: Int,
    len: Int,
    head: Int,
    tail_begin: Int,
    total: Scalar[accum_dtype[dtype]()],
):
    """Sweep 2 outside the aligned part: thread `t`'s elements of dx in the
    head and tail (from the edges `_load_edges` got) and, for a head of V
    elements or more, re-read element by element as `_add_scalar_head`
    read them."""
    comptime acc = accum_dtype[dtype]()
    var edges = backward_out[log_in, acc, 2](edge_a, edge_g, total).cast[
        dtype
    ]()
    if t < head and head < V:
        rdx[unsafe_offset=t] = edges[0]
    if tail_begin + t < len:
        rdx[unsafe_offset=tail_begin + t] = edges[1]
    for e in range(t + (T if head < V else 0), head, T):
        rdx[unsafe_offset=e] = backward_out[log_in, acc, 1](
            ra[unsafe_offset=e].cast[acc](),
            rg[unsafe_offset=e].cast[acc](),
            total,
        ).cast[dtype]()


@always_inline
def _sum_on_chip[
    dtype: DType, log_in: Bool, V: Int, T: Int
](
    ra: Pointer[Scalar[dtype], MutAnyOrigin],
    rg: Pointer[Scalar[dtype], MutAnyOrigin],
    smem_a: Pointer[
        Scalar[dtype], MutUntrackedOrigin, address_space=AddressSpace.SHARED
    ],
    smem_g: Pointer[
        Scalar[dtype], MutUntrackedOrigin, address_space=AddressSpace.SHARED
    ],
    t: Int,
    len: Int,
    head: Int,
    nvec: Int,
    mut regs_a: SIMD[dtype, V * BACKWARD_REG_CHUNKS],
    mut regs_g: SIMD[dtype, V * BACKWARD_REG_CHUNKS],
    mut edge_a: SIMD[accum_dtype[dtype](), 2],
    mut edge_g: SIMD[accum_dtype[dtype](), 2],
) -> Scalar[accum_dtype[dtype]()]:
    """Sweep 1 over a row (or a cluster kernel's part of one) of `len` from
    `ra` and `rg`: load it on chip (registers, shared memory, edges) and
    return the block's sum of its `backward_term`."""
    comptime acc = accum_dtype[dtype]()
    var s = _sum_aligned_part[dtype, log_in, V, T](
        ra, rg, smem_a, smem_g, t, head, nvec, regs_a, regs_g
    )
    var tail_begin = head + nvec * V
    _load_edges[dtype, V](ra, rg, t, len, head, tail_begin, edge_a, edge_g)
    s += backward_term[log_in, acc, 2](edge_a, edge_g).reduce_add()
    return block_sum[acc, T](
        _add_scalar_head[dtype, log_in, V, T](ra, rg, t, head, s)
    )


@always_inline
def _write_on_chip[
    dtype: DType, log_in: Bool, V: Int, T: Int
](
    rdx: Pointer[Scalar[dtype], MutAnyOrigin],
    ra: Pointer[Scalar[dtype], MutAnyOrigin],
    rg: Pointer[Scalar[dtype], MutAnyOrigin],
    smem_a: Pointer[
        Scalar[dtype], MutUntrackedOrigin, address_space=AddressSpace.SHARED
    ],
    smem_g: Pointer[
        Scalar[dtype], MutUntrackedOrigin, address_space=AddressSpace.SHARED
    ],
    t: Int,
    len: Int,
    head: Int,
    nvec: Int,
    regs_a: SIMD[dtype, V * BACKWARD_REG_CHUNKS],
    regs_g: SIMD[dtype, V * BACKWARD_REG_CHUNKS],
    edge_a: SIMD[accum_dtype[dtype](), 2],
    edge_g: SIMD[accum_dtype[dtype](), 2],
    total: Scalar[accum_dtype[dtype]()],
):
    """Sweep 2: the row's (or part's) dx into `rdx` from what
    `_sum_on_chip` put on chip, with the whole row's sum `total`."""
    _write_aligned_part[dtype, log_in, V, T](
        rdx, regs_a, regs_g, smem_a, smem_g, t, head, nvec, total
    )
    _write_scalar_parts[dtype, log_in, V, T](
        rdx, ra, rg, edge_a, edge_g, t, len, head, head + nvec * V, total
    )


@__llvm_metadata(
    MAX_THREADS_PER_BLOCK_METADATA=StaticTuple[Int32, 1](Int32(T)),
    `nvvm.minctasm`=SIMDLength(2 if T == SMEM_HALF_THREADS else 1),
)
def backward_smem_kernel[
    dtype: DType, log_in: Bool, V: Int, T: Int
](
    dx: Pointer[Scalar[dtype], MutAnyOrigin],
    a: Pointer[Scalar[dtype], MutAnyOrigin],
    dy: Pointer[Scalar[dtype], MutAnyOrigin],
    n: Int64,
    aligned_flag: Int32,
):
    """The gradient of `grid_dim.x` rows of `n <= smem_capacity(V, 2)`, a
    row per block of `T` threads (`smem_threads_for`).

    Parameters:
        dtype: Element type.
        log_in: `a` holds log-softmax output (log_softmax_backward).
        V: Elements per 16-byte vector of `dtype`.
        T: Threads per block.

    Args:
        dx: Output gradient rows.
        a: Forward output rows (y or log p).
        dy: Incoming gradient rows.
        n: Row length.
        aligned_flag: Nonzero when dx, a and dy start 16-byte aligned.
    """
    comptime acc = accum_dtype[dtype]()
    comptime assert acc.is_floating_point()
    comptime R = BACKWARD_REG_CHUNKS
    var t = Int(thread_idx.x)
    var len = Int(n)
    var start = Int(block_idx.x) * len
    var ra = a.unsafe_offset(start)
    var rg = dy.unsafe_offset(start)
    # head: elements before the row's first 16-byte boundary (all of them
    # when the buffers themselves are unaligned: scalar throughout).
    var head = min((V - start % V) % V, len) if aligned_flag != 0 else len
    var nvec = (len - head) // V
    var smem_a = external_memory[
        Scalar[dtype], address_space=AddressSpace.SHARED, alignment=16
    ]()
    # dy's shared part follows a's: a whole number of 16-byte vectors.
    var smem_g = smem_a.unsafe_offset(max(0, nvec - R * T) * V)
    var regs_a = SIMD[dtype, V * R](0)
    var regs_g = SIMD[dtype, V * R](0)
    var edge_a = SIMD[acc, 2](0)
    var edge_g = SIMD[acc, 2](0)
    var total = _sum_on_chip[dtype, log_in, V, T](
        ra,
        rg,
        smem_a,
        smem_g,
        t,
        len,
        head,
        nvec,
        regs_a,
        regs_g,
        edge_a,
        edge_g,
    )
    _write_on_chip[dtype, log_in, V, T](
        dx.unsafe_offset(start),
        ra,
        rg,
        smem_a,
        smem_g,
        t,
        len,
        head,
        nvec,
        regs_a,
        regs_g,
        edge_a,
        edge_g,
        total,
    )


def launch_backward_smem[
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
    """Launch `backward_smem_kernel` on `rows` rows of `n`, a block a row
    with the shared memory both tensors' rows need. Raises past
    `smem_capacity(V, 2)`."""
    comptime V = vector_width[dtype]()
    if n > smem_capacity(V, SMEM_TENSORS):
        raise Error(
            "max_softmax: the backward's 'smem' kernel handles rows up to "
            + String(smem_capacity(V, SMEM_TENSORS))
            + " elements, got "
            + String(n)
        )
    var threads = smem_threads_for(n, V, SMEM_TENSORS)
    var smem_bytes = smem_bytes_for(n, V, threads, SMEM_TENSORS)
    comptime for T in [SMEM_HALF_THREADS, SMEM_THREADS]:
        if threads == T:
            comptime kernel = backward_smem_kernel[dtype, log_in, V, T]
            ctx.enqueue_function[kernel](
                dx,
                a,
                dy,
                Int64(n),
                aligned_flag_of(aligned),
                grid_dim=rows,
                block_dim=T,
                shared_mem_bytes=smem_bytes,
                func_attribute=FuncAttribute.MAX_DYNAMIC_SHARED_SIZE_BYTES(
                    UInt32(smem_bytes)
                ),
            )


# ===----------------------------------------------------------------------=== #
# Rows past one SM: a cluster of blocks a row
# ===----------------------------------------------------------------------=== #


@always_inline
def _cluster_total[
    acc: DType, C: Int
](
    slots: Pointer[Scalar[acc], MutAnyOrigin],
    rank: Int,
    t: Int,
    s: Scalar[acc],
) -> Scalar[acc]:
    """The row's sum from the C blocks' sums `s` of a
    `backward_cluster_kernel` cluster: thread 0 publishes this block's
    into `slots[rank]`, and after a cluster barrier (release / acquire: the
    others' stores are visible) every thread adds all C, in the same order
    in every block, so all parts use the same total. `slots` has a
    128-byte line to itself, read only after the barrier: no stale L1
    copy."""
    if t == 0:
        slots[unsafe_offset=rank] = s
    cluster_sync()
    var total = slots[unsafe_offset=0]
    comptime for r in range(1, C):
        total += slots[unsafe_offset=r]
    return total


@__llvm_metadata(
    MAX_THREADS_PER_BLOCK_METADATA=StaticTuple[Int32, 1](Int32(T)),
    `nvvm.minctasm`=SIMDLength(2 if T == SMEM_HALF_THREADS else 1),
)
def backward_cluster_kernel[
    dtype: DType, log_in: Bool, V: Int, T: Int, C: Int
](
    dx: Pointer[Scalar[dtype], MutAnyOrigin],
    a: Pointer[Scalar[dtype], MutAnyOrigin],
    dy: Pointer[Scalar[dtype], MutAnyOrigin],
    partials: Pointer[Scalar[accum_dtype[dtype]()], MutAnyOrigin],
    n: Int64,
    aligned_flag: Int32,
):
    """The gradient of rows too long for one SM (to `cluster_capacity(V,
    2, C)`), a row per thread-block cluster of C T-thread blocks, each
    reading its part of y (or log p) and dy once (`cluster_split`).

    Each block holds its part on chip as `backward_smem_kernel` holds a
    row, sums its `backward_term`, exchanges the sum with the other blocks
    through `partials` at a cluster barrier (`_cluster_total`; a cluster's
    blocks are co-scheduled, so waiting cannot deadlock), and writes its
    part of dx from chip.

    Args:
        dx: Output gradient rows.
        a: Forward output rows (y or log p).
        dy: Incoming gradient rows.
        partials: `CLUSTER_SLOTS` a row, for the exchange.
        n: Row length.
        aligned_flag: Nonzero when dx, a and dy start 16-byte aligned.

    `grid_dim.x` = C x rows, in clusters of C.
    """
    comptime acc = accum_dtype[dtype]()
    comptime assert acc.is_floating_point()
    comptime assert C <= CLUSTER_SLOTS
    comptime R = BACKWARD_REG_CHUNKS
    var t = Int(thread_idx.x)
    var rank = Int(block_rank_in_cluster())
    var row = Int(block_idx.x) // C
    var len_row = Int(n)
    var lo = cluster_split[V, C](row * len_row, len_row, aligned_flag, rank)
    var hi = cluster_split[V, C](row * len_row, len_row, aligned_flag, rank + 1)
    var start = row * len_row + lo
    var len = hi - lo
    var ra = a.unsafe_offset(start)
    var rg = dy.unsafe_offset(start)
    # As in backward_smem_kernel, for this block's part (all but rank 0's
    # start aligned, so only rank 0 has a head).
    var head = min((V - start % V) % V, len) if aligned_flag != 0 else len
    var nvec = (len - head) // V
    var smem_a = external_memory[
        Scalar[dtype], address_space=AddressSpace.SHARED, alignment=16
    ]()
    var smem_g = smem_a.unsafe_offset(max(0, nvec - R * T) * V)
    var regs_a = SIMD[dtype, V * R](0)
    var regs_g = SIMD[dtype, V * R](0)
    var edge_a = SIMD[acc, 2](0)
    var edge_g = SIMD[acc, 2](0)
    var s = _sum_on_chip[dtype, log_in, V, T](
        ra,
        rg,
        smem_a,
        smem_g,
        t,
        len,
        head,
        nvec,
        regs_a,
        regs_g,
        edge_a,
        edge_g,
    )
    var total = _cluster_total[acc, C](
        partials.unsafe_offset(row * CLUSTER_SLOTS), rank, t, s
    )
    _write_on_chip[dtype, log_in, V, T](
        dx.unsafe_offset(start),
        ra,
        rg,
        smem_a,
        smem_g,
        t,
        len,
        head,
        nvec,
        regs_a,
        regs_g,
        edge_a,
        edge_g,
        total,
    )


def launch_backward_cluster[
    dtype: DType, log_in: Bool, C: Int
](
    ctx: DeviceContext,
    dx: Pointer[Scalar[dtype], MutAnyOrigin],
    a: Pointer[Scalar[dtype], MutAnyOrigin],
    dy: Pointer[Scalar[dtype], MutAnyOrigin],
    rows: Int,
    n: Int,
    aligned: Bool,
) raises:
    """Launch `backward_cluster_kernel` on `rows` rows of `n`: clusters of
    C blocks a row, each with the shared memory its part of both tensors
    needs (parts of at most (n + C - 1) / C + 2V elements), and
    `CLUSTER_SLOTS` partials a row. Raises past
    `cluster_capacity(V, 2, C)`."""
    comptime V = vector_width[dtype]()
    comptime acc = accum_dtype[dtype]()
    if n > cluster_capacity(V, SMEM_TENSORS, C):
        raise Error(
            "max_softmax: the backward's cluster kernel of "
            + String(C)
            + " blocks handles rows up to "
            + String(cluster_capacity(V, SMEM_TENSORS, C))
            + " elements, got "
            + String(n)
        )
    var part = (n + C - 1) // C + 2 * V
    var threads = smem_threads_for(part, V, SMEM_TENSORS)
    var smem_bytes = smem_bytes_for(part, V, threads, SMEM_TENSORS)
    var partials = ctx.enqueue_create_buffer[acc](rows * CLUSTER_SLOTS)
    var partials_ptr = rebind[Pointer[Scalar[acc], MutAnyOrigin]](
        partials.unsafe_ptr()
    )
    comptime for T in [SMEM_HALF_THREADS, SMEM_THREADS]:
        if threads == T:
            comptime kernel = backward_cluster_kernel[dtype, log_in, V, T, C]
            ctx.enqueue_function[kernel](
                dx,
                a,
                dy,
                partials_ptr,
                Int64(n),
                aligned_flag_of(aligned),
                grid_dim=C * rows,
                block_dim=T,
                cluster_dim=Dim(C),
                shared_mem_bytes=smem_bytes,
                func_attribute=FuncAttribute.MAX_DYNAMIC_SHARED_SIZE_BYTES(
                    UInt32(smem_bytes)
                ),
            )
    # Freed in stream order, after the kernel.
    _ = partials^
