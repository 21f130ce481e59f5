"""Documented semantics for NaN, infinities, huge values and empty input."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import DEVICES, DTYPES, assert_matches_scipy

import max_softmax
from max_softmax.dtypes import DTYPE_NAMES

INF = np.inf
NAN = np.nan

ROWS = {
    "nan": [1.0, NAN, 2.0, 3.0],
    "plus_inf": [1.0, INF, 2.0, 3.0],
    "all_minus_inf": [-INF, -INF, -INF, -INF],
    "some_minus_inf": [-INF, -INF, 1.0, 2.0],
    "minus_inf_last": [3.0, 1.0, -INF, -INF],
    "huge": [1e30, -1e30, 1e30, 0.0],
    "all_equal": [7.0, 7.0, 7.0, 7.0],
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("row", list(ROWS))
@pytest.mark.parametrize("n", [4, 3000, 200000])
def test_special_values(device, op, dtype, row, n):
    """Each special row tiled to length n (each kernel family sees it)."""
    values = np.array(ROWS[row], dtype=np.float64)
    if row == "huge":
        values = np.clip(values, -1e4, 1e4) if dtype == "float16" else values
    x = np.resize(values, (3, n)).astype(DTYPE_NAMES[dtype])
    y = getattr(max_softmax, op)(x, axis=-1, device=device)
    assert_matches_scipy(op, y, x, -1)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_dtype_extremes(device, dtype):
    info = np.finfo(DTYPE_NAMES[dtype])
    x = np.array([[info.max, info.min, 0.0, info.max], [info.tiny, -info.tiny, 0, 1]])
    x = x.astype(DTYPE_NAMES[dtype])
    y = max_softmax.softmax(x, device=device)
    assert_matches_scipy("softmax", y, x, -1)
    np.testing.assert_allclose(y[0], [0.5, 0.0, 0.0, 0.5])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape,axis", [((0,), 0), ((3, 0), 1), ((0, 5), 1), ((2, 0, 4), 0)])
def test_empty(device, shape, axis):
    x = np.zeros(shape, dtype=np.float32)
    y = max_softmax.softmax(x, axis=axis, device=device)
    assert y.shape == shape and y.dtype == np.float32
