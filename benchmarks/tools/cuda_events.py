"""The CUDA-event timing loop the torch benchmark tools share.

    from cuda_events import median_ms
    median_ms(lambda x, t: loss(x, t).backward(), reps=20, warmup=3,
              inputs=lambda i: (fresh_logits(), fresh_targets()))

The tools run as scripts (`python benchmarks/tools/X.py`), so this folder is
on `sys.path` and the module imports by its bare name.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

import torch


def median_ms(
    fn: Callable[..., object],
    reps: int,
    warmup: int = 3,
    inputs: Callable[[int], tuple[Any, ...]] | None = None,
) -> float:
    """Median ms of `fn(*inputs(i))` over `reps` calls after `warmup`, each
    between two CUDA events; `inputs(i)` (call i's arguments: fresh leaves,
    fresh logits) runs before the first event, so it is not timed."""
    times = []
    for i in range(warmup + reps):
        args = inputs(i) if inputs is not None else ()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn(*args)
        end.record()
        end.synchronize()
        if i >= warmup:
            times.append(start.elapsed_time(end))
        del args
    return statistics.median(times)
