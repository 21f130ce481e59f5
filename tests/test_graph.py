"""Our op inside users' own MAX graphs (graph-level API)."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.special
from conftest import DEVICES
from max.driver import CPU, Accelerator, Buffer
from max.dtype import DType
from max.engine import InferenceSession
from max.graph import DeviceRef, Graph, TensorType, ops

import max_softmax


def _device(kind):
    return (Accelerator(), DeviceRef.GPU()) if kind == "gpu" else (CPU(), DeviceRef.CPU())


@pytest.mark.parametrize("device", DEVICES)
def test_matmul_softmax_matmul(rng, device):
    """Attention-like block: softmax(q @ k^T) @ v with symbolic batch."""
    dev, ref = _device(device)
    q = rng.standard_normal((6, 16)).astype(np.float32)
    k = rng.standard_normal((16, 10)).astype(np.float32)
    v = rng.standard_normal((10, 4)).astype(np.float32)
    types = [
        TensorType(DType.float32, ["batch", 16], device=ref),
        TensorType(DType.float32, [16, 10], device=ref),
        TensorType(DType.float32, [10, 4], device=ref),
    ]
    with Graph("attention", input_types=types, custom_extensions=[max_softmax.KERNELS]) as g:
        a, b, c = (t.tensor for t in g.inputs)
        g.output(ops.matmul(max_softmax.ops.softmax(ops.matmul(a, b), axis=-1), c))
    model = InferenceSession(devices=[dev]).load(g)
    (out,) = model.execute(*(Buffer.from_numpy(t).to(dev) for t in (q, k, v)))
    want = scipy.special.softmax(q.astype(np.float64) @ k, axis=-1) @ v
    # GPU matmuls may run in TF32 (10-bit mantissa): the logits, not our
    # softmax, set the tolerance there.
    tol = 5e-3 if device == "gpu" else 1e-5
    np.testing.assert_allclose(out.to(CPU()).to_numpy(), want, rtol=tol, atol=tol)


def test_graph_without_custom_extensions(rng):
    """The op adds the kernel library itself if the user forgot it."""
    x = rng.standard_normal((3, 4, 5)).astype(np.float32)
    with Graph("plain", input_types=[TensorType(DType.float32, [3, 4, 5], DeviceRef.CPU())]) as g:
        g.output(max_softmax.ops.log_softmax(g.inputs[0].tensor, axis=-2))
    (out,) = InferenceSession(devices=[CPU()]).load(g).execute(Buffer.from_numpy(x))
    np.testing.assert_allclose(
        out.to_numpy(),
        scipy.special.log_softmax(x.astype(np.float64), axis=-2),
        atol=1e-5,
    )


def test_graph_level_errors():
    with Graph("bad", input_types=[TensorType(DType.int32, [3], DeviceRef.CPU())]) as g:
        with pytest.raises(TypeError, match="floating-point"):
            max_softmax.ops.softmax(g.inputs[0].tensor)
    with Graph("bad_axis", input_types=[TensorType(DType.float32, [3], DeviceRef.CPU())]) as g:
        with pytest.raises(ValueError, match="axis 1 is out of range"):
            max_softmax.ops.softmax(g.inputs[0].tensor, axis=1)
