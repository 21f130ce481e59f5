"""GPU cross-entropy under the extended options (z-loss, softcap, class
weights), for rows of any length: `ce_options_kernel`, a block a row, an
online (max, sum of exp) pass over the capped logits (with, under label
smoothing, the weighted sums the loss needs), then, with the gradient, a
pass that re-reads the row to write it. It takes the loss alone (one read
either way), few rows and rows past a pair's capacity; many rows with a
gradient go on chip (gpu_ce_options_smem_rows), read once.

`launch_cross_entropy_options` is the whole launch sequence for such
calls, as `launch_cross_entropy` is for the plain loss: the "mean" count
(a weighted count with class weights: torch divides by the sum of w[t] over
the kept rows), the row kernel (`options_onchip_parts` picks), then
`ce_reduce_kernel`. The plain kernels
are not touched: the options' length (a host value) picks this file.
"""

from max.gpu import MAX_THREADS_PER_BLOCK_METADATA, block_idx, thread_idx
from max.gpu.host import DeviceContext
from std.utils import StaticTuple
from std.utils.numerics import nan

from .cross_entropy_math import (
    EXTENDED_OPTIONS,
    KEPT,
    OUT_OF_RANGE,
    extended_layout,
    extended_p_factor,
    extended_row_loss,
    softcap_chain,
    softcap_of,
    target_kind,
)
from .gpu_ce_options_smem_rows import (
    launch_ce_options_parts,
    options_onchip_parts,
)
from .gpu_ce_smem_rows import WEIGHTED_TERMS, Z_TERMS, launch_ce_parts
from .gpu_cross_entropy import CE_SMALL_THREADS, CEWorkspace
from .gpu_launch import aligned16
from .gpu_reductions import block_max_sum, block_sum
from .row_math import (
    accum_dtype,
    exp_nan,
    online_add,
    online_sum_guard,
    vector_width,
)

# Threads a row of the options kernel.
comptime CE_OPTIONS_THREADS = 512
# Elements a thread loads before it uses them.
comptime CE_OPTIONS_UNROLL = 4


@__llvm_metadata(
    MAX_THREADS_PER_BLOCK_METADATA=StaticTuple[Int32, 1](
        Int32(CE_SMALL_THREADS)
    )
)
def ce_weighted_count_kernel(
    count: Pointer[Float64, MutAnyOrigin],
    targets: Pointer[Int64, MutAnyOrigin],
    options: Pointer[Float64, MutAnyOrigin],
    rows: Int64,
    n: Int64,
    has_weight: Int32,
):
    """`count[0]` = the sum over kept rows of w[target] (1 without weights);
    out-of-range targets add nothing (their rows are NaN). One block of
    CE_SMALL_THREADS."""
    var t = Int(thread_idx.x)
    var ignore_index = Int64(options[unsafe_offset=0])
    var c = Float64(0)
    for r in range(t, Int(rows), CE_SMALL_THREADS):
        var tgt = targets[unsafe_offset=r]
        if target_kind(tgt, ignore_index, Int(n)) == KEPT:
            if has_weight != 0:
                c += options[unsafe_offset=EXTENDED_OPTIONS + Int(tgt)]
            else:
                c += 1
    var total = block_sum[DType.float64, CE_SMALL_THREADS](c)
    if t == 0:
        count[unsafe_offset=0] = total


@__llvm_metadata(
    MAX_THREADS_PER_BLOCK_METADATA=StaticTuple[Int32, 1](
        Int32(CE_OPTIONS_THREADS)
    )
)
def ce_options_kernel[
    dtype: DType, with_grad: Bool, mean: Bool, reduce: Bool
](
    dlogits: Pointer[Scalar[dtype], MutAnyOrigin],
    logits: Pointer[Scalar[dtype], MutAnyOrigin],
    targets: Pointer[Int64, MutAnyOrigin],
    options: Pointer[Float64, MutAnyOrigin],
    count: Pointer[Float64, MutAnyOrigin],
    row_losses: Pointer[Scalar[accum_dtype[dtype]()], MutAnyOrigin],
    loss: Pointer[Scalar[dtype], MutAnyOrigin],
    n: Int64,
    has_weight: Int32,
):
    """One row (block) of the extended cross-entropy: its loss to
    `row_losses` (`reduce`) or `loss`, and `with_grad` its gradient."""
    comptime acc = accum_dtype[dtype]()
    comptime assert acc.is_floating_point()
    comptime T = CE_OPTIONS_THREADS
    var t = Int(thread_idx.x)
    var row = Int(block_idx.x)
    var len = Int(n)
    var x = logits.unsafe_offset(row * len)
    var y_out = dlogits.unsafe_offset(row * len)
    var weights = options.unsafe_offset(EXTENDED_OPTIONS)
    var ignore_index = Int64(options[unsafe_offset=0])
    var eps = options[unsafe_offset=1].cast[acc]()
    var z_loss = options[unsafe_offset=2].cast[acc]()
    var cap = options[unsafe_offset=3].cast[acc]()
    var tgt = targets[unsafe_offset=row]
    var kind = target_kind(tgt, ignore_index, len)
    if kind != KEPT:
        # Ignored: loss 0 and gradient 0; out of range: NaN (the host
        # cannot be told without a sync).
        var fill = Scalar[acc](0) if kind != OUT_OF_RANGE else nan[acc]()
        comptime if with_grad:
            for c in range(t, len, T):
                y_out[unsafe_offset=c] = fill.cast[dtype]()
        if t == 0:
            comptime if reduce:
                row_losses[unsafe_offset=row] = fill
            else:
                loss[unsafe_offset=row] = fill.cast[dtype]()
        return
    var m = Scalar[acc](-1) / Scalar[acc](0)
    var s = Scalar[acc](0)
    var su = Scalar[acc](0)
    var suy = Scalar[acc](0)
    # CE_OPTIONS_UNROLL elements a thread are loaded before they are used
    # (loads in flight), then the rest one at a time.
    comptime U = CE_OPTIONS_UNROLL
    var c = t
    while c + (U - 1) * T < len:
        _stats_step[dtype, U](
            x, weights, c, has_weight, eps, cap, m, s, su, suy
        )
        c += U * T
    while c < len:
        _stats_step[dtype, 1](
            x, weights, c, has_weight, eps, cap, m, s, su, suy
        )
        c += T
    # The target's logit and weight are read before the block's first
    # barrier: the gradient may be written over the logits (in place), and
    # no thread writes before every thread has passed that barrier.
    var w_t = Scalar[acc](1)
    if has_weight != 0:
        w_t = weights[unsafe_offset=Int(tgt)].cast[acc]()
    var y_t = softcap_of[acc, 1](x[unsafe_offset=Int(tgt)].cast[acc](), cap)
    var stats = block_max_sum[acc, T](m, s)
    var row_max = stats[0]
    var row_sum = online_sum_guard[acc](row_max, stats[1])
    if eps != 0:
        su = block_sum[acc, T](su)
        suy = block_sum[acc, T](suy)
    if t == 0:
        var value = extended_row_loss[acc](
            row_max, row_sum, y_t, w_t, su, suy, eps, z_loss, len
        )
        comptime if reduce:
            row_losses[unsafe_offset=row] = value
        else:
            loss[unsafe_offset=row] = value.cast[dtype]()
    comptime if with_grad:
        var scale = Scalar[acc](1)
        comptime if mean:
            scale = Scalar[acc](1 / count[unsafe_offset=0])
        var factor = extended_p_factor[acc](
            row_max, row_sum, w_t, su, eps, z_loss, len
        )
        var inv_s = 1 / row_sum
        var smooth = eps / Scalar[acc](len)
        var target_term = (1 - eps) * w_t
        var g_c = t
        while g_c + (U - 1) * T < len:
            _grad_step[dtype, U](
                y_out,
                x,
                weights,
                g_c,
                Int(tgt),
                has_weight,
                eps,
                cap,
                row_max,
                inv_s,
                factor,
                smooth,
                target_term,
                scale,
            )
            g_c += U * T
        while g_c < len:
            _grad_step[dtype, 1](
                y_out,
                x,
                weights,
                g_c,
                Int(tgt),
                has_weight,
                eps,
                cap,
                row_max,
                inv_s,
                factor,
                smooth,
                target_term,
                scale,
            )
            g_c += T


@always_inline
def _gather[
    dtype: DType, acc: DType, W: Int
](p: Pointer[Scalar[dtype], MutAnyOrigin], c: Int) -> SIMD[acc, W]:
    """Elements c, c + T, ..., c + (W - 1) T of `p` (T =
    CE_OPTIONS_THREADS: a thread's share, coalesced across the block), all
    loaded before any is used."""
    var v = SIMD[acc, W](0)
    comptime for k in range(W):
        v[k] = p[unsafe_offset=c + k * CE_OPTIONS_THREADS].cast[acc]()
    return v


@always_inline
def _stats_step[
    dtype: DType, W: Int
](
    x: Pointer[Scalar[dtype], MutAnyOrigin],
    weights: Pointer[Float64, MutAnyOrigin],
    c: Int,
    has_weight: Int32,
    eps: Scalar[accum_dtype[dtype]()],
    cap: Scalar[accum_dtype[dtype]()],
    mut m: Scalar[accum_dtype[dtype]()],
    mut s: Scalar[accum_dtype[dtype]()],
    mut su: Scalar[accum_dtype[dtype]()],
    mut suy: Scalar[accum_dtype[dtype]()],
):
    """Fold W of a thread's elements from `c` into its online (max, sum of
    exp) pair and, under label smoothing, its weighted sums."""
    comptime acc = accum_dtype[dtype]()
    var y = softcap_of[acc, W](_gather[dtype, acc, W](x, c), cap)
    var pair = online_add[acc, W](m, s, y)
    m = pair[0]
    s = pair[1]
    if eps != 0:
        var u = SIMD[acc, W](1)
        if has_weight != 0:
            u = _gather[DType.float64, acc, W](weights, c)
        su += u.reduce_add()
        suy += (u * y).reduce_add()


@always_inline
def _grad_step[
    dtype: DType, W: Int
](
    y_out: Pointer[Scalar[dtype], MutAnyOrigin],
    x: Pointer[Scalar[dtype], MutAnyOrigin],
    weights: Pointer[Float64, MutAnyOrigin],
    c: Int,
    tgt: Int,
    has_weight: Int32,
    eps: Scalar[accum_dtype[dtype]()],
    cap: Scalar[accum_dtype[dtype]()],
    row_max: Scalar[accum_dtype[dtype]()],
    inv_s: Scalar[accum_dtype[dtype]()],
    factor: Scalar[accum_dtype[dtype]()],
    smooth: Scalar[accum_dtype[dtype]()],
    target_term: Scalar[accum_dtype[dtype]()],
    scale: Scalar[accum_dtype[dtype]()],
):
    """Write the gradient of W of a thread's elements from `c` (each read
    before it is written: in-place safe)."""
    comptime acc = accum_dtype[dtype]()
    var y = softcap_of[acc, W](_gather[dtype, acc, W](x, c), cap)
    var g = exp_nan[acc, W](y - row_max) * inv_s * factor
    if eps != 0:
        var u = SIMD[acc, W](1)
        if has_weight != 0:
            u = _gather[DType.float64, acc, W](weights, c)
        g -= u * smooth
    comptime for k in range(W):
        if c + k * CE_OPTIONS_THREADS == tgt:
            g[k] = g[k] - target_term
    g = g * scale * softcap_chain[acc, W](y, cap)
    comptime for k in range(W):
        y_out[unsafe_offset=c + k * CE_OPTIONS_THREADS] = g[k].cast[dtype]()


def launch_cross_entropy_options[
    dtype: DType, with_grad: Bool, reduction: StaticString
](
    ctx: DeviceContext,
    loss: Pointer[Scalar[dtype], MutAnyOrigin],
    dlogits: Pointer[Scalar[dtype], MutAnyOrigin],
    logits: Pointer[Scalar[dtype], MutAnyOrigin],
    targets: Pointer[Int64, MutAnyOrigin],
    options: Pointer[Float64, MutAnyOrigin],
    n_options: Int,
    rows: Int,
    n: Int,
) raises:
    """Enqueue the extended cross-entropy of `rows` rows of `n` logits:
    `options` (on the device) holds `n_options` float64 values,
    (ignore_index, eps, z_loss, softcap[, V class weights]) and hints
    (`extended_layout`). Rows on chip whose options are scalar terms
    take the plain on-chip kernel with those terms."""
    var layout = extended_layout(n_options, n)
    comptime mean = reduction == "mean"
    comptime reduce = reduction != "none"
    var has_weight = Int32(1) if layout.weighted else Int32(0)
    var workspace = CEWorkspace[dtype, mean, reduce](ctx, rows)
    var count_ptr = workspace.count_ptr()
    var losses_ptr = workspace.losses_ptr()
    comptime if mean:
        ctx.enqueue_function[ce_weighted_count_kernel](
            count_ptr,
            targets,
            options,
            Int64(rows),
            Int64(n),
            has_weight,
            grid_dim=1,
            block_dim=CE_SMALL_THREADS,
        )
    comptime V = vector_width[dtype]()
    var parts = options_onchip_parts(rows, n, V) if with_grad else 0
    var aligned = aligned16(Int(logits), Int(dlogits))
    # z-loss and the target's weight alone take the plain on-chip pass.
    var scalar_terms = layout.scalar_terms()
    comptime for C in [1, 2]:
        if parts == C and scalar_terms:
            comptime for terms in [Z_TERMS, WEIGHTED_TERMS]:
                if layout.weighted == (terms == WEIGHTED_TERMS):
                    launch_ce_parts[dtype, True, mean, reduce, C, terms](
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
                        aligned,
                    )
        elif parts == C:
            launch_ce_options_parts[dtype, mean, reduce, V, C](
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
                aligned,
                has_weight,
            )
    if parts == 0 and rows > 0:
        comptime kernel = ce_options_kernel[dtype, with_grad, mean, reduce]
        ctx.enqueue_function[kernel](
            dlogits,
            logits,
            targets,
            options,
            count_ptr,
            losses_ptr,
            loss,
            Int64(n),
            has_weight,
            grid_dim=rows,
            block_dim=CE_OPTIONS_THREADS,
        )
    workspace.enqueue_reduce(ctx, loss, rows)
    # Freed in stream order, after the kernels.
    _ = workspace^
