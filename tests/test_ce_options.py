"""Cross-entropy's z_loss, softcap and class weights (issue 36 part 2)
against float64 references, composed with ignore_index, label_smoothing
and every reduction: numpy (CPU), MAX graphs (CPU), the torch bridge (CPU,
with gradients and float64 gradcheck), and the same on a GPU where there
is one (skipped here). numpy (CPU) and torch calls run twice (`path`):
through the launch extension, with every model builder refusing, and on
the graph path (MAX_SOFTMAX_LAUNCH=graph's).

The reference is `reference.cross_entropy_options_reference` (float64),
itself checked against torch's float64 F.cross_entropy (weights and
smoothing) and autograd (z-loss, softcap) first.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import DEVICES, GPU_SKIP

from max_softmax import arrays, cross_entropy_with_grad, launch
from max_softmax.reference import (
    compare_cross_entropy,
    cross_entropy_options_reference,
    cross_entropy_reference,
)

torch = pytest.importorskip("torch")

ROWS, CLASSES = 7, 33


@pytest.fixture(params=["launch", "graph"])
def path(request, monkeypatch) -> str:
    """The path numpy (CPU) and torch calls take: "launch", the launch
    extension, where every cross-entropy model builder raises (a call that
    would compile a graph fails); "graph", `Model.execute` of the op's
    models, as MAX_SOFTMAX_LAUNCH=graph or an extension not built yet."""
    import max_softmax.torch._cross_entropy as torch_ce
    import max_softmax.torch.linear as torch_linear

    enabled = request.param == "launch"
    monkeypatch.setattr(launch, "ENABLED", enabled)
    monkeypatch.setattr(launch, "CUDA_ENABLED", enabled)
    if not enabled:
        return request.param
    try:
        launch.extension()
    except launch.LaunchError as err:
        pytest.skip(f"the launch extension is not built here: {err}")

    def refuse(*args, **kwargs):
        raise AssertionError(f"a cross-entropy model was asked for: {args}")

    monkeypatch.setattr(arrays, "cross_entropy_model", refuse)
    monkeypatch.setattr(torch_ce, "cross_entropy_into_model", refuse)
    monkeypatch.setattr(torch_ce, "scale_rows_into_model", refuse)
    monkeypatch.setattr(torch_linear, "cross_entropy_into_model", refuse)
    return request.param


def _numpy_on(device: str, path: str) -> None:
    """Skip a numpy call on the GPU under "launch": numpy arrays launch on
    the CPU only (a GPU's take the graph path, tested under "graph")."""
    if device == "gpu" and path == "launch":
        pytest.skip("numpy arrays on a GPU take the graph path")


# (weight?, z_loss, softcap): each option alone and all together.
EXTRAS = [
    pytest.param(True, 0.0, None, id="weight"),
    pytest.param(False, 1e-2, None, id="zloss"),
    pytest.param(False, 0.0, 3.0, id="softcap"),
    pytest.param(True, 1e-2, 3.0, id="all"),
]
# (ignore_index, label_smoothing)
BASE = [pytest.param(-100, 0.0, id="plain"), pytest.param(2, 0.15, id="ignore+smooth")]
REDUCTIONS = ("mean", "sum", "none")
NP_DTYPES = {"float32": np.float32, "float64": np.float64}


def _inputs(ignore_index: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Logits (some large, to exercise the softcap), targets holding
    `ignore_index` where it is a class, and positive class weights."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((ROWS, CLASSES)) * 4
    t = rng.integers(0, CLASSES, ROWS)
    t[1] = ignore_index if ignore_index >= 0 else t[1]
    t[4] = ignore_index
    w = rng.uniform(0.2, 2.0, CLASSES)
    return x, t, w


def _torch_reference(x, t, w, ignore_index, eps, z_loss, softcap, reduction):
    """The loss and its gradient by torch autograd in float64: softcap by
    tanh, F.cross_entropy with torch's weights and smoothing, z-loss added
    per kept row and (mean) divided by torch's own normaliser."""
    xt = torch.tensor(x, requires_grad=True)
    tt = torch.tensor(t)
    wt = None if w is None else torch.tensor(w)
    y = softcap * torch.tanh(xt / softcap) if softcap else xt
    kw = {"weight": wt, "ignore_index": ignore_index, "label_smoothing": eps}
    rows = torch.nn.functional.cross_entropy(y, tt, reduction="none", **kw)
    kept = (tt != ignore_index).to(torch.float64)
    rows = rows + z_loss * torch.logsumexp(y, -1) ** 2 * kept
    if reduction == "none":
        loss = rows
    elif reduction == "sum":
        loss = rows.sum()
    else:
        # torch's mean: over the sum of w[t] of the kept rows; checked
        # against F.cross_entropy(reduction="mean") itself below.
        safe = torch.where(tt != ignore_index, tt, torch.zeros_like(tt))
        count = (kept * (1.0 if wt is None else wt[safe])).sum()
        loss = rows.sum() / count
        if not z_loss:
            torch.testing.assert_close(
                loss, torch.nn.functional.cross_entropy(y, tt, reduction="mean", **kw)
            )
    loss.sum().backward()
    return loss.detach().numpy(), xt.grad.numpy()


@pytest.mark.parametrize("ignore_index,eps", BASE)
@pytest.mark.parametrize("has_weight,z_loss,softcap", EXTRAS)
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_reference_matches_torch(ignore_index, eps, has_weight, z_loss, softcap, reduction):
    x, t, w = _inputs(ignore_index)
    w = w if has_weight else None
    want = _torch_reference(x, t, w, ignore_index, eps, z_loss, softcap, reduction)
    got = cross_entropy_options_reference(x, t, ignore_index, reduction, eps, w, z_loss, softcap)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(got[1], want[1], rtol=1e-12, atol=1e-12)


def _check(got_loss, got_grad, x, t, w, ignore_index, eps, z_loss, softcap, reduction, dtype):
    want = cross_entropy_reference(
        x, t, ignore_index, reduction, eps, weight=w, z_loss=z_loss, softcap=softcap
    )
    ok, loss_err, grad_err = compare_cross_entropy(
        np.asarray(got_loss, dtype=np.float64),
        np.asarray(got_grad, dtype=np.float64),
        want[0],
        want[1],
        dtype,
    )
    assert ok, (loss_err, grad_err)


# (dtype, reduction): every reduction in float64, the mean in float32 (a
# model each: compiles dominate the CPU run time).
NP_CASES = [("float64", r) for r in REDUCTIONS] + [("float32", "mean")]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype,reduction", NP_CASES)
@pytest.mark.parametrize("ignore_index,eps", BASE)
@pytest.mark.parametrize("has_weight,z_loss,softcap", EXTRAS)
def test_numpy(path, device, dtype, ignore_index, eps, has_weight, z_loss, softcap, reduction):
    """The numpy front door (one model per (op, dtype, reduction, device)
    serves every option and value; on the CPU the launch extension)."""
    _numpy_on(device, path)
    x, t, w = _inputs(ignore_index)
    w = w if has_weight else None
    logits = x.astype(NP_DTYPES[dtype])
    kw = {"weight": w, "z_loss": z_loss, "softcap": softcap, "device": device}
    loss, grad = cross_entropy_with_grad(
        logits, t, ignore_index=ignore_index, reduction=reduction, label_smoothing=eps, **kw
    )
    _check(loss, grad, logits, t, w, ignore_index, eps, z_loss, softcap, reduction, dtype)


@pytest.mark.parametrize("weight_kind", ["graph value", "array"])
def test_in_a_graph(weight_kind):
    """ops.cross_entropy_with_grad with every option in the user's own
    graph (CPU): symbolic rows, the weight a graph input or an array."""
    from max.driver import CPU, Buffer
    from max.dtype import DType
    from max.engine import InferenceSession
    from max.graph import DeviceRef, Graph, TensorType

    import max_softmax

    x, t, w = _inputs(2)
    types = [
        TensorType(DType.float64, ["rows", CLASSES], DeviceRef.CPU()),
        TensorType(DType.int64, ["rows"], DeviceRef.CPU()),
        TensorType(DType.float32, [CLASSES], DeviceRef.CPU()),
    ]
    kw = {"ignore_index": 2, "label_smoothing": 0.15, "z_loss": 1e-2, "softcap": 3.0}
    with Graph("ce", input_types=types, custom_extensions=[max_softmax.KERNELS]) as g:
        logits, targets, weight = (v.tensor for v in g.inputs)
        weight = weight if weight_kind == "graph value" else w.astype(np.float32)
        loss, dlogits = max_softmax.ops.cross_entropy_with_grad(
            logits, targets, weight=weight, **kw
        )
        g.output(loss, dlogits)
    model = InferenceSession(devices=[CPU()]).load(g)
    w32 = w.astype(np.float32)
    loss, dlogits = model.execute(*(Buffer.from_numpy(a) for a in (x, t, w32)))
    want = cross_entropy_options_reference(x, t, 2, "mean", 0.15, w32, 1e-2, 3.0)
    ok, *errs = compare_cross_entropy(loss.to_numpy(), dlogits.to_numpy(), *want, "float64")
    assert ok, errs


def _torch_case(device, dtype, ignore_index, has_weight, seed=0):
    x, t, w = _inputs(ignore_index, seed)
    where = "cuda" if device == "gpu" else "cpu"
    xt = torch.tensor(x, dtype=dtype, device=where, requires_grad=True)
    tt = torch.tensor(t, device=where)
    wt = torch.tensor(w, dtype=dtype, device=where) if has_weight else None
    return xt, tt, wt


TORCH_DTYPES = {
    "float64": torch.float64,
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}
# (dtype, reduction): every reduction in float64 (gradcheck too) and
# float32, the mean in 16 bits (a compiled model each on the CPU).
TORCH_CASES = (
    [("float64", r) for r in REDUCTIONS]
    + [("float32", r) for r in REDUCTIONS]
    + [("bfloat16", "mean"), ("float16", "sum")]
)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype,reduction", TORCH_CASES)
@pytest.mark.parametrize("ignore_index,eps", BASE)
@pytest.mark.parametrize("has_weight,z_loss,softcap", EXTRAS)
def test_torch(path, device, dtype, ignore_index, eps, has_weight, z_loss, softcap, reduction):
    """The torch bridge: loss and input gradient (backward with a
    non-trivial incoming gradient) against the float64 reference."""
    import max_softmax.torch as mst

    xt, tt, wt = _torch_case(device, TORCH_DTYPES[dtype], ignore_index, has_weight)
    kw = {"ignore_index": ignore_index, "label_smoothing": eps, "reduction": reduction}
    loss = mst.cross_entropy(xt, tt, wt, z_loss=z_loss, softcap=softcap, **kw)
    loss.sum().backward()
    x = xt.detach().double().cpu().numpy()
    w = None if wt is None else wt.double().cpu().numpy()
    _check(
        loss.detach().double().cpu().numpy(),
        xt.grad.double().cpu().numpy(),
        x,
        tt.cpu().numpy(),
        w,
        ignore_index,
        eps,
        z_loss,
        softcap,
        reduction,
        dtype,
    )


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("has_weight,z_loss,softcap", EXTRAS)
def test_torch_gradcheck(path, device, has_weight, z_loss, softcap, reduction):
    """float64 gradcheck and gradgradcheck (the second order by the torch-op
    gradient, `_cross_entropy._gradient`) with smoothing and ignored rows."""
    import max_softmax.torch as mst

    xt, tt, wt = _torch_case(device, torch.float64, 2, has_weight)
    xt = xt.detach()[:3, :9].clone().requires_grad_(True)
    tt = tt[:3] % 9
    wt = None if wt is None else wt[:9]
    kw = {"ignore_index": 2, "label_smoothing": 0.15, "reduction": reduction}

    def f(x):
        return mst.cross_entropy(x, tt, wt, z_loss=z_loss, softcap=softcap, **kw)

    assert torch.autograd.gradcheck(f, (xt,))
    assert torch.autograd.gradgradcheck(f, (xt,))


def test_errors():
    """Bad options get clear errors on every front door."""
    import max_softmax.torch as mst

    x, t, w = _inputs(-100)
    with pytest.raises(ValueError, match="z_loss must be a finite number >= 0"):
        cross_entropy_with_grad(x, t, z_loss=-1.0, device="cpu")
    with pytest.raises(TypeError, match="softcap must be a float"):
        cross_entropy_with_grad(x, t, softcap="3", device="cpu")
    with pytest.raises(ValueError, match="weight must have shape \\(33,\\)"):
        cross_entropy_with_grad(x, t, weight=w[:5], device="cpu")
    with pytest.raises(ValueError, match="weight must have shape \\(33,\\)"):
        mst.cross_entropy(torch.tensor(x), torch.tensor(t), torch.ones(3, 11))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("weight_as", ["array", "tensor"])
def test_eager(device, weight_as):
    """MAX eager Tensors: every option at once, the weight an array or a
    Tensor on the logits' device."""
    import max_softmax
    from max_softmax.devices import device as max_device
    from max_softmax.dtypes import to_buffer, to_numpy

    Tensor = pytest.importorskip("max.experimental.tensor").Tensor

    def to_tensor(a):
        return Tensor.from_dlpack(to_buffer(np.ascontiguousarray(a))).to(max_device(device))

    def back(t):
        return to_numpy(t.driver_tensor.to(max_device("cpu")))

    x, t, w = _inputs(2)
    kw = {"ignore_index": 2, "label_smoothing": 0.15, "z_loss": 1e-2, "softcap": 3.0}
    weight = w if weight_as == "array" else to_tensor(w)
    loss, dlogits = max_softmax.cross_entropy_with_grad(to_tensor(x), t, weight=weight, **kw)
    want = cross_entropy_options_reference(x, t, 2, "mean", 0.15, w, 1e-2, 3.0)
    ok, *errs = compare_cross_entropy(back(loss), back(dlogits), *want, "float64")
    assert ok, errs


@pytest.mark.parametrize("device", DEVICES)
def test_in_place(path, device):
    """out=logits: the gradient written over the logits (every option on)."""
    _numpy_on(device, path)
    x, t, w = _inputs(2)
    kw = {"ignore_index": 2, "label_smoothing": 0.15, "z_loss": 1e-2, "softcap": 3.0}
    want = cross_entropy_options_reference(x, t, 2, "sum", 0.15, w, 1e-2, 3.0)
    logits = x.copy()
    loss, grad = cross_entropy_with_grad(
        logits, t, weight=w, reduction="sum", device=device, out=logits, **kw
    )
    assert np.shares_memory(grad, logits)
    ok, *errs = compare_cross_entropy(loss, grad, *want, "float64")
    assert ok, errs


@GPU_SKIP
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_gpu_long_rows(dtype, reduction):
    """GPT-2's 50257 classes (unaligned rows) on the GPU, every option on."""
    from max_softmax.dtypes import DTYPE_NAMES

    rng = np.random.default_rng(1)
    x = (rng.standard_normal((64, 50257)) * 4).astype(DTYPE_NAMES[dtype])
    t = rng.integers(0, 50257, 64)
    t[3] = -100
    w = rng.uniform(0.2, 2.0, 50257)
    kw = {"label_smoothing": 0.1, "z_loss": 1e-4, "softcap": 30.0, "reduction": reduction}
    loss, grad = cross_entropy_with_grad(x, t, weight=w, device="gpu", **kw)
    _check(loss, grad, x, t, w, -100, 0.1, 1e-4, 30.0, reduction, dtype)


# (dtype, rows, classes) that reach the on-chip options kernel (at least 264
# rows with a gradient): a block a row, and a cluster of two past one SM's
# capacity (fp32 ~74K, 16-bit ~148K); odd lengths, so rows start unaligned.
ONCHIP = [
    pytest.param("float32", 300, 5003, id="fp32-block"),
    pytest.param("bfloat16", 300, 5003, id="bf16-block"),
    pytest.param("float64", 280, 4001, id="fp64-block"),
    pytest.param("float32", 300, 100003, id="fp32-pair"),
    pytest.param("bfloat16", 270, 160001, id="bf16-pair"),
]


def _launched_on_cuda(x, t, w, ignore_index, eps, z_loss, softcap, reduction, in_place):
    """(loss, dlogits) as float64 numpy arrays from the launch extension on
    CUDA tensors (the torch bridge's `_launch.cross_entropy`), dlogits
    written over the logits if `in_place`."""
    from max_softmax.torch import _launch as torch_launch
    from max_softmax.torch._options import options_tensor

    dtype = TORCH_DTYPES[x.dtype.name]
    # float64 holds every input dtype's values exactly (numpy's bfloat16 does
    # not convert to torch directly).
    logits = torch.tensor(x.astype(np.float64)).to("cuda", dtype)
    targets = torch.tensor(t, device="cuda")
    weight = None if w is None else torch.tensor(w, device="cuda")
    options = options_tensor(logits.device, ignore_index, eps, (weight, z_loss, softcap or 0.0))
    rows = logits.shape[0]
    loss = torch.empty((rows,) if reduction == "none" else (1,), dtype=dtype, device="cuda")
    dlogits = logits if in_place else torch.empty_like(logits)
    torch_launch.cross_entropy(loss, dlogits, logits, targets, options, reduction)
    got = loss.double().cpu().numpy()
    return got if reduction == "none" else got.reshape(()), dlogits.double().cpu().numpy()


@GPU_SKIP
@pytest.mark.parametrize("front", ["numpy", "torch"])
@pytest.mark.parametrize("dtype,rows,classes", ONCHIP)
@pytest.mark.parametrize("ignore_index,eps", BASE)
@pytest.mark.parametrize(
    "has_weight,z_loss,softcap",
    [*EXTRAS, pytest.param(True, 1e-2, None, id="weight+zloss")],
)
@pytest.mark.parametrize("reduction,in_place", [("mean", False), ("none", True)])
def test_gpu_on_chip_rows(
    front, dtype, rows, classes, ignore_index, eps, has_weight, z_loss, softcap, reduction, in_place
):
    """Many rows with a gradient take an on-chip kernel: the plain one with
    scalar terms where the options are z-loss and the target's weight alone
    (no softcap, no weighted smoothing), else its `OPTION_TERMS` form; a
    block or a pair a row, the gradient also written over the logits; numpy
    arrays by the op's model, torch tensors by the launch extension."""
    from max_softmax.dtypes import DTYPE_NAMES

    rng = np.random.default_rng(rows + classes)
    x = (rng.standard_normal((rows, classes)) * 4).astype(DTYPE_NAMES[dtype])
    t = rng.integers(0, classes, rows)
    t[1] = ignore_index if ignore_index >= 0 else t[1]
    t[5] = ignore_index
    w = rng.uniform(0.2, 2.0, classes) if has_weight else None
    if front == "torch":
        loss, grad = _launched_on_cuda(
            x, t, w, ignore_index, eps, z_loss, softcap, reduction, in_place
        )
        _check(loss, grad, x, t, w, ignore_index, eps, z_loss, softcap, reduction, dtype)
        return
    kw = {"ignore_index": ignore_index, "label_smoothing": eps, "z_loss": z_loss}
    logits = x.copy()
    loss, grad = cross_entropy_with_grad(
        logits,
        t,
        weight=w,
        softcap=softcap,
        reduction=reduction,
        device="gpu",
        out=logits if in_place else None,
        **kw,
    )
    _check(loss, grad, x, t, w, ignore_index, eps, z_loss, softcap, reduction, dtype)


# (logit scale, softcap): every |x / softcap| under 0.25, where the tanh
# takes its polynomial alone (Gemma's cap on normal logits); around 0.5,
# where vectors mix it with the exp form; saturated, tanh = +-1 and the
# chain factor ~0; a cap past SOFTCAP_AS_MAX, which folds the row's max
# first.
SOFTCAP_RANGES = [
    pytest.param(1.0, 30.0, id="tiny"),
    pytest.param(15.0, 30.0, id="mixed"),
    pytest.param(100.0, 3.0, id="saturated"),
    pytest.param(25.0, 50.0, id="long-cap"),
]


@GPU_SKIP
@pytest.mark.parametrize("dtype,rows,classes", ONCHIP)
@pytest.mark.parametrize("scale,softcap", SOFTCAP_RANGES)
@pytest.mark.parametrize("eps", [0.0, 0.1])
@pytest.mark.parametrize("has_weight", [False, True])
def test_gpu_on_chip_softcap_ranges(dtype, rows, classes, scale, softcap, eps, has_weight):
    """The on-chip options kernel's softcap over the tanh's ranges: without
    label smoothing sweep 2 holds exp(y - max) * (1 - tanh^2) (one tanh a
    logit), with it sweep 3 recomputes; the target's entry apart."""
    from max_softmax.dtypes import DTYPE_NAMES

    rng = np.random.default_rng(classes + int(scale))
    x = (rng.standard_normal((rows, classes)) * scale).astype(DTYPE_NAMES[dtype])
    t = rng.integers(0, classes, rows)
    t[5] = -100
    w = rng.uniform(0.2, 2.0, classes) if has_weight else None
    loss, grad = _launched_on_cuda(x, t, w, -100, eps, 1e-4, softcap, "mean", False)
    _check(loss, grad, x, t, w, -100, eps, 1e-4, softcap, "mean", dtype)


def test_inplace_backward_refuses_options():
    """The torch bridge's in-place backward takes the plain options only."""
    import max_softmax.torch as mst

    x = torch.randn(3, 5, requires_grad=True)
    with pytest.raises(NotImplementedError, match="inplace_backward=True"):
        mst.cross_entropy(x, torch.tensor([0, 1, 2]), z_loss=1e-3, inplace_backward=True)


def test_torch_compile_fullgraph():
    """torch.compile(fullgraph=True) traces the bridge with every option."""
    import max_softmax.torch as mst

    xt, tt, wt = _torch_case("cpu", torch.float64, 2, True)
    kw = {"ignore_index": 2, "label_smoothing": 0.15, "z_loss": 1e-2, "softcap": 3.0}
    f = torch.compile(
        lambda x, t: mst.cross_entropy(x, t, wt, **kw) * 2.0, fullgraph=True, backend="aot_eager"
    )
    loss = f(xt, tt)
    loss.backward()
    want = cross_entropy_options_reference(
        xt.detach().numpy(), tt.numpy(), 2, "mean", 0.15, wt.numpy(), 1e-2, 3.0
    )
    ok, *errs = compare_cross_entropy(
        loss.detach().numpy() / 2, xt.grad.numpy() / 2, *want, "float64"
    )
    assert ok, errs


@pytest.mark.parametrize("classes", [1, 3, 5])
@pytest.mark.parametrize("eps", [0.0, 0.1])
@pytest.mark.parametrize("has_weight,z_loss,softcap", EXTRAS)
def test_options_layout(classes, eps, has_weight, z_loss, softcap):
    """The options' length tells weights from hints for any class count
    (op/cross_entropy_math.mojo `extended_layout`): unweighted 4-7,
    weighted 8 + V + hints; a hint only where its term is off."""
    from max_softmax.validation import cross_entropy_hints, cross_entropy_options

    weight = np.linspace(0.5, 1.5, classes) if has_weight else None
    options = cross_entropy_options(-100, eps, z_loss, softcap or 0.0, weight)
    hints = cross_entropy_hints(eps, softcap or 0.0, has_weight)
    assert (hints & 1) == (softcap is None)
    assert (hints & 2 != 0) == (not (has_weight and eps != 0.0))
    if has_weight:
        assert len(options) == 8 + classes + hints
        np.testing.assert_array_equal(options[4 : 4 + classes], weight)
        assert not options[4 + classes :].any()
    else:
        assert 4 <= len(options) == 4 + hints <= 7
    assert list(options[:4]) == [-100, eps, z_loss, softcap or 0.0]


def test_options_old_weighted_layout_refused():
    """Weights without their mark (the layout before the hints) are an
    error, not weights read as hints."""
    from max_softmax.arrays import _execute
    from max_softmax.dtypes import max_dtype
    from max_softmax.models import cross_entropy_model

    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 9)).astype(np.float32)
    t = rng.integers(0, 9, 4)
    old = np.concatenate([[-100.0, 0.0, 0.01, 0.0], np.ones(9)])
    model = cross_entropy_model(True, max_dtype(x.dtype), "cpu", "mean")
    with pytest.raises(Exception, match="options must hold"):
        _execute(model, [x, t, old], "cpu")
