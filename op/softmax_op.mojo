"""The custom ops MAX loads from this package.

Each op takes a rank-3 (outer, n, inner) view made by a free reshape in the
graph (see python/max_softmax/ops.py) and works along n, so one compiled
kernel per (op, dtype, device) serves every rank, axis and shape.
"""

import extensibility
from extensibility import InputTensor, OutputTensor
from max.gpu.host import DeviceContext

from .dispatch import softmax_rows


@extensibility.register("softmax")
struct Softmax:
    """Softmax along axis 1 of an (outer, n, inner) tensor."""

    @staticmethod
    def execute[
        # "cpu" or "gpu": the kind of device this runs on.
        target: StaticString,
        # Element type of input and output.
        dtype: DType,
        # Kernel family: "auto" (the dispatch table) or one named in it.
        variant: StaticString = "auto",
    ](
        output: OutputTensor[dtype=dtype, rank=3, static_spec=_],
        input: InputTensor[dtype=dtype, rank=3, static_spec=_],
        ctx: DeviceContext,
    ) raises:
        softmax_rows[target, dtype, False, variant](
            ctx,
            rebind[Pointer[Scalar[dtype], MutAnyOrigin]](output.unsafe_ptr()),
            rebind[Pointer[Scalar[dtype], MutAnyOrigin]](input.unsafe_ptr()),
            input.dim_size(0),
            input.dim_size(1),
            input.dim_size(2),
        )


@extensibility.register("log_softmax")
struct LogSoftmax:
    """Log-softmax along axis 1 of an (outer, n, inner) tensor."""

    @staticmethod
    def execute[
        target: StaticString,
        dtype: DType,
        variant: StaticString = "auto",
    ](
        output: OutputTensor[dtype=dtype, rank=3, static_spec=_],
        input: InputTensor[dtype=dtype, rank=3, static_spec=_],
        ctx: DeviceContext,
    ) raises:
        softmax_rows[target, dtype, True, variant](
            ctx,
            rebind[Pointer[Scalar[dtype], MutAnyOrigin]](output.unsafe_ptr()),
            rebind[Pointer[Scalar[dtype], MutAnyOrigin]](input.unsafe_ptr()),
            input.dim_size(0),
            input.dim_size(1),
            input.dim_size(2),
        )
