"""The array functions' CPU launch path (`launch.py`): numpy arrays go to the
row functions through the launch extension, not `Model.execute`, and get the
very bits the compiled models give."""

from __future__ import annotations

import gc

import numpy as np
import pytest
from conftest import random_logits

import max_softmax
from max_softmax import arrays, host_pool, launch, registry
from max_softmax.reference import compare, masked_reference

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


def _ce_options(rng, classes: int) -> list:
    """Cross-entropy's keyword options: the plain loss, then each of z-loss,
    softcap and class weights, and all together (the extended kernels)."""
    weight = rng.uniform(0.2, 2.0, classes)
    return [
        pytest.param({}, id="plain"),
        pytest.param({"z_loss": 1e-2}, id="zloss"),
        pytest.param({"softcap": 3.0}, id="softcap"),
        pytest.param({"weight": weight}, id="weight"),
        pytest.param({"weight": weight, "z_loss": 1e-2, "softcap": 3.0}, id="all"),
    ]


CE_OPTIONS = _ce_options(np.random.default_rng(7), 50)
"""`_ce_options` for 50 classes: the shapes below."""


@pytest.mark.parametrize("options", CE_OPTIONS)
@pytest.mark.parametrize("reduction", ["mean", "none"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_cross_entropy_launch_matches_the_models(
    rng, monkeypatch, launched, reduction, dtype, options
):
    """The launch extension gives the models' bits, plain and under every
    extended option (one model per (op, dtype, reduction) serves them)."""
    x = random_logits(rng, (3, 4, 50), dtype)
    t = rng.integers(0, 50, size=(3, 4))
    t[1, 2] = -100
    kw = {"reduction": reduction, "label_smoothing": 0.1, "device": "cpu", **options}
    got = max_softmax.cross_entropy_with_grad(x, t, **kw)
    assert len(launched) == 1
    monkeypatch.setattr(launch, "ENABLED", False)
    want = max_softmax.cross_entropy_with_grad(x, t, **kw)
    assert all(_same_bits(g, w) for g, w in zip(got, want))


@pytest.fixture
def no_graphs(monkeypatch):
    """Every model builder of the array functions raises: a call that would
    compile a graph fails."""

    def refuse(*args, **kwargs):
        raise AssertionError(f"a graph was asked for: {args}")

    for name in ("row_op_model", "masked_model", "cross_entropy_model"):
        monkeypatch.setattr(arrays, name, refuse)


def test_every_registry_op_is_served_by_the_extension():
    """Each op of the registry has an extension entry, and the built
    extension has it: no numpy or torch call of an op waits for a graph."""
    if not launch.available_for_arrays():
        pytest.skip("the launch extension is not built here")
    module = launch.extension()
    assert set(launch.ENTRIES) == set(registry.OPS)
    for op, entry in launch.ENTRIES.items():
        assert callable(getattr(module, entry, None)), (op, entry)
        assert launch.function(op) is getattr(module, entry)
    for name in launch.HELPERS:
        assert callable(getattr(module, name, None)), name
    assert set(launch.ROW_OPS) | set(launch.MASKED_OPS) <= set(registry.OPS)


def _mask(rng, kind, shape):
    if kind == "bool":
        return rng.random(shape) < 0.7
    if kind == "float":
        return np.where(rng.random(shape) < 0.3, -np.inf, rng.standard_normal(shape))
    return None


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float64"])
@pytest.mark.parametrize(
    ("scale", "mask", "mask_shape", "causal", "axis"),
    [
        (0.5, None, None, False, -1),
        (None, "bool", (6, 33), False, -1),  # one mask a (L, n) matrix
        (2.0, "float", (2, 1, 6, 33), True, -1),  # a mask a batch element
        (None, None, None, True, -1),
        (0.25, "bool", (2, 3, 6, 33), False, 1),  # not the last axis
    ],
)
@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
def test_masked_calls_launch(
    rng, launched, no_graphs, op, dtype, scale, mask, mask_shape, causal, axis
):
    x = random_logits(rng, (2, 3, 6, 33), dtype)
    m = _mask(rng, mask, mask_shape)
    kw = {"scale": scale, "mask": m, "causal": causal}
    got = getattr(max_softmax, op)(x, axis, device="cpu", **kw)
    assert len(launched) == 1
    want = masked_reference(op, x, axis=axis, **kw)
    c = compare(op, got, x, axis, ref=want)
    assert got.shape == x.shape and got.dtype == x.dtype and c.ok, c


@pytest.mark.parametrize("ce_options", CE_OPTIONS)
def test_no_op_compiles_a_graph_on_the_cpu(rng, launched, no_graphs, ce_options):
    """Every array function of every op, with its options, on the CPU;
    cross-entropy plain and with z-loss, softcap and class weights."""
    x = random_logits(rng, (5, 50), "float32")
    dy = random_logits(rng, (5, 50), "float32", scale=1.0)
    t = rng.integers(0, 50, size=5)
    y = max_softmax.softmax(x, device="cpu")
    logp = max_softmax.log_softmax(x, device="cpu")
    max_softmax.softmax(x, device="cpu", scale=0.5, mask=x > 0, causal=True)
    max_softmax.log_softmax(x, device="cpu", scale=0.5)
    max_softmax.softmax_backward(y, dy, device="cpu", scale=0.5)
    max_softmax.log_softmax_backward(logp, dy, device="cpu", scale=2.0)
    for reduction in ("mean", "sum", "none"):
        kw = {"reduction": reduction, "device": "cpu", **ce_options}
        max_softmax.cross_entropy(x, t, **kw)
        max_softmax.cross_entropy_with_grad(x, t, **kw)
    linear = {("class_weight" if k == "weight" else k): v for k, v in ce_options.items()}
    max_softmax.linear_cross_entropy(x, np.eye(50, dtype=np.float32), t, device="cpu", **linear)
    assert len(launched) == 13


def _every_call(x, dy, t):
    """(name, call(out)) for each array function with out=."""
    return [
        ("softmax", lambda out: max_softmax.softmax(x, device="cpu", out=out)),
        ("log_softmax", lambda out: max_softmax.log_softmax(x, 0, device="cpu", out=out)),
        ("masked", lambda out: max_softmax.softmax(x, device="cpu", causal=True, out=out)),
        (
            "masked_axis0",
            lambda out: max_softmax.log_softmax(x, 0, device="cpu", scale=0.5, out=out),
        ),
        (
            "softmax_backward",
            lambda out: max_softmax.softmax_backward(x, dy, device="cpu", scale=0.5, out=out),
        ),
        (
            "log_softmax_backward",
            lambda out: max_softmax.log_softmax_backward(x, dy, 0, device="cpu", out=out),
        ),
        (
            "cross_entropy_with_grad",
            lambda out: max_softmax.cross_entropy_with_grad(x, t, device="cpu", out=out)[1],
        ),
    ]


@pytest.mark.parametrize("where", ["fresh", "strided", "input"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_out_gets_the_same_bits(rng, dtype, where):
    """out= writes the very result the call returns without it: into a new
    array, a non-contiguous view, or the input itself (computed aside,
    then copied)."""
    x = random_logits(rng, (6, 50), dtype)
    dy = random_logits(rng, (6, 50), dtype, scale=1.0)
    t = rng.integers(0, 50, size=6)
    for name, call in _every_call(x, dy, t):
        want = call(None)
        if where == "input":
            # The call reads x and writes x: a copy of x, given as both.
            x_in = x.copy()
            got = dict(_every_call(x_in, dy, t))[name](x_in)
            assert got is x_in, name
        else:
            out = np.empty_like(x) if where == "fresh" else np.empty((6, 100), x.dtype)[:, ::2]
            got = call(out)
            assert got is out, name
        assert _same_bits(np.ascontiguousarray(got), want), name


def test_out_errors(rng):
    x = random_logits(rng, (3, 8), "float32")
    with pytest.raises(ValueError, match="shape"):
        max_softmax.softmax(x, device="cpu", out=np.empty((3, 9), np.float32))
    with pytest.raises(ValueError, match="dtype"):
        max_softmax.softmax(x, device="cpu", out=np.empty((3, 8), np.float64))
    with pytest.raises(TypeError, match="numpy array"):
        max_softmax.log_softmax(x, device="cpu", out=[0.0] * 24)
    frozen = np.empty_like(x)
    frozen.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        max_softmax.softmax_backward(x, x, device="cpu", out=frozen)
    with pytest.raises(ValueError, match="shape"):
        max_softmax.cross_entropy_with_grad(x, [0, 1, 2], device="cpu", out=np.empty(3, np.float32))


def test_large_outputs_come_from_the_host_pool(rng, monkeypatch):
    """An output on a pooled block (host_pool) holds its values while other
    outputs take pooled blocks, and equals the numpy-allocated one."""
    monkeypatch.setattr(arrays, "POOLED_BYTES", 0)
    x = random_logits(rng, (4, 300), "bfloat16")
    first = max_softmax.softmax(x, device="cpu")
    assert first.base is not None and first.flags.c_contiguous and first.flags.writeable
    assert first.ctypes.data % host_pool.HUGE_PAGE == 0
    want = first.copy()
    gc.collect()
    for _ in range(3):
        max_softmax.softmax(random_logits(rng, (4, 300), "bfloat16"), device="cpu")
    assert _same_bits(first, want)
    monkeypatch.setattr(arrays, "POOLED_BYTES", 1 << 62)
    assert _same_bits(max_softmax.softmax(x, device="cpu"), want)
