"""Property-based tests: random shapes, axes, dtypes, values and layouts
against scipy.special in float64, plus invariants.

The normal suite runs a few examples per device; `scripts/fuzz` runs
thousands (`pytest --fuzz-examples N`; the script passes 2000).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from conftest import DEVICES, DTYPES, assert_matches_scipy
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import max_softmax
from max_softmax.dtypes import DTYPE_NAMES
from max_softmax.reference import compare_backward, reference

SIZES = [0, 1, 2, 3, 5, 7, 13, 31, 32, 33, 64, 127, 128, 129, 255, 257, 1000, 1023, 1025]
VALUE_KINDS = ["normal", "huge", "tiny", "all_equal", "specials", "dtype_max"]
FUZZ = settings(deadline=None, suppress_health_check=list(HealthCheck), database=None)
"""Every fuzz test's hypothesis settings (no deadline); the number of examples
and whether they are drawn anew come from `--fuzz-examples` (conftest)."""


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
    @FUZZ
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

    @FUZZ
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


@st.composite
def masked_cases(draw):
    """(x, axis, scale, mask, causal): `cases()`' arrays with a random
    scale, a boolean or floating mask broadcastable to x (each dim x's or
    1, leading dims dropped now and then), and causal where it applies
    (rank >= 2, along the last axis)."""
    x, axis = draw(cases())
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    scale = draw(st.sampled_from([None, 0.125, 1.0, -0.5, 0.0, 3.0]))
    kind = draw(st.sampled_from(["none", "bool", "float"]))
    mask = None
    if kind != "none":
        shape = [d if draw(st.booleans()) else 1 for d in x.shape]
        shape = shape[draw(st.integers(0, len(shape))) :]
        if kind == "bool":
            mask = rng.random(shape) < 0.7
        else:
            mask = np.where(rng.random(shape) < 0.3, -np.inf, rng.standard_normal(shape))
    last = axis % max(x.ndim, 1) == x.ndim - 1
    causal = x.ndim >= 2 and last and draw(st.booleans())
    if scale is None and mask is None and not causal:
        scale = 0.5  # the plain op is fuzzed above
    return x, axis, scale, mask, causal


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
def test_fuzz_masked_against_reference(device, op):
    """Scaled, masked and causal softmax on `cases()`' shapes, layouts and
    values against the float64 reference (torch's attention semantics)."""
    from max_softmax.reference import compare, masked_reference

    @FUZZ
    @given(masked_cases())
    def check(case):
        x, axis, scale, mask, causal = case
        kw = {"scale": scale, "mask": mask, "causal": causal}
        got = getattr(max_softmax, op)(x, axis=axis, device=device, **kw)
        assert got.shape == x.shape and got.dtype == x.dtype
        if x.size == 0:
            return
        with np.errstate(over="ignore", invalid="ignore"):
            want = masked_reference(op, x, axis=axis, **kw)
        c = compare(op, got, np.ascontiguousarray(x), axis, ref=want)
        shape = None if mask is None else mask.shape
        assert c.ok, (
            f"{op} {x.dtype} {x.shape} axis={axis} scale={scale} mask={shape} {causal}: {c}"
        )

    check()


@st.composite
def cross_entropy_cases(draw):
    """(logits, targets, reduction, ignore_index, label_smoothing): random
    rows and classes (now and then a GPT-2-sized row), dtypes, values as
    `cases()` draws them bar NaN/inf and dtype_max, targets with ignored rows."""
    dtype = draw(st.sampled_from(DTYPES))
    rows = draw(st.sampled_from([0, 1, 2, 3, 7, 33, 129, 300]))
    n = draw(st.sampled_from(SIZES[1:] + [50257]))
    if n == 50257:
        rows = min(rows, 3)
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    # Not dtype_max: a loss of such logits (up to 2 x max) is past the
    # dtype's range where the float64 reference is not.
    kind = draw(st.sampled_from(["normal", "huge", "tiny", "all_equal"]))
    x = rng.standard_normal((rows, n)) * 5
    if kind == "huge":
        x = x * (1e30 if dtype != "float16" else 1e3)
    elif kind == "tiny":
        x = x * 1e-30
    elif kind == "all_equal":
        x = np.full((rows, n), rng.standard_normal())
    ignore_index = draw(st.sampled_from([-100, 0, n - 1]))
    t = rng.integers(0, n, size=rows)
    t[rng.random(rows) < 0.2] = ignore_index
    reduction = draw(st.sampled_from(["mean", "sum", "none"]))
    eps = draw(st.sampled_from([0.0, 0.1, 0.5]))
    return x.astype(DTYPE_NAMES[dtype]), t, reduction, ignore_index, eps


@pytest.mark.parametrize("device", DEVICES)
def test_fuzz_cross_entropy_against_reference(device):
    """cross_entropy_with_grad on random shapes, dtypes, values, reductions,
    ignore_index and label smoothing against the float64 numpy reference
    (loss, dlogits and each gradient row's sum)."""
    from test_cross_entropy import assert_close, assert_row_sums, reduction_scale

    from max_softmax.reference import cross_entropy_reference

    @FUZZ
    @given(cross_entropy_cases())
    def check(case):
        x, t, reduction, ignore_index, eps = case
        kw = {"reduction": reduction, "ignore_index": ignore_index, "label_smoothing": eps}
        loss, dlogits = max_softmax.cross_entropy_with_grad(x, t, device=device, **kw)
        with np.errstate(over="ignore", invalid="ignore"):
            want_loss, want_grad = cross_entropy_reference(x, t, **kw)
            # Rounded to the dtype: a loss past its range is inf there.
            want_loss = np.asarray(want_loss).astype(x.dtype).astype(np.float64)
        dtype = x.dtype.name
        assert dlogits.shape == x.shape and dlogits.dtype == x.dtype
        assert_close(loss, want_loss, dtype, f"loss {x.shape} {kw}")
        assert_close(dlogits, want_grad, dtype, f"dlogits {x.shape} {kw}")
        assert_row_sums(dlogits, want_grad, dtype, reduction_scale(t, **kw))

    check()
