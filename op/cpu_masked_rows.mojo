"""Scaled, masked and causal softmax on the CPU, rows along the last axis.

Row r of the (rows, n) input uses mask row `r % mask_rows` (when there is a
mask) and, when causal, keeps columns j <= i with i = r % L (top-left
aligned, as torch's `is_causal`); columns past i are neither read nor
exp'ed, their output is 0 (softmax) or -inf (log-softmax). Rows are split
into tasks of whole rows (`cpu_tasks`); each row takes three SIMD sweeps
over a float32 (float64) scratch row of the task: z = x * scale + mask and
its max; exp(z - max) and its sum; the output. The exp sweep reads no
memory, so it prefetches the task's next row of x and mask into L2, and
this row's output for writing (the hardware prefetcher, idle there, would
leave the next sweeps waiting on DRAM). 16-bit softmax takes its exps by
`exp_lean`. Semantics: `row_math`'s `masked_value` / `masked_row_scale`.
"""

from std.sys import simd_width_of, size_of
from std.sys.intrinsics import PrefetchOptions, prefetch
from std.utils.numerics import inf

from .cpu_rows import ExpTerms
from .cpu_sweeps import RowTerms, blocked_sum
from .cpu_tasks import run_in_tasks
from .gpu_launch import HeldRows, held, kernel_arg
from .masked_softmax_ops import MaskedCall
from .row_math import (
    accum_dtype,
    exp_nan,
    masked_row_scale,
    masked_value,
    row_exp,
    sum_shift,
)


def masked_softmax_cpu[
    dtype: DType,
    log_out: Bool,
    has_mask: Bool,
    causal: Bool,
    variant: StaticString,
](call: MaskedCall[dtype, log_out, variant]) raises:
    """Softmax (or log-softmax) of `scale * x + mask` row by row into `dst`,
    `call`'s (rows, n) rows, its `mask_rows` and `causal_rows` at least 1
    (`masked_rows`).

    Parameters:
        dtype: Element type of `dst`, `x` and `mask`.
        log_out: Write log-softmax instead of softmax.
        has_mask: Add `mask` (else it is not read); row r uses mask row
            r % mask_rows.
        causal: Keep only columns j <= r % causal_rows in row r.
        variant: The GPU's strategy (unused here).
    """
    comptime acc = accum_dtype[dtype]()
    comptime assert acc.is_floating_point()
    comptime W = simd_width_of[acc]()
    var n = call.view.n
    var mask_rows = call.mask_rows
    var causal_rows = call.causal_rows
    var sc = kernel_arg(call.options.values)[unsafe_offset=0].cast[acc]()
    var src = kernel_arg(call.x)
    var dst = kernel_arg(call.dst)
    var mask = kernel_arg(call.mask)

    def task_rows(begin: Int, end: Int) raises {imm}:
        var scratch_row = List[Scalar[acc]](length=n, fill=0)
        var z = rebind[Pointer[Scalar[acc], MutAnyOrigin]](
            scratch_row.unsafe_ptr()
        )
        for r in range(begin, end):
            var x = src.unsafe_offset(r * n)
            var y = dst.unsafe_offset(r * n)
            var m_row = mask.unsafe_offset((r % mask_rows) * n)
            var limit = n
            comptime if causal:
                limit = min(n, r % causal_rows + 1)
            var m = _values_and_max[dtype, has_mask, W](z, x, m_row, limit, sc)
            # The values (log-softmax) or exps (softmax) are in z, the row's
            # scratch row in cpu_rows' terms (x is not read again).
            var row = ZRow[dtype](held(y), held(z), held(y), sum_shift[acc](m))
            # The next row's x and mask are fetched into L2 while this one
            # computes its exps (the sweep that reads no memory).
            var next_r = r + 1 if r + 1 < end else r
            var s = blocked_sum[W](
                MaskedExps[dtype, log_out, has_mask](
                    row,
                    held(src.unsafe_offset(next_r * n)),
                    held(mask.unsafe_offset((next_r % mask_rows) * n)),
                ),
                limit,
            )
            var rs = masked_row_scale[log_out, acc](s, m)
            _write[dtype, log_out](row, limit, n, rs)
        _ = scratch_row^

    run_in_tasks(task_rows, call.view.outer, n)


comptime ZRow[dtype: DType] = ExpTerms[dtype, False, True, False]
"""A masked row as cpu_rows' sweeps see it: y, the values z as its scratch
row (exps once parked there), y again as x (never read) and the shift."""


@always_inline
def _values_and_max[
    dtype: DType, has_mask: Bool, W: Int
](
    z: Pointer[Scalar[accum_dtype[dtype]()], MutAnyOrigin],
    x: Pointer[Scalar[dtype], MutAnyOrigin],
    mask: Pointer[Scalar[dtype], MutAnyOrigin],
    count: Int,
    scale: Scalar[accum_dtype[dtype]()],
) -> Scalar[accum_dtype[dtype]()]:
    """z[0:count] = masked_value(x, scale, mask); their max, NaN left out
    (-inf if there is none: NaN still reaches the sum)."""
    comptime acc = accum_dtype[dtype]()
    var n_vec = count - count % W
    var mv = SIMD[acc, W](-inf[acc]())
    for j in range(0, n_vec, W):
        var mk = SIMD[acc, W](0)
        comptime if has_mask:
            mk = mask.unsafe_offset(j).unsafe_load[width=W]().cast[acc]()
        var v = masked_value[acc, W](
            x.unsafe_offset(j).unsafe_load[width=W]().cast[acc](), scale, mk
        )
        z.unsafe_offset(j).unsafe_store(v)
        mv = v.gt(mv).select(v, mv)
    var m = mv.reduce_max()
    for j in range(n_vec, count):
        var mk = Scalar[acc](0)
        comptime if has_mask:
            mk = mask[unsafe_offset=j].cast[acc]()
        var v = masked_value[acc, 1](x[unsafe_offset=j].cast[acc](), scale, mk)
        z[unsafe_offset=j] = v
        m = v.gt(m).select(v, m)
    return m


@fieldwise_init
struct MaskedExps[dtype: DType, log_out: Bool, has_mask: Bool](RowTerms):
    """exp(z - shift) of a row of values z, 0 where z is -inf (dropped);
    softmax parks each exp in z. The vector body prefetches the next row's
    x and mask into L2, and this row's y for the write sweep."""

    comptime acc = accum_dtype[Self.dtype]()

    var row: ZRow[Self.dtype]
    """The row's output y, its values z and shift m."""
    var next_x: HeldRows[Self.dtype]
    """The next row of x."""
    var next_mask: HeldRows[Self.dtype]
    """The next row of the mask."""

    @always_inline
    def term[w: Int](self, j: Int) -> SIMD[Self.acc, w]:
        """The exps at j, parked."""
        # 16-bit softmax rounds its outputs to 16 bits: exps good to ~1e-6
        # do (`exp_lean`, as cpu_rows).
        comptime lean = not Self.log_out and size_of[Self.dtype]() < 4
        var v = self.row.value[w](j)
        var shift = self.row.m
        var e: SIMD[Self.acc, w]
        comptime if w == 1:
            e = exp_nan[Self.acc, w](v - shift)
        else:
            comptime to_l2 = PrefetchOptions().for_read().medium_locality()
            comptime for_write = PrefetchOptions().for_write().medium_locality()
            prefetch[to_l2](self.next_x.unsafe_offset(j))
            comptime if Self.has_mask:
                prefetch[to_l2](self.next_mask.unsafe_offset(j))
            prefetch[for_write](self.row.y.unsafe_offset(j))
            # Exactly 0 where dropped (the vector exp of -inf is 4e-39).
            e = v.eq(-inf[Self.acc]()).select(
                SIMD[Self.acc, w](0), row_exp[Self.acc, w, lean](v - shift)
            )
        comptime if not Self.log_out:
            self.row.scratch.unsafe_offset(j).unsafe_store(e)
        return e


@always_inline
def _write[
    dtype: DType, log_out: Bool
](row: ZRow[dtype], count: Int, n: Int, rs: Scalar[accum_dtype[dtype]()]):
    """y[0:count] from the parked exps (softmax) or the values (log-softmax);
    y[count:n], past a causal row's diagonal, 0 or -inf."""
    comptime acc = accum_dtype[dtype]()
    var shift = row.m
    row.write[log_out](count, rs)
    # A dropped position's value, computed as a kept one would be: 0 or
    # -inf, but NaN in a row made NaN by a kept NaN or +inf (as the GPU
    # kernel and the reference give).
    var fill = (
        ((-inf[acc]() - shift) - rs)
        .cast[dtype]() if log_out else (Scalar[acc](0) * rs)
        .cast[dtype]()
    )
    for j in range(count, n):
        row.y[unsafe_offset=j] = fill
