"""How the kernel sweeps (backward_sweep, ce_loss_sweep,
register_plan_sweep, split_stream_sweep) time a kernel and report it:
launches back to back between two device syncs, the median over
repetitions, one line a configuration."""

from std.sys import argv, size_of
from std.time import perf_counter_ns

from max.gpu.host import DeviceContext


def median_launch_us[
    launch: def(Int) raises capturing -> None
](ctx: DeviceContext, iters: Int, reps: Int) raises -> Float64:
    """Median over `reps` of the wall time of `launch(0)` ... `launch(iters
    - 1)` enqueued back to back, the device drained before and after, in µs
    a launch."""
    var times = List[Float64]()
    for _ in range(reps):
        ctx.synchronize()
        var t0 = perf_counter_ns()
        for i in range(iters):
            launch(i)
        ctx.synchronize()
        times.append(Float64(perf_counter_ns() - t0) / 1e3 / Float64(iters))
    sort(times)
    return times[reps // 2]


def has_arg(name: StringSlice) -> Bool:
    """Whether the command line names `name`: a sweep's flags ("once": each
    configuration launched once, for ncu; others the sweep's own)."""
    for i in range(1, len(argv())):
        if argv()[i] == name:
            return True
    return False


def print_result[
    dtype: DType
](rows: Int, n: Int, label: String, us: Float64, passes: Float64, err: String):
    """One line of a sweep's table: dtype, shape, what ran (`label`), µs a
    launch and GB/s, counted as `passes` x the tensor's bytes a launch,
    then the error check."""
    var bytes = Float64(rows * n * size_of[dtype]())
    print(
        String(dtype),
        String(rows) + "x" + String(n),
        label,
        "us=" + String(us),
        "GB/s=" + String(passes * bytes / us / 1e3),
        err,
    )
