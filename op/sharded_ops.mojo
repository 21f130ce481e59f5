"""The sharded (vocab-parallel) row ops' work (`ShardedCall`): a row's
classes split over devices, each op working on one device's (rows,
n_shard) slice.

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

from max.gpu.host import DeviceContext

from .cpu_sharded_rows import epilogue_cpu, row_stats_cpu
from .gpu_launch import HeldRows, kernel_arg
from .gpu_sharded_rows import launch_epilogue, launch_row_stats
from .op_call import OpCall, RowsView
from .row_math import accum_dtype


@fieldwise_init
struct ShardedCall[dtype: DType, kind: StaticString, stats: Bool](OpCall):
    """`sharded_row_stats` (`stats`) or `sharded_epilogue` of `kind` on the
    (rows, n) slice `logits`."""

    comptime acc = accum_dtype[Self.dtype]()
    """The statistics' type: float32, float64 for float64."""
    comptime out_dtype = Self.acc if Self.stats else Self.dtype
    """What the op writes: statistics, or the slice's values."""

    var logits: HeldRows[Self.dtype]
    """(rows, n) slice."""
    var view: RowsView
    """(rows, n, 1)."""
    var targets: HeldRows[DType.int64]
    """(rows,) global class indices (cross-entropy only)."""
    var options: HeldRows[DType.float64]
    """(class offset, ignore_index, label smoothing, total classes)."""
    var row_in: HeldRows[Self.acc]
    """The rows' global (max, sum, scale) (rows, 3); not read for stats."""
    var output: HeldRows[Self.out_dtype]
    """(rows, 4) statistics, or the (rows, n) result."""

    def run[target: StaticString](self, ctx: DeviceContext) raises:
        """Run the op on `target`."""
        comptime assert (
            Self.kind == "softmax"
            or Self.kind == "log_softmax"
            or Self.kind == "cross_entropy"
        ), "kind must be softmax, log_softmax or cross_entropy"
        comptime with_target = Self.kind == "cross_entropy"
        comptime if target == "cpu":
            comptime if Self.stats:
                row_stats_cpu[Self.dtype, Self.kind](
                    rebind[ShardedCall[Self.dtype, Self.kind, True]](self)
                )
            else:
                epilogue_cpu[Self.dtype, Self.kind](
                    rebind[ShardedCall[Self.dtype, Self.kind, False]](self)
                )
            return
        elif target != "gpu":
            raise Error("max_softmax: unsupported target " + target)
        var x = kernel_arg(self.logits)
        var t = kernel_arg(self.targets)
        var o = kernel_arg(self.options)
        var r = kernel_arg(self.row_in)
        var rows = self.view.outer
        var n = self.view.n
        comptime if Self.stats:
            var s = rebind[type_of(r)](kernel_arg(self.output))
            launch_row_stats[Self.dtype, with_target](ctx, s, x, t, o, rows, n)
        else:
            var y = rebind[type_of(x)](kernel_arg(self.output))
            launch_epilogue[Self.dtype, Self.kind](ctx, y, x, r, t, o, rows, n)
