"""The numpy front door against MAX's built-in and SciPy on the CPU (issue 38).

Interleaved in one process, each round times every provider once on its own
fresh input, and the best of the rounds is reported:

- ours: `max_softmax.softmax(x)` (a fresh output) and with `out=`;
- MAX: a 1-op `ops.softmax` graph, `execute` on `Buffer.from_numpy(x)`;
- SciPy: `scipy.special.softmax(x, axis=-1)`.

    python benchmarks/tools/numpy_front_door.py [--rounds 12] [--shape 4096x4096 ...]

Prints one line per shape and, with `--json F`, appends a record to F.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np
import scipy.special

import max_softmax
from max_softmax.bench.providers import MaxGraphProvider
from max_softmax.dtypes import to_buffer

SHAPES = ("4096x4096", "512x50257", "4x1048576")


def _seconds(fn, x) -> float:
    """The wall time of one call `fn(x)`."""
    t0 = time.perf_counter()
    fn(x)
    return time.perf_counter() - t0


def measure(shape: str, rounds: int) -> dict:
    """Best-of-`rounds` seconds per provider at `shape`, interleaved."""
    rows, n = (int(s) for s in shape.split("x"))
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal((rows, n), dtype=np.float32) for _ in range(3)]
    out = np.empty_like(xs[0])
    graph = MaxGraphProvider("cpu", "float32", ours=False)
    model = graph.model(1)

    def max_builtin(x):
        return model.execute(to_buffer(x))

    providers = {
        "ours": lambda x: max_softmax.softmax(x),
        "ours_out": lambda x: max_softmax.softmax(x, out=out),
        "max": max_builtin,
        "scipy": lambda x: scipy.special.softmax(x, axis=-1),
    }
    for fn in providers.values():  # warm-up (compiles, pools, page faults)
        fn(xs[0])
    ref = scipy.special.softmax(xs[0].astype(np.float64), axis=-1)
    np.testing.assert_allclose(max_softmax.softmax(xs[0]), ref, rtol=1e-5, atol=1e-7)
    times: dict[str, list[float]] = {k: [] for k in providers}
    for r in range(rounds):
        for name, fn in providers.items():
            times[name].append(_seconds(fn, xs[r % len(xs)]))
    best = {k: min(v) for k, v in times.items()}
    return {
        "shape": shape,
        "best_ms": {k: round(v * 1e3, 3) for k, v in best.items()},
        "vs_max": round(best["max"] / best["ours"], 3),
        "vs_max_out": round(best["max"] / best["ours_out"], 3),
        "vs_scipy": round(best["scipy"] / best["ours"], 3),
        "load": os.getloadavg()[0],
    }


def main() -> None:
    """Measure each shape and print (and optionally append) the ratios."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", action="append")
    p.add_argument("--rounds", type=int, default=12)
    p.add_argument("--json")
    a = p.parse_args()
    for shape in a.shape or SHAPES:
        rec = measure(shape, a.rounds)
        print(json.dumps(rec))
        if a.json:
            with open(a.json, "a") as f:
                f.write(json.dumps(rec) + "\n")


if __name__ == "__main__":
    main()
