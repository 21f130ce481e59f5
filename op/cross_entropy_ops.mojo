"""The cross-entropy ops MAX calls: loss, or loss and gradient, fused.

Each takes logits as a (rows, classes) view (a free reshape in the graph,
see python/max_softmax/ops.py), int64 targets (rows,) and `options`, a
float64 tensor on the op's device holding (ignore_index, label_smoothing),
or (ignore_index, label_smoothing, z_loss, softcap[, a weight per class])
for the extended options: run-time values, so one compiled model per (op,
dtype, reduction, device) serves all of them. The options' length (known
on the host) picks the kernels: 2 the plain families, more the extended
ones (cpu_ce_options, gpu_ce_options_rows). `reduction` ("mean", "sum", "none") is a
compile-time parameter: it decides the loss's shape, (1,) or (rows,).

`cross_entropy_with_grad` also writes dlogits = d loss / d logits (for
"none": the gradient of the sum of the row losses). The `*_into` twins
write into given buffers, for the torch bridge (see registered_ops.mojo).
"""

import extensibility
from extensibility import InputTensor, ManagedTensorSlice, OutputTensor
from extensibility import _MutableInputTensor as MutableInputTensor
from max.gpu.host import DeviceContext

from .cpu_ce_options import cross_entropy_options_cpu
from .cpu_cross_entropy import cross_entropy_cpu
from .cross_entropy_math import PLAIN_OPTIONS
from .gpu_ce_options_rows import launch_cross_entropy_options
from .gpu_cross_entropy import launch_cross_entropy
from .registered_ops import rows_ptr as _ptr


def cross_entropy_rows[
    target: StaticString,
    dtype: DType,
    with_grad: Bool,
    reduction: StaticString,
    variant: StaticString = "auto",
](
    ctx: DeviceContext,
    loss: ManagedTensorSlice[dtype=dtype, rank=1, ...],
    dlogits: Pointer[Scalar[dtype], MutAnyOrigin],
    logits: InputTensor[dtype=dtype, rank=2, static_spec=_],
    targets: InputTensor[dtype=DType.int64, rank=1, static_spec=_],
    options: InputTensor[dtype=DType.float64, rank=1, static_spec=_],
) raises:
    """Cross-entropy of `logits` rows against `targets` on `target` (the
    gradient into `dlogits` where `with_grad`); GPU rows under `variant`
    (`launch_cross_entropy`)."""
    comptime assert (
        reduction == "mean" or reduction == "sum" or reduction == "none"
    ), "reduction must be mean, sum or none"
    var rows = logits.dim_size(0)
    var n = logits.dim_size(1)
    var n_options = options.dim_size(0)
    if n_options < PLAIN_OPTIONS:
        raise Error(
            "max_softmax: cross_entropy options must hold at least 2 values,"
            " got "
            + String(n_options)
        )
    if n_options > PLAIN_OPTIONS:
        # z-loss, softcap or class weights: their own families, so that
        # the plain kernels below do the same work as without them.
        comptime if target == "cpu":
            cross_entropy_options_cpu[dtype, with_grad, reduction](
                _ptr(loss),
                dlogits,
                _ptr(logits),
                _ptr(targets),
                _ptr(options),
                n_options,
                rows,
                n,
            )
        elif target == "gpu":
            launch_cross_entropy_options[dtype, with_grad, reduction](
                ctx,
                _ptr(loss),
                dlogits,
                _ptr(logits),
                _ptr(targets),
                _ptr(options),
                n_options,
                rows,
                n,
            )
        else:
            raise Error("max_softmax: unsupported target " + String(target))
        return
    comptime if target == "cpu":
        var opts = _ptr(options)
        cross_entropy_cpu[dtype, with_grad, reduction](
            _ptr(loss),
            dlogits,
            _ptr(logits),
            _ptr(targets),
            Int64(opts[unsafe_offset=0]),
            opts[unsafe_offset=1],
            rows,
            n,
        )
    elif target == "gpu":
        launch_cross_entropy[dtype, with_grad, reduction, variant](
            ctx,
            _ptr(loss),
            dlogits,
            _ptr(logits),
            _ptr(targets),
            _ptr(options),
            rows,
            n,
        )
    else:
        raise Error("max_softmax: unsupported target " + String(target))


@extensibility.register("cross_entropy")
struct CrossEntropy:
    """Cross-entropy of (rows, classes) logits against (rows,) targets."""

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
        loss: OutputTensor[dtype=dtype, rank=1, static_spec=_],
        logits: InputTensor[dtype=dtype, rank=2, static_spec=_],
        targets: InputTensor[dtype=DType.int64, rank=1, static_spec=_],
        options: InputTensor[dtype=DType.float64, rank=1, static_spec=_],
        ctx: DeviceContext,
    ) raises:
        """Run the op."""
        # No gradient: the kernels never write through this pointer.
        cross_entropy_rows[target, dtype, False, reduction, variant](
            ctx, loss, _ptr(logits), logits, targets, options
        )


@extensibility.register("cross_entropy_with_grad")
struct CrossEntropyWithGrad:
    """Cross-entropy and d loss / d logits, from one pass over the logits."""

    @staticmethod
    def execute[
        target: StaticString,
        dtype: DType,
        reduction: StaticString = "mean",
        # Strategy: "auto", "register", "smem", "pair" or "block".
        variant: StaticString = "auto",
    ](
        loss: OutputTensor[dtype=dtype, rank=1, static_spec=_],
        dlogits: OutputTensor[dtype=dtype, rank=2, static_spec=_],
        logits: InputTensor[dtype=dtype, rank=2, static_spec=_],
        targets: InputTensor[dtype=DType.int64, rank=1, static_spec=_],
        options: InputTensor[dtype=DType.float64, rank=1, static_spec=_],
        ctx: DeviceContext,
    ) raises:
        """Run the op."""
        cross_entropy_rows[target, dtype, True, reduction, variant](
            ctx, loss, _ptr(dlogits), logits, targets, options
        )


@extensibility.register("cross_entropy_into")
struct CrossEntropyInto:
    """Cross-entropy, into `loss`."""

    @staticmethod
    def execute[
        target: StaticString,
        dtype: DType,
        reduction: StaticString = "mean",
    ](
        loss: MutableInputTensor[dtype=dtype, rank=1, static_spec=_],
        logits: InputTensor[dtype=dtype, rank=2, static_spec=_],
        targets: InputTensor[dtype=DType.int64, rank=1, static_spec=_],
        options: InputTensor[dtype=DType.float64, rank=1, static_spec=_],
        ctx: DeviceContext,
    ) raises:
        """Run the op."""
        cross_entropy_rows[target, dtype, False, reduction](
            ctx, loss, _ptr(logits), logits, targets, options
        )


@extensibility.register("cross_entropy_with_grad_into")
struct CrossEntropyWithGradInto:
    """Cross-entropy and its gradient, into `loss` and `dlogits`."""

    @staticmethod
    def execute[
        target: StaticString,
        dtype: DType,
        reduction: StaticString = "mean",
    ](
        loss: MutableInputTensor[dtype=dtype, rank=1, static_spec=_],
        dlogits: MutableInputTensor[dtype=dtype, rank=2, static_spec=_],
        logits: InputTensor[dtype=dtype, rank=2, static_spec=_],
        targets: InputTensor[dtype=DType.int64, rank=1, static_spec=_],
        options: InputTensor[dtype=DType.float64, rank=1, static_spec=_],
        ctx: DeviceContext,
    ) raises:
        """Run the op."""
        cross_entropy_rows[target, dtype, True, reduction](
            ctx, loss, _ptr(dlogits), logits, targets, options
        )
