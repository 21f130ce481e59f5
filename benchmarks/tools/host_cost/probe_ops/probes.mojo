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


trait ProbeOp:
    """A probe: the signature of our rank-3 row ops, and no work but, with
    `launch`, one empty kernel on the GPU (nothing on the CPU)."""

    comptime launch: Bool
    """Enqueue the empty kernel."""

    @staticmethod
    def execute[
        target: StaticString, dtype: DType
    ](
        output: OutputTensor[dtype=dtype, rank=3, static_spec=_],
        input: InputTensor[dtype=dtype, rank=3, static_spec=_],
        ctx: DeviceContext,
    ) raises:
        """Launch the empty kernel (`launch`), or do nothing."""
        comptime if Self.launch and target == "gpu":
            ctx.enqueue_function[_empty_kernel](
                Int32(input.dim_size(1)), grid_dim=1, block_dim=32
            )


@extensibility.register("probe_nothing")
struct ProbeNothing(ProbeOp):
    """Returns without touching the device."""

    comptime launch = False


@extensibility.register("probe_launch")
struct ProbeLaunch(ProbeOp):
    """Enqueues one empty kernel on the GPU (nothing on the CPU)."""

    comptime launch = True
