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
buffer, for the torch bridge (see registered_ops.mojo). Each struct names
its flag; its `execute` is its trait's (`MaskedOp`, `MaskedIntoOp`).
"""

import extensibility
from extensibility import InputTensor, ManagedTensorSlice, OutputTensor
from extensibility import _MutableInputTensor as MutableInputTensor
from max.gpu.host import DeviceContext

from .cpu_masked_rows import masked_softmax_cpu
from .gpu_masked_rows import launch_masked_rows
from .masked_flags import (
    CAUSAL_FLAG,
    FLAG_COMBINATIONS,
    MASK_FLAG,
    masked_flags,
)
from .registered_ops import rows_ptr as _ptr


def masked_rows[
    target: StaticString,
    dtype: DType,
    log_out: Bool,
    variant: StaticString = "auto",
](
    ctx: DeviceContext,
    output: ManagedTensorSlice[dtype=dtype, rank=3, ...],
    x: InputTensor[dtype=dtype, rank=3, static_spec=_],
    mask: InputTensor[dtype=dtype, rank=2, static_spec=_],
    options: InputTensor[dtype=DType.float64, rank=1, static_spec=_],
) raises:
    """`masked_rows_of` for the flags the options' length carries
    (`masked_flags`): a run-time switch over the four compile-time
    specialisations, read from a shape, so nothing waits on the device."""
    var flags = masked_flags(options.dim_size(0))
    comptime for f in range(FLAG_COMBINATIONS):
        if flags == f:
            masked_rows_of[
                target,
                dtype,
                log_out,
                (f & MASK_FLAG) != 0,
                (f & CAUSAL_FLAG) != 0,
                variant,
            ](ctx, output, x, mask, options)
            return


def masked_rows_of[
    target: StaticString,
    dtype: DType,
    log_out: Bool,
    has_mask: Bool,
    causal: Bool,
    variant: StaticString = "auto",
](
    ctx: DeviceContext,
    output: ManagedTensorSlice[dtype=dtype, rank=3, ...],
    x: InputTensor[dtype=dtype, rank=3, static_spec=_],
    mask: InputTensor[dtype=dtype, rank=2, static_spec=_],
    options: InputTensor[dtype=DType.float64, rank=1, static_spec=_],
) raises:
    """Softmax (or log-softmax) of scale * x + mask along the rows of the
    (outer, L, n) view `x`, on `target`: row r = o * L + i uses mask row
    r % mask_rows and, when causal, keeps columns j <= i; GPU rows under
    `variant` (`launch_masked_rows`)."""
    var causal_rows = x.dim_size(1)
    var rows = x.dim_size(0) * causal_rows
    var n = x.dim_size(2)
    var mask_rows = mask.dim_size(0)
    comptime if has_mask:
        if mask.dim_size(1) != n or mask_rows < 1:
            raise Error(
                "max_softmax: the mask must be (mask_rows >= 1, n) for rows of "
                + String(n)
                + ", got ("
                + String(mask_rows)
                + ", "
                + String(mask.dim_size(1))
                + ")"
            )
    comptime if target == "cpu":
        masked_softmax_cpu[dtype, log_out, has_mask, causal](
            _ptr(output),
            _ptr(x),
            _ptr(mask),
            rows,
            n,
            max(mask_rows, 1),
            _ptr(options)[unsafe_offset=0],
            max(causal_rows, 1),
        )
    elif target == "gpu":
        launch_masked_rows[dtype, log_out, has_mask, causal, variant](
            ctx,
            _ptr(output),
            _ptr(x),
            _ptr(mask),
            _ptr(options),
            rows,
            n,
            max(mask_rows, 1),
            max(causal_rows, 1),
        )
    else:
        raise Error("max_softmax: unsupported target " + String(target))


trait MaskedOp:
    """softmax_masked or log_softmax_masked (`log_out`) into a new tensor."""

    comptime log_out: Bool
    """Log-softmax rather than softmax."""

    @staticmethod
    def execute[
        # "cpu" or "gpu": the kind of device this runs on.
        target: StaticString,
        # Element type of x, mask and output.
        dtype: DType,
        # Strategy: "auto", "register" or "block" (gpu_masked_rows).
        variant: StaticString = "auto",
    ](
        output: OutputTensor[dtype=dtype, rank=3, static_spec=_],
        x: InputTensor[dtype=dtype, rank=3, static_spec=_],
        mask: InputTensor[dtype=dtype, rank=2, static_spec=_],
        options: InputTensor[dtype=DType.float64, rank=1, static_spec=_],
        ctx: DeviceContext,
    ) raises:
        """Run the op along the rows of (rows, n), the flags from the
        options' length."""
        masked_rows[target, dtype, Self.log_out, variant](
            ctx, output, x, mask, options
        )


trait MaskedIntoOp:
    """`MaskedOp` into a given buffer (the `*_into` twin)."""

    comptime log_out: Bool
    """Log-softmax rather than softmax."""

    @staticmethod
    def execute[
        target: StaticString,
        dtype: DType,
    ](
        output: MutableInputTensor[dtype=dtype, rank=3, static_spec=_],
        x: InputTensor[dtype=dtype, rank=3, static_spec=_],
        mask: InputTensor[dtype=dtype, rank=2, static_spec=_],
        options: InputTensor[dtype=DType.float64, rank=1, static_spec=_],
        ctx: DeviceContext,
    ) raises:
        """Run the op along the rows of (rows, n), into `output`."""
        masked_rows[target, dtype, Self.log_out](ctx, output, x, mask, options)


@extensibility.register("softmax_masked")
struct SoftmaxMasked(MaskedOp):
    """Softmax of scale * x + mask (and causal) along the rows of (rows, n)."""

    comptime log_out = False


@extensibility.register("log_softmax_masked")
struct LogSoftmaxMasked(MaskedOp):
    """Log-softmax of scale * x + mask (and causal) along the rows."""

    comptime log_out = True


@extensibility.register("softmax_masked_into")
struct SoftmaxMaskedInto(MaskedIntoOp):
    """`softmax_masked`, into `output`."""

    comptime log_out = False


@extensibility.register("log_softmax_masked_into")
struct LogSoftmaxMaskedInto(MaskedIntoOp):
    """`log_softmax_masked`, into `output`."""

    comptime log_out = True
