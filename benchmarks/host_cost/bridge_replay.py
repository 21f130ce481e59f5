"""Can the torch bridge replay a captured graph when torch hands it the same
memory again, and what would it save?

    python benchmarks/host_cost/bridge_replay.py      # needs a CUDA GPU

Captures the bridge's destination-passing model (`models.into_model`) on
DLPack buffers of two torch tensors, then replays it (1) with the very
Buffer objects of the capture, (2) with fresh DLPack buffers of the same
tensors, (3) with a buffer of another tensor, and checks each result
against the executed one. Then times, per call and median of 200: execute
on fresh DLPack buffers (what the bridge does), replay on fresh buffers,
replay on the captured objects. Prints JSON lines.
"""

from __future__ import annotations

import gc
import json
import statistics
import sys
import time
import weakref


def main() -> int:
    """Run the three replays and the timings; print what happened."""
    import torch
    from max.dtype import DType

    from max_softmax.models import into_model
    from max_softmax.torch import _buffer

    model = into_model("softmax", DType.float32, "gpu")
    for rows, n in [(64, 128), (4096, 4096)]:
        probe(torch, model, _buffer, rows, n)
    return 0


def probe(torch, model, _buffer, rows: int, n: int) -> None:
    """The replays and timings at one shape."""
    x = torch.randn(rows, n, 1, device="cuda")
    out = torch.empty_like(x)
    bo, bx = _buffer(out), _buffer(x)
    model.execute(bo, bx)
    torch.cuda.synchronize()
    want = out.clone()
    key = rows * 100000 + n
    model.capture(key, bo, bx)
    cases = {
        "same objects": lambda: (bo, bx),
        "fresh buffers, same tensors": lambda: (_buffer(out), _buffer(x)),
        "another input tensor": lambda: (_buffer(out), _buffer(x.clone())),
    }
    replayed = {}
    for what, bufs in cases.items():
        out.zero_()
        torch.cuda.synchronize()
        try:
            model.replay(key, *bufs())
            torch.cuda.synchronize()
            ok = bool(torch.equal(out, want))
            row = {"case": what, "replayed": True, "equal_to_execute": ok}
        except Exception as err:
            row = {"case": what, "replayed": False, "error": f"{type(err).__name__}: {err}"}
        replayed[what] = row["replayed"]
        print(json.dumps({"shape": f"{rows}x{n}", **row}), flush=True)

    def per_call(fn) -> float:
        for _ in range(20):
            fn()
        torch.cuda.synchronize()
        times = []
        for _ in range(200):
            t0 = time.perf_counter()
            fn()
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
        return round(statistics.median(times) * 1e6, 1)

    timings = {
        "execute, fresh buffers (the bridge)": per_call(
            lambda: model.execute(_buffer(out), _buffer(x))
        ),
        "replay, captured objects": per_call(lambda: model.replay(key, bo, bx)),
        "torch.softmax": per_call(lambda: torch.softmax(x, dim=1)),
    }
    if replayed["fresh buffers, same tensors"]:
        timings["replay, fresh buffers"] = per_call(
            lambda: model.replay(key, _buffer(out), _buffer(x))
        )
    for what, us in timings.items():
        print(json.dumps({"shape": f"{rows}x{n}", "timing": what, "us_sync": us}), flush=True)
    model.release_captured_graph(key)
    # Does a capture keep the torch tensors of its buffers alive?
    x2 = torch.randn(rows, n, 1, device="cuda")
    o2 = torch.empty_like(x2)
    model.capture(key + 1, _buffer(o2), _buffer(x2))
    alive = weakref.ref(x2)
    del x2, o2
    gc.collect()
    pins = alive() is not None
    print(json.dumps({"shape": f"{rows}x{n}", "capture keeps its input tensor alive": pins}))
    model.release_captured_graph(key + 1)


if __name__ == "__main__":
    sys.exit(main())
