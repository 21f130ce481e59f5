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

An op's work is an `OpCall`: its buffers and dims, run on either target.
A registration's `execute` (MAX reads its signature, so each kind of op
writes one out) builds the call from its tensors; the launch extension
(python/max_softmax/launch_ext) builds the same call from addresses. Each
struct names its op and its flags; its `execute` is its trait's (`RowOp`,
`BackwardOp`), whose `io` tells a new tensor (`IO.Output`) from a given
buffer (`IO.Input`, MAX's mutable input: the `*_into` twin).
"""

import extensibility
from extensibility import IO, IOSpec, InputTensor, ManagedTensorSlice
from max.gpu.host import DeviceContext

from .dispatch import (
    RowsLauncher,
    launch_variant,
    softmax_backward_rows,
    softmax_rows,
)
from .gpu_launch import HeldRows, held, kernel_arg


comptime written[io: IO] = IOSpec[True, io]()
"""The tensor an op writes: a new one (`IO.Output`, MAX's OutputTensor) or a
given buffer (`IO.Input`, MAX's mutable input tensor, for the `*_into`
twins)."""


trait OpCall(ImplicitlyCopyable):
    """One op's work on raw buffers and dims, for either target: what a
    registration's `execute` and the launch extension both build."""

    def run[target: StaticString](self, ctx: DeviceContext) raises:
        """Run the op on `target` ("cpu" or "gpu"; the GPU's kernels are
        queued on `ctx`)."""
        ...


@always_inline
def rows_ptr[
    dtype: DType, rank: Int
](t: ManagedTensorSlice[dtype=dtype, rank=rank, ...]) -> Pointer[
    Scalar[dtype], MutAnyOrigin
]:
    """The tensor's elements, as the kernels take them."""
    return rebind[Pointer[Scalar[dtype], MutAnyOrigin]](t.unsafe_ptr())


@always_inline
def rows_of[
    dtype: DType, rank: Int
](t: ManagedTensorSlice[dtype=dtype, rank=rank, ...]) -> HeldRows[dtype]:
    """The tensor's elements, as an `OpCall` holds them."""
    return held(rows_ptr(t))


@fieldwise_init
struct ForwardCall[
    dtype: DType, log_out: Bool, launch_rows: RowsLauncher[dtype]
](OpCall):
    """Softmax (or log-softmax) of the (outer, n, inner) view `src` into
    `dst` along n, contiguous GPU rows by `launch_rows` (`softmax_rows`)."""

    var dst: HeldRows[Self.dtype]
    """Output."""
    var src: HeldRows[Self.dtype]
    """Input."""
    var outer: Int
    """Rows before the axis."""
    var n: Int
    """The axis' length."""
    var inner: Int
    """Elements after the axis (1: contiguous rows)."""

    def run[target: StaticString](self, ctx: DeviceContext) raises:
        """Run the op on `target`."""
        softmax_rows[target, Self.dtype, Self.log_out, Self.launch_rows](
            ctx,
            kernel_arg(self.dst),
            kernel_arg(self.src),
            self.outer,
            self.n,
            self.inner,
        )


@fieldwise_init
struct BackwardCall[dtype: DType, log_in: Bool, variant: StaticString](OpCall):
    """The gradient of softmax (`a` = y) or log-softmax (`log_in`, `a` =
    log p) of the (outer, n, inner) view into `dx` along n, from `dy`;
    contiguous GPU rows under `variant` (`softmax_backward_rows`)."""

    var dx: HeldRows[Self.dtype]
    """Output gradient."""
    var a: HeldRows[Self.dtype]
    """The forward op's output."""
    var dy: HeldRows[Self.dtype]
    """The incoming gradient."""
    var outer: Int
    """Rows before the axis."""
    var n: Int
    """The axis' length."""
    var inner: Int
    """Elements after the axis."""

    def run[target: StaticString](self, ctx: DeviceContext) raises:
        """Run the op on `target`."""
        softmax_backward_rows[target, Self.dtype, Self.log_in, Self.variant](
            ctx,
            kernel_arg(self.dx),
            kernel_arg(self.a),
            kernel_arg(self.dy),
            self.outer,
            self.n,
            self.inner,
        )


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
    ForwardCall[dtype, log_out, launch_rows](
        rows_of(output),
        rows_of(input),
        input.dim_size(0),
        input.dim_size(1),
        input.dim_size(2),
    ).run[target](ctx)


trait RowOp:
    """softmax or log_softmax (`log_out`) into a new tensor or, for the
    `*_into` twin, a given buffer (`io`)."""

    comptime log_out: Bool
    """Log-softmax rather than softmax."""
    comptime io: IO
    """`IO.Output` (a new tensor) or `IO.Input` (into a given buffer)."""

    @staticmethod
    def execute[
        # "cpu" or "gpu": the kind of device this runs on.
        target: StaticString,
        # Element type of input and output.
        dtype: DType,
        # Strategy: "auto" (the dispatch table) or a name (variants.mojo).
        variant: StaticString = "auto",
    ](
        output: ManagedTensorSlice[
            io_spec=written[Self.io], dtype=dtype, rank=3, static_spec=_
        ],
        input: InputTensor[dtype=dtype, rank=3, static_spec=_],
        ctx: DeviceContext,
    ) raises:
        """Run the op along axis 1 of an (outer, n, inner) tensor."""
        comptime launch = launch_variant[dtype, Self.log_out, variant]
        forward_rows[target, dtype, Self.log_out, launch](ctx, output, input)


trait BackwardOp:
    """The gradient of softmax (dx = y * (dy - sum(dy * y))) or, with
    `log_in`, of log-softmax (dx = dy - exp(logp) * sum(dy)), into a new
    tensor or a given buffer (`io`)."""

    comptime log_in: Bool
    """The first input is log p (log_softmax_backward)."""
    comptime io: IO
    """`IO.Output` (a new tensor) or `IO.Input` (into a given buffer)."""

    @staticmethod
    def execute[
        target: StaticString,
        dtype: DType,
        # Strategy: "auto" (the dispatch table) or a name (variants.mojo).
        variant: StaticString = "auto",
    ](
        dx: ManagedTensorSlice[
            io_spec=written[Self.io], dtype=dtype, rank=3, static_spec=_
        ],
        a: InputTensor[dtype=dtype, rank=3, static_spec=_],
        dy: InputTensor[dtype=dtype, rank=3, static_spec=_],
        ctx: DeviceContext,
    ) raises:
        """Run the op along axis 1 (`a` = y or log p)."""
        BackwardCall[dtype, Self.log_in, variant](
            rows_of(dx),
            rows_of(a),
            rows_of(dy),
            a.dim_size(0),
            a.dim_size(1),
            a.dim_size(2),
        ).run[target](ctx)


@extensibility.register("softmax")
struct Softmax(RowOp):
    """Softmax along axis 1 of an (outer, n, inner) tensor."""

    comptime log_out = False
    comptime io = IO.Output


@extensibility.register("log_softmax")
struct LogSoftmax(RowOp):
    """Log-softmax along axis 1 of an (outer, n, inner) tensor."""

    comptime log_out = True
    comptime io = IO.Output


@extensibility.register("softmax_into")
struct SoftmaxInto(RowOp):
    """Softmax along axis 1, into `output`."""

    comptime log_out = False
    comptime io = IO.Input


@extensibility.register("log_softmax_into")
struct LogSoftmaxInto(RowOp):
    """Log-softmax along axis 1, into `output`."""

    comptime log_out = True
    comptime io = IO.Input


@extensibility.register("softmax_backward")
struct SoftmaxBackward(BackwardOp):
    """Gradient of softmax along axis 1: dx = y * (dy - sum(dy * y))."""

    comptime log_in = False
    comptime io = IO.Output


@extensibility.register("log_softmax_backward")
struct LogSoftmaxBackward(BackwardOp):
    """Gradient of log-softmax along axis 1: dx = dy - exp(logp) * sum(dy)."""

    comptime log_in = True
    comptime io = IO.Output


@extensibility.register("softmax_backward_into")
struct SoftmaxBackwardInto(BackwardOp):
    """Gradient of softmax along axis 1, into `dx`."""

    comptime log_in = False
    comptime io = IO.Input


@extensibility.register("log_softmax_backward_into")
struct LogSoftmaxBackwardInto(BackwardOp):
    """Gradient of log-softmax along axis 1, into `dx`."""

    comptime log_in = True
    comptime io = IO.Input
