"""How the kernel sweeps (backward_sweep, ce_loss_sweep,
register_plan_sweep, split_stream_sweep) time a kernel and report it:
launches back to back between two device syncs, the median over
repetitions, one line a configuration."""

from std.sys import argv, size_of
from std.time import perf_counter_ns

from max.gpu.host import DeviceContext

from op.variants import Strategy


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


def timed_us[
    launch: def(Int) raises capturing -> None
](ctx: DeviceContext, once: Bool, iters: Int, reps: Int) raises -> Optional[
    Float64
]:
    """`launch(0)`, then `median_launch_us` of `launch`; with `once` (each
    configuration launched once, for ncu) only `launch(0)`, and None."""
    launch(0)
    if once:
        ctx.synchronize()
        return None
    return median_launch_us[launch](ctx, iters, reps)


struct Sweep(Copyable):
    """What every timing of a sweep (backward_sweep, ce_loss_sweep) shares:
    the device, whether each configuration is launched only once (the
    "once" flag, for ncu), and how it is timed."""

    var ctx: DeviceContext
    """The device the kernels run on."""
    var once: Bool
    """Launch each configuration once: no timing, no checks, no lines."""
    var iters: Int
    """Launches back to back a timing."""
    var reps: Int
    """Timings a configuration (their median is reported)."""

    def __init__(out self, iters: Int, reps: Int) raises:
        """A sweep on the first GPU, "once" read from the command line."""
        self.ctx = DeviceContext()
        self.once = has_arg("once")
        self.iters = iters
        self.reps = reps

    def line[
        dtype: DType,
        family: StaticString,
        launch: def(Int) raises capturing -> None,
        check: def() raises capturing -> String,
    ](self, rows: Int, n: Int, params: String, passes: Float64) raises:
        """Time `launch` (`timed_us`) and print its line (`print_result`):
        "`family` `params`", GB/s counted as `passes` x the tensor's bytes
        (a "copy": 2, read and written), then `check()`, the error check,
        run after the timing. With `once`, launch once and print
        nothing."""
        var us = timed_us[launch](self.ctx, self.once, self.iters, self.reps)
        if us:
            var label = family + " " + params
            var counted = 2.0 if family == "copy" else passes
            print_result[dtype](rows, n, label, us.value(), counted, check())


def picks(s: Strategy) -> String:
    """The strategy a dispatch table picked, as a sweep's line shows it."""
    return "picks=" + String(s.kind) + "/" + String(s.form)


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
