"""Scaled, masked and causal softmax (`scale=`, `mask=`, `causal=`): against
the float64 reference (`reference.masked_reference`), against torch's own
autograd of the unfused expression, and its errors.

Each (op, dtype, device) compiles one model serving every mask / causal
combination, scale and shape (run-time values: the flags ride in the
options' length), so the cases below share few of them."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
from conftest import DEVICES, random_logits

import max_softmax
from max_softmax.reference import compare, compare_backward, masked_reference

ROOT = Path(__file__).resolve().parent.parent
CHECK = ROOT / "tests" / "gpu_masked_check.mojo"
HAVE_TORCH = importlib.util.find_spec("torch") is not None
OPS = ["softmax", "log_softmax"]


def _bool_mask(rng, shape, keep=0.7):
    return rng.random(shape) < keep


def _float_mask(rng, shape, drop=0.3):
    m = rng.standard_normal(shape)
    return np.where(rng.random(shape) < drop, -np.inf, m)


def run(op, x, device, **kw):
    fn = max_softmax.softmax if op == "softmax" else max_softmax.log_softmax
    return fn(x, device=device, **kw)


def check(op, x, device, axis=-1, **kw):
    """Our op against the float64 reference under the plain op's tolerances."""
    got = run(op, x, device, axis=axis, **kw)
    want = masked_reference(op, x, axis=axis, **kw)
    assert got.shape == x.shape and got.dtype == x.dtype
    c = compare(op, got, x, axis, ref=want)
    assert c.ok, (
        f"{op} {x.dtype} {x.shape} {sorted(kw)}: max_abs_err={c.max_abs_err:.3g} "
        f"max_rel_err={c.max_rel_err:.3g} nan_mismatches={c.nan_mismatches}"
    )
    return got


# (name, x shape, mask maker or None, causal, axis). All share one model per
# (op, dtype, device).
def _cases():
    def bool_of(shape):
        return lambda rng: _bool_mask(rng, shape)

    def float_of(shape):
        return lambda rng: _float_mask(rng, shape)

    return [
        ("scale-only", (4, 37), None, False, -1),
        ("scale-only-1000", (3, 1000), None, False, -1),
        ("bool-Ln-over-BHLn", (2, 3, 5, 7), bool_of((5, 7)), False, -1),
        ("float-full-shape", (4, 33), float_of((4, 33)), False, -1),
        ("padding-B11n", (2, 3, 4, 9), bool_of((2, 1, 1, 9)), False, -1),
        ("padding-1H1n", (2, 3, 4, 64), float_of((1, 3, 1, 64)), False, -1),
        ("row-vector-n", (6, 128), float_of((128,)), False, -1),
        ("broadcast-last-axis", (2, 3, 4, 8), bool_of((2, 3, 4, 1)), False, -1),
        ("axis-1", (5, 4, 3), bool_of((5, 1, 3)), False, 1),
        ("axis-0-float", (6, 7), float_of((6, 1)), False, 0),
        ("long-rows", (3, 40000), float_of((40000,)), False, -1),
        ("causal-square", (2, 3, 6, 6), None, True, -1),
        ("causal-L<n", (2, 5, 9), None, True, -1),
        ("causal-L>n", (2, 9, 5), None, True, -1),
        ("causal-1024", (1, 64, 1024), None, True, -1),
        ("causal-long", (1, 3, 40000), None, True, -1),
        ("causal-and-mask", (2, 3, 7, 7), bool_of((2, 1, 1, 7)), True, -1),
    ]


CASES = _cases()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize(
    ("name", "shape", "make_mask", "causal", "axis"), CASES, ids=[c[0] for c in CASES]
)
def test_matches_reference(rng, device, op, name, shape, make_mask, causal, axis):
    x = random_logits(rng, shape, "float32")
    mask = make_mask(rng) if make_mask else None
    scale = float(rng.choice([0.37, 1.0, 2.5, -1.5]))
    check(op, x, device, axis=axis, scale=scale, mask=mask, causal=causal)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    ("dtype", "op"),
    [("bfloat16", "softmax"), ("float64", "log_softmax"), ("float16", "softmax")],
)
@pytest.mark.parametrize("shape", [(2, 3, 5, 1000), (3, 37), (2, 40000)])
def test_dtypes(rng, device, dtype, op, shape):
    """16-bit and float64 rows (aligned, unaligned, past the GPU register
    plans); one model per (dtype, op), the mask's model."""
    x = random_logits(rng, shape, dtype)
    mask = _float_mask(rng, shape[-2:])
    check(op, x, device, scale=0.125, mask=mask)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("n", [7, 1000, 40000])
def test_fully_masked_rows(rng, device, op, n):
    """A row with nothing kept is 0 (softmax) or -inf (log_softmax), never
    NaN; so is a row whose kept values are all -inf; a NaN under the mask is
    dropped."""
    x = random_logits(rng, (4, n), "float32")
    keep = _bool_mask(rng, (4, n))
    keep[1] = False
    x[2] = -np.inf
    x[3, ~keep[3]] = np.nan
    got = check(op, x, device, mask=keep)
    fill = 0.0 if op == "softmax" else -np.inf
    assert np.all(got[1] == fill) and np.all(got[2] == fill)
    assert not np.isnan(got).any()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op", OPS)
def test_nan_and_inf_kept_make_the_row_nan(device, op):
    x = np.zeros((3, 8), dtype=np.float32)
    x[0, 2], x[1, 3] = np.nan, np.inf
    keep = np.ones((3, 8), dtype=bool)
    got = check(op, x, device, mask=keep)
    assert np.isnan(got[:2]).all() and not np.isnan(got[2]).any()
    # Causal: the positions past the diagonal of a NaN row are NaN too.
    x = np.zeros((1, 4, 4), dtype=np.float32)
    x[0, 2, 0], x[0, 3, 1] = np.nan, np.inf
    got = check(op, x, device, causal=True)
    assert np.isnan(got[0, 2:]).all() and not np.isnan(got[0, :2]).any()


@pytest.mark.parametrize("device", DEVICES)
def test_scale_is_a_run_time_value(rng, device, monkeypatch):
    """A new scale (temperature) reuses the compiled model."""
    from max_softmax import launch
    from max_softmax.models import compile_count

    monkeypatch.setattr(launch, "ENABLED", False)  # the compiled models' path (CPU numpy
    # calls otherwise take the launch extension and compile nothing)

    x = random_logits(rng, (8, 100), "float32")
    for t in (0.5, 1.0, 2.0, 10.0):
        check("softmax", x, device, scale=1 / t)
    keys = [
        k
        for k in compile_count  # row ops' keys are ModelKeys, the masked ops' tuples
        if isinstance(k, tuple) and k[:2] == ("softmax_masked", max_softmax.SUPPORTED_DTYPES[0])
    ]
    assert keys and all(compile_count[k] == 1 for k in keys)


COMBINATIONS = [(False, False), (True, False), (False, True), (True, True)]
"""(has a mask, causal): every combination one masked model serves."""


def _masked_keys(op, dtype, kind, into=False):
    """The model keys compiled for masked op `op` on (dtype, device `kind`):
    (op, dtype, kind), or ("into", op, dtype, kind) for the torch bridge's."""
    from max_softmax.models import compile_count

    want = ("into",) * into + (f"{op}_masked", dtype)
    return [
        k
        for k in compile_count
        if isinstance(k, tuple) and k[: len(want)] == want and k[len(want) :] == (kind,)
    ]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op", OPS)
def test_one_model_serves_every_combination(rng, device, op, monkeypatch):
    """The four (mask, causal) combinations of one op and dtype run through
    one compiled model, compiled once, each against the float64 reference
    (a mask that differs per row and a causal L < n, so no combination
    passes for another)."""
    from max.dtype import DType

    from max_softmax import launch
    from max_softmax.models import compile_count

    monkeypatch.setattr(launch, "ENABLED", False)  # the compiled models' path
    x = random_logits(rng, (2, 5, 9), "float32")
    keep = _bool_mask(rng, (5, 9), keep=0.6)
    keep[:, 0] = True
    results = []
    for has_mask, causal in COMBINATIONS:
        mask = keep if has_mask else None
        results.append(check(op, x, device, scale=0.7, mask=mask, causal=causal))
    for i, a in enumerate(results):  # each combination gave its own values
        for b in results[i + 1 :]:
            assert not np.array_equal(a, b)
    kind = "cpu" if device == "cpu" else "gpu"
    keys = _masked_keys(op, DType.float32, kind)
    assert len(keys) == 1, keys
    assert compile_count[keys[0]] == 1


@pytest.mark.parametrize("options", [[], [0.5, 0, 0, 0, 0]])
def test_bad_options_length_is_a_clear_error(rng, options):
    """A masked model given options of a length that carries no flags
    raises, naming the expected lengths."""
    from max.driver import Buffer
    from max.dtype import DType

    from max_softmax.models import masked_model

    model = masked_model("softmax_masked", DType.float32, "cpu")
    x = random_logits(rng, (1, 2, 4), "float32")
    args = [x, np.zeros((1, 1), np.float32), np.array(options, np.float64)]
    with pytest.raises(Exception, match="options must hold 1 to 4"):
        model.execute(*(Buffer.from_numpy(a) for a in args))


def test_masked_options_encode_the_flags():
    from max_softmax.validation import CAUSAL_FLAG, MASK_FLAG, masked_flags, masked_options

    assert masked_flags(False, False) == 0 and masked_flags(True, True) == 3
    assert masked_options(0.5, masked_flags(True, False)) == [0.5, 0.0]
    assert len(masked_options(2.0, MASK_FLAG | CAUSAL_FLAG)) == 4
    with pytest.raises(ValueError, match="flags"):
        masked_options(1.0, 4)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op", OPS)
def test_plain_call_keeps_the_plain_op(rng, device, op):
    """No scale/mask/causal: the plain op's path (and its semantics: a row
    of only -inf is NaN there)."""
    x = random_logits(rng, (2, 16), "float32")
    x[1] = -np.inf
    got = run(op, x, device)
    assert np.isnan(got[1]).all()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    ("op", "dtype"),
    [
        ("softmax_backward", "float32"),
        ("log_softmax_backward", "float32"),
        ("softmax_backward", "bfloat16"),
    ],
)
def test_backward_takes_the_scale(rng, device, op, dtype):
    """dx = scale * the unscaled formula, from a scaled and masked forward."""
    shape, scale = (5, 300), 0.37
    x = random_logits(rng, shape, dtype)
    forward = op.removesuffix("_backward")
    a = run(forward, x, device, scale=scale, mask=_float_mask(rng, shape[-2:], drop=0.0))
    dy = random_logits(rng, shape, dtype, scale=1.0)
    fn = getattr(max_softmax, op)
    got = fn(a, dy, -1, device=device, scale=scale)
    plain = fn(a, dy, -1, device=device)
    c = compare_backward(op, got.astype(np.float64) / scale, a, dy, -1)
    assert c.ok, (c.max_abs_err, c.max_rel_err)
    np.testing.assert_allclose(
        got.astype(np.float64), plain.astype(np.float64) * scale, rtol=1e-2, atol=1e-6
    )


# ---- errors (no compile) ----


@pytest.mark.parametrize(
    ("kw", "shape", "axis", "error", "match"),
    [
        ({"causal": True}, (4, 5), 0, max_softmax.SoftmaxInputError, "last axis"),
        ({"causal": True}, (5,), -1, max_softmax.SoftmaxInputError, "rank >= 2"),
        ({"causal": 1}, (4, 5), -1, TypeError, "causal must be a bool"),
        ({"scale": float("inf")}, (4, 5), -1, ValueError, "scale must be finite"),
        ({"scale": float("nan")}, (4, 5), -1, ValueError, "scale must be finite"),
        ({"scale": "2"}, (4, 5), -1, TypeError, "scale must be a real number"),
        ({"scale": True}, (4, 5), -1, TypeError, "scale must be a real number"),
        ({"mask": np.ones((3, 5), bool)}, (4, 5), -1, ValueError, "broadcastable"),
        ({"mask": np.ones((2, 4, 5), bool)}, (4, 5), -1, ValueError, "broadcastable"),
        ({"mask": np.ones((4, 5), np.int32)}, (4, 5), -1, TypeError, "boolean mask"),
        ({"mask": np.ones((4, 5), bool), "variant": "warp"}, (4, 5), -1, ValueError, "variant"),
    ],
)
@pytest.mark.parametrize("op", OPS)
def test_errors(op, kw, shape, axis, error, match):
    x = np.zeros(shape, dtype=np.float32)
    with pytest.raises(error, match=match):
        run(op, x, "cpu", axis=axis, **kw)


def test_backward_scale_errors():
    y = np.full((2, 3), 1 / 3, dtype=np.float32)
    with pytest.raises(ValueError, match="scale must be finite"):
        max_softmax.softmax_backward(y, y, scale=float("inf"), device="cpu")


def test_empty_input(rng):
    x = np.zeros((0, 5), dtype=np.float32)
    assert run("softmax", x, "cpu", mask=np.ones(5, bool)).shape == (0, 5)


# ---- the graph level ----


@pytest.mark.parametrize("device", DEVICES)
def test_graph_level(rng, device):
    """ops.softmax / log_softmax / the backward ops with scale, mask and
    causal in a user's graph, symbolic dims, a boolean mask input."""
    from max.driver import Buffer
    from max.dtype import DType
    from max.graph import Graph, TensorType

    from max_softmax.dtypes import to_numpy
    from max_softmax.models import device_ref, session

    ref = device_ref(device)
    padding = np.where(rng.random((1, 1, 1, 9)) < 0.3, -np.inf, 0.0)
    types = [
        TensorType(DType.float32, ["B", "H", "L", 9], ref),
        TensorType(DType.bool, ["L", 9], ref),
        TensorType(DType.float32, ["B", "H", "L", 9], ref),
    ]
    with Graph("masked", input_types=types, custom_extensions=[max_softmax.KERNELS]) as g:
        x, m, dy = (v.tensor for v in g.inputs)
        y = max_softmax.ops.softmax(x, scale=0.5, mask=m, causal=True)
        logp = max_softmax.ops.log_softmax(x, axis=1, scale=2.0)
        dx = max_softmax.ops.softmax_backward(y, dy, scale=0.5)
        padded = max_softmax.ops.softmax(x, mask=padding)  # a numpy constant
        g.output(y, logp, dx, padded)
    model = session(device).load(g)
    x = random_logits(rng, (2, 3, 6, 9), "float32")
    keep = _bool_mask(rng, (6, 9))
    dy = random_logits(rng, (2, 3, 6, 9), "float32", scale=1.0)
    bufs = [Buffer.from_numpy(a) for a in (x, keep, dy)]
    if device == "gpu":
        from max_softmax.devices import device as dev

        bufs = [b.to(dev("gpu")) for b in bufs]
    y, logp, dx, padded = (to_numpy(o) for o in model.execute(*bufs))
    want = masked_reference("softmax", x, scale=0.5, mask=keep, causal=True)
    assert compare("softmax", y, x, -1, ref=want).ok
    want = masked_reference("log_softmax", x, axis=1, scale=2.0)
    assert compare("log_softmax", logp, x, 1, ref=want).ok
    assert compare_backward("softmax_backward", dx / 0.5, y, dy, -1).ok
    assert compare("softmax", padded, x, -1, ref=masked_reference("softmax", x, mask=padding)).ok


def test_gpu_kernels_compile(tmp_path):
    """Every masked-softmax GPU kernel compiles for the H100 (sm_90) without
    a GPU (tests/gpu_masked_check.mojo launches each)."""
    from test_gpu_build import _build

    _build(tmp_path / "check", source=CHECK)


# ---- torch: against torch's own autograd of the unfused expression ----

torch_only = pytest.mark.skipif(not HAVE_TORCH, reason="torch is not installed (extra [torch])")


def _torch_device(device):
    return "cuda" if device == "gpu" else "cpu"


@torch_only
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize(
    ("shape", "mask_shape", "causal"),
    [
        ((2, 3, 5, 7), (5, 7), False),
        ((2, 3, 4, 33), (2, 1, 1, 33), False),
        ((2, 3, 6, 6), None, True),
        ((2, 5, 9), None, True),
    ],
)
def test_torch_autograd_matches_torch(rng, device, op, shape, mask_shape, causal):
    """Forward and gradient against torch.softmax / log_softmax of
    (x * scale).masked_fill(~keep, -inf) (the boolean mask's meaning: 0
    gradient at dropped positions), rows with something kept."""
    import torch

    import max_softmax.torch as mst

    dev = _torch_device(device)
    scale = 0.37
    x64 = rng.standard_normal(shape) * 3
    keep = np.ones(shape, bool)
    mask = None
    if mask_shape is not None:
        m = _bool_mask(rng, mask_shape, keep=0.8)
        m[..., 0] = True  # no row fully masked: torch's reference is NaN there
        keep &= np.broadcast_to(m, shape)
        mask = torch.from_numpy(m).to(dev)
    if causal:
        keep &= np.tril(np.ones(shape[-2:], bool))
    keep_t = torch.from_numpy(keep).to(dev)
    x = torch.tensor(x64, dtype=torch.float32, device=dev, requires_grad=True)
    xr = x.detach().clone().requires_grad_(True)
    ours = getattr(mst, op)(x, -1, scale=scale, mask=mask, causal=causal)
    theirs = getattr(torch, op)((xr * scale).masked_fill(~keep_t, float("-inf")), -1)
    torch.testing.assert_close(ours, theirs, rtol=2e-5, atol=1e-6)
    g = torch.randn(shape, dtype=torch.float32, device=dev)
    ours.backward(g)
    theirs.backward(g)
    torch.testing.assert_close(x.grad, xr.grad, rtol=1e-4, atol=1e-5)


@torch_only
@pytest.mark.parametrize("device", DEVICES)
def test_torch_float_mask_and_fully_masked_rows(rng, device):
    """An additive float mask matches torch's autograd of softmax(x * s + m)
    where rows keep something; fully masked rows give 0 and gradient 0."""
    import torch

    import max_softmax.torch as mst

    dev = _torch_device(device)
    m = torch.from_numpy(_float_mask(rng, (4, 50))).float().to(dev)
    m[0] = float("-inf")
    m[1:, 0] = 0.0
    x = torch.randn(3, 4, 50, device=dev, requires_grad=True)
    xr = x.detach().clone().requires_grad_(True)
    ours = mst.softmax(x, scale=2.0, mask=m)
    theirs = torch.softmax(xr * 2.0 + m, -1)
    assert torch.all(ours[:, 0] == 0)
    torch.testing.assert_close(ours[:, 1:], theirs[:, 1:], rtol=2e-5, atol=1e-6)
    g = torch.randn_like(ours)
    ours.backward(g)
    theirs.backward(g)
    assert torch.all(x.grad[:, 0] == 0)
    torch.testing.assert_close(x.grad[:, 1:], xr.grad[:, 1:], rtol=1e-4, atol=1e-5)


@torch_only
def test_torch_axis_not_last_and_errors(rng):
    import torch

    import max_softmax.torch as mst

    x = torch.randn(4, 6, 3, requires_grad=True)
    keep = torch.rand(4, 6, 1) < 0.8
    keep[:, 0] = True
    xr = x.detach().clone().requires_grad_(True)
    ours = mst.softmax(x, 1, scale=0.5, mask=keep)
    theirs = torch.softmax((xr * 0.5).masked_fill(~keep, float("-inf")), 1)
    torch.testing.assert_close(ours, theirs, rtol=2e-5, atol=1e-6)
    ours.sum().backward()
    with pytest.raises(max_softmax.SoftmaxInputError, match="last axis"):
        mst.softmax(x, 0, causal=True)
    with pytest.raises(ValueError, match="broadcastable"):
        mst.softmax(x, mask=torch.ones(5, 3, dtype=torch.bool))


@torch_only
@pytest.mark.parametrize("device", DEVICES)
def test_torch_graph_path_one_model_for_every_combination(rng, device, monkeypatch):
    """The torch bridge's graph path (the launch extension off) runs all
    four (mask, causal) combinations through one destination-passing model,
    each against the float64 reference."""
    import torch
    from max.dtype import DType

    import max_softmax.torch as mst
    from max_softmax import launch
    from max_softmax.models import compile_count

    monkeypatch.setattr(launch, "ENABLED", False)
    monkeypatch.setattr(launch, "CUDA_ENABLED", False)
    dev = _torch_device(device)
    x = random_logits(rng, (2, 5, 9), "float32")
    keep = _bool_mask(rng, (5, 9), keep=0.6)
    keep[:, 0] = True
    for has_mask, causal in COMBINATIONS:
        mask = keep if has_mask else None
        m = torch.from_numpy(keep).to(dev) if has_mask else None
        got = mst.log_softmax(torch.from_numpy(x).to(dev), scale=1.5, mask=m, causal=causal)
        want = masked_reference("log_softmax", x, scale=1.5, mask=mask, causal=causal)
        c = compare("log_softmax", got.cpu().numpy(), x, -1, ref=want)
        assert c.ok, (has_mask, causal, c.max_abs_err)
    kind = "cpu" if device == "cpu" else "gpu"
    keys = _masked_keys("log_softmax", DType.float32, kind, into=True)
    assert len(keys) == 1, keys
    assert compile_count[keys[0]] == 1


@torch_only
def test_torch_compile_fullgraph():
    """The masked op is a registered torch custom op under torch.compile."""
    import torch

    import max_softmax.torch as mst

    x = torch.randn(2, 3, 6, 6)
    keep = torch.rand(6, 6) > 0.3
    keep[:, 0] = True

    def f(a, m):
        return mst.softmax(a, scale=0.5, mask=m, causal=True)

    y = torch.compile(f, fullgraph=True)(x, keep)
    both = keep & torch.ones(6, 6, dtype=torch.bool).tril()
    want = torch.softmax((x * 0.5).masked_fill(~both, float("-inf")), -1)
    torch.testing.assert_close(y, want, rtol=2e-5, atol=1e-6)
