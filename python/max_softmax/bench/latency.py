"""`softmax bench --latency`: the fixed cost of one call on a tiny input.

For small inputs a softmax costs what launching it costs. This times one
call on a 1 x 128 float32 row, inputs already on the device:

- `ours`: `model.execute` of our row-op model (what `max_softmax.softmax`
  runs on a GPU, inputs already there);
- `ours:numpy`: `max_softmax.softmax` on the numpy array, end to end (on the
  CPU through the launch extension, no graph; on a GPU with the copies);
- `max.ops.softmax`: a one-op graph of MAX's built-in;
- `max.ops.negate (floor)`: a single elementwise op, the floor of any MAX graph;
- with torch installed, `torch` (`torch.softmax`), `ours:torch` (our op
  through the torch bridge, `max_softmax.torch.softmax`), and `ours, execute
  on Buffer.from_dlpack(torch)`: a bare `model.execute` of our row-op model on
  a buffer made from the torch tensor each call, what a lean bridge could cost.

Two numbers each, medians over many calls:

- `sync_us`: call, then wait for the device: what a caller waiting on the
  result sees;
- `async_us`: calls issued back to back, one wait at the end, divided by the
  count: the host-side cost per call when calls are pipelined.

A case that fails becomes a row with its error in `note`.
"""

from __future__ import annotations

import importlib.util
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from ..devices import device as max_device
from ..dtypes import to_buffer
from ..models import ModelKey, build_graph, compiled, device_ref, row_op_model
from .progress import say

CALLS = 2000
ROUNDS = 7
WARMUP = 50


def timings(call: Callable[[], object], sync: Callable[[], None]) -> dict[str, float]:
    """Median µs per call of `call`, waiting after each (sync_us) and once
    after many (async_us)."""
    for _ in range(WARMUP):
        call()
    sync()
    per_sync = []
    for _ in range(ROUNDS):
        t0 = time.perf_counter()
        for _ in range(CALLS // 10):
            call()
            sync()
        per_sync.append((time.perf_counter() - t0) / (CALLS // 10))
    per_async = []
    for _ in range(ROUNDS):
        t0 = time.perf_counter()
        for _ in range(CALLS):
            call()
        sync()
        per_async.append((time.perf_counter() - t0) / CALLS)
    return {
        "sync_us": statistics.median(per_sync) * 1e6,
        "async_us": statistics.median(per_async) * 1e6,
    }


def _builtin_model(kind: str, op: str) -> Any:
    """A one-op graph of MAX's built-in softmax or negate on (rows, n) float32."""
    from max.dtype import DType
    from max.graph import TensorType, ops

    t = TensorType(DType.float32, ["rows", "n"], device=device_ref(kind))

    def body(x: Any) -> list[Any]:
        return [ops.softmax(x, axis=-1) if op == "softmax" else ops.negate(x)]

    return compiled(
        ("bench-latency", op, kind),
        kind,
        lambda: build_graph(f"latency_{op}", [t], body),
        f"max.ops.{op} (latency graph)",
    )


def _max_cases(kind: str, x: np.ndarray) -> list[tuple[str, Callable[[], tuple]]]:
    """(name, make) of the MAX cases; make() -> (call, sync), may raise."""
    from max.dtype import DType

    dev = max_device(kind)
    sync = dev.synchronize if kind == "gpu" else (lambda: None)

    def ours() -> tuple:
        model = row_op_model(ModelKey("softmax", DType.float32, kind))
        buf = to_buffer(x.reshape(1, 128, 1)).to(dev)
        return (lambda: model.execute(buf)), sync

    def builtin(op: str) -> Callable[[], tuple]:
        def make() -> tuple:
            model, buf = _builtin_model(kind, op), to_buffer(x).to(dev)
            return (lambda: model.execute(buf)), sync

        return make

    def array_api() -> tuple:
        from .. import arrays

        return (lambda: arrays.softmax(x, device=kind)), sync

    return [
        ("ours", ours),
        ("ours:numpy (max_softmax.softmax)", array_api),
        ("max.ops.softmax", builtin("softmax")),
        ("max.ops.negate (floor)", builtin("negate")),
    ]


def _torch_cases(kind: str, x: np.ndarray) -> list[tuple[str, Callable[[], tuple]]]:
    """(name, make) of the cases that need torch; [] without it."""
    if importlib.util.find_spec("torch") is None:
        return []
    from max.dtype import DType

    def tensor() -> tuple[Any, Callable[[], None]]:
        import torch

        tx = torch.from_numpy(x).to("cuda" if kind == "gpu" else "cpu")
        if kind != "gpu":
            return tx, lambda: None
        dev = max_device("gpu")
        return tx, lambda: (torch.cuda.synchronize(), dev.synchronize())

    def plain() -> tuple:
        import torch

        tx, sync = tensor()
        return (lambda: torch.softmax(tx, dim=-1)), sync

    def bridge() -> tuple:
        from .. import torch as ours_torch

        tx, sync = tensor()
        return (lambda: ours_torch.softmax(tx, dim=-1)), sync

    def dlpack() -> tuple:
        from max.driver import Buffer

        model = row_op_model(ModelKey("softmax", DType.float32, kind))
        tx, sync = tensor()
        t3 = tx.view(1, 128, 1)
        return (lambda: model.execute(Buffer.from_dlpack(t3))), sync

    return [
        ("torch", plain),
        ("ours:torch (bridge)", bridge),
        ("ours, execute on Buffer.from_dlpack(torch)", dlpack),
    ]


def measure_latency(kind: str) -> list[dict[str, Any]]:
    """Per-call times of each case on `kind` ("cpu" or "gpu"); a case that
    cannot run is a row with None times and its error in "note"."""
    x = np.random.default_rng(0).standard_normal((1, 128)).astype(np.float32)
    out = []
    for name, make in _max_cases(kind, x) + _torch_cases(kind, x):
        say(f"latency: timing {name}...")
        row: dict[str, Any] = {"provider": name, "rows": 1, "n": 128, "dtype": "float32"}
        row["device"] = kind
        try:
            call, sync = make()
            row.update(timings(call, sync), note="")
        except Exception as err:  # one case lost, not the table
            note = f"error: {type(err).__name__}: {str(err)[:160]}"
            row.update(sync_us=None, async_us=None, note=note)
        out.append(row)
    return out


def latency_table(rows: list[dict[str, Any]]) -> str:
    """Markdown table of `measure_latency` rows (errors as footnotes)."""
    lines = ["| provider | sync µs/call | async µs/call |", "|---|---|---|"]
    notes: list[str] = []
    for r in rows:
        if r.get("sync_us") is None:
            notes.append(" ".join((r.get("note") or "not measured").split()))
            mark = f"err[^{len(notes)}]"
            lines.append(f"| {r['provider']} | {mark} | {mark} |")
        else:
            lines.append(f"| {r['provider']} | {r['sync_us']:.1f} | {r['async_us']:.1f} |")
    return "\n".join(lines + ([""] + [f"[^{i}]: {t}" for i, t in enumerate(notes, 1)]))
