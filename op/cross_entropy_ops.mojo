"""The cross-entropy ops MAX calls: loss, or loss and gradient, fused.

Each takes logits as a (rows, classes) view (a free reshape in the graph,
see python/max_softmax/ops.py), int64 targets (rows,) and `options`, a
float64 tensor on the op's device: (ignore_index, label_smoothing) for the
plain loss, or the extended options (z-loss, softcap, class weights; their
layout is `extended_layout`'s, op/cross_entropy_math.mojo). Run-time
values, so one compiled model per (op, dtype, reduction, device) serves all
of them. The options' length (known on the host) picks the kernels:
PLAIN_OPTIONS the plain families, more the extended ones (cpu_ce_options,
gpu_ce_options_rows). `reduction` ("mean", "sum", "none") is a compile-time
parameter: it decides the loss's shape, (1,) or (rows,).

`cross_entropy_with_grad` also writes dlogits = d loss / d logits (for
"none": the gradient of the sum of the row losses). The work is a
`CrossEntropyCall`, which the launch extension builds too. The `*_into`
twins write into given buffers, for the torch bridge (see
registered_ops.mojo).
"""

import extensibility
from extensibility import IO, InputTensor, ManagedTensorSlice
from max.gpu.host import DeviceContext

from .cpu_ce_options import cross_entropy_options_cpu
from .cpu_cross_entropy import cross_entropy_cpu
from .cross_entropy_math import PLAIN_OPTIONS
from .gpu_ce_options_rows import launch_cross_entropy_options
from .gpu_cross_entropy import launch_cross_entropy
from .gpu_launch import HeldRows, kernel_arg
from .registered_ops import OpCall, rows_of, written


@fieldwise_init
struct CrossEntropyCall[
    dtype: DType,
    with_grad: Bool,
    reduction: StaticString,
    variant: StaticString = "auto",
](OpCall):
    """Cross-entropy of `rows` rows of `n` logits against `targets` into
    `loss` ((1,) for "mean"/"sum", (rows,) for "none"), and d loss / d
    logits into `dlogits` where `with_grad`; GPU rows under `variant`
    (`launch_cross_entropy`)."""

    var loss: HeldRows[Self.dtype]
    """The loss."""
    var dlogits: HeldRows[Self.dtype]
    """The gradient (without `with_grad` never written: any address)."""
    var logits: HeldRows[Self.dtype]
    """(rows, n) logits."""
    var targets: HeldRows[DType.int64]
    """(rows,) class indices."""
    var options: HeldRows[DType.float64]
    """The options, on the device that runs the op."""
    var n_options: Int
    """The options' length: PLAIN_OPTIONS, or an extended layout."""
    var rows: Int
    """Number of rows."""
    var n: Int
    """Classes a row."""

    def run[target: StaticString](self, ctx: DeviceContext) raises:
        """Run the op on `target`: the plain families for PLAIN_OPTIONS
        options, the extended ones for more."""
        comptime assert (
            Self.reduction == "mean"
            or Self.reduction == "sum"
            or Self.reduction == "none"
        ), "reduction must be mean, sum or none"
        if self.n_options < PLAIN_OPTIONS:
            raise Error(
                t"max_softmax: cross_entropy options must hold at least"
                t" {PLAIN_OPTIONS} values, got {self.n_options}"
            )
        if self.n_options > PLAIN_OPTIONS:
            # z-loss, softcap or class weights: their own families, so that
            # the plain kernels below do the same work as without them.
            self.extended[target](ctx)
            return
        var options = kernel_arg(self.options)
        comptime if target == "cpu":
            cross_entropy_cpu[Self.dtype, Self.with_grad, Self.reduction](
                kernel_arg(self.loss),
                kernel_arg(self.dlogits),
                kernel_arg(self.logits),
                kernel_arg(self.targets),
                Int64(options[unsafe_offset=0]),
                options[unsafe_offset=1],
                self.rows,
                self.n,
            )
        elif target == "gpu":
            launch_cross_entropy[
                Self.dtype, Self.with_grad, Self.reduction, Self.variant
            ](
                ctx,
                kernel_arg(self.loss),
                kernel_arg(self.dlogits),
                kernel_arg(self.logits),
                kernel_arg(self.targets),
                options,
                self.rows,
                self.n,
            )
        else:
            raise Error("max_softmax: unsupported target " + String(target))

    def extended[target: StaticString](self, ctx: DeviceContext) raises:
        """The extended families (z-loss, softcap, class weights) on
        `target`."""
        comptime if target == "cpu":
            cross_entropy_options_cpu[
                Self.dtype, Self.with_grad, Self.reduction
            ](
                kernel_arg(self.loss),
                kernel_arg(self.dlogits),
                kernel_arg(self.logits),
                kernel_arg(self.targets),
                kernel_arg(self.options),
                self.n_options,
                self.rows,
                self.n,
            )
        elif target == "gpu":
            launch_cross_entropy_options[
                Self.dtype, Self.with_grad, Self.reduction
            ](
                ctx,
                kernel_arg(self.loss),
                kernel_arg(self.dlogits),
                kernel_arg(self.logits),
                kernel_arg(self.targets),
                kernel_arg(self.options),
                self.n_options,
                self.rows,
                self.n,
            )
        else:
            raise Error("max_softmax: unsupported target " + String(target))


def cross_entropy_rows[
    target: StaticString,
    dtype: DType,
    with_grad: Bool,
    reduction: StaticString,
    variant: StaticString = "auto",
](
    ctx: DeviceContext,
    loss: ManagedTensorSlice[dtype=dtype, rank=1, ...],
    dlogits: HeldRows[dtype],
    logits: InputTensor[dtype=dtype, rank=2, static_spec=_],
    targets: InputTensor[dtype=DType.int64, rank=1, static_spec=_],
    options: InputTensor[dtype=DType.float64, rank=1, static_spec=_],
) raises:
    """The `CrossEntropyCall` of the tensors, run on `target`."""
    CrossEntropyCall[dtype, with_grad, reduction, variant](
        rows_of(loss),
        dlogits,
        rows_of(logits),
        rows_of(targets),
        rows_of(options),
        options.dim_size(0),
        logits.dim_size(0),
        logits.dim_size(1),
    ).run[target](ctx)


trait CrossEntropyOp:
    """cross_entropy into a new tensor or, for the `*_into` twin, a given
    buffer (`io`)."""

    comptime io: IO
    """`IO.Output` (a new tensor) or `IO.Input` (into a given buffer)."""

    @staticmethod
    def execute[
        # "cpu" or "gpu": the kind of device this runs on.
        target: StaticString,
        # Element type of logits and loss.
        dtype: DType,
        # "mean", "sum" (loss of shape (1,)) or "none" (shape (rows,)).
        reduction: StaticString = "mean",
        # Strategy: "auto", "register", "smem", "pair" or "block".
        variant: StaticString = "auto",
    ](
        loss: ManagedTensorSlice[
            io_spec=written[Self.io], dtype=dtype, rank=1, static_spec=_
        ],
        logits: InputTensor[dtype=dtype, rank=2, static_spec=_],
        targets: InputTensor[dtype=DType.int64, rank=1, static_spec=_],
        options: InputTensor[dtype=DType.float64, rank=1, static_spec=_],
        ctx: DeviceContext,
    ) raises:
        """Run the op."""
        # No gradient: the kernels never write through this pointer.
        cross_entropy_rows[target, dtype, False, reduction, variant](
            ctx, loss, rows_of(logits), logits, targets, options
        )


trait CrossEntropyGradOp:
    """cross_entropy_with_grad into new tensors or, for the `*_into` twin,
    given buffers (`io`)."""

    comptime io: IO
    """`IO.Output` (new tensors) or `IO.Input` (into given buffers)."""

    @staticmethod
    def execute[
        target: StaticString,
        dtype: DType,
        reduction: StaticString = "mean",
        # Strategy: "auto", "register", "smem", "pair" or "block".
        variant: StaticString = "auto",
    ](
        loss: ManagedTensorSlice[
            io_spec=written[Self.io], dtype=dtype, rank=1, static_spec=_
        ],
        dlogits: ManagedTensorSlice[
            io_spec=written[Self.io], dtype=dtype, rank=2, static_spec=_
        ],
        logits: InputTensor[dtype=dtype, rank=2, static_spec=_],
        targets: InputTensor[dtype=DType.int64, rank=1, static_spec=_],
        options: InputTensor[dtype=DType.float64, rank=1, static_spec=_],
        ctx: DeviceContext,
    ) raises:
        """Run the op."""
        cross_entropy_rows[target, dtype, True, reduction, variant](
            ctx, loss, rows_of(dlogits), logits, targets, options
        )


@extensibility.register("cross_entropy")
struct CrossEntropy(CrossEntropyOp):
    """Cross-entropy of (rows, classes) logits against (rows,) targets."""

    comptime io = IO.Output


@extensibility.register("cross_entropy_with_grad")
struct CrossEntropyWithGrad(CrossEntropyGradOp):
    """Cross-entropy and d loss / d logits, from one pass over the logits."""

    comptime io = IO.Output


@extensibility.register("cross_entropy_into")
struct CrossEntropyInto(CrossEntropyOp):
    """Cross-entropy, into `loss`."""

    comptime io = IO.Input


@extensibility.register("cross_entropy_with_grad_into")
struct CrossEntropyWithGradInto(CrossEntropyGradOp):
    """Cross-entropy and its gradient, into `loss` and `dlogits`."""

    comptime io = IO.Input
