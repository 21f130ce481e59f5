"""The cross-entropy ops' work (`LossCall`: `CrossEntropyCall` against
class indices, `SoftCrossEntropyCall` against class probabilities,
soft_cross_entropy_ops): loss, or loss and gradient, fused.

Each takes logits as a (rows, classes) view (a free reshape in the graph,
see python/max_softmax/ops.py), int64 targets (rows,) and `options`, a
float64 tensor on the op's device: (ignore_index, label_smoothing) for the
plain loss, or the extended options (z-loss, softcap, class weights; their
layout is `extended_layout`'s, op/cross_entropy_math.mojo). Run-time
values, so one compiled model per (op, dtype, reduction, device) serves all
of them. The options' length (known on the host) picks the kernels:
PLAIN_OPTIONS the plain kernels, more the extended terms (both chosen by
`cross_entropy_cpu` on the CPU, by `launch_cross_entropy` with `n_options`
on the GPU). `reduction` ("mean", "sum", "none") is a compile-time
parameter: it decides the loss's shape, (1,) or (rows,).

`cross_entropy_with_grad` also writes dlogits = d loss / d logits (for
"none": the gradient of the sum of the row losses). The work is a
`CrossEntropyCall`, which the launch extension builds too. The `*_into`
twins write into given buffers, for the torch bridge (see
registered_ops.mojo).
"""

from max.gpu.host import DeviceContext

from .cpu_cross_entropy import cross_entropy_cpu
from .cpu_soft_cross_entropy import soft_cross_entropy_cpu
from .cross_entropy_math import PLAIN_OPTIONS
from .gpu_cross_entropy import launch_cross_entropy
from .gpu_launch import HeldRows, kernel_arg
from .gpu_soft_cross_entropy import launch_soft_cross_entropy
from .op_call import DeviceOptions, OpCall, RowsView
from .soft_cross_entropy_ops import SoftCrossEntropyCall


@fieldwise_init
struct LossCall[
    dtype: DType,
    target_dtype: DType,
    with_grad: Bool,
    reduction: StaticString,
    variant: StaticString = "auto",
](OpCall):
    """Cross-entropy of the (rows, n) `logits` against `targets` into
    `loss` ((1,) for "mean"/"sum", (rows,) for "none"), and d loss / d
    logits into `dlogits` where `with_grad`. The targets are int64 class
    indices (`target_dtype` int64: GPU rows under `variant`,
    `launch_cross_entropy`) or class probabilities of the logits' dtype
    (`launch_soft_cross_entropy`)."""

    comptime soft = Self.target_dtype != DType.int64
    """Probability targets (soft_target_math's options)."""

    var logits: HeldRows[Self.dtype]
    """(rows, n) logits."""
    var targets: HeldRows[Self.target_dtype]
    """(rows,) class indices, or (rows, n) class probabilities."""
    var view: RowsView
    """(rows, n, 1)."""
    var options: DeviceOptions
    """PLAIN_OPTIONS values or an extended layout; soft: (eps, z_loss[, n
    class weights])."""
    var loss: HeldRows[Self.dtype]
    """The loss."""
    var dlogits: HeldRows[Self.dtype]
    """The gradient (without `with_grad` never written: any address)."""

    def class_indices(self) -> Pointer[Int64, MutAnyOrigin]:
        """The targets as int64 class indices (`target_dtype` int64)."""
        return rebind[Pointer[Int64, MutAnyOrigin]](kernel_arg(self.targets))

    def run[target: StaticString](self, ctx: DeviceContext) raises:
        """Run the op on `target`. Class indices: the plain families for
        PLAIN_OPTIONS options, the extended ones (z-loss, softcap or class
        weights) for more, so that the plain kernels do the same work as
        without them."""
        comptime assert (
            Self.reduction == "mean"
            or Self.reduction == "sum"
            or Self.reduction == "none"
        ), "reduction must be mean, sum or none"
        comptime assert (
            not Self.soft or Self.target_dtype == Self.dtype
        ), "class probabilities are of the logits' dtype"
        var n_options = self.options.count
        comptime if not Self.soft:
            if n_options < PLAIN_OPTIONS:
                raise Error(
                    t"max_softmax: cross_entropy options must hold at least"
                    t" {PLAIN_OPTIONS} values, got {n_options}"
                )
        comptime dtype = Self.dtype
        comptime with_grad = Self.with_grad
        comptime rd = Self.reduction
        comptime if Self.soft:
            # The very type (`target_dtype` == `dtype`, asserted above).
            var call = rebind[SoftCrossEntropyCall[dtype, with_grad, rd]](self)
            comptime if target == "cpu":
                soft_cross_entropy_cpu[dtype, with_grad, rd](call)
                return
            elif target == "gpu":
                launch_soft_cross_entropy[dtype, with_grad, rd](ctx, call)
                return
        else:
            comptime if target == "cpu":
                # Variants are the GPU's.
                cross_entropy_cpu[dtype, with_grad, rd](
                    rebind[CrossEntropyCall[dtype, with_grad, rd]](self)
                )
                return
            elif target == "gpu":
                launch_cross_entropy[dtype, with_grad, rd, Self.variant](
                    ctx,
                    kernel_arg(self.loss),
                    kernel_arg(self.dlogits),
                    kernel_arg(self.logits),
                    self.class_indices(),
                    kernel_arg(self.options.values),
                    self.view.outer,
                    self.view.n,
                    n_options,
                )
                return
        raise Error("max_softmax: unsupported target " + String(target))


comptime CrossEntropyCall[
    dtype: DType,
    with_grad: Bool,
    reduction: StaticString,
    variant: StaticString = "auto",
] = LossCall[dtype, DType.int64, with_grad, reduction, variant]
"""Cross-entropy against (rows,) int64 class indices."""
