"""Many threads at once, and many calls in a loop."""

from __future__ import annotations

import numpy as np
from conftest import assert_matches_scipy, run_in_threads

import max_softmax
from max_softmax.models import compile_count


def test_eight_threads_mixed_shapes_and_dtypes(array_path):
    dtypes = ["float32", "float64", "float16", "bfloat16"]

    def worker(i: int) -> None:
        rng = np.random.default_rng(i)
        for j in range(12):
            shape = (1 + (i + j) % 5, 3 + 17 * j)
            dt = max_softmax.dtypes.DTYPE_NAMES[dtypes[(i + j) % 4]]
            x = (rng.standard_normal(shape) * 3).astype(dt)
            axis = -1 if j % 2 else 0
            assert_matches_scipy(
                "softmax", max_softmax.softmax(x, axis=axis, device="cpu"), x, axis
            )

    run_in_threads(worker, 8)
    if array_path == "graph":  # each model compiled once, whatever the threads
        assert compile_count and all(n == 1 for n in compile_count.values()), compile_count


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def test_ten_thousand_calls_do_not_grow_memory(array_path):
    """After a warm-up, 10,000 calls may grow resident memory by < 32 MB."""
    x = np.random.default_rng(0).standard_normal((4, 100)).astype(np.float32)
    for _ in range(500):
        max_softmax.softmax(x, device="cpu")
    before = _rss_bytes()
    for _ in range(10_000):
        max_softmax.softmax(x, device="cpu")
    grown = _rss_bytes() - before
    print(f"RSS growth over 10,000 calls: {grown / 2**20:.1f} MiB")
    assert grown < 32 * 2**20, f"grew {grown / 2**20:.1f} MiB"
