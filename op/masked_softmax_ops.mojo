"""The scaled, masked and causal softmax ops MAX calls.

`softmax_masked` / `log_softmax_masked` take x as a (rows, n) view (a free
reshape in the graph, see python/max_softmax/ops.py), an additive mask
(mask_rows, n) in x's dtype (row r of x uses mask row r % mask_rows; -inf
drops a position), and `options`, a float64 tensor on the op's device:
options[0] is the scale, a run-time value read where the kernel runs, and
the options' length, 1 + flags, carries the flags (`masked_flags`):
MASK_FLAG (else the mask, a placeholder, is not read) and CAUSAL_FLAG (row
r = o * L + i keeps columns j <= i). x is viewed as (outer, L, n): L, the
causal rows, is a dim of the view (symbolic in a graph, where a constant
could not hold it).

A shape is known on the host whichever device holds the values, so
`execute` reads the flags from it with no host sync (capture-safe) and
calls the kernels specialised at compile time for that combination
(`masked_softmax_cpu[..., has_mask, causal]`, `launch_masked_rows[...]`):
one compiled model per (op, dtype, device) serves every scale, shape, mask
and causal combination, each with its own specialised kernel (no
per-element run-time branch). A row with nothing kept gives 0 (softmax) or
-inf (log-softmax): see row_math. The `*_into` twins write into a given
buffer, for the torch bridge (see registered_ops.mojo). The work is a
`MaskedCall`, which the launch extension builds too; each struct names its
flag and its output (`io`); its `execute` is `MaskedOp`'s.
"""

import extensibility
from extensibility import IO, InputTensor, ManagedTensorSlice
from max.gpu.host import DeviceContext

from .cpu_masked_rows import masked_softmax_cpu
from .gpu_launch import HeldRows, kernel_arg
from .gpu_masked_rows import launch_masked_rows
from .masked_flags import (
    CAUSAL_FLAG,
    FLAG_COMBINATIONS,
    MASK_FLAG,
    masked_flags,
)
from .registered_ops import OpCall, rows_of, written


@fieldwise_init
struct MaskedCall[dtype: DType, log_out: Bool, variant: StaticString = "auto"](
    OpCall
):
    """Softmax (or log-softmax) of scale * x + mask along the rows of the
    (outer, L, n) view `x` into `dst`: row r = o * L + i uses mask row
    r % mask_rows when `flags` has MASK_FLAG and, with CAUSAL_FLAG, keeps
    columns j <= i; GPU rows under `variant` (`launch_masked_rows`)."""

    var dst: HeldRows[Self.dtype]
    """Output rows."""
    var x: HeldRows[Self.dtype]
    """Input rows."""
    var mask: HeldRows[Self.dtype]
    """(mask_rows, n) additive mask (a placeholder without MASK_FLAG)."""
    var options: HeldRows[DType.float64]
    """(scale, ...) on the device that runs the op."""
    var flags: Int
    """MASK_FLAG | CAUSAL_FLAG (`masked_flags`)."""
    var rows: Int
    """outer * L."""
    var causal_rows: Int
    """L, the causal rows of the view."""
    var n: Int
    """Row length."""
    var mask_rows: Int
    """The mask's rows."""

    def run[target: StaticString](self, ctx: DeviceContext) raises:
        """`masked_rows` for the flags: a run-time switch over the four
        compile-time specialisations."""
        comptime for f in range(FLAG_COMBINATIONS):
            if self.flags == f:
                masked_rows[
                    target,
                    (f & MASK_FLAG) != 0,
                    (f & CAUSAL_FLAG) != 0,
                ](self, ctx)
                return
        raise Error("max_softmax: bad masked flags " + String(self.flags))


def masked_rows[
    target: StaticString, has_mask: Bool, causal: Bool
](call: MaskedCall, ctx: DeviceContext) raises:
    """`call`'s rows with the flags' kernels, on `target`."""
    comptime dtype = call.dtype
    comptime log_out = call.log_out
    var mask_rows = max(call.mask_rows, 1)
    var causal_rows = max(call.causal_rows, 1)
    comptime if target == "cpu":
        masked_softmax_cpu[dtype, log_out, has_mask, causal](
            kernel_arg(call.dst),
            kernel_arg(call.x),
            kernel_arg(call.mask),
            call.rows,
            call.n,
            mask_rows,
            kernel_arg(call.options)[unsafe_offset=0],
            causal_rows,
        )
    elif target == "gpu":
        launch_masked_rows[dtype, log_out, has_mask, causal, call.variant](
            ctx,
            kernel_arg(call.dst),
            kernel_arg(call.x),
            kernel_arg(call.mask),
            kernel_arg(call.options),
            call.rows,
            call.n,
            mask_rows,
            causal_rows,
        )
    else:
        raise Error("max_softmax: unsupported target " + String(target))


trait MaskedOp:
    """softmax_masked or log_softmax_masked (`log_out`) into a new tensor or,
    for the `*_into` twin, a given buffer (`io`)."""

    comptime log_out: Bool
    """Log-softmax rather than softmax."""
    comptime io: IO
    """`IO.Output` (a new tensor) or `IO.Input` (into a given buffer)."""

    @staticmethod
    def execute[
        # "cpu" or "gpu": the kind of device this runs on.
        target: StaticString,
        # Element type of x, mask and output.
        dtype: DType,
        # Strategy: "auto", "register" or "block" (gpu_masked_rows).
        variant: StaticString = "auto",
    ](
        output: ManagedTensorSlice[
            io_spec=written[Self.io], dtype=dtype, rank=3, static_spec=_
        ],
        x: InputTensor[dtype=dtype, rank=3, static_spec=_],
        mask: InputTensor[dtype=dtype, rank=2, static_spec=_],
        options: InputTensor[dtype=DType.float64, rank=1, static_spec=_],
        ctx: DeviceContext,
    ) raises:
        """Run the op along the rows of (rows, n), the flags from the
        options' length (no host sync: a shape is known on the host)."""
        var flags = masked_flags(options.dim_size(0))
        var n = x.dim_size(2)
        var mask_rows = mask.dim_size(0)
        if (flags & MASK_FLAG) != 0 and (
            mask.dim_size(1) != n or mask_rows < 1
        ):
            raise Error(
                "max_softmax: the mask must be (mask_rows >= 1, n) for rows of "
                + String(n)
                + ", got ("
                + String(mask_rows)
                + ", "
                + String(mask.dim_size(1))
                + ")"
            )
        MaskedCall[dtype, Self.log_out, variant](
            rows_of(output),
            rows_of(x),
            rows_of(mask),
            rows_of(options),
            flags,
            x.dim_size(0) * x.dim_size(1),
            x.dim_size(1),
            n,
            mask_rows,
        ).run[target](ctx)


@extensibility.register("softmax_masked")
struct SoftmaxMasked(MaskedOp):
    """Softmax of scale * x + mask (and causal) along the rows of (rows, n)."""

    comptime log_out = False
    comptime io = IO.Output


@extensibility.register("log_softmax_masked")
struct LogSoftmaxMasked(MaskedOp):
    """Log-softmax of scale * x + mask (and causal) along the rows."""

    comptime log_out = True
    comptime io = IO.Output


@extensibility.register("softmax_masked_into")
struct SoftmaxMaskedInto(MaskedOp):
    """`softmax_masked`, into `output`."""

    comptime log_out = False
    comptime io = IO.Input


@extensibility.register("log_softmax_masked_into")
struct LogSoftmaxMaskedInto(MaskedOp):
    """`log_softmax_masked`, into `output`."""

    comptime log_out = True
    comptime io = IO.Input
