"""Cross-entropy rows too long for one SM, read once: `ce_pair_kernel`, a
thread-block cluster of two blocks a row, each holding half of it on chip
as `ce_smem_kernel` holds a row (gpu_ce_smem_rows), their (max, sum)
partials exchanged through global memory at cluster barriers.

`ce_kernel_for` (gpu_cross_entropy) gives it as many rows as the smem
kernel takes (at least SPLIT_BELOW_ROWS), to `pair_capacity(V)` (~148K
fp32, ~296K 16-bit classes).
"""

from max.gpu import MAX_THREADS_PER_BLOCK_METADATA, block_idx, thread_idx
from max.gpu.host import DeviceContext, Dim, FuncAttribute
from max.gpu.memory import AddressSpace, external_memory
from max.gpu.primitives.cluster import block_rank_in_cluster
from std.utils import StaticTuple
from std.utils.numerics import inf, nan

from .cross_entropy_math import IGNORED, KEPT, row_loss, target_kind
from .gpu_ce_common import ce_options, fill_row
from .gpu_ce_smem_rows import (
    SmemRowShare,
    smem_row_grad,
    smem_row_max,
    smem_row_share,
    smem_row_stats,
)
from .gpu_launch import aligned_flag_of
from .gpu_smem_rows import (
    REG_CHUNKS,
    SMEM_HALF_THREADS,
    SMEM_THREADS,
    cluster_exchange,
    pair_capacity,
    pair_split,
    smem_bytes_for,
    smem_threads_for,
)
from .gpu_split_chunks import SharedBuffer
from .row_math import accum_dtype, vector_width

# `ce_pair_kernel`'s partials a row: two exchanges of (rank 0, rank 1)
# pairs, each in a 128-byte line of its own (float64: two).
comptime CE_PAIR_SLOTS = 64


@always_inline
def _pair_row_stats[
    dtype: DType, with_grad: Bool, V: Int, T: Int
](
    xp: Pointer[Scalar[dtype], MutAnyOrigin],
    smem: SharedBuffer[dtype],
    p: SmemRowShare,
    mut regs: SIMD[dtype, V * REG_CHUNKS],
    mut edge: SIMD[accum_dtype[dtype](), 2],
    slots: Pointer[Scalar[accum_dtype[dtype]()], MutAnyOrigin],
    rank: Int,
    eps: Scalar[accum_dtype[dtype]()],
) -> Tuple[
    Scalar[accum_dtype[dtype]()],
    Scalar[accum_dtype[dtype]()],
    Scalar[accum_dtype[dtype]()],
]:
    """Sweeps 1 and 2 of `ce_pair_kernel` over this block's part `p` (from
    `xp`), each followed by an exchange with the other block (`slots`: the
    row's `CE_PAIR_SLOTS`): the whole row's max, sum of exp(x - max) and
    (label smoothing) sum of x."""
    comptime acc = accum_dtype[dtype]()
    var m = smem_row_max[dtype, V, T](xp, smem, p, regs, edge)
    var row_max = cluster_exchange[acc, 2](slots, rank, p.t, m, 0)[
        0
    ].reduce_max()
    var sums = smem_row_stats[dtype, with_grad, V, T](
        xp, smem, p, regs, edge, row_max, eps
    )
    var both = cluster_exchange[acc, 2](
        slots.unsafe_offset(CE_PAIR_SLOTS // 2), rank, p.t, sums[0], sums[1]
    )
    return (row_max, both[0].reduce_add(), both[1].reduce_add())


@__llvm_metadata(
    MAX_THREADS_PER_BLOCK_METADATA=StaticTuple[Int32, 1](Int32(T)),
    `nvvm.minctasm`=SIMDLength(2 if T == SMEM_HALF_THREADS else 1),
)
def ce_pair_kernel[
    dtype: DType, with_grad: Bool, mean: Bool, reduce: Bool, V: Int, T: Int
](
    dlogits: Pointer[Scalar[dtype], MutAnyOrigin],
    logits: Pointer[Scalar[dtype], MutAnyOrigin],
    targets: Pointer[Int64, MutAnyOrigin],
    options: Pointer[Float64, MutAnyOrigin],
    count: Pointer[Float64, MutAnyOrigin],
    row_losses: Pointer[Scalar[accum_dtype[dtype]()], MutAnyOrigin],
    loss: Pointer[Scalar[dtype], MutAnyOrigin],
    partials: Pointer[Scalar[accum_dtype[dtype]()], MutAnyOrigin],
    n: Int64,
    aligned_flag: Int32,
):
    """Cross-entropy of rows too long for one SM (to `pair_capacity(V)`),
    a row per thread-block cluster of two T-thread blocks, read once: each
    block holds its part of the row on chip as `ce_smem_kernel` holds a
    row (`pair_split`), and the parts' max, then sums, meet through
    `partials` (`CE_PAIR_SLOTS` a row) at two cluster barriers. Arguments as
    `ce_smem_kernel`; `grid_dim.x` = 2 x rows, clusters of 2.
    """
    comptime acc = accum_dtype[dtype]()
    comptime assert acc.is_floating_point()
    var t = Int(thread_idx.x)
    var rank = Int(block_rank_in_cluster())
    var row = Int(block_idx.x) // 2
    var len = Int(n)
    var start = row * len
    var x = logits.unsafe_offset(start)
    var split = pair_split[V](start, len, aligned_flag)
    var first = 0 if rank == 0 else split
    var part = split if rank == 0 else len - split
    var xp = x.unsafe_offset(first)
    var p = smem_row_share[V, T](t, start + first, part, aligned_flag)
    var opts = ce_options[acc](options)
    var eps = opts[1]
    var tgt = targets[unsafe_offset=row]
    # The same for both blocks of the cluster: the cluster barriers inside
    # the branch are reached by every thread of both or by none.
    var kind = target_kind(tgt, opts[0], len)
    var smem = external_memory[
        Scalar[dtype], address_space=AddressSpace.SHARED, alignment=16
    ]()
    var regs = SIMD[dtype, V * REG_CHUNKS](0)
    var edge = SIMD[acc, 2](-inf[acc]())
    var value = Scalar[acc](0)
    var row_max = Scalar[acc](0)
    var inv_s = Scalar[acc](0)
    var x_t = Scalar[acc](0)
    if kind == KEPT:
        x_t = x[unsafe_offset=Int(tgt)].cast[acc]()
        var stats = _pair_row_stats[dtype, with_grad, V, T](
            xp,
            smem,
            p,
            regs,
            edge,
            partials.unsafe_offset(row * CE_PAIR_SLOTS),
            rank,
            eps,
        )
        row_max = stats[0]
        value = row_loss[acc](row_max, stats[1], x_t, stats[2], eps, len)
        inv_s = 1 / stats[1]
    elif kind != IGNORED:
        value = nan[acc]()
    if t == 0 and rank == 0:
        comptime if reduce:
            row_losses[unsafe_offset=row] = value
        else:
            loss[unsafe_offset=row] = value.cast[dtype]()
    comptime if with_grad:
        var y = dlogits.unsafe_offset(start + first)
        if kind != KEPT:
            var fill = Scalar[dtype](0) if kind == IGNORED else nan[dtype]()
            fill_row[dtype, V, T](
                y, p.t, p.head, p.nvec, p.tail_begin, part, fill
            )
            return
        smem_row_grad[dtype, mean, V, T, True](
            y,
            xp,
            smem,
            p,
            regs,
            edge,
            count,
            row_max,
            inv_s,
            x_t,
            eps,
            len,
            kind,
            Int(tgt) - first,
        )


def launch_ce_pair[
    dtype: DType, with_grad: Bool, mean: Bool, reduce: Bool
](
    ctx: DeviceContext,
    dlogits: Pointer[Scalar[dtype], MutAnyOrigin],
    logits: Pointer[Scalar[dtype], MutAnyOrigin],
    targets: Pointer[Int64, MutAnyOrigin],
    options: Pointer[Float64, MutAnyOrigin],
    count: Pointer[Float64, MutAnyOrigin],
    row_losses: Pointer[Scalar[accum_dtype[dtype]()], MutAnyOrigin],
    loss: Pointer[Scalar[dtype], MutAnyOrigin],
    rows: Int,
    n: Int,
    aligned: Bool,
) raises:
    """Launch `ce_pair_kernel` on `rows` rows of `n`: clusters of two
    blocks a row, each with the shared memory its part needs (parts of at
    most (n + 1) / 2 + 2V elements), and `CE_PAIR_SLOTS` partials a row. Raises past
    `pair_capacity(V)`."""
    comptime V = vector_width[dtype]()
    comptime acc = accum_dtype[dtype]()
    if n > pair_capacity(V):
        raise Error(
            "max_softmax: the cross-entropy 'pair' kernel handles rows up to "
            + String(pair_capacity(V))
            + " classes, got "
            + String(n)
        )
    var part = (n + 1) // 2 + 2 * V
    var threads = smem_threads_for(part, V)
    var smem_bytes = smem_bytes_for(part, V, threads)
    var partials = ctx.enqueue_create_buffer[acc](rows * CE_PAIR_SLOTS)
    var partials_ptr = rebind[Pointer[Scalar[acc], MutAnyOrigin]](
        partials.unsafe_ptr()
    )
    comptime for T in [SMEM_HALF_THREADS, SMEM_THREADS]:
        if threads == T:
            comptime kernel = ce_pair_kernel[
                dtype, with_grad, mean, reduce, V, T
            ]
            ctx.enqueue_function[kernel](
                dlogits,
                logits,
                targets,
                options,
                count,
                row_losses,
                loss,
                partials_ptr,
                Int64(n),
                aligned_flag_of(aligned),
                grid_dim=2 * rows,
                block_dim=T,
                cluster_dim=Dim(2),
                shared_mem_bytes=smem_bytes,
                func_attribute=FuncAttribute.MAX_DYNAMIC_SHARED_SIZE_BYTES(
                    UInt32(smem_bytes)
                ),
            )
    # Freed in stream order, after the kernel.
    _ = partials^
