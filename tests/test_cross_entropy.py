"""Fused cross-entropy (loss, and loss with its gradient): against a float64
numpy reference of torch's semantics, against torch where it is installed,
and its errors. Each (op, dtype, reduction, device) compiles one model, so
the CPU cases keep to few of them; ignore_index and label smoothing are
run-time values and vary freely."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from conftest import DEVICES, GPU_SKIP, random_logits

import max_softmax
from max_softmax.dtypes import DTYPE_NAMES
from max_softmax.reference import CROSS_ENTROPY_TOLERANCES
from max_softmax.reference import cross_entropy_reference as reference

ROOT = Path(__file__).resolve().parent.parent
CHECK = ROOT / "tests" / "gpu_cross_entropy_check.mojo"
HAVE_TORCH = importlib.util.find_spec("torch") is not None

TOL = CROSS_ENTROPY_TOLERANCES  # rtol; atol relative to the largest reference value


def targets_for(rng, shape, classes, ignore_index=-100, ignored=0.2):
    """Random targets, about `ignored` of them ignore_index."""
    t = rng.integers(0, classes, size=shape)
    return np.where(rng.random(shape) < ignored, ignore_index, t)


def assert_close(got, want, dtype, what):
    tol = TOL[dtype]
    want = np.asarray(want)
    got64 = np.asarray(got).astype(np.float64)
    finite = np.abs(want[np.isfinite(want)])
    atol = tol * max(float(finite.max()) if finite.size else 0.0, 1e-30)
    assert got64.shape == want.shape, (what, got64.shape, want.shape)
    assert np.array_equal(np.isnan(got64), np.isnan(want)), f"{what}: NaN mismatch"
    ok = np.isnan(want) | np.isclose(got64, want, rtol=tol, atol=atol)
    with np.errstate(invalid="ignore"):
        diff = np.abs(got64 - want)
    diff = diff[~np.isnan(diff)]  # NaN and inf - inf places have no error to report
    err = float(diff.max()) if diff.size else 0.0
    assert ok.all(), f"{what} {dtype}: max abs err {err:.3g} (rtol={tol}, atol={atol:.3g})"


ROW_SUM_TOL = {"float32": 1e-4, "float64": 1e-9, "float16": 2e-3, "bfloat16": 1e-2}
"""A gradient row's sum may differ from the reference's by this fraction of
the row's sum of |entries| (rounding of every entry; 16-bit rows are
rounded twice where they hold their exps)."""


def assert_row_sums(got, want, dtype, scale=1.0):
    """Each gradient row's sum against the reference's (0 for a kept row):
    an error spread thinly over every class, as a label-smoothing term
    computed for half a row, stays far inside the elementwise atol (a
    fraction of the largest entry) but moves the row's sum by eps x scale.
    The reference is rounded to `dtype` first: float16 flushes entries
    below its smallest subnormal (6e-8) to 0, and their sum with them. A
    row whose target takes nearly all the probability has (p_t - 1) * scale
    rounded from p_t near 1: a few ulps of `scale` (the reduction's, 1 / rows
    kept for "mean") on top."""
    want = np.asarray(want).astype(DTYPE_NAMES[dtype]).astype(np.float64)
    want = want.reshape(-1, want.shape[-1])
    got = np.asarray(got, dtype=np.float64).reshape(want.shape)
    with np.errstate(invalid="ignore"):
        diff = np.abs(got.sum(-1) - want.sum(-1))
        ulp = float(ml_dtypes.finfo(DTYPE_NAMES[dtype]).eps)
        bound = ROW_SUM_TOL[dtype] * np.abs(want).sum(-1) + 4 * ulp * scale + 1e-30
    rows = np.isfinite(want.sum(-1))
    bad = np.flatnonzero(rows & ~(diff <= bound))
    assert bad.size == 0, f"dlogits {dtype}: row {bad[0]} sums off by {diff[bad[0]]:.3g}"


def check(device, dtype, x, t, **kw):
    """cross_entropy_with_grad against the reference."""
    loss, dlogits = max_softmax.cross_entropy_with_grad(x, t, device=device, **kw)
    ref_kw = {"ignore_index": kw.get("ignore_index", -100)}
    ref_kw["reduction"] = kw.get("reduction", "mean")
    ref_kw["label_smoothing"] = kw.get("label_smoothing", 0.0)
    want_loss, want_grad = reference(x, t, **ref_kw)
    assert loss.dtype == x.dtype and dlogits.dtype == x.dtype
    assert dlogits.shape == x.shape
    assert_close(loss, want_loss, dtype, "loss")
    assert_close(dlogits, want_grad, dtype, "dlogits")
    assert_row_sums(dlogits, want_grad, dtype, reduction_scale(t, **ref_kw))
    return loss, dlogits


def reduction_scale(t, ignore_index=-100, reduction="mean", **_):
    """The factor the reduction puts on each row's gradient: 1 / rows kept
    for "mean" (1 if none), else 1."""
    kept = int(np.sum(np.asarray(t) != ignore_index))
    return 1.0 / max(kept, 1) if reduction == "mean" else 1.0


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "float64"])
@pytest.mark.parametrize("shape", [(7, 1000), (3, 4, 50)])
@pytest.mark.parametrize("eps", [0.0, 0.1])
def test_mean_matches_reference(rng, device, dtype, shape, eps):
    x = random_logits(rng, shape, dtype)
    t = targets_for(rng, shape[:-1], shape[-1])
    loss, _ = check(device, dtype, x, t, label_smoothing=eps)
    assert loss.shape == ()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("eps", [0.0, 0.1])
def test_gpt2_vocabulary(rng, device, eps):
    """V = 50257: rows past the GPU register plans, unaligned row starts."""
    x = random_logits(rng, (5, 50257), "float32")
    t = np.array([0, 50256, -100, 12345, 7])
    check(device, "float32", x, t, label_smoothing=eps)


def mean_loss_float64(x, t, z_loss=0.0, block=1024):
    """The mean cross-entropy (plus z_loss lse^2 a row) of float32 logits
    `x` against `t`, in float64, a block of rows at a time (the whole
    float64 copy would take 2 GB)."""
    total = 0.0
    for b in range(0, x.shape[0], block):
        xb = x[b : b + block].astype(np.float64)
        m = xb.max(axis=1)
        lse = m + np.log(np.exp(xb - m[:, None]).sum(axis=1))
        rows = lse - xb[np.arange(xb.shape[0]), t[b : b + block]] + z_loss * lse**2
        total += float(np.sum(rows))
    return total / x.shape[0]


@pytest.mark.skipif(not HAVE_TORCH, reason="torch is not installed")
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", [(1024, 32000), (8192, 32000), (65536, 1000), (1 << 20, 16)])
@pytest.mark.parametrize("z_loss", [0.0, 1e-4])
def test_float32_mean_loss_as_accurate_as_torch(device, shape, z_loss):
    """Issue 37: the float32 mean loss of 1K-1M rows is within 2x torch's
    relative error against float64 (or 2e-7): the row losses are summed in
    float64, not in a float32 running total; with z-loss too (the extended
    options' kernels). Torch runs on CUDA beside our GPU run where it can."""
    import torch

    rng = np.random.default_rng(37)
    x = rng.standard_normal(shape, dtype=np.float32) * np.float32(4)
    t = rng.integers(0, shape[1], size=shape[0])
    want = mean_loss_float64(x, t, z_loss)
    got = float(max_softmax.cross_entropy(x, t, device=device, z_loss=z_loss))
    where = "cuda" if device != "cpu" and torch.cuda.is_available() else "cpu"
    xt, tt = torch.from_numpy(x).to(where), torch.from_numpy(t).to(where)
    if z_loss:
        rows = torch.nn.functional.cross_entropy(xt, tt, reduction="none")
        theirs = float((rows + z_loss * torch.logsumexp(xt, -1) ** 2).mean())
    else:
        theirs = float(torch.nn.functional.cross_entropy(xt, tt))
    ours_err = abs(got - want) / abs(want)
    torch_err = abs(theirs - want) / abs(want)
    assert ours_err <= max(2 * torch_err, 2e-7), (ours_err, torch_err)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("reduction", ["sum", "none"])
@pytest.mark.parametrize("ignore_index", [-100, 3])
def test_sum_and_none(rng, device, reduction, ignore_index):
    x = random_logits(rng, (9, 301), "float32")
    t = targets_for(rng, (9,), 301, ignore_index=ignore_index)
    t[0] = 3
    loss, _ = check(
        device,
        "float32",
        x,
        t,
        reduction=reduction,
        ignore_index=ignore_index,
        label_smoothing=0.05,
    )
    assert loss.shape == (() if reduction == "sum" else (9,))
    if reduction == "none":
        assert np.all(loss[t == ignore_index] == 0)


@pytest.mark.parametrize("device", DEVICES)
def test_none_float64_3d(rng, device):
    x = random_logits(rng, (2, 3, 17), "float64")
    t = targets_for(rng, (2, 3), 17)
    loss, _ = check(device, "float64", x, t, reduction="none", label_smoothing=0.3)
    assert loss.shape == (2, 3)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_loss_only_equals_fused_loss(rng, device, reduction):
    x = random_logits(rng, (6, 777), "float32")
    t = targets_for(rng, (6,), 777)
    kw = {"reduction": reduction, "label_smoothing": 0.1, "device": device}
    loss = max_softmax.cross_entropy(x, t, **kw)
    fused, _ = max_softmax.cross_entropy_with_grad(x, t, **kw)
    np.testing.assert_array_equal(loss, fused)
    assert_close(
        loss, reference(x, t, reduction=reduction, label_smoothing=0.1)[0], "float32", "loss"
    )


@pytest.mark.parametrize("device", DEVICES)
def test_every_row_ignored(rng, device):
    """As torch: mean over no rows is NaN, the gradient 0; sum is 0."""
    x = random_logits(rng, (4, 1000), "float32")
    t = np.full(4, -100)
    loss, dlogits = max_softmax.cross_entropy_with_grad(x, t, device=device, label_smoothing=0.1)
    assert np.isnan(loss) and np.all(dlogits == 0)
    loss, dlogits = max_softmax.cross_entropy_with_grad(x, t, device=device, reduction="sum")
    assert loss == 0 and np.all(dlogits == 0)


@pytest.mark.parametrize("device", DEVICES)
def test_special_rows(device):
    """-inf logits are fine (a -inf target gives an infinite loss and a
    finite gradient); NaN or +inf in a row make that row NaN."""
    x = np.zeros((4, 40), np.float32)
    x[0, 5:9] = -np.inf
    x[1, 3] = -np.inf
    x[2, 7] = np.nan
    x[3, 1] = np.inf
    t = np.array([1, 3, 0, 0])
    loss, dlogits = max_softmax.cross_entropy_with_grad(x, t, device=device, reduction="none")
    want_loss, want_grad = reference(x, t, reduction="none")
    assert_close(loss, want_loss, "float32", "loss")
    assert np.isposinf(loss[1]) and np.all(np.isfinite(dlogits[:2]))
    assert np.all(np.isnan(dlogits[2:])) and np.all(np.isnan(loss[2:]))
    assert_close(dlogits[:2], want_grad[:2], "float32", "dlogits")


@pytest.mark.parametrize("device", DEVICES)
def test_empty_batch(device):
    x = np.zeros((0, 10), np.float32)
    t = np.zeros(0, np.int64)
    assert np.isnan(max_softmax.cross_entropy(x, t, device=device))
    assert max_softmax.cross_entropy(x, t, reduction="sum", device=device) == 0
    loss, dlogits = max_softmax.cross_entropy_with_grad(x, t, reduction="none", device=device)
    assert loss.shape == (0,) and dlogits.shape == (0, 10)


def test_out_of_range_target_is_a_clear_error():
    x = np.zeros((3, 10), np.float32)
    for bad in (10, -1, -100 + 1):
        with pytest.raises(ValueError, match=f"target {bad} at index \\(1,\\) is out of range"):
            max_softmax.cross_entropy(x, np.array([0, bad, 2]), device="cpu")
    # ignore_index itself is never out of range.
    max_softmax.cross_entropy(x, np.array([0, 77, 2]), ignore_index=77, device="cpu")


def test_cpu_kernel_rejects_a_bad_target():
    """Past the host check (graph-level callers): the CPU kernel raises."""
    from max.dtype import DType

    from max_softmax.dtypes import to_buffer
    from max_softmax.models import cross_entropy_model

    model = cross_entropy_model(True, DType.float32, "cpu", "mean")
    x = to_buffer(np.zeros((3, 10), np.float32))
    t = to_buffer(np.array([0, 10, 2], np.int64))
    options = to_buffer(np.array([-100, 0.0]))
    with pytest.raises(Exception, match="target 10 at row 1 is out of range for 10 classes"):
        model.execute(x, t, options)


def test_argument_errors():
    x = np.zeros((3, 10), np.float32)
    t = np.zeros(3, np.int64)
    with pytest.raises(ValueError, match="reduction must be one of"):
        max_softmax.cross_entropy(x, t, reduction="avg")
    with pytest.raises(ValueError, match="label_smoothing must be in"):
        max_softmax.cross_entropy(x, t, label_smoothing=1.5)
    with pytest.raises(ValueError, match="targets shaped like the logits"):
        max_softmax.cross_entropy(x, np.zeros(4, np.int64))
    with pytest.raises(TypeError, match="integer class-index targets"):
        max_softmax.cross_entropy(x, np.zeros(3, np.float32))
    with pytest.raises(TypeError, match="floating-point"):
        max_softmax.cross_entropy(x.astype(np.int32), t)
    with pytest.raises(TypeError, match="ignore_index must be an int"):
        max_softmax.cross_entropy(x, t, ignore_index=1.5)


def test_in_a_graph(rng):
    """max_softmax.ops.cross_entropy_with_grad on symbolic dims, int32
    targets, 3-D logits, in the user's own graph."""
    from max.driver import CPU, Buffer
    from max.dtype import DType
    from max.engine import InferenceSession
    from max.graph import DeviceRef, Graph, TensorType

    types = [
        TensorType(DType.float32, ["b", "s", 64], DeviceRef.CPU()),
        TensorType(DType.int32, ["b", "s"], DeviceRef.CPU()),
    ]
    with Graph("ce", input_types=types, custom_extensions=[max_softmax.KERNELS]) as g:
        logits, targets = (v.tensor for v in g.inputs)
        loss, dlogits = max_softmax.ops.cross_entropy_with_grad(
            logits, targets, ignore_index=0, label_smoothing=0.2
        )
        g.output(loss, dlogits)
    model = InferenceSession(devices=[CPU()]).load(g)
    for shape in [(2, 3), (4, 5)]:
        x = random_logits(rng, (*shape, 64), "float32")
        t = rng.integers(0, 64, size=shape).astype(np.int32)
        loss, dlogits = model.execute(Buffer.from_numpy(x), Buffer.from_numpy(t))
        want_loss, want_grad = reference(x, t, ignore_index=0, label_smoothing=0.2)
        assert_close(loss.to_numpy(), want_loss, "float32", "loss")
        assert_close(dlogits.to_numpy(), want_grad, "float32", "dlogits")


@GPU_SKIP
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("shape", [(300, 50257), (3, 128256), (1000, 32000), (64, 7)])
@pytest.mark.parametrize("eps", [0.0, 0.1])
def test_gpu_large_vocabularies(rng, dtype, shape, eps):
    """LLM vocabularies on the GPU: Llama-3's 128256 (past the register
    plans), Llama-2's 32000 (a register plan), GPT-2's with many rows."""
    x = random_logits(rng, shape, dtype)
    t = targets_for(rng, shape[:-1], shape[-1])
    check("gpu", dtype, x, t, label_smoothing=eps)
    check("gpu", dtype, x, t, reduction="none", label_smoothing=eps)


@GPU_SKIP
def test_gpu_bad_target_gives_nan():
    """A graph on the GPU cannot raise without a host sync: the row of a
    bad target is NaN, and so is the mean."""
    from max.dtype import DType

    from max_softmax.devices import device
    from max_softmax.dtypes import to_buffer, to_numpy
    from max_softmax.models import cross_entropy_model

    gpu = device("gpu")
    model = cross_entropy_model(True, DType.float32, "gpu", "none")
    x = to_buffer(np.zeros((3, 10), np.float32)).to(gpu)
    t = to_buffer(np.array([0, 10, 2], np.int64)).to(gpu)
    options = to_buffer(np.array([-100, 0.0])).to(gpu)
    loss, dlogits = (to_numpy(b) for b in model.execute(x, t, options))
    assert np.isnan(loss[1]) and np.all(np.isnan(dlogits[1]))
    assert np.all(np.isfinite(loss[[0, 2]])) and np.all(np.isfinite(dlogits[[0, 2]]))


@pytest.mark.skipif(not HAVE_TORCH, reason="torch is not installed")
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("shape", [(8, 100), (2, 11, 3), (11,)])
def test_torch_matches_f_cross_entropy(device, reduction, shape):
    """Drop-in for F.cross_entropy (classes on dim 1 as torch), forward and
    backward, with ignore_index and label smoothing."""
    import torch
    import torch.nn.functional as F

    from max_softmax.torch import cross_entropy

    where = "cuda" if device == "gpu" else "cpu"
    torch.manual_seed(0)
    x = torch.randn(shape, device=where, requires_grad=True)
    tshape = () if len(shape) == 1 else (shape[0], *shape[2:])
    t = torch.randint(0, shape[0] if len(shape) == 1 else shape[1], tshape, device=where)
    if t.dim():
        t.view(-1)[0] = -100
    kw = {"reduction": reduction, "label_smoothing": 0.1}
    ours = cross_entropy(x, t, **kw)
    # Every other row's incoming gradient is 1 (rows the CUDA backward
    # leaves unread), the others 1.5; a scalar loss gets 1.5.
    g = torch.ones_like(ours)
    g.view(-1)[::2] = 1.5
    (grad_ours,) = torch.autograd.grad(ours, x, g)
    theirs = F.cross_entropy(x, t, **kw)
    (grad_theirs,) = torch.autograd.grad(theirs, x, g)
    assert ours.shape == theirs.shape and ours.dtype == theirs.dtype
    torch.testing.assert_close(ours, theirs, rtol=2e-5, atol=1e-6)
    torch.testing.assert_close(grad_ours, grad_theirs, rtol=2e-5, atol=1e-7)


@pytest.mark.skipif(not HAVE_TORCH, reason="torch is not installed")
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("grad_scale", [1.0, 2.5])
def test_torch_backward_repeated_with_retain_graph(device, grad_scale):
    """Backward scales the fused gradient in place (or passes it through for a
    gradient of 1): backpropagating the same loss again still gives torch's
    gradients, accumulated."""
    import torch
    import torch.nn.functional as F

    from max_softmax.torch import cross_entropy

    where = "cuda" if device == "gpu" else "cpu"
    torch.manual_seed(1)
    x = torch.randn(6, 40, device=where, requires_grad=True)
    ref = x.detach().clone().requires_grad_()
    t = torch.randint(0, 40, (6,), device=where)
    ours, theirs = cross_entropy(x, t) * grad_scale, F.cross_entropy(ref, t) * grad_scale
    for _ in range(3):
        ours.backward(retain_graph=True)
        theirs.backward(retain_graph=True)
        torch.testing.assert_close(x.grad, ref.grad, rtol=2e-5, atol=1e-7)


@pytest.mark.skipif(not HAVE_TORCH, reason="torch is not installed")
def test_torch_compile_fullgraph_forward_and_backward():
    """Under torch.compile the loss runs as one registered custom op, without
    graph breaks, forward and backward equal to F.cross_entropy."""
    import torch
    import torch.nn.functional as F

    from max_softmax.torch import cross_entropy

    torch.manual_seed(2)
    x = torch.randn(8, 50, requires_grad=True)
    ref = x.detach().clone().requires_grad_()
    t = torch.randint(0, 50, (8,))
    step = torch.compile(
        lambda x, t: cross_entropy(x, t, label_smoothing=0.1) * 2.0,
        backend="aot_eager",
        fullgraph=True,
    )
    loss = step(x, t)
    loss.backward()
    expected = F.cross_entropy(ref, t, label_smoothing=0.1) * 2.0
    expected.backward()
    torch.testing.assert_close(loss, expected)
    torch.testing.assert_close(x.grad, ref.grad)


@pytest.mark.skipif(not HAVE_TORCH, reason="torch is not installed")
def test_torch_errors_and_no_grad():
    import torch
    import torch.nn.functional as F

    from max_softmax.torch import cross_entropy

    x = torch.zeros(3, 10)
    with pytest.raises(ValueError, match="target 10 at index \\(1,\\) is out of range"):
        cross_entropy(x, torch.tensor([0, 10, 2]))
    with pytest.raises(ValueError, match="weight must have shape \\(10,\\)"):
        cross_entropy(x, torch.tensor([0, 1, 2]), weight=torch.ones(9))
    soft = torch.softmax(torch.randn(3, 10, dtype=torch.float64), -1).to(x.dtype)
    torch.testing.assert_close(cross_entropy(x, soft), F.cross_entropy(x, soft))
    loss = cross_entropy(x, torch.tensor([0, 1, 2]))  # no grad: the loss-only op
    assert not loss.requires_grad
    torch.testing.assert_close(loss, torch.tensor(np.log(10.0), dtype=torch.float32))


def test_gpu_kernels_compile(tmp_path):
    """Every cross-entropy GPU kernel, the sharded (vocab-parallel) row
    kernels included, compiles for the H100 (sm_90) without a GPU
    (tests/gpu_cross_entropy_check.mojo launches each)."""
    from test_gpu_build import _build

    _build(tmp_path / "check", source=CHECK)


@GPU_SKIP
@pytest.mark.parametrize(
    ("dtype", "shape", "eps"),
    [
        ("float32", (300, 20001), 0.0),  # 512 threads a row, unaligned rows
        ("float32", (264, 32000), 0.1),  # Llama-2's vocabulary, aligned rows
        ("bfloat16", (300, 20001), 0.1),
        ("bfloat16", (264, 37000), 0.0),
        ("float16", (264, 80001), 0.1),  # 1024 threads a row
        ("float64", (264, 20001), 0.0),  # 1024 threads a row
        ("float32", (264, 6001), 0.1),  # all in registers, no shared memory
        ("bfloat16", (264, 12001), 0.0),
        ("float32", (264, 128256), 0.0),  # ce_pair_kernel: Llama-3's vocabulary
        ("float32", (264, 100003), 0.1),  # ce_pair_kernel, unaligned rows
        ("bfloat16", (264, 200003), 0.1),  # ce_pair_kernel, 16-bit
    ],
)
def test_gpu_smem_rows(rng, dtype, shape, eps):
    """Rows the GPU holds on chip (ce_smem_kernel: rows >= 264, past the
    256-thread register plans; past one SM's capacity, ce_pair_kernel: a
    cluster of two blocks a row), a fifth of them ignored."""
    x = random_logits(rng, shape, dtype)
    t = targets_for(rng, shape[:-1], shape[-1])
    t[:3] = [0, shape[-1] - 1, -100]
    check("gpu", dtype, x, t, label_smoothing=eps)
    if dtype in ("float32", "bfloat16"):  # models the tests above compile
        check("gpu", dtype, x, t, reduction="none", label_smoothing=eps)
        # The loss alone streams these rows through ce_block_kernel instead.
        for reduction in ("none", "mean"):
            kw = {"reduction": reduction, "label_smoothing": eps}
            loss = max_softmax.cross_entropy(x, t, device="gpu", **kw)
            assert_close(loss, reference(x, t, **kw)[0], dtype, "loss")


@GPU_SKIP
@pytest.mark.parametrize(
    ("dtype", "n"), [("float32", 20001), ("bfloat16", 20001), ("float32", 100003)]
)
@pytest.mark.parametrize("eps", [0.0, 0.1])
@pytest.mark.parametrize("with_grad", [True, False])
def test_gpu_smem_special_rows(rng, dtype, n, eps, with_grad):
    """ce_smem_kernel's rows of every kind, in one batch: ignored, a bad
    target (NaN loss and gradient row), targets in a row's scalar head and
    tail, -inf logits (a -inf target: infinite loss, finite gradient), NaN
    and +inf (NaN rows). bfloat16 rows hold their exps on chip for the
    gradient (`_holds_exp`), float32 rows their logits; rows of 100003
    go to ce_pair_kernel (head in rank 0's part, tail in rank 1's). The
    loss alone takes ce_block_kernel, four loads a thread, for all of them."""
    from max.dtype import DType

    from max_softmax.devices import device
    from max_softmax.dtypes import to_buffer, to_numpy
    from max_softmax.models import cross_entropy_model

    # Row r starts r * n % V elements past a 16-byte boundary (V = 4
    # float32, 8 bfloat16 elements): row 2 has a head, rows 8 and 9 a tail.
    x = random_logits(rng, (264, n), dtype)
    t = rng.integers(0, n, size=264)
    t[0] = -100  # ignored
    t[1] = n  # bad
    t[2] = 1  # in row 2's head (2 or 6 elements)
    t[8], t[9] = n - 1, n - 2  # in row 8's and row 9's tails
    x[4, ::3] = -np.inf
    t[4] = 3  # a -inf target
    x[5, 100] = np.nan
    x[6, 17] = np.inf
    gpu = device("gpu")
    model = cross_entropy_model(with_grad, getattr(DType, dtype), "gpu", "none")
    args = (x, t, np.array([-100, eps]))
    out = [to_numpy(b) for b in model.execute(*(to_buffer(a).to(gpu) for a in args))]
    loss = out[0]
    assert np.isnan(loss[1])
    good = np.arange(264) != 1
    want_loss, want_grad = reference(x[good], t[good], reduction="none", label_smoothing=eps)
    assert_close(loss[good], want_loss, dtype, "loss")
    assert loss[0] == 0 and np.isposinf(loss[4]) and np.all(np.isnan(loss[5:7]))
    if with_grad:
        dlogits = out[1]
        assert np.all(np.isnan(dlogits[1]))
        assert_close(dlogits[good], want_grad, dtype, "dlogits")
        assert_row_sums(dlogits[good], want_grad, dtype)
        assert np.all(dlogits[0] == 0) and np.all(np.isfinite(dlogits[4]))
        assert np.all(np.isnan(dlogits[5:7]))
