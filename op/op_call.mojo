"""An op's work as a value: its buffers and dims, run on either target.

A registration's `execute` (op/registered_ops.mojo) builds an op's call from
its tensors; the launch extension (python/max_softmax/launch_ext) builds the
same call from addresses. Each op's call lives beside its kernels' routing:
`ForwardCall` and `BackwardCall` here, `MaskedCall` (masked_softmax_ops),
`CrossEntropyCall` (cross_entropy_ops), `ShardedCall` (sharded_ops) and
`ScaleCall` (scale_ops).
"""

from max.gpu.host import DeviceContext

from .dispatch import RowsLauncher, softmax_backward_rows, softmax_rows
from .gpu_launch import HeldRows
from .row_tensors import RowTensors


trait OpCall(ImplicitlyCopyable):
    """One op's work on raw buffers and dims, for either target."""

    def run[target: StaticString](self, ctx: DeviceContext) raises:
        """Run the op on `target` ("cpu" or "gpu"; the GPU's kernels are
        queued on `ctx`)."""
        ...


@fieldwise_init
struct RowsView(ImplicitlyCopyable):
    """The (outer, n, inner) view an op works along n of; a (rows, n) op's
    rows are (rows, n, 1)."""

    var outer: Int
    """Rows before the axis (the rows of a (rows, n) op)."""
    var n: Int
    """The axis' length."""
    var inner: Int
    """Elements after the axis (1: contiguous rows)."""

    def size(self) -> Int:
        """Elements in all."""
        return self.outer * self.n * self.inner


@fieldwise_init
struct DeviceOptions(ImplicitlyCopyable):
    """An op's float64 options on the device that runs it, and their length:
    the host knows the length without a sync, so it may choose kernels."""

    var values: HeldRows[DType.float64]
    """The values (read where the op runs)."""
    var count: Int
    """How many."""


@fieldwise_init
struct ForwardCall[
    dtype: DType, log_out: Bool, launch_rows: RowsLauncher[dtype]
](OpCall):
    """Softmax (or log-softmax) of `src` into `dst` along n of `view`,
    contiguous GPU rows by `launch_rows` (`softmax_rows`)."""

    var dst: HeldRows[Self.dtype]
    """Output."""
    var src: HeldRows[Self.dtype]
    """Input."""
    var view: RowsView
    """The view both share."""

    def run[target: StaticString](self, ctx: DeviceContext) raises:
        """Run the op on `target`."""
        var v = self.view
        softmax_rows[target, Self.dtype, Self.log_out, Self.launch_rows](
            ctx, RowTensors(self.dst, self.src, self.src), v.outer, v.n, v.inner
        )


@fieldwise_init
struct BackwardCall[dtype: DType, log_in: Bool, variant: StaticString](OpCall):
    """The gradient of softmax (`a` = y) or log-softmax (`log_in`, `a` =
    log p) into `dx` along n of `view`, from `dy`; contiguous GPU rows under
    `variant` (`softmax_backward_rows`)."""

    var dx: HeldRows[Self.dtype]
    """Output gradient."""
    var a: HeldRows[Self.dtype]
    """The forward op's output."""
    var dy: HeldRows[Self.dtype]
    """The incoming gradient."""
    var view: RowsView
    """The view all three share."""

    def run[target: StaticString](self, ctx: DeviceContext) raises:
        """Run the op on `target`."""
        var v = self.view
        softmax_backward_rows[target, Self.dtype, Self.log_in, Self.variant](
            ctx, RowTensors(self.dx, self.a, self.dy), v.outer, v.n, v.inner
        )
