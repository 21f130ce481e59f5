"""What the bench builds before it times anything, said up front and built
side by side.

A cold bench used to build one thing at a time, as each provider's check
first needed it: the kernel library, then per dtype a 1-op and a K-op MAX
graph for ours and for MAX's built-in (12-15 s each on a quiet 2-core CPU,
each keeping one core busy), and the launch extension for `ours:numpy`
(~25 s, a subprocess). Their graphs have symbolic dims, so the set a sweep
needs is known from its dtypes, shapes and K values before the first shape:
`plan` lists it, `build_ahead` builds it on as many threads as there are
cores (MAX compiles without holding the GIL; the extension builds in a
child process) and waits for all of it, so no compile runs while anything
is timed. Each build still announces itself (`models.compiled`).
"""

from __future__ import annotations

import os
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial

from .. import models
from .progress import say
from .providers import ArrayProvider, MaxGraphProvider, Provider, bridged, is_max_graph
from .workloads import Workload


@dataclass
class Build:
    """One thing to build before timing: what it is, the call that builds
    it, whether it was already cached, and (after `build_ahead`) the seconds
    it took and the error it raised, if any."""

    what: str
    run: Callable[[], object]
    cached: bool
    seconds: float = 0.0
    error: str = ""


@dataclass
class Plan:
    """Everything a sweep builds, and what each provider needs (for the
    announcement)."""

    builds: list[Build] = field(default_factory=list)
    needs: dict[str, str] = field(default_factory=dict)


def _process_cpu() -> float:
    """CPU seconds of this process and its finished children, user + system."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def plan(
    kind: str,
    dtypes: Sequence[str],
    shapes: Sequence[tuple[int, int]],
    workload: Workload,
    max_k: int,
    factories_of: Callable[[str], list[Callable[[], Provider]]],
) -> Plan:
    """The MAX graphs (one per graph provider, dtype and K: 1 and each
    shape's K) and the launch extension (where a provider on the CPU
    launches through it) that a sweep of `dtypes` x `shapes` needs;
    `factories_of(dtype)` gives that dtype's providers."""
    from .. import launch

    out = Plan()
    extension = False
    for dtype in dtypes:
        itemsize = _itemsize(dtype)
        ks = sorted({1} | {workload.rotations(r * n * itemsize, max_k) for r, n in shapes})
        for factory in factories_of(dtype):
            if is_max_graph(factory):
                p = factory()
                assert isinstance(p, MaxGraphProvider)
                for k in ks:
                    key = p.key(k)
                    what = f"{p.name} {workload.op} {dtype} {k}-op graph"
                    cached = models.compile_marker(key).is_file()
                    out.builds.append(Build(what, partial(p.model, k), cached))
                graphs = " and ".join(f"{k}-op" for k in ks)
                prev = out.needs.get(p.name)
                mine = f"{dtype} {graphs}"
                out.needs[p.name] = f"{prev}; {mine}" if prev else f"MAX graphs: {mine}"
            elif kind == "cpu" and launch.ENABLED and _launches(factory):
                extension = True
                name = _name(factory)
                out.needs[name] = "the launch extension (no graph)"
    if extension:
        cached = launch.extension_path().is_file()
        out.builds.insert(0, Build("the launch extension", launch.extension, cached))
    return out


def _itemsize(dtype: str) -> int:
    from ..dtypes import DTYPE_NAMES

    return DTYPE_NAMES[dtype].itemsize


def _launches(factory: Callable[[], Provider]) -> bool:
    """Whether `factory`'s provider calls our op through the launch
    extension on the CPU: the array functions, the torch bridge."""
    return isinstance(factory, partial) and (
        factory.func is ArrayProvider or factory.func in bridged()
    )


def _name(factory: Callable[[], Provider]) -> str:
    return "ours:numpy" if factory.func is ArrayProvider else "ours:torch"  # type: ignore[attr-defined]


def announce(p: Plan) -> None:
    """Say, per provider, what it compiles before anything is timed."""
    for name, need in p.needs.items():
        say(f"{name} needs {need}")
    say(
        "the other providers (copy and peers) build nothing of ours; a peer's own JIT "
        "(torch.compile, JAX) compiles in its untimed warm-up"
    )
    todo = [b for b in p.builds if not b.cached]
    if todo:
        workers = min(len(todo), _cores())
        say(
            f"building {len(todo)} of {len(p.builds)} ahead, {workers} at a time "
            f"(the rest are cached), before timing anything: " + ", ".join(b.what for b in todo)
        )
    elif p.builds:
        say(f"all {len(p.builds)} builds are cached (MAX's cache loads a graph in ~1-2 s)")


def build_ahead(p: Plan, workers: int | None = None) -> float:
    """Build everything in `p` on `workers` daemon threads (default: one per
    core), the uncached first; wait for all; return the wall seconds. A
    failed build is noted in its `Build.error` and left to its provider's
    check, which then says why in its row. Daemon threads, so Ctrl-C is
    not held up by a compile in flight."""
    if not p.builds:
        return 0.0
    order = sorted(p.builds, key=lambda b: b.cached)
    jobs: queue.Queue[Build] = queue.Queue()
    for b in order:
        jobs.put(b)
    workers = max(1, min(workers or _cores(), len(order)))
    done = threading.Semaphore(0)

    def work() -> None:
        while True:
            try:
                b = jobs.get_nowait()
            except queue.Empty:
                return
            start = time.perf_counter()
            try:
                b.run()
            except Exception as err:  # the provider's check says why, in its row
                b.error = f"{type(err).__name__}: {err}"
            b.seconds = time.perf_counter() - start
            done.release()

    start, cpu = time.perf_counter(), _process_cpu()
    for _ in range(workers):
        threading.Thread(target=work, name="bench build", daemon=True).start()
    for _ in order:
        done.acquire()
    wall, cpu = time.perf_counter() - start, _process_cpu() - cpu
    built = [b for b in order if not b.cached]
    if built:
        # CPU seconds say what the builds cost whatever else the machine runs
        # (MAX compiles on its own threads: per build, only the wall time).
        each = ", ".join(f"{b.what} {b.seconds:.1f} s" for b in built)
        say(
            f"built {len(built)} in {wall:.1f} s wall and {cpu:.0f} CPU seconds "
            f"(builds in child processes included), {workers} at a time: {each}"
        )
    for b in order:
        if b.error:
            say(f"{b.what} failed ({b.error[:200]}); its provider's row will say why")
    return wall
