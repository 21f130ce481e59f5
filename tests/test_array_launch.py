"""The array functions' CPU launch path (`launch.py`): numpy arrays go to the
row functions through the launch extension, not `Model.execute`, and get the
very bits the compiled models give."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import random_logits

import max_softmax
from max_softmax import launch

OPS = ["softmax", "log_softmax", "softmax_backward", "log_softmax_backward"]


def _call(op: str, x: np.ndarray, dy: np.ndarray, axis: int) -> np.ndarray:
    fn = getattr(max_softmax, op)
    return fn(x, dy, axis, device="cpu") if op.endswith("_backward") else fn(x, axis, device="cpu")


def _same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return (
        a.shape == b.shape
        and a.dtype == b.dtype
        and np.array_equal(a.reshape(-1).view(np.uint8), b.reshape(-1).view(np.uint8))
    )


@pytest.fixture
def launched(monkeypatch):
    """Counts the calls that reach the extension."""
    if not launch.available_for_arrays():
        pytest.skip("the launch extension is not built here")
    calls = []
    real = launch.call

    def counting(fn, *args):
        calls.append(fn)
        return real(fn, *args)

    monkeypatch.setattr(launch, "call", counting)
    return calls


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float64"])
@pytest.mark.parametrize(("shape", "axis"), [((8, 1000), -1), ((3, 50, 2), 1), ((7,), 0)])
@pytest.mark.parametrize("op", OPS)
def test_launch_matches_the_models_bit_for_bit(rng, monkeypatch, launched, op, dtype, shape, axis):
    x = random_logits(rng, shape, dtype)
    dy = random_logits(rng, shape, dtype, scale=1.0)
    got = _call(op, x, dy, axis)
    assert len(launched) == 1
    monkeypatch.setattr(launch, "ENABLED", False)
    assert _same_bits(got, _call(op, x, dy, axis))
    assert len(launched) == 1  # the graph path did not launch


@pytest.mark.parametrize("reduction", ["mean", "none"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_cross_entropy_launch_matches_the_models(rng, monkeypatch, launched, reduction, dtype):
    x = random_logits(rng, (3, 4, 50), dtype)
    t = rng.integers(0, 50, size=(3, 4))
    t[1, 2] = -100
    kw = {"reduction": reduction, "label_smoothing": 0.1, "device": "cpu"}
    got = max_softmax.cross_entropy_with_grad(x, t, **kw)
    assert len(launched) == 1
    monkeypatch.setattr(launch, "ENABLED", False)
    want = max_softmax.cross_entropy_with_grad(x, t, **kw)
    assert all(_same_bits(g, w) for g, w in zip(got, want))


def test_masked_calls_keep_the_models(rng, launched):
    """The extension has no masked op: scale, mask and causal run the model."""
    x = random_logits(rng, (4, 9), "float32")
    max_softmax.softmax(x, scale=0.5, device="cpu")
    assert not launched
