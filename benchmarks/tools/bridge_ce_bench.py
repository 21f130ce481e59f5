"""Cross-entropy fwd + bwd through autograd on CUDA: the torch bridge on both
of its launch paths against our replayed graph and the peers, in JSON.

    python benchmarks/tools/bridge_ce_bench.py --out bridge_ce.json
    python benchmarks/tools/bridge_ce_bench.py --shapes 8192x50257 --dtypes bfloat16 \\
        --providers ours_launch,ours_graph

Providers (each guarded: one that cannot be imported, built or run is
recorded as such, the rest go on):

- ours_launch: `max_softmax.torch.cross_entropy`, the launch extension
  (built first, in the foreground);
- ours_graph: the same with the extension switched off: the graph path
  (`MAX_SOFTMAX_LAUNCH=graph`: destination-passing models on buffer views);
- ours_inplace: ours_launch with `inplace_backward=True` (the gradient over
  the logits);
- replay: MAX capture/replay of K `ops.cross_entropy_with_grad` calls on K
  input sets (the kernel with no torch, no autograd, no per-call host work);
- eager: `F.cross_entropy`; compile: the same under `torch.compile`;
- liger: liger_kernel's LigerCrossEntropyLoss; quack: quack's cross_entropy.

Each torch call gets fresh logits (`torch.randn`, outside the timed span)
requiring grad and fresh targets; the timed span (CUDA events) is the loss
and `loss.backward()`. The figure is the median of `--reps` calls after
`--warmup`, and GB/s-eq = 2 x logits bytes / time (the read of the logits
and the write of their gradient).
"""

from __future__ import annotations

import argparse
import importlib
import json
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

SHAPES = [(8192, 50257), (4096, 128256), (16384, 32000)]
DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}
PROVIDERS = [
    "ours_launch",
    "ours_graph",
    "ours_inplace",
    "replay",
    "eager",
    "compile",
    "liger",
    "quack",
]

Loss = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


class Unsupported(Exception):
    """A provider that cannot run here (not installed, not built)."""


def _ours(path: str, inplace: bool = False) -> Loss:
    """The bridge's cross-entropy with the launch extension on ("launch",
    built now) or off ("graph")."""
    import max_softmax.torch as mst
    from max_softmax import launch
    from max_softmax.torch import _launch as torch_launch

    if path == "launch":
        launch.CUDA_ENABLED = True
        try:
            launch.extension()
        except Exception as err:
            raise Unsupported(f"launch extension: {err}") from None
        torch_launch.available = launch.available
    else:
        torch_launch.available = lambda cuda=False: False
    if inplace:
        return lambda x, t: mst.cross_entropy(x, t, inplace_backward=True)
    return mst.cross_entropy


def make_loss(provider: str) -> Loss:
    """The loss function `provider` times (raises Unsupported)."""
    if provider in ("ours_launch", "ours_graph", "ours_inplace"):
        return _ours("graph" if provider == "ours_graph" else "launch", provider == "ours_inplace")
    if provider == "eager":
        return F.cross_entropy
    if provider == "compile":
        return torch.compile(F.cross_entropy)
    if provider == "liger":
        try:
            from liger_kernel.transformers import LigerCrossEntropyLoss
        except Exception as err:
            raise Unsupported(f"liger_kernel: {err}") from None
        return LigerCrossEntropyLoss()
    if provider == "quack":
        try:  # quack/__init__ exports names that shadow its submodules
            q = importlib.import_module("quack.cross_entropy")
        except Exception as err:
            raise Unsupported(f"quack.cross_entropy: {err}") from None
        return lambda x, t: q.cross_entropy(x, t, reduction="mean")
    raise ValueError(f"unknown provider {provider!r}; choose from {PROVIDERS}")


def time_torch(loss_fn: Loss, rows: int, n: int, dtype: torch.dtype, warmup: int, reps: int):
    """Median ms of loss + backward, fresh logits and targets each call."""
    times = []
    for i in range(warmup + reps):
        x = torch.randn(rows, n, device="cuda", dtype=dtype).requires_grad_()
        t = torch.randint(0, n, (rows,), device="cuda")
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        loss_fn(x, t).backward()
        end.record()
        end.synchronize()
        if i >= warmup:
            times.append(start.elapsed_time(end))
        del x, t
    return statistics.median(times)


def time_replay(rows: int, n: int, dtype: str, reps: int) -> float:
    """Median ms a call of K captured `ops.cross_entropy_with_grad` calls on
    K input sets, replayed (ab_replay's graph)."""
    import numpy as np
    from max.driver import Accelerator
    from max.engine import InferenceSession

    sys.path.insert(0, str(Path(__file__).parent))
    import ab_replay

    gpu = Accelerator()
    session = InferenceSession(devices=[gpu])
    size = 4 if dtype == "float32" else 2
    k = int(min(16, max(2, (256 << 20) // (rows * n * size))))
    model = session.load(ab_replay._graph("cross_entropy", dtype, k))
    bufs = ab_replay._inputs("cross_entropy", dtype, rows, n, k, gpu, np.random.default_rng(0))
    key = hash(("bridge_ce", dtype, rows, n)) & 0x7FFFFFFF
    outs = model.capture(key, *bufs)
    gpu.synchronize()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        model.replay(key, *bufs)
        gpu.synchronize()
        times.append(time.perf_counter() - t0)
    del outs
    model.release_captured_graph(key)
    return statistics.median(times) / k * 1e3


def run_case(provider: str, rows: int, n: int, dtype: str, warmup: int, reps: int) -> dict:
    """One (provider, dtype, shape) record."""
    record: dict = {"provider": provider, "dtype": dtype, "rows": rows, "n": n}
    try:
        if provider == "replay":
            ms = time_replay(rows, n, dtype, reps)
        else:
            ms = time_torch(make_loss(provider), rows, n, DTYPES[dtype], warmup, reps)
    except Unsupported as err:
        return {**record, "status": "unsupported", "why": str(err)}
    except torch.OutOfMemoryError as err:
        torch.cuda.empty_cache()
        return {**record, "status": "oom", "why": str(err)[:200]}
    except Exception as err:  # one provider's failure must not end the run
        return {**record, "status": "error", "why": f"{type(err).__name__}: {err}"[:400]}
    moved = 2 * rows * n * torch.tensor([], dtype=DTYPES[dtype]).element_size()
    return {**record, "status": "ok", "ms": ms, "gbps_eq": moved / (ms * 1e-3) / 1e9}


def main(argv: list[str] | None = None) -> int:
    """Parse arguments, time every case, write the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("bridge_ce.json"))
    parser.add_argument("--providers", default=",".join(PROVIDERS))
    parser.add_argument("--dtypes", default="bfloat16,float32")
    parser.add_argument("--shapes", default=",".join(f"{r}x{n}" for r, n in SHAPES))
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--reps", type=int, default=20)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("bridge_ce_bench: needs a CUDA device", file=sys.stderr)
        return 2
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    providers = args.providers.split(",")
    # The launch paths switch a module attribute: the graph path last, so
    # the extension's providers are not timed on it by mistake.
    providers.sort(key=lambda p: p == "ours_graph")
    records = []
    for provider in providers:
        for dtype in args.dtypes.split(","):
            for rows, n in shapes:
                rec = run_case(provider, rows, n, dtype, args.warmup, args.reps)
                print(json.dumps(rec), flush=True)
                records.append(rec)
                torch.cuda.empty_cache()
    meta = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "warmup": args.warmup,
        "reps": args.reps,
    }
    args.out.write_text(json.dumps({"meta": meta, "records": records}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
