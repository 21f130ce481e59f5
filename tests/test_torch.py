"""The PyTorch bridge: values and gradients against torch, gradcheck,
torch.compile. Skipped where torch is not installed."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (extra [torch])")
mst = pytest.importorskip("max_softmax.torch")

DEVICES = [
    "cpu",
    pytest.param(
        "cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
    ),
]
TOL = {torch.float32: 1e-5, torch.float64: 1e-10, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}
CASES = [((128,), 0), ((7, 1000), -1), ((3, 5, 7), 1), ((2, 3, 4, 5), 0)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", list(TOL))
@pytest.mark.parametrize("shape,dim", CASES)
@pytest.mark.parametrize("name", ["softmax", "log_softmax"])
def test_values_and_gradients_match_torch(device, dtype, shape, dim, name):
    gen = torch.Generator().manual_seed(0)
    x64 = torch.randn(shape, generator=gen, dtype=torch.float64) * 3
    w = torch.randn(shape, generator=gen, dtype=torch.float64).to(device, dtype)
    ours_x = x64.to(device, dtype).requires_grad_()
    ref_x = x64.to(device).requires_grad_()
    ours = getattr(mst, name)(ours_x, dim=dim)
    ref = getattr(torch, name)(ref_x, dim=dim)
    assert ours.dtype == dtype and ours.device.type == device
    tol = TOL[dtype]
    torch.testing.assert_close(
        ours.double(), ref, rtol=tol, atol=tol if name == "softmax" else 4 * tol
    )
    (ours * w).sum().backward()
    (ref * w.double()).sum().backward()
    torch.testing.assert_close(ours_x.grad.double(), ref_x.grad, rtol=4 * tol, atol=4 * tol)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", ["softmax", "log_softmax"])
@pytest.mark.parametrize("layout", ["contiguous", "transposed", "expanded_dy"])
def test_repeated_calls_follow_new_values_and_layouts(device, name, layout):
    """The second and later calls of a shape take the bridge's cached plan
    (_rows._plans, no checks): they must still read each call's own values,
    make a non-contiguous input or an expanded (stride 0) gradient dense, and
    match torch every time."""
    gen = torch.Generator().manual_seed(1)
    fn, ref_fn = getattr(mst, name), getattr(torch, name)
    for _ in range(3):
        base = torch.randn(6, 33, generator=gen, dtype=torch.float64).to(device)
        x = (base.t().contiguous().t() if layout == "transposed" else base).requires_grad_()
        ref_x = base.detach().clone().requires_grad_()
        dy = torch.randn(1, 33, dtype=torch.float64).to(device).expand(6, 33)
        if layout != "expanded_dy":
            dy = dy.contiguous()
        y, ref = fn(x, dim=-1), ref_fn(ref_x, dim=-1)
        torch.testing.assert_close(y, ref)
        y.backward(dy)
        ref.backward(dy)
        torch.testing.assert_close(x.grad, ref_x.grad)


def test_launch_plans_stay_bounded(monkeypatch):
    """Shapes that never repeat keep at most PLAN_LIMIT plans, and calls
    past the limit still compute the right values."""
    from max_softmax.torch import _launch as torch_launch

    if not torch_launch.available():
        pytest.skip("the launch extension is off or not built")
    from max_softmax.torch import _rows

    monkeypatch.setattr(_rows, "PLAN_LIMIT", 3)
    monkeypatch.setattr(_rows, "_plans", {})
    for n in range(1, 9):
        x = torch.randn(2, n, dtype=torch.float64)
        torch.testing.assert_close(mst.softmax(x, dim=-1), torch.softmax(x, dim=-1))
        assert 1 <= len(_rows._plans) <= 3


@pytest.mark.parametrize("name", ["softmax", "log_softmax"])
@pytest.mark.parametrize("grad", ["requires_grad", "no_grad", "plain"])
def test_autograd_records_only_when_a_gradient_is_wanted(name, grad):
    """Inference calls skip the autograd Function; a call that needs a
    gradient still gets one, and every call computes the same values."""
    x = torch.randn(5, 9, dtype=torch.float64, requires_grad=grad != "plain")
    with torch.set_grad_enabled(grad != "no_grad"):
        y = getattr(mst, name)(x, dim=-1)
    assert (y.grad_fn is not None) == (grad == "requires_grad")
    torch.testing.assert_close(y.detach(), getattr(torch, name)(x.detach(), dim=-1))


def _python_calls(step) -> list[str]:
    """The qualified names of the Python functions `step()` calls."""
    import sys

    seen = []

    def profile(frame, event, arg):
        if event == "call":
            code = frame.f_code
            seen.append(getattr(code, "co_qualname", code.co_name))

    sys.setprofile(profile)
    try:
        step()
    finally:
        sys.setprofile(None)
    return seen


@pytest.mark.parametrize("op", ["softmax", "log_softmax", "masked", "cross_entropy"])
def test_first_order_call_applies_its_function_in_c(op):
    """A first-order forward and backward applies the eager Function by
    torch's C apply (no Python Function.apply: no argument binding, no
    functorch check, no dead-wrapper unwrap), and asks torch.compile at most
    once a forward and once a backward for the row ops."""
    x = torch.randn(8, 100, requires_grad=True)
    dy = torch.randn(8, 100)
    steps = {
        "softmax": lambda: mst.softmax(x, -1).backward(dy),
        "log_softmax": lambda: mst.log_softmax(x, -1).backward(dy),
        "masked": lambda: mst.softmax(x, -1, scale=0.5).backward(dy),
        "cross_entropy": lambda: mst.cross_entropy(x, torch.arange(8)).backward(),
    }
    steps[op]()  # the launch plans made
    calls = _python_calls(steps[op])
    assert "Function.apply" not in calls and "unwrap_dead_wrappers" not in calls
    if op in ("softmax", "log_softmax"):
        assert calls.count("is_compiling") <= 3, calls


@pytest.mark.parametrize("name", ["softmax", "log_softmax"])
def test_repeated_inference_call_goes_straight_to_its_launch(name):
    """A repeated call that no autograd, transform or torch.compile sees runs
    its launch plan without `pick` or the Function machinery, and follows
    new values."""
    fn, ref = getattr(mst, name), getattr(torch, name)
    x = torch.randn(8, 100)
    fn(x, -1)  # the launch plan made
    x2 = torch.randn(8, 100)
    calls = _python_calls(lambda: fn(x2, -1))
    assert "pick" not in calls and "run_checked" not in " ".join(calls), calls
    torch.testing.assert_close(fn(x2, -1), ref(x2, -1))


@pytest.mark.parametrize("name", ["softmax", "log_softmax"])
@pytest.mark.parametrize("transform", ["vmap", "jvp", "grad_escaped"])
def test_a_plan_is_not_used_for_a_wrapped_tensor(name, transform):
    """With a launch plan already made for the shape, a tensor a torch.func
    transform wraps (live, or dead after it escaped) still takes the path that
    unwraps it: values and tangents as torch's."""
    fn, ref = getattr(mst, name), getattr(torch, name)
    x = torch.randn(4, 8, 100, dtype=torch.float64)
    fn(x[0], -1)  # a plan for each (8, 100) sample's shape
    if transform == "vmap":
        torch.testing.assert_close(torch.func.vmap(fn)(x), ref(x, -1))
    elif transform == "jvp":
        t = torch.randn_like(x[0])
        ours = torch.func.jvp(lambda a: fn(a, -1), (x[0],), (t,))
        theirs = torch.func.jvp(lambda a: ref(a, -1), (x[0],), (t,))
        torch.testing.assert_close(ours, theirs)
    else:
        escaped = []

        def f(a):
            escaped.append(a)
            return fn(a, -1).sum()

        torch.func.grad(f)(x[0])
        torch.testing.assert_close(fn(escaped[0], -1), ref(x[0], -1))


@pytest.mark.parametrize("op", ["softmax", "log_softmax", "masked", "cross_entropy"])
@pytest.mark.parametrize("when", ["live", "escaped"])
def test_functionalize_tensors_are_refused(op, when):
    """A tensor of torch.func.functionalize has storage at address 0: with a
    launch plan made or not, every op raises RuntimeError on it (live, or
    escaped from the transform), never launching a kernel on it."""
    x = torch.randn(8, 100)
    targets = torch.randint(0, 100, (8,))
    calls = {
        "softmax": lambda a: mst.softmax(a, -1),
        "log_softmax": lambda a: mst.log_softmax(a, -1),
        "masked": lambda a: mst.softmax(a, -1, scale=0.5),
        "cross_entropy": lambda a: mst.cross_entropy(a, targets),
    }
    call = calls[op]
    call(x)  # the launch plans made
    with pytest.raises(RuntimeError):
        if when == "live":
            torch.func.functionalize(call)(x)
        else:
            escaped = []
            torch.func.functionalize(lambda a: escaped.append(a) or a.sum())(x)
            call(escaped[0])


@pytest.mark.parametrize("name", ["softmax", "log_softmax"])
def test_dim_types_as_torch(name):
    """dim takes what torch takes (int, numpy integer, 0-d integer tensor)
    and refuses what torch refuses (bool, float, arrays) with a TypeError,
    also once a launch plan for dim 1 exists."""
    fn, ref = getattr(mst, name), getattr(torch, name)
    x = torch.randn(4, 5, dtype=torch.float64)
    fn(x, 1)  # the launch plan for dim 1
    for dim in (np.int64(1), torch.tensor(1), torch.tensor(1, dtype=torch.uint8)):
        torch.testing.assert_close(fn(x, dim), ref(x, 1))
    bad = (True, 1.0, np.bool_(True), torch.tensor(True), torch.tensor([1]), np.array(1))
    for dim in bad:
        with pytest.raises(TypeError, match="dim must be an int"):
            fn(x, dim)


@pytest.mark.parametrize("name", ["softmax", "log_softmax"])
def test_func_transform_over_a_captured_tensor(name):
    """Under torch.func.grad a call on a tensor the transform does not wrap
    (captured, requiring grad) takes the setup_context Function (an eager one
    may not be applied under a transform) and gives torch's gradient."""
    w = torch.randn(3, 5, dtype=torch.float64, requires_grad=True)
    a = torch.randn(3, 5, dtype=torch.float64)

    def loss(a, fn):
        return (fn(w, -1) * a).sum()

    ours = torch.func.grad(lambda a: loss(a, getattr(mst, name)))(a)
    ref = torch.func.grad(lambda a: loss(a, getattr(torch, name)))(a)
    torch.testing.assert_close(ours, ref)


def test_gradcheck_float64():
    for fn in (mst.softmax, mst.log_softmax):
        x = torch.randn(3, 6, dtype=torch.float64, requires_grad=True)
        assert torch.autograd.gradcheck(lambda t, fn=fn: fn(t, dim=-1), (x,))
        assert torch.autograd.gradcheck(lambda t, fn=fn: fn(t, dim=0), (x,))


def test_torch_compile_fullgraph():
    model = torch.nn.Sequential(torch.nn.Linear(8, 5), mst.Softmax(dim=-1))
    compiled = torch.compile(model, fullgraph=True)
    x = torch.randn(4, 8)
    torch.testing.assert_close(compiled(x), torch.softmax(model[0](x), dim=-1))


@pytest.mark.parametrize("name", ["softmax", "log_softmax"])
def test_torch_compile_fullgraph_backward(name):
    """Under torch.compile(fullgraph=True) the row ops' autograd Functions
    trace forward and backward; values and gradients are torch's."""
    ours, ref = getattr(mst, name), getattr(torch, name)
    w = torch.randn(4, 6)

    def loss(t, fn):
        return (fn(t, dim=-1) * w).sum()

    x = torch.randn(4, 6, requires_grad=True)
    got = torch.compile(lambda t: loss(t, ours), fullgraph=True)(x)
    want = loss(x, ref)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(torch.autograd.grad(got, x), torch.autograd.grad(want, x))


def test_torch_compile_as_a_process_first_call():
    """A compiled call may be a process's first use of the bridge: the
    launch extension's first load (a lock Dynamo cannot trace) happens at
    trace time, outside the graph. A fresh interpreter, since this one has
    loaded the extension already."""
    import subprocess
    import sys

    code = (
        "import torch, max_softmax.torch as mst\n"
        "x = torch.randn(4, 8, requires_grad=True)\n"
        "t = torch.randint(0, 8, (4,))\n"
        "f = torch.compile(lambda x, t: mst.cross_entropy(mst.log_softmax(x, -1), t), "
        "fullgraph=True)\n"
        "want = torch.nn.functional.cross_entropy(torch.log_softmax(x, -1), t)\n"
        "torch.testing.assert_close(f(x, t), want)\n"
        "print('ok')\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0 and "ok" in result.stdout, result.stderr[-3000:]


def test_bad_dtype():
    with pytest.raises(TypeError, match="floating-point"):
        mst.softmax(torch.ones(3, dtype=torch.int64))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("rows,n", [(4, 1000), (4, 50257), (4, 131073), (300, 20001)])
def test_unaligned_storage(device, rows, n):
    """Views starting 4 bytes into their storage, forward and backward (on
    the GPU: register rows, the split stream, and rows on chip): the kernels
    must not issue 16-byte vector loads there."""
    flat = torch.randn(2 * rows * n + 2, device=device)
    x = flat[1 : rows * n + 1].view(rows, n).requires_grad_()
    dy = flat[rows * n + 2 :].view(rows, n)
    ref = x.detach().clone().requires_grad_()
    y = mst.softmax(x, dim=-1)
    expected = torch.softmax(ref, dim=-1)
    torch.testing.assert_close(y, expected)
    y.backward(dy)
    expected.backward(dy)
    torch.testing.assert_close(x.grad, ref.grad, rtol=1e-4, atol=1e-7)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("rows,n", [(4, 50257), (300, 20001)])
def test_cross_entropy_of_unaligned_storage(device, rows, n):
    """Logits starting 4 bytes into their storage: the loss alone (no grad;
    on the GPU ce_block_kernel's four-loads-a-thread pass, here over scalars)
    and with its gradient, against torch in float64."""
    flat = torch.randn(rows * n + 1, device=device) * 4
    logits = flat[1:].view(rows, n)
    t = torch.randint(0, n, (rows,), device=device)
    t[0] = -100
    want = torch.nn.functional.cross_entropy(logits.double(), t, label_smoothing=0.1)
    with torch.no_grad():
        got = mst.cross_entropy(logits, t, label_smoothing=0.1)
    torch.testing.assert_close(got.double(), want, rtol=2e-5, atol=0)
    x = logits.clone().requires_grad_()
    mst.cross_entropy(x, t, label_smoothing=0.1).backward()
    ref = logits.double().requires_grad_()
    torch.nn.functional.cross_entropy(ref, t, label_smoothing=0.1).backward()
    torch.testing.assert_close(x.grad.double(), ref.grad, rtol=1e-4, atol=1e-8)


# --- CUDA: replaying captured graphs when torch hands back the same memory ---

cuda_only = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")


@pytest.fixture
def graph_path(monkeypatch):
    """The bridge's graph path (Model.execute on buffer views, replay when
    enabled), as MAX_SOFTMAX_TORCH_LAUNCH=graph chooses, instead of the
    launch extension."""
    from max_softmax.torch import _launch as torch_launch

    monkeypatch.setattr(torch_launch, "available", lambda cuda=False: False)


@pytest.fixture
def replay_cache(monkeypatch, graph_path):
    """Replay turned on, with a fresh cache (the process's one may have
    stopped capturing after other tests' churn)."""
    from max_softmax.torch import _replay as torch_replay

    cache = torch_replay.ReplayCache()
    monkeypatch.setattr(torch_replay, "CACHE", cache)
    monkeypatch.setenv("MAX_SOFTMAX_TORCH_REPLAY", "1")  # opt-in
    yield cache
    cache.clear()


@cuda_only
def test_cuda_replay_follows_in_place_updates(replay_cache):
    """The same input memory, rewritten in place between calls: replays
    (from a signature's third call on) must read the new values."""
    x = torch.randn(64, 128, device="cuda")
    for _ in range(10):
        x.mul_(0.5).add_(torch.randn_like(x))
        y = mst.softmax(x, dim=-1)
        torch.testing.assert_close(y, torch.softmax(x, dim=-1))
    assert replay_cache.captures >= 1
    assert sum(c.replays for c in replay_cache.live.values()) >= 1


def _take_cuda_path(monkeypatch, path: str) -> None:
    """Send CUDA calls through the launch extension ("launch", built now, not
    in the background) or through MAX graphs (any other path), with no
    launch plans cached by an earlier test (a plan skips the choice)."""
    from max_softmax import launch
    from max_softmax.torch import _launch as torch_launch
    from max_softmax.torch import _rows

    monkeypatch.setattr(_rows, "_plans", {})
    if path == "launch":
        monkeypatch.setattr(launch, "CUDA_ENABLED", True)
        torch_launch.extension()
    else:
        monkeypatch.setattr(torch_launch, "available", lambda cuda=False: False)


@cuda_only
@pytest.mark.parametrize("path", ["launch", "graph", "replay"])
def test_cuda_bridge_waits_for_torch_stream(monkeypatch, path):
    """A call right after long torch work that writes its input: MAX's queue
    must wait for torch's stream, launched, executed or replayed."""
    from max_softmax.torch import _replay as torch_replay

    replay = path == "replay"
    _take_cuda_path(monkeypatch, path)
    cache = torch_replay.ReplayCache()
    monkeypatch.setattr(torch_replay, "CACHE", cache)
    monkeypatch.setenv("MAX_SOFTMAX_TORCH_REPLAY", "1" if replay else "0")
    a = torch.randn(4096, 4096, device="cuda")
    x = torch.empty(64, 4096, device="cuda")
    for i in range(10):
        x.copy_((a @ a)[:64] * ((i + 1) / 4096))
        y = mst.softmax(x, dim=-1)
        torch.testing.assert_close(y, torch.softmax(x, dim=-1))
        del y  # so the allocator hands the next call the same output memory
    replays = sum(c.replays for c in cache.live.values())
    assert replays >= (1 if replay else 0), (
        f"captures={cache.captures} failed={cache.failed} signatures={len(cache.seen)}"
    )
    cache.clear()


@cuda_only
@pytest.mark.parametrize("path", ["launch", "graph"])
def test_cuda_torch_waits_for_the_bridge(monkeypatch, path):
    """Torch work queued right after a call reads the finished output, even
    when MAX's queue is held up (the output is torch's memory, written on
    MAX's queue)."""
    from max_softmax.torch import _buffers as torch_buffers

    _take_cuda_path(monkeypatch, path)
    x = torch.randn(2048, 4096, device="cuda")
    expected = torch.softmax(x, dim=-1)
    mst.softmax(x, dim=-1)  # compiled and warm
    torch.cuda.synchronize()
    with torch.cuda.stream(torch_buffers._max_stream()):
        torch.cuda._sleep(100_000_000)  # tens of ms of MAX's queue
    got = mst.softmax(x, dim=-1) * 1.0  # queued on torch's stream at once
    torch.testing.assert_close(got, expected)


@cuda_only
def test_cuda_buffer_views_keep_no_memory_alive():
    """The bridge's reused buffer views own nothing: freed tensors' memory
    goes back to torch's allocator."""
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    for n in (1000, 4096, 50257):
        x = torch.randn(64, n, device="cuda")
        y = mst.log_softmax(x, dim=-1)
        del x, y
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated() == base


def test_bridge_reuses_buffer_views_and_rewrites_in_place_results(graph_path):
    """The same memory comes back with new values: a reused view must read
    the new values, and results land in the tensor returned."""
    from max_softmax.torch import _buffers as torch_buffers

    x = torch.randn(16, 300, dtype=torch.float64)
    for _ in range(4):
        x.mul_(0.5).add_(torch.randn_like(x))
        torch.testing.assert_close(mst.softmax(x, dim=-1), torch.softmax(x, dim=-1))
    key = (x.data_ptr(), torch.Size([16, 300, 1]), x.dtype, x.device)
    assert key in torch_buffers._views


# --- The drop-in surface: dtype=, 0-d inputs, modules, errors torch code catches ---


@pytest.mark.parametrize("name", ["softmax", "log_softmax"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_dtype_casts_first_as_torch(name, dtype):
    """`dtype=` casts the input before the op (values and gradient flow
    through the cast), as torch; a non-float dtype is refused."""
    x = torch.randn(3, 7, dtype=torch.float16, requires_grad=True)
    ref_x = x.detach().clone().requires_grad_()
    ours = getattr(mst, name)(x, 1, dtype=dtype)
    ref = getattr(torch, name)(ref_x, 1, dtype=dtype)
    assert ours.dtype == dtype
    torch.testing.assert_close(ours, ref)
    ours.sum().backward()
    ref.sum().backward()
    torch.testing.assert_close(x.grad, ref_x.grad)
    with pytest.raises(TypeError, match="dtype= must be one of"):
        getattr(mst, name)(x, 1, dtype=torch.int32)


@pytest.mark.parametrize("name", ["softmax", "log_softmax"])
@pytest.mark.parametrize("value", [2.0, float("inf"), float("nan")])
def test_zero_dim_input_as_torch(name, value):
    """A 0-d input: softmax 1, log_softmax 0 (NaN for inf and NaN), gradient 0,
    dim 0 or -1; any other dim is an IndexError, as torch."""
    x = torch.tensor(value, dtype=torch.float64, requires_grad=True)
    ref_x = x.detach().clone().requires_grad_()
    ours, ref = getattr(mst, name)(x, 0), getattr(torch, name)(ref_x, 0)
    assert ours.shape == ()
    torch.testing.assert_close(ours, ref, equal_nan=True)
    ours.backward()
    ref.backward()
    torch.testing.assert_close(x.grad, ref_x.grad, equal_nan=True)
    torch.testing.assert_close(getattr(mst, name)(x.detach(), -1), ref.detach(), equal_nan=True)
    with pytest.raises(IndexError, match="dim 0 or -1"):
        getattr(mst, name)(x, 1)


def test_out_of_range_target_is_index_and_value_error():
    """Code that catches torch's IndexError catches ours, and so does code
    that catches ValueError."""
    x = torch.randn(3, 5)
    for bad in (5, -1):
        with pytest.raises(mst.TargetIndexError, match=f"target {bad} at index \\(1,\\)") as err:
            mst.cross_entropy(x, torch.tensor([0, bad, 2]))
        assert isinstance(err.value, IndexError) and isinstance(err.value, ValueError)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("eps", [0.0, 0.2])
@pytest.mark.parametrize("shape", [(4, 7), (7,), (2, 5, 3)])
def test_probability_targets_match_torch(reduction, eps, shape):
    """Class-probability targets (the input's shape), with label smoothing:
    loss and gradients (to the logits and to the target) as F.cross_entropy."""
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(shape, generator=gen, dtype=torch.float64, requires_grad=True)
    dim = 0 if len(shape) == 1 else 1
    q = torch.softmax(torch.randn(shape, generator=gen, dtype=torch.float64), dim)
    q.requires_grad_()
    kw = {"reduction": reduction, "label_smoothing": eps}
    ours = mst.cross_entropy(x, q, **kw)
    ref = torch.nn.functional.cross_entropy(x, q, **kw)
    torch.testing.assert_close(ours, ref)
    g = torch.randn(ref.shape, generator=gen, dtype=torch.float64)
    got = torch.autograd.grad(ours, (x, q), g)
    want = torch.autograd.grad(ref, (x, q), g)
    torch.testing.assert_close(got, want)
    with pytest.raises(ValueError, match="shaped as the input"):
        mst.cross_entropy(x, q[..., :1].detach(), **kw)


@pytest.mark.parametrize(
    "ours,theirs,shape",
    [
        (lambda: mst.Softmax(1), lambda: torch.nn.Softmax(1), (3, 4, 5)),
        (lambda: mst.LogSoftmax(-1), lambda: torch.nn.LogSoftmax(-1), (3, 4)),
        (mst.Softmax2d, torch.nn.Softmax2d, (2, 3, 4, 5)),
        (mst.Softmax2d, torch.nn.Softmax2d, (3, 4, 5)),
    ],
)
def test_modules_match_torch(ours, theirs, shape):
    x = torch.randn(shape, dtype=torch.float64, requires_grad=True)
    torch.testing.assert_close(ours()(x), theirs()(x))


def test_module_errors():
    with pytest.raises(ValueError, match="Softmax2d expects a 3-D or 4-D input"):
        mst.Softmax2d()(torch.randn(4, 5))
    with pytest.raises(ValueError, match="weight must have shape"):
        mst.CrossEntropyLoss(weight=torch.ones(4))(torch.randn(2, 3), torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="softcap must be a finite number >= 0"):
        mst.cross_entropy(torch.randn(2, 3), torch.tensor([0, 1]), softcap=-1.0)


@pytest.mark.parametrize("kw", [{}, {"ignore_index": 1, "label_smoothing": 0.1}])
@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_cross_entropy_loss_module_matches_torch(kw, reduction):
    x = torch.randn(6, 4, 3, dtype=torch.float64, requires_grad=True)
    t = torch.randint(0, 4, (6, 3))
    ours = mst.CrossEntropyLoss(reduction=reduction, **kw)(x, t)
    ref = torch.nn.CrossEntropyLoss(reduction=reduction, **kw)(x, t)
    torch.testing.assert_close(ours, ref)


def test_floating_mask_that_wants_a_gradient_is_refused():
    """The masked op gives no gradient to a floating mask: one that requires
    grad raises rather than silently getting none; detached, it works."""
    x = torch.randn(2, 5, dtype=torch.float64, requires_grad=True)
    bias = torch.randn(2, 5, dtype=torch.float64, requires_grad=True)
    with pytest.raises(NotImplementedError, match="no gradient to a floating mask"):
        mst.softmax(x, mask=bias)
    y = mst.softmax(x, mask=bias.detach())
    torch.testing.assert_close(y, torch.softmax(x + bias.detach(), -1))


@pytest.mark.parametrize("path", ["default", "graph"])
@pytest.mark.parametrize("factor", ["one", "2.5", "none"])
def test_cross_entropy_backward_scales_gradient(monkeypatch, path, factor):
    """The backward scales the forward's gradient (on the graph path by the
    scale_rows op): by 1 (loss.backward()), by 2.5, and a factor a row."""
    if path == "graph":
        from max_softmax.torch import _launch as torch_launch

        monkeypatch.setattr(torch_launch, "available", lambda cuda=False: False)
    torch.manual_seed(0)
    x = torch.randn(37, 301, dtype=torch.float64, requires_grad=True)
    t = torch.randint(0, 301, (37,))
    t[3] = -100
    ref = x.detach().clone().requires_grad_()
    reduction = "none" if factor == "none" else "mean"
    grad = {"one": torch.tensor(1.0), "2.5": torch.tensor(2.5)}.get(factor)
    if grad is None:
        grad = torch.linspace(-2.0, 3.0, 37, dtype=torch.float64)
        grad[5] = 1.0  # a row left unread
    mst.cross_entropy(x, t, reduction=reduction, label_smoothing=0.1).backward(grad.double())
    want = torch.nn.functional.cross_entropy(ref, t, reduction=reduction, label_smoothing=0.1)
    want.backward(grad.double())
    torch.testing.assert_close(x.grad, ref.grad)


@pytest.mark.parametrize("per_row", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_scale_rows_model_on_cpu(per_row, dtype):
    """The scale_rows op in place: rows times their factor, rows whose
    factor is 1 untouched (bit for bit)."""
    from max_softmax.models import scale_rows_into_model
    from max_softmax.torch._buffers import DTYPES
    from max_softmax.torch._graph_path import execute

    data = torch.randn(9, 130).to(dtype)
    factor = torch.tensor([2.5, 1.0, -0.5, 1.0, 3.0, 0.0, 1.0, 7.0, 1.0]).to(dtype)
    factor = factor if per_row else factor[:1]
    want = data * (factor[:, None] if per_row else factor)
    execute(scale_rows_into_model(DTYPES[dtype], "cpu", per_row), (data, factor))
    torch.testing.assert_close(data, want, rtol=0, atol=0)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cross_entropy_inplace_backward(reduction, dtype):
    """inplace_backward=True: the loss and gradient as F.cross_entropy's,
    the gradient in the logits' memory, and a second backward raises."""
    torch.manual_seed(1)
    base = torch.randn(16, 100, dtype=torch.float64)
    t = torch.randint(0, 100, (16,))
    t[2] = -100
    x = base.to(dtype).requires_grad_()
    ref = base.to(dtype).double().requires_grad_()
    ptr = x.data_ptr()
    loss = mst.cross_entropy(x, t, reduction=reduction, inplace_backward=True)
    want = torch.nn.functional.cross_entropy(ref, t, reduction=reduction)
    tol = {"atol": 2e-2, "rtol": 2e-2} if dtype == torch.bfloat16 else {}
    torch.testing.assert_close(loss.double(), want, **tol)
    grad = torch.linspace(0.5, 2.0, 16, dtype=dtype) if reduction == "none" else None
    loss.backward(grad, retain_graph=True)
    want.backward(None if grad is None else grad.double())
    torch.testing.assert_close(x.grad.double(), ref.grad, **tol)
    assert x.grad.data_ptr() == ptr  # the logits' own memory
    with pytest.raises(RuntimeError, match="backward twice"):
        loss.backward(grad)


def test_linear_cross_entropy_is_exported():
    """max_softmax.torch.linear_cross_entropy is F.cross_entropy(F.linear)."""
    torch.manual_seed(2)
    h = torch.randn(8, 16, dtype=torch.float64)
    w = torch.randn(50, 16, dtype=torch.float64)
    t = torch.randint(0, 50, (8,))
    want = torch.nn.functional.cross_entropy(torch.nn.functional.linear(h, w), t)
    torch.testing.assert_close(mst.linear_cross_entropy(h, w, t), want)
    assert "linear_cross_entropy" in mst.__all__
