"""How the CPU kernels cut their work into tasks and run them: whole items
(rows, or column blocks) grouped to `TASK_ELEMENTS` a task, in parallel when
there are more than `INLINE_TASKS`, inline otherwise.

MAX's `sync_parallelize` hands even a single task to its thread pool, which
costs ~25 µs a call on a 2-core machine (benchmarks/DECISIONS.md): four times
the work of a small batch, and more than MAX's own softmax pays per op.
"""

from std.math import ceildiv

from max.algorithm import sync_parallelize

# Enough elements per task that thread start-up is noise, few enough tasks
# that both cores stay busy on small batches.
comptime TASK_ELEMENTS = 1 << 15


def items_per_task(item_elements: Int) -> Int:
    """How many whole items of `item_elements` elements one task takes: at
    least one, else as many as fit `TASK_ELEMENTS`."""
    return max(1, TASK_ELEMENTS // max(item_elements, 1))


# Work of at most this many tasks (64K elements of rows; a long row's two
# chunks) runs on the calling thread: there a pool worker was no faster on a
# lightly loaded 2-core machine, and several times slower on a busy one,
# where it waits for a core (docs/drafts/cpu_roof.md).
comptime INLINE_TASKS = 2


@always_inline
def run_tasks[
    FuncType: def(Int) raises -> None
](func: FuncType, tasks: Int) raises:
    """Run `func(0)` ... `func(tasks - 1)`: inline, one after another, when
    there are at most `INLINE_TASKS`, else in parallel."""
    if tasks <= INLINE_TASKS:
        for t in range(tasks):
            func(t)
    else:
        sync_parallelize(func, tasks)


@always_inline
def run_in_tasks[
    FuncType: def(Int, Int) raises -> None
](each_range: FuncType, items: Int, item_elements: Int) raises:
    """Run `each_range(begin, end)` over items 0 ... items - 1 of
    `item_elements` elements each, cut into tasks of `items_per_task` whole
    items (`run_tasks`): the one way every CPU kernel groups its rows."""
    var per_task = items_per_task(item_elements)

    def task(t: Int) raises {imm}:
        each_range(t * per_task, min(items, (t + 1) * per_task))

    run_tasks(task, ceildiv(items, per_task))
