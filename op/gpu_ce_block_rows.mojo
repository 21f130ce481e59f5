"""Cross-entropy rows of any length: `ce_block_kernel`, a block per row:
an online (max, sum) pass, then, with the gradient, a pass that re-reads
the row (mostly from L2) to write it. Loss-only reads the row once.

`ce_kernel_for` (gpu_cross_entropy) gives it the rows the other families
do not take: rows longer than theirs, or fewer.
"""

from max.gpu import MAX_THREADS_PER_BLOCK_METADATA, block_idx, thread_idx
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
from .gpu_ce_common import ce_options, grad_scale, scalar_grad, target_owner
from .gpu_launch import aligned_flag_of
from .gpu_reductions import block_max_sum, block_sum
from .row_math import (
    accum_dtype,
    exp_nan,
    online_add,
    online_sum_guard,
    vector_width,
)

# Rows longer than the register plans: a block of this many threads a row.
comptime CE_BLOCK_THREADS = 512


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
        y[unsafe_offset=e] = scalar_grad[dtype](
            x, e, kind, fill, row_max, inv_s, smooth, scale
        )
    for e in range(tail_begin + t, len, T):
        y[unsafe_offset=e] = scalar_grad[dtype](
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
    var opts = ce_options[acc](options)
    var eps = opts[1]
    var tgt = targets[unsafe_offset=row]
    var kind = target_kind(tgt, opts[0], len)
    var scale = grad_scale[acc, mean](count)
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
            if t == target_owner[V, T](Int(tgt), head, tail_begin):
                y[unsafe_offset=Int(tgt)] = target_grad[acc](
                    exp_nan[acc, 1](x_t - row_max) * inv_s, smooth, eps, scale
                ).cast[dtype]()


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
