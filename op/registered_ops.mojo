"""The custom ops MAX loads from this package: every registration.

The row ops (softmax, log_softmax, their backward and masked ops) take a
rank-3 view made by a free reshape in the graph (see
python/max_softmax/ops.py), so one compiled kernel per (op, dtype, device)
serves every rank, axis and shape; cross-entropy and the sharded ops take
(rows, classes).

Each op writes a new tensor, and its `*_into` twin writes into a buffer it
is given, for bridges. A torch custom op hands MAX its output tensor as a
mutable buffer; with an ordinary op MAX would write the result to a
temporary and then copy it into that buffer: one more read and write of the
whole tensor, which doubles the traffic of a memory-bound softmax. Used by
python/max_softmax/torch through `ops.inplace_custom`.

MAX reads an op's `execute` signature, so each kind of op writes one out,
in a trait (`RowOp`, `BackwardOp`, `MaskedOp`, `CrossEntropyOp`,
`CrossEntropyGradOp`, `SoftCrossEntropyOp`, `SoftCrossEntropyGradOp`,
`RowStatsOp`, `EpilogueOp`): its body checks what the
tensors' shapes must satisfy and runs the op's `OpCall` (op_call.mojo), the
call the launch extension runs too. The trait's `io` tells a new tensor
(`IO.Output`) from a given buffer (`IO.Input`, MAX's mutable input: the
`*_into` twin); each struct below names its op and its flags.
"""

import extensibility
from extensibility import IO, IOSpec, InputTensor, ManagedTensorSlice
from extensibility import _MutableInputTensor as MutableInputTensor
from max.gpu.host import DeviceContext

from .cross_entropy_ops import CrossEntropyCall
from .dispatch import RowsLauncher, launch_variant
from .gpu_launch import HeldRows, held
from .masked_flags import MASK_FLAG, masked_flags
from .masked_softmax_ops import MaskedCall
from .op_call import BackwardCall, DeviceOptions, ForwardCall, RowsView
from .row_math import accum_dtype
from .scale_ops import ScaleCall
from .sharded_ops import ShardedCall
from .soft_cross_entropy_ops import SoftCrossEntropyCall


comptime written[io: IO] = IOSpec[True, io]()
"""The tensor an op writes: a new one (`IO.Output`, MAX's OutputTensor) or a
given buffer (`IO.Input`, MAX's mutable input tensor, for the `*_into`
twins)."""


@always_inline
def rows_of[
    dtype: DType, rank: Int
](t: ManagedTensorSlice[dtype=dtype, rank=rank, ...]) -> HeldRows[dtype]:
    """The tensor's elements, as an `OpCall` holds them."""
    return held(rebind[Pointer[Scalar[dtype], MutAnyOrigin]](t.unsafe_ptr()))


def view_of[rank: Int](t: ManagedTensorSlice[rank=rank, ...]) -> RowsView:
    """A rank-3 tensor's (outer, n, inner), or a (rows, n) tensor's (rows,
    n, 1)."""
    comptime if rank == 3:
        return RowsView(t.dim_size(0), t.dim_size(1), t.dim_size(2))
    return RowsView(t.dim_size(0), t.dim_size(1), 1)


def options_of(
    t: InputTensor[dtype=DType.float64, rank=1, static_spec=_]
) -> DeviceOptions:
    """An options tensor's values and length."""
    return DeviceOptions(rows_of(t), t.dim_size(0))


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
    var call = ForwardCall[dtype, log_out, launch_rows](
        rows_of(output), rows_of(input), view_of(input)
    )
    call.run[target](ctx)


# ===----------------------------------------------------------------------=== #
# softmax, log_softmax and their backward ops
# ===----------------------------------------------------------------------=== #


trait RowOp:
    """softmax or log_softmax (`log_out`) along axis 1 of an (outer, n,
    inner) tensor."""

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
        """Run the op."""
        comptime launch = launch_variant[dtype, Self.log_out, variant]
        forward_rows[target, dtype, Self.log_out, launch](ctx, output, input)


trait BackwardOp:
    """The gradient along axis 1 of softmax (dx = y * (dy - sum(dy * y)),
    `a` = y) or, with `log_in`, of log-softmax (dx = dy - exp(logp) *
    sum(dy), `a` = log p)."""

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
        """Run the op."""
        var call = BackwardCall[dtype, Self.log_in, variant](
            rows_of(dx), rows_of(a), rows_of(dy), view_of(a)
        )
        call.run[target](ctx)


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


# ===----------------------------------------------------------------------=== #
# softmax_masked, log_softmax_masked (masked_softmax_ops.mojo)
# ===----------------------------------------------------------------------=== #


trait MaskedOp:
    """softmax_masked or log_softmax_masked (`log_out`): scale * x + mask
    (and causal) along the rows of the (outer, L, n) view `x`, the flags
    from the options' length (`masked_flags`)."""

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
        """Run the op."""
        var n = x.dim_size(2)
        var mask_rows = mask.dim_size(0)
        var has_mask = (masked_flags(options.dim_size(0)) & MASK_FLAG) != 0
        if has_mask and (mask.dim_size(1) != n or mask_rows < 1):
            raise Error(
                t"max_softmax: the mask must be (mask_rows >= 1, n) for rows"
                t" of {n}, got ({mask_rows}, {mask.dim_size(1)})"
            )
        var call = MaskedCall[dtype, Self.log_out, variant](
            rows_of(output),
            rows_of(x),
            RowsView(x.dim_size(0) * x.dim_size(1), n, 1),
            x.dim_size(1),
            rows_of(mask),
            mask_rows,
            options_of(options),
        )
        call.run[target](ctx)


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


# ===----------------------------------------------------------------------=== #
# cross_entropy, cross_entropy_with_grad (cross_entropy_ops.mojo)
# ===----------------------------------------------------------------------=== #


trait CrossEntropyOp:
    """Cross-entropy of (rows, classes) logits against (rows,) targets."""

    comptime io: IO
    """`IO.Output` (a new tensor) or `IO.Input` (into a given buffer)."""

    @staticmethod
    def execute[
        # "cpu" or "gpu": the kind of device this runs on.
        target: StaticString,
        # Element type of logits and loss.
        dtype: DType,
        # "mean", "sum" (loss of shape (1,)) or "none" (shape (rows,)).
        reduction: StaticString = "mean",
        # Strategy: "auto", "register", "smem", "pair" or "block".
        variant: StaticString = "auto",
    ](
        loss: ManagedTensorSlice[
            io_spec=written[Self.io], dtype=dtype, rank=1, static_spec=_
        ],
        logits: InputTensor[dtype=dtype, rank=2, static_spec=_],
        targets: InputTensor[dtype=DType.int64, rank=1, static_spec=_],
        options: InputTensor[dtype=DType.float64, rank=1, static_spec=_],
        ctx: DeviceContext,
    ) raises:
        """Run the op."""
        # No gradient: the kernels never write through dlogits, so the
        # logits stand in.
        var x = rows_of(logits)
        var call = CrossEntropyCall[dtype, False, reduction, variant](
            x,
            rows_of(targets),
            view_of(logits),
            options_of(options),
            rows_of(loss),
            x,
        )
        call.run[target](ctx)


trait CrossEntropyGradOp:
    """Cross-entropy and d loss / d logits, from one pass over the logits
    (for "none": the gradient of the sum of the row losses)."""

    comptime io: IO
    """`IO.Output` (new tensors) or `IO.Input` (into given buffers)."""

    @staticmethod
    def execute[
        target: StaticString,
        dtype: DType,
        reduction: StaticString = "mean",
        variant: StaticString = "auto",
    ](
        loss: ManagedTensorSlice[
            io_spec=written[Self.io], dtype=dtype, rank=1, static_spec=_
        ],
        dlogits: ManagedTensorSlice[
            io_spec=written[Self.io], dtype=dtype, rank=2, static_spec=_
        ],
        logits: InputTensor[dtype=dtype, rank=2, static_spec=_],
        targets: InputTensor[dtype=DType.int64, rank=1, static_spec=_],
        options: InputTensor[dtype=DType.float64, rank=1, static_spec=_],
        ctx: DeviceContext,
    ) raises:
        """Run the op."""
        var call = CrossEntropyCall[dtype, True, reduction, variant](
            rows_of(logits),
            rows_of(targets),
            view_of(logits),
            options_of(options),
            rows_of(loss),
            rows_of(dlogits),
        )
        call.run[target](ctx)


@extensibility.register("cross_entropy")
struct CrossEntropy(CrossEntropyOp):
    """Cross-entropy of (rows, classes) logits against (rows,) targets."""

    comptime io = IO.Output


@extensibility.register("cross_entropy_with_grad")
struct CrossEntropyWithGrad(CrossEntropyGradOp):
    """Cross-entropy and d loss / d logits, from one pass over the logits."""

    comptime io = IO.Output


@extensibility.register("cross_entropy_into")
struct CrossEntropyInto(CrossEntropyOp):
    """Cross-entropy, into `loss`."""

    comptime io = IO.Input


@extensibility.register("cross_entropy_with_grad_into")
struct CrossEntropyWithGradInto(CrossEntropyGradOp):
    """Cross-entropy and its gradient, into `loss` and `dlogits`."""

    comptime io = IO.Input


# ===----------------------------------------------------------------------=== #
# soft_cross_entropy, soft_cross_entropy_with_grad (soft_cross_entropy_ops.mojo)
# ===----------------------------------------------------------------------=== #


def check_soft_shapes(
    logits: ManagedTensorSlice[rank=2, ...],
    probs: ManagedTensorSlice[rank=2, ...],
) raises:
    """Raise unless the probabilities are shaped as the logits."""
    if logits.dim_size(0) != probs.dim_size(0) or logits.dim_size(
        1
    ) != probs.dim_size(1):
        raise Error(
            "max_softmax: soft_cross_entropy needs the probabilities shaped"
            " as the logits"
        )


trait SoftCrossEntropyOp:
    """Cross-entropy of (rows, classes) logits against (rows, classes)
    class probabilities."""

    comptime io: IO
    """`IO.Output` (a new tensor) or `IO.Input` (into a given buffer)."""

    @staticmethod
    def execute[
        # "cpu" or "gpu": the kind of device this runs on.
        target: StaticString,
        # Element type of logits, probabilities and loss.
        dtype: DType,
        # "mean", "sum" (loss of shape (1,)) or "none" (shape (rows,)).
        reduction: StaticString = "mean",
    ](
        loss: ManagedTensorSlice[
            io_spec=written[Self.io], dtype=dtype, rank=1, static_spec=_
        ],
        logits: InputTensor[dtype=dtype, rank=2, static_spec=_],
        probs: InputTensor[dtype=dtype, rank=2, static_spec=_],
        options: InputTensor[dtype=DType.float64, rank=1, static_spec=_],
        ctx: DeviceContext,
    ) raises:
        """Run the op."""
        check_soft_shapes(logits, probs)
        # No gradient: the kernels never write through dlogits, so the
        # logits stand in.
        var x = rows_of(logits)
        var call = SoftCrossEntropyCall[dtype, False, reduction](
            x,
            rows_of(probs),
            view_of(logits),
            options_of(options),
            rows_of(loss),
            x,
        )
        call.run[target](ctx)


trait SoftCrossEntropyGradOp:
    """Soft-target cross-entropy and d loss / d logits, fused (for "none":
    the gradient of the sum of the row losses)."""

    comptime io: IO
    """`IO.Output` (new tensors) or `IO.Input` (into given buffers)."""

    @staticmethod
    def execute[
        target: StaticString,
        dtype: DType,
        reduction: StaticString = "mean",
    ](
        loss: ManagedTensorSlice[
            io_spec=written[Self.io], dtype=dtype, rank=1, static_spec=_
        ],
        dlogits: ManagedTensorSlice[
            io_spec=written[Self.io], dtype=dtype, rank=2, static_spec=_
        ],
        logits: InputTensor[dtype=dtype, rank=2, static_spec=_],
        probs: InputTensor[dtype=dtype, rank=2, static_spec=_],
        options: InputTensor[dtype=DType.float64, rank=1, static_spec=_],
        ctx: DeviceContext,
    ) raises:
        """Run the op."""
        check_soft_shapes(logits, probs)
        var call = SoftCrossEntropyCall[dtype, True, reduction](
            rows_of(logits),
            rows_of(probs),
            view_of(logits),
            options_of(options),
            rows_of(loss),
            rows_of(dlogits),
        )
        call.run[target](ctx)


@extensibility.register("soft_cross_entropy")
struct SoftCrossEntropy(SoftCrossEntropyOp):
    """Cross-entropy of (rows, classes) logits against class probabilities."""

    comptime io = IO.Output


@extensibility.register("soft_cross_entropy_with_grad")
struct SoftCrossEntropyWithGrad(SoftCrossEntropyGradOp):
    """Soft-target cross-entropy and d loss / d logits, fused."""

    comptime io = IO.Output


@extensibility.register("soft_cross_entropy_into")
struct SoftCrossEntropyInto(SoftCrossEntropyOp):
    """Soft-target cross-entropy, into `loss`."""

    comptime io = IO.Input


@extensibility.register("soft_cross_entropy_with_grad_into")
struct SoftCrossEntropyWithGradInto(SoftCrossEntropyGradOp):
    """Soft-target cross-entropy and its gradient, into `loss` and
    `dlogits`."""

    comptime io = IO.Input


# ===----------------------------------------------------------------------=== #
# sharded_row_stats, sharded_epilogue (sharded_ops.mojo)
# ===----------------------------------------------------------------------=== #


trait RowStatsOp:
    """Per-row statistics (rows, 4) of a (rows, n_shard) slice of logits,
    in the accumulator type `sdtype` (float32, float64 for float64)."""

    comptime io: IO
    """`IO.Output` (a new tensor) or `IO.Input` (into a given buffer)."""

    @staticmethod
    def execute[
        # "cpu" or "gpu": the kind of device this runs on.
        target: StaticString,
        # Element type of the logits.
        dtype: DType,
        # Element type of the statistics: float32, float64 for float64.
        sdtype: DType,
        # "softmax", "log_softmax" (no target) or "cross_entropy".
        kind: StaticString = "softmax",
    ](
        stats: ManagedTensorSlice[
            io_spec=written[Self.io], dtype=sdtype, rank=2, static_spec=_
        ],
        logits: InputTensor[dtype=dtype, rank=2, static_spec=_],
        targets: InputTensor[dtype=DType.int64, rank=1, static_spec=_],
        options: InputTensor[dtype=DType.float64, rank=1, static_spec=_],
        ctx: DeviceContext,
    ) raises:
        """Run the op (no row inputs: `stats` stands in, never read)."""
        comptime assert (
            sdtype == accum_dtype[dtype]()
        ), "stats are float32 (float64 for float64)"
        if stats.dim_size(0) != logits.dim_size(0) or stats.dim_size(1) != 4:
            raise Error(
                "max_softmax: sharded_row_stats writes (rows, 4) statistics"
            )
        comptime S = ShardedCall[dtype, kind, True]
        var s = rebind[HeldRows[S.acc]](rows_of(stats))
        var call = S(
            rows_of(logits),
            view_of(logits),
            rows_of(targets),
            rows_of(options),
            s,
            rebind[HeldRows[S.out_dtype]](s),
        )
        call.run[target](ctx)


trait EpilogueOp:
    """Softmax, log-softmax or the cross-entropy gradient of a slice, from
    the rows' global (max, sum, scale) (rows, 3) in `sdtype`."""

    comptime io: IO
    """`IO.Output` (a new tensor) or `IO.Input` (into a given buffer)."""

    @staticmethod
    def execute[
        target: StaticString,
        dtype: DType,
        sdtype: DType,
        kind: StaticString = "softmax",
    ](
        output: ManagedTensorSlice[
            io_spec=written[Self.io], dtype=dtype, rank=2, static_spec=_
        ],
        logits: InputTensor[dtype=dtype, rank=2, static_spec=_],
        row_in: InputTensor[dtype=sdtype, rank=2, static_spec=_],
        targets: InputTensor[dtype=DType.int64, rank=1, static_spec=_],
        options: InputTensor[dtype=DType.float64, rank=1, static_spec=_],
        ctx: DeviceContext,
    ) raises:
        """Run the op."""
        comptime assert (
            sdtype == accum_dtype[dtype]()
        ), "row inputs are float32 (float64 for float64)"
        if row_in.dim_size(0) != logits.dim_size(0) or row_in.dim_size(1) != 3:
            raise Error(
                "max_softmax: sharded_epilogue takes (rows, 3) row inputs"
            )
        comptime S = ShardedCall[dtype, kind, False]
        var call = S(
            rows_of(logits),
            view_of(logits),
            rows_of(targets),
            rows_of(options),
            rebind[HeldRows[S.acc]](rows_of(row_in)),
            rebind[HeldRows[S.out_dtype]](rows_of(output)),
        )
        call.run[target](ctx)


@extensibility.register("sharded_row_stats")
struct ShardedRowStats(RowStatsOp):
    """Per-row statistics (rows, 4) of a (rows, n_shard) slice of logits."""

    comptime io = IO.Output


@extensibility.register("sharded_epilogue")
struct ShardedEpilogue(EpilogueOp):
    """Softmax, log-softmax or the cross-entropy gradient of a slice, from
    the rows' global (max, sum, scale)."""

    comptime io = IO.Output


@extensibility.register("sharded_row_stats_into")
struct ShardedRowStatsInto(RowStatsOp):
    """`sharded_row_stats`, into `stats`."""

    comptime io = IO.Input


@extensibility.register("sharded_epilogue_into")
struct ShardedEpilogueInto(EpilogueOp):
    """`sharded_epilogue`, into `output`."""

    comptime io = IO.Input


# ===----------------------------------------------------------------------=== #
# scale_rows (scale_ops.mojo)
# ===----------------------------------------------------------------------=== #


@extensibility.register("scale_rows")
struct ScaleRows:
    """(rows, n) `data` times `factor` in place: (rows,) a factor a row, or
    (1,) one for all; rows whose factor is 1 are not touched."""

    @staticmethod
    def execute[
        # "cpu" or "gpu": the kind of device this runs on.
        target: StaticString,
        # Element type of data and factor.
        dtype: DType,
    ](
        data: MutableInputTensor[dtype=dtype, rank=2, static_spec=_],
        factor: InputTensor[dtype=dtype, rank=1, static_spec=_],
        ctx: DeviceContext,
    ) raises:
        """Run the op."""
        var rows = data.dim_size(0)
        var count = factor.dim_size(0)
        if count != 1 and count != rows:
            raise Error(
                t"max_softmax: scale_rows needs one factor or one a row, got"
                t" {count} for {rows} rows"
            )
        var call = ScaleCall[dtype](
            rows_of(data), rows_of(factor), view_of(data), count != 1
        )
        call.run[target](ctx)
