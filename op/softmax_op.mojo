"""The custom ops MAX loads from this package.

Each op takes a rank-3 (outer, n, inner) view made by a free reshape in the
graph (see python/max_softmax/ops.py) and works along n, so one compiled
kernel per (op, dtype, device) serves every rank, axis and shape.
"""

import extensibility
from extensibility import InputTensor, OutputTensor
from max.gpu.host import DeviceContext

from .dispatch import softmax_backward_rows, softmax_rows


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


@extensibility.register("softmax_backward")
struct SoftmaxBackward:
    """Gradient of softmax along axis 1: dx = y * (dy - sum(dy * y))."""

    @staticmethod
    def execute[
        target: StaticString,
        dtype: DType,
    ](
        dx: OutputTensor[dtype=dtype, rank=3, static_spec=_],
        y: InputTensor[dtype=dtype, rank=3, static_spec=_],
        dy: InputTensor[dtype=dtype, rank=3, static_spec=_],
        ctx: DeviceContext,
    ) raises:
        softmax_backward_rows[target, dtype, False](
            ctx,
            rebind[Pointer[Scalar[dtype], MutAnyOrigin]](dx.unsafe_ptr()),
            rebind[Pointer[Scalar[dtype], MutAnyOrigin]](y.unsafe_ptr()),
            rebind[Pointer[Scalar[dtype], MutAnyOrigin]](dy.unsafe_ptr()),
            y.dim_size(0),
            y.dim_size(1),
            y.dim_size(2),
        )


@extensibility.register("log_softmax_backward")
struct LogSoftmaxBackward:
    """Gradient of log-softmax along axis 1: dx = dy - exp(logp) * sum(dy)."""

    @staticmethod
    def execute[
        target: StaticString,
        dtype: DType,
    ](
        dx: OutputTensor[dtype=dtype, rank=3, static_spec=_],
        logp: InputTensor[dtype=dtype, rank=3, static_spec=_],
        dy: InputTensor[dtype=dtype, rank=3, static_spec=_],
        ctx: DeviceContext,
    ) raises:
        softmax_backward_rows[target, dtype, True](
            ctx,
            rebind[Pointer[Scalar[dtype], MutAnyOrigin]](dx.unsafe_ptr()),
            rebind[Pointer[Scalar[dtype], MutAnyOrigin]](logp.unsafe_ptr()),
            rebind[Pointer[Scalar[dtype], MutAnyOrigin]](dy.unsafe_ptr()),
            logp.dim_size(0),
            logp.dim_size(1),
            logp.dim_size(2),
        )
