"""Waits announced truly: what each kind of build costs, and the notices.

Every build that makes a caller wait more than ~2 s (the kernel library's
precompile, the launch extension's build, a MAX model's compile) is run
inside `announced`, which prints one line on stderr before it starts, with
an estimate, and one after, with the time it took (MAX_SOFTMAX_QUIET=1
silences both). A user's graph that holds our ops is compiled by MAX inside
`InferenceSession.load`: `user_graph` announces it, and the first load of
that graph says when it is done. The estimates come from one table, `BUILDS`: seconds
measured on an idle machine (named in each entry), scaled by how many
other tasks compete for the CPU right now (`busy_factor`), since every
build here keeps about one core busy and a shared machine stretches it.
"""

from __future__ import annotations

import functools
import os
import sys
import threading
import time
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from . import settings


@dataclass(frozen=True)
class Build:
    """One kind of build: its wall time on an idle `machine`, the cores it
    keeps busy (CPU time / wall time), and the command that measured it."""

    seconds: float
    machine: str
    cores: float
    measured_by: str


VM = "2-core AMD EPYC VM (CPU only)"
H100_HOST = "H100 host (16 cores)"

_WARMUP = "XDG_CACHE_HOME=$(mktemp -d) softmax warmup --device cpu"

BUILDS: dict[str, Build] = {
    "kernel_library": Build(5.0, VM, 1.0, _WARMUP),
    "extension:cpu": Build(30.0, VM, 1.1, _WARMUP),
    "extension:gpu": Build(100.0, H100_HOST, 1.1, "RESULTS.md, First call: 1 min 40 s"),
    "model:cpu": Build(18.0, VM, 1.0, _WARMUP),
    "model:gpu": Build(15.0, H100_HOST, 1.0, "benchmarks/tools/compile_time.py --device gpu"),
    "attention_example:cpu": Build(65.0, VM, 1.0, "the README's 'attention' graph, empty caches"),
    "train_step:cpu": Build(140.0, VM, 1.0, "softmax train --steps 1 --device cpu, empty caches"),
}
"""Measured seconds per kind of build (benchmarks/RESULTS.md, "First call
and compile time"): the precompiled kernel library; the launch extension
for the CPU only or with a GPU target; one MAX model of our ops (any graph
costs MAX about that much at least); the README's user graph, where two
matmuls add ~45 s to our op's compile; `softmax train`'s step graph (its
matmuls, forward and backward)."""


def announce(message: str) -> None:
    """One line to stderr about a wait the user would otherwise not see;
    silenced by MAX_SOFTMAX_QUIET=1."""
    if settings.flag("MAX_SOFTMAX_QUIET"):
        return
    print(f"max-softmax: {message}", file=sys.stderr, flush=True)


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


def _others_running() -> float:
    """How many other tasks want a CPU now: the kernel's count of runnable
    tasks (/proc/loadavg's fourth field, sampled a few times over ~20 ms,
    less this reader), else the one-minute load average."""
    samples = []
    try:
        for _ in range(5):
            with open("/proc/loadavg") as f:
                samples.append(int(f.read().split()[3].split("/")[0]) - 1)
            time.sleep(0.004)
    except (OSError, ValueError, IndexError):
        try:
            return os.getloadavg()[0]
        except OSError:
            return 0.0
    return max(0.0, sum(samples) / len(samples))


def busy_factor(cores: float = 1.0) -> float:
    """How much longer than on an idle machine a build keeping `cores`
    cores busy takes now: (others runnable + cores) / the cores we may use,
    at least 1."""
    return max(1.0, (_others_running() + cores) / _cores())


def estimate(kind: str) -> float:
    """The seconds a build of `kind` (a key of BUILDS) should take now."""
    build = BUILDS[kind]
    return build.seconds * busy_factor(build.cores)


def _seconds(seconds: float) -> str:
    """`seconds` as an estimate reads: "~5 s", "~34 s", "~2 min"."""
    if seconds < 120:
        return f"~{seconds:.0f} s"
    return f"~{seconds / 60:.0f} min"


def estimate_text(kind: str) -> str:
    """`estimate(kind)` as the notices print it, e.g. "~15 s"."""
    return _seconds(estimate(kind))


@contextmanager
def announced(kind: str, doing: str, done: str) -> Iterator[None]:
    """Announce the build of `kind` (a key of BUILDS) before it starts
    ("`doing` (first use, ~N s; then cached)") and after it ends ("`done`
    in T s"),
    on stderr; a build that raises is left to its error."""
    announce(f"{doing} (first use, {estimate_text(kind)}; then cached)")
    start = time.perf_counter()
    yield
    announce(f"{done} in {time.perf_counter() - start:.1f} s")


# ---------------------------------------------------------------------------
# Graphs: ours (announced where they compile) and the user's
# ---------------------------------------------------------------------------

_ours = threading.local()
_users: weakref.WeakSet[Any] = weakref.WeakSet()
_unloaded: weakref.WeakSet[Any] = weakref.WeakSet()
_users_lock = threading.Lock()
_load_timed = False


@contextmanager
def our_graph() -> Iterator[None]:
    """Mark the graphs staged in this block (on this thread) as max-softmax's
    own: `models.compiled` announces their compile, so `user_graph` stays
    silent for them."""
    _ours.depth = getattr(_ours, "depth", 0) + 1
    try:
        yield
    finally:
        _ours.depth -= 1


def user_graph(graph: Any) -> None:
    """Say, once per graph, that a user's graph now holds our ops, so its
    first `InferenceSession.load` compiles them; that load then says how
    long it took (`_time_first_loads`)."""
    if getattr(_ours, "depth", 0):
        return
    with _users_lock:
        if graph in _users:
            return
        _users.add(graph)
        _unloaded.add(graph)
    _time_first_loads()
    device = "gpu" if any(_on_gpu(v) for v in getattr(graph, "inputs", ())) else "cpu"
    name = getattr(graph, "name", None) or "?"
    example = f"attention_example:{device}"
    others = ""
    if example in BUILDS:
        others = f" (the README's, with two matmuls: {estimate_text(example)} in all)"
    announce(
        f"graph {name!r} holds max-softmax ops: its first InferenceSession.load on this "
        f"machine compiles them ({estimate_text('model:' + device)}) and its other ops"
        f"{others}; MAX caches it, later loads ~1 s"
    )


def _on_gpu(value: Any) -> bool:
    """Whether graph input `value` lives on a GPU (a DeviceRef prints as "gpu:0")."""
    device = getattr(getattr(value, "type", None), "device", None)
    return device is not None and str(device).lower().startswith("gpu")


def _time_first_loads() -> None:
    """Have `InferenceSession.load` say, after the first load of a graph
    `user_graph` announced, how long it took (MAX compiles inside it, where
    nothing else can see the compile end). Installed once a process, on
    the first user graph that holds our ops; every other load, and every
    later load of that graph, passes straight through."""
    global _load_timed
    with _users_lock:
        if _load_timed:
            return
        _load_timed = True
    from max.engine import InferenceSession

    original = InferenceSession.load

    @functools.wraps(original)
    def load(self: Any, model: Any, *args: Any, **kwargs: Any) -> Any:
        with _users_lock:
            # A path is no graph (and no WeakSet member: it has no weakref).
            first = not isinstance(model, (str, os.PathLike)) and model in _unloaded
            if first:
                _unloaded.discard(model)
        if not first:
            return original(self, model, *args, **kwargs)
        start = time.perf_counter()
        loaded = original(self, model, *args, **kwargs)
        name = getattr(model, "name", None) or "?"
        took = time.perf_counter() - start
        announce(f"graph {name!r} loaded in {took:.1f} s (compiled, or from MAX's cache)")
        return loaded

    InferenceSession.load = load
