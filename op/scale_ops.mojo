"""The scale_rows op's work (`ScaleCall`): rows of a buffer multiplied in
place by a factor held on the device, rows whose factor is 1 left unread.

The torch bridge's graph path runs it in the cross-entropy backward (as the
launch extension runs `op.gpu_scale_rows` directly): the gradient the
forward wrote is scaled by the incoming gradient without a host read of the
factor (a sync) and, for `loss.backward()` (factor 1), without a pass over
the gradient. `factor` is (rows,) for a factor a row, or (1,) for one.
The registration is in registered_ops.mojo.
"""

from max.gpu.host import DeviceContext

from .gpu_launch import HeldRows, kernel_arg
from .gpu_scale_rows import launch_scale_rows
from .op_call import OpCall, RowsView


def scale_rows_cpu[
    dtype: DType
](
    data: Pointer[Scalar[dtype], MutAnyOrigin],
    factor: Pointer[Scalar[dtype], MutAnyOrigin],
    rows: Int,
    n: Int,
    per_row: Bool,
):
    """`data[r, :] *= factor[r]` (`per_row`) or `*= factor[0]` on the host,
    for rows whose factor is not 1."""
    for row in range(rows):
        var f = factor[unsafe_offset=row if per_row else 0]
        if f == 1:
            continue
        var base = row * n
        for i in range(n):
            data[unsafe_offset=base + i] = data[unsafe_offset=base + i] * f


@fieldwise_init
struct ScaleCall[dtype: DType](OpCall):
    """(rows, n) `data` times `factor` in place (one factor a row where
    `per_row`, else one for all), rows whose factor is 1 untouched."""

    var data: HeldRows[Self.dtype]
    """The rows, scaled in place."""
    var factor: HeldRows[Self.dtype]
    """The factors, on the device that runs the op."""
    var view: RowsView
    """(rows, n, 1)."""
    var per_row: Bool
    """A factor a row, else one."""

    def run[target: StaticString](self, ctx: DeviceContext) raises:
        """Run the op on `target`."""
        var data = kernel_arg(self.data)
        var factor = kernel_arg(self.factor)
        var rows = self.view.outer
        comptime if target == "cpu":
            scale_rows_cpu(data, factor, rows, self.view.n, self.per_row)
        elif target == "gpu":
            launch_scale_rows(
                ctx, data, factor, rows, self.view.n, self.per_row
            )
        else:
            raise Error("max_softmax: unsupported target " + String(target))
