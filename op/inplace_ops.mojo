"""Destination-passing twins of the ops in softmax_op.mojo, for bridges.

A torch custom op hands MAX its output tensor as a mutable buffer. With an
ordinary op MAX would write the result to a temporary and then copy it into
that buffer: one more read and write of the whole tensor, which doubles the
traffic of a memory-bound softmax. These ops write into the buffer directly.
Used by python/max_softmax/torch.py through `ops.inplace_custom`.
"""

import extensibility
from extensibility import InputTensor
from extensibility import _MutableInputTensor as MutableInputTensor
from max.gpu.host import DeviceContext

from .dispatch import softmax_backward_rows, softmax_rows


@extensibility.register("softmax_into")
struct SoftmaxInto:
    """Softmax along axis 1 of an (outer, n, inner) tensor, into `output`."""

    @staticmethod
    def execute[
        target: StaticString, dtype: DType
    ](
        output: MutableInputTensor[dtype=dtype, rank=3, static_spec=_],
        input: InputTensor[dtype=dtype, rank=3, static_spec=_],
        ctx: DeviceContext,
    ) raises:
        softmax_rows[target, dtype, False, "auto"](
            ctx,
            rebind[Pointer[Scalar[dtype], MutAnyOrigin]](output.unsafe_ptr()),
            rebind[Pointer[Scalar[dtype], MutAnyOrigin]](input.unsafe_ptr()),
            input.dim_size(0),
            input.dim_size(1),
            input.dim_size(2),
        )


@extensibility.register("log_softmax_into")
struct LogSoftmaxInto:
    """Log-softmax along axis 1 of an (outer, n, inner) tensor, into `output`.
    """

    @staticmethod
    def execute[
        target: StaticString, dtype: DType
    ](
        output: MutableInputTensor[dtype=dtype, rank=3, static_spec=_],
        input: InputTensor[dtype=dtype, rank=3, static_spec=_],
        ctx: DeviceContext,
    ) raises:
        softmax_rows[target, dtype, True, "auto"](
            ctx,
            rebind[Pointer[Scalar[dtype], MutAnyOrigin]](output.unsafe_ptr()),
            rebind[Pointer[Scalar[dtype], MutAnyOrigin]](input.unsafe_ptr()),
            input.dim_size(0),
            input.dim_size(1),
            input.dim_size(2),
        )


@extensibility.register("softmax_backward_into")
struct SoftmaxBackwardInto:
    """Gradient of softmax along axis 1, into `dx`."""

    @staticmethod
    def execute[
        target: StaticString, dtype: DType
    ](
        dx: MutableInputTensor[dtype=dtype, rank=3, static_spec=_],
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


@extensibility.register("log_softmax_backward_into")
struct LogSoftmaxBackwardInto:
    """Gradient of log-softmax along axis 1, into `dx`."""

    @staticmethod
    def execute[
        target: StaticString, dtype: DType
    ](
        dx: MutableInputTensor[dtype=dtype, rank=3, static_spec=_],
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
