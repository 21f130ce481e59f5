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
