"""Cross-entropy rows held on chip: `ce_smem_kernel`, a block per row
holding it as the softmax forward's gpu_smem_rows (registers, the rest in
shared memory by cp.async), read once, the gradient written once.

`ce_kernel_for` (gpu_cross_entropy) gives it at least SPLIT_BELOW_ROWS
rows to `smem_capacity(V)` (~74K fp32, ~148K 16-bit classes). Its share
of a row (`SmemRowShare`) and its sweeps (`smem_row_max`,
`smem_row_stats`, `smem_row_grad`) also serve `ce_pair_kernel`
(gpu_ce_pair_rows), each of whose blocks holds a part of a row this way.
"""

from max.gpu import MAX_THREADS_PER_BLOCK_METADATA, block_idx, thread_idx
from max.gpu.host import DeviceContext, FuncAttribute
from max.gpu.memory import AddressSpace, external_memory
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
from .gpu_ce_common import (
    ce_options,
    fill_row,
    grad_scale,
    scalar_grad,
    target_owner,
)
from .gpu_launch import aligned_flag_of
from .gpu_reductions import block_max, block_sum
from .gpu_smem_rows import (
    REG_CHUNKS,
    SMEM_HALF_THREADS,
    SMEM_THREADS,
    load_row,
    smem_bytes_for,
    smem_capacity,
    smem_threads_for,
)
from .gpu_split_chunks import SharedBuffer
from .row_math import accum_dtype, exp_nan, vector_width

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


@fieldwise_init
struct SmemRowShare(ImplicitlyCopyable):
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
def smem_row_share[
    V: Int, T: Int
](t: Int, start: Int, len: Int, aligned_flag: Int32) -> SmemRowShare:
    """Thread `t`'s `SmemRowShare` of the row of `len` from element
    `start` of the buffers."""
    var head = min((V - start % V) % V, len) if aligned_flag != 0 else len
    var nvec = (len - head) // V
    var tail_begin = head + nvec * V
    return SmemRowShare(
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
def smem_row_max[
    dtype: DType, V: Int, T: Int
](
    x: Pointer[Scalar[dtype], MutAnyOrigin],
    smem: SharedBuffer[dtype],
    p: SmemRowShare,
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
    p: SmemRowShare,
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
    p: SmemRowShare,
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
        y[unsafe_offset=e] = scalar_grad[dtype](
            x, e, kind, Scalar[dtype](0), row_max, inv_s, smooth, scale
        )
    comptime if part:  # a part of the row (`ce_pair_kernel`)
        if tgt < 0 or tgt >= p.len:
            return
    if p.t == target_owner[V, T](tgt, p.head, p.tail_begin):
        y[unsafe_offset=tgt] = target_grad[acc](
            exp_nan[acc, 1](x_t - row_max) * inv_s, smooth, eps, scale
        ).cast[dtype]()


@always_inline
def smem_row_grad[
    dtype: DType, mean: Bool, V: Int, T: Int, part: Bool = False
](
    y: Pointer[Scalar[dtype], MutAnyOrigin],
    x: Pointer[Scalar[dtype], MutAnyOrigin],
    smem: SharedBuffer[dtype],
    p: SmemRowShare,
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
    var scale = grad_scale[acc, mean](count)
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
    p: SmemRowShare,
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
    p: SmemRowShare,
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
    as `smem_row_grad`."""
    comptime acc = accum_dtype[dtype]()
    comptime R = REG_CHUNKS
    var scale = grad_scale[acc, mean](count)
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
def smem_row_stats[
    dtype: DType, with_grad: Bool, V: Int, T: Int
](
    x: Pointer[Scalar[dtype], MutAnyOrigin],
    smem: SharedBuffer[dtype],
    p: SmemRowShare,
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
    them (`SmemRowShare`). Arguments as `ce_block_kernel`.

    Sweep 1 (`smem_row_max`) loads the row and its max; sweep 2
    (`smem_row_stats`) sums exp(x - max) and x (label smoothing) over the
    on-chip copy, and 16-bit rows keep their exps in it (`_holds_exp`);
    sweep 3 (`smem_row_grad`) writes the gradient from it.
    """
    comptime acc = accum_dtype[dtype]()
    comptime assert acc.is_floating_point()
    var t = Int(thread_idx.x)
    var row = Int(block_idx.x)
    var len = Int(n)
    var start = row * len
    var x = logits.unsafe_offset(start)
    var p = smem_row_share[V, T](t, start, len, aligned_flag)
    var opts = ce_options[acc](options)
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
        row_max = smem_row_max[dtype, V, T](x, smem, p, regs, edge)
        var sums = smem_row_stats[dtype, with_grad, V, T](
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
            fill_row[dtype, V, T](
                y, p.t, p.head, p.nvec, p.tail_begin, len, fill
            )
            return
        smem_row_grad[dtype, mean, V, T](
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
