"""Fused linear + cross-entropy (torch, numpy, MAX graph) and the in-place
cross-entropy gradient, against float64 references (torch's F.linear +
F.cross_entropy and autograd)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

from max.driver import CPU, Buffer  # noqa: E402
from max.dtype import DType  # noqa: E402
from max.engine import InferenceSession  # noqa: E402
from max.graph import DeviceRef, Graph, TensorType  # noqa: E402

import max_softmax  # noqa: E402
from max_softmax.linear import linear_cross_entropy as np_lce  # noqa: E402
from max_softmax.linear import linear_cross_entropy_with_grad as np_lce_grad  # noqa: E402
from max_softmax.linear_graph import linear_cross_entropy_with_grad as graph_lce_grad  # noqa: E402
from max_softmax.torch import linear as tl  # noqa: E402

ROWS, HIDDEN, CLASSES = 37, 24, 53
IGNORE = -100
DEVICES = [
    "cpu",
    pytest.param(
        "cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
    ),
]


def _inputs(dtype, bias, seed=0, rows=ROWS, classes=CLASSES):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(rows, HIDDEN, generator=g).to(dtype)
    w = (torch.randn(classes, HIDDEN, generator=g) / HIDDEN**0.5).to(dtype)
    b = torch.randn(classes, generator=g).to(dtype) if bias else None
    t = torch.randint(0, classes, (rows,), generator=g)
    t[::5] = IGNORE
    return h, w, b, t


def _reference(h, w, b, t, reduction, eps, grad_out=None, dtype=torch.float64):
    """Loss and (dh, dw, db) by torch autograd in `dtype`."""
    leaves = [None if a is None else a.detach().to(dtype).requires_grad_() for a in (h, w, b)]
    loss = F.cross_entropy(
        F.linear(*leaves),
        t,
        ignore_index=IGNORE,
        reduction=reduction,
        label_smoothing=eps,
    )
    (loss if grad_out is None else loss * grad_out.to(dtype)).sum().backward()
    return loss.detach(), [None if x is None else x.grad for x in leaves]


def _grad_out(reduction):
    if reduction != "none":
        return None
    return torch.linspace(-1.0, 2.0, ROWS, dtype=torch.float64)


def _run_torch(h, w, b, t, reduction, eps, chunk_rows, grad_out=None, device="cpu"):
    """Ours on `device`: the loss and (dh, dw, db), back on the CPU."""
    leaves = [
        None if a is None else a.detach().clone().to(device).requires_grad_() for a in (h, w, b)
    ]
    if grad_out is not None:
        grad_out = grad_out.to(device)
    loss = tl.linear_cross_entropy(
        leaves[0],
        leaves[1],
        t.to(device),
        leaves[2],
        ignore_index=IGNORE,
        reduction=reduction,
        label_smoothing=eps,
        chunk_rows=chunk_rows,
    )
    (loss if grad_out is None else loss * grad_out.to(loss.dtype)).sum().backward()
    return loss.detach().cpu(), [None if x is None else x.grad.cpu() for x in leaves]


def _close_grads(got, want, bound=None):
    """Gradients close to the float64 reference: to float32 precision, or
    (16-bit, `bound` the 16-bit torch path's own errors) within twice
    torch's error plus a rounding of the largest entry."""
    for k, (g, r) in enumerate(zip(got, want)):
        if r is None:
            assert g is None
            continue
        err = (g.double() - r).abs().max().item()
        if bound is None:
            assert err <= 1e-5 * max(1.0, r.abs().max().item()), (k, err)
        else:
            assert err <= 2 * bound[k] + 2**-8 * r.abs().max().item(), (k, err, bound[k])


@pytest.mark.parametrize("chunk_rows", [None, 7, 16])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("device", DEVICES)
def test_torch_matches_reference(device, dtype, reduction, bias, chunk_rows):
    """Loss and gradients of every reduction, with and without bias, in
    chunks that do and do not divide the rows (on CUDA, two chunk buffers
    taking turns), against float64."""
    eps = 0.1 if bias else 0.0
    h, w, b, t = _inputs(dtype, bias)
    go = _grad_out(reduction)
    loss, grads = _run_torch(h, w, b, t, reduction, eps, chunk_rows, go, device)
    want, want_grads = _reference(h, w, b, t, reduction, eps, go)
    if dtype == torch.float32:
        assert loss.dtype == torch.float32
        torch.testing.assert_close(loss.double(), want, rtol=1e-5, atol=1e-5)
        _close_grads(grads, want_grads)
        return
    assert loss.dtype == torch.float32  # 16-bit inputs: a float32 loss
    ref32, _ = _reference(h, w, b, t, reduction, eps, go, dtype=torch.float32)
    if reduction == "none":  # each row's loss rounded to bfloat16
        torch.testing.assert_close(loss, ref32, rtol=2**-8, atol=1e-3)
    else:
        assert abs(loss.item() - ref32.item()) <= 1e-3 * abs(ref32.item())
    _, torch16 = _reference(h, w, b, t, reduction, eps, go, dtype=dtype)
    bound = [
        None if g is None else (g.double() - r).abs().max().item()
        for g, r in zip(torch16, want_grads)
    ]
    _close_grads(grads, want_grads, bound)


def test_torch_multi_dim_input_and_only_some_grads():
    """(B, T, H) input with (B, T) targets; a weight without grad gets none."""
    h, w, _, t = _inputs(torch.float32, False, rows=24)
    h3 = h.reshape(4, 6, HIDDEN).requires_grad_()
    loss = tl.linear_cross_entropy(h3, w, t.reshape(4, 6), reduction="none", chunk_rows=5)
    assert loss.shape == (4, 6)
    loss.sum().backward()
    want, (dh, _, _) = _reference(h, w, None, t, "none", 0.0)
    torch.testing.assert_close(loss.double().reshape(-1), want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(h3.grad.double().reshape(-1, HIDDEN), dh, rtol=1e-5, atol=1e-5)
    assert w.grad is None


def test_torch_no_grad_and_retain_graph():
    """Under no_grad only the loss is computed; a second backward
    (retain_graph) runs the chunks again and gives the same gradients."""
    h, w, b, t = _inputs(torch.float32, True)
    with torch.no_grad():
        loss0 = tl.linear_cross_entropy(h, w, t, b, chunk_rows=8)
    hg = h.clone().requires_grad_()
    loss = tl.linear_cross_entropy(hg, w, t, b, chunk_rows=8)
    torch.testing.assert_close(loss0, loss.detach())
    (2 * loss).backward(retain_graph=True)
    first = hg.grad.clone()
    hg.grad = None
    (2 * loss).backward()
    torch.testing.assert_close(hg.grad, first)
    _, (dh, _, _) = _reference(h, w, b, t, "mean", 0.0)
    torch.testing.assert_close(first.double(), 2 * dh, rtol=1e-5, atol=1e-6)


def test_torch_every_row_ignored():
    """ "mean" over no kept row: NaN loss and zero gradients, as torch."""
    h, w, _, t = _inputs(torch.float32, False)
    hg = h.clone().requires_grad_()
    loss = tl.linear_cross_entropy(hg, w, torch.full_like(t, IGNORE))
    loss.backward()
    assert torch.isnan(loss)
    assert torch.count_nonzero(hg.grad) == 0


def test_torch_empty_batch():
    h = torch.zeros(0, HIDDEN, requires_grad=True)
    w = torch.randn(CLASSES, HIDDEN, requires_grad=True)
    t = torch.zeros(0, dtype=torch.int64)
    assert torch.isnan(tl.linear_cross_entropy(h, w, t))
    loss = tl.linear_cross_entropy(h, w, t, reduction="sum")
    loss.backward()
    assert loss.item() == 0 and torch.count_nonzero(w.grad) == 0


def test_torch_graph_launch_path(monkeypatch):
    """The MAX model path (no launch extension), bf16 in place, matches."""
    monkeypatch.setattr(tl.torch_launch, "available", lambda cuda=False: False)
    h, w, b, t = _inputs(torch.bfloat16, True)
    loss, grads = _run_torch(h, w, b, t, "mean", 0.0, 16)
    monkeypatch.undo()
    want, want_grads = _run_torch(h, w, b, t, "mean", 0.0, 16)
    torch.testing.assert_close(loss, want)
    for g, r in zip(grads, want_grads):
        torch.testing.assert_close(g, r)


def test_torch_errors():
    h, w, b, t = _inputs(torch.float32, True)
    with pytest.raises(NotImplementedError, match="z_loss"):
        tl.linear_cross_entropy(h, w, t, z_loss=1e-4)
    with pytest.raises(NotImplementedError, match="softcap"):
        tl.linear_cross_entropy(h, w, t, softcap=30.0)
    with pytest.raises(ValueError, match="weight"):
        tl.linear_cross_entropy(h, w.t(), t)
    with pytest.raises(ValueError, match="target"):
        tl.linear_cross_entropy(h, w, t[:-1])
    with pytest.raises(ValueError, match="bias"):
        tl.linear_cross_entropy(h, w, t, b[:-1])
    with pytest.raises(TypeError, match="dtype"):
        tl.linear_cross_entropy(h, w.double(), t)
    with pytest.raises(TypeError, match="integer"):
        tl.linear_cross_entropy(h, w, t.float())
    with pytest.raises(ValueError, match="out of range"):
        tl.linear_cross_entropy(h, w, torch.full_like(t, CLASSES))
    with pytest.raises(ValueError, match="chunk_rows"):
        tl.linear_cross_entropy(h, w, t, chunk_rows=0)


def test_chunk_rows_for_budget(monkeypatch):
    monkeypatch.setattr(tl, "CHUNK_BYTES", 256 * 2**20)
    assert tl.chunk_rows_for(8192, 128256, 2, 1) == 1024  # 1046, cut to whole 128s
    assert tl.chunk_rows_for(8192, 128256, 2, 2) == 512
    assert tl.chunk_rows_for(100, 128256, 2, 1) == 100
    assert tl.chunk_rows_for(10, 2**40, 4, 1) == 1


# The in-place gradient.


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_cpu_kernel_in_place_for_16bit(dtype):
    """The CPU kernel writes dlogits over the logits correctly for 16-bit
    rows (its exps are parked in a scratch row): `inplace_safe`."""
    x = torch.randn(29, 301).to(dtype)
    t = torch.randint(0, 301, (29,))
    t[3] = IGNORE
    options = tl._options(x.device, IGNORE, 0.1)
    loss, grad = torch.empty(1, dtype=dtype), torch.empty_like(x)
    tl.cross_entropy_into(loss, grad, x, t, options, "mean")
    y, loss_in = x.clone(), torch.empty(1, dtype=dtype)
    assert tl.inplace_safe(y)
    tl.cross_entropy_into(loss_in, y, y, t, options, "mean")
    assert torch.equal(loss_in, loss) and torch.equal(y, grad)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("device", DEVICES)
def test_cross_entropy_inplace(device, dtype, reduction):
    """The gradient lands in the logits' memory and equals the fused
    cross-entropy's (float32/float64 on the CPU through a copy)."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(31, 67, generator=g).to(dtype)
    t = torch.randint(0, 67, (31,), generator=g)
    t[::4] = IGNORE
    go = torch.linspace(0.5, 1.5, 31, dtype=dtype) if reduction == "none" else None
    leaf = x.clone().to(device).requires_grad_()
    work = leaf * 1  # a non-leaf whose memory the gradient overwrites
    loss = tl.cross_entropy_inplace(work, t.to(device), IGNORE, reduction, 0.05)
    (loss if go is None else loss * go.to(device)).sum().backward()
    loss, work, leaf_grad = loss.detach().cpu(), work.detach().cpu(), leaf.grad.cpu()
    ref = x.double().requires_grad_()
    want = F.cross_entropy(ref, t, ignore_index=IGNORE, reduction=reduction, label_smoothing=0.05)
    (want if go is None else want * go.double()).sum().backward()
    tol = 1e-6 if dtype != torch.bfloat16 else 2e-2
    torch.testing.assert_close(loss.double().reshape(want.shape), want.detach(), rtol=tol, atol=tol)
    torch.testing.assert_close(leaf_grad.double(), ref.grad, rtol=tol, atol=tol * 1e-1)
    assert torch.equal(work, leaf_grad)  # the logits now hold the gradient
    with pytest.raises(RuntimeError, match="backward twice"):
        tl._CrossEntropyInplace.backward(_Ctx(), torch.ones(()))


class _Ctx:
    grad = None
    reduction = "mean"


# numpy and MAX graph paths (CPU).


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16])
def test_numpy_matches_reference(dtype, bias, reduction):
    th, tw, tb, tt = _inputs(torch.float32, bias)
    h, w = th.numpy().astype(dtype), tw.numpy().astype(dtype)
    b = None if tb is None else tb.numpy().astype(dtype)
    t = tt.numpy()
    out = np_lce_grad(h, w, t, b, reduction=reduction, label_smoothing=0.1, chunk_rows=10)
    assert len(out) == (4 if bias else 3)
    args = [torch.from_numpy(np.asarray(a, dtype=np.float64)) for a in (h, w)]
    bt = None if b is None else torch.from_numpy(b.astype(np.float64))
    want, want_grads = _reference(*args, bt, tt, reduction, 0.1)
    bf16 = dtype != np.float32
    tol = 1e-5 if not bf16 else 1e-2
    loss = torch.from_numpy(np.asarray(out[0], dtype=np.float64))
    assert out[0].dtype == np.float32
    torch.testing.assert_close(loss, want, rtol=tol if reduction == "none" else tol / 10, atol=tol)
    for got, ref in zip(out[1:], want_grads):
        assert got.dtype == h.dtype
        scale = ref.abs().max().item()
        err = np.abs(got.astype(np.float64) - ref.numpy()).max()
        assert err <= tol * max(scale, 1e-3) * (4 if bf16 else 1), err
    only = np_lce(h, w, t, b, reduction=reduction, label_smoothing=0.1)
    np.testing.assert_allclose(only, out[0], rtol=1e-6)


@pytest.mark.parametrize(
    ("rows", "chunk_rows", "bias", "reduction"),
    [(ROWS, 10, True, "mean"), ("rows", None, False, "none")],
)
def test_graph_matches_reference(rows, chunk_rows, bias, reduction):
    """MAX graph ops on the CPU: static rows in static chunks, symbolic
    rows in one chunk."""
    th, tw, tb, tt = _inputs(torch.float32, bias)
    ref = DeviceRef.CPU()
    types = [
        TensorType(DType.float32, [rows, HIDDEN], ref),
        TensorType(DType.float32, [CLASSES, HIDDEN], ref),
        TensorType(DType.int64, [rows], ref),
    ] + ([TensorType(DType.float32, [CLASSES], ref)] if bias else [])
    with Graph("lce", input_types=types, custom_extensions=[max_softmax.KERNELS]) as g:
        ins = [v.tensor for v in g.inputs]
        outs = graph_lce_grad(
            ins[0],
            ins[1],
            ins[2],
            ins[3] if bias else None,
            reduction=reduction,
            label_smoothing=0.1,
            chunk_rows=chunk_rows,
        )
        g.output(*outs)
    model = InferenceSession(devices=[CPU()]).load(g)
    arrays = [th.numpy(), tw.numpy(), tt.numpy()] + ([tb.numpy()] if bias else [])
    got = [o.to_numpy() for o in model.execute(*(Buffer.from_numpy(a) for a in arrays))]
    want, want_grads = _reference(th, tw, tb, tt, reduction, 0.1)
    np.testing.assert_allclose(got[0], want.numpy(), rtol=1e-5, atol=1e-5)
    for a, r in zip(got[1:], [x for x in want_grads if x is not None]):
        np.testing.assert_allclose(a, r.numpy(), rtol=1e-4, atol=1e-6)
