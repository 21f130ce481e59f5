"""Cross-entropy against class probabilities (soft targets, issue #37): the
fused soft_cross_entropy op against float64 references, over dtype,
reduction, label smoothing, class weights and z-loss: numpy (CPU through
the launch extension, no graph compiled; the graph path; a GPU where there
is one) and the torch bridge (values and first- and second-order
gradients against float64 `F.cross_entropy`, the unfused path where a
gradient in the target is asked for).

The reference is `reference.soft_cross_entropy_reference` (float64), itself
checked against torch's float64 F.cross_entropy first.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import DEVICES, GPU_SKIP, random_logits

import max_softmax
from max_softmax import arrays, launch
from max_softmax.dtypes import DTYPE_NAMES
from max_softmax.reference import compare_cross_entropy, soft_cross_entropy_reference

torch = pytest.importorskip("torch")
F = torch.nn.functional

REDUCTIONS = ("mean", "sum", "none")
DTYPES = ("float32", "float64", "bfloat16", "float16")
TORCH_DTYPES = {
    "float32": torch.float32,
    "float64": torch.float64,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}
# (label_smoothing, weight?, z_loss)
OPTIONS = [
    pytest.param(0.0, False, 0.0, id="plain"),
    pytest.param(0.2, False, 0.0, id="smooth"),
    pytest.param(0.0, True, 0.0, id="weight"),
    pytest.param(0.0, False, 1e-2, id="zloss"),
    pytest.param(0.1, True, 1e-2, id="all"),
]
# Rows longer than the GPU's on-chip capacity for two tensors (the block
# a row's second sweep re-reads them).
LONG_ROW = 300_000


def _probs(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """Random class probabilities along the last axis (rows sum to 1)."""
    e = rng.random(shape) ** 3
    return e / e.sum(axis=-1, keepdims=True)


def _weight(rng: np.random.Generator, classes: int, on: bool) -> np.ndarray | None:
    return rng.uniform(0.2, 2.0, classes) if on else None


@pytest.fixture
def no_graphs(monkeypatch):
    """The launch extension is on and built, and every model builder
    raises: a call that would compile a graph fails."""
    monkeypatch.setattr(launch, "ENABLED", True)
    try:
        launch.extension()
    except launch.LaunchError as err:
        pytest.skip(f"the launch extension is not built here: {err}")

    def refuse(*args, **kwargs):
        raise AssertionError(f"a graph was asked for: {args}")

    monkeypatch.setattr(max_softmax.models, "compiled", refuse)
    monkeypatch.setattr(arrays, "soft_cross_entropy_model", refuse)


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize(("eps", "weighted", "z_loss"), OPTIONS[:3])
def test_reference_is_torchs(rng, reduction, eps, weighted, z_loss):
    """The float64 reference is torch's F.cross_entropy (and its autograd)
    with probability targets."""
    x = rng.standard_normal((6, 11)) * 3
    p = _probs(rng, x.shape)
    w = _weight(rng, 11, weighted)
    xt = torch.tensor(x, requires_grad=True)
    wt = None if w is None else torch.tensor(w)
    loss = F.cross_entropy(xt, torch.tensor(p), weight=wt, reduction=reduction, label_smoothing=eps)
    loss.sum().backward()
    want_loss, want_grad = soft_cross_entropy_reference(x, p, reduction, eps, w)
    np.testing.assert_allclose(want_loss, loss.detach().numpy(), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(want_grad, xt.grad.numpy(), rtol=1e-12, atol=1e-12)


def _numpy_case(rng, dtype, shape, eps, weighted):
    x = random_logits(rng, shape, dtype)
    p = _probs(rng, shape).astype(x.dtype)
    return x, p, _weight(rng, shape[-1], weighted)


def _check_numpy(got_loss, got_grad, x, p, reduction, eps, w, z_loss, dtype):
    want_loss, want_grad = soft_cross_entropy_reference(x, p, reduction, eps, w, z_loss)
    ok, loss_err, grad_err = compare_cross_entropy(got_loss, got_grad, want_loss, want_grad, dtype)
    assert ok, (loss_err, grad_err)
    assert got_loss.dtype == x.dtype and got_grad.dtype == x.dtype


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize(("eps", "weighted", "z_loss"), OPTIONS)
@pytest.mark.parametrize("shape", [(7, 33), (2, 3, 65), (129,)], ids=["2d", "3d", "1d"])
def test_numpy_cpu_launch_compiles_no_graph(
    rng, no_graphs, dtype, reduction, eps, weighted, z_loss, shape
):
    x, p, w = _numpy_case(rng, dtype, shape, eps, weighted)
    kwargs = dict(reduction=reduction, label_smoothing=eps, weight=w, z_loss=z_loss, device="cpu")
    loss, grad = max_softmax.cross_entropy_with_grad(x, p, **kwargs)
    _check_numpy(loss, grad, x, p, reduction, eps, w, z_loss, dtype)
    alone = max_softmax.cross_entropy(x, p, **kwargs)
    np.testing.assert_array_equal(alone, loss)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize(("eps", "weighted", "z_loss"), [OPTIONS[0], OPTIONS[-1]])
def test_numpy_graph_path(monkeypatch, rng, device, dtype, reduction, eps, weighted, z_loss):
    """The op's MAX model (a GPU's numpy call, or MAX_SOFTMAX_LAUNCH=graph)."""
    monkeypatch.setattr(launch, "ENABLED", False)
    x, p, w = _numpy_case(rng, dtype, (5, 40), eps, weighted)
    kwargs = dict(reduction=reduction, label_smoothing=eps, weight=w, z_loss=z_loss)
    loss, grad = max_softmax.cross_entropy_with_grad(x, p, device=device, **kwargs)
    _check_numpy(loss, grad, x, p, reduction, eps, w, z_loss, dtype)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("n", [pytest.param(n, id=f"gpu-{n}") for n in (1000, 50_257, LONG_ROW)])
@GPU_SKIP
def test_numpy_gpu_rows(rng, dtype, n):
    """GPU rows short, on chip and past it."""
    x, p, w = _numpy_case(rng, dtype, (3, n), 0.1, True)
    loss, grad = max_softmax.cross_entropy_with_grad(
        x, p, label_smoothing=0.1, weight=w, z_loss=1e-3, device="gpu"
    )
    _check_numpy(loss, grad, x, p, "mean", 0.1, w, 1e-3, dtype)


@GPU_SKIP
@pytest.mark.parametrize(
    ("dtype", "shape"),
    [
        pytest.param("float32", (300, 20001), id="gpu-smem-512-unaligned"),
        pytest.param("bfloat16", (264, 32000), id="gpu-smem-aligned"),
        pytest.param("float16", (64, 70001), id="gpu-smem-1024"),
        pytest.param("float64", (64, 15001), id="gpu-smem-f64"),
        pytest.param("float32", (8, 40000), id="gpu-block-past-smem"),
    ],
)
def test_numpy_gpu_on_chip_and_past(rng, dtype, shape):
    x, p, w = _numpy_case(rng, dtype, shape, 0.1, True)
    for reduction in REDUCTIONS:
        loss, grad = max_softmax.cross_entropy_with_grad(
            x, p, reduction=reduction, label_smoothing=0.1, weight=w, device="gpu"
        )
        _check_numpy(loss, grad, x, p, reduction, 0.1, w, 0.0, dtype)


def test_gpu_kernels_compile(tmp_path):
    """Every soft-target GPU kernel compiles for the H100 (sm_90) without
    a GPU (tests/gpu_soft_targets_check.mojo launches each)."""
    from pathlib import Path

    from test_gpu_build import _build

    check = Path(__file__).resolve().parent / "gpu_soft_targets_check.mojo"
    _build(tmp_path / "check", source=check)


def test_numpy_checks(rng):
    x = random_logits(rng, (4, 5), "float32")
    with pytest.raises(ValueError, match="shaped as the input"):
        max_softmax.cross_entropy(x, np.ones((4, 6), np.float32))
    with pytest.raises(NotImplementedError, match="softcap"):
        max_softmax.cross_entropy(x, _probs(rng, (4, 5)).astype(np.float32), softcap=3.0)


def test_numpy_empty_rows():
    x = np.zeros((0, 5), np.float32)
    assert np.isnan(max_softmax.cross_entropy(x, x))
    assert max_softmax.cross_entropy(x, x, reduction="sum") == 0


# ---------------------------------------------------------------------------
# torch
# ---------------------------------------------------------------------------


def _torch_case(rng, dtype, shape, eps, weighted, device="cpu"):
    """(x, p, weight) as torch tensors of `dtype` (the weight float32),
    classes on dim 1 (dim 0 for 1-D)."""
    x = random_logits(rng, shape, "float64")
    dim = 0 if len(shape) == 1 else 1
    e = rng.random(shape) ** 3
    p = e / e.sum(axis=dim, keepdims=True)
    w = _weight(rng, shape[dim], weighted)
    t = TORCH_DTYPES[dtype]
    return (
        torch.tensor(x, dtype=t, device=device),
        torch.tensor(p, dtype=t, device=device),
        None if w is None else torch.tensor(w, dtype=torch.float32, device=device),
    )


def _torch_loss64(x64, p, w, reduction, eps, z_loss):
    """Float64 F.cross_entropy (plus z_loss lse^2 a row, classes on dim 1,
    inside the reduction) of float64 `x64`, differentiable in it."""
    p64 = p.detach().double().cpu()
    w64 = None if w is None else w.double().cpu()
    loss = F.cross_entropy(x64, p64, weight=w64, reduction="none", label_smoothing=eps)
    if z_loss:
        loss = loss + z_loss * torch.logsumexp(x64, 0 if x64.dim() == 1 else 1) ** 2
    return {"mean": loss.mean, "sum": loss.sum, "none": lambda: loss}[reduction]()


def _torch_reference(x, p, w, reduction, eps, z_loss, upstream=None):
    """The float64 loss and its gradient in x (of sum(loss * upstream))."""
    x64 = x.detach().double().cpu().requires_grad_(True)
    loss = _torch_loss64(x64, p, w, reduction, eps, z_loss)
    weights = torch.ones_like(loss) if upstream is None else upstream.double().cpu()
    (g,) = torch.autograd.grad((loss * weights).sum(), x64)
    return loss.detach(), g


def _assert_close(got, want, dtype):
    tol = {"float64": 1e-10, "float32": 2e-5, "float16": 2e-3, "bfloat16": 1.6e-2}[dtype]
    got = got.detach().double().cpu()
    size = float(want.abs().max()) if want.numel() else 1.0
    torch.testing.assert_close(got, want, rtol=tol, atol=tol * size)


@pytest.fixture
def fused_only(monkeypatch, no_graphs):
    """`no_graphs`, and the torch bridge's unfused path raises: a torch
    call takes the fused op through the launch extension."""
    import max_softmax.torch._cross_entropy as torch_ce

    def refuse(*args, **kwargs):
        raise AssertionError(f"not the fused launch: {args}")

    monkeypatch.setattr(torch_ce, "_soft_cross_entropy_unfused", refuse)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize(("eps", "weighted", "z_loss"), OPTIONS)
@pytest.mark.parametrize("shape", [(6, 40), (3, 17, 4), (50,)], ids=["NC", "NCd1", "C"])
def test_torch_fused_values_and_gradients(
    rng, fused_only, dtype, reduction, eps, weighted, z_loss, shape
):
    from max_softmax.torch import cross_entropy

    x, p, w = _torch_case(rng, dtype, shape, eps, weighted)
    x.requires_grad_(True)
    loss = cross_entropy(x, p, weight=w, reduction=reduction, label_smoothing=eps, z_loss=z_loss)
    upstream = torch.rand(loss.shape, dtype=torch.float64) + 0.5
    want_loss, want_grad = _torch_reference(x, p, w, reduction, eps, z_loss, upstream)
    assert loss.dtype == x.dtype and loss.shape == want_loss.shape
    _assert_close(loss, want_loss, dtype)
    (g,) = torch.autograd.grad(loss, x, upstream.to(loss.dtype))
    _assert_close(g, want_grad, dtype)


def test_torch_no_grad_and_retain_graph(rng, fused_only):
    from max_softmax.torch import cross_entropy

    x, p, w = _torch_case(rng, "float64", (5, 9), 0.0, True)
    with torch.no_grad():
        plain = cross_entropy(x, p, weight=w)
    x.requires_grad_(True)
    loss = cross_entropy(x, p, weight=w)
    torch.testing.assert_close(loss.detach(), plain)
    loss.backward(retain_graph=True)
    first = x.grad.clone()
    loss.backward()
    torch.testing.assert_close(x.grad, 2 * first)


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_torch_second_order(rng, reduction):
    """create_graph: the gradient recomputed with torch ops is itself
    differentiable (float64 gradgradcheck)."""
    from max_softmax.torch import cross_entropy

    x, p, w = _torch_case(rng, "float64", (4, 7), 0.1, True)
    x.requires_grad_(True)

    def f(x):
        return cross_entropy(x, p, weight=w, reduction=reduction, label_smoothing=0.1, z_loss=0.01)

    assert torch.autograd.gradgradcheck(f, (x,))


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_torch_target_gradient_takes_the_unfused_path(rng, dtype):
    """A target that requires grad gets torch's gradient in it too."""
    from max_softmax.torch import cross_entropy

    x, p, _ = _torch_case(rng, dtype, (5, 8), 0.0, False)
    x.requires_grad_(True)
    p.requires_grad_(True)
    cross_entropy(x, p, label_smoothing=0.1).backward()
    x2 = x.detach().clone().requires_grad_(True)
    p2 = p.detach().clone().requires_grad_(True)
    F.cross_entropy(x2, p2, label_smoothing=0.1).backward()
    torch.testing.assert_close(p.grad, p2.grad)
    torch.testing.assert_close(x.grad, x2.grad)


def test_torch_forward_mode_and_softcap_stay_unfused(rng):
    from max_softmax.torch import cross_entropy

    x, p, _ = _torch_case(rng, "float64", (3, 6), 0.0, False)
    t = torch.randn_like(x)
    with torch.autograd.forward_ad.dual_level():
        dual = torch.autograd.forward_ad.make_dual(x, t)
        out = torch.autograd.forward_ad.unpack_dual(cross_entropy(dual, p)).tangent
    x2 = x.clone().requires_grad_(True)
    (g,) = torch.autograd.grad(F.cross_entropy(x2, p), x2)
    torch.testing.assert_close(out, (g * t).sum())
    capped = cross_entropy(x, p, softcap=2.0)
    torch.testing.assert_close(capped, F.cross_entropy(2.0 * torch.tanh(x / 2.0), p))


CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")


@CUDA
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize(
    "shape", [pytest.param(s, id=f"cuda-{s[1]}") for s in ((64, 1000), (4, 50_257), (2, LONG_ROW))]
)
def test_torch_cuda(rng, dtype, shape):
    from max_softmax.torch import cross_entropy

    x, p, w = _torch_case(rng, dtype, shape, 0.1, True, device="cuda")
    x.requires_grad_(True)
    loss = cross_entropy(x, p, weight=w, label_smoothing=0.1, z_loss=1e-3)
    want_loss, want_grad = _torch_reference(x, p, w, "mean", 0.1, 1e-3)
    _assert_close(loss, want_loss, dtype)
    (g,) = torch.autograd.grad(loss, x)
    _assert_close(g, want_grad, dtype)


def test_dtype_names_cover_the_tested_dtypes():
    assert set(DTYPES) <= set(DTYPE_NAMES)
