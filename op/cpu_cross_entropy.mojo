"""Vectorized, multithreaded CPU cross-entropy (and its gradient), fused.

Rows are split into tasks of whole rows as in cpu_rows.mojo. A row takes
the SIMD sweeps of softmax there (max; exp and sum, the exps parked in the
gradient row, or for 16-bit types in a float32 scratch row), then, with the
gradient, one sweep writing (p - eps/V) * scale: the logits are read twice
and the gradient written once, never read back from memory other than the
parked exps. Without the gradient nothing is written but the loss.

Targets are on the host here, so they are checked before any row runs: an
out-of-range target (not `ignore_index`) raises, naming the row.
"""

from std.sys import simd_width_of, size_of

from .cpu_ce_options import cross_entropy_options_rows
from .cpu_rows import ExpTerms, _max_of
from .cpu_sweeps import RowPieces, RowTerms, blocked_sum, each_piece
from .cpu_tasks import run_in_tasks
from .cross_entropy_math import (
    EXTENDED_OPTIONS,
    IGNORED,
    PLAIN_OPTIONS,
    checked_target_kind,
    extended_layout,
    grad_of,
    row_loss,
    smoothing_of,
    target_grad,
)
from .cross_entropy_ops import CrossEntropyCall, LossCall
from .gpu_launch import HeldRows, held, kernel_arg
from .row_math import accum_dtype, exp_nan


def cross_entropy_cpu[
    dtype: DType, with_grad: Bool, reduction: StaticString
](call: CrossEntropyCall[dtype, with_grad, reduction]) raises:
    """Cross-entropy of `call`'s (rows, n) logits against its class indices,
    `options` on the host: PLAIN_OPTIONS (ignore_index, eps) by the sweeps
    here, extended ones (z-loss, softcap, class weights) by cpu_ce_options'
    rows (`cross_entropy_options_rows`).

    Parameters:
        dtype: Element type of logits, loss and gradient.
        with_grad: Also write d loss / d logits into `dlogits`.
        reduction: "mean", "sum" (one loss) or "none" (a loss a row).

    Args:
        call: The buffers and dims (`LossCall`): loss, one element ("mean",
            "sum") or `rows` ("none"); dlogits (unused without the
            gradient) and logits, `rows * n` row-major; `rows` targets.
    """
    comptime acc = accum_dtype[dtype]()
    comptime assert acc.is_floating_point()
    var rows = call.view.outer
    var n = call.view.n
    var targets = call.class_indices()
    var options = kernel_arg(call.options.values)
    var n_options = call.options.count
    var extended = n_options > PLAIN_OPTIONS
    var has_weight = extended and extended_layout(n_options, n).weighted
    var weights = options.unsafe_offset(EXTENDED_OPTIONS)
    var ignore_index = Int64(options[unsafe_offset=0])
    # Checked first and serially: a bad target must stop the op before any
    # output is written, and the kept rows (summed w[target] with class
    # weights: torch's rule) are what "mean" divides by.
    var kept = Float64(0)
    for r in range(rows):
        var t = targets[unsafe_offset=r]
        var kind = checked_target_kind(t, r, ignore_index, n)
        if kind != IGNORED:
            kept += weights[unsafe_offset=Int(t)] if has_weight else 1
    if extended:
        cross_entropy_options_rows(call, has_weight, kept)
        return
    # 1 / 0 = inf for "mean" over no kept rows: every row is then ignored
    # and gets a zero gradient, so the inf is never used.
    var scale = Scalar[acc](1) / Scalar[acc](
        kept
    ) if reduction == "mean" else Scalar[acc](1)
    var e = options[unsafe_offset=1].cast[acc]()

    def loss_of_row(row: LossRow[dtype]) {imm} -> Scalar[acc]:
        return _row[dtype, with_grad](
            row, targets[unsafe_offset=row.index], ignore_index, e, scale, n
        )

    # 16-bit gradients park their exps in a float32 scratch row (`_row`).
    comptime scratch = with_grad and size_of[dtype]() < 4
    loss_rows_in_tasks(loss_of_row, call, kept, n if scratch else 0)


@fieldwise_init
struct LossRow[dtype: DType](ImplicitlyCopyable):
    """One row of a CPU loss kernel, as `loss_rows_in_tasks` hands it to
    the kernel's row function: its index and its rows."""

    comptime acc = accum_dtype[Self.dtype]()

    var index: Int
    """The row's index."""
    var dlogits: HeldRows[Self.dtype]
    """Its gradient row (unused without the gradient)."""
    var logits: HeldRows[Self.dtype]
    """Its logits."""
    var scratch: HeldRows[Self.acc]
    """The task's scratch row (`scratch_length` elements)."""


@fieldwise_init
struct RowLosses[dtype: DType, reduction: StaticString](ImplicitlyCopyable):
    """Where a CPU loss kernel's row losses go: into the accumulator-typed
    row losses that `loss_rows_in_tasks` reduces ("mean", "sum"), or
    straight into the (rows,) loss ("none")."""

    comptime acc = accum_dtype[Self.dtype]()

    var loss: HeldRows[Self.dtype]
    """The op's loss."""
    var row_losses: HeldRows[Self.acc]
    """A loss a row, to reduce (unused for "none")."""

    @always_inline
    def put(self, r: Int, value: Scalar[Self.acc]):
        """Row r's loss."""
        comptime if Self.reduction != "none":
            self.row_losses[unsafe_offset=r] = value
        else:
            self.loss[unsafe_offset=r] = value.cast[Self.dtype]()


def loss_rows_in_tasks[
    dtype: DType,
    target_dtype: DType,
    with_grad: Bool,
    reduction: StaticString,
    variant: StaticString,
    //,
    FuncType: def(LossRow[dtype]) -> Scalar[accum_dtype[dtype]()],
](
    loss_of_row: FuncType,
    call: LossCall[dtype, target_dtype, with_grad, reduction, variant],
    kept: Float64,
    scratch_length: Int = 0,
) raises:
    """Put `loss_of_row(row)` for every row of `call`'s (rows, n) logits,
    whole rows a task (`run_in_tasks`), each task with a scratch row of
    `scratch_length` accumulator elements; then for "mean" and "sum" write
    their sum (divided by `kept` for "mean") to the loss: the one row loop
    and loss epilogue of the CPU cross-entropy kernels."""
    comptime acc = accum_dtype[dtype]()
    comptime reduce = reduction != "none"
    var rows = call.view.outer
    var n = call.view.n
    var row_losses = List[Scalar[acc]](length=rows if reduce else 0, fill=0)
    var losses = RowLosses[dtype, reduction](
        call.loss,
        rebind[HeldRows[acc]](row_losses.unsafe_ptr()),
    )
    var dlogits = kernel_arg(call.dlogits)
    var logits = kernel_arg(call.logits)

    def task_rows(begin: Int, end: Int) raises {imm}:
        var scratch_row = List[Scalar[acc]](capacity=scratch_length)
        var scratch = rebind[HeldRows[acc]](scratch_row.unsafe_ptr())
        for r in range(begin, end):
            losses.put(
                r,
                loss_of_row(
                    LossRow[dtype](
                        r,
                        held(dlogits.unsafe_offset(r * n)),
                        held(logits.unsafe_offset(r * n)),
                        scratch,
                    )
                ),
            )
        _ = scratch_row^

    run_in_tasks(task_rows, rows, n)
    comptime if reduce:
        reduce_row_losses[reduction == "mean"](
            kernel_arg(call.loss), row_losses, kept
        )
    _ = row_losses^


@always_inline
def reduce_row_losses[
    mean: Bool, dtype: DType, acc: DType
](
    loss: Pointer[Scalar[dtype], MutAnyOrigin],
    row_losses: List[Scalar[acc]],
    kept: Float64,
):
    """`loss[0]` = the sum of the row losses, divided by `kept` where
    `mean`. Summed in row order (repeatable bits) in float64 for every
    dtype: a float32 running total of 8192 rows loses ~20 bits' worth of
    the last row's precision, 100x torch's error."""
    var total = Float64(0)
    for r in range(len(row_losses)):
        total += row_losses[r].cast[DType.float64]()
    comptime if mean:
        total = total / kept
    loss[unsafe_offset=0] = total.cast[dtype]()


@always_inline
def _row[
    dtype: DType, with_grad: Bool
](
    row: LossRow[dtype],
    t: Int64,
    ignore_index: Int64,
    eps: Scalar[accum_dtype[dtype]()],
    scale: Scalar[accum_dtype[dtype]()],
    n: Int,
) -> Scalar[accum_dtype[dtype]()]:
    """`row`'s loss against class `t` (0 if ignored); with the gradient,
    its gradient row (16-bit types park their exps in the row's scratch)."""
    comptime acc = accum_dtype[dtype]()
    comptime W = simd_width_of[acc]()
    var y = kernel_arg(row.dlogits)
    var x = kernel_arg(row.logits)
    if t == ignore_index:
        comptime if with_grad:
            for j in range(0, n - n % W, W):
                y.unsafe_offset(j).unsafe_store(SIMD[dtype, W](0))
            for j in range(n - n % W, n):
                y[unsafe_offset=j] = 0
        return 0
    # 32/64-bit types park exp(x - m) in the gradient row, 16-bit types in
    # a float32 scratch row (parking them in y would round twice), by the
    # lean exp (16-bit outputs need ~1e-6, see cpu_rows).
    comptime park_in_dst = with_grad and size_of[dtype]() >= 4
    comptime park_in_scratch = with_grad and size_of[dtype]() < 4
    comptime lean = size_of[dtype]() < 4
    var m = _max_of[dtype](x, n)
    var s = ExpTerms[dtype, park_in_dst, park_in_scratch, lean](
        row.dlogits, row.scratch, row.logits, m
    ).sum(n)
    var x_t = x[unsafe_offset=Int(t)].cast[acc]()
    var sum_x = _sum_of[dtype](x, n) if eps != 0 else Scalar[acc](0)
    comptime if with_grad:
        var inv_s = 1 / s
        var smooth = smoothing_of[acc](eps, n)
        each_piece[W](
            GradWrite[dtype, park_in_dst](
                ExpTerms[dtype, park_in_dst, not park_in_dst, False](
                    row.dlogits, row.scratch, row.logits, m
                ),
                inv_s,
                smooth,
                scale,
            ),
            n,
        )
        y[unsafe_offset=Int(t)] = target_grad[acc](
            exp_nan[acc, 1](x_t - m) * inv_s, smooth, eps, scale
        ).cast[dtype]()
    return row_loss[acc](m, s, x_t, sum_x, eps, n)


@fieldwise_init
struct GradWrite[dtype: DType, park_in_dst: Bool](RowPieces):
    """Writes a gradient row (p - eps/V) * scale from the exps parked in it
    (`park_in_dst`) or in a float32 scratch row."""

    comptime acc = accum_dtype[Self.dtype]()

    var row: ExpTerms[Self.dtype, Self.park_in_dst, not Self.park_in_dst, False]
    """The gradient row (`y`) and where the exps are parked."""
    var inv_s: Scalar[Self.acc]
    """1 / the row's sum of exps."""
    var smooth: Scalar[Self.acc]
    """`smoothing_of` the row."""
    var scale: Scalar[Self.acc]
    """The reduction's factor."""

    @always_inline
    def put[w: Int](self, j: Int):
        """Write the gradient at j."""
        var e = self.row.value[w](j)
        self.row.y.unsafe_offset(j).unsafe_store(
            grad_of[Self.acc, w](e, self.inv_s, self.smooth, self.scale).cast[
                Self.dtype
            ]()
        )


@fieldwise_init
struct Values[dtype: DType](RowTerms):
    """The elements of a row, in the accumulator type."""

    comptime acc = accum_dtype[Self.dtype]()

    var x: HeldRows[Self.dtype]
    """The row."""

    @always_inline
    def term[w: Int](self, j: Int) -> SIMD[Self.acc, w]:
        """The w elements at j."""
        return self.x.unsafe_offset(j).unsafe_load[width=w]().cast[Self.acc]()


@always_inline
def _sum_of[
    dtype: DType
](x: Pointer[Scalar[dtype], MutAnyOrigin], count: Int) -> Scalar[
    accum_dtype[dtype]()
]:
    """The sum of x[0:count] in the accumulator type, blocked as the sums
    of exp in cpu_rows (label smoothing needs it)."""
    return blocked_sum[simd_width_of[accum_dtype[dtype]()]()](
        Values[dtype](held(x)), count
    )
