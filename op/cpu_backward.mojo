"""Vectorized, multithreaded CPU kernels of the backward ops.

Same layout and tasking as cpu_rows.mojo: contiguous rows are split into
tasks of whole rows with two SIMD sweeps (row sum; gradient); other axes are
processed W columns at a time along the contiguous inner dimension.
"""

from .cpu_tasks import items_per_task, run_tasks
from std.math import ceildiv
from std.sys import simd_width_of

from .cpu_rows import SUM_BLOCK
from .row_math import accum_dtype, backward_out, backward_term


def softmax_backward_cpu[
    dtype: DType, log_in: Bool
](
    dx: Pointer[Scalar[dtype], MutAnyOrigin],
    a: Pointer[Scalar[dtype], MutAnyOrigin],
    dy: Pointer[Scalar[dtype], MutAnyOrigin],
    outer: Int,
    n: Int,
    inner: Int,
) raises:
    """Gradient of softmax (a = y) or log-softmax (a = log p) for every row.

    Parameters:
        dtype: Element type of all three tensors.
        log_in: `a` is log-softmax output (log_softmax_backward).

    Args:
        dx: Output gradient, `outer * n * inner` elements, row-major.
        a: The forward op's output.
        dy: The incoming gradient.
        outer: Product of the dims before the axis.
        n: Length of the axis.
        inner: Product of the dims after it.
    """
    comptime acc = accum_dtype[dtype]()
    comptime assert acc.is_floating_point()
    comptime W = simd_width_of[acc]()
    var col_blocks = ceildiv(inner, W) if inner > 1 else 1
    # An item is a row, or W columns of n when inner > 1.
    var rows_per_task = items_per_task(n * W if inner > 1 else n)
    var items = outer * col_blocks
    var tasks = ceildiv(items, rows_per_task)

    def task(t: Int) raises {imm}:
        for item in range(
            t * rows_per_task, min(items, (t + 1) * rows_per_task)
        ):
            var o = item // col_blocks
            var i0 = (item % col_blocks) * W
            var base = o * n * inner + i0
            if inner == 1:
                _row[dtype, log_in, W](dx, a, dy, base, n)
            elif i0 + W <= inner:
                _column_block[dtype, log_in, W](dx, a, dy, base, n, inner)
            else:
                for i in range(i0, inner):
                    _column_block[dtype, log_in, 1](
                        dx, a, dy, base + i - i0, n, inner
                    )

    run_tasks(task, tasks)


@always_inline
def _row[
    dtype: DType, log_in: Bool, W: Int
](
    dx: Pointer[Scalar[dtype], MutAnyOrigin],
    a: Pointer[Scalar[dtype], MutAnyOrigin],
    dy: Pointer[Scalar[dtype], MutAnyOrigin],
    base: Int,
    n: Int,
):
    """One contiguous row, SIMD across the row."""
    comptime acc = accum_dtype[dtype]()
    var n_vec = n - n % W
    var s = Scalar[acc](0)
    for b in range(0, n_vec, SUM_BLOCK):
        var part = SIMD[acc, W](0)  # blocked summation, as in cpu_rows
        for j in range(b, min(b + SUM_BLOCK, n_vec), W):
            part += backward_term[log_in, acc, W](
                a.unsafe_offset(base + j).unsafe_load[width=W]().cast[acc](),
                dy.unsafe_offset(base + j).unsafe_load[width=W]().cast[acc](),
            )
        s += part.reduce_add()
    for j in range(n_vec, n):
        s += backward_term[log_in, acc, 1](
            a[unsafe_offset=base + j].cast[acc](),
            dy[unsafe_offset=base + j].cast[acc](),
        )
    for j in range(0, n_vec, W):
        var g = backward_out[log_in, acc, W](
            a.unsafe_offset(base + j).unsafe_load[width=W]().cast[acc](),
            dy.unsafe_offset(base + j).unsafe_load[width=W]().cast[acc](),
            s,
        )
        dx.unsafe_offset(base + j).unsafe_store(g.cast[dtype]())
    for j in range(n_vec, n):
        dx[unsafe_offset=base + j] = backward_out[log_in, acc, 1](
            a[unsafe_offset=base + j].cast[acc](),
            dy[unsafe_offset=base + j].cast[acc](),
            s,
        ).cast[dtype]()


@always_inline
def _column_block[
    dtype: DType, log_in: Bool, w: Int
](
    dx: Pointer[Scalar[dtype], MutAnyOrigin],
    a: Pointer[Scalar[dtype], MutAnyOrigin],
    dy: Pointer[Scalar[dtype], MutAnyOrigin],
    base: Int,
    n: Int,
    stride: Int,
):
    """`w` adjacent columns of stride `stride` at once."""
    comptime acc = accum_dtype[dtype]()
    var s = SIMD[acc, w](0)
    for b in range(0, n, SUM_BLOCK):
        var part = SIMD[acc, w](0)
        for j in range(b, min(b + SUM_BLOCK, n)):
            var at = base + j * stride
            part += backward_term[log_in, acc, w](
                a.unsafe_offset(at).unsafe_load[width=w]().cast[acc](),
                dy.unsafe_offset(at).unsafe_load[width=w]().cast[acc](),
            )
        s += part
    for j in range(n):
        var at = base + j * stride
        var g = backward_out[log_in, acc, w](
            a.unsafe_offset(at).unsafe_load[width=w]().cast[acc](),
            dy.unsafe_offset(at).unsafe_load[width=w]().cast[acc](),
            s,
        )
        dx.unsafe_offset(at).unsafe_store(g.cast[dtype]())
