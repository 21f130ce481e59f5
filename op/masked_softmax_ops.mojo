"""The scaled, masked and causal softmax ops' work (`MaskedCall`).

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

A shape is known on the host whichever device holds the values, so the
op reads the flags from it with no host sync (capture-safe) and calls the
kernels specialised at compile time for that combination
(`masked_softmax_cpu[..., has_mask, causal]`, `launch_masked_rows[...]`):
one compiled model per (op, dtype, device) serves every scale, shape, mask
and causal combination, each with its own specialised kernel (no
per-element run-time branch). A row with nothing kept gives 0 (softmax) or
-inf (log-softmax): see row_math. The `*_into` twins write into a given
buffer, for the torch bridge (see registered_ops.mojo). The work is a
`MaskedCall`, which the launch extension builds too; each struct names its
flag and its output (`io`); its `execute` is `MaskedOp`'s.
"""

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
from .op_call import DeviceOptions, OpCall, RowsView


@fieldwise_init
struct MaskedCall[dtype: DType, log_out: Bool, variant: StaticString = "auto"](
    OpCall
):
    """Softmax (or log-softmax) of scale * x + mask along the rows of the
    (outer, L, n) view of `x` into `dst`: row r = o * L + i uses mask row
    r % mask_rows when the flags have MASK_FLAG and, with CAUSAL_FLAG, keeps
    columns j <= i; GPU rows under `variant` (`launch_masked_rows`)."""

    var dst: HeldRows[Self.dtype]
    """Output rows."""
    var x: HeldRows[Self.dtype]
    """Input rows."""
    var view: RowsView
    """(rows, n, 1): rows = outer * L of the (outer, L, n) view."""
    var causal_rows: Int
    """L: row r = o * L + i keeps columns j <= i where causal."""
    var mask: HeldRows[Self.dtype]
    """(mask_rows, n) additive mask (a placeholder without MASK_FLAG)."""
    var mask_rows: Int
    """The mask's rows."""
    var options: DeviceOptions
    """(scale,), then one value a flag (`masked_flags`)."""

    def run[target: StaticString](self, ctx: DeviceContext) raises:
        """`masked_rows` for the flags the options' length carries: a
        run-time switch over the four compile-time specialisations."""
        var flags = masked_flags(self.options.count)
        comptime for f in range(FLAG_COMBINATIONS):
            if flags == f:
                comptime has_mask = (f & MASK_FLAG) != 0
                masked_rows[target, has_mask, (f & CAUSAL_FLAG) != 0](self, ctx)


def masked_rows[
    target: StaticString, has_mask: Bool, causal: Bool
](call: MaskedCall, ctx: DeviceContext) raises:
    """`call`'s rows by the kernels of its flags, on `target`."""
    comptime dtype = call.dtype
    # r % mask_rows and r % L need at least 1: without a mask, or not
    # causal, the call may carry 0.
    var c = call
    c.mask_rows = max(call.mask_rows, 1)
    c.causal_rows = max(call.causal_rows, 1)
    comptime if target == "cpu":
        masked_softmax_cpu[dtype, call.log_out, has_mask, causal, call.variant](
            c
        )
    elif target == "gpu":
        launch_masked_rows[dtype, call.log_out, has_mask, causal, call.variant](
            ctx,
            kernel_arg(c.dst),
            kernel_arg(c.x),
            kernel_arg(c.mask),
            kernel_arg(c.options.values),
            c.view.outer,
            c.view.n,
            c.mask_rows,
            c.causal_rows,
        )
    else:
        raise Error("max_softmax: unsupported target " + String(target))
