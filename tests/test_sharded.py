"""The sharded (vocab-parallel) MAX graph ops on the CPU: several slices of
the class axis on one device, the statistics joined without collectives,
against float64 references of the whole row."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import DEVICES
from max.dtype import DType
from max.graph import DeviceRef, Graph, TensorType

from max_softmax import ops as graph_ops
from max_softmax.devices import device
from max_softmax.dtypes import to_buffer, to_numpy
from max_softmax.kernels import kernel_library
from max_softmax.models import device_ref, session
from max_softmax.reference import compare, compare_cross_entropy, cross_entropy_reference

DTYPES = {"float32": DType.float32, "float64": DType.float64}


def _split(x: np.ndarray, widths: tuple[int, ...]) -> list[np.ndarray]:
    cuts = np.cumsum(widths)[:-1]
    return [np.ascontiguousarray(p) for p in np.split(x, cuts, axis=-1)]


def _run(
    build, inputs: list[np.ndarray], types: list[TensorType], kind: str = "cpu"
) -> list[np.ndarray]:
    with Graph("sharded_test", input_types=types, custom_extensions=[kernel_library()]) as g:
        g.output(*build([v.tensor for v in g.inputs]))
    model = session(kind).load(g)
    return [to_numpy(b) for b in model.execute(*[to_buffer(a).to(device(kind)) for a in inputs])]


def _types(parts: list[np.ndarray], dtype: DType, kind: str = "cpu") -> list[TensorType]:
    return [TensorType(dtype, p.shape, device_ref(kind)) for p in parts]


@pytest.mark.parametrize("dtype", DTYPES)
def test_softmax_matches_whole_row(rng, dtype):
    # Every split and both ops in one graph: one compile a dtype.
    x = (rng.standard_normal((6, 20)) * 4).astype(dtype)
    x[1, 2] = -np.inf
    x[2, :] = -np.inf  # a row of only -inf: NaN, as the one-device op
    x[3, 0] = np.nan
    x[4, 5] = np.inf
    splits = [(20,), (5, 15), (1, 16, 3), (4, 6, 2, 8)]
    parts = [p for w in splits for p in _split(x, w)]

    def build(vs):
        outs, k = [], 0
        for w in splits:
            shards = vs[k : k + len(w)]
            k += len(w)
            outs += graph_ops.sharded_softmax(shards, None)
            outs += graph_ops.sharded_log_softmax(shards, None)
        return outs

    out = _run(build, parts, _types(parts, DTYPES[dtype]))
    k = 0
    for w in splits:
        n = len(w)
        for op in ("softmax", "log_softmax"):
            got = np.concatenate(out[k : k + n], axis=-1)
            k += n
            result = compare(op, got, x, axis=-1)
            assert result.ok, (w, op, result)


def test_softmax_3d_rows(rng):
    x = rng.standard_normal((2, 3, 21)).astype(np.float32)
    parts = _split(x, (10, 11))
    got = _run(lambda vs: graph_ops.sharded_softmax(vs, None), parts, _types(parts, DType.float32))
    assert got[0].shape == (2, 3, 10)
    assert compare("softmax", np.concatenate(got, axis=-1), x, axis=-1).ok


CE_CASES = [
    (w, r, e) for w in [(5, 9), (1, 10, 3)] for r in ["mean", "sum", "none"] for e in [0.0, 0.1]
]


@pytest.mark.parametrize("weighted", [False, True], ids=["plain", "weighted"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", DEVICES)
def test_cross_entropy_matches_whole_row(rng, kind, dtype, weighted):
    """Every split x reduction x smoothing in one graph (the slices of both
    splits are inputs, all on one device: the statistics joined without
    collectives), against the float64 reference of the whole row;
    `weighted`: with class weights (the whole vector, given once), as
    torch's weight=, one of them 0."""
    x = (rng.standard_normal((9, 14)) * 3).astype(dtype)
    t = rng.integers(0, 14, size=9).astype(np.int64)
    t[[1, 5]] = -100
    t[2] = 13
    t[3] = 0
    w = None
    if weighted:
        w = (rng.random(14) * 2).astype(dtype)
        w[t[4]] = 0.0
    splits = [(5, 9), (1, 10, 3)]
    parts = [p for s in splits for p in _split(x, s)]
    ref = device_ref(kind)
    types = [*_types(parts, DTYPES[dtype], kind), TensorType(DType.int64, [9], ref)]
    if weighted:
        types.append(TensorType(DTYPES[dtype], [14], ref))
    firsts = {(5, 9): 0, (1, 10, 3): 2}

    def build(vs):
        outs = []
        targets, weight = vs[len(parts)], vs[len(parts) + 1] if weighted else None
        for s, reduction, eps in CE_CASES:
            losses, grads = graph_ops.sharded_cross_entropy(
                vs[firsts[s] : firsts[s] + len(s)],
                targets,
                None,
                reduction=reduction,
                label_smoothing=eps,
                with_grad=True,
                weight=weight,
            )
            outs += [losses[0], losses[-1], *grads]
        return outs

    out = _run(build, [*parts, t] + ([w] if weighted else []), types, kind)
    k = 0
    for s, reduction, eps in CE_CASES:
        loss, last, *grads = out[k : k + 2 + len(s)]
        k += 2 + len(s)
        want_loss, want_grad = cross_entropy_reference(
            x, t, reduction=reduction, label_smoothing=eps, weight=w
        )
        ok, loss_err, grad_err = compare_cross_entropy(
            loss, np.concatenate(grads, axis=-1), want_loss, want_grad, dtype
        )
        assert ok, (s, reduction, eps, loss_err, grad_err)
        np.testing.assert_array_equal(loss, last)


def test_weighted_cross_entropy_checks_the_weight():
    cpu = DeviceRef.CPU()
    types = [TensorType(DType.float32, [4, 5], cpu)] * 2
    types += [TensorType(DType.int64, [4], cpu), TensorType(DType.float32, [9], cpu)]
    with Graph("bad_weight", input_types=types) as g:
        a, b, t, w = (v.tensor for v in g.inputs)
        with pytest.raises(ValueError, match=r"weight must have shape \(10,\)"):
            graph_ops.sharded_cross_entropy([a, b], t, None, weight=w)


def test_cross_entropy_bad_target_is_nan_and_ignore_index(rng):
    x = rng.standard_normal((3, 12)).astype(np.float32)
    t = np.array([3, 40, 7], dtype=np.int64)
    parts = _split(x, (4, 8))
    types = [*_types(parts, DType.float32), TensorType(DType.int64, [3], DeviceRef.CPU())]

    def build(vs):
        losses, grads = graph_ops.sharded_cross_entropy(
            vs[:2], vs[2], None, reduction="none", ignore_index=7, with_grad=True
        )
        return [losses[0], *grads]

    loss, *grads = _run(build, [*parts, t], types)
    grad = np.concatenate(grads, axis=-1)
    assert np.isnan(loss[1]) and np.isnan(grad[1]).all()
    assert loss[2] == 0 and (grad[2] == 0).all()
    want_loss, want_grad = cross_entropy_reference(x[:1], t[:1], reduction="none")
    assert compare_cross_entropy(loss[:1], grad[:1], want_loss, want_grad, "float32")[0]


def test_clear_errors(rng):
    types = [TensorType(DType.float32, [4, 5], DeviceRef.CPU())] * 2
    with Graph("bad", input_types=types) as g:
        a, b = (v.tensor for v in g.inputs)
        with pytest.raises(ValueError, match="last axis"):
            graph_ops.sharded_softmax([a, b], None, axis=0)
        with pytest.raises(ValueError, match="at least one"):
            graph_ops.sharded_softmax([], None)
    types = [TensorType(DType.float32, [4, 5], DeviceRef.CPU())] * 2
    types[1] = TensorType(DType.float32, [3, 5], DeviceRef.CPU())
    with Graph("bad2", input_types=types) as g:
        a, b = (v.tensor for v in g.inputs)
        with pytest.raises(ValueError, match="leading dims"):
            graph_ops.sharded_softmax([a, b], None)


def _gpu_count() -> int:
    from max.driver import accelerator_count

    return accelerator_count()


@pytest.mark.parametrize("gpus", [2, 3, 4])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_on_gpus_with_real_collectives(rng, gpus, dtype):
    """One slice a GPU, `ops.allgather` over `max.nn.comm.Signals`: softmax,
    log-softmax and cross-entropy with its gradient in one graph, against
    float64 references of the whole row (uneven slices, rows long enough
    for the kernels' vector paths)."""
    if _gpu_count() < gpus:
        pytest.skip(f"needs {gpus} GPUs")
    from max.driver import CPU, Accelerator
    from max.engine import InferenceSession
    from max.nn.comm import Signals

    from max_softmax.dtypes import BFLOAT16

    np_dtype = BFLOAT16 if dtype == "bfloat16" else np.float32
    rows, widths = 37, [4099, 1, 2048, 777][:gpus]
    classes = sum(widths)
    x = (rng.standard_normal((rows, classes)) * 3).astype(np_dtype)
    x[1, 3] = -np.inf
    t = rng.integers(0, classes, size=rows).astype(np.int64)
    t[2] = -100
    t[3] = classes - 1
    refs = [DeviceRef.GPU(id=i) for i in range(gpus)]
    accels = [Accelerator(id=i) for i in range(gpus)]
    signals = Signals(devices=refs)
    md = DType.bfloat16 if dtype == "bfloat16" else DType.float32
    shard_types = [TensorType(md, [rows, w], device=r) for w, r in zip(widths, refs)]
    target_type = TensorType(DType.int64, [rows], device=refs[0])
    with Graph(
        "sharded_gpus",
        input_types=[*shard_types, target_type, *signals.input_types()],
        custom_extensions=[kernel_library()],
    ) as g:
        shards = [v.tensor for v in g.inputs[:gpus]]
        targets = g.inputs[gpus].tensor
        buffers = [v.buffer for v in g.inputs[gpus + 1 :]]
        soft = graph_ops.sharded_softmax(shards, buffers)
        logs = graph_ops.sharded_log_softmax(shards, buffers)
        losses, grads = graph_ops.sharded_cross_entropy(
            shards, targets, buffers, label_smoothing=0.1, with_grad=True
        )
        g.output(*soft, *logs, *losses, *grads)
    model = InferenceSession(devices=[CPU(), *accels]).load(g)
    parts = [to_buffer(p).to(a) for p, a in zip(_split(x, widths), accels)]
    out = model.execute(*parts, to_buffer(t).to(accels[0]), *signals.buffers())
    out = [to_numpy(b) for b in out]
    for k, op in enumerate(("softmax", "log_softmax")):
        got = np.concatenate(out[k * gpus : (k + 1) * gpus], axis=-1)
        result = compare(op, got, x, axis=-1)
        assert result.ok, (op, gpus, dtype, result)
    losses, grads = out[2 * gpus : 3 * gpus], out[3 * gpus :]
    want_loss, want_grad = cross_entropy_reference(x, t, label_smoothing=0.1)
    ok, loss_err, grad_err = compare_cross_entropy(
        losses[0], np.concatenate(grads, axis=-1), want_loss, want_grad, dtype
    )
    assert ok, (gpus, dtype, loss_err, grad_err)
    for other in losses[1:]:
        np.testing.assert_array_equal(other, losses[0])
