"""Device-graph replay (`Model.capture` / `Model.replay`) with our ops.

Every GPU dispatch path, the split kernels with their workspace included,
must give under replay what it gives executed; a replay must compute on
whatever the captured input buffers hold now (the recipe in the README).
The CPU has no device graphs: MAX says so clearly, and so do we.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from conftest import GPU_SKIP, random_logits
from max.dtype import DType

from max_softmax.devices import device, gpu_count
from max_softmax.dtypes import DTYPE_NAMES, max_dtype, to_buffer, to_numpy
from max_softmax.models import ModelKey, row_op_model
from max_softmax.reference import compare, compare_backward, reference
from max_softmax.registry import op_spec
from max_softmax.validation import canonical_shape

_keys = itertools.count(1000)

GPUS = [f"gpu:{i}" for i in range(gpu_count())] or [pytest.param("gpu", marks=GPU_SKIP)]
"""Every GPU MAX sees (one skipped case where there is none): replay on each."""

# (op, dtype, shape, axis): one case per dispatch path of op/dispatch.mojo.
CASES = [
    ("softmax", "float32", (64, 256), -1),  # a few lanes a row, registers
    ("softmax", "float32", (8, 4096), -1),  # block rows in registers
    ("softmax", "float32", (300, 36000), -1),  # row on chip, a block a row (smem)
    ("softmax", "float32", (300, 40000), -1),  # row on chip over a cluster of blocks
    ("log_softmax", "float32", (300, 40000), -1),
    ("softmax", "float32", (4, 300_000), -1),  # split_stream, workspace
    ("softmax", "bfloat16", (4, 300_000), -1),  # split_stream, 16-bit blocks
    ("softmax", "float32", (2, 2_200_000), -1),  # rows over 8 MB: split
    ("softmax", "float32", (8, 100, 3), 1),  # strided
    ("log_softmax", "float32", (4, 300_000), -1),
    ("softmax_backward", "float32", (64, 256), -1),  # registers
    ("softmax_backward", "float32", (4, 40000), -1),  # block per row
    ("softmax_backward", "float32", (8, 100, 3), 1),  # strided
]


def _inputs(rng, op: str, dtype: str, shape, axis: int) -> list[np.ndarray]:
    x = random_logits(rng, shape, dtype)
    if op_spec(op).arity == 1:
        return [x]
    forward = "log_softmax" if op.startswith("log") else "softmax"
    return [reference(forward, x, axis).astype(x.dtype), random_logits(rng, shape, dtype, 1.0)]


def _check(op: str, got: np.ndarray, arrays: list[np.ndarray], axis: int) -> None:
    c = (
        compare(op, got, arrays[0], axis)
        if len(arrays) == 1
        else compare_backward(op, got, *arrays, axis)
    )
    assert c.ok, f"{op}: max_abs_err={c.max_abs_err:.3g}"


@pytest.mark.parametrize("gpu", GPUS)
@pytest.mark.parametrize("op,dtype,shape,axis", CASES)
def test_replay_equals_execute(rng, op, dtype, shape, axis, gpu):
    model = row_op_model(ModelKey(op, max_dtype(DTYPE_NAMES[dtype]), gpu))
    view = canonical_shape(shape, axis)
    arrays = _inputs(rng, op, dtype, shape, axis)
    bufs = [to_buffer(np.ascontiguousarray(a).reshape(view)).to(device(gpu)) for a in arrays]
    (executed,) = model.execute(*bufs)
    want = to_numpy(executed)
    key = next(_keys)
    outs = model.capture(key, *bufs)
    try:
        model.replay(key, *bufs)
        np.testing.assert_array_equal(to_numpy(outs[0]), want)
        # New values in the captured buffers: the replay computes on them.
        fresh = _inputs(rng, op, dtype, shape, axis)
        for buf, a in zip(bufs, fresh):
            buf.inplace_copy_from(to_buffer(np.ascontiguousarray(a).reshape(view)).to(buf.device))
        model.replay(key, *bufs)
        _check(op, to_numpy(outs[0]).reshape(shape), fresh, axis)
        model.debug_verify_replay(key, *bufs)
    finally:
        del outs
        model.release_captured_graph(key)


def test_cpu_has_no_device_graphs():
    """On the CPU capture fails at once with MAX's own message, no hang."""
    model = row_op_model(ModelKey("softmax", DType.float32, "cpu"))
    buf = to_buffer(np.ones((2, 5, 1), np.float32))
    with pytest.raises(RuntimeError, match="No graph-capture devices"):
        model.capture(next(_keys), buf)
    # ... and the model still executes.
    (out,) = model.execute(buf)
    np.testing.assert_allclose(to_numpy(out), 0.2, rtol=1e-6)
