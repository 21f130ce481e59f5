"""The custom ops MAX loads from this package.

Each op takes a rank-3 (outer, n, inner) view made by a free reshape in the
graph (see python/max_softmax/ops.py) and works along n, so one compiled
kernel per (op, dtype, device) serves every rank, axis and shape.

softmax, log_softmax and their backward ops write a new tensor; the `*_into`
twins write into a buffer they are given, for bridges. A torch custom op
hands MAX its output tensor as a mutable buffer; with an ordinary op MAX
would write the result to a temporary and then copy it into that buffer:
one more read and write of the whole tensor, which doubles the traffic of a
memory-bound softmax. Used by python/max_softmax/torch.py through
`ops.inplace_custom`.

Every struct's body is one call to `_forward` or `_backward`.
"""

import extensibility
from extensibility import InputTensor, ManagedTensorSlice, OutputTensor
from extensibility import _MutableInputTensor as MutableInputTensor
from max.gpu.host import DeviceContext

from .dispatch import RowsLauncher, softmax_backward_rows, softmax_rows
from .variants import launch_variant


@always_inline
def rows_ptr[
    dtype: DType
](t: ManagedTensorSlice[dtype=dtype, rank=3, ...]) -> Pointer[
    Scalar[dtype], MutAnyOrigin
]:
    """The tensor's elements, as the kernels take them."""
    return rebind[Pointer[Scalar[dtype], MutAnyOrigin]](t.unsafe_ptr())


def forward_rows[
    target: StaticString,
    dtype: DType,
    log_out: Bool,
    launch_rows: RowsLauncher[dtype],
](
    ctx: DeviceContext,
    output: ManagedTensorSlice[dtype=dtype, rank=3, ...],
    input: InputTensor[dtype=dtype, rank=3, static_spec=_],
) raises:
    """Softmax (or log-softmax) of `input` into `output`, along axis 1,
    contiguous GPU rows by `launch_rows` (see `softmax_rows`)."""
    softmax_rows[target, dtype, log_out, launch_rows](
        ctx,
        rows_ptr(output),
        rows_ptr(input),
        input.dim_size(0),
        input.dim_size(1),
        input.dim_size(2),
    )


def _forward[
    target: StaticString, dtype: DType, log_out: Bool, variant: StaticString
](
    ctx: DeviceContext,
    output: ManagedTensorSlice[dtype=dtype, rank=3, ...],
    input: InputTensor[dtype=dtype, rank=3, static_spec=_],
) raises:
    """Softmax (or log-softmax) of `input` into `output` by the live family
    `variant` names ("auto": the table)."""
    forward_rows[
        target, dtype, log_out, launch_variant[dtype, log_out, variant]
    ](ctx, output, input)


def _backward[
    target: StaticString, dtype: DType, log_in: Bool
](
    ctx: DeviceContext,
    dx: ManagedTensorSlice[dtype=dtype, rank=3, ...],
    a: InputTensor[dtype=dtype, rank=3, static_spec=_],
    dy: InputTensor[dtype=dtype, rank=3, static_spec=_],
) raises:
    """The gradient of softmax (`a` = y) or log-softmax (`a` = log p) into
    `dx`, along axis 1."""
    softmax_backward_rows[target, dtype, log_in](
        ctx,
        rows_ptr(dx),
        rows_ptr(a),
        rows_ptr(dy),
        a.dim_size(0),
        a.dim_size(1),
        a.dim_size(2),
    )


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
        """Run the op."""
        _forward[target, dtype, False, variant](ctx, output, input)


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
        """Run the op."""
        _forward[target, dtype, True, variant](ctx, output, input)


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
        """Run the op."""
        _backward[target, dtype, False](ctx, dx, y, dy)


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
        """Run the op."""
        _backward[target, dtype, True](ctx, dx, logp, dy)


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
        """Run the op."""
        _forward[target, dtype, False, "auto"](ctx, output, input)


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
        """Run the op."""
        _forward[target, dtype, True, "auto"](ctx, output, input)


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
        """Run the op."""
        _backward[target, dtype, False](ctx, dx, y, dy)


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
        """Run the op."""
        _backward[target, dtype, True](ctx, dx, logp, dy)
