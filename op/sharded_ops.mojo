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
cross-entropy. The `*_into` twins write into given buffers (torch).
"""

import extensibility
from extensibility import InputTensor, ManagedTensorSlice, OutputTensor
from extensibility import _MutableInputTensor as MutableInputTensor
from max.gpu.host import DeviceContext

from .cpu_sharded_rows import epilogue_cpu, row_stats_cpu
from .gpu_sharded_rows import launch_epilogue, launch_row_stats
from .registered_ops import rows_ptr as _ptr
from .row_math import accum_dtype


def _check_kind[kind: StaticString]():
    comptime assert (
        kind == "softmax" or kind == "log_softmax" or kind == "cross_entropy"
    ), "kind must be softmax, log_softmax or cross_entropy"


def row_stats_rows[
    target: StaticString, dtype: DType, sdtype: DType, kind: StaticString
](
    ctx: DeviceContext,
    stats: ManagedTensorSlice[dtype=sdtype, rank=2, ...],
    logits: InputTensor[dtype=dtype, rank=2, static_spec=_],
    targets: InputTensor[dtype=DType.int64, rank=1, static_spec=_],
    options: InputTensor[dtype=DType.float64, rank=1, static_spec=_],
) raises:
    """The statistics of each row of the slice `logits` into `stats`."""
    _check_kind[kind]()
    comptime assert (
        sdtype == accum_dtype[dtype]()
    ), "stats are float32 (float64 for float64)"
    comptime with_target = kind == "cross_entropy"
    var rows = logits.dim_size(0)
    var n = logits.dim_size(1)
    if stats.dim_size(0) != rows or stats.dim_size(1) != 4:
        raise Error(
            "max_softmax: sharded_row_stats writes (rows, 4) statistics"
        )
    var s = rebind[Pointer[Scalar[accum_dtype[dtype]()], MutAnyOrigin]](
        _ptr(stats)
    )
    comptime if target == "cpu":
        row_stats_cpu[dtype, with_target](
            s, _ptr(logits), _ptr(targets), _ptr(options), rows, n
        )
    elif target == "gpu":
        launch_row_stats[dtype, with_target](
            ctx, s, _ptr(logits), _ptr(targets), _ptr(options), rows, n
        )
    else:
        raise Error("max_softmax: unsupported target " + String(target))


def epilogue_rows[
    target: StaticString, dtype: DType, sdtype: DType, kind: StaticString
](
    ctx: DeviceContext,
    output: ManagedTensorSlice[dtype=dtype, rank=2, ...],
    logits: InputTensor[dtype=dtype, rank=2, static_spec=_],
    row_in: InputTensor[dtype=sdtype, rank=2, static_spec=_],
    targets: InputTensor[dtype=DType.int64, rank=1, static_spec=_],
    options: InputTensor[dtype=DType.float64, rank=1, static_spec=_],
) raises:
    """`kind` of each row of the slice `logits` into `output`, from the
    rows' global (max, sum, scale) `row_in`."""
    _check_kind[kind]()
    comptime assert (
        sdtype == accum_dtype[dtype]()
    ), "row inputs are float32 (float64 for float64)"
    var rows = logits.dim_size(0)
    var n = logits.dim_size(1)
    if row_in.dim_size(0) != rows or row_in.dim_size(1) != 3:
        raise Error("max_softmax: sharded_epilogue takes (rows, 3) row inputs")
    var r = rebind[Pointer[Scalar[accum_dtype[dtype]()], MutAnyOrigin]](
        _ptr(row_in)
    )
    comptime if target == "cpu":
        epilogue_cpu[dtype, kind](
            _ptr(output), _ptr(logits), r, _ptr(targets), _ptr(options), rows, n
        )
    elif target == "gpu":
        launch_epilogue[dtype, kind](
            ctx,
            _ptr(output),
            _ptr(logits),
            r,
            _ptr(targets),
            _ptr(options),
            rows,
            n,
        )
    else:
        raise Error("max_softmax: unsupported target " + String(target))


@extensibility.register("sharded_row_stats")
struct ShardedRowStats:
    """Per-row statistics (rows, 4) of a (rows, n_shard) slice of logits."""

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
        stats: OutputTensor[dtype=sdtype, rank=2, static_spec=_],
        logits: InputTensor[dtype=dtype, rank=2, static_spec=_],
        targets: InputTensor[dtype=DType.int64, rank=1, static_spec=_],
        options: InputTensor[dtype=DType.float64, rank=1, static_spec=_],
        ctx: DeviceContext,
    ) raises:
        """Run the op."""
        row_stats_rows[target, dtype, sdtype, kind](
            ctx, stats, logits, targets, options
        )


@extensibility.register("sharded_row_stats_into")
struct ShardedRowStatsInto:
    """`sharded_row_stats`, into `stats`."""

    @staticmethod
    def execute[
        target: StaticString,
        dtype: DType,
        sdtype: DType,
        kind: StaticString = "softmax",
    ](
        stats: MutableInputTensor[dtype=sdtype, rank=2, static_spec=_],
        logits: InputTensor[dtype=dtype, rank=2, static_spec=_],
        targets: InputTensor[dtype=DType.int64, rank=1, static_spec=_],
        options: InputTensor[dtype=DType.float64, rank=1, static_spec=_],
        ctx: DeviceContext,
    ) raises:
        """Run the op."""
        row_stats_rows[target, dtype, sdtype, kind](
            ctx, stats, logits, targets, options
        )


@extensibility.register("sharded_epilogue")
struct ShardedEpilogue:
    """Softmax, log-softmax or the cross-entropy gradient of a slice, from
    the rows' global (max, sum, scale)."""

    @staticmethod
    def execute[
        target: StaticString,
        dtype: DType,
        sdtype: DType,
        kind: StaticString = "softmax",
    ](
        output: OutputTensor[dtype=dtype, rank=2, static_spec=_],
        logits: InputTensor[dtype=dtype, rank=2, static_spec=_],
        row_in: InputTensor[dtype=sdtype, rank=2, static_spec=_],
        targets: InputTensor[dtype=DType.int64, rank=1, static_spec=_],
        options: InputTensor[dtype=DType.float64, rank=1, static_spec=_],
        ctx: DeviceContext,
    ) raises:
        """Run the op."""
        epilogue_rows[target, dtype, sdtype, kind](
            ctx, output, logits, row_in, targets, options
        )


@extensibility.register("sharded_epilogue_into")
struct ShardedEpilogueInto:
    """`sharded_epilogue`, into `output`."""

    @staticmethod
    def execute[
        target: StaticString,
        dtype: DType,
        sdtype: DType,
        kind: StaticString = "softmax",
    ](
        output: MutableInputTensor[dtype=dtype, rank=2, static_spec=_],
        logits: InputTensor[dtype=dtype, rank=2, static_spec=_],
        row_in: InputTensor[dtype=sdtype, rank=2, static_spec=_],
        targets: InputTensor[dtype=DType.int64, rank=1, static_spec=_],
        options: InputTensor[dtype=DType.float64, rank=1, static_spec=_],
        ctx: DeviceContext,
    ) raises:
        """Run the op."""
        epilogue_rows[target, dtype, sdtype, kind](
            ctx, output, logits, row_in, targets, options
        )
