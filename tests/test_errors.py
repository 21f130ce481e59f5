"""Bad input gets a clear Python exception naming the problem."""

from __future__ import annotations

import numpy as np
import pytest

import max_softmax


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.uint8, np.bool_, np.complex64])
def test_non_float_dtype(dtype):
    with pytest.raises(TypeError, match="floating-point"):
        max_softmax.softmax(np.ones((2, 3), dtype=dtype), device="cpu")


def test_rank_zero():
    with pytest.raises(ValueError, match="rank >= 1"):
        max_softmax.softmax(np.float32(1.0), device="cpu")


@pytest.mark.parametrize("axis", [2, -3, 10])
def test_axis_out_of_range(axis):
    with pytest.raises(ValueError, match=f"axis {axis} is out of range for a tensor of rank 2"):
        max_softmax.softmax(np.ones((2, 3), dtype=np.float32), axis=axis, device="cpu")


def test_axis_not_int():
    with pytest.raises(TypeError, match="axis must be an int"):
        max_softmax.softmax(np.ones(3, dtype=np.float32), axis=1.5, device="cpu")


def test_unknown_device():
    with pytest.raises(ValueError, match="device must be one of"):
        max_softmax.softmax(np.ones(3, dtype=np.float32), device="tpu")


def test_unknown_variant():
    with pytest.raises(ValueError, match="unknown variant"):
        max_softmax.softmax(np.ones(3, dtype=np.float32), device="cpu", variant="fast")


def test_gpu_variant_on_cpu():
    """variant= picks among GPU kernel families: on the CPU it is an error,
    not silently ignored (nor a second compiled model)."""
    with pytest.raises(ValueError, match="'warp' is a GPU kernel family; on the cpu"):
        max_softmax.softmax(np.ones(3, dtype=np.float32), device="cpu", variant="warp")


def test_big_endian_input():
    """A non-native byte order (e.g. '>f4' read from a file) is a float array too."""
    x = np.array([[1.0, 2.0, 3.0]], dtype=">f4")
    y = max_softmax.softmax(x, device="cpu")
    want = np.exp([1.0, 2.0, 3.0]) / np.exp([1.0, 2.0, 3.0]).sum()
    np.testing.assert_allclose(y[0], want, rtol=1e-6)


@pytest.mark.skipif(max_softmax.gpu_available(), reason="a GPU is present")
def test_gpu_requested_without_gpu():
    with pytest.raises(max_softmax.NoGPUError, match="no accelerator"):
        max_softmax.softmax(np.ones(3, dtype=np.float32), device="gpu")


@pytest.mark.skipif(not max_softmax.gpu_available(), reason="no GPU: MAX finds no accelerator")
@pytest.mark.parametrize(
    "variant,capacity,n",
    # float32: "warp" holds 512 (1024 where rows are 16-byte aligned, n % 4
    # == 0); rows of up to 8 MB for the split kernels
    [
        ("warp", 512, 513),
        ("warp", 1024, 1028),
        ("smem", 74240, 74241),
        ("split_stream", 2 * 2**20, 2 * 2**20 + 1),
    ],
)
def test_variant_too_short_for_row_on_gpu(variant, capacity, n):
    x = np.ones((2, n), dtype=np.float32)
    with pytest.raises(
        ValueError, match=f"variant '{variant}' handles rows up to {capacity} elements, got {n}"
    ):
        max_softmax.softmax(x, device="gpu", variant=variant)
    # The model stays usable after the error.
    y = max_softmax.softmax(x, device="gpu")
    np.testing.assert_allclose(y, 1 / n, rtol=1e-6)


@pytest.mark.skipif(max_softmax.gpu_available(), reason="a GPU is present")
def test_graph_on_missing_gpu():
    """A graph placing our op on a GPU the machine lacks fails at build time,
    naming the problem (MAX alone fails later: "Failed to compile the model")."""
    from max.dtype import DType
    from max.graph import DeviceRef, Graph, TensorType

    t = TensorType(DType.float32, [4, 8], DeviceRef.GPU())
    with Graph("softmax_on_missing_gpu", input_types=[t]) as g:
        with pytest.raises(max_softmax.NoGPUError, match="finds no accelerator"):
            max_softmax.ops.softmax(g.inputs[0].tensor)


def test_graph_backward_mismatched_devices():
    from max.dtype import DType
    from max.graph import DeviceRef, Graph, TensorType

    on_cpu = TensorType(DType.float32, [4, 8], DeviceRef.CPU())
    on_gpu = TensorType(DType.float32, [4, 8], DeviceRef.GPU())
    with Graph("backward_mixed_devices", input_types=[on_cpu, on_gpu]) as g:
        y, dy = (v.tensor for v in g.inputs)
        with pytest.raises(ValueError, match="needs dy like its first input"):
            max_softmax.ops.softmax_backward(y, dy)
