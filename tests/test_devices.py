"""Any device: device names ("cpu", "gpu", "gpu:N"), their errors, and every
front door on every visible GPU.

The parsing and error tests run anywhere (a GPU count is stood in where
they need one). The GPU tests run once per GPU MAX sees (numpy and MAX
graphs, `device="gpu:N"`) and once per CUDA device torch sees (the torch
bridge on `cuda:N`: the launch extension, MAX graphs, replay); they skip
where there is none.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import assert_matches_scipy, random_logits
from max.dtype import DType
from max.graph import DeviceRef, Graph, TensorType

import max_softmax
from max_softmax import devices, launch
from max_softmax.models import ModelKey
from max_softmax.reference import (
    compare_backward,
    compare_cross_entropy,
    cross_entropy_reference,
    masked_reference,
    reference,
)

NO_GPU = pytest.mark.skipif(devices.gpu_count() == 0, reason="no GPU: MAX finds no accelerator")
GPUS = [f"gpu:{i}" for i in range(devices.gpu_count())] or [pytest.param("gpu:0", marks=NO_GPU)]
"""Every GPU MAX sees, by device name (one skipped case where there is none)."""


@pytest.fixture
def gpus(monkeypatch):
    """Stand in `count` GPUs for the device checks: `gpus(2)`."""

    def stand_in(count: int) -> None:
        monkeypatch.setattr(devices, "gpu_count", lambda: count)

    return stand_in


# ---------------------------------------------------------------------------
# Names, anywhere
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name,want",
    [
        ("auto", "gpu"),
        ("cpu", "cpu"),
        ("gpu", "gpu"),
        ("gpu:0", "gpu"),
        ("gpu:1", "gpu:1"),
        ("gpu:2", "gpu:2"),
    ],
)
def test_resolve_device_names(gpus, name, want):
    """ "gpu" is "gpu:0", spelled "gpu"; "auto" takes the first GPU."""
    gpus(3)
    assert devices.resolve_device(name) == want
    assert devices.canonical_name(name) == want
    assert devices.gpu_index(want) == (None if want == "cpu" else int(want[4:] or 0))
    assert devices.device_kind(want) == ("cpu" if want == "cpu" else "gpu")


def test_auto_without_a_gpu_is_the_cpu(gpus):
    gpus(0)
    assert devices.resolve_device("auto") == "cpu"


@pytest.mark.parametrize(
    "name", ["tpu", "cuda:1", "GPU", "gpu:", "gpu:-1", "gpu:1.0", "gpu: 1", "gpu1", "", 1, None]
)
def test_malformed_names_are_refused(gpus, name):
    gpus(2)
    with pytest.raises(ValueError, match="device must be one of 'auto', 'cpu', 'gpu' or 'gpu:N'"):
        devices.resolve_device(name)
    with pytest.raises(ValueError, match="device must be one of"):
        devices.device_ref(name)


@pytest.mark.parametrize(
    "count,name,message",
    [
        (0, "gpu", "device='gpu' was requested but MAX finds no accelerator"),
        (0, "gpu:1", "device='gpu:1' was requested but MAX finds no accelerator"),
        (1, "gpu:1", r"finds 1 accelerator on this machine \(gpu:0\)"),
        (2, "gpu:2", r"finds 2 accelerators on this machine \(gpu:0 to gpu:1\)"),
        (2, "gpu:17", r"device='gpu:17' was requested but MAX finds 2 accelerators"),
    ],
)
def test_a_gpu_past_the_count_is_refused(gpus, count, name, message):
    gpus(count)
    with pytest.raises(max_softmax.NoGPUError, match=message):
        devices.resolve_device(name)


def test_device_refs(gpus):
    gpus(2)
    assert devices.device_ref("cpu") == DeviceRef.CPU()
    assert devices.device_ref("gpu") == DeviceRef.GPU(0)
    assert devices.device_ref("gpu:0") == DeviceRef.GPU(0)
    assert devices.device_ref("gpu:1") == DeviceRef.GPU(1)


def test_gpu_0_and_gpu_are_one_model_key():
    """One device, one compiled model, however it is spelled."""
    assert ModelKey("softmax", DType.float32, "gpu:0") == ModelKey("softmax", DType.float32, "gpu")
    assert ModelKey("softmax", DType.float32, "gpu:1").device == "gpu:1"


@pytest.mark.parametrize("device", ["gpu:5", "gpu:x"])
@pytest.mark.parametrize(
    "call",
    [
        lambda x, d: max_softmax.softmax(x, device=d),
        lambda x, d: max_softmax.log_softmax(x, device=d, scale=0.5),
        lambda x, d: max_softmax.softmax_backward(x, x, device=d),
        lambda x, d: max_softmax.cross_entropy(x, np.zeros(2, np.int64), device=d),
    ],
    ids=["softmax", "masked", "backward", "cross_entropy"],
)
def test_array_functions_refuse_a_bad_device(gpus, call, device):
    """A GPU index past the count, or a malformed name, before anything runs."""
    gpus(2)
    x = np.ones((2, 3), np.float32)
    error = ValueError if device == "gpu:x" else max_softmax.NoGPUError
    with pytest.raises(error, match="device"):
        call(x, device)


def test_graph_on_a_gpu_past_the_count(gpus):
    """A graph placing our op on GPU 2 of a 2-GPU machine fails at build
    time, naming the GPUs there are."""
    gpus(2)
    t = TensorType(DType.float32, [4, 8], DeviceRef.GPU(2))
    with Graph("softmax_on_gpu_2", input_types=[t]) as g:
        with pytest.raises(max_softmax.NoGPUError, match=r"finds 2 accelerators.*GPU\(0\.\.1\)"):
            max_softmax.ops.softmax(g.inputs[0].tensor)


def test_launch_context_of_a_missing_gpu(gpus):
    gpus(1)
    with pytest.raises(max_softmax.NoGPUError, match=r"GPU 3 \(cuda:3\) was requested"):
        launch.gpu_context(3)


# ---------------------------------------------------------------------------
# numpy and MAX graphs on every GPU
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("gpu", GPUS)
@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_arrays_on_each_gpu(rng, gpu, op, dtype):
    x = random_logits(rng, (33, 5000), dtype)
    assert_matches_scipy(op, getattr(max_softmax, op)(x, axis=-1, device=gpu), x, -1)
    x3 = random_logits(rng, (4, 300, 3), dtype)  # strided: axis 1 of 3
    assert_matches_scipy(op, getattr(max_softmax, op)(x3, axis=1, device=gpu), x3, 1)


@pytest.mark.parametrize("gpu", GPUS)
@pytest.mark.parametrize("op", ["softmax_backward", "log_softmax_backward"])
def test_array_backward_on_each_gpu(rng, gpu, op):
    x = random_logits(rng, (16, 3000), "float32")
    forward = op.removesuffix("_backward")
    a = reference(forward, x, -1).astype(np.float32)
    dy = random_logits(rng, x.shape, "float32", 1.0)
    got = getattr(max_softmax, op)(a, dy, axis=-1, device=gpu)
    c = compare_backward(op, got, a, dy, -1)
    assert c.ok, f"{op} on {gpu}: max_abs_err={c.max_abs_err:.3g}"


@pytest.mark.parametrize("gpu", GPUS)
def test_masked_array_on_each_gpu(rng, gpu):
    x = random_logits(rng, (2, 3, 64, 64), "float32")
    got = max_softmax.softmax(x, device=gpu, scale=0.125, causal=True)
    want = masked_reference("softmax", x, -1, scale=0.125, causal=True)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("gpu", GPUS)
@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_array_cross_entropy_on_each_gpu(rng, gpu, reduction):
    logits = random_logits(rng, (37, 1000), "float32")
    targets = rng.integers(0, 1000, size=37)
    targets[::5] = -100
    loss, grad = max_softmax.cross_entropy_with_grad(
        logits, targets, reduction=reduction, label_smoothing=0.1, device=gpu
    )
    want_loss, want_grad = cross_entropy_reference(logits, targets, -100, reduction, 0.1)
    ok, loss_err, grad_err = compare_cross_entropy(loss, grad, want_loss, want_grad, "float32")
    assert ok, f"on {gpu}: loss error {loss_err:.3g}, dlogits error {grad_err:.3g}"


@pytest.mark.parametrize("gpu", GPUS)
def test_user_graph_on_each_gpu(rng, gpu):
    """Our op in a user's graph on DeviceRef.GPU(N), loaded by a session of
    MAX's Accelerator(N)."""
    from max.driver import Buffer
    from max.engine import InferenceSession

    dev = devices.device(gpu)
    t = TensorType(DType.float32, [8, 1000], devices.device_ref(gpu))
    name = f"softmax_on_{gpu.replace(':', '')}"
    with Graph(name, input_types=[t], custom_extensions=[max_softmax.KERNELS]) as g:
        g.output(max_softmax.ops.softmax(g.inputs[0].tensor))
    model = InferenceSession(devices=[dev]).load(g)
    x = random_logits(rng, (8, 1000), "float32")
    (out,) = model.execute(Buffer.from_numpy(x).to(dev))
    assert not out.device.is_host and out.device.id == dev.id
    assert_matches_scipy("softmax", out.to(devices.device("cpu")).to_numpy(), x, -1)


@pytest.mark.parametrize("gpu", GPUS)
def test_models_and_sessions_are_per_device(gpu):
    from max_softmax import models

    assert models.session(gpu) is models.session(devices.canonical_name(gpu))
    model = models.row_op_model(ModelKey("softmax", DType.float32, gpu))
    assert model is models.row_op_model(ModelKey("softmax", DType.float32, gpu))
    if devices.canonical_name(gpu) != devices.canonical_name("gpu"):
        assert models.session(gpu) is not models.session("gpu")
        assert model is not models.row_op_model(ModelKey("softmax", DType.float32, "gpu"))


# ---------------------------------------------------------------------------
# The torch bridge on every CUDA device
# ---------------------------------------------------------------------------

try:
    import torch
except ImportError:  # the [torch] extra is not installed: these skip
    torch = None

_CUDA_COUNT = torch.cuda.device_count() if torch is not None else 0
NO_CUDA = pytest.mark.skipif(_CUDA_COUNT == 0, reason="no CUDA device (or no torch)")
CUDAS = [f"cuda:{i}" for i in range(_CUDA_COUNT)] or [pytest.param("cuda:0", marks=NO_CUDA)]
"""Every CUDA device torch sees (one skipped case where there is none)."""

ROW = {"launch": 1000, "graph": 1001}
"""Row length by path: a graph-path call must not find a launch plan an
earlier launch-path call of the same shape left (the plan would launch)."""


def _other(cuda: str) -> int:
    """Another CUDA device than `cuda` where there is one: the current
    device while the bridge runs on `cuda`, which must not matter."""
    return (int(cuda[5:]) + 1) % _CUDA_COUNT


@pytest.fixture(params=["launch", "graph"])
def bridge_path(request, monkeypatch) -> str:
    """CUDA calls through the launch extension (built now, not in the
    background) or through MAX graphs (`Model.execute`)."""
    if request.param == "launch":
        monkeypatch.setattr(launch, "CUDA_ENABLED", True)
        launch.extension()
    else:
        monkeypatch.setattr(launch, "CUDA_ENABLED", False)
    return request.param


def _bridge():
    return pytest.importorskip("max_softmax.torch")


@pytest.mark.parametrize("cuda", CUDAS)
@pytest.mark.parametrize("name", ["softmax", "log_softmax"])
def test_bridge_on_each_cuda_device(bridge_path, cuda, name):
    """Values and gradients on cuda:N, with another device current."""
    mst = _bridge()
    n = ROW[bridge_path]
    gen = torch.Generator().manual_seed(int(cuda[5:]))
    x64 = torch.randn(6, n, generator=gen, dtype=torch.float64) * 3
    w = torch.randn(6, n, generator=gen, dtype=torch.float64).to(cuda)
    x = x64.to(cuda, torch.float32).requires_grad_()
    ref_x = x64.to(cuda).requires_grad_()
    with torch.cuda.device(_other(cuda)):
        y = getattr(mst, name)(x, dim=-1)
        (y * w.float()).sum().backward()
    ref = getattr(torch, name)(ref_x, dim=-1)
    (ref * w).sum().backward()
    assert y.device == x.device == torch.device(cuda)
    torch.testing.assert_close(y.double(), ref, rtol=1e-5, atol=4e-5)
    torch.testing.assert_close(x.grad.double(), ref_x.grad, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("cuda", CUDAS)
def test_masked_bridge_on_each_cuda_device(cuda):
    """Scale, boolean mask and causal on cuda:N (MAX graphs on every path)."""
    mst = _bridge()
    gen = torch.Generator().manual_seed(3)
    x64 = torch.randn(2, 3, 48, 48, generator=gen, dtype=torch.float64)
    keep = torch.rand(48, 48, generator=gen) > 0.3
    keep[:, 0] = True  # every row keeps something (torch's reference would give NaN)
    w = torch.randn(2, 3, 48, 48, generator=gen, dtype=torch.float64).to(cuda)
    x = x64.to(cuda, torch.float32).requires_grad_()
    with torch.cuda.device(_other(cuda)):
        y = mst.softmax(x, dim=-1, scale=0.5, mask=keep.to(cuda), causal=True)
        (y * w.float()).sum().backward()
    causal = torch.ones(48, 48, dtype=torch.bool).tril()
    ref_x = x64.to(cuda).requires_grad_()
    logits = (ref_x * 0.5).masked_fill(~(keep & causal).to(cuda), float("-inf"))
    ref = torch.softmax(logits, dim=-1)
    (ref * w).sum().backward()
    assert y.device == torch.device(cuda)
    torch.testing.assert_close(y.double(), ref, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(x.grad.double(), ref_x.grad, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("cuda", CUDAS)
@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_cross_entropy_bridge_on_each_cuda_device(bridge_path, cuda, reduction):
    mst = _bridge()
    n = ROW[bridge_path]
    gen = torch.Generator().manual_seed(4)
    logits64 = torch.randn(37, n, generator=gen, dtype=torch.float64) * 3
    target = torch.randint(0, n, (37,), generator=gen)
    target[::5] = -100
    target = target.to(cuda)
    x = logits64.to(cuda, torch.float32).requires_grad_()
    ref_x = logits64.to(cuda).requires_grad_()
    kw = {"reduction": reduction, "label_smoothing": 0.1}
    with torch.cuda.device(_other(cuda)):
        loss = mst.cross_entropy(x, target, **kw)
        loss.sum().backward()
    ref = torch.nn.functional.cross_entropy(ref_x, target, **kw)
    ref.sum().backward()
    assert loss.device == torch.device(cuda)
    torch.testing.assert_close(loss.double(), ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(x.grad.double(), ref_x.grad, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("cuda", CUDAS)
def test_bridge_waits_for_torch_on_each_cuda_device(bridge_path, cuda):
    """Long torch work on a side stream of cuda:N writes the input just
    before the call, and a consumer on that stream reads the output just
    after: both are ordered against MAX's queue of cuda:N."""
    mst = _bridge()
    n = 4096 + (bridge_path == "graph")
    side = torch.cuda.Stream(device=cuda)
    with torch.cuda.stream(side):
        a = torch.randn(4096, 4096, device=cuda)
        x = torch.empty(64, n, device=cuda)
        for i in range(3):
            a @ a  # keeps the stream busy
            x.fill_(float(i))  # queued before the call
            got = mst.softmax(x, dim=-1) * n  # the product: queued after
            torch.testing.assert_close(got, torch.ones_like(got))


@pytest.mark.parametrize("cuda", CUDAS)
def test_replay_on_each_cuda_device(monkeypatch, cuda):
    """Replay (graph path) on cuda:N: the same memory rewritten in place
    between calls; replays read the new values, and the captures are
    cuda:N's, in its own cache."""
    mst = _bridge()
    from max_softmax.torch import _replay as torch_replay

    monkeypatch.setattr(launch, "CUDA_ENABLED", False)
    monkeypatch.setenv("MAX_SOFTMAX_TORCH_REPLAY", "1")
    monkeypatch.setattr(torch_replay, "CACHE", torch_replay.ReplayCache())
    monkeypatch.setattr(torch_replay, "_caches", {})
    index = int(cuda[5:])
    x = torch.randn(64, 129, device=cuda)
    try:
        with torch.cuda.device(_other(cuda)):
            for _ in range(12):
                x.mul_(0.5).add_(torch.randn_like(x))
                y = mst.softmax(x, dim=-1)
                torch.testing.assert_close(y, torch.softmax(x, dim=-1))
                del y  # so the allocator hands the next call the same output memory
        mine = torch_replay.cache(index)
        assert mine.captures >= 1, f"failed={mine.failed} signatures={len(mine.seen)}"
        assert sum(c.replays for c in mine.live.values()) >= 1
        for other in range(_CUDA_COUNT):
            if other != index:
                assert torch_replay.cache(other).captures == 0
    finally:
        torch_replay.clear_all()


def test_all_cuda_devices_in_turn(bridge_path):
    """One shape on every device in turn, round after round: each device's
    own plan, model and queue, each result on its own device and right."""
    if _CUDA_COUNT == 0:
        pytest.skip("no CUDA device (or no torch)")
    mst = _bridge()
    n = ROW[bridge_path] + 7
    gen = torch.Generator().manual_seed(5)
    xs = [(torch.randn(8, n, generator=gen) * (i + 1)).to(f"cuda:{i}") for i in range(_CUDA_COUNT)]
    for _ in range(3):
        ys = [mst.log_softmax(x, dim=-1) for x in xs]
        for x, y in zip(xs, ys):
            assert y.device == x.device
            torch.testing.assert_close(y, torch.log_softmax(x, dim=-1), rtol=1e-5, atol=1e-5)
