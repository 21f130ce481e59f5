"""The soft-target cross-entropy ops' work (`SoftCrossEntropyCall`): the
loss against class probabilities, or the loss and its gradient, fused.

Each takes logits and probabilities as (rows, classes) views of one dtype
(a free reshape in the graph, see python/max_softmax/ops.py) and
`options`, a float64 tensor on the op's device: (eps, z_loss[, class
weights]) (soft_target_math). Run-time values, so one compiled model per
(op, dtype, reduction, device) serves all of them; the options' length
(known on the host) tells whether the kernels read weights. `reduction`
("mean", "sum", "none") is a compile-time parameter: it decides the loss's
shape, (1,) or (rows,).

`soft_cross_entropy_with_grad` also writes dlogits = d loss / d logits
(for "none": the gradient of the sum of the row losses). The launch
extension builds the same call; the `*_into` twins write into given
buffers, for the torch bridge (see registered_ops.mojo).
"""

from max.gpu.host import DeviceContext

from .cpu_soft_cross_entropy import soft_cross_entropy_cpu
from .gpu_launch import HeldRows, kernel_arg
from .gpu_soft_cross_entropy import launch_soft_cross_entropy
from .op_call import DeviceOptions, OpCall, RowsView


@fieldwise_init
struct SoftCrossEntropyCall[
    dtype: DType, with_grad: Bool, reduction: StaticString
](OpCall):
    """Cross-entropy of the (rows, n) `logits` against the (rows, n)
    class probabilities `probs` into `loss` ((1,) for "mean"/"sum",
    (rows,) for "none"), and d loss / d logits into `dlogits` where
    `with_grad`."""

    var logits: HeldRows[Self.dtype]
    """(rows, n) logits."""
    var probs: HeldRows[Self.dtype]
    """(rows, n) class probabilities."""
    var view: RowsView
    """(rows, n, 1)."""
    var options: DeviceOptions
    """(eps, z_loss[, n class weights])."""
    var loss: HeldRows[Self.dtype]
    """The loss."""
    var dlogits: HeldRows[Self.dtype]
    """The gradient (without `with_grad` never written: any address)."""

    def run[target: StaticString](self, ctx: DeviceContext) raises:
        """Run the op on `target`."""
        comptime assert (
            Self.reduction == "mean"
            or Self.reduction == "sum"
            or Self.reduction == "none"
        ), "reduction must be mean, sum or none"
        var rows = self.view.outer
        var n = self.view.n
        var loss = kernel_arg(self.loss)
        var dlogits = kernel_arg(self.dlogits)
        var logits = kernel_arg(self.logits)
        var probs = kernel_arg(self.probs)
        var options = kernel_arg(self.options.values)
        var count = self.options.count
        comptime if target == "cpu":
            soft_cross_entropy_cpu[Self.dtype, Self.with_grad, Self.reduction](
                loss, dlogits, logits, probs, options, count, rows, n
            )
        elif target == "gpu":
            launch_soft_cross_entropy[
                Self.dtype, Self.with_grad, Self.reduction
            ](ctx, loss, dlogits, logits, probs, options, count, rows, n)
        else:
            raise Error("max_softmax: unsupported target " + String(target))
