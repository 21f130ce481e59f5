"""The cross-entropy ops' work (`CrossEntropyCall`): loss, or loss and
gradient, fused.

Each takes logits as a (rows, classes) view (a free reshape in the graph,
see python/max_softmax/ops.py), int64 targets (rows,) and `options`, a
float64 tensor on the op's device: (ignore_index, label_smoothing) for the
plain loss, or the extended options (z-loss, softcap, class weights; their
layout is `extended_layout`'s, op/cross_entropy_math.mojo). Run-time
values, so one compiled model per (op, dtype, reduction, device) serves all
of them. The options' length (known on the host) picks the kernels:
PLAIN_OPTIONS the plain kernels, more the extended terms (cpu_ce_options;
on the GPU `launch_cross_entropy` with `n_options`). `reduction` ("mean", "sum", "none") is a compile-time
parameter: it decides the loss's shape, (1,) or (rows,).

`cross_entropy_with_grad` also writes dlogits = d loss / d logits (for
"none": the gradient of the sum of the row losses). The work is a
`CrossEntropyCall`, which the launch extension builds too. The `*_into`
twins write into given buffers, for the torch bridge (see
registered_ops.mojo).
"""

from max.gpu.host import DeviceContext

from .cpu_ce_options import cross_entropy_options_cpu
from .cpu_cross_entropy import cross_entropy_cpu
from .cross_entropy_math import PLAIN_OPTIONS
from .gpu_cross_entropy import launch_cross_entropy
from .gpu_launch import HeldRows, kernel_arg
from .op_call import DeviceOptions, OpCall, RowsView


@fieldwise_init
struct CrossEntropyCall[
    dtype: DType,
    with_grad: Bool,
    reduction: StaticString,
    variant: StaticString = "auto",
](OpCall):
    """Cross-entropy of the (rows, n) `logits` against `targets` into
    `loss` ((1,) for "mean"/"sum", (rows,) for "none"), and d loss / d
    logits into `dlogits` where `with_grad`; GPU rows under `variant`
    (`launch_cross_entropy`)."""

    var logits: HeldRows[Self.dtype]
    """(rows, n) logits."""
    var targets: HeldRows[DType.int64]
    """(rows,) class indices."""
    var view: RowsView
    """(rows, n, 1)."""
    var options: DeviceOptions
    """PLAIN_OPTIONS values, or an extended layout."""
    var loss: HeldRows[Self.dtype]
    """The loss."""
    var dlogits: HeldRows[Self.dtype]
    """The gradient (without `with_grad` never written: any address)."""

    def run[target: StaticString](self, ctx: DeviceContext) raises:
        """Run the op on `target`: the plain families for PLAIN_OPTIONS
        options, the extended ones (z-loss, softcap or class weights) for
        more, so that the plain kernels do the same work as without them."""
        comptime assert (
            Self.reduction == "mean"
            or Self.reduction == "sum"
            or Self.reduction == "none"
        ), "reduction must be mean, sum or none"
        var n_options = self.options.count
        if n_options < PLAIN_OPTIONS:
            raise Error(
                t"max_softmax: cross_entropy options must hold at least"
                t" {PLAIN_OPTIONS} values, got {n_options}"
            )
        var rows = self.view.outer
        var n = self.view.n
        var loss = kernel_arg(self.loss)
        var dlogits = kernel_arg(self.dlogits)
        var logits = kernel_arg(self.logits)
        var targets = kernel_arg(self.targets)
        var options = kernel_arg(self.options.values)
        comptime if target == "cpu":
            if n_options > PLAIN_OPTIONS:
                cross_entropy_options_cpu[
                    Self.dtype, Self.with_grad, Self.reduction
                ](loss, dlogits, logits, targets, options, n_options, rows, n)
                return
            var ignore_index = Int64(options[unsafe_offset=0])
            var eps = options[unsafe_offset=1]
            cross_entropy_cpu[Self.dtype, Self.with_grad, Self.reduction](
                loss, dlogits, logits, targets, ignore_index, eps, rows, n
            )
        elif target == "gpu":
            launch_cross_entropy[
                Self.dtype, Self.with_grad, Self.reduction, Self.variant
            ](ctx, loss, dlogits, logits, targets, options, rows, n, n_options)
        else:
            raise Error("max_softmax: unsupported target " + String(target))
