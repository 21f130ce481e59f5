"""How the kernel sweeps (backward_sweep, ce_loss_sweep,
register_plan_sweep, split_stream_sweep) time a kernel: launches back to
back between two device syncs, the median over repetitions."""

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
