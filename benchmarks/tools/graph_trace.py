"""Where a bench graph's time goes on the GPU: the timeline of one execute and
of back-to-back replays of the bench's K-op graph, from CUPTI.

    python benchmarks/tools/graph_trace.py --op masked_softmax --dtype float32 \\
        --shape 4096x4096 [--k 3] [--replays 4] [--builtin] [--show 40]

For each phase it prints every GPU item (kernel, memcpy, memset) with its
start (µs from the phase's first event), duration, the time since the
previous GPU item started and the GPU's idle time before it, and the CUDA
calls CUPTI saw until the last GPU item ended (for MAX: its kernel
launches; CUPTI does not see every driver call), then a summary: GPU span,
GPU busy time, start-to-start spacing, idle time between GPU items. With
PDL a kernel is scheduled before its predecessor ends, so spans overlap:
its duration then includes its wait, and the spacing is the figure to read.
The bench reports per-op medians; this shows what sits between the kernels
(extra kernels, copies, launch gaps) when those medians trail the device
time. Needs a GPU and torch with CUDA.

With `--markers` the execute is traced without host events (which slow
`execute` ~15x) and is bracketed by two one-element torch kernels on a
stream of their own: the first starts when `execute` is called (plus a
launch's latency, the GPU being idle), the second once it has returned
(or when an SM frees). The first MAX kernel's start after the first marker
is then the host time `execute` spent before its first launch, and the
host times of `execute` and of the sync are printed beside the trace.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import numpy as np

from max_softmax.bench.device_timer import GPU_CATEGORIES, busy_seconds, gpu_trace
from max_softmax.bench.providers import MaxGraphProvider, make_providers
from max_softmax.bench.workloads import WORKLOADS

HOST_CATEGORIES = frozenset({"cuda_runtime", "cuda_driver", "user_annotation"})


def graph_provider(op: str, dtype: str, ours: bool) -> MaxGraphProvider:
    """The bench's MAX graph provider of `op`: ours (auto) or the built-in."""
    for factory in make_providers("gpu", dtype, [], op):
        p = factory()
        if isinstance(p, MaxGraphProvider) and p.ours == ours:
            return p
    raise SystemExit(f"graph_trace: no {'ours' if ours else 'built-in'} provider for {op}")


def show(title: str, events: list[dict], limit: int) -> None:
    """Print a phase's timeline (at most `limit` lines) and its summary."""
    gpu = [e for e in events if e.get("cat") in GPU_CATEGORIES]
    if not gpu:
        print(f"## {title}: CUPTI saw no GPU work")
        return
    gpu_end = max(float(e["ts"]) + float(e["dur"]) for e in gpu)
    # Host calls after the last GPU item are the profiler's own, not fn's.
    events = [
        e
        for e in events
        if e.get("cat") in GPU_CATEGORIES
        or (e.get("cat") in HOST_CATEGORIES and float(e["ts"]) < gpu_end)
    ]
    t0 = float(events[0]["ts"])
    print(f"## {title}: {len(gpu)} GPU items, {len(events) - len(gpu)} host calls")
    print(f"{'start':>10} {'dur':>9} {'spacing':>8} {'idle':>8}  what")
    end = last_start = None
    gaps, spacings = [], []
    for shown, e in enumerate(events):
        ts, dur = float(e["ts"]) - t0, float(e["dur"])
        spacing = idle = ""
        if e["cat"] in GPU_CATEGORIES:
            if end is not None:
                gaps.append(max(0.0, ts - end))
                spacings.append(ts - last_start)
                idle, spacing = f"{gaps[-1]:8.1f}", f"{spacings[-1]:8.1f}"
            end, last_start = max(end or 0.0, ts + dur), ts
        if shown < limit:
            where = "GPU " if e["cat"] in GPU_CATEGORIES else "host"
            name = str(e.get("name"))[:90]
            print(f"{ts:10.1f} {dur:9.1f} {spacing:>8} {idle:>8}  {where} {name}")
    span = gpu_end - float(gpu[0]["ts"])
    busy = busy_seconds([(float(e["ts"]), float(e["dur"])) for e in gpu])
    median = statistics.median(spacings) if spacings else 0.0
    print(
        f"GPU span {span:.1f} µs, busy {busy:.1f} µs, start-to-start median {median:.1f} µs, "
        f"idle between GPU items {sum(gaps):.1f} µs (largest "
        f"{', '.join(f'{g:.1f}' for g in sorted(gaps)[-4:])})\n"
    )


def main() -> None:
    """Trace one execute and `--replays` replays of the bench graph."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--op", default="softmax", choices=sorted(WORKLOADS))
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--shape", default="4096x4096")
    ap.add_argument("--k", type=int, default=0, help="ops per graph (default: the bench's K)")
    ap.add_argument("--replays", type=int, default=4)
    ap.add_argument("--builtin", action="store_true", help="MAX's built-in instead of ours")
    ap.add_argument("--show", type=int, default=60, help="timeline lines per phase")
    ap.add_argument(
        "--markers",
        action="store_true",
        help="bracket the execute with torch marker kernels, no host events",
    )
    args = ap.parse_args()
    rows, n = (int(v) for v in args.shape.split("x"))
    workload = WORKLOADS[args.op]
    p = graph_provider(args.op, args.dtype, not args.builtin)
    first = workload.make_inputs(np.random.default_rng(0), rows, n, args.dtype)
    nbytes = first[0].nbytes
    k = args.k or workload.rotations(nbytes, 16)
    rng = np.random.default_rng(1)
    p.prepare([first] + [workload.make_inputs(rng, rows, n, args.dtype) for _ in range(k - 1)])
    for _ in range(3):
        p.run(k)
    print(f"# {p.name} {args.op} {args.dtype} {args.shape}, {k} ops a graph\n")
    if args.markers:
        for ops in sorted({1, k}):
            host: dict[str, float] = {}
            trace = gpu_trace(lambda ops=ops, host=host: _bracketed(p, ops, host))
            show(f"execute of {ops} ops + sync, between markers", trace, args.show)
            print(", ".join(f"{what} {us:.1f} µs" for what, us in host.items()) + "\n")
    else:
        show("execute + sync", gpu_trace(lambda: _marked(p, k), host=True), args.show)

    model, bufs = p.model(k), p.inputs(k)
    model.capture(1, *bufs)
    try:
        for _ in range(3):
            model.replay(1, *bufs)
        p.sync()

        def replays() -> None:
            for _ in range(args.replays):
                model.replay(1, *bufs)
            p.sync()

        show(f"{args.replays} replays + sync", gpu_trace(replays), args.show)
        host = _host_cost(lambda: model.replay(1, *bufs), p.sync)
        print(f"host time of one replay call (device idle before it): {host:.1f} µs")
    finally:
        model.release_captured_graph(1)


def _marked(p: MaxGraphProvider, k: int) -> None:
    """`p.run(k)` with its execute and its sync marked in the host trace."""
    from torch.profiler import record_function

    with record_function("model.execute"):
        p.last = p.model(k).execute(*p.inputs(k))
    with record_function("sync"):
        p.sync()


def _bracketed(p: MaxGraphProvider, k: int, host: dict[str, float]) -> None:
    """`p.run(k)` between two marker kernels on a torch stream of their own
    (non-blocking, so neither waits for MAX's stream nor holds it up); the
    host times of execute and of the sync go to `host`."""
    import torch

    stream = torch.cuda.Stream()
    mark = torch.zeros(1, device="cuda")
    model, bufs = p.model(k), p.inputs(k)
    torch.cuda.synchronize()
    with torch.cuda.stream(stream):
        mark.add_(1)
    t0 = time.perf_counter()
    p.last = model.execute(*bufs)
    t1 = time.perf_counter()
    with torch.cuda.stream(stream):
        mark.add_(1)
    p.sync()
    t2 = time.perf_counter()
    torch.cuda.synchronize()
    host["execute"] = (t1 - t0) * 1e6
    host["sync"] = (t2 - t1) * 1e6


def _host_cost(call: Callable[[], None], sync: Callable[[], None], n: int = 20) -> float:
    """Median host time of `call` in µs, the device drained between calls."""
    times = []
    for _ in range(n):
        sync()
        t = time.perf_counter()
        call()
        times.append((time.perf_counter() - t) * 1e6)
    sync()
    return statistics.median(times)


if __name__ == "__main__":
    main()
