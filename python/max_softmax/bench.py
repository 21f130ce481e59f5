"""`softmax bench`: GB/s of our kernels against every peer that is installed.

Method (the same for every provider, so the numbers compare):

- Fresh random inputs (never zeros). K distinct input/output pairs are
  rotated so that the K tensors together exceed the GPU's L2 (50 MB on an
  H100): each call reads from HBM, as in a model.
- Marginal time per call = (T(K calls) - T(1 call)) / (K - 1), each T the
  median of several synchronized wall-clock runs after a warm-up. This
  removes fixed per-`execute` / per-sync overhead (MAX's ~30 us) for all
  providers alike. For MAX (ours and the built-in) the K calls are K ops in
  one graph, executed once.
- On the GPU with torch installed (`--timer device`, the default there) the
  time reported is instead the GPU's own: the union of every kernel, memcpy
  and memset span CUPTI records during the K calls, divided by K (see
  device_timer.py). MAX adds 7-16 µs of host work per graph op (H100), which the
  wall-clock marginal time counts and CUDA-event-timed peers do not; the
  wall-clock figure stays in the JSON (`extra.wall_us`, `extra.wall_gbps`).
- GB/s = bytes that must move (read input + write output = 2 x tensor
  bytes) / time; the roof is a device copy of the same tensors measured in
  the same run.
- Every provider's output is checked against the float64 SciPy reference
  (first rows) before it is timed; a failing provider is reported, not
  timed.

`--op` picks what is timed: `softmax` (default; our graph op and every
peer), `softmax_backward` (reads y and dy, writes dx: 3 tensors a call; peer
torch's softmax backward), or `torch_fwd_bwd` (a torch training step's
softmax, forward + backward through autograd: 5 tensors a call; our op
through the `max_softmax.torch` bridge, its overhead included, against
`torch.softmax`). With `--bridge` the softmax sweep also times our op called
from torch (`ours:torch`).

Results go to a JSON file first; the table and the PNG plot are made from
that data.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from .devices import device as max_device
from .devices import resolve_device
from .dtypes import DTYPE_NAMES, max_dtype, to_buffer
from .models import session
from .reference import compare, compare_backward, reference

# JAX grabs 75% of GPU memory on first use unless told not to, which starves
# MAX's allocator for the large shapes measured after it.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

ISSUE_SHAPES_GPU: list[tuple[int, int]] = [
    (4096, 1024),
    (4096, 4096),
    (4096, 16384),
    (4096, 65536),
    (8192, 50257),
    (32, 1 << 20),
]
SWEEP_GPU: list[tuple[int, int]] = [
    (16384, 32),
    (16384, 128),
    (16384, 512),
    (8192, 2048),
    (2048, 8192),
    (1024, 32768),
    (256, 131072),
    (64, 524288),
    (1, 1 << 20),
    (16, 1 << 20),
]
SHAPES_CPU: list[tuple[int, int]] = [
    (4096, 1024),
    (1024, 16384),
    (256, 65536),
    (16, 1 << 20),
    (2048, 128),
]
L2_BYTES = 50 << 20
CHECK_ROWS = 64


@dataclass(frozen=True)
class Workload:
    """What one timed call computes: its inputs and how many tensor-sized
    transfers it must make (GB/s = transfers x tensor bytes / time)."""

    op: str
    transfers: int
    arity: int

    def make_inputs(self, rng: np.random.Generator, rows: int, n: int, dtype: str) -> tuple:
        """Fresh random inputs of one call: (x,), (y, dy) or (x, dy)."""
        x = (rng.standard_normal((rows, n), dtype=np.float32) * 4).astype(DTYPE_NAMES[dtype])
        if self.op == "softmax":
            return (x,)
        dy = rng.standard_normal((rows, n), dtype=np.float32).astype(DTYPE_NAMES[dtype])
        if self.op == "softmax_backward":  # y = softmax(x), in float32 to stay quick
            e = np.exp(x.astype(np.float32) - x.max(axis=-1, keepdims=True).astype(np.float32))
            return ((e / e.sum(axis=-1, keepdims=True)).astype(x.dtype), dy)
        return (x, dy)

    def check(self, got: np.ndarray, inputs: tuple) -> tuple[bool, str]:
        """Whether `got` (first CHECK_ROWS rows) matches the float64 reference."""
        first = [a[:CHECK_ROWS] for a in inputs]
        if self.op == "softmax":
            c = compare("softmax", got, first[0], -1)
        else:
            y, dy = first
            if self.op == "torch_fwd_bwd":  # the y torch differentiates
                y = reference("softmax", y, -1).astype(dy.dtype)
            c = compare_backward("softmax_backward", got, y, dy, -1)
        return c.ok, f"max_rel_err={c.max_rel_err:.2g}"


WORKLOADS: dict[str, Workload] = {
    "softmax": Workload("softmax", 2, 1),
    "softmax_backward": Workload("softmax_backward", 3, 2),
    "torch_fwd_bwd": Workload("torch_fwd_bwd", 5, 2),
}


@dataclass
class Row:
    """One provider at one shape and dtype."""

    provider: str
    rows: int
    n: int
    dtype: str
    device: str
    us: float | None = None
    gbps: float | None = None
    ok: bool | None = None
    note: str = ""
    extra: dict = field(default_factory=dict)


# --- providers -----------------------------------------------------------


class Provider:
    """Something that computes a workload along the last axis of a batch."""

    name = "?"
    transfers = 2  # tensor-sized transfers a call makes (copy: always 2)

    def prepare(self, xs: list[tuple[np.ndarray, ...]]) -> None:
        """Move the K input tuples to where the provider computes (untimed)."""

    def run(self, k: int) -> None:
        """Compute the workload for the first k inputs and wait for the results."""

    def output0(self) -> np.ndarray:
        """The result for input 0, as numpy."""
        raise NotImplementedError


# Compiled K-op graphs, kept across shapes: the dims are symbolic, so one
# graph per (provider, dtype, device, K) serves the whole sweep.
_BENCH_MODELS: dict[tuple, object] = {}


class MaxGraphProvider(Provider):
    """Our op (any variant) or MAX's built-in ops.softmax, K ops per graph."""

    def __init__(self, kind: str, dtype: str, ours: bool, variant: str = "auto", op="softmax"):
        self.kind, self.dtype, self.ours, self.variant, self.op = kind, dtype, ours, variant, op
        self.name = (
            ("ours" if variant == "auto" else f"ours:{variant}") if ours else "max.ops.softmax"
        )
        self.transfers = WORKLOADS[op].transfers
        self.session = session(kind)

    def _model(self, k: int):
        key = (self.name, self.op, self.dtype, self.kind, k)
        if key not in _BENCH_MODELS:
            from max.graph import DeviceRef, Graph, TensorType, ops

            from . import ops as our_ops
            from ._paths import KERNELS

            ref = DeviceRef.GPU() if self.kind == "gpu" else DeviceRef.CPU()
            t = TensorType(max_dtype(DTYPE_NAMES[self.dtype]), ["rows", "n"], device=ref)
            arity = WORKLOADS[self.op].arity
            with Graph(
                f"bench_{self.name}_{self.op}_{k}",
                input_types=[t] * (k * arity),
                custom_extensions=[KERNELS],
            ) as g:
                args = [v.tensor for v in g.inputs]
                outs = []
                for i in range(k):
                    if self.op == "softmax_backward":
                        outs.append(our_ops.softmax_backward(args[2 * i], args[2 * i + 1], -1))
                    elif self.ours:
                        outs.append(our_ops.softmax(args[i], -1, variant=self.variant))
                    else:
                        outs.append(ops.softmax(args[i], axis=-1))
                g.output(*outs)
            _BENCH_MODELS[key] = self.session.load(g)
        return _BENCH_MODELS[key]

    def prepare(self, xs):
        dev = max_device(self.kind)
        self.bufs = [to_buffer(np.ascontiguousarray(a)).to(dev) for case in xs for a in case]

    def run(self, k):
        out = self._model(k).execute(*self.bufs[: k * WORKLOADS[self.op].arity])
        self.last = out
        if self.kind == "gpu":
            max_device("gpu").synchronize()

    def output0(self):
        from .dtypes import to_numpy

        return to_numpy(self.last[0])


class TorchProvider(Provider):
    """torch: the device-copy roof (copy=True), torch.softmax, its backward,
    or a forward + backward step through autograd."""

    def __init__(self, kind: str, copy: bool = False, op: str = "softmax"):
        import torch

        self.torch, self.kind, self.copy, self.op = torch, kind, copy, op
        self.name = "copy" if copy else "torch"
        self.transfers = 2 if copy else WORKLOADS[op].transfers
        self.dev = torch.device("cuda" if kind == "gpu" else "cpu")

    def softmax(self, x):
        """The forward this provider differentiates (torch's own here)."""
        return self.torch.softmax(x, dim=-1)

    def prepare(self, xs):
        t = self.torch
        self.xs = [tuple(_to_torch(t, a, self.dev) for a in case) for case in xs]
        self.ys = [t.empty_like(case[0]) for case in self.xs]

    def run(self, k):
        t = self.torch
        for i, case in enumerate(self.xs[:k]):
            if self.copy:
                self.ys[i].copy_(case[0])
            elif self.op == "softmax":
                self.ys[i] = self.softmax(case[0])
            elif self.op == "softmax_backward":
                y, dy = case
                self.ys[i] = t._softmax_backward_data(dy, y, -1, y.dtype)
            else:  # a training step's softmax: forward, then backward to x
                x = case[0].detach().requires_grad_()
                self.softmax(x).backward(case[1])
                self.ys[i] = x.grad
        if self.kind == "gpu":
            t.cuda.synchronize()

    def output0(self):
        return _from_torch(self.ys[0])


class BridgeProvider(TorchProvider):
    """Our op called from torch through `max_softmax.torch` (bridge
    overhead included): its forward, or forward + backward via autograd."""

    def __init__(self, kind: str, op: str = "softmax"):
        super().__init__(kind, op=op)
        from . import torch as bridge

        self.bridge = bridge
        self.name = "ours:torch"

    def softmax(self, x):
        return self.bridge.softmax(x, dim=-1)


class TritonProvider(TorchProvider):
    """The Triton tutorial's fused softmax (a program per row, row in SRAM)."""

    def __init__(self, kind: str):
        super().__init__(kind)
        from ._triton_softmax import triton_softmax

        self.fn = triton_softmax
        self.name = "triton"

    def run(self, k):
        for (x,), y in zip(self.xs[:k], self.ys[:k]):
            self.fn(x, y)
        self.torch.cuda.synchronize()


class JaxProvider(Provider):
    """jax.nn.softmax, jitted."""

    def __init__(self, kind: str):
        import jax

        self.jax = jax
        self.name = "jax"
        self.dev = jax.devices("gpu" if kind == "gpu" else "cpu")[0]
        self.fn = jax.jit(lambda x: jax.nn.softmax(x, axis=-1))

    def prepare(self, xs):
        self.xs = [self.jax.device_put(case[0], self.dev) for case in xs]

    def run(self, k):
        self.ys = [self.fn(x) for x in self.xs[:k]]
        for y in self.ys:
            y.block_until_ready()

    def output0(self):
        return np.asarray(self.ys[0])


class NumpyProvider(Provider):
    """CPU peers: scipy.special.softmax, a plain numpy softmax, and np.copyto."""

    def __init__(self, which: str):
        self.name = which

    def prepare(self, xs):
        self.xs = [case[0] for case in xs]
        self.ys = [np.empty_like(x) for x in self.xs]

    def run(self, k):
        import scipy.special

        for x, y in zip(self.xs[:k], self.ys[:k]):
            if self.name == "copy":
                np.copyto(y, x)
            elif self.name == "scipy":
                y[...] = scipy.special.softmax(x, axis=-1)
            else:
                e = np.exp(x - x.max(axis=-1, keepdims=True))
                np.divide(e, e.sum(axis=-1, keepdims=True), out=y)

    def output0(self):
        return self.ys[0]


def _to_torch(torch, x: np.ndarray, dev):
    if x.dtype == DTYPE_NAMES["bfloat16"]:
        return torch.from_numpy(x.view(np.uint16)).view(torch.bfloat16).to(dev)
    return torch.from_numpy(x).to(dev)


def _from_torch(y) -> np.ndarray:
    import torch

    y = y.detach().cpu()
    if y.dtype == torch.bfloat16:
        return y.view(torch.uint16).numpy().view(DTYPE_NAMES["bfloat16"])
    return y.numpy()


def make_providers(
    kind: str, dtype: str, variants: Sequence[str], op: str = "softmax", bridge: bool = False
) -> list[Callable[[], Provider]]:
    """Factories for every provider of `op` available on this machine."""
    out: list[Callable[[], Provider]] = []
    have = _installed()
    if kind == "gpu" and "torch" in have:
        out.append(lambda: TorchProvider(kind, copy=True))
    if kind == "cpu":
        out.append(lambda: NumpyProvider("copy"))
    if op == "torch_fwd_bwd":
        if "torch" in have:
            out += [lambda: BridgeProvider(kind, op), lambda: TorchProvider(kind, op=op)]
        return out
    out.append(lambda: MaxGraphProvider(kind, dtype, ours=True, op=op))
    if op == "softmax_backward":
        if "torch" in have:
            out.append(lambda: TorchProvider(kind, op=op))
        return out
    for v in variants:
        out.append(lambda v=v: MaxGraphProvider(kind, dtype, ours=True, variant=v))
    if bridge and "torch" in have:
        out.append(lambda: BridgeProvider(kind))
    out.append(lambda: MaxGraphProvider(kind, dtype, ours=False))
    if "torch" in have:
        out.append(lambda: TorchProvider(kind))
    if kind == "gpu" and "triton" in have and "torch" in have:
        out.append(lambda: TritonProvider(kind))
    if "jax" in have and dtype != "float16":
        out.append(lambda: JaxProvider(kind))
    if kind == "cpu" and dtype in ("float32", "float64"):
        out.append(lambda: NumpyProvider("scipy"))
        out.append(lambda: NumpyProvider("numpy"))
    return out


def _installed() -> set[str]:
    import importlib.util

    return {m for m in ("torch", "triton", "jax") if importlib.util.find_spec(m)}


# --- measurement ---------------------------------------------------------


def _elapsed(fn: Callable[[], None]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def check_provider(provider: Provider, xs: list[tuple[np.ndarray, ...]], workload: Workload) -> str:
    """Prepare `provider`, check its first output against the reference and
    warm up its K-call path; "" if it may be timed, else why not."""
    provider.prepare(xs)
    provider.run(1)
    got = provider.output0()[:CHECK_ROWS]
    if provider.name == "copy":
        ok, why = np.array_equal(got, xs[0][0][:CHECK_ROWS]), "copy differs"
    else:
        ok, why = workload.check(got, xs[0])
    if not ok:
        return f"wrong: {why}"
    provider.run(len(xs))  # warm-up (and compile) the K-call path
    return ""


def measure_interleaved(
    providers: list[Provider], k: int, reps: int
) -> list[tuple[float, bool, str]]:
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
        one, many = statistics.median(a), statistics.median(b)
        if many <= one:
            out.append((float("nan"), False, "unreliable: T(K) <= T(1); raise --reps"))
        else:
            out.append(((many - one) / (k - 1), True, ""))
    return out


def measure_device(provider: Provider, k: int, reps: int) -> float | None:
    """Median GPU-busy seconds per call over `reps` runs of K calls (after
    `measure`, so compiled and warm); None if CUPTI saw no GPU work."""
    from .device_timer import gpu_busy

    per_call = []
    for _ in range(reps):
        secs, items = gpu_busy(lambda: provider.run(k))
        if items == 0:
            return None
        per_call.append(secs / k)
    return statistics.median(per_call)


def run_sweep(
    args: argparse.Namespace, save: Callable[[list[Row]], None] | None = None
) -> list[Row]:
    """Measure every provider at every shape and dtype; return the rows.

    `save` is called with the rows so far after each shape, so a sweep cut
    short by a time limit still leaves its data."""
    kind = resolve_device(args.device)
    workload = WORKLOADS[args.op]
    shapes = args.shapes or (ISSUE_SHAPES_GPU + SWEEP_GPU if kind == "gpu" else SHAPES_CPU)
    rng = np.random.default_rng(args.seed)
    results: list[Row] = []
    jobs = [(d, s) for d in args.dtype for s in shapes]
    bar = _progress(len(jobs))
    for dtype, (rows, n) in jobs:
        nbytes = rows * n * DTYPE_NAMES[dtype].itemsize
        # Two K values only (each K is a graph to compile): 16 small cases
        # or 3 large ones, always well over 4x the L2 in total.
        per_case = workload.arity * nbytes
        k = args.max_k if 3 * per_case < 4 * L2_BYTES else 3
        xs = [workload.make_inputs(rng, rows, n, dtype) for _ in range(k)]
        # On the CPU, check every provider, then time those that passed
        # together, round by round. On the GPU, time each right after its
        # check and free it: all of them at once would not fit at 8192 x
        # 50257 with variants, and the device timer is per provider anyway.
        interleave = kind == "cpu"
        rows_here: list[Row] = []
        live: list[tuple[int, Provider]] = []

        for factory in make_providers(kind, dtype, args.variants, args.op, args.bridge):
            p = None
            i = len(rows_here)
            rows_here.append(Row("?", rows, n, dtype, kind))
            try:
                p = factory()
                why = check_provider(p, xs, workload)
                rows_here[i] = Row(p.name, rows, n, dtype, kind, None, None, False, why)
                if not why and interleave:
                    live.append((i, p))
                elif not why:
                    timed = measure_interleaved([p], k, args.reps)[0]
                    rows_here[i] = _timed_row(p, timed, rows_here[i], k, nbytes, args)
            except Exception as err:  # a peer that cannot run this case
                note = f"error: {str(err)[:120]}"
                name = getattr(p, "name", "?")
                rows_here[i] = Row(name, rows, n, dtype, kind, None, None, None, note)
            finally:
                if not interleave:
                    p = None
                    _release_torch_cache()
        if live:
            try:
                timed = measure_interleaved([p for _, p in live], k, args.reps)
                for (i, p), t in zip(live, timed, strict=True):
                    rows_here[i] = _timed_row(p, t, rows_here[i], k, nbytes, args)
            except Exception as err:  # as when each was timed alone: a row, no crash
                note = f"error: {str(err)[:120]}"
                for i, p in live:
                    rows_here[i] = Row(p.name, rows, n, dtype, kind, None, None, None, note)
        live = []
        p = None
        _release_torch_cache()
        results.extend(rows_here)
        _flag_impossible([r for r in results if (r.dtype, r.rows, r.n) == (dtype, rows, n)])
        bar(f"{dtype} {rows}x{n}")
        if save:
            save(results)
    return results


def _timed_row(
    p: Provider,
    timed: tuple[float, bool, str],
    row: Row,
    k: int,
    nbytes: int,
    args: argparse.Namespace,
) -> Row:
    """`row` with the provider's speed from its wall-clock `timed` result
    (and, with `--timer device`, its GPU busy time)."""
    secs, ok, note = timed
    gbps = p.transfers * nbytes / secs / 1e9 if ok else None
    us = secs * 1e6 if ok else None
    extra = {"k": k, "timer": "wall"}
    if ok and args.timer == "device":
        dev = measure_device(p, k, min(args.reps, DEVICE_REPS))
        if dev is None:
            note = "device timer saw no GPU work: wall clock"
        else:
            extra.update(timer="device", wall_us=us, wall_gbps=gbps)
            us, gbps = dev * 1e6, p.transfers * nbytes / dev / 1e9
    return Row(p.name, row.rows, row.n, row.dtype, row.device, us, gbps, ok, note, extra)


IMPOSSIBLE_VS_COPY = 3.0
# Profiled runs per provider and shape (each exports a trace to parse).
DEVICE_REPS = 5


def _flag_impossible(rows: list[Row]) -> None:
    """Un-time results over 3x the copy roof of their shape: no provider
    moves its bytes that much faster than a copy (a backward, reading more
    than it writes, reaches ~1.1x), so such a number is a timing artefact
    (e.g. T(1) inflated by allocation), not a speed."""
    roof = next((r.gbps for r in rows if r.provider == "copy" and r.gbps), None)
    for r in rows:
        if roof and r.gbps and r.gbps > IMPOSSIBLE_VS_COPY * roof:
            r.note = f"unreliable: {r.gbps:.0f} GB/s is over 3x the copy roof"
            r.gbps = r.us = None
            r.ok = None


def _release_torch_cache() -> None:
    """Give torch's cached GPU memory back so the next provider can use it."""
    import sys as _sys

    torch = _sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        torch.cuda.empty_cache()


def _progress(total: int) -> Callable[[str], None]:
    try:
        from tqdm import tqdm

        t = tqdm(total=total, file=sys.stderr, desc="bench")

        def step(label: str) -> None:
            t.set_postfix_str(label)
            t.update()

        return step
    except ImportError:
        done = [0]

        def step(label: str) -> None:
            done[0] += 1
            print(f"[{done[0]}/{total}] {label}", file=sys.stderr, flush=True)

        return step


# --- reporting -----------------------------------------------------------


def table(results: list[Row]) -> str:
    """Markdown table: GB/s per provider, % of the copy roof, ours / best peer."""
    providers = []
    for r in results:
        if r.provider not in providers:
            providers.append(r.provider)
    peers = [p for p in providers if not p.startswith("ours") and p != "copy"]
    head = (
        "| dtype | rows x N | " + " | ".join(providers) + " | ours % of copy | ours / best peer |"
    )
    lines = [head, "|" + "---|" * (len(providers) + 4)]
    keys = []
    for r in results:
        if (r.dtype, r.rows, r.n) not in keys:
            keys.append((r.dtype, r.rows, r.n))
    for key in keys:
        by = {r.provider: r for r in results if (r.dtype, r.rows, r.n) == key}

        def cell(p: str, by: dict[str, Row] = by) -> str:
            r = by.get(p)
            if r is None:
                return "—"
            if r.gbps:
                return f"{r.gbps:.0f}"
            return "?" if r.note.startswith("unreliable") else ("✗" if r.ok is False else "err")

        ours = by.get("ours") or next(
            (by[p] for p in providers if p.startswith("ours") and p in by), None
        )
        roof = by.get("copy")
        best_peer = max((by[p].gbps for p in peers if p in by and by[p].gbps), default=None)
        pct = (
            f"{100 * ours.gbps / roof.gbps:.0f}%"
            if ours and ours.gbps and roof and roof.gbps
            else "—"
        )
        ratio = f"{ours.gbps / best_peer:.2f}x" if ours and ours.gbps and best_peer else "—"
        lines.append(
            f"| {key[0]} | {key[1]} x {key[2]} | "
            + " | ".join(cell(p) for p in providers)
            + f" | {pct} | {ratio} |"
        )
    return "\n".join(lines)


def plot(results: list[Row], path: Path) -> bool:
    """GB/s per provider at each shape, shapes sorted by row length N (one
    panel per dtype); False without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    dtypes = sorted({r.dtype for r in results})
    fig, axes = plt.subplots(1, len(dtypes), figsize=(8 * len(dtypes), 5.5), squeeze=False)
    for ax, dtype in zip(axes[0], dtypes):
        mine = [r for r in results if r.dtype == dtype]
        shapes = sorted({(r.n, r.rows) for r in mine})
        where = {s: i for i, s in enumerate(shapes)}
        provs = list(dict.fromkeys(r.provider for r in mine))
        for p in provs:
            pts = sorted((where[(r.n, r.rows)], r.gbps) for r in mine if r.provider == p and r.gbps)
            if pts:
                style = "-o" if p.startswith("ours") else ("k--" if p == "copy" else "-x")
                ax.plot([q[0] for q in pts], [q[1] for q in pts], style, label=p, alpha=0.85)
        ax.set_xticks(range(len(shapes)))
        ax.set_xticklabels([f"{rows}x{n}" for n, rows in shapes], rotation=45, ha="right")
        ax.set_xlabel("rows x N (sorted by row length N)")
        ax.set_ylabel("GB/s (bytes that must move / time)")
        ax.set_title(f"softmax {dtype}, {results[0].device}")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return True


def build_parser() -> argparse.ArgumentParser:
    """Arguments of `softmax bench`."""
    p = argparse.ArgumentParser(prog="softmax bench", description=__doc__.split("\n")[0])
    p.add_argument("--device", choices=["auto", "cpu", "gpu"], default="auto")
    p.add_argument("--dtype", nargs="+", default=["float32", "bfloat16"], choices=list(DTYPE_NAMES))
    p.add_argument(
        "--shape",
        dest="shapes",
        action="append",
        type=lambda s: tuple(int(v) for v in s.split("x")),
        help="ROWSxN (repeatable; default: the issue's shapes and a sweep)",
    )
    p.add_argument(
        "--variants",
        nargs="*",
        default=[],
        help="also time these forced kernel families, e.g. tree online split",
    )
    p.add_argument(
        "--op",
        choices=list(WORKLOADS),
        default="softmax",
        help="what a call computes (softmax_backward: 3 tensors; torch_fwd_bwd: 5)",
    )
    p.add_argument(
        "--bridge", action="store_true", help="also time our op called from torch (ours:torch)"
    )
    p.add_argument(
        "--latency",
        action="store_true",
        help="time one call on a tiny input instead (see latency.py)",
    )
    p.add_argument(
        "--timer",
        choices=["auto", "wall", "device"],
        default="auto",
        help="wall: marginal wall-clock time; device: GPU busy time from CUPTI "
        "(auto: device on a GPU with torch installed)",
    )
    p.add_argument("--reps", type=int, default=15)
    p.add_argument("--max-k", type=int, default=16, help="most rotating inputs per shape")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    p.add_argument("--tag", default="", help="suffix for the output file names")
    p.add_argument("--from-json", type=Path, help="redo the table and plot from a saved JSON")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run the sweep, write JSON, print the table, save the plot."""
    args = build_parser().parse_args(argv)
    if args.from_json:
        data = json.loads(args.from_json.read_text())
        results = [Row(**r) for r in data["results"]]
        print(data["meta"])
        print(table(results))
        png = args.from_json.with_suffix(".png")
        if plot(results, png):
            print(f"plot: {png}")
        return 0
    kind = resolve_device(args.device)
    args.timer = resolve_timer(args.timer, kind)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.latency:
        from .latency import latency_table, measure_latency

        rows = measure_latency(kind)
        (args.out / f"latency_{kind}.json").write_text(
            json.dumps({"device": _device_name(kind), "rows": rows}, indent=1)
        )
        print(_device_name(kind))
        print(latency_table(rows))
        return 0
    op = "" if args.op == "softmax" else f"_{args.op}"
    stem = f"bench_{kind}{op}{'_' + args.tag if args.tag else ''}"
    meta = {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "device": _device_name(kind),
        "host": platform.node(),
        "command": "softmax bench " + " ".join(sys.argv[2:] if argv is None else argv),
        "op": args.op,
        "method": (
            (
                "GPU busy time per call (CUPTI kernel/memcpy spans) over K rotating inputs"
                if args.timer == "device"
                else "marginal wall-clock time per call over K rotating inputs,"
                " providers interleaved round by round"
            )
            + f", medians; GB/s = {WORKLOADS[args.op].transfers} x tensor bytes / time"
            " (copy: 2 x)"
        ),
    }

    def save(rows: list[Row]) -> None:
        payload = {"meta": meta, "results": [asdict(r) for r in rows]}
        (args.out / f"{stem}.json").write_text(json.dumps(payload, indent=1))

    results = run_sweep(args, save)
    save(results)
    text = table(results)
    (args.out / f"{stem}.md").write_text(f"{meta}\n\n{text}\n")
    print(meta)
    print(text)
    if plot(results, args.out / f"{stem}.png"):
        print(f"plot: {args.out / (stem + '.png')}")
    return 0


def resolve_timer(timer: str, kind: str) -> str:
    """ "device" or "wall": what `--timer auto` means on `kind`, and a clear
    error where the device timer cannot run."""
    from .device_timer import available

    if timer == "auto":
        return "device" if kind == "gpu" and available() else "wall"
    if timer == "device" and not (kind == "gpu" and available()):
        raise SystemExit("softmax bench: --timer device needs a GPU and torch with CUDA")
    return timer


def _device_name(kind: str) -> str:
    if kind == "gpu":
        try:
            import torch

            return torch.cuda.get_device_name(0)
        except Exception:
            return "gpu"
    return f"{platform.processor() or platform.machine()} CPU"
