"""numpy softmax on the CPU with its outputs from `host_pool` (ours now) against outputs from
MAX's host pool (a byte `Buffer` handed to numpy by DLPack, the form before), `out=`, and MAX's
`ops.softmax` graph, interleaved in one process (issue 38):

    python benchmarks/tools/numpy_outputs_ab.py --shape 4096x4096 --rounds 25

Prints one JSON line: best and median ms of each.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np
from max.driver import Buffer
from max.dtype import DType

import max_softmax
from max_softmax import arrays, host_pool
from max_softmax.bench.providers import MaxGraphProvider
from max_softmax.devices import device
from max_softmax.dtypes import to_buffer


def maxs_pool_empty(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """An output from MAX's host memory pool, as `arrays.empty` gave before `host_pool`."""
    nbytes = int(np.prod(shape)) * dtype.itemsize
    raw = np.from_dlpack(Buffer(DType.uint8, (nbytes,), device=device("cpu")))
    return raw.view(dtype).reshape(shape)


def main() -> None:
    """Time the four providers, interleaved, and print their best and median ms."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="4096x4096")
    parser.add_argument("--rounds", type=int, default=25)
    args = parser.parse_args()
    shape = tuple(int(s) for s in args.shape.split("x"))
    xs = [np.random.default_rng(i).standard_normal(shape, dtype=np.float32) for i in range(3)]
    model = MaxGraphProvider("cpu", "float32", ours=False).model(1)
    out = np.empty_like(xs[0])
    providers = {
        "maxs_pool": (maxs_pool_empty, lambda x: max_softmax.softmax(x)),
        "host_pool": (host_pool.empty, lambda x: max_softmax.softmax(x)),
        "out": (host_pool.empty, lambda x: max_softmax.softmax(x, out=out)),
        "max": (host_pool.empty, lambda x: model.execute(to_buffer(x))),
    }
    times: dict[str, list[float]] = {k: [] for k in providers}
    for r in range(args.rounds + 1):
        x = xs[r % len(xs)]
        for name, (empty, fn) in providers.items():
            arrays.empty = empty
            t0 = time.perf_counter()
            result = fn(x)
            if r:  # the first round warms up
                times[name].append(time.perf_counter() - t0)
            del result
    print(
        json.dumps(
            {
                "shape": args.shape,
                "best_ms": {k: round(min(v) * 1e3, 3) for k, v in times.items()},
                "median_ms": {k: round(sorted(v)[len(v) // 2] * 1e3, 3) for k, v in times.items()},
                "load": os.getloadavg()[0],
            }
        )
    )


if __name__ == "__main__":
    main()
