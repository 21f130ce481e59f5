"""GPU cross-entropy (and its gradient), fused: a row's logits are reduced
(max, sum of exp, and for label smoothing the sum) and its loss and
gradient written in one kernel.

Launches, in stream order, with no host synchronisation (so the op stays
capturable for device-graph replay):

1. "mean" only: `ce_count_kernel`, one block over the targets, counts the
   rows kept (target != ignore_index) into a float64 word: the gradient's
   scale 1 / count must be known before any gradient is written, and
   counting 8 bytes a row first is what keeps the logits read once.
2. The row kernel, choosing by rows and row length like the softmax
   table (`ce_kernel_for`):
   - rows that a register plan holds (to 32K values, gpu_register_rows;
     to 256 threads a row where the smem kernel can take the rows):
     `ce_register_kernel`, 8 to 512 threads a row, the row loaded once
     into registers with the softmax kernels' chunk loaders and plan
     launcher, reduced with warp shuffles, the gradient written once;
   - at least SPLIT_BELOW_ROWS rows to `smem_capacity(V)` (~74K fp32,
     ~148K 16-bit classes): `ce_smem_kernel`, a block per row holding it
     on chip as the softmax forward's gpu_smem_rows (registers, the rest
     in shared memory by cp.async), read once, the gradient written once;
   - as many rows to `pair_capacity(V)` (~148K fp32, ~296K 16-bit
     classes): `ce_pair_kernel`, a thread-block cluster of two such blocks
     a row, each holding half of it, their (max, sum) partials exchanged
     through global memory at cluster barriers: read once;
   - longer rows, or fewer: `ce_block_kernel`, a block per row: an online
     (max, sum) pass, then, with the gradient, a pass that re-reads the
     row (mostly from L2) to write it. Loss-only reads the row once.
   A row's loss goes to a float32 (float64 for float64) workspace for
   "mean"/"sum", or straight to the output for "none".
3. "mean"/"sum": `ce_reduce_kernel`, one block, sums the row losses in a
   fixed order (repeatable, unlike atomics) and divides by the count.

A target out of range that is not ignore_index cannot raise here without
a host sync: that row's loss and gradient are NaN, so a reduced loss is NaN
(the Python front doors check targets on the host where they are there).
Ignored and out-of-range rows skip the logits: nothing is loaded for them.
"""

from max.gpu import (
    MAX_THREADS_PER_BLOCK_METADATA,
    WARP_SIZE,
    block_idx,
    thread_idx,
)
from max.gpu.host import DeviceContext, Dim, FuncAttribute
from max.gpu.memory import AddressSpace, external_memory
from max.gpu.primitives.cluster import block_rank_in_cluster, cluster_sync
from std.math import exp2
from std.sys import size_of
from std.utils import StaticTuple
from std.utils.numerics import inf, nan

from .cross_entropy_math import (
    IGNORED,
    KEPT,
    grad_of,
    row_loss,
    smoothing_of,
    target_grad,
    target_kind,
)
from .dispatch import SPLIT_BELOW_ROWS
from .gpu_launch import HeldRows, aligned16, aligned_flag_of, held, kernel_arg
from .gpu_launch import vector_flag_of
from .gpu_reductions import block_max, block_max_sum, block_sum
from .gpu_register_rows import (
    MAX_PLAN_THREADS,
    MAX_ROW_REGISTERS,
    RegisterPlanKernel,
    block_threads,
    chunk_registers,
    launch_register_plan,
    load_row_chunks,
    min_blocks_per_sm,
    plan_threads,
    register_plan,
    store_row_chunks,
)
from .gpu_smem_rows import (
    REG_CHUNKS,
    SMEM_HALF_THREADS,
    SMEM_THREADS,
    load_row,
    pair_capacity,
    pair_split,
    smem_bytes_for,
    smem_capacity,
    smem_threads_for,
)
from .gpu_split_chunks import SharedBuffer
from .row_math import (
    accum_dtype,
    exp_nan,
    online_add,
    online_sum_guard,
    vector_width,
)

# Threads of the one-block count and reduce kernels.
comptime CE_SMALL_THREADS = 1024
# Rows longer than the register plans: a block of this many threads a row.
comptime CE_BLOCK_THREADS = 512
# Most threads a row of the register plans that many rows keep (rows to
# 4096 fp32, 8192 16-bit, 2048 float64 classes); longer rows go to the
# smem kernel (`ce_kernel_for`).
comptime CE_PLAN_THREADS = 256
# `ce_pair_kernel`'s partials a row: two exchanges of (rank 0, rank 1)
# pairs, each in a 128-byte line of its own (float64: two).
comptime CE_PAIR_SLOTS = 64

# 16-bit rows on chip: after sweep 2, `ce_smem_kernel` keeps exp(x - max)
# * 2^HELD_EXP_SHIFT in place of each logit, in the logits' own type, so the
# gradient sweep computes no exp (`_holds_exp`). The shift keeps float16's
# full precision down to exp(x - max) = 2^-29 (subnormals to 2^-39), below
# which a float16 gradient is subnormal or 0 anyway; the largest value,
# 2^15, stays under float16's 65504. bfloat16 holds any exp, rounded to 8
# bits: without label smoothing the gradient, rounded again, is within one
# bfloat16 ulp of the correctly rounded value (~74% equal on normal logits),
# float16 within one float16 ulp; with smoothing, entries where p ~ eps / V
# nearly cancel and keep the held exp's absolute error (up to 2^-9 x eps / V
# x scale in bfloat16), many ulps of a result near 0.
comptime HELD_EXP_SHIFT = 15
comptime LOG2E = 1.4426950408889634


@always_inline
def _options[
    acc: DType
](options: Pointer[Float64, MutAnyOrigin]) -> Tuple[Int64, Scalar[acc]]:
    """(ignore_index, label smoothing) from the device's options tensor."""
    return (
        Int64(options[unsafe_offset=0]),
        options[unsafe_offset=1].cast[acc](),
    )


@always_inline
def _scale[
    acc: DType, mean: Bool
](count: Pointer[Float64, MutAnyOrigin]) -> Scalar[acc]:
    """The gradient's scale: 1 / rows kept for "mean", else 1."""
    comptime if mean:
        return Scalar[acc](1 / count[unsafe_offset=0])
    return Scalar[acc](1)


# Launch bounds: without them ptxas may give a 1024-thread kernel more
# registers than a block has (CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES).
@__llvm_metadata(
    MAX_THREADS_PER_BLOCK_METADATA=StaticTuple[Int32, 1](
        Int32(CE_SMALL_THREADS)
    )
)
def ce_count_kernel(
    count: Pointer[Float64, MutAnyOrigin],
    targets: Pointer[Int64, MutAnyOrigin],
    options: Pointer[Float64, MutAnyOrigin],
    rows: Int64,
):
    """Count the rows whose target is not ignore_index into `count[0]`
    (float64: exact to 2^53 rows); one block of CE_SMALL_THREADS."""
    var t = Int(thread_idx.x)
    var ignore_index = Int64(options[unsafe_offset=0])
    var c = Float64(0)
    for r in range(t, Int(rows), CE_SMALL_THREADS):
        if targets[unsafe_offset=r] != ignore_index:
            c += 1
    var total = block_sum[DType.float64, CE_SMALL_THREADS](c)
    if t == 0:
        count[unsafe_offset=0] = total


@__llvm_metadata(
    MAX_THREADS_PER_BLOCK_METADATA=StaticTuple[Int32, 1](
        Int32(CE_SMALL_THREADS)
    )
)
def ce_reduce_kernel[
    dtype: DType, mean: Bool
](
    loss: Pointer[Scalar[dtype], MutAnyOrigin],
    row_losses: Pointer[Scalar[accum_dtype[dtype]()], MutAnyOrigin],
    count: Pointer[Float64, MutAnyOrigin],
    rows: Int64,
):
    """`loss[0]` = the sum of the row losses (over the count for "mean":
    0 / 0 = NaN when every row is ignored, as torch); one block of
    CE_SMALL_THREADS, always the same order of additions."""
    comptime acc = accum_dtype[dtype]()
    comptime assert acc.is_floating_point()
    var t = Int(thread_idx.x)
    var s = Scalar[acc](0)
    for r in range(t, Int(rows), CE_SMALL_THREADS):
        s += row_losses[unsafe_offset=r]
    var total = block_sum[acc, CE_SMALL_THREADS](s)
    if t == 0:
        comptime if mean:
            total = total / Scalar[acc](count[unsafe_offset=0])
        loss[unsafe_offset=0] = total.cast[dtype]()


@always_inline
def _held_index[
    threads: Int, V: Int
](k: Int, v: Int, t: Int, vector_loads: Bool) -> Int:
    """Which element of the row thread t holds at lane v of chunk k: the
    layout of `load_row_chunks` (gpu_register_rows)."""
    if vector_loads:
        return (k * threads + t) * V + v
    return (k * V + v) * threads + t


@always_inline
def _held_sum[
    dtype: DType, threads: Int, V: Int, K: Int
](raw: SIMD[dtype, V * K], t: Int, vector_loads: Bool, load_len: Int) -> Scalar[
    accum_dtype[dtype]()
]:
    """This thread's sum of the row values it holds (label smoothing's sum
    of x), padding left out."""
    comptime acc = accum_dtype[dtype]()
    var part = Scalar[acc](0)
    comptime for k in range(K):
        comptime for v in range(V):
            if _held_index[threads, V](k, v, t, vector_loads) < load_len:
                part += raw[k * V + v].cast[acc]()
    return part


@always_inline
def _held_grad[
    dtype: DType, threads: Int, V: Int, K: Int
](
    raw: SIMD[dtype, V * K],
    row_max: Scalar[accum_dtype[dtype]()],
    inv_s: Scalar[accum_dtype[dtype]()],
    smooth: Scalar[accum_dtype[dtype]()],
    scale: Scalar[accum_dtype[dtype]()],
    g_t: Scalar[dtype],
    tgt: Int,
    t: Int,
    vector_loads: Bool,
) -> SIMD[dtype, V * K]:
    """The gradient of the row values this thread holds: (softmax - eps/V)
    * scale, with `g_t` at the target's entry."""
    comptime acc = accum_dtype[dtype]()
    var out = SIMD[dtype, V * K](0)
    comptime for k in range(K):
        out = out.insert[offset=k * V](
            grad_of[acc, V](
                exp_nan[acc, V](
                    raw.slice[V, offset=k * V]().cast[acc]() - row_max
                ),
                inv_s,
                smooth,
                scale,
            ).cast[dtype]()
        )
    comptime for k in range(K):
        comptime for v in range(V):
            if _held_index[threads, V](k, v, t, vector_loads) == tgt:
                out[k * V + v] = g_t
    return out


@always_inline
def _held_loss[
    dtype: DType, threads: Int, block: Int, V: Int, K: Int
](
    raw: SIMD[dtype, V * K],
    t: Int,
    vector_loads: Bool,
    load_len: Int,
    kind: Int,
    x_t: Scalar[accum_dtype[dtype]()],
    eps: Scalar[accum_dtype[dtype]()],
    n: Int,
) -> Tuple[
    Scalar[accum_dtype[dtype]()],
    Scalar[accum_dtype[dtype]()],
    Scalar[accum_dtype[dtype]()],
]:
    """The row's (max, sum of exp, loss) from the chunks its threads hold,
    reduced over the row's threads; the loss is NaN for a bad target and 0
    for an ignored row."""
    comptime acc = accum_dtype[dtype]()
    var m = -inf[acc]()
    comptime for k in range(K):
        m = max(m, raw.slice[V, offset=k * V]().cast[acc]().reduce_max())
    var row_max = block_max[acc, threads, block](m)
    var s = Scalar[acc](0)
    comptime for k in range(K):
        s += exp_nan[acc, V](
            raw.slice[V, offset=k * V]().cast[acc]() - row_max
        ).reduce_add()
    var row_sum = block_sum[acc, threads, block](s)
    var sum_x = Scalar[acc](0)
    if eps != 0:  # the same for every thread: the reduction stays uniform
        sum_x = block_sum[acc, threads, block](
            _held_sum[dtype, threads, V, K](raw, t, vector_loads, load_len)
        )
    var value = Scalar[acc](0)
    if kind == KEPT:
        value = row_loss[acc](row_max, row_sum, x_t, sum_x, eps, n)
    elif kind != IGNORED:
        value = nan[acc]()
    return (row_max, row_sum, value)


@always_inline
def _held_grad_row[
    dtype: DType, mean: Bool, threads: Int, V: Int, K: Int
](
    raw: SIMD[dtype, V * K],
    count: Pointer[Float64, MutAnyOrigin],
    row_max: Scalar[accum_dtype[dtype]()],
    row_sum: Scalar[accum_dtype[dtype]()],
    x_t: Scalar[accum_dtype[dtype]()],
    eps: Scalar[accum_dtype[dtype]()],
    n: Int,
    kind: Int,
    tgt: Int,
    t: Int,
    vector_loads: Bool,
) -> SIMD[dtype, V * K]:
    """The gradient of the row values this thread holds: `_held_grad` for a
    kept row, zeros for an ignored one, NaN for a bad target."""
    comptime acc = accum_dtype[dtype]()
    var scale = _scale[acc, mean](count)
    var smooth = smoothing_of[acc](eps, n)
    var inv_s = 1 / row_sum
    if kind == KEPT:
        var g_t = target_grad[acc](
            exp_nan[acc, 1](x_t - row_max) * inv_s, smooth, eps, scale
        ).cast[dtype]()
        return _held_grad[dtype, threads, V, K](
            raw, row_max, inv_s, smooth, scale, g_t, tgt, t, vector_loads
        )
    if kind != IGNORED:
        return SIMD[dtype, V * K](nan[dtype]())
    return SIMD[dtype, V * K](0)


@__llvm_metadata(
    MAX_THREADS_PER_BLOCK_METADATA=StaticTuple[Int32, 1](
        Int32(block_threads[threads]())
    ),
    `nvvm.minctasm`=SIMDLength(min_blocks_per_sm[dtype, threads, K]()),
)
def ce_register_kernel[
    dtype: DType,
    with_grad: Bool,
    mean: Bool,
    reduce: Bool,
    threads: Int,
    V: Int,
    K: Int,
](
    dlogits: Pointer[Scalar[dtype], MutAnyOrigin],
    logits: Pointer[Scalar[dtype], MutAnyOrigin],
    targets: Pointer[Int64, MutAnyOrigin],
    options: Pointer[Float64, MutAnyOrigin],
    count: Pointer[Float64, MutAnyOrigin],
    row_losses: Pointer[Scalar[accum_dtype[dtype]()], MutAnyOrigin],
    loss: Pointer[Scalar[dtype], MutAnyOrigin],
    rows: Int64,
    n: Int64,
    vector_flag: Int32,
):
    """Cross-entropy of rows of `n <= threads * V * K` held in registers.

    Parameters:
        dtype: Element type of logits, loss and gradient.
        with_grad: Write the gradient into `dlogits`.
        mean: Scale the gradient by 1 / `count[0]`.
        reduce: Row losses go to `row_losses` (else to `loss`, in dtype).
        threads: Threads per row (as `register_rows_kernel`).
        V: Elements per 16-byte chunk.
        K: Chunks per thread.

    Args:
        dlogits: Gradient rows (written only `with_grad`).
        logits: Logit rows.
        targets: A class index a row.
        options: (ignore_index, label smoothing), float64.
        count: Rows kept (read only for `mean`).
        row_losses: A loss a row, accumulator type (written if `reduce`).
        loss: A loss a row in dtype (written unless `reduce`).
        rows: Number of rows.
        n: Row length (classes).
        vector_flag: Nonzero when row starts are 16-byte aligned.
    """
    comptime acc = accum_dtype[dtype]()
    comptime assert acc.is_floating_point()
    comptime assert chunk_registers(V) * K <= MAX_ROW_REGISTERS
    comptime block = block_threads[threads]()
    var vector_loads = vector_flag != 0
    var t = Int(thread_idx.x) % threads
    var row = (
        Int(block_idx.x) * (block // threads) + Int(thread_idx.x) // threads
    )
    # Past the last row: stay for the block's barriers and touch nothing
    # (as register_rows_kernel).
    var len = Int(n)
    var live = row < Int(rows)
    if not live:
        comptime if threads == WARP_SIZE:
            return
        len = 0
        row = 0
    var opts = _options[acc](options)
    var eps = opts[1]
    var tgt = targets[unsafe_offset=row]
    var kind = target_kind(tgt, opts[0], Int(n))
    var x = logits.unsafe_offset(row * Int(n))
    # Ignored and bad rows load nothing (in LLM batches, padding rows are
    # ignored, and many); every thread still takes part in the reductions.
    var load_len = len if kind == KEPT else 0
    var raw = load_row_chunks[dtype, threads, V, K, dtype](
        x, load_len, t, vector_loads, -inf[dtype]()
    )
    var x_t = x[unsafe_offset=Int(tgt)].cast[acc]() if kind == KEPT else Scalar[
        acc
    ](0)
    var (row_max, row_sum, value) = _held_loss[dtype, threads, block, V, K](
        raw, t, vector_loads, load_len, kind, x_t, eps, Int(n)
    )
    if live and t == 0:
        comptime if reduce:
            row_losses[unsafe_offset=row] = value
        else:
            loss[unsafe_offset=row] = value.cast[dtype]()
    comptime if with_grad:
        var out = _held_grad_row[dtype, mean, threads, V, K](
            raw,
            count,
            row_max,
            row_sum,
            x_t,
            eps,
            Int(n),
            kind,
            Int(tgt),
            t,
            vector_loads,
        )
        store_row_chunks[dtype, threads, V, K, dtype](
            dlogits.unsafe_offset(row * Int(n)), out, len, t, vector_loads
        )


@always_inline
def _online_pass[
    dtype: DType, V: Int, T: Int
](
    x: Pointer[Scalar[dtype], MutAnyOrigin],
    t: Int,
    head: Int,
    nvec: Int,
    tail_begin: Int,
    len: Int,
) -> Tuple[
    Scalar[accum_dtype[dtype]()],
    Scalar[accum_dtype[dtype]()],
    Scalar[accum_dtype[dtype]()],
]:
    """Thread `t`'s share of the row: its online (max, sum of exp) pair
    and its plain sum (for label smoothing)."""
    comptime acc = accum_dtype[dtype]()
    var m = -inf[acc]()
    var s = Scalar[acc](0)
    var sx = Scalar[acc](0)
    for i in range(t, nvec, T):
        var v = (
            x.unsafe_offset(head + i * V)
            .unsafe_load[width=V, alignment=16]()
            .cast[acc]()
        )
        (m, s) = online_add[acc, V](m, s, v)
        sx += v.reduce_add()
    for e in range(t, head, T):
        var v = x[unsafe_offset=e].cast[acc]()
        (m, s) = online_add[acc, 1](m, s, v)
        sx += v
    for e in range(tail_begin + t, len, T):
        var v = x[unsafe_offset=e].cast[acc]()
        (m, s) = online_add[acc, 1](m, s, v)
        sx += v
    return (m, s, sx)


@always_inline
def _write_grad[
    dtype: DType, V: Int, T: Int
](
    y: Pointer[Scalar[dtype], MutAnyOrigin],
    x: Pointer[Scalar[dtype], MutAnyOrigin],
    t: Int,
    head: Int,
    nvec: Int,
    tail_begin: Int,
    len: Int,
    kind: Int,
    fill: Scalar[dtype],
    row_max: Scalar[accum_dtype[dtype]()],
    inv_s: Scalar[accum_dtype[dtype]()],
    smooth: Scalar[accum_dtype[dtype]()],
    scale: Scalar[accum_dtype[dtype]()],
):
    """Thread `t`'s share of the row's gradient into `y` (`fill` for rows
    not kept), from a second read of the logits `x`: the vector body, then
    the scalar head and tail. The target's entry is fixed up after."""
    comptime acc = accum_dtype[dtype]()
    for i in range(t, nvec, T):
        var out = SIMD[dtype, V](fill)
        if kind == KEPT:
            var v = (
                x.unsafe_offset(head + i * V)
                .unsafe_load[width=V, alignment=16]()
                .cast[acc]()
            )
            out = grad_of[acc, V](
                exp_nan[acc, V](v - row_max), inv_s, smooth, scale
            ).cast[dtype]()
        y.unsafe_offset(head + i * V).unsafe_store[alignment=16](out)
    for e in range(t, head, T):
        y[unsafe_offset=e] = _scalar_grad[dtype](
            x, e, kind, fill, row_max, inv_s, smooth, scale
        )
    for e in range(tail_begin + t, len, T):
        y[unsafe_offset=e] = _scalar_grad[dtype](
            x, e, kind, fill, row_max, inv_s, smooth, scale
        )


@__llvm_metadata(MAX_THREADS_PER_BLOCK_METADATA=StaticTuple[Int32, 1](Int32(T)))
def ce_block_kernel[
    dtype: DType, with_grad: Bool, mean: Bool, reduce: Bool, V: Int, T: Int
](
    dlogits: Pointer[Scalar[dtype], MutAnyOrigin],
    logits: Pointer[Scalar[dtype], MutAnyOrigin],
    targets: Pointer[Int64, MutAnyOrigin],
    options: Pointer[Float64, MutAnyOrigin],
    count: Pointer[Float64, MutAnyOrigin],
    row_losses: Pointer[Scalar[accum_dtype[dtype]()], MutAnyOrigin],
    loss: Pointer[Scalar[dtype], MutAnyOrigin],
    n: Int64,
    aligned_flag: Int32,
):
    """Cross-entropy of rows of any length, a block of T threads a row:
    online (max, sum of exp) over the row, then the gradient from a second
    read. Arguments as `ce_register_kernel`; `aligned_flag` is nonzero when
    the buffers start 16-byte aligned (each row then has a scalar head,
    an aligned vector body and a scalar tail, as in gpu_smem_rows)."""
    comptime acc = accum_dtype[dtype]()
    comptime assert acc.is_floating_point()
    var t = Int(thread_idx.x)
    var row = Int(block_idx.x)
    var len = Int(n)
    var start = row * len
    var x = logits.unsafe_offset(start)
    var head = min((V - start % V) % V, len) if aligned_flag != 0 else len
    var nvec = (len - head) // V
    var tail_begin = head + nvec * V
    var opts = _options[acc](options)
    var eps = opts[1]
    var tgt = targets[unsafe_offset=row]
    var kind = target_kind(tgt, opts[0], len)
    var scale = _scale[acc, mean](count)
    var smooth = smoothing_of[acc](eps, len)
    # kind is the same for the whole block, so the reductions inside the
    # branch are reached by every thread or by none.
    var value = Scalar[acc](0)
    var row_max = Scalar[acc](0)
    var inv_s = Scalar[acc](0)
    var x_t = Scalar[acc](0)
    if kind == KEPT:
        var part = _online_pass[dtype, V, T](x, t, head, nvec, tail_begin, len)
        var pair = block_max_sum[acc, T](part[0], part[1])
        row_max = pair[0]
        var row_sum = online_sum_guard[acc](pair[0], pair[1])
        var sum_x = block_sum[acc, T](part[2]) if eps != 0 else Scalar[acc](0)
        x_t = x[unsafe_offset=Int(tgt)].cast[acc]()
        value = row_loss[acc](row_max, row_sum, x_t, sum_x, eps, len)
        inv_s = 1 / row_sum
    elif kind != IGNORED:
        value = nan[acc]()
    if t == 0:
        comptime if reduce:
            row_losses[unsafe_offset=row] = value
        else:
            loss[unsafe_offset=row] = value.cast[dtype]()
    comptime if with_grad:
        var y = dlogits.unsafe_offset(start)
        var fill = Scalar[dtype](0) if kind == IGNORED else nan[dtype]()
        _write_grad[dtype, V, T](
            y,
            x,
            t,
            head,
            nvec,
            tail_begin,
            len,
            kind,
            fill,
            row_max,
            inv_s,
            smooth,
            scale,
        )
        # The target's entry, by the thread that wrote it (its vector or
        # scalar store above came first in program order).
        if kind == KEPT:
            if t == _target_owner[V, T](Int(tgt), head, tail_begin):
                y[unsafe_offset=Int(tgt)] = target_grad[acc](
                    exp_nan[acc, 1](x_t - row_max) * inv_s, smooth, eps, scale
                ).cast[dtype]()


@always_inline
def _scalar_grad[
    dtype: DType
](
    x: Pointer[Scalar[dtype], MutAnyOrigin],
    e: Int,
    kind: Int,
    fill: Scalar[dtype],
    row_max: Scalar[accum_dtype[dtype]()],
    inv_s: Scalar[accum_dtype[dtype]()],
    smooth: Scalar[accum_dtype[dtype]()],
    scale: Scalar[accum_dtype[dtype]()],
) -> Scalar[dtype]:
    """The gradient of element `e` outside the row's vector body."""
    comptime acc = accum_dtype[dtype]()
    if kind != KEPT:
        return fill
    return grad_of[acc, 1](
        exp_nan[acc, 1](x[unsafe_offset=e].cast[acc]() - row_max),
        inv_s,
        smooth,
        scale,
    ).cast[dtype]()


@always_inline
def _fill_row[
    dtype: DType, V: Int, T: Int
](
    y: Pointer[Scalar[dtype], MutAnyOrigin],
    t: Int,
    head: Int,
    nvec: Int,
    tail_begin: Int,
    len: Int,
    fill: Scalar[dtype],
):
    """Thread `t`'s share of a gradient row not kept (0 for an ignored row,
    NaN for a bad target), reading nothing."""
    for i in range(t, nvec, T):
        y.unsafe_offset(head + i * V).unsafe_store[alignment=16](
            SIMD[dtype, V](fill)
        )
    for e in range(t, head, T):
        y[unsafe_offset=e] = fill
    for e in range(tail_begin + t, len, T):
        y[unsafe_offset=e] = fill


@always_inline
def _target_owner[V: Int, T: Int](tgt: Int, head: Int, tail_begin: Int) -> Int:
    """The thread of a T-thread block that writes the row's element `tgt`
    in `_write_grad` and `ce_smem_kernel`: element e of the scalar head by
    thread e % T, vector i of the body by thread i % T, tail element
    tail_begin + j by thread j."""
    if tgt < head:
        return tgt % T
    if tgt >= tail_begin:
        return (tgt - tail_begin) % T
    return ((tgt - head) // V) % T


@fieldwise_init
struct _SmemRowShare(ImplicitlyCopyable):
    """Thread `t`'s share of a row that `ce_smem_kernel` holds on chip: a
    scalar head up to the row's first 16-byte boundary (all of the row when
    the buffers themselves are unaligned: scalar throughout), `nvec`
    aligned vectors, a scalar tail. A head under V elements and the tail
    sit in the thread's `edge` pair; a longer (scalar) head is read from
    global memory at each sweep, from element `lead`."""

    var t: Int
    """The thread."""
    var head: Int
    """Elements before the vector body."""
    var nvec: Int
    """16-byte vectors of the body."""
    var tail_begin: Int
    """First element of the tail."""
    var len: Int
    """Row length."""
    var has_head: Bool
    """The thread holds head element `t` in `edge[0]`."""
    var has_tail: Bool
    """The thread holds tail element `tail_begin + t` in `edge[1]`."""
    var lead: Int
    """First element of a long head the thread reads from global memory."""


@always_inline
def _smem_row_share[
    V: Int, T: Int
](t: Int, start: Int, len: Int, aligned_flag: Int32) -> _SmemRowShare:
    """Thread `t`'s `_SmemRowShare` of the row of `len` from element
    `start` of the buffers."""
    var head = min((V - start % V) % V, len) if aligned_flag != 0 else len
    var nvec = (len - head) // V
    var tail_begin = head + nvec * V
    return _SmemRowShare(
        t,
        head,
        nvec,
        tail_begin,
        len,
        t < head and head < V,
        tail_begin + t < len,
        t + (T if head < V else 0),
    )


@always_inline
def _smem_row_max[
    dtype: DType, V: Int, T: Int
](
    x: Pointer[Scalar[dtype], MutAnyOrigin],
    smem: SharedBuffer[dtype],
    p: _SmemRowShare,
    mut regs: SIMD[dtype, V * REG_CHUNKS],
    mut edge: SIMD[accum_dtype[dtype](), 2],
) -> Scalar[accum_dtype[dtype]()]:
    """Sweep 1 of `ce_smem_kernel`: load the row on chip (`load_row`; the
    head and tail into `edge`) and reduce its max over the block."""
    comptime acc = accum_dtype[dtype]()
    var m = load_row[dtype, V, T](x, smem, p.t, p.head, p.nvec, regs)
    if p.has_head:
        edge[0] = x[unsafe_offset=p.t].cast[acc]()
    if p.has_tail:
        edge[1] = x[unsafe_offset=p.tail_begin + p.t].cast[acc]()
    m = max(m, edge.reduce_max())
    for e in range(p.lead, p.head, T):
        m = max(m, x[unsafe_offset=e].cast[acc]())
    return block_max[acc, T](m)


@always_inline
def _smem_row_sums[
    dtype: DType, V: Int, T: Int
](
    x: Pointer[Scalar[dtype], MutAnyOrigin],
    smem: SharedBuffer[dtype],
    p: _SmemRowShare,
    regs: SIMD[dtype, V * REG_CHUNKS],
    edge: SIMD[accum_dtype[dtype](), 2],
    row_max: Scalar[accum_dtype[dtype]()],
) -> Tuple[Scalar[accum_dtype[dtype]()], Scalar[accum_dtype[dtype]()]]:
    """Sweep 2 of `ce_smem_kernel`: thread `t`'s sums of exp(x - max) and
    of x (label smoothing) over its share of the on-chip copy. -inf
    padding in `edge` adds exp(-inf) = 0 to the first unless the row is
    all -inf (NaN anyway); the second leaves it out."""
    comptime acc = accum_dtype[dtype]()
    comptime R = REG_CHUNKS
    var s = Scalar[acc](0)
    var sx = Scalar[acc](0)
    comptime for k in range(R):
        if k * T + p.t < p.nvec:
            var v = regs.slice[V, offset=k * V]().cast[acc]()
            s += exp_nan[acc, V](v - row_max).reduce_add()
            sx += v.reduce_add()
    for i in range(R * T + p.t, p.nvec, T):
        var v = (
            smem.unsafe_offset((i - R * T) * V)
            .unsafe_load[width=V, alignment=16]()
            .cast[acc]()
        )
        s += exp_nan[acc, V](v - row_max).reduce_add()
        sx += v.reduce_add()
    s += exp_nan[acc, 2](edge - row_max).reduce_add()
    if p.has_head:
        sx += edge[0]
    if p.has_tail:
        sx += edge[1]
    for e in range(p.lead, p.head, T):
        var v = x[unsafe_offset=e].cast[acc]()
        s += exp_nan[acc, 1](v - row_max)
        sx += v
    return (s, sx)


@always_inline
def _smem_edges_grad[
    dtype: DType, V: Int, T: Int, part: Bool = False
](
    y: Pointer[Scalar[dtype], MutAnyOrigin],
    x: Pointer[Scalar[dtype], MutAnyOrigin],
    p: _SmemRowShare,
    edge: SIMD[accum_dtype[dtype](), 2],
    row_max: Scalar[accum_dtype[dtype]()],
    inv_s: Scalar[accum_dtype[dtype]()],
    smooth: Scalar[accum_dtype[dtype]()],
    scale: Scalar[accum_dtype[dtype]()],
    x_t: Scalar[accum_dtype[dtype]()],
    eps: Scalar[accum_dtype[dtype]()],
    kind: Int,
    tgt: Int,
):
    """The end of sweep 3 of `ce_smem_kernel`: the gradient of thread
    `t`'s head and tail elements (`edge`, a long head from global memory),
    then the target's entry by the thread that wrote it (its store came
    first in program order). With `part`, `p` is a part of the row and
    `tgt` (relative to it) may lie outside it."""
    comptime acc = accum_dtype[dtype]()
    var edges = grad_of[acc, 2](
        exp_nan[acc, 2](edge - row_max), inv_s, smooth, scale
    ).cast[dtype]()
    if p.has_head:
        y[unsafe_offset=p.t] = edges[0]
    if p.has_tail:
        y[unsafe_offset=p.tail_begin + p.t] = edges[1]
    for e in range(p.lead, p.head, T):
        y[unsafe_offset=e] = _scalar_grad[dtype](
            x, e, kind, Scalar[dtype](0), row_max, inv_s, smooth, scale
        )
    comptime if part:  # a part of the row (`ce_pair_kernel`)
        if tgt < 0 or tgt >= p.len:
            return
    if p.t == _target_owner[V, T](tgt, p.head, p.tail_begin):
        y[unsafe_offset=tgt] = target_grad[acc](
            exp_nan[acc, 1](x_t - row_max) * inv_s, smooth, eps, scale
        ).cast[dtype]()


@always_inline
def _smem_row_grad[
    dtype: DType, mean: Bool, V: Int, T: Int, part: Bool = False
](
    y: Pointer[Scalar[dtype], MutAnyOrigin],
    x: Pointer[Scalar[dtype], MutAnyOrigin],
    smem: SharedBuffer[dtype],
    p: _SmemRowShare,
    regs: SIMD[dtype, V * REG_CHUNKS],
    edge: SIMD[accum_dtype[dtype](), 2],
    count: Pointer[Float64, MutAnyOrigin],
    row_max: Scalar[accum_dtype[dtype]()],
    inv_s: Scalar[accum_dtype[dtype]()],
    x_t: Scalar[accum_dtype[dtype]()],
    eps: Scalar[accum_dtype[dtype]()],
    row_len: Int,
    kind: Int,
    tgt: Int,
):
    """Sweep 3 of `ce_smem_kernel` for a kept row: thread `t`'s share of
    the gradient into `y`, from the on-chip copy (for 16-bit rows from the
    exps it holds: `_smem_held_grad`); then the target's owner fixes its
    entry up. `row_len` is the whole row's (label smoothing spreads eps
    over every class, also where `p` holds only a part of the row)."""
    comptime acc = accum_dtype[dtype]()
    comptime R = REG_CHUNKS
    comptime if _holds_exp[dtype]():
        _smem_held_grad[dtype, mean, V, T, part](
            y,
            x,
            smem,
            p,
            regs,
            edge,
            count,
            row_max,
            inv_s,
            x_t,
            eps,
            row_len,
            kind,
            tgt,
        )
        return
    var scale = _scale[acc, mean](count)
    var smooth = smoothing_of[acc](eps, row_len)
    comptime for k in range(R):
        var i = k * T + p.t
        if i < p.nvec:
            y.unsafe_offset(p.head + i * V).unsafe_store[alignment=16](
                grad_of[acc, V](
                    exp_nan[acc, V](
                        regs.slice[V, offset=k * V]().cast[acc]() - row_max
                    ),
                    inv_s,
                    smooth,
                    scale,
                ).cast[dtype]()
            )
    for i in range(R * T + p.t, p.nvec, T):
        var v = smem.unsafe_offset((i - R * T) * V).unsafe_load[
            width=V, alignment=16
        ]()
        y.unsafe_offset(p.head + i * V).unsafe_store[alignment=16](
            grad_of[acc, V](
                exp_nan[acc, V](v.cast[acc]() - row_max),
                inv_s,
                smooth,
                scale,
            ).cast[dtype]()
        )
    _smem_edges_grad[dtype, V, T, part](
        y, x, p, edge, row_max, inv_s, smooth, scale, x_t, eps, kind, tgt
    )


@always_inline
def _holds_exp[dtype: DType]() -> Bool:
    """Whether `ce_smem_kernel` holds exp(x - max) instead of the logits
    after sweep 2: 16-bit rows, where two exps a value (one for the sum,
    one for the gradient) kept the SM busy while HBM idled (78-81% of copy
    against float32's 96%)."""
    return size_of[dtype]() == 2


@always_inline
def _held_exp[acc: DType, w: Int](d: SIMD[acc, w]) -> SIMD[acc, w]:
    """exp(d) * 2^HELD_EXP_SHIFT for d = x - max <= 0 (NaN stays NaN):
    one FMA and one `ex2.approx` an element on the GPU."""
    comptime assert acc.is_floating_point()
    return exp2(d.fma(Scalar[acc](LOG2E), Scalar[acc](HELD_EXP_SHIFT)))


@always_inline
def _smem_held_sums[
    dtype: DType, V: Int, T: Int, with_x: Bool
](
    x: Pointer[Scalar[dtype], MutAnyOrigin],
    smem: SharedBuffer[dtype],
    p: _SmemRowShare,
    mut regs: SIMD[dtype, V * REG_CHUNKS],
    edge: SIMD[accum_dtype[dtype](), 2],
    row_max: Scalar[accum_dtype[dtype]()],
) -> Tuple[Scalar[accum_dtype[dtype]()], Scalar[accum_dtype[dtype]()]]:
    """Sweep 2 of `ce_smem_kernel` for 16-bit rows (`_holds_exp`): thread
    `t`'s sums of `_held_exp`(x - max) (2^HELD_EXP_SHIFT x the sum of exp)
    and, `with_x` (label smoothing), of x, over its share; each vector of the
    on-chip copy is overwritten by its held exps, in `dtype`. Edge
    padding as in `_smem_row_sums`."""
    comptime acc = accum_dtype[dtype]()
    comptime R = REG_CHUNKS
    var s = Scalar[acc](0)
    var sx = Scalar[acc](0)
    comptime for k in range(R):
        if k * T + p.t < p.nvec:
            var v = regs.slice[V, offset=k * V]().cast[acc]()
            var h = _held_exp[acc, V](v - row_max)
            s += h.reduce_add()
            comptime if with_x:
                sx += v.reduce_add()
            regs = regs.insert[offset=k * V](h.cast[dtype]())
    for i in range(R * T + p.t, p.nvec, T):
        var at = smem.unsafe_offset((i - R * T) * V)
        var v = at.unsafe_load[width=V, alignment=16]().cast[acc]()
        var h = _held_exp[acc, V](v - row_max)
        s += h.reduce_add()
        comptime if with_x:
            sx += v.reduce_add()
        at.unsafe_store[alignment=16](h.cast[dtype]())
    s += _held_exp[acc, 2](edge - row_max).reduce_add()
    if p.has_head:
        sx += edge[0]
    if p.has_tail:
        sx += edge[1]
    for e in range(p.lead, p.head, T):
        var v = x[unsafe_offset=e].cast[acc]()
        s += _held_exp[acc, 1](v - row_max)[0]
        sx += v
    return (s, sx)


@always_inline
def _smem_held_grad[
    dtype: DType, mean: Bool, V: Int, T: Int, part: Bool = False
](
    y: Pointer[Scalar[dtype], MutAnyOrigin],
    x: Pointer[Scalar[dtype], MutAnyOrigin],
    smem: SharedBuffer[dtype],
    p: _SmemRowShare,
    regs: SIMD[dtype, V * REG_CHUNKS],
    edge: SIMD[accum_dtype[dtype](), 2],
    count: Pointer[Float64, MutAnyOrigin],
    row_max: Scalar[accum_dtype[dtype]()],
    inv_s: Scalar[accum_dtype[dtype]()],
    x_t: Scalar[accum_dtype[dtype]()],
    eps: Scalar[accum_dtype[dtype]()],
    row_len: Int,
    kind: Int,
    tgt: Int,
):
    """Sweep 3 of `ce_smem_kernel` for 16-bit rows: the gradient of the
    vector body from the held exps (`_smem_held_sums`), h * (scale / sum)
    - eps / row_len * scale, one FMA an element; the edges and the target
    as `_smem_row_grad`."""
    comptime acc = accum_dtype[dtype]()
    comptime R = REG_CHUNKS
    var scale = _scale[acc, mean](count)
    var smooth = smoothing_of[acc](eps, row_len)
    var per_held = inv_s * Scalar[acc](2.0**-HELD_EXP_SHIFT) * scale
    var shift = -smooth * scale
    comptime for k in range(R):
        var i = k * T + p.t
        if i < p.nvec:
            var h = regs.slice[V, offset=k * V]().cast[acc]()
            y.unsafe_offset(p.head + i * V).unsafe_store[alignment=16](
                h.fma(per_held, shift).cast[dtype]()
            )
    for i in range(R * T + p.t, p.nvec, T):
        var h = (
            smem.unsafe_offset((i - R * T) * V)
            .unsafe_load[width=V, alignment=16]()
            .cast[acc]()
        )
        y.unsafe_offset(p.head + i * V).unsafe_store[alignment=16](
            h.fma(per_held, shift).cast[dtype]()
        )
    _smem_edges_grad[dtype, V, T, part](
        y, x, p, edge, row_max, inv_s, smooth, scale, x_t, eps, kind, tgt
    )


@always_inline
def _smem_row_stats[
    dtype: DType, with_grad: Bool, V: Int, T: Int
](
    x: Pointer[Scalar[dtype], MutAnyOrigin],
    smem: SharedBuffer[dtype],
    p: _SmemRowShare,
    mut regs: SIMD[dtype, V * REG_CHUNKS],
    edge: SIMD[accum_dtype[dtype](), 2],
    row_max: Scalar[accum_dtype[dtype]()],
    eps: Scalar[accum_dtype[dtype]()],
) -> Tuple[Scalar[accum_dtype[dtype]()], Scalar[accum_dtype[dtype]()]]:
    """Sweep 2 of `ce_smem_kernel` and its block reductions: the row's sum
    of exp(x - max) and, with label smoothing (`eps` != 0, the same for
    every thread), its sum of x. 16-bit rows hold their exps from here on
    for the gradient (`_holds_exp`; the loss alone needs no second exp).
    """
    comptime acc = accum_dtype[dtype]()
    comptime if with_grad and _holds_exp[dtype]():
        # The sum of x only with smoothing: two loops, not a select a value.
        var part = (Scalar[acc](0), Scalar[acc](0))
        if eps != 0:
            part = _smem_held_sums[dtype, V, T, True](
                x, smem, p, regs, edge, row_max
            )
        else:
            part = _smem_held_sums[dtype, V, T, False](
                x, smem, p, regs, edge, row_max
            )
        var row_sum = block_sum[acc, T](part[0]) * Scalar[acc](
            2.0**-HELD_EXP_SHIFT
        )
        var sum_x = block_sum[acc, T](part[1]) if eps != 0 else Scalar[acc](0)
        return (row_sum, sum_x)
    var part = _smem_row_sums[dtype, V, T](x, smem, p, regs, edge, row_max)
    var row_sum = block_sum[acc, T](part[0])
    var sum_x = block_sum[acc, T](part[1]) if eps != 0 else Scalar[acc](0)
    return (row_sum, sum_x)


@__llvm_metadata(
    MAX_THREADS_PER_BLOCK_METADATA=StaticTuple[Int32, 1](Int32(T)),
    `nvvm.minctasm`=SIMDLength(2 if T == SMEM_HALF_THREADS else 1),
)
def ce_smem_kernel[
    dtype: DType, with_grad: Bool, mean: Bool, reduce: Bool, V: Int, T: Int
](
    dlogits: Pointer[Scalar[dtype], MutAnyOrigin],
    logits: Pointer[Scalar[dtype], MutAnyOrigin],
    targets: Pointer[Int64, MutAnyOrigin],
    options: Pointer[Float64, MutAnyOrigin],
    count: Pointer[Float64, MutAnyOrigin],
    row_losses: Pointer[Scalar[accum_dtype[dtype]()], MutAnyOrigin],
    loss: Pointer[Scalar[dtype], MutAnyOrigin],
    n: Int64,
    aligned_flag: Int32,
):
    """Cross-entropy of rows of `n <= smem_capacity(V)` held on chip, a row
    per block of `T` threads (`smem_threads_for`), read once: the softmax
    forward's `smem_rows_kernel` layout (gpu_smem_rows), `REG_CHUNKS`
    vectors a thread in registers, the rest of the row in dynamic shared
    memory, the head and tail in the registers of the threads that load
    them (`_SmemRowShare`). Arguments as `ce_block_kernel`.

    Sweep 1 (`_smem_row_max`) loads the row and its max; sweep 2
    (`_smem_row_stats`) sums exp(x - max) and x (label smoothing) over the
    on-chip copy, and 16-bit rows keep their exps in it (`_holds_exp`);
    sweep 3 (`_smem_row_grad`) writes the gradient from it.
    """
    comptime acc = accum_dtype[dtype]()
    comptime assert acc.is_floating_point()
    var t = Int(thread_idx.x)
    var row = Int(block_idx.x)
    var len = Int(n)
    var start = row * len
    var x = logits.unsafe_offset(start)
    var p = _smem_row_share[V, T](t, start, len, aligned_flag)
    var opts = _options[acc](options)
    var eps = opts[1]
    var tgt = targets[unsafe_offset=row]
    var kind = target_kind(tgt, opts[0], len)
    var smem = external_memory[
        Scalar[dtype], address_space=AddressSpace.SHARED, alignment=16
    ]()
    var regs = SIMD[dtype, V * REG_CHUNKS](0)
    var edge = SIMD[acc, 2](-inf[acc]())
    # kind is the same for the whole block, so the reductions inside the
    # branch are reached by every thread or by none; rows not kept load
    # nothing.
    var value = Scalar[acc](0)
    var row_max = Scalar[acc](0)
    var inv_s = Scalar[acc](0)
    var x_t = Scalar[acc](0)
    if kind == KEPT:
        x_t = x[unsafe_offset=Int(tgt)].cast[acc]()
        row_max = _smem_row_max[dtype, V, T](x, smem, p, regs, edge)
        var sums = _smem_row_stats[dtype, with_grad, V, T](
            x, smem, p, regs, edge, row_max, eps
        )
        value = row_loss[acc](row_max, sums[0], x_t, sums[1], eps, len)
        inv_s = 1 / sums[0]
    elif kind != IGNORED:
        value = nan[acc]()
    if t == 0:
        comptime if reduce:
            row_losses[unsafe_offset=row] = value
        else:
            loss[unsafe_offset=row] = value.cast[dtype]()
    comptime if with_grad:
        var y = dlogits.unsafe_offset(start)
        if kind != KEPT:
            var fill = Scalar[dtype](0) if kind == IGNORED else nan[dtype]()
            _fill_row[dtype, V, T](
                y, p.t, p.head, p.nvec, p.tail_begin, len, fill
            )
            return
        _smem_row_grad[dtype, mean, V, T](
            y,
            x,
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
            Int(tgt),
        )


@always_inline
def _pair_exchange[
    acc: DType
](
    slots: Pointer[Scalar[acc], MutAnyOrigin],
    rank: Int,
    t: Int,
    a: Scalar[acc],
    b: Scalar[acc],
) -> Tuple[SIMD[acc, 2], SIMD[acc, 2]]:
    """Both blocks of a `ce_pair_kernel` cluster publish (a, b) (thread 0,
    into `slots[2 * rank]`, `slots[2 * rank + 1]`) and get both blocks'
    pairs back, (a0, a1) and (b0, b1), after a cluster barrier (release /
    acquire: the other block's stores are visible). `slots` has a 128-byte
    line to itself, read only after the barrier: no stale L1 copy."""
    if t == 0:
        slots[unsafe_offset=2 * rank] = a
        slots[unsafe_offset=2 * rank + 1] = b
    cluster_sync()
    return (
        SIMD[acc, 2](slots[unsafe_offset=0], slots[unsafe_offset=2]),
        SIMD[acc, 2](slots[unsafe_offset=1], slots[unsafe_offset=3]),
    )


@always_inline
def _pair_row_stats[
    dtype: DType, with_grad: Bool, V: Int, T: Int
](
    xp: Pointer[Scalar[dtype], MutAnyOrigin],
    smem: SharedBuffer[dtype],
    p: _SmemRowShare,
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
    var m = _smem_row_max[dtype, V, T](xp, smem, p, regs, edge)
    var row_max = _pair_exchange[acc](slots, rank, p.t, m, 0)[0].reduce_max()
    var sums = _smem_row_stats[dtype, with_grad, V, T](
        xp, smem, p, regs, edge, row_max, eps
    )
    var both = _pair_exchange[acc](
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
    var p = _smem_row_share[V, T](t, start + first, part, aligned_flag)
    var opts = _options[acc](options)
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
            _fill_row[dtype, V, T](
                y, p.t, p.head, p.nvec, p.tail_begin, part, fill
            )
            return
        _smem_row_grad[dtype, mean, V, T, True](
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


def launch_ce_smem[
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
    """Launch `ce_smem_kernel` on `rows` rows of `n`, a block a row with the
    shared memory the row needs (as `launch_smem_rows`). Raises past
    `smem_capacity(V)`."""
    comptime V = vector_width[dtype]()
    if n > smem_capacity(V):
        raise Error(
            "max_softmax: the cross-entropy 'smem' kernel handles rows up to "
            + String(smem_capacity(V))
            + " classes, got "
            + String(n)
        )
    var threads = smem_threads_for(n, V)
    var smem_bytes = smem_bytes_for(n, V, threads)
    comptime for T in [SMEM_HALF_THREADS, SMEM_THREADS]:
        if threads == T:
            comptime kernel = ce_smem_kernel[
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
                Int64(n),
                aligned_flag_of(aligned),
                grid_dim=rows,
                block_dim=T,
                shared_mem_bytes=smem_bytes,
                func_attribute=FuncAttribute.MAX_DYNAMIC_SHARED_SIZE_BYTES(
                    UInt32(smem_bytes)
                ),
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


@fieldwise_init
struct CERegisterRows[dtype: DType, with_grad: Bool, mean: Bool, reduce: Bool](
    RegisterPlanKernel
):
    """`ce_register_kernel` with its arguments, for `launch_register_plan`."""

    var dlogits: HeldRows[Self.dtype]
    """Gradient rows."""
    var logits: HeldRows[Self.dtype]
    """Logit rows."""
    var targets: HeldRows[DType.int64]
    """A class index a row."""
    var options: HeldRows[DType.float64]
    """(ignore_index, label smoothing)."""
    var count: HeldRows[DType.float64]
    """Rows kept ("mean")."""
    var row_losses: HeldRows[accum_dtype[Self.dtype]()]
    """A loss a row, accumulator type ("mean", "sum")."""
    var loss: HeldRows[Self.dtype]
    """A loss a row ("none")."""
    var rows: Int
    """Number of rows."""
    var n: Int
    """Row length."""
    var vector_flag: Int32
    """`vector_flag_of` the buffers and `n`."""

    def enqueue[
        T: Int, K: Int
    ](self, ctx: DeviceContext, grid: Int, block: Int) raises:
        """Enqueue `ce_register_kernel` for T threads a row, K chunks a
        thread."""
        comptime V = vector_width[Self.dtype]()
        comptime kernel = ce_register_kernel[
            Self.dtype, Self.with_grad, Self.mean, Self.reduce, T, V, K
        ]
        ctx.enqueue_function[kernel](
            kernel_arg(self.dlogits),
            kernel_arg(self.logits),
            kernel_arg(self.targets),
            kernel_arg(self.options),
            kernel_arg(self.count),
            kernel_arg(self.row_losses),
            kernel_arg(self.loss),
            Int64(self.rows),
            Int64(self.n),
            self.vector_flag,
            grid_dim=grid,
            block_dim=block,
        )


def ce_kernel_for(rows: Int, n: Int, V: Int) -> String:
    """The row kernel `launch_cross_entropy` picks for `rows` rows of `n`
    classes: "register", "smem", "pair" or "block".

    Where the smem kernel can take the rows (rows >= SPLIT_BELOW_ROWS, so
    a block a row fills the GPU twice over, and n <= `smem_capacity(V)`),
    register plans keep only rows of at most `CE_PLAN_THREADS` threads:
    the 512-thread plans get one block an SM (fp32: 102-128 registers a
    thread; 16-bit: capped at 64 and spilling), whose HBM idles while it
    reduces. The smem kernel runs two 512-thread blocks an SM at 64
    registers (to ~37K fp32 / ~74K 16-bit classes, then one of 1024
    threads). H100, 2026-11-25, wall GB/s, "mean" (copy ~3000), register
    plan -> smem: fp32 8192 x 16384 2473 -> 2833, 16384 x 32000 1556 ->
    2914; bf16 8192 x 16384 1277 -> 2102; but fp32 32768 x 4096 2159 ->
    1895 (512 threads are too many for such rows).
    Fewer rows keep every register plan (a row read once). Rows past the
    smem kernel's capacity, to `pair_capacity(V)` (~148K fp32, ~296K
    16-bit classes: Llama-3's 128256 fp32), go to `ce_pair_kernel` (a
    cluster of two blocks a row, read once) where there are as many rows,
    else to the block kernel (read twice).
    """
    var plan = register_plan(n, V, 0)
    if rows >= SPLIT_BELOW_ROWS and n <= smem_capacity(V):
        if plan >= 0 and plan_threads(plan) <= CE_PLAN_THREADS:
            return "register"
        return "smem"
    if plan >= 0:
        return "register"
    if rows >= SPLIT_BELOW_ROWS and n <= pair_capacity(V):
        return "pair"
    return "block"


def launch_ce_block[
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
    """Launch `ce_block_kernel` on `rows` rows of `n`, a block of
    `CE_BLOCK_THREADS` a row (any length)."""
    comptime V = vector_width[dtype]()
    comptime kernel = ce_block_kernel[
        dtype, with_grad, mean, reduce, V, CE_BLOCK_THREADS
    ]
    ctx.enqueue_function[kernel](
        dlogits,
        logits,
        targets,
        options,
        count,
        row_losses,
        loss,
        Int64(n),
        aligned_flag_of(aligned),
        grid_dim=rows,
        block_dim=CE_BLOCK_THREADS,
    )


def _launch_ce_rows[
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
) raises:
    """Enqueue the row kernel `ce_kernel_for` picks for `rows > 0` rows of
    `n`: each row's loss (to `row_losses` if `reduce`, else to `loss`) and,
    `with_grad`, its gradient."""
    comptime V = vector_width[dtype]()
    var aligned = aligned16(Int(logits), Int(dlogits))
    var family = ce_kernel_for(rows, n, V)
    if family == "smem":
        launch_ce_smem[dtype, with_grad, mean, reduce](
            ctx,
            dlogits,
            logits,
            targets,
            options,
            count,
            row_losses,
            loss,
            rows,
            n,
            aligned,
        )
    elif family == "pair":
        launch_ce_pair[dtype, with_grad, mean, reduce](
            ctx,
            dlogits,
            logits,
            targets,
            options,
            count,
            row_losses,
            loss,
            rows,
            n,
            aligned,
        )
    elif family == "register":
        var plan = register_plan(n, V, 0)
        launch_register_plan[V, MAX_ROW_REGISTERS, 1, MAX_PLAN_THREADS](
            ctx,
            CERegisterRows[dtype, with_grad, mean, reduce](
                held(dlogits),
                held(logits),
                held(targets),
                held(options),
                held(count),
                held(row_losses),
                held(loss),
                rows,
                n,
                vector_flag_of(aligned, n, V),
            ),
            plan,
            rows,
        )
    else:
        launch_ce_block[dtype, with_grad, mean, reduce](
            ctx,
            dlogits,
            logits,
            targets,
            options,
            count,
            row_losses,
            loss,
            rows,
            n,
            aligned,
        )


def launch_cross_entropy[
    dtype: DType, with_grad: Bool, reduction: StaticString
](
    ctx: DeviceContext,
    loss: Pointer[Scalar[dtype], MutAnyOrigin],
    dlogits: Pointer[Scalar[dtype], MutAnyOrigin],
    logits: Pointer[Scalar[dtype], MutAnyOrigin],
    targets: Pointer[Int64, MutAnyOrigin],
    options: Pointer[Float64, MutAnyOrigin],
    rows: Int,
    n: Int,
) raises:
    """Enqueue the cross-entropy of `rows` rows of `n` logits (see the
    module docstring): the count ("mean"), the row kernel the row length
    picks (`_launch_ce_rows`), the reduction ("mean", "sum"). Arguments as
    `cross_entropy_cpu`, with `options` on the device."""
    comptime acc = accum_dtype[dtype]()
    comptime mean = reduction == "mean"
    comptime reduce = reduction != "none"
    var count = ctx.enqueue_create_buffer[DType.float64](1)
    # Row losses in the accumulator type, for the reduction ("none" writes
    # them to the output instead and gets a placeholder).
    var row_losses = ctx.enqueue_create_buffer[acc](
        max(rows, 1) if reduce else 1
    )
    var count_ptr = rebind[Pointer[Float64, MutAnyOrigin]](count.unsafe_ptr())
    var losses_ptr = rebind[Pointer[Scalar[acc], MutAnyOrigin]](
        row_losses.unsafe_ptr()
    )
    comptime if mean:
        ctx.enqueue_function[ce_count_kernel](
            count_ptr,
            targets,
            options,
            Int64(rows),
            grid_dim=1,
            block_dim=CE_SMALL_THREADS,
        )
    if rows > 0:
        _launch_ce_rows[dtype, with_grad, mean, reduce](
            ctx,
            dlogits,
            logits,
            targets,
            options,
            count_ptr,
            losses_ptr,
            loss,
            rows,
            n,
        )
    comptime if reduce:
        comptime kernel = ce_reduce_kernel[dtype, mean]
        ctx.enqueue_function[kernel](
            loss,
            losses_ptr,
            count_ptr,
            Int64(rows),
            grid_dim=1,
            block_dim=CE_SMALL_THREADS,
        )
    # Freed in stream order, after the kernels.
    _ = count^
    _ = row_losses^
