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

Each struct names its op and its flag; its `execute` is its trait's
(`RowOp`, `RowIntoOp`, `BackwardOp`, `BackwardIntoOp`): one body an op kind.
"""

import extensibility
from extensibility import InputTensor, ManagedTensorSlice, OutputTensor
from extensibility import _MutableInputTensor as MutableInputTensor
from max.gpu.host import DeviceContext

from .dispatch import (
    RowsLauncher,
    launch_variant,
    softmax_backward_rows,
    softmax_rows,
)


@always_inline
def rows_ptr[
    dtype: DType, rank: Int
](t: ManagedTensorSlice[dtype=dtype, rank=rank, ...]) -> Pointer[
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


def _backward[
    target: StaticString, dtype: DType, log_in: Bool, variant: StaticString
](
    ctx: DeviceContext,
    dx: ManagedTensorSlice[dtype=dtype, rank=3, ...],
    a: InputTensor[dtype=dtype, rank=3, static_spec=_],
    dy: InputTensor[dtype=dtype, rank=3, static_spec=_],
) raises:
    """The gradient of softmax (`a` = y) or log-softmax (`a` = log p) into
    `dx`, along axis 1, contiguous GPU rows under `variant`."""
    softmax_backward_rows[target, dtype, log_in, variant](
        ctx,
        rows_ptr(dx),
        rows_ptr(a),
        rows_ptr(dy),
        a.dim_size(0),
        a.dim_size(1),
        a.dim_size(2),
    )


trait RowOp:
    """softmax or log_softmax (`log_out`) into a new tensor."""

    comptime log_out: Bool
    """Log-softmax rather than softmax."""

    @staticmethod
    def execute[
        # "cpu" or "gpu": the kind of device this runs on.
        target: StaticString,
        # Element type of input and output.
        dtype: DType,
        # Strategy: "auto" (the dispatch table) or a name (variants.mojo).
        variant: StaticString = "auto",
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
            launch_variant[dtype, Self.log_out, variant],
        ](ctx, output, input)


trait RowIntoOp:
    """`RowOp` into a given buffer (the `*_into` twin)."""

    comptime log_out: Bool
    """Log-softmax rather than softmax."""

    @staticmethod
    def execute[
        target: StaticString, dtype: DType
    ](
        output: MutableInputTensor[dtype=dtype, rank=3, static_spec=_],
        input: InputTensor[dtype=dtype, rank=3, static_spec=_],
        ctx: DeviceContext,
    ) raises:
        """Run the op along axis 1, into `output`."""
        forward_rows[
            target,
            dtype,
            Self.log_out,
            launch_variant[dtype, Self.log_out, "auto"],
        ](ctx, output, input)


trait BackwardOp:
    """The gradient of softmax (dx = y * (dy - sum(dy * y))) or, with
    `log_in`, of log-softmax (dx = dy - exp(logp) * sum(dy))."""

    comptime log_in: Bool
    """The first input is log p (log_softmax_backward)."""

    @staticmethod
    def execute[
        target: StaticString,
        dtype: DType,
        # Strategy: "auto" (the dispatch table) or a name (variants.mojo).
        variant: StaticString = "auto",
    ](
        dx: OutputTensor[dtype=dtype, rank=3, static_spec=_],
        a: InputTensor[dtype=dtype, rank=3, static_spec=_],
        dy: InputTensor[dtype=dtype, rank=3, static_spec=_],
        ctx: DeviceContext,
    ) raises:
        """Run the op along axis 1 (`a` = y or log p)."""
        _backward[target, dtype, Self.log_in, variant](ctx, dx, a, dy)


trait BackwardIntoOp:
    """`BackwardOp` into a given buffer (the `*_into` twin)."""

    comptime log_in: Bool
    """The first input is log p (log_softmax_backward)."""

    @staticmethod
    def execute[
        target: StaticString, dtype: DType
    ](
        dx: MutableInputTensor[dtype=dtype, rank=3, static_spec=_],
        a: InputTensor[dtype=dtype, rank=3, static_spec=_],
        dy: InputTensor[dtype=dtype, rank=3, static_spec=_],
        ctx: DeviceContext,
    ) raises:
        """Run the op along axis 1, into `dx`."""
        _backward[target, dtype, Self.log_in, "auto"](ctx, dx, a, dy)


@extensibility.register("softmax")
struct Softmax(RowOp):
    """Softmax along axis 1 of an (outer, n, inner) tensor."""

    comptime log_out = False


@extensibility.register("log_softmax")
struct LogSoftmax(RowOp):
    """Log-softmax along axis 1 of an (outer, n, inner) tensor."""

    comptime log_out = True


@extensibility.register("softmax_into")
struct SoftmaxInto(RowIntoOp):
    """Softmax along axis 1, into `output`."""

    comptime log_out = False


@extensibility.register("log_softmax_into")
struct LogSoftmaxInto(RowIntoOp):
    """Log-softmax along axis 1, into `output`."""

    comptime log_out = True


@extensibility.register("softmax_backward")
struct SoftmaxBackward(BackwardOp):
    """Gradient of softmax along axis 1: dx = y * (dy - sum(dy * y))."""

    comptime log_in = False


@extensibility.register("log_softmax_backward")
struct LogSoftmaxBackward(BackwardOp):
    """Gradient of log-softmax along axis 1: dx = dy - exp(logp) * sum(dy)."""

    comptime log_in = True


@extensibility.register("softmax_backward_into")
struct SoftmaxBackwardInto(BackwardIntoOp):
    """Gradient of softmax along axis 1, into `dx`."""

    comptime log_in = False


@extensibility.register("log_softmax_backward_into")
struct LogSoftmaxBackwardInto(BackwardIntoOp):
    """Gradient of log-softmax along axis 1, into `dx`."""

    comptime log_in = True
