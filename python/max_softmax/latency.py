"""`softmax bench --latency`: the fixed cost of one call on a tiny input.

For small inputs a softmax costs what launching it costs. This times one
`model.execute` on a 1 x 128 float32 row, inputs already on the device, for
our op, MAX's built-in `ops.softmax` and, as the floor of any MAX graph, a
single elementwise op (`ops.negate`); and `torch.softmax` where installed.
Two numbers each, medians over many calls:

- `sync_us`: call, then wait for the device: what a caller waiting on the
  result sees;
- `async_us`: calls issued back to back, one wait at the end, divided by the
  count: the host-side cost per call when calls are pipelined.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import numpy as np

from .devices import device as max_device
from .dtypes import to_buffer
from .models import ModelKey, get_model, session

CALLS = 2000
ROUNDS = 7


def _timings(call: Callable[[], object], sync: Callable[[], None]) -> dict[str, float]:
    for _ in range(50):  # warm-up
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


def _builtin_model(kind: str, op: str):
    from max.dtype import DType
    from max.graph import DeviceRef, Graph, TensorType, ops

    ref = DeviceRef.GPU() if kind == "gpu" else DeviceRef.CPU()
    t = TensorType(DType.float32, ["rows", "n"], device=ref)
    with Graph(f"latency_{op}", input_types=[t]) as g:
        x = g.inputs[0].tensor
        g.output(ops.softmax(x, axis=-1) if op == "softmax" else ops.negate(x))
    return session(kind).load(g)


def measure_latency(kind: str) -> list[dict]:
    """Per-call times of each provider on `kind` ("cpu" or "gpu")."""
    from max.dtype import DType

    dev = max_device(kind)
    x = np.random.default_rng(0).standard_normal((1, 128)).astype(np.float32)
    buf2 = to_buffer(x).to(dev)
    buf3 = to_buffer(x.reshape(1, 128, 1)).to(dev)
    sync = dev.synchronize if kind == "gpu" else (lambda: None)
    models = [
        ("ours", get_model(ModelKey("softmax", DType.float32, kind)), buf3),
        ("max.ops.softmax", _builtin_model(kind, "softmax"), buf2),
        ("max.ops.negate (floor)", _builtin_model(kind, "negate"), buf2),
    ]
    out = [
        {"provider": name, **_timings(lambda m=m, b=b: m.execute(b), sync)} for name, m, b in models
    ]
    try:
        import torch

        tdev = torch.device("cuda" if kind == "gpu" else "cpu")
        tx = torch.from_numpy(x).to(tdev)
        tsync = torch.cuda.synchronize if kind == "gpu" else (lambda: None)
        out.append({"provider": "torch", **_timings(lambda: torch.softmax(tx, dim=-1), tsync)})
    except ImportError:
        pass
    return out


def latency_table(rows: list[dict]) -> str:
    """Markdown table of `measure_latency` rows."""
    lines = ["| provider | sync µs/call | async µs/call |", "|---|---|---|"]
    lines += [f"| {r['provider']} | {r['sync_us']:.1f} | {r['async_us']:.1f} |" for r in rows]
    return "\n".join(lines)
