"""How the CPU kernels run their tasks: in parallel when there are several,
inline when there is one.

MAX's `sync_parallelize` hands even a single task to its thread pool, which
costs ~25 µs a call on a 2-core machine (benchmarks/host_cost): four times
the work of a small batch, and more than MAX's own softmax pays per op.
"""

from max.algorithm import sync_parallelize


@always_inline
def run_tasks[
    FuncType: def(Int) raises -> None
](func: FuncType, tasks: Int) raises:
    """Run `func(0)` ... `func(tasks - 1)`: in parallel, or inline when
    `tasks` is 1."""
    if tasks == 1:
        func(0)
    else:
        sync_parallelize(func, tasks)
