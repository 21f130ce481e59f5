"""Cross-entropy rows that a register plan holds: `ce_register_kernel`,
8 to 512 threads a row, run by the shared register strategy
(`register_rows`, gpu_register_rows) over the op `CERegisterRow`: the row
loaded once into registers, reduced with warp shuffles, its loss and
gradient written once.

`ce_kernel_for` (gpu_cross_entropy) gives it rows to 32K values, and where
the smem kernel can take the rows, only those of up to `CE_PLAN_THREADS`
threads a row. `CERows` (gpu_cross_entropy) holds its arguments and
enqueues it (`enqueue_ce_register`) for `launch_register_plan`.
"""

from max.gpu import MAX_THREADS_PER_BLOCK_METADATA
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
from .gpu_launch import HeldRows, held, in_global, kernel_arg, vector_flag_of
from .gpu_reductions import block_sum
from .gpu_register_rows import (
    MAX_ROW_REGISTERS,
    block_threads,
    chunk_registers,
    held_max_sum,
    load_row_chunks,
    min_blocks_per_sm,
    register_rows,
    store_row_chunks,
)
from .row_math import accum_dtype, exp_nan, vector_width
from .row_op import RegisterRowOp


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
    """Cross-entropy of rows of `n <= threads * V * K` held in registers
    (`CERegisterRow` over `register_rows`).

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
    var op = CERegisterRow[dtype, with_grad, mean, reduce, threads, V, K](
        args, n
    )
    register_rows[pdl=False, aligned=False](op, rows, n, vector_flag)


struct CERegisterRow[
    dtype: DType,
    with_grad: Bool,
    mean: Bool,
    reduce: Bool,
    T: Int,
    V: Int,
    K: Int,
](RegisterRowOp):
    """Cross-entropy of class-index targets (ignore_index, label smoothing)
    as a `RegisterRowOp`: K chunks of V logits a thread, held in their own
    dtype and widened a chunk at a time; it folds (max, sum of exp(x -
    max)) and, with label smoothing, the sum of the logits, writes the row's
    loss (`CEArgs.store_loss`) and, `with_grad`, the gradient. Rows ignored
    or with a bad target load nothing (in LLM batches padding rows are
    ignored, and many); their threads still take part in the reductions."""

    comptime threads = Self.T
    comptime acc = accum_dtype[Self.dtype]()

    var args: CEArgs[Self.dtype]
    """The tensors."""
    var n: Int
    """Row length (classes)."""
    var x: HeldRows[Self.dtype]
    """This group's logit row."""
    var base: Int
    """Offset of this group's row."""
    var len: Int
    """Elements of the row written (0 past the last row)."""
    var load_len: Int
    """Elements of the row read: `len` for a kept row, else 0."""
    var eps: Scalar[Self.acc]
    """Label smoothing."""
    var tgt: Int64
    """The row's target."""
    var kind: Int
    """The target's `target_kind`."""
    var x_t: Scalar[Self.acc]
    """The target's logit (0 for a row not kept)."""
    var raw: SIMD[Self.dtype, Self.V * Self.K]
    """The thread's chunks of the row (-inf past it)."""
    var stats: Tuple[Scalar[Self.acc], Scalar[Self.acc], Scalar[Self.acc]]
    """The row's (max, sum of exp(x - max), loss)."""

    @always_inline
    def __init__(out self, args: CEArgs[Self.dtype], n: Int64):
        """The op on these tensors, rows of `n`; nothing is read yet."""
        comptime assert Self.acc.is_floating_point()
        comptime assert chunk_registers(Self.V) * Self.K <= MAX_ROW_REGISTERS
        self.args = args
        self.n = Int(n)
        self.x = held(in_global(args.logits))
        self.base = 0
        self.len = 0
        self.load_len = 0
        self.eps = 0
        self.tgt = 0
        self.kind = KEPT
        self.x_t = 0
        self.raw = SIMD[Self.dtype, Self.V * Self.K](0)
        self.stats = (
            Scalar[Self.acc](0),
            Scalar[Self.acc](0),
            Scalar[Self.acc](0),
        )

    @always_inline
    def begin(mut self, row: Int, len: Int):
        """The options, the row's target and its kind."""
        var opts = ce_options[Self.acc](in_global(self.args.options))
        self.eps = opts[1]
        self.tgt = in_global(self.args.targets)[unsafe_offset=row]
        self.kind = target_kind(self.tgt, opts[0], self.n)
        self.base = row * self.n
        self.x = held(in_global(self.args.logits).unsafe_offset(self.base))
        self.len = len
        self.load_len = len if self.kind == KEPT else 0

    @always_inline
    def fold(mut self, t: Int, vector_loads: Bool):
        """Load the chunks and the target's logit, then the row's (max, sum,
        loss)."""
        comptime acc = Self.acc
        var x = kernel_arg(self.x)
        self.raw = load_row_chunks[
            Self.dtype, Self.T, Self.V, Self.K, Self.dtype
        ](x, self.load_len, t, vector_loads, -inf[Self.dtype]())
        self.x_t = x[unsafe_offset=Int(self.tgt)].cast[
            acc
        ]() if self.kind == KEPT else Scalar[acc](0)
        self.stats = _held_loss[Self.dtype, Self.T, Self.V, Self.K](
            self.raw,
            self.kind,
            self.x_t,
            self.n,
            self.eps,
            self.load_len,
            t,
            vector_loads,
        )

    @always_inline
    def finish(self, live: Bool, row: Int, t: Int):
        """The row's loss, from its first thread."""
        if live and t == 0:
            self.args.store_loss[Self.reduce](row, self.stats[2])

    @always_inline
    def write(self, t: Int, vector_loads: Bool):
        """`with_grad`: the chunks' gradient, where they were read."""
        comptime if Self.with_grad:
            var out = _held_grad_row[
                Self.dtype, Self.mean, Self.T, Self.V, Self.K
            ](
                self.raw,
                in_global(self.args.count),
                self.stats[0],
                self.stats[1],
                self.x_t,
                self.eps,
                self.n,
                self.kind,
                Int(self.tgt),
                t,
                vector_loads,
            )
            store_row_chunks[Self.dtype, Self.T, Self.V, Self.K, Self.dtype](
                in_global(self.args.dlogits).unsafe_offset(self.base),
                out,
                self.len,
                t,
                vector_loads,
            )


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
    dtype: DType, threads: Int, V: Int, K: Int
](
    raw: SIMD[dtype, V * K],
    kind: Int,
    x_t: Scalar[accum_dtype[dtype]()],
    n: Int,
    eps: Scalar[accum_dtype[dtype]()],
    load_len: Int,
    t: Int,
    vector_loads: Bool,
) -> Tuple[
    Scalar[accum_dtype[dtype]()],
    Scalar[accum_dtype[dtype]()],
    Scalar[accum_dtype[dtype]()],
]:
    """The row's (max, sum of exp, loss) from the chunks its threads hold,
    reduced over the row's threads; the loss is NaN for a bad target and 0
    for an ignored row."""
    comptime acc = accum_dtype[dtype]()
    comptime block = block_threads[threads]()
    var (row_max, row_sum) = held_max_sum[dtype, threads, V, K](raw)
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
