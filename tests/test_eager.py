"""MAX eager: max_softmax functions on max.experimental Tensors, and the same
custom.declare declaration staged in a Graph."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import DEVICES, assert_matches_scipy, random_logits

import max_softmax
from max_softmax import eager
from max_softmax.devices import device as max_device
from max_softmax.dtypes import to_buffer, to_numpy
from max_softmax.reference import compare_backward

Tensor = pytest.importorskip("max.experimental.tensor").Tensor

CASES = [((8, 1000), -1), ((3, 50, 2), 1), ((2, 3, 4, 5), 0), ((300,), 0)]


def to_tensor(x: np.ndarray, device: str):
    """A MAX eager Tensor holding `x` on `device`."""
    return Tensor.from_dlpack(to_buffer(np.ascontiguousarray(x))).to(max_device(device))


def from_tensor(t) -> np.ndarray:
    """A MAX eager Tensor back as numpy (bfloat16 via ml_dtypes)."""
    return to_numpy(t.driver_tensor.to(max_device("cpu")))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("shape,axis", CASES)
@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
def test_eager_tensor_in_tensor_out(rng, device, dtype, shape, axis, op):
    x = random_logits(rng, shape, dtype)
    t = to_tensor(x, device)
    y = getattr(max_softmax, op)(t, axis=axis)
    assert isinstance(y, Tensor) and y.device == t.device and y.dtype == t.dtype
    assert_matches_scipy(op, from_tensor(y), x, axis)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op", ["softmax_backward", "log_softmax_backward"])
def test_eager_backward(rng, device, op):
    x = random_logits(rng, (6, 40), "float32")
    forward = max_softmax.softmax if op == "softmax_backward" else max_softmax.log_softmax
    a = forward(x, device="cpu")
    dy = random_logits(rng, x.shape, "float32")
    dx = getattr(max_softmax, op)(to_tensor(a, device), to_tensor(dy, device))
    assert compare_backward(op, from_tensor(dx), a, dy, -1).ok


def test_declaration_works_in_a_graph(rng):
    """Eager and graph code share one declaration."""
    from max.dtype import DType
    from max.graph import DeviceRef, Graph, TensorType

    from max_softmax.models import session

    t = TensorType(DType.float32, ["a", "b", "c"], DeviceRef.CPU())
    with Graph("declared_softmax", input_types=[t]) as g:
        g.output(eager.declaration("softmax")(g.inputs[0].tensor))
    model = session("cpu").load(g)
    x = random_logits(rng, (4, 33, 3), "float32")
    (y,) = model.execute(to_buffer(x))
    assert_matches_scipy("softmax", to_numpy(y), x, 1)


def test_eager_errors():
    t = Tensor.from_dlpack(np.ones((2, 3), dtype=np.int32))
    with pytest.raises(TypeError, match="floating-point"):
        max_softmax.softmax(t)
    f = Tensor.from_dlpack(np.ones((2, 3), dtype=np.float32))
    with pytest.raises(ValueError, match="axis 2 is out of range"):
        max_softmax.softmax(f, axis=2)
    with pytest.raises(ValueError, match="leave device and variant"):
        max_softmax.softmax(f, device="cpu")
    with pytest.raises(ValueError, match="dy like its first input"):
        max_softmax.softmax_backward(f, Tensor.from_dlpack(np.ones((3, 2), dtype=np.float32)))


def test_eager_empty():
    t = Tensor.from_dlpack(np.ones((0, 5), dtype=np.float32))
    assert from_tensor(max_softmax.softmax(t)).shape == (0, 5)


@pytest.mark.parametrize("shape", [(), (1,), (3, 5)])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_buffer_round_trip_keeps_values_and_shape(rng, dtype, shape):
    """to_buffer / to_numpy move every dtype's bits both ways, 0-d too (a
    reduced loss is a 0-d buffer, and MAX cannot deduce a bfloat16 view's
    shape from it)."""
    from max_softmax.dtypes import DTYPE_NAMES

    x = np.asarray(rng.standard_normal(shape)).astype(DTYPE_NAMES[dtype])
    got = to_numpy(to_buffer(x))
    assert got.shape == x.shape and got.dtype == x.dtype
    assert np.array_equal(got.reshape(-1).view(np.uint8), x.reshape(-1).view(np.uint8))


# ---- scale, mask and causal (the graph-level edge staged with the declared masked op) ----

MASKED_CASES = [
    # (x shape, mask shape or None, mask kind, causal, axis)
    ((2, 3, 5, 7), (5, 7), "bool", False, -1),
    ((5, 4, 3), (5, 1, 3), "bool", False, 1),
    ((2, 3, 7, 7), (2, 1, 1, 7), "bool", True, -1),
    ((3, 1000), None, None, False, -1),
]


def _mask(rng, shape, kind):
    if kind is None:
        return None
    if kind == "bool":
        return rng.random(shape) < 0.7
    return np.where(rng.random(shape) < 0.3, -np.inf, rng.standard_normal(shape))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", MASKED_CASES, ids=lambda c: f"{c[0]}-{c[2]}-causal{c[3]}")
@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
def test_eager_masked_matches_reference(rng, device, case, op):
    from max_softmax.reference import compare, masked_reference

    shape, mask_shape, kind, causal, axis = case
    x = random_logits(rng, shape, "float32")
    mask = _mask(rng, mask_shape, kind)
    scale = 0.37
    y = getattr(max_softmax, op)(to_tensor(x, device), axis, scale=scale, mask=mask, causal=causal)
    assert isinstance(y, Tensor) and y.device == max_device(device)
    want = masked_reference(op, x, axis=axis, scale=scale, mask=mask, causal=causal)
    c = compare(op, from_tensor(y), x, axis, ref=want)
    assert c.ok, (c.max_abs_err, c.max_rel_err, c.nan_mismatches)


@pytest.mark.parametrize("device", DEVICES)
def test_eager_mask_as_a_tensor_and_16_bit(rng, device):
    """A mask that is itself a MAX Tensor; bfloat16 x with a float mask."""
    x = random_logits(rng, (3, 6, 40), "bfloat16")
    keep = rng.random((6, 40)) < 0.6
    keep[2] = False  # a row with nothing kept: zeros
    y = max_softmax.softmax(to_tensor(x, device), mask=to_tensor(keep, device))
    want = max_softmax.softmax(x, mask=keep, device="cpu")
    got = from_tensor(y)
    assert got.dtype == x.dtype and np.all(got[:, 2] == 0)
    np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), rtol=1.6e-2)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op", ["softmax_backward", "log_softmax_backward"])
def test_eager_backward_takes_the_scale(rng, device, op):
    x = random_logits(rng, (5, 30), "float32")
    forward = op.removesuffix("_backward")
    a = getattr(max_softmax, forward)(x, scale=0.5, device="cpu")
    dy = random_logits(rng, x.shape, "float32")
    fn = getattr(max_softmax, op)
    got = from_tensor(fn(to_tensor(a, device), to_tensor(dy, device), scale=0.5))
    np.testing.assert_allclose(got, fn(a, dy, scale=0.5, device="cpu"), rtol=1e-6, atol=1e-7)


def test_eager_masked_errors():
    f = Tensor.from_dlpack(np.ones((4, 5), dtype=np.float32))
    with pytest.raises(TypeError, match="boolean mask"):
        max_softmax.softmax(f, mask=np.ones((4, 5), np.int32))
    with pytest.raises(ValueError, match="broadcastable"):
        max_softmax.softmax(f, mask=np.ones((3, 5), bool))
    with pytest.raises(max_softmax.SoftmaxInputError, match="last axis"):
        max_softmax.softmax(f, axis=0, causal=True)
    with pytest.raises(ValueError, match="scale must be finite"):
        max_softmax.softmax(f, scale=float("nan"))
    with pytest.raises(ValueError, match="leave device and variant"):
        max_softmax.softmax(f, scale=2.0, variant="warp")


# ---- cross-entropy (the graph-level edge staged with the declared loss op) ----


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("reduction", ["mean", "none"])
@pytest.mark.parametrize("targets_as", ["numpy", "tensor"])
def test_eager_cross_entropy_with_grad(rng, device, reduction, targets_as):
    from max_softmax.reference import CROSS_ENTROPY_TOLERANCES, cross_entropy_reference

    x = random_logits(rng, (3, 4, 50), "float32")
    t = rng.integers(0, 50, size=(3, 4))
    t[0, 1] = -100
    targets = t if targets_as == "numpy" else to_tensor(t, device)
    loss, dlogits = max_softmax.cross_entropy_with_grad(
        to_tensor(x, device), targets, reduction=reduction, label_smoothing=0.1
    )
    assert isinstance(loss, Tensor) and isinstance(dlogits, Tensor)
    assert loss.device == dlogits.device == max_device(device)
    want_loss, want_grad = cross_entropy_reference(x, t, reduction=reduction, label_smoothing=0.1)
    tol = CROSS_ENTROPY_TOLERANCES["float32"]
    np.testing.assert_allclose(from_tensor(loss), want_loss, rtol=tol, atol=1e-6)
    np.testing.assert_allclose(from_tensor(dlogits), want_grad, rtol=tol, atol=1e-6)
    alone = max_softmax.cross_entropy(to_tensor(x, device), targets, reduction=reduction)
    np.testing.assert_allclose(
        from_tensor(alone), cross_entropy_reference(x, t, reduction=reduction)[0], rtol=tol
    )


def test_eager_cross_entropy_errors():
    x = Tensor.from_dlpack(np.zeros((3, 10), dtype=np.float32))
    bad = np.array([1, 10, 2])
    for targets in (bad, Tensor.from_dlpack(bad)):  # host targets are checked before a run
        with pytest.raises(ValueError, match="target 10 at index"):
            max_softmax.cross_entropy(x, targets)
    with pytest.raises(ValueError, match="leave device and variant"):
        max_softmax.cross_entropy(x, np.zeros(3, np.int64), device="cpu")
    with pytest.raises(TypeError):
        max_softmax.cross_entropy(x, np.zeros(3, np.float32))
