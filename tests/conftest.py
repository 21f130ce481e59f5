"""Shared fixtures: the devices to test on and a seeded random generator.

GPU cases share the CPU test bodies; they skip with a reason where MAX
finds no accelerator.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import numpy as np
import pytest

import max_softmax

GPU_SKIP = pytest.mark.skipif(
    not max_softmax.gpu_available(),
    reason="no GPU: MAX finds no accelerator on this machine",
)

DEVICES = ["cpu", pytest.param("gpu", marks=GPU_SKIP)]
DTYPES = ["float32", "float16", "bfloat16", "float64"]


@pytest.fixture
def rng() -> np.random.Generator:
    """A generator seeded per test, so failures reproduce."""
    return np.random.default_rng(1234)


@pytest.fixture(params=["launch", "graph"])
def array_path(request, monkeypatch) -> str:
    """Run a test's CPU array calls through the launch extension (the
    default) and again through `Model.execute` of the compiled models."""
    from max_softmax import launch

    if request.param == "graph":
        monkeypatch.setattr(launch, "ENABLED", False)
    return request.param


def random_logits(rng: np.random.Generator, shape, dtype, scale: float = 4.0):
    """Fresh random logits (never zeros) of `shape` in numpy dtype `dtype`."""
    from max_softmax.dtypes import DTYPE_NAMES

    return (rng.standard_normal(shape) * scale).astype(DTYPE_NAMES[dtype])


def assert_matches_scipy(op: str, got, x, axis: int) -> None:
    """Fail with the error figures if `got` is off the float64 reference."""
    from max_softmax.reference import compare

    assert got.shape == x.shape and got.dtype == x.dtype
    c = compare(op, got, x, axis)
    assert c.ok, (
        f"{op} {x.dtype} {x.shape} axis={axis}: max_abs_err={c.max_abs_err:.3g} "
        f"max_rel_err={c.max_rel_err:.3g} nan_mismatches={c.nan_mismatches} "
        f"(rtol={c.rtol}, atol={c.atol})"
    )


def run_in_threads(worker: Callable[[int], None], count: int) -> None:
    """Run worker(0) ... worker(count - 1) on as many threads at once; fail
    with the first error any of them raised."""
    errors: list[BaseException] = []

    def guarded(i: int) -> None:
        try:
            worker(i)
        except BaseException as err:  # noqa: BLE001 - reported below
            errors.append(err)

    threads = [threading.Thread(target=guarded, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]
