"""How the bench measures: the correctness gate, the marginal wall-clock
time, graph replay, the GPU's busy time, and the sweep over shapes that
puts them together (method: see the package docstring)."""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from ..dtypes import DTYPE_NAMES, to_buffer, to_numpy
from .providers import MaxGraphProvider, Provider, TorchProvider
from .report import gbps_text
from .workloads import CHECK_ROWS, FIGURES, Row, Workload

IMPOSSIBLE_VS_COPY = 3.0
"""A figure over this many times its shape's copy roof is a timing artefact."""

IMPOSSIBLE_VS_BANDWIDTH_COPY = 1.15
"""The same limit where a GPU copy is bound by memory bandwidth (tensors of
`BANDWIDTH_BOUND_BYTES` or more): nothing moves its bytes faster than the
copy there, bar the ~1.1x of a backward that reads more than it writes."""

BANDWIDTH_BOUND_BYTES = 16 << 20

DEVICE_REPS = 5
"""Profiled runs per provider and shape (each exports a trace to parse)."""

REPLAY_WARMUP = 3

REPLAY_OPS = 96
"""Ops the long sample of a replay figure covers: R = max(2, ceil(REPLAY_OPS
/ K)) replays back to back, then one device sync; the short sample is 1
replay + sync, and seconds per op = (T(R) - T(1)) / ((R - 1) K) from the
medians (`time_replays`). Marginal, like exec: a sample's fixed cost (the
first replay call's host time and launch latency before the GPU starts,
and the final sync's return, ~15-25 µs) cancels. wall / (R K) counted it,
0.5-1 µs an op at small shapes, and not alike for every provider: MAX's
`model.replay` takes ~10 µs of host a call, a torch CUDA graph's
`replay()` its own. 96 rather than 48: a difference of two medians is
noisier than one median. Replays run back to back: a sync after each
would add its ~10-20 µs, 20 / K µs an op (a 3-op graph of 130 µs ops
read 81-84% of a copy for that alone on an H100)."""

RETIME = "time it again (more --reps, a quieter machine)"
"""The fix a figure judged impossible (over its copy roof) comes with."""

REPLAY_UNRELIABLE = "replay n/a: unreliable: T(R) <= T(1); raise --reps"
"""`checked_replay`'s note where `time_replays` finds no marginal figure."""


class Timed(NamedTuple):
    """A provider's marginal wall-clock result: seconds per call (NaN if
    unreliable), whether it is reliable, why not, and T(K)/K as a rough
    stand-in (plotted hollow when the marginal figure is unreliable)."""

    secs: float
    ok: bool
    note: str
    rough: float


def _elapsed(fn: Callable[[], None]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def check_provider(provider: Provider, xs: list[tuple[np.ndarray, ...]], workload: Workload) -> str:
    """Prepare `provider`, check its first output against the reference and
    warm up its K-call path; "" if it may be timed, else why not."""
    provider.prepare(xs)
    provider.run(1)
    got = provider.output0()
    if provider.name == "copy":
        ok, why = np.array_equal(got[:CHECK_ROWS], xs[0][0][:CHECK_ROWS]), "copy differs"
    else:  # the workload looks at the first CHECK_ROWS rows
        ok, why = workload.check(got, xs[0])
    if not ok:
        return f"wrong: {why}"
    provider.run(len(xs))  # warm-up (and compile) the K-call path
    return ""


def measure_interleaved(providers: list[Provider], k: int, reps: int) -> list[Timed]:
    """Marginal seconds per call of each provider, (T(K) - T(1)) / (K - 1)
    from medians over `reps` rounds. Each round times every provider once,
    so a burst of noise on a shared machine (our 2-core VM swings 1.5-2x
    within minutes) hits them all alike instead of whichever ran then.
    With one provider it is the plain median of its runs."""
    t1: list[list[float]] = [[] for _ in providers]
    tk: list[list[float]] = [[] for _ in providers]
    for _ in range(reps):
        for i, p in enumerate(providers):
            t1[i].append(_elapsed(lambda p=p: p.run(1)))
            tk[i].append(_elapsed(lambda p=p: p.run(k)))
    out = []
    for a, b in zip(t1, tk, strict=True):
        secs, rough = marginal(a, b, k - 1), statistics.median(b) / k
        if secs is None:
            note = "unreliable: T(K) <= T(1); raise --reps"
            out.append(Timed(float("nan"), False, note, rough))
        else:
            out.append(Timed(secs, True, "", rough))
    return out


def marginal(one: list[float], many: list[float], extra: int) -> float | None:
    """Seconds per unit of the `extra` more units that each `many` sample
    ran beyond each `one` sample: (median(many) - median(one)) / extra, so
    what every sample pays once cancels; None where median(many) <=
    median(one) (no reliable figure). The bench's marginal rule, for exec
    and replay alike."""
    lo, hi = statistics.median(one), statistics.median(many)
    return (hi - lo) / extra if hi > lo else None


def measure_device(provider: Provider, k: int, reps: int) -> float | None:
    """Median GPU-busy seconds per call over `reps` runs of K calls (after
    `measure_interleaved`, so compiled and warm); None if CUPTI saw no GPU work."""
    from .device_timer import gpu_busy

    per_call = []
    for _ in range(reps):
        secs, items = gpu_busy(lambda: provider.run(k))
        if items == 0:
            return None
        per_call.append(secs / k)
    return statistics.median(per_call)


_replay_keys = itertools.count(1)

TORCH_REPLAY = "torch.cuda.graph"
"""`extra["replay"]` of a peer row whose replay figure is its K-call body
captured in a torch CUDA graph (set where it was tried, even if it failed)."""


def _same_bits(a: Any, b: Any) -> bool:
    """Whether two outputs (arrays, or tuples of them: a loss and its
    gradient) are equal bit for bit (NaN payloads and the sign of 0 included)."""
    if isinstance(a, tuple) or isinstance(b, tuple):
        return (
            isinstance(a, tuple)
            and isinstance(b, tuple)
            and len(a) == len(b)
            and all(_same_bits(x, y) for x, y in zip(a, b, strict=True))
        )
    a, b = np.asarray(a), np.asarray(b)
    return (
        a.shape == b.shape
        and a.dtype == b.dtype
        and np.array_equal(
            np.ascontiguousarray(a).view(np.uint8), np.ascontiguousarray(b).view(np.uint8)
        )
    )


def _scribble(buf: object, dtype: str) -> None:
    """Overwrite a captured output with NaNs, so the correctness check sees
    what the replay wrote, not what the capture left there."""
    try:
        junk = np.full(tuple(int(d) for d in buf.shape), np.nan, DTYPE_NAMES[dtype])
        buf.inplace_copy_from(to_buffer(junk))
    except Exception:  # the check still compares, just less strictly
        pass


def time_replays(
    replay: Callable[[], None], sync: Callable[[], None], k: int, reps: int
) -> float | None:
    """Marginal seconds per op of a captured K-op graph: REPLAY_WARMUP
    replays and a `sync`, then `reps` samples, each timing (a) 1 replay +
    `sync` and then (b) R = max(2, ceil(REPLAY_OPS / K)) replays back to
    back + `sync` (alternated, as `measure_interleaved` does, so noise hits
    both); (median(b) - median(a)) / ((R - 1) K), so a sample's fixed cost
    cancels (REPLAY_OPS says why). None if median(b) <= median(a): no
    reliable figure. The one place replays are timed, for MAX's graphs and
    torch's alike."""
    for _ in range(REPLAY_WARMUP):
        replay()
    sync()
    many = max(2, -(-REPLAY_OPS // k))

    def sample(replays: int) -> float:
        t0 = time.perf_counter()
        for _ in range(replays):
            replay()
        sync()
        return time.perf_counter() - t0

    t1: list[float] = []
    tr: list[float] = []
    for _ in range(reps):
        t1.append(sample(1))
        tr.append(sample(many))
    return marginal(t1, tr, (many - 1) * k)


def checked_replay(
    replay: Callable[[], None],
    sync: Callable[[], None],
    scribble: Callable[[], None],
    read: Callable[[], Any],
    expected: Any,
    k: int,
    reps: int,
    against: str = "executed",
) -> tuple[float | None, str]:
    """`time_replays` of a captured graph once one replay has proved it
    right: `scribble` fills the captured output 0 with NaN (so what the
    capture left there cannot pass), one replay, then `read()` (output 0,
    as numpy) must equal `expected` (the `against` run's output 0) bit for
    bit. (seconds per op, "") or (None, why): a wrong replay, an
    unreliable figure (REPLAY_UNRELIABLE) or an exception is a note, never
    a crash."""
    try:
        scribble()
        sync()
        replay()
        sync()
        if not _same_bits(read(), expected):
            return None, f"replay n/a: replayed output 0 differs from {against} output 0"
        secs = time_replays(replay, sync, k, reps)
        return (None, REPLAY_UNRELIABLE) if secs is None else (secs, "")
    except Exception as err:
        return None, f"replay n/a: replay failed: {type(err).__name__}: {err}"


def measure_replay(p: MaxGraphProvider, k: int, reps: int) -> tuple[float | None, str]:
    """Seconds per op of `p`'s K-op graph captured once and replayed
    (`checked_replay`), or (None, why).

    Replay gets the very buffers of the capture (MAX refuses others). Its
    output 0 must equal an executed graph's output 0 bit for bit, else it is
    not timed. The captured graph is released before returning."""
    model, bufs, key = p.model(k), p.inputs(k), next(_replay_keys)
    try:
        expected = to_numpy(model.execute(*bufs)[0])
    except Exception as err:
        return None, f"replay n/a: execute failed: {type(err).__name__}: {err}"
    try:
        outs = model.capture(key, *bufs)
    except Exception as err:
        return None, f"replay n/a: capture failed on {p.kind}: {type(err).__name__}: {err}"
    try:
        return checked_replay(
            lambda: model.replay(key, *bufs),
            p.sync,
            lambda: _scribble(outs[0], p.dtype),
            lambda: to_numpy(outs[0]),
            expected,
            k,
            reps,
        )
    finally:
        outs = None
        try:
            model.release_captured_graph(key)
        except Exception:
            pass


def _owned(y: Any) -> Any:
    """A copy of an output as numpy (an array or a tuple of them): from a
    CPU tensor numpy shares its memory, which the NaN fill would overwrite."""
    if isinstance(y, tuple):
        return tuple(_owned(a) for a in y)
    return np.array(y, copy=True)


def _nan_fill(y: Any) -> None:
    """Overwrite a torch output (a tensor, or a tuple of them and None) with
    NaN. `detach()` shares the memory and never asks autograd."""
    for t in y if isinstance(y, tuple) else (y,):
        if t is not None and t.is_floating_point():
            t.detach().fill_(float("nan"))


def measure_torch_replay(p: TorchProvider, k: int, reps: int) -> tuple[float | None, str]:
    """Seconds per call of torch peer `p`'s K-call body (`p.calls(k)`)
    captured once into a `torch.cuda.CUDAGraph` and replayed, timed as
    ours (`checked_replay`): what a torch user who captures gets. Or (None,
    why), on the CPU too.

    The body runs once eagerly on the capture's side stream first (torch
    asks for a warm-up there; it also loads lazy kernels and compiles), and
    its output 0 is the reference the replay must match bit for bit. A body
    that allocates its outputs gets them from the graph's private pool
    during capture: the replay writes those, so output 0 is read from the
    tensor the capture produced. The graph is released before returning."""
    if p.kind != "gpu":
        return None, "peer on the CPU: a torch CUDA graph needs a CUDA device; no replay"
    cuda = p.torch.cuda
    before = cuda.current_stream()
    try:
        side = cuda.Stream()
        side.wait_stream(before)
        with cuda.stream(side):
            p.calls(k)
        before.wait_stream(side)
        p.sync()
        expected = _owned(p.output0())
    except Exception as err:
        return None, f"replay n/a: eager warm-up failed: {type(err).__name__}: {err}"
    graph = cuda.CUDAGraph()
    try:
        try:
            with cuda.graph(graph, stream=side):
                p.calls(k)
        except Exception as err:  # e.g. a host sync (.item()) inside the body
            return None, f"replay n/a: capture failed: {type(err).__name__}: {err}"
        captured = p.ys[0]
        return checked_replay(
            graph.replay,
            p.sync,
            lambda: _nan_fill(captured),
            lambda: p.output_of(captured),
            expected,
            k,
            reps,
            against="eager",
        )
    finally:
        # A capture that fails in `capture_end` leaves the side stream
        # current (torch.cuda.graph skips restoring it): every later torch
        # call of the sweep would queue there.
        cuda.set_stream(before)
        captured = None
        try:  # frees the graph now, not when the collector gets to it
            graph.reset()
        except Exception:
            pass
        graph = None


def timed_row(
    p: Provider, timed: Timed, base: Row, k: int, nbytes: int, args: argparse.Namespace
) -> Row:
    """`base` (a checked provider's row) with every figure it gets: the
    headline from the wall-clock `timed`, then for a MAX graph its replay
    and device figures, for a peer under `--timer device` its GPU busy time
    in place of wall clock, and for a torch peer on the GPU its replay in a
    torch CUDA graph. A figure that cannot be had gets a note."""

    def rate(secs: float) -> float:
        return p.transfers * nbytes / secs / 1e9

    row = Row(p.name, base.rows, base.n, base.dtype, base.device, ok=True, note=timed.note)
    row.extra = {"k": k, "timer": "wall", "graph": p.graph}
    if timed.ok:
        row.set_figure("exec", timed.secs, rate(timed.secs))
    else:
        row.ok = None
        row.extra["rough"] = {"exec": rate(timed.rough)}
    if args.device_timer if p.graph else args.timer == "device":
        try:
            dev = measure_device(p, k, min(args.reps, DEVICE_REPS))
        except Exception as err:  # a figure lost, not the row
            dev, row.notes["device"] = None, f"device n/a: {type(err).__name__}: {err}"[:240]
        if dev is None:
            row.notes.setdefault("device", "device n/a: the device timer saw no GPU work")
        else:
            row.set_figure("device", dev, rate(dev))
    elif p.graph:
        row.notes["device"] = "device n/a: CUPTI busy time needs a GPU and torch with CUDA"
    else:
        row.notes["device"] = "peer: timed by wall clock (--timer wall), no device figure"
    if not p.graph:
        if args.timer == "device" and row.device_us is not None:
            row.extra.update(timer="device", wall_us=row.us, wall_gbps=row.gbps)
            row.us, row.gbps, row.ok, row.note = row.device_us, row.device_gbps, True, ""
        elif args.timer == "device":
            why = "the device timer saw no GPU work: wall clock"
            row.note = f"{row.note}; {why}" if row.note else why
    if isinstance(p, MaxGraphProvider):
        replay = measure_replay
    elif isinstance(p, TorchProvider):  # on the CPU it returns why not at once
        replay = measure_torch_replay
        if p.kind == "gpu":  # tried: the table gives the peer a replay column
            row.extra["replay"] = TORCH_REPLAY
    else:
        row.notes["replay"] = "peer: no graph to replay (only torch peers on a CUDA device are)"
        return row
    try:
        secs, why = replay(p, k, args.reps)
    except Exception as err:  # a figure lost, not the row
        secs, why = None, f"replay n/a: {type(err).__name__}: {err}"
    if secs is None:
        row.notes["replay"] = why[:240]
    else:
        row.set_figure("replay", secs, rate(secs))
    return row


def flag_impossible(rows: list[Row], moves_less: float = 1.0) -> None:
    """Un-time figures over 3x the copy roof of their shape (1.15x for a
    GPU tensor of 16 MB or more), times `moves_less` (the workload's: a
    causal softmax reads about half its input): no provider moves its
    bytes that much faster than a copy (a backward, reading more than it
    writes, reaches ~1.1x), so such a number is a timing artefact (e.g.
    T(1) inflated by allocation), not a speed. The value is kept in
    `extra["rough"]` (plotted hollow). The headline is held against the
    copy's headline; replay and device figures against the copy's GPU time
    when it was timed on the device (a wall-clock copy at a tiny shape is
    launch-bound, and a replay can legitimately beat it), replays else
    against the copy's own replay (a torch CUDA graph of its copies). Peers'
    replays are held like ours."""
    copy = next((r for r in rows if r.provider == "copy" and r.gbps), None)
    if copy is None:
        return
    replay_roof = copy.device_gbps or copy.replay_gbps
    roofs = {"exec": copy.gbps, "replay": replay_roof, "device": copy.device_gbps}
    nbytes = copy.rows * copy.n * DTYPE_NAMES[copy.dtype].itemsize
    bound = copy.device == "gpu" and nbytes >= BANDWIDTH_BOUND_BYTES
    limit = (IMPOSSIBLE_VS_BANDWIDTH_COPY if bound else IMPOSSIBLE_VS_COPY) * moves_less
    for r in rows:
        for which in FIGURES:
            gbps, roof = r.figure(which)[1], roofs[which]
            if gbps and roof and gbps > limit * roof:
                why = f"unreliable: {gbps:.0f} GB/s is over {limit:.3g}x the copy roof; {RETIME}"
                r.extra.setdefault("rough", {})[which] = gbps
                r.set_figure(which, None, None)
                if which == "exec":
                    r.note, r.ok = why, None
                else:
                    r.notes[which] = why


_flag_impossible = flag_impossible  # the name older code and tests use


def release_torch_cache() -> None:
    """Give torch's cached GPU memory back so the next provider can use it."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        torch.cuda.empty_cache()


def summary(row: Row) -> str:
    """One line of a row's figures for the progress output."""
    if row.ok is False or (row.gbps is None and row.note and not row.is_graph):
        return row.note
    parts = []
    # A peer: its one timed figure, and its torch CUDA graph replay where tried.
    peer = ("exec", "replay") if row.extra.get("replay") else ("exec",)
    for which in FIGURES if row.is_graph else peer:
        gbps = row.figure(which)[1]
        label = which if row.is_graph or which != "exec" else row.extra.get("timer", "wall")
        if gbps:
            parts.append(f"{label} {gbps_text(gbps)} GB/s")
        else:  # never a bare n/a: the reason and its fix, on the same line
            parts.append(f"{label} n/a ({row.why_missing(which).split('n/a: ', 1)[-1]})")
    return ", ".join(parts)
