"""The torch bridge's launch path (torch_launch): every row op and dtype
against torch's own kernels, odd and strided shapes, empty tensors, errors,
cross-entropy. Skipped where torch is not installed; CUDA cases skip
without a CUDA device. The extension is built once (cached across runs)."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (extra [torch])")
tl = pytest.importorskip("max_softmax.torch._launch")
from max_softmax import launch  # noqa: E402
from max_softmax.reference import (  # noqa: E402
    backward_error_scale,
    compare,
    compare_cross_entropy,
    cross_entropy_reference,
)

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
CUDAS = [f"cuda:{i}" for i in range(torch.cuda.device_count())] or [
    pytest.param("cuda:0", marks=CUDA)
]
"""Every CUDA device torch sees (one skipped case where there is none)."""
DEVICES = ["cpu", *CUDAS]
DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64]
# (outer, n, inner): one element, odd rows, a vocabulary row, along a
# non-last axis (inner > 1: the strided kernels).
SHAPES = [(1, 1, 1), (3, 1000, 1), (4, 50257, 1), (2, 7, 5), (3, 129, 4)]


@pytest.fixture(scope="module", autouse=True)
def extension():
    """Build (or find in the cache) and load the extension once."""
    return tl.extension()


def _np(t: torch.Tensor) -> np.ndarray:
    """`t` as a numpy array of the same dtype (bfloat16 through ml_dtypes)."""
    t = t.detach().cpu()
    if t.dtype == torch.bfloat16:
        import ml_dtypes

        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


def _inputs(shape, dtype, device, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = (torch.randn(shape, generator=gen, dtype=torch.float64) * 3).to(device, dtype)
    dy = torch.randn(shape, generator=gen, dtype=torch.float64).to(device, dtype)
    return x, dy


def _assert_ok(c, what):
    assert c.ok, (
        f"{what}: max_abs_err={c.max_abs_err:.3g} max_rel_err={c.max_rel_err:.3g} "
        f"nan_mismatches={c.nan_mismatches} (rtol={c.rtol}, atol={c.atol})"
    )


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
def test_forward_matches_torch(op, shape, dtype, device):
    x, _ = _inputs(shape, dtype, device)
    out = torch.empty_like(x)
    tl.run(op, out, x, outer=shape[0], n=shape[1], inner=shape[2])
    ref = getattr(torch, op)(x.double(), dim=1)
    _assert_ok(compare(op, _np(out), _np(x), 1, ref=_np(ref)), f"{op} {dtype} {shape}")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("op", ["softmax_backward", "log_softmax_backward"])
def test_backward_matches_torch(op, shape, dtype, device):
    """dx from the forward's output in `dtype` against torch's own backward
    kernel of the same (a, dy) in float64, judged relative to the terms dx
    subtracts (reference.backward_error_scale)."""
    x, dy = _inputs(shape, dtype, device)
    forward = op.removesuffix("_backward")
    a = getattr(torch, forward)(x.double(), dim=1).to(dtype)
    dx = torch.empty_like(a)
    tl.run(op, dx, a, dy, outer=shape[0], n=shape[1], inner=shape[2])
    torch_backward = (
        torch._softmax_backward_data if forward == "softmax" else torch._log_softmax_backward_data
    )
    ref = torch_backward(dy.double(), a.double(), 1, torch.float64)
    scale = backward_error_scale(op, _np(a), _np(dy), 1)
    c = compare(op, _np(dx), _np(a), 1, ref=_np(ref), scale=scale)
    _assert_ok(c, f"{op} {dtype} {shape}")


@pytest.mark.parametrize("device", DEVICES)
def test_autograd_chain_matches_torch(device):
    """The forward's output fed to the backward, as the bridge's autograd
    Function does, against torch.autograd end to end."""
    x, dy = _inputs((5, 300, 1), torch.float32, device, seed=1)
    y = torch.empty_like(x)
    dx = torch.empty_like(x)
    tl.run("log_softmax", y, x, outer=5, n=300, inner=1)
    tl.run("log_softmax_backward", dx, y, dy, outer=5, n=300, inner=1)
    xr = x.double().requires_grad_()
    torch.log_softmax(xr, dim=1).backward(dy.double())
    torch.testing.assert_close(dx.double(), xr.grad, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dims", [(0, 5, 1), (3, 0, 1), (3, 5, 0)], ids=str)
def test_empty_does_nothing(dims, device):
    out = torch.full(dims, 7.0, device=device)
    x = torch.empty(dims, device=device)
    tl.run("softmax", out, x, outer=dims[0], n=dims[1], inner=dims[2])
    tl.run("softmax_backward", out, out, out, outer=dims[0], n=dims[1], inner=dims[2])
    assert (out == 7.0).all()


def test_unaligned_view():
    """A view 4 bytes into its storage (the kernels must not assume 16-byte
    alignment)."""
    flat = torch.randn(2 * 3 * 1001 + 1)
    x = flat[1 : 1 + 3 * 1001].view(3, 1001)
    out = torch.empty(3 * 1001 + 1)[1:].view(3, 1001)
    tl.run("softmax", out, x, outer=3, n=1001, inner=1)
    torch.testing.assert_close(out, torch.softmax(x, dim=-1))


def test_threads():
    """Calls from several threads at once, small ones (which keep the GIL)
    and large ones (which release it while the kernel runs)."""
    from conftest import run_in_threads

    def worker(i: int) -> None:
        for rows in (2, 512, 3):
            x = torch.randn(
                rows, 257, dtype=torch.float64, generator=torch.Generator().manual_seed(i)
            )
            out = torch.empty_like(x)
            tl.run("softmax", out, x, outer=rows, n=257, inner=1)
            torch.testing.assert_close(out, torch.softmax(x, dim=-1))

    run_in_threads(worker, 6)


def test_errors_surface_as_exceptions():
    x = torch.randn(2, 3)
    with pytest.raises(ValueError, match="no launch for op"):
        tl.run("softplus", x, x, outer=2, n=3, inner=1)
    with pytest.raises(TypeError, match="int32"):
        xi = torch.ones(2, 3, dtype=torch.int32)
        tl.run("softmax", xi, xi, outer=2, n=3, inner=1)
    # Raised inside Mojo, handed back as a Python exception.
    with pytest.raises(tl.LaunchError, match="negative dims"):
        tl.run("softmax", x, x, outer=-2, n=-3, inner=1)
    ext = tl.extension()
    with pytest.raises(Exception, match="unknown dtype code 9"):
        ext.softmax(launch.cpu_context(), None, 9, x.data_ptr(), x.data_ptr(), 2, 3, 1)
    with pytest.raises(Exception, match="null device context"):
        ext.softmax(0, None, 0, x.data_ptr(), x.data_ptr(), 2, 3, 1)


@pytest.mark.skipif(launch.target_accelerator() is not None, reason="the build has a GPU target")
def test_cpu_only_build_refuses_a_gpu_launch():
    x = torch.randn(2, 3)
    with pytest.raises(Exception, match="without a GPU target"):
        launch.extension().softmax(launch.cpu_context(), 0, 0, x.data_ptr(), x.data_ptr(), 2, 3, 1)


def test_graph_fallback_switch(monkeypatch):
    """MAX_SOFTMAX_LAUNCH=graph turns the launch path off (the torch bridge
    and the array functions keep Model.execute); "auto" (the default) and
    "extension" launch, "auto" building for CUDA in the background; any
    other value is refused. MAX_SOFTMAX_TORCH_LAUNCH, its older name, is
    read where the new one is not set."""
    import importlib

    try:
        monkeypatch.setenv("MAX_SOFTMAX_LAUNCH", "graph")
        importlib.reload(launch)
        assert not launch.ENABLED and not launch.available()
        assert not launch.available_for_arrays()
        monkeypatch.delenv("MAX_SOFTMAX_LAUNCH")
        importlib.reload(launch)
        assert launch.available() and launch.CUDA_ENABLED and launch.BUILD_IN_BACKGROUND
        monkeypatch.setenv("MAX_SOFTMAX_TORCH_LAUNCH", "extension")
        importlib.reload(launch)
        assert launch.available() and launch.CUDA_ENABLED and not launch.BUILD_IN_BACKGROUND
        monkeypatch.setenv("MAX_SOFTMAX_LAUNCH", "graph")  # the new name wins
        importlib.reload(launch)
        assert not launch.ENABLED
        monkeypatch.setenv("MAX_SOFTMAX_LAUNCH", "fast")
        with pytest.raises(ValueError, match="MAX_SOFTMAX_LAUNCH"):
            importlib.reload(launch)
    finally:
        monkeypatch.delenv("MAX_SOFTMAX_LAUNCH", raising=False)
        monkeypatch.delenv("MAX_SOFTMAX_TORCH_LAUNCH", raising=False)
        importlib.reload(launch)
        importlib.reload(tl)  # its LaunchError and re-exports: the reloaded module's
    assert launch.ENABLED and launch.available()


def test_cuda_build_in_background(monkeypatch, tmp_path):
    """Under "auto", a CUDA call that finds no built extension starts the
    build on a thread and returns at once (the graph path meanwhile), and
    every call while it builds does too; once it is loaded the bridge
    launches."""
    import threading

    gate, module = threading.Event(), object()

    def slow_extension():
        gate.wait(30)
        launch._module = module
        return module

    monkeypatch.setattr(launch, "_module", None)
    monkeypatch.setattr(launch, "_failure", None)
    monkeypatch.setattr(launch, "_builder", None)
    monkeypatch.setattr(launch, "CUDA_ENABLED", True)
    monkeypatch.setattr(launch, "BUILD_IN_BACKGROUND", True)
    monkeypatch.setattr(launch, "extension_path", lambda: tmp_path / "missing.so")
    monkeypatch.setattr(launch, "extension", slow_extension)
    assert not launch.available(cuda=True)
    builder = launch._builder
    assert builder is not None and builder.is_alive()
    assert not launch.available(cuda=True) and not launch.available()
    assert launch._builder is builder  # one build, however many calls
    gate.set()
    builder.join(30)
    assert launch.available(cuda=True) and launch.available()


def test_failed_build_falls_back_once(monkeypatch, tmp_path, capsys):
    """Where the extension cannot be built, available() is False (the bridge
    keeps Model.execute), the failure is announced once, and extension()
    raises it."""

    def fail(target):
        raise tl.LaunchError("max_softmax: no compiler here")

    monkeypatch.delenv("MAX_SOFTMAX_QUIET", raising=False)
    monkeypatch.setattr(launch, "_module", None)
    monkeypatch.setattr(launch, "_failure", None)
    monkeypatch.setattr(launch, "_announced", False)
    monkeypatch.setattr(launch, "extension_path", lambda: tmp_path / "missing.so")
    monkeypatch.setattr(launch, "_build", fail)
    assert not launch.available() and not launch.available()
    assert capsys.readouterr().err.count("no compiler here") == 1
    with pytest.raises(tl.LaunchError, match="no compiler here"):
        launch.extension()


# Cross-entropy's extended options (class weights?, z_loss, softcap): off
# (the plain kernels), and on (the options kernels).
CE_EXTRAS = [
    pytest.param(False, 0.0, 0.0, id="plain"),
    pytest.param(False, 1e-3, 0.0, id="zloss"),
    pytest.param(True, 1e-3, 30.0, id="all"),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("with_grad", [True, False])
@pytest.mark.parametrize(("has_weight", "z_loss", "softcap"), CE_EXTRAS)
def test_cross_entropy_matches_reference(
    has_weight, z_loss, softcap, with_grad, reduction, dtype, device
):
    from max_softmax.torch._options import options_tensor

    rows, classes, ignore, eps = 37, 1000, 3, 0.1
    gen = torch.Generator().manual_seed(2)
    logits = (torch.randn(rows, classes, generator=gen, dtype=torch.float64) * 3).to(device, dtype)
    targets = torch.randint(0, classes, (rows,), generator=gen)
    targets[::5] = ignore
    targets = targets.to(device)
    weight = torch.rand(classes, generator=gen, dtype=torch.float64) + 0.2 if has_weight else None
    options = options_tensor(logits.device, ignore, eps, (weight, z_loss, softcap))
    loss = torch.empty((rows,) if reduction == "none" else (1,), dtype=dtype, device=device)
    dlogits = torch.empty_like(logits) if with_grad else None
    tl.cross_entropy(loss, dlogits, logits, targets, options, reduction)
    want_loss, want_grad = cross_entropy_reference(
        _np(logits),
        targets.cpu().numpy(),
        ignore,
        reduction,
        eps,
        weight=None if weight is None else weight.numpy(),
        z_loss=z_loss,
        softcap=softcap,
    )
    got_grad = _np(dlogits) if with_grad else want_grad
    ok, loss_err, grad_err = compare_cross_entropy(
        _np(loss).reshape(np.shape(want_loss)), got_grad, want_loss, want_grad, str(dtype)[6:]
    )
    assert ok, f"loss error {loss_err:.3g}, dlogits error {grad_err:.3g}"


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize(("has_weight", "z_loss", "softcap"), CE_EXTRAS)
def test_cross_entropy_compiles_no_graph_on_the_cpu(
    monkeypatch, has_weight, z_loss, softcap, reduction
):
    """The bridge's cross-entropy on the CPU, plain and under the extended
    options: forward, backward by an incoming gradient that is not 1, and
    `linear_cross_entropy`'s chunks, all through the extension (every
    model builder they could reach raises)."""
    import max_softmax.torch as mt
    import max_softmax.torch._cross_entropy as torch_ce
    import max_softmax.torch.linear as torch_linear

    def refuse(*args, **kwargs):
        raise AssertionError(f"a model was asked for: {args}")

    for module, name in [
        (torch_ce, "cross_entropy_into_model"),
        (torch_ce, "scale_rows_into_model"),
        (torch_linear, "cross_entropy_into_model"),
    ]:
        monkeypatch.setattr(module, name, refuse)
    launched = []
    real = launch.function

    def recording(name):
        fn = real(name)
        return lambda *args: (launched.append(name), fn(*args))[1]

    monkeypatch.setattr(launch, "function", recording)
    monkeypatch.setattr(torch_ce, "_plans", {})  # every launcher made here
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(6, 40, generator=gen, dtype=torch.float64, requires_grad=True)
    t = torch.randint(0, 40, (6,), generator=gen)
    weight = torch.rand(40, generator=gen, dtype=torch.float64) + 0.2 if has_weight else None
    kw = {"reduction": reduction, "z_loss": z_loss, "softcap": softcap}
    loss = mt.cross_entropy(x, t, weight, **kw)
    loss.backward(torch.full_like(loss, 2.0))
    want = x.grad.clone()
    x.grad = None
    mt.cross_entropy(x, t, weight, **kw).sum().backward()
    torch.testing.assert_close(x.grad * 2, want)
    h = x.detach().requires_grad_(True)
    lin = mt.linear_cross_entropy(
        h, torch.eye(40, dtype=torch.float64), t, class_weight=weight, **kw
    )
    lin.sum().backward()
    torch.testing.assert_close(lin, mt.cross_entropy(h.detach(), t, weight, **kw))
    assert len(launched) >= 4


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy_empty(reduction):
    logits = torch.empty(0, 10)
    loss = torch.empty((0,) if reduction == "none" else (1,))
    dlogits = torch.empty_like(logits)
    options = torch.tensor([-100, 0.0], dtype=torch.float64)
    tl.cross_entropy(loss, dlogits, logits, torch.empty(0, dtype=torch.int64), options, reduction)
    if reduction == "mean":
        assert torch.isnan(loss).all()
    elif reduction == "sum":
        assert loss.item() == 0.0


@pytest.mark.parametrize("device", CUDAS)
def test_cuda_stream_ordering(device):
    """A long torch op queued before the launch, and a consumer after it,
    on a non-default torch stream of each device: the launch sees the
    producer's result and the consumer sees the launch's."""
    side = torch.cuda.Stream(device=device)
    with torch.cuda.stream(side):
        big = torch.randn(4096, 4096, device=device)
        x = torch.empty(64, 4096, device=device)
        out = torch.empty_like(x)
        for _ in range(3):
            big @ big  # keeps the stream busy
            x.fill_(1.0)  # queued before the launch
            tl.run("softmax", out, x, outer=64, n=4096, inner=1)
            got = out * 4096  # queued after: must see 1/4096 * 4096
    torch.cuda.synchronize()
    torch.testing.assert_close(got, torch.ones_like(got))


@pytest.mark.parametrize("device", CUDAS)
def test_each_cuda_device_with_another_current(device):
    """A launch on cuda:N runs on MAX's context of GPU N (one context per
    device) and torch's stream there, whatever device is current."""
    index = int(device[5:])
    other = (index + 1) % torch.cuda.device_count()
    x, dy = _inputs((3, 1000, 1), torch.float32, device, seed=index)
    out, dx = torch.empty_like(x), torch.empty_like(x)
    with torch.cuda.device(other):
        tl.run("softmax", out, x, outer=3, n=1000, inner=1)
        tl.run("softmax_backward", dx, out, dy, outer=3, n=1000, inner=1)
    torch.testing.assert_close(out, torch.softmax(x, dim=1))
    want = torch._softmax_backward_data(dy.double(), out.double(), 1, torch.float64)
    torch.testing.assert_close(dx.double(), want, rtol=1e-4, atol=1e-6)
    contexts = {launch.gpu_context(i) for i in range(torch.cuda.device_count())}
    assert len(contexts) == torch.cuda.device_count()


def test_loading_leaves_child_processes_environment_alone():
    """Mojo's Python interop writes PYTHONEXECUTABLE, PYTHONPATH and the
    library path into the C environment as the extension loads; children
    would inherit them (a virtualenv's python then lost its packages).
    The loader puts them back."""
    import json
    import os
    import subprocess
    import sys

    launch.extension()
    code = "import json, os; print(json.dumps(dict(os.environ)))"
    child = json.loads(
        subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True
        ).stdout
    )
    for name in launch._ENV_SET_BY_MOJO:
        assert child.get(name) == os.environ.get(name), name


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize(
    ("scale", "mask_shape", "causal"),
    [(0.5, None, False), (None, (6, 33), True), (2.0, (2, 3, 6, 33), False)],
)
@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
def test_masked_launches(monkeypatch, op, scale, mask_shape, causal, dtype, device):
    """Scale, mask and causal go through the extension (no masked model),
    with the float64 reference's values."""
    import max_softmax.torch as mt
    from max_softmax import models
    from max_softmax.reference import masked_reference

    def refuse(*args, **kwargs):
        raise AssertionError("a masked model was built")

    monkeypatch.setattr(models, "masked_into_model", refuse)
    monkeypatch.setattr("max_softmax.torch._masked.masked_into_model", refuse)
    x, _ = _inputs((2, 3, 6, 33), dtype, device)
    gen = torch.Generator().manual_seed(1)
    mask = None
    if mask_shape is not None:
        mask = (torch.rand(mask_shape, generator=gen) < 0.7).to(device)
    y = getattr(mt, op)(x, -1, scale=scale, mask=mask, causal=causal)
    m = None if mask is None else mask.cpu().numpy()
    want = masked_reference(op, _np(x), scale=scale, mask=m, causal=causal)
    _assert_ok(compare(op, _np(y), _np(x), -1, ref=want), f"{op} {dtype} {device}")


def test_masked_launch_entry_errors():
    """The masked entry refuses bad flags and mask rows with an exception."""
    ext = tl.extension()
    x = torch.zeros(2, 3)
    opts = torch.ones(1, dtype=torch.float64)
    args = (x.data_ptr(), x.data_ptr(), x.data_ptr(), opts.data_ptr(), 1, 2, 3)
    with pytest.raises(Exception, match="masked flags"):
        ext.softmax_masked(launch.cpu_context(), None, 0, 7, *args, 1)
    with pytest.raises(Exception, match="mask_rows"):
        ext.softmax_masked(launch.cpu_context(), None, 0, 1, *args, 0)


@pytest.mark.parametrize(
    ("n_options", "message"),
    [
        (1, "at least 2 values, got 1"),
        (3, "options must hold 4 values"),
        (9, "options must hold 4 values"),
    ],
)
def test_cross_entropy_entry_refuses_bad_options(n_options, message):
    """The cross-entropy entry refuses options of a length that is neither
    the plain (2) nor an extended one (4-7 with hints; 3 classes weighted:
    11-14, op/cross_entropy_math.mojo `extended_layout`)."""
    ext = tl.extension()
    logits = torch.zeros(2, 3)
    loss = torch.empty(1)
    targets = torch.zeros(2, dtype=torch.int64)
    options = torch.zeros(8, dtype=torch.float64)
    addresses = [t.data_ptr() for t in (loss, logits, logits, targets, options)]
    with pytest.raises(Exception, match=message):
        ext.cross_entropy(launch.cpu_context(), None, 0, 0, *addresses, n_options, 2, 3)
