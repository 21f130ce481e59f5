"""Two custom ops that do no softmax work, to split our op's per-call host
cost into MAX's custom-op floor, one kernel launch, and our dispatch.

`probe_nothing` returns at once (the output is left unwritten); with
`probe_launch` each call enqueues one empty one-block kernel on the GPU.
"""

import extensibility
from extensibility import InputTensor, OutputTensor
from max.gpu.host import DeviceContext


def _empty_kernel(flag: Int32):
    """Does nothing: the launch is what is timed."""
    pass


@extensibility.register("probe_nothing")
struct ProbeNothing:
    """Returns without touching the device."""

    @staticmethod
    def execute[
        target: StaticString, dtype: DType
    ](
        output: OutputTensor[dtype=dtype, rank=3, static_spec=_],
        input: InputTensor[dtype=dtype, rank=3, static_spec=_],
        ctx: DeviceContext,
    ) raises:
        """Do nothing."""
        pass


@extensibility.register("probe_launch")
struct ProbeLaunch:
    """Enqueues one empty kernel on the GPU (nothing on the CPU)."""

    @staticmethod
    def execute[
        target: StaticString, dtype: DType
    ](
        output: OutputTensor[dtype=dtype, rank=3, static_spec=_],
        input: InputTensor[dtype=dtype, rank=3, static_spec=_],
        ctx: DeviceContext,
    ) raises:
        """Launch the empty kernel."""
        comptime if target == "gpu":
            ctx.enqueue_function[_empty_kernel](
                Int32(input.dim_size(1)), grid_dim=1, block_dim=32
            )
