"""GPU busy time of a call, from CUPTI's device timestamps (torch.profiler).

Wall-clock time around K ops of a MAX graph includes MAX's per-op host
work: on the H100 7-16 µs an op, as much as the kernel of a 16 MB
softmax. CUPTI records every kernel, memcpy and memset the process runs on
the GPU, whichever library launched it (MAX, torch, Triton, JAX), with the
GPU's own start and end times. The union of those spans is the time the GPU
spent on the call, the same measure for every provider, and what "time
kernels, not Python call overhead" asks for.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable
from pathlib import Path

# Chrome-trace categories of GPU work in torch.profiler's export.
GPU_CATEGORIES = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})


def available() -> bool:
    """Whether torch with CUDA (and so CUPTI) is installed and sees a GPU."""
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def busy_seconds(spans: list[tuple[float, float]]) -> float:
    """Length of the union of (start, duration) spans, in their unit."""
    total, end = 0.0, float("-inf")
    for start, dur in sorted(spans):
        stop = start + dur
        if stop > end:
            total += stop - max(start, end)
            end = stop
    return total


def gpu_spans(trace: dict) -> list[tuple[float, float]]:
    """(start, duration) in µs of every GPU item in a chrome trace."""
    return [
        (float(e["ts"]), float(e["dur"]))
        for e in trace.get("traceEvents", [])
        if e.get("cat") in GPU_CATEGORIES and "dur" in e and "ts" in e
    ]


def gpu_trace(fn: Callable[[], None], host: bool = False) -> list[dict]:
    """The chrome-trace events with a start and a duration that the
    profiler recorded while `fn` ran, sorted by start: GPU items (kernel,
    memcpy, memset), the CUDA runtime / driver calls CUPTI saw (MAX's
    kernel launches among them, not every driver call; torch's own), and
    with `host` the CPU-side events (`torch.profiler.record_function`
    spans that `fn` marks)."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CUDA] + ([ProfilerActivity.CPU] if host else [])
    with profile(activities=activities) as prof:
        fn()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(path))
        events = json.loads(path.read_text()).get("traceEvents", [])
    return sorted((e for e in events if "dur" in e and "ts" in e), key=lambda e: float(e["ts"]))


def gpu_busy(fn: Callable[[], None]) -> tuple[float, int]:
    """Seconds the GPU was busy while `fn` ran (it must synchronize), and
    how many kernels/copies that was."""
    spans = gpu_spans({"traceEvents": gpu_trace(fn)})
    return busy_seconds(spans) * 1e-6, len(spans)
