"""The sharded (vocab-parallel) row ops MAX calls: a row's classes split
over devices, each op working on one device's (rows, n_shard) slice.

`sharded_row_stats` reads the slice once and writes each row's (max, sum of
exp, target logit or -inf, sum of logits) as a (rows, 4) tensor in the
accumulator type (float32, float64 for float64); the caller gathers every
device's statistics and combines them (python/max_softmax/sharded.py,
torch/parallel.py). `sharded_epilogue` takes each row's global (max, sum,
scale) as (rows, 3) and writes the slice's softmax, log-softmax or
cross-entropy gradient. `kind` (compile time) is "softmax", "log_softmax"
or "cross_entropy"; `options` is a float64 (4,) tensor on the device:
(class offset of the slice, ignore_index, label smoothing, total classes).
Targets are int64 (rows,) global class indices, read only for
cross-entropy. The work is a `ShardedCall`, which the launch extension
builds too. The `*_into` twins write into given buffers (torch).
"""

import extensibility
from extensibility import IO, InputTensor, ManagedTensorSlice
from max.gpu.host import DeviceContext

from .cpu_sharded_rows import epilogue_cpu, row_stats_cpu
from .gpu_launch import HeldRows, kernel_arg
from .gpu_sharded_rows import launch_epilogue, launch_row_stats
from .registered_ops import OpCall, rows_of, written
from .row_math import accum_dtype


@fieldwise_init
struct ShardedCall[dtype: DType, kind: StaticString, stats: Bool](OpCall):
    """`sharded_row_stats` (`stats`) or `sharded_epilogue` of `kind` on
    `rows` rows of a slice of `n` classes."""

    comptime acc = accum_dtype[Self.dtype]()
    """The statistics' type: float32, float64 for float64."""
    comptime out_dtype = Self.acc if Self.stats else Self.dtype
    """What the op writes: statistics, or the slice's values."""

    var output: HeldRows[Self.out_dtype]
    """(rows, 4) statistics, or the (rows, n) result."""
    var logits: HeldRows[Self.dtype]
    """(rows, n) slice."""
    var row_in: HeldRows[Self.acc]
    """The rows' global (max, sum, scale) (rows, 3); not read for stats."""
    var targets: HeldRows[DType.int64]
    """(rows,) global class indices (cross-entropy only)."""
    var options: HeldRows[DType.float64]
    """(class offset, ignore_index, label smoothing, total classes)."""
    var rows: Int
    """Number of rows."""
    var n: Int
    """Classes in the slice."""

    def run[target: StaticString](self, ctx: DeviceContext) raises:
        """Run the op on `target`."""
        comptime assert (
            Self.kind == "softmax"
            or Self.kind == "log_softmax"
            or Self.kind == "cross_entropy"
        ), "kind must be softmax, log_softmax or cross_entropy"
        comptime with_target = Self.kind == "cross_entropy"
        var out = kernel_arg(self.output)
        var logits = kernel_arg(self.logits)
        var t = kernel_arg(self.targets)
        var o = kernel_arg(self.options)
        var r = kernel_arg(self.row_in)
        comptime if target == "cpu":
            comptime if Self.stats:
                row_stats_cpu[Self.dtype, with_target](
                    rebind[type_of(r)](out), logits, t, o, self.rows, self.n
                )
            else:
                epilogue_cpu[Self.dtype, Self.kind](
                    rebind[type_of(logits)](out),
                    logits,
                    r,
                    t,
                    o,
                    self.rows,
                    self.n,
                )
        elif target == "gpu":
            comptime if Self.stats:
                launch_row_stats[Self.dtype, with_target](
                    ctx,
                    rebind[type_of(r)](out),
                    logits,
                    t,
                    o,
                    self.rows,
                    self.n,
                )
            else:
                launch_epilogue[Self.dtype, Self.kind](
                    ctx,
                    rebind[type_of(logits)](out),
                    logits,
                    r,
                    t,
                    o,
                    self.rows,
                    self.n,
                )
        else:
            raise Error("max_softmax: unsupported target " + String(target))


def sharded_rows[
    target: StaticString, dtype: DType, kind: StaticString, stats: Bool
](
    ctx: DeviceContext,
    output: HeldRows[ShardedCall[dtype, kind, stats].out_dtype],
    logits: InputTensor[dtype=dtype, rank=2, static_spec=_],
    row_in: HeldRows[accum_dtype[dtype]()],
    targets: InputTensor[dtype=DType.int64, rank=1, static_spec=_],
    options: InputTensor[dtype=DType.float64, rank=1, static_spec=_],
) raises:
    """The `ShardedCall` of the tensors, run on `target`."""
    ShardedCall[dtype, kind, stats](
        output,
        rows_of(logits),
        row_in,
        rows_of(targets),
        rows_of(options),
        logits.dim_size(0),
        logits.dim_size(1),
    ).run[target](ctx)


trait RowStatsOp:
    """sharded_row_stats into a new tensor or, for the `*_into` twin, a given
    buffer (`io`)."""

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
        var s = rebind[HeldRows[accum_dtype[dtype]()]](rows_of(stats))
        sharded_rows[target, dtype, kind, True](
            ctx, s, logits, s, targets, options
        )


trait EpilogueOp:
    """sharded_epilogue into a new tensor or, for the `*_into` twin, a given
    buffer (`io`)."""

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
        var r = rebind[HeldRows[accum_dtype[dtype]()]](rows_of(row_in))
        sharded_rows[target, dtype, kind, False](
            ctx, rows_of(output), logits, r, targets, options
        )


@extensibility.register("sharded_row_stats")
struct ShardedRowStats(RowStatsOp):
    """Per-row statistics (rows, 4) of a (rows, n_shard) slice of logits."""

    comptime io = IO.Output


@extensibility.register("sharded_row_stats_into")
struct ShardedRowStatsInto(RowStatsOp):
    """`sharded_row_stats`, into `stats`."""

    comptime io = IO.Input


@extensibility.register("sharded_epilogue")
struct ShardedEpilogue(EpilogueOp):
    """Softmax, log-softmax or the cross-entropy gradient of a slice, from
    the rows' global (max, sum, scale)."""

    comptime io = IO.Output


@extensibility.register("sharded_epilogue_into")
struct ShardedEpilogueInto(EpilogueOp):
    """`sharded_epilogue`, into `output`."""

    comptime io = IO.Input
