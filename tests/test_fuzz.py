"""Property-based tests: random shapes, axes, dtypes, values and layouts
against scipy.special in float64, plus invariants.

The normal suite runs a few examples per device; `scripts/fuzz` runs
thousands (MAX_SOFTMAX_FUZZ_EXAMPLES, default 2000).
"""

from __future__ import annotations

import os

import ml_dtypes
import numpy as np
import pytest
from conftest import DEVICES, DTYPES, assert_matches_scipy
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import max_softmax
from max_softmax.dtypes import DTYPE_NAMES
from max_softmax.reference import compare_backward, reference

EXAMPLES = int(os.environ.get("MAX_SOFTMAX_FUZZ_EXAMPLES", "15"))
SIZES = [0, 1, 2, 3, 5, 7, 13, 31, 32, 33, 64, 127, 128, 129, 255, 257, 1000, 1023, 1025]
VALUE_KINDS = ["normal", "huge", "tiny", "all_equal", "specials", "dtype_max"]


@st.composite
def cases(draw):
    """(array, axis) with a random shape, layout and kind of values."""
    dtype = draw(st.sampled_from(DTYPES))
    rank = draw(st.integers(1, 4))
    if draw(st.integers(0, 49)) == 0:  # now and then one long row
        shape = [draw(st.sampled_from([(1 << 20) - 1, 1 << 20, (1 << 20) + 1]))]
        shape = [draw(st.integers(1, 2))] + shape if rank > 1 else shape
    else:
        shape = [draw(st.sampled_from(SIZES)) for _ in range(rank)]
        while np.prod(shape) > 1 << 16:
            shape[int(np.argmax(shape))] //= 2
    axis = draw(st.integers(-len(shape), len(shape) - 1))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    kind = draw(st.sampled_from(VALUE_KINDS))
    x = rng.standard_normal(shape) * 5
    if kind == "huge":
        x = x * (1e30 if dtype != "float16" else 1e3)
    elif kind == "tiny":
        x = x * 1e-30
    elif kind == "all_equal":
        x = np.full(shape, rng.standard_normal())
    elif kind == "dtype_max":
        info = ml_dtypes.finfo(DTYPE_NAMES[dtype])
        x = np.where(rng.random(shape) < 0.5, float(info.max), float(info.min))
    elif kind == "specials":
        pick = rng.random(shape)
        x = np.where(pick < 0.05, np.inf, x)
        x = np.where((pick >= 0.05) & (pick < 0.1), -np.inf, x)
        x = np.where((pick >= 0.1) & (pick < 0.12), np.nan, x)
    x = x.astype(DTYPE_NAMES[dtype])
    layout = draw(st.sampled_from(["contiguous", "reversed", "strided"]))
    if layout == "reversed":
        x = np.flip(x, axis=axis)
    elif layout == "strided" and x.ndim and x.shape[0] > 1:
        x = np.repeat(x, 2, axis=0)[::2]
    return x, axis


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
def test_fuzz_against_scipy(device, op):
    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        database=None,
    )
    @given(cases())
    def check(case):
        x, axis = case
        fn = getattr(max_softmax, op)
        y = fn(x, axis=axis, device=device)
        assert_matches_scipy(op, y, np.ascontiguousarray(x), axis)
        assert np.array_equal(fn(x, axis=axis, device=device), y, equal_nan=True)
        if op == "softmax" and y.size:
            p = y.astype(np.float64)
            finite_rows = ~np.any(np.isnan(p), axis=axis)
            assert np.all((p[~np.isnan(p)] >= 0) & (p[~np.isnan(p)] <= 1))
            sums = p.sum(axis=axis)[finite_rows]
            assert np.allclose(sums, 1.0, rtol=0, atol=2e-2 if x.itemsize == 2 else 1e-4)

    check()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op", ["softmax_backward", "log_softmax_backward"])
def test_fuzz_backward_against_formula(device, op):
    """The backward ops on the forward's float64 output (rounded to the
    dtype, specials and all) and random dy, against the float64 formula."""

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        database=None,
    )
    @given(cases(), st.integers(0, 2**32 - 1))
    def check(case, seed):
        x, axis = case
        forward = "softmax" if op == "softmax_backward" else "log_softmax"
        with np.errstate(over="ignore", invalid="ignore"):
            a = reference(forward, x, axis).astype(x.dtype)
        dy = np.random.default_rng(seed).standard_normal(x.shape).astype(x.dtype)
        dx = getattr(max_softmax, op)(a, dy, axis=axis, device=device)
        c = compare_backward(op, dx, a, dy, axis)
        assert c.ok, f"{op} {x.dtype} {x.shape} axis={axis}: {c}"

    check()
