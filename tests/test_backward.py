"""softmax_backward and log_softmax_backward: the analytic formula in
float64, finite differences of the forward, and properties."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import DEVICES, DTYPES, GPU_SKIP, random_logits

import max_softmax
import max_softmax.reference
from max_softmax.reference import compare_backward

BACKWARD = {"softmax_backward": "softmax", "log_softmax_backward": "log_softmax"}
SHAPES_AXES = [((128,), 0), ((7, 1000), -1), ((5, 50257), 1), ((3, 5, 7), 0), ((2, 3, 4, 5), -2)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op", list(BACKWARD))
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,axis", SHAPES_AXES)
def test_matches_formula(rng, device, op, dtype, shape, axis):
    x = random_logits(rng, shape, dtype)
    a = getattr(max_softmax, BACKWARD[op])(x, axis=axis, device=device)
    dy = random_logits(rng, shape, dtype, scale=1.0)
    dx = getattr(max_softmax, op)(a, dy, axis=axis, device=device)
    assert dx.shape == x.shape and dx.dtype == x.dtype
    c = compare_backward(op, dx, a, dy, axis)
    assert c.ok, f"{op} {dtype} {shape}: max_abs_err={c.max_abs_err:.3g}"


# One shape for each GPU backward family of dispatch.mojo's
# backward_kernel_for, with n not a multiple of the 16-byte vector so rows
# start unaligned (peeled heads and tails):
# - 7 x 4000, 3 x 16384: register plans of a block a row (16-bit rows held
#   raw, the kernel that asks for 1024 resident threads);
# - 300 x 20001: registers for 16-bit (512 threads x 8 chunks), on chip for
#   float32 (1024 threads);
# - 300 x 35001: both rows on chip, a block a row (512 threads for 16-bit);
# - 300 x 50257: on chip for 16-bit (1024 threads); for float32 (too long
#   for one SM) a cluster of four blocks a row, a quarter each on chip (more
#   in GPU_CLUSTER_ROWS below);
# - 8 x 300001: split stream, too few rows for a block a row;
# - 2 x 2^20: split stream, rows of 4 MB (float32);
# - 1 x (2^22 + 3): past the split stream's 8 MB, the block-per-row fallback.
GPU_LONG_ROWS = [
    (7, 4000),
    (3, 16384),
    (300, 20001),
    (300, 35001),
    (300, 50257),
    (8, 300001),
    (2, 1 << 20),
    (1, (1 << 22) + 3),
]


@GPU_SKIP
@pytest.mark.parametrize("op", list(BACKWARD))
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("shape", GPU_LONG_ROWS, ids=lambda s: f"{s[0]}x{s[1]}")
def test_gpu_long_rows(rng, op, dtype, shape):
    x = random_logits(rng, shape, dtype)
    a = getattr(max_softmax, BACKWARD[op])(x, axis=-1, device="gpu")
    dy = random_logits(rng, shape, dtype, scale=1.0)
    dx = getattr(max_softmax, op)(a, dy, axis=-1, device="gpu")
    assert dx.shape == x.shape and dx.dtype == x.dtype
    c = compare_backward(op, dx, a, dy, -1)
    assert c.ok, f"{op} {dtype} {shape}: max_abs_err={c.max_abs_err:.3g}"


# Rows past one SM, where backward_kernel_for picks a cluster kernel (a part
# of the row on chip in each block): rows >= 264, n over smem_capacity(V, 2).
# float32 and float64 take four blocks a row to cluster_capacity(V, 2, 4):
# float32 rows unaligned (50257, 40001, 131075) and aligned (40000, 65536,
# and 265 x 45056 with a row count that is not a multiple of anything), at
# capacity (float32 148448, float64 74224), and the first float32 row past
# it, which goes to the split stream (the dispatch boundary, values only).
# 16-bit rows take two blocks a row where the split stream's chunks would be
# under 15/16 full (80001, 86017; longer ones fill them).
GPU_CLUSTER_ROWS = [
    ("float32", (264, 50257)),
    ("float32", (300, 40001)),
    ("float32", (300, 40000)),
    ("float32", (265, 45056)),
    ("float32", (264, 65536)),
    ("float32", (264, 131075)),
    ("float32", (264, 148448)),
    ("float32", (264, 148449)),
    ("bfloat16", (264, 80001)),
    ("bfloat16", (264, 86017)),
    ("float16", (264, 80001)),
    ("float64", (264, 20001)),
    ("float64", (264, 74224)),
]


@GPU_SKIP
@pytest.mark.parametrize("op", list(BACKWARD))
@pytest.mark.parametrize(
    "dtype,shape", GPU_CLUSTER_ROWS, ids=lambda v: v if isinstance(v, str) else f"{v[0]}x{v[1]}"
)
def test_gpu_cluster_rows(rng, op, dtype, shape):
    x = random_logits(rng, shape, dtype)
    a = getattr(max_softmax, BACKWARD[op])(x, axis=-1, device="gpu")
    dy = random_logits(rng, shape, dtype, scale=1.0)
    # Special rows in the first and last parts: a NaN in the last block's
    # part makes the whole row NaN (every block takes the exchanged sum), a
    # large dy in rank 0's part (its scalar head where the row is
    # unaligned) moves the other parts' dx.
    dy[1, -2] = np.nan
    dy[2, 1] = 1e3
    dx = getattr(max_softmax, op)(a, dy, axis=-1, device="gpu")
    assert dx.shape == x.shape and dx.dtype == x.dtype
    assert np.all(np.isnan(dx[1]))
    c = compare_backward(op, np.delete(dx, 1, 0), np.delete(a, 1, 0), np.delete(dy, 1, 0), -1)
    assert c.ok, f"{op} {dtype} {shape}: max_abs_err={c.max_abs_err:.3g}"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op", list(BACKWARD))
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_finite_differences(rng, device, op, axis):
    """d/dx of L = sum(w * forward(x)) by central differences, float64."""
    x = rng.standard_normal((3, 4, 5))
    w = rng.standard_normal(x.shape)
    forward = getattr(max_softmax, BACKWARD[op])
    got = getattr(max_softmax, op)(
        forward(x, axis=axis, device=device), w, axis=axis, device=device
    )
    h = 1e-6
    numeric = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        e = np.zeros_like(x)
        e[i] = h
        up = np.sum(w * forward(x + e, axis=axis, device=device))
        down = np.sum(w * forward(x - e, axis=axis, device=device))
        numeric[i] = (up - down) / (2 * h)
    np.testing.assert_allclose(got, numeric, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("device", DEVICES)
def test_properties(rng, device):
    x = random_logits(rng, (16, 300), "float64")
    y = max_softmax.softmax(x, device=device)
    dy = rng.standard_normal(x.shape)
    dx = max_softmax.softmax_backward(y, dy, device=device)
    np.testing.assert_allclose(dx.sum(axis=-1), 0.0, atol=1e-12)  # rows sum to 0
    # dy constant along each row: softmax is shift invariant, so dx = 0.
    const = np.broadcast_to(rng.standard_normal((16, 1)), x.shape).copy()
    np.testing.assert_allclose(max_softmax.softmax_backward(y, const, device=device), 0, atol=1e-12)
    logp = max_softmax.log_softmax(x, device=device)
    # dy = p = exp(logp): dx = p - p * sum(p) = 0.
    np.testing.assert_allclose(
        max_softmax.log_softmax_backward(logp, y, device=device), 0, atol=1e-12
    )


def test_dy_mismatch_is_a_clear_error():
    y = np.ones((2, 3), np.float32) / 3
    with pytest.raises(ValueError, match="dy like its first input"):
        max_softmax.softmax_backward(y, np.ones((3, 2), np.float32), device="cpu")
    with pytest.raises(ValueError, match="dy like its first input"):
        max_softmax.softmax_backward(y, np.ones((2, 3), np.float64), device="cpu")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op", list(BACKWARD))
@pytest.mark.parametrize("n", [4, 3000, 200000])
def test_special_rows(device, op, n):
    """Rows of the forward's special outputs (NaN rows, -inf log-probs, 0
    probabilities) give the formula's result: NaN stays NaN (Mojo's CPU exp
    would turn it into inf), -inf log-probs contribute dy."""
    forward = BACKWARD[op]
    x = np.resize(np.array([1.0, np.nan, 2.0, 3.0]), (1, n))
    x = np.concatenate([x, np.resize(np.array([-np.inf, 0.5, 1.0, -np.inf]), (1, n))])
    with np.errstate(invalid="ignore"):
        a = max_softmax.reference.reference(forward, x, -1).astype(np.float32)
    dy = np.resize(np.array([0.5, -1.0, 2.0], dtype=np.float32), a.shape)
    dx = getattr(max_softmax, op)(a, dy, axis=-1, device=device)
    c = compare_backward(op, dx, a, dy, -1)
    assert c.ok, f"{op} n={n}: {c}"
    assert np.all(np.isnan(dx[0])) and np.all(np.isfinite(dx[1]))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op", list(BACKWARD))
def test_long_row_with_a_dominant_entry(rng, device, op):
    """A row of 2^20 - 1 where one entry holds most of the mass: dx there is
    dy - p * sum(dy) with sum(dy) ~ 1e3, the case the H100 fuzz found. The
    float32 sum is good to ~1e-7 of sum(|dy|), so the check is relative to
    the terms subtracted (backward_error_scale), and still catches a sum
    that is off by 1e-4 of them."""
    x = rng.standard_normal((1 << 20) - 1).astype(np.float32)
    x[12345] = 20.0
    a = getattr(max_softmax, BACKWARD[op])(x, axis=0, device=device)
    dy = rng.standard_normal(x.shape).astype(np.float32)
    dx = getattr(max_softmax, op)(a, dy, axis=0, device=device)
    assert compare_backward(op, dx, a, dy, 0).ok
    sum_terms = np.sum(np.abs(dy)) if op == "log_softmax_backward" else np.sum(np.abs(dy * a))
    p = np.exp(a.astype(np.float64)) if op == "log_softmax_backward" else a
    wrong = dx - (p * 3e-4 * sum_terms).astype(np.float32)
    assert not compare_backward(op, wrong, a, dy, 0).ok
