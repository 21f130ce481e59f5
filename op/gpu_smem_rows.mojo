"""Long rows kept on chip, in registers and shared memory: read once.

Rows too long for the register kernels (over 32K values) but short enough
for one SM (up to ~74K float32 or ~149K 16-bit values) get a block of
512 or 1024 threads each (`smem_threads_for`), or a cluster of two blocks
(below). The first sweep streams the
row from global memory once, in 16-byte vectors: each thread keeps its
first `REG_CHUNKS` vectors in registers, the rest of the row goes to
dynamic shared memory (up to 227 KB). Then max and sum are reduced over the on-chip copy and the
result written, so the row crosses HBM once each way, as in the register
kernels, instead of twice on the way in as in the online kernel.

A float32 or float64 row that needs a whole SM (1024 threads: past ~37K
float32 values) but whose halves fit 512-thread blocks (to ~74K less a
few hundred values) is split over a thread-block cluster of two such
blocks, a half each (`smem_parts_for`, `cluster_split`): an SM then holds
two halves and one block's sweeps overlap the other's loads. The halves
fold their pairs (max, sum of exp(x - max)) through a line of global
memory at a cluster barrier (`cluster_row_pair`), as the backward's
cluster kernel does its sums.

Rows need not start 16-byte aligned (GPT-2's 50257-long rows mostly do
not): each row is a scalar head up to its first aligned element, an aligned
vector body, and a scalar tail; head and tail (under V elements each) stay
in the registers of the threads that load them.
"""

from max.gpu import (
    MAX_THREADS_PER_BLOCK_METADATA,
    block_idx,
    thread_idx,
)
from max.gpu.host import DeviceContext, Dim, FuncAttribute
from max.gpu.memory import (
    AddressSpace,
    async_copy,
    async_copy_commit_group,
    async_copy_wait_all,
    external_memory,
)
from max.gpu.primitives.cluster import block_rank_in_cluster, cluster_sync
from std.utils import StaticTuple
from std.utils.numerics import inf

from .gpu_launch import aligned_flag_of
from .gpu_reductions import block_max, block_sum
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
def cluster_split[
    V: Int, parts: Int
](start: Int, len: Int, aligned_flag: Int32, r: Int) -> Int:
    """Where part `r` (0 to `parts`) begins when a cluster of `parts`
    blocks splits the row of `len` from element `start`: part 0 takes the
    scalar head and each part an equal share (rounded up) of the aligned
    vectors, the last one the scalar tail too, so every part but the first
    starts 16-byte aligned; unaligned buffers split in equal parts. Each
    part has at most (len + parts - 1) / parts + 2V elements."""
    if aligned_flag == 0:
        return min(r * ((len + parts - 1) // parts), len)
    if r == parts:
        return len
    var head = min((V - start % V) % V, len)
    var nvec = (len - head) // V
    return (0 if r == 0 else head) + min(
        r * ((nvec + parts - 1) // parts), nvec
    ) * V


@always_inline
def pair_split[V: Int](start: Int, len: Int, aligned_flag: Int32) -> Int:
    """Where a pair kernel splits the row between its two blocks: rank 0
    takes [0, split), rank 1 [split, len) (`cluster_split`)."""
    return cluster_split[V, 2](start, len, aligned_flag, 1)


@always_inline
def start_row_copy[
    dtype: DType, V: Int, T: Int, R: Int
](
    x: Pointer[Scalar[dtype], MutAnyOrigin],
    smem: Pointer[
        Scalar[dtype], MutUntrackedOrigin, address_space=AddressSpace.SHARED
    ],
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
def load_row[
    dtype: DType, V: Int, T: Int
](
    x: Pointer[Scalar[dtype], MutAnyOrigin],
    smem: Pointer[
        Scalar[dtype], MutUntrackedOrigin, address_space=AddressSpace.SHARED
    ],
    t: Int,
    head: Int,
    nvec: Int,
    mut regs: SIMD[dtype, V * REG_CHUNKS],
) -> Scalar[accum_dtype[dtype]()]:
    """Sweep 1 of `smem_rows_kernel`: thread `t`'s vectors of the row's
    aligned part (from `x + head`) into `regs` and `smem`, and their max.
    The shared-memory part goes first (`start_row_copy`)."""
    comptime acc = accum_dtype[dtype]()
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
    return m


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


@__llvm_metadata(
    MAX_THREADS_PER_BLOCK_METADATA=StaticTuple[Int32, 1](Int32(T)),
    `nvvm.minctasm`=SIMDLength(2 if T == SMEM_HALF_THREADS else 1),
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
    into `dst`, a row per cluster of C blocks of `T` threads
    (`smem_threads_for` of a part), each holding its part of the row on
    chip (`cluster_split`); V elements a 16-byte vector; `aligned_flag` is
    nonzero when both buffers start 16-byte aligned. With C > 1 the parts
    meet through `partials` (`CLUSTER_SLOTS` a row, `cluster_row_pair`);
    `grid_dim.x` = C x rows."""
    comptime acc = accum_dtype[dtype]()
    comptime assert acc.is_floating_point()
    comptime assert 2 * C <= CLUSTER_SLOTS
    var t = Int(thread_idx.x)
    var rank = 0
    comptime if C > 1:
        rank = Int(block_rank_in_cluster())
    var row = Int(block_idx.x) // C
    var len_row = Int(n)
    var lo = cluster_split[V, C](row * len_row, len_row, aligned_flag, rank)
    var hi = cluster_split[V, C](row * len_row, len_row, aligned_flag, rank + 1)
    var len = hi - lo
    var start = row * len_row + lo
    var x = src.unsafe_offset(start)
    var y = dst.unsafe_offset(start)
    # head: elements before the part's first 16-byte boundary (all of them
    # when the buffers themselves are unaligned: scalar throughout). Every
    # part but the first starts aligned (`cluster_split`).
    var head = min((V - start % V) % V, len) if aligned_flag != 0 else len
    var nvec = (len - head) // V
    var tail_begin = head + nvec * V
    var smem = external_memory[
        Scalar[dtype], address_space=AddressSpace.SHARED, alignment=16
    ]()

    var regs = SIMD[dtype, V * REG_CHUNKS](0)
    var m = load_row[dtype, V, T](x, smem, t, head, nvec, regs)
    # Head and tail: fewer than V elements each, unless the row is scalar.
    var edge = SIMD[acc, 2](-inf[acc]())
    if t < head and head < V:
        edge[0] = x[unsafe_offset=t].cast[acc]()
    if tail_begin + t < len:
        edge[1] = x[unsafe_offset=tail_begin + t].cast[acc]()
    m = max(m, edge.reduce_max())
    for e in range(t + (T if head < V else 0), head, T):
        m = max(m, x[unsafe_offset=e].cast[acc]())
    var part_max = block_max[acc, T](m)
    # A cluster's part sums exp around its own max, shifted off -inf so that
    # a part of only -inf gives the pair (-inf, 0) (`sum_shift`); one block
    # holds the whole row and keeps the three-pass algorithm's NaN for it.
    var shift = part_max
    comptime if C > 1:
        shift = sum_shift[acc](part_max)

    # Sweep 2: the sum of exp over the on-chip copy.
    var s = Scalar[acc](0)
    comptime for k in range(REG_CHUNKS):
        if k * T + t < nvec:
            s += exp_nan[acc, V](
                regs.slice[V, offset=k * V]().cast[acc]() - shift
            ).reduce_add()
    for i in range(REG_CHUNKS * T + t, nvec, T):
        var v = smem.unsafe_offset((i - REG_CHUNKS * T) * V).unsafe_load[
            width=V, alignment=16
        ]()
        s += exp_nan[acc, V](v.cast[acc]() - shift).reduce_add()
    s += exp_nan[acc, 2](edge - shift).reduce_add()
    for e in range(t + (T if head < V else 0), head, T):
        s += exp_nan[acc, 1](x[unsafe_offset=e].cast[acc]() - shift)
    var row_max = part_max
    var scale: Scalar[acc]
    comptime if C > 1:
        var pair = cluster_row_pair[acc, C](
            partials.unsafe_offset(row * CLUSTER_SLOTS),
            rank,
            t,
            part_max,
            block_sum[acc, T](s),
        )
        row_max = pair[0]
        scale = row_scale[log_out, acc](online_sum_guard[acc](pair[0], pair[1]))
    else:
        scale = row_scale[log_out, acc](block_sum[acc, T](s))

    # Sweep 3: write the result.
    comptime for k in range(REG_CHUNKS):
        var i = k * T + t
        if i < nvec:
            y.unsafe_offset(head + i * V).unsafe_store[alignment=16](
                epilogue[log_out, acc, V](
                    regs.slice[V, offset=k * V]().cast[acc](), row_max, scale
                ).cast[dtype]()
            )
    for i in range(REG_CHUNKS * T + t, nvec, T):
        var v = smem.unsafe_offset((i - REG_CHUNKS * T) * V).unsafe_load[
            width=V, alignment=16
        ]()
        y.unsafe_offset(head + i * V).unsafe_store[alignment=16](
            epilogue[log_out, acc, V](v.cast[acc](), row_max, scale).cast[
                dtype
            ]()
        )
    var out = epilogue[log_out, acc, 2](edge, row_max, scale).cast[dtype]()
    if t < head and head < V:
        y[unsafe_offset=t] = out[0]
    if tail_begin + t < len:
        y[unsafe_offset=tail_begin + t] = out[1]
    for e in range(t + (T if head < V else 0), head, T):
        y[unsafe_offset=e] = epilogue[log_out, acc, 1](
            x[unsafe_offset=e].cast[acc](), row_max, scale
        ).cast[dtype]()


def smem_parts_for(n: Int, V: Int) -> Int:
    """Blocks a row of `n` (up to `smem_capacity(V)`) is split over: one
    while two blocks of the row fit an SM, else, for float32 and float64
    (V <= 4), a cluster of `SMEM_CLUSTER` blocks, a part each, so that an
    SM holds two parts and one block's sweeps overlap the other's loads
    (one 1024-thread block an SM leaves HBM idle while it computes).

    H100 (benchmarks/split_stream_sweep.mojo cluster): float32 4096 x 65536
    2937 -> 2978 GB/s, 8192 x 50257 2948 -> 2952, 4096 x 40000 2935 ->
    2951; four blocks ran 2-14% slower than one. 16-bit rows keep one
    block: bfloat16 4096 x 100000 ran 3% slower in two (4096 x 131072 0.7%
    faster)."""
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
](
    ctx: DeviceContext,
    dst: Pointer[Scalar[dtype], MutAnyOrigin],
    src: Pointer[Scalar[dtype], MutAnyOrigin],
    rows: Int,
    n: Int,
    aligned: Bool,
) raises:
    """Launch `smem_rows_kernel` on `rows` rows of `n`, a row per cluster
    of C blocks (C = 1: a block a row), each with the shared memory its
    part needs (parts of at most (n + C - 1) / C + 2V elements; all of `n`
    for C = 1). Raises past the capacity."""
    comptime V = vector_width[dtype]()
    comptime acc = accum_dtype[dtype]()
    var capacity = smem_capacity(V) if C == 1 else cluster_capacity(V, 1, C)
    if n > capacity:
        raise Error(
            "max_softmax: the on-chip rows kernel "
            + ("of one block" if C == 1 else "of a cluster of " + String(C))
            + " handles rows up to "
            + String(capacity)
            + " elements, got "
            + String(n)
        )
    var part = n if C == 1 else (n + C - 1) // C + 2 * V
    var threads = smem_threads_for(part, V)
    var smem_bytes = smem_bytes_for(part, V, threads)
    var partials = ctx.enqueue_create_buffer[acc](
        rows * CLUSTER_SLOTS if C > 1 else 1
    )
    var partials_ptr = rebind[Pointer[Scalar[acc], MutAnyOrigin]](
        partials.unsafe_ptr()
    )
    comptime for T in [SMEM_HALF_THREADS, SMEM_THREADS]:
        if threads == T:
            comptime kernel = smem_rows_kernel[dtype, log_out, V, T, C]
            ctx.enqueue_function[kernel](
                dst,
                src,
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


def launch_smem_rows[
    dtype: DType, log_out: Bool
](
    ctx: DeviceContext,
    dst: Pointer[Scalar[dtype], MutAnyOrigin],
    src: Pointer[Scalar[dtype], MutAnyOrigin],
    rows: Int,
    n: Int,
    aligned: Bool,
) raises:
    """Launch `smem_rows_kernel` on `rows` rows of `n <= smem_capacity`,
    a row per block or per cluster (`smem_parts_for`). Raises past
    `smem_capacity`."""
    comptime V = vector_width[dtype]()
    if n > smem_capacity(V):
        raise Error(
            "max_softmax: variant 'smem' handles rows up to "
            + String(smem_capacity(V))
            + " elements, got "
            + String(n)
        )
    if smem_parts_for(n, V) == 1:
        launch_smem_parts[dtype, log_out, 1](ctx, dst, src, rows, n, aligned)
    else:
        launch_smem_parts[dtype, log_out, SMEM_CLUSTER](
            ctx, dst, src, rows, n, aligned
        )
