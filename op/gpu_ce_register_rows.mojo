"""Cross-entropy rows that a register plan holds: `ce_register_kernel`,
8 to 512 threads a row, the register strategy (`register_rows`,
gpu_register_rows) over `CERegisterRow`: the row loaded once into
registers, reduced with warp shuffles, the gradient written once.

`ce_kernel_for` (gpu_cross_entropy) gives it rows to 32K values, and where
the smem kernel can take the rows, only those of up to `CE_PLAN_THREADS`
threads a row. `CERows` (gpu_cross_entropy) holds its arguments and
enqueues it for `launch_register_plan`.
"""

from max.gpu import MAX_THREADS_PER_BLOCK_METADATA
from std.utils import StaticTuple
from std.utils.numerics import inf, nan

from .cross_entropy_math import (
    IGNORED,
    KEPT,
    grad_of,
    row_loss,
    smoothing_of,
    target_kind,
)
from .gpu_ce_common import CETensors, ce_options, grad_scale, target_entry
from .gpu_reductions import block_sum
from .gpu_launch import HeldRows, held, kernel_arg
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
from .row_math import accum_dtype, exp_nan
from .row_op import RegisterRowOp


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
    comptime assert chunk_registers(V) * K <= MAX_ROW_REGISTERS
    var io = CETensors[dtype](
        dlogits, logits, targets, options, count, row_losses, loss
    )
    var op = CERegisterRow[dtype, with_grad, mean, reduce, threads, V, K](io, n)
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
    """Cross-entropy of `logits` rows as a `RegisterRowOp`: K chunks of V a
    thread, held in their own dtype; it folds (max, sum of exp, and with
    label smoothing the sum of the logits), writes the row's loss and, with
    `with_grad`, the gradient. Parameters and fields as
    `ce_register_kernel`'s."""

    comptime threads = Self.T

    var io: CETensors[Self.dtype]
    """The tensors."""
    var n: Int
    """Row length (classes)."""
    var row: Int
    """This group's row."""
    var len: Int
    """Elements of the row written (0 past the last row)."""
    var load_len: Int
    """Elements of the row read: none for an ignored or bad row."""
    var eps: Scalar[accum_dtype[Self.dtype]()]
    """Label smoothing."""
    var tgt: Int64
    """The row's target."""
    var kind: Int
    """The target's `target_kind`."""
    var x: HeldRows[Self.dtype]
    """This group's logit row."""
    var raw: SIMD[Self.dtype, Self.V * Self.K]
    """The thread's chunks of the row."""
    var x_t: Scalar[accum_dtype[Self.dtype]()]
    """The target's logit (0 unless kept)."""
    var row_max: Scalar[accum_dtype[Self.dtype]()]
    """The row's max."""
    var row_sum: Scalar[accum_dtype[Self.dtype]()]
    """The row's sum of exp(x - max)."""
    var value: Scalar[accum_dtype[Self.dtype]()]
    """The row's loss."""

    @always_inline
    def __init__(out self, io: CETensors[Self.dtype], n: Int64):
        """The op on these tensors, rows of `n`."""
        comptime assert accum_dtype[Self.dtype]().is_floating_point()
        self.io = io
        self.n = Int(n)
        self.row = 0
        self.len = 0
        self.load_len = 0
        self.eps = 0
        self.tgt = 0
        self.kind = 0
        self.x = io.logits
        self.raw = SIMD[Self.dtype, Self.V * Self.K](0)
        self.x_t = 0
        self.row_max = 0
        self.row_sum = 0
        self.value = 0

    @always_inline
    def begin(mut self, row: Int, len: Int):
        """The row's options, target and logits. Ignored and bad rows load
        nothing (in LLM batches, padding rows are ignored, and many); every
        thread still takes part in the reductions."""
        comptime acc = accum_dtype[Self.dtype]()
        self.row = row
        self.len = len
        var opts = ce_options[acc](kernel_arg(self.io.options))
        self.eps = opts[1]
        self.tgt = kernel_arg(self.io.targets)[unsafe_offset=row]
        self.kind = target_kind(self.tgt, opts[0], self.n)
        self.x = held(kernel_arg(self.io.logits).unsafe_offset(row * self.n))
        self.load_len = len if self.kind == KEPT else 0

    @always_inline
    def fold(mut self, t: Int, vector_loads: Bool):
        """Load the chunks (-inf past the row), the target's logit, then
        the row's (max, sum of exp, loss)."""
        comptime acc = accum_dtype[Self.dtype]()
        var x = kernel_arg(self.x)
        self.raw = load_row_chunks[
            Self.dtype, Self.T, Self.V, Self.K, Self.dtype
        ](x, self.load_len, t, vector_loads, -inf[Self.dtype]())
        self.x_t = x[unsafe_offset=Int(self.tgt)].cast[
            acc
        ]() if self.kind == KEPT else Scalar[acc](0)
        var (row_max, row_sum) = held_max_sum[
            Self.dtype, Self.T, Self.V, Self.K
        ](self.raw)
        self.row_max = row_max
        self.row_sum = row_sum
        var sum_x = Scalar[acc](0)
        # eps is the same for every thread: the reduction stays uniform.
        if self.eps != 0:
            sum_x = block_sum[acc, Self.T, block_threads[Self.T]()](
                _held_sum[Self.dtype, Self.T, Self.V, Self.K](
                    self.raw, t, vector_loads, self.load_len
                )
            )
        self.value = 0
        if self.kind == KEPT:
            self.value = row_loss[acc](
                row_max, row_sum, self.x_t, sum_x, self.eps, self.n
            )
        elif self.kind != IGNORED:
            self.value = nan[acc]()

    @always_inline
    def finish(self, live: Bool, row: Int, t: Int):
        """The row's loss, once (thread 0 of a live row)."""
        if live and t == 0:
            self.io.store_loss[Self.reduce](row, self.value)

    @always_inline
    def write(self, t: Int, vector_loads: Bool):
        """The chunks' gradient, with `with_grad`."""
        comptime if Self.with_grad:
            var out = self.held_grad(t, vector_loads)
            store_row_chunks[Self.dtype, Self.T, Self.V, Self.K, Self.dtype](
                kernel_arg(self.io.dlogits).unsafe_offset(self.row * self.n),
                out,
                self.len,
                t,
                vector_loads,
            )

    @always_inline
    def held_grad(
        self, t: Int, vector_loads: Bool
    ) -> SIMD[Self.dtype, Self.V * Self.K]:
        """The gradient of the row values thread t holds: `_held_grad` for
        a kept row, zeros for an ignored one, NaN for a bad target."""
        comptime acc = accum_dtype[Self.dtype]()
        var scale = grad_scale[acc, Self.mean](kernel_arg(self.io.count))
        var smooth = smoothing_of[acc](self.eps, self.n)
        var inv_s = 1 / self.row_sum
        if self.kind == KEPT:
            var g_t = target_entry[Self.dtype](
                self.x_t, self.row_max, inv_s, smooth, self.eps, scale
            )
            return _held_grad[Self.dtype, Self.T, Self.V, Self.K](
                self.raw,
                self.row_max,
                inv_s,
                smooth,
                scale,
                g_t,
                Int(self.tgt),
                t,
                vector_loads,
            )
        if self.kind != IGNORED:
            return SIMD[Self.dtype, Self.V * Self.K](nan[Self.dtype]())
        return SIMD[Self.dtype, Self.V * Self.K](0)
