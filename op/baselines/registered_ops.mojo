"""The baseline families as ops of their own, for `variant=` "tree",
"online" and "split_smem" (python/max_softmax/ops.py routes those names
here). Registered from this folder so that the live package never imports
a baseline: deleting op/baselines/ removes these ops and nothing else.
"""

import extensibility
from extensibility import InputTensor, OutputTensor
from max.gpu.host import DeviceContext

from ..registered_ops import forward_rows
from .gpu_online_rows import launch_online_rows
from .gpu_split_smem_rows import launch_split_smem_rows
from .gpu_tree_rows import launch_tree_rows


def launch_baseline[
    dtype: DType, log_out: Bool, variant: StaticString
](
    ctx: DeviceContext,
    dst: Pointer[Scalar[dtype], MutAnyOrigin],
    src: Pointer[Scalar[dtype], MutAnyOrigin],
    rows: Int,
    n: Int,
    aligned: Bool,
) raises:
    """Launch the baseline family `variant` names on `rows` contiguous rows
    of `n`."""
    comptime if variant == "tree":
        launch_tree_rows[dtype, log_out](ctx, dst, src, rows, n)
    elif variant == "online":
        launch_online_rows[dtype, log_out](ctx, dst, src, rows, n, aligned)
    elif variant == "split_smem":
        launch_split_smem_rows[dtype, log_out](ctx, dst, src, rows, n, aligned)
    else:
        raise Error("max_softmax: unknown baseline '" + String(variant) + "'")


def _baseline_forward[
    target: StaticString, dtype: DType, log_out: Bool, variant: StaticString
](
    ctx: DeviceContext,
    output: OutputTensor[dtype=dtype, rank=3, static_spec=_],
    input: InputTensor[dtype=dtype, rank=3, static_spec=_],
) raises:
    """Softmax (or log-softmax) of `input` along axis 1 by the baseline
    `variant`: the live path for everything but contiguous GPU rows."""
    forward_rows[
        target, dtype, log_out, launch_baseline[dtype, log_out, variant]
    ](ctx, output, input)


@extensibility.register("softmax_baseline")
struct SoftmaxBaseline:
    """Softmax along axis 1 of an (outer, n, inner) tensor by a baseline."""

    @staticmethod
    def execute[
        target: StaticString, dtype: DType, variant: StaticString
    ](
        output: OutputTensor[dtype=dtype, rank=3, static_spec=_],
        input: InputTensor[dtype=dtype, rank=3, static_spec=_],
        ctx: DeviceContext,
    ) raises:
        """Run the op."""
        _baseline_forward[target, dtype, False, variant](ctx, output, input)


@extensibility.register("log_softmax_baseline")
struct LogSoftmaxBaseline:
    """Log-softmax along axis 1 of an (outer, n, inner) tensor by a baseline."""

    @staticmethod
    def execute[
        target: StaticString, dtype: DType, variant: StaticString
    ](
        output: OutputTensor[dtype=dtype, rank=3, static_spec=_],
        input: InputTensor[dtype=dtype, rank=3, static_spec=_],
        ctx: DeviceContext,
    ) raises:
        """Run the op."""
        _baseline_forward[target, dtype, True, variant](ctx, output, input)
