"""Cross-entropy rows that a register plan holds: `ce_register_kernel`,
8 to 512 threads a row, the row loaded once into registers with the
softmax kernels' chunk loaders and plan launcher (gpu_register_rows),
reduced with warp shuffles, the gradient written once.

`ce_kernel_for` (gpu_cross_entropy) gives it rows to 32K values, and where
the smem kernel can take the rows, only those of up to `CE_PLAN_THREADS`
threads a row. `CERows` (gpu_cross_entropy) holds its arguments and
enqueues it (`enqueue_ce_register`) for `launch_register_plan`.
"""

from max.gpu import (
    MAX_THREADS_PER_BLOCK_METADATA,
    WARP_SIZE,
    block_idx,
    thread_idx,
)
from max.gpu.host import DeviceContext
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
from .gpu_ce_common import CEArgs, CELaunchRows, ce_options, grad_scale
from .gpu_launch import in_global, vector_flag_of
from .gpu_reductions import block_max, block_sum
from .gpu_register_rows import (
    MAX_ROW_REGISTERS,
    block_threads,
    chunk_registers,
    load_row_chunks,
    min_blocks_per_sm,
    store_row_chunks,
)
from .row_math import accum_dtype, exp_nan, vector_width


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
    var scale = grad_scale[acc, mean](count)
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
](args: CEArgs[dtype], rows: Int64, n: Int64, vector_flag: Int32):
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
        args: The tensors (`CEArgs`).
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
    var opts = ce_options[acc](in_global(args.options))
    var eps = opts[1]
    var tgt = in_global(args.targets)[unsafe_offset=row]
    var kind = target_kind(tgt, opts[0], Int(n))
    var x = in_global(args.logits).unsafe_offset(row * Int(n))
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
        args.store_loss[reduce](row, value)
    comptime if with_grad:
        var out = _held_grad_row[dtype, mean, threads, V, K](
            raw,
            in_global(args.count),
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
            in_global(args.dlogits).unsafe_offset(row * Int(n)),
            out,
            len,
            t,
            vector_loads,
        )


def enqueue_ce_register[
    dtype: DType, with_grad: Bool, mean: Bool, reduce: Bool, T: Int, K: Int
](ctx: DeviceContext, op: CELaunchRows[dtype], grid: Int, block: Int) raises:
    """Enqueue `ce_register_kernel` on `op`'s rows, T threads a row, K
    chunks a thread, in `grid` blocks of `block` threads (`CERows.enqueue`,
    for `launch_register_plan`)."""
    comptime V = vector_width[dtype]()
    comptime kernel = ce_register_kernel[
        dtype, with_grad, mean, reduce, T, V, K
    ]
    ctx.enqueue_function[kernel](
        op.args,
        Int64(op.rows),
        Int64(op.n),
        vector_flag_of(op.aligned, op.n, V),
        grid_dim=grid,
        block_dim=block,
    )
