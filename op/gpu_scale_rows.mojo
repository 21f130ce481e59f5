"""Rows multiplied in place by a factor held on the device, skipped where it is 1.

The torch bridge's cross-entropy writes d loss / d logits in its forward;
its backward must scale that by the incoming gradient, a device tensor that
is almost always 1 (`loss.backward()`). Reading it on the host would cost a
sync; `torch.mul_` would cost a full pass over the gradient (a read and a
write of the largest tensor in the model, doubling the step's traffic).
Here each block reads the factor of its rows on the device and leaves them
untouched when it is 1, so the common case moves no gradient bytes.
"""

from max.gpu import block_idx, grid_dim, thread_idx
from max.gpu.host import DeviceContext

comptime SCALE_THREADS = 256
"""Threads a block; a block walks whole rows, a thread every SCALE_THREADS-th
element of one."""

comptime SCALE_BLOCKS = 1056
"""Blocks at most (8 per SM on an H100); they stride over the rows."""


def scale_rows_kernel[
    dtype: DType, per_row: Bool
](
    data: Pointer[Scalar[dtype], MutAnyOrigin],
    factor: Pointer[Scalar[dtype], MutAnyOrigin],
    rows: Int64,
    n: Int64,
):
    """`data[r, :] *= factor[r]` (`per_row`) or `*= factor[0]`, for rows whose
    factor is not 1.

    Args:
        data: (rows, n) elements, contiguous.
        factor: (rows,) factors if `per_row`, else one.
        rows: Number of rows.
        n: Row length.

    Parameters:
        dtype: The element type of `data` and `factor`.
        per_row: Whether each row has its own factor.
    """
    var len = Int(n)
    var row = Int(block_idx.x)
    while row < Int(rows):
        var f = factor[unsafe_offset=row if per_row else 0]
        if f != 1:
            var base = row * len
            var i = Int(thread_idx.x)
            while i < len:
                data[unsafe_offset=base + i] = data[unsafe_offset=base + i] * f
                i += SCALE_THREADS
        else:
            comptime if not per_row:
                return  # one factor, and it is 1: every row is done
        row += Int(grid_dim.x)


def launch_scale_rows[
    dtype: DType
](
    ctx: DeviceContext,
    data: Pointer[Scalar[dtype], MutAnyOrigin],
    factor: Pointer[Scalar[dtype], MutAnyOrigin],
    rows: Int,
    n: Int,
    per_row: Bool,
) raises:
    """Launch `scale_rows_kernel` on `ctx`'s queue: a block per row up to
    SCALE_BLOCKS. Nothing is launched for an empty tensor."""
    if rows == 0 or n == 0:
        return
    comptime for flag in range(2):
        if per_row == (flag == 1):
            comptime kernel = scale_rows_kernel[dtype, flag == 1]
            ctx.enqueue_function[kernel](
                data,
                factor,
                Int64(rows),
                Int64(n),
                grid_dim=min(rows, SCALE_BLOCKS),
                block_dim=SCALE_THREADS,
            )
