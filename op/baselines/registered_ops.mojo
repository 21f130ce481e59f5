"""The baseline families as ops of their own, for `variant=` "tree",
"online" and "split_smem" (python/max_softmax/ops.py routes those names
here). Registered from this folder so that the live package never imports
a baseline: deleting op/baselines/ removes these ops and nothing else.
"""

import extensibility
from extensibility import InputTensor, OutputTensor
from max.gpu.host import DeviceContext

from ..gpu_launch import vector_flag_of
from ..registered_ops import forward_rows
from ..row_math import vector_width
from ..row_tensors import LaunchRows
from .gpu_online_rows import ONLINE_THREADS, online_rows_kernel
from .gpu_split_smem_rows import launch_split_smem_rows
from .gpu_tree_rows import TREE_THREADS, tree_rows_kernel


def launch_baseline[
    dtype: DType, log_out: Bool, variant: StaticString
](ctx: DeviceContext, r: LaunchRows[dtype]) raises:
    """Launch the baseline family `variant` names on `r`'s rows: the tree
    and online kernels a block a row, the split_smem rows by their own
    launcher (the split sweep times it too)."""
    var n = Int64(r.n)
    comptime if variant == "tree":
        ctx.enqueue_function[tree_rows_kernel[dtype, log_out]](
            r.dst(), r.a(), n, grid_dim=r.rows, block_dim=TREE_THREADS
        )
    elif variant == "online":
        comptime V = vector_width[dtype]()
        var flag = vector_flag_of(r.aligned, r.n, V)
        ctx.enqueue_function[online_rows_kernel[dtype, log_out, V]](
            r.dst(), r.a(), n, flag, grid_dim=r.rows, block_dim=ONLINE_THREADS
        )
    elif variant == "split_smem":
        launch_split_smem_rows[dtype, log_out](ctx, r)
    else:
        raise Error("max_softmax: unknown baseline '" + String(variant) + "'")


trait BaselineOp:
    """Softmax or log-softmax (`log_out`) by the baseline `variant`: the
    live path for everything but contiguous GPU rows."""

    comptime log_out: Bool
    """Log-softmax rather than softmax."""

    @staticmethod
    def execute[
        target: StaticString, dtype: DType, variant: StaticString
    ](
        output: OutputTensor[dtype=dtype, rank=3, static_spec=_],
        input: InputTensor[dtype=dtype, rank=3, static_spec=_],
        ctx: DeviceContext,
    ) raises:
        """Run the op along axis 1 of an (outer, n, inner) tensor."""
        forward_rows[
            target,
            dtype,
            Self.log_out,
            launch_baseline[dtype, Self.log_out, variant],
        ](ctx, output, input)


@extensibility.register("softmax_baseline")
struct SoftmaxBaseline(BaselineOp):
    """Softmax along axis 1 of an (outer, n, inner) tensor by a baseline."""

    comptime log_out = False


@extensibility.register("log_softmax_baseline")
struct LogSoftmaxBaseline(BaselineOp):
    """Log-softmax along axis 1 of an (outer, n, inner) tensor by a baseline."""

    comptime log_out = True
