"""Fused linear + cross-entropy (torch, numpy, MAX graph) and the in-place
cross-entropy gradient, against float64 references (torch's F.linear +
F.cross_entropy and autograd), with z_loss, softcap and class weights
composed with ignore_index, label smoothing and every reduction."""

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


def _class_weight(seed=0, classes=CLASSES):
    """Positive class weights, float32."""
    g = torch.Generator().manual_seed(100 + seed)
    return torch.rand(classes, generator=g) * 1.8 + 0.2


def _reference(
    h,
    w,
    b,
    t,
    reduction,
    eps,
    grad_out=None,
    dtype=torch.float64,
    z_loss=0.0,
    softcap=None,
    class_weight=None,
):
    """Loss and (dh, dw, db) by torch autograd in `dtype`: the logits
    capped by c tanh(x / c), F.cross_entropy with torch's class weights and
    smoothing, z_loss lse^2 added a kept row, "mean" over the sum of the
    kept rows' target weights (checked against F.cross_entropy's own mean
    where there is no z-loss)."""
    leaves = [
        None if a is None else a.detach().clone().to(dtype).requires_grad_() for a in (h, w, b)
    ]
    y = F.linear(*leaves)
    if softcap:
        y = softcap * torch.tanh(y / softcap)
    cw = None if class_weight is None else class_weight.to(dtype)
    kw = {"weight": cw, "ignore_index": IGNORE, "label_smoothing": eps}
    rows = F.cross_entropy(y, t, reduction="none", **kw)
    kept = (t != IGNORE).to(dtype)
    if z_loss:
        rows = rows + z_loss * torch.logsumexp(y, -1) ** 2 * kept
    if reduction == "none":
        loss = rows
    elif reduction == "sum":
        loss = rows.sum()
    else:
        safe = torch.where(t != IGNORE, t, torch.zeros_like(t))
        loss = rows.sum() / (kept * (1.0 if cw is None else cw[safe])).sum()
        if not z_loss and dtype == torch.float64:
            torch.testing.assert_close(loss, F.cross_entropy(y, t, reduction="mean", **kw))
    (loss if grad_out is None else loss * grad_out.to(dtype)).sum().backward()
    return loss.detach(), [None if x is None else x.grad for x in leaves]


def _grad_out(reduction):
    if reduction != "none":
        return None
    return torch.linspace(-1.0, 2.0, ROWS, dtype=torch.float64)


def _run_torch(h, w, b, t, reduction, eps, chunk_rows, grad_out=None, device="cpu", **options):
    """Ours on `device` (`options`: z_loss, softcap, class_weight): the
    loss and (dh, dw, db), back on the CPU."""
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
        **{k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in options.items()},
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


# (z_loss, softcap, class weights?): every combination of the three.
OPTION_SETS = [
    pytest.param(z, cap, cw, id=f"z{int(bool(z))}-cap{int(bool(cap))}-cw{int(cw)}")
    for z in (0.0, 1e-2)
    for cap in (None, 2.0)
    for cw in (False, True)
]
SMOOTHING = [pytest.param(0.0, id="eps0"), pytest.param(0.1, id="eps0.1")]


def _options(z_loss, softcap, cw, seed=0):
    """The keyword options of one OPTION_SETS entry (class weights float32)."""
    return {
        "z_loss": z_loss,
        "softcap": softcap,
        "class_weight": _class_weight(seed) if cw else None,
    }


def _loss_tolerance(dtype):
    """(rtol, atol) of a loss against float64, by input dtype (16-bit:
    against the float32 reference; rows rounded to bfloat16)."""
    return {torch.float64: (1e-10, 1e-10), torch.float32: (1e-5, 1e-5)}.get(dtype, (2**-8, 1e-3))


@pytest.mark.parametrize(("z_loss", "softcap", "cw"), OPTION_SETS)
@pytest.mark.parametrize("eps", SMOOTHING)
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("device", DEVICES)
def test_torch_options_match_reference(device, dtype, reduction, eps, z_loss, softcap, cw):
    """z_loss, softcap and class weights, each alone and together, with
    ignore_index, label smoothing and every reduction: the loss and the
    gradients wrt input, weight and bias against float64 autograd (16-bit:
    within twice torch's own 16-bit error), in chunks that do not divide
    the rows."""
    options = _options(z_loss, softcap, cw)
    h, w, b, t = _inputs(dtype, True)
    go = _grad_out(reduction)
    loss, grads = _run_torch(h, w, b, t, reduction, eps, 10, go, device, **options)
    want, want_grads = _reference(h, w, b, t, reduction, eps, go, **options)
    assert loss.dtype == (torch.float64 if dtype == torch.float64 else torch.float32)
    rtol, atol = _loss_tolerance(dtype)
    if dtype != torch.bfloat16:
        torch.testing.assert_close(loss.double(), want, rtol=rtol, atol=atol)
        _close_grads(grads, want_grads, None if dtype == torch.float32 else [1e-12] * 3)
        return
    ref32, _ = _reference(h, w, b, t, reduction, eps, go, dtype=torch.float32, **options)
    torch.testing.assert_close(loss, ref32, rtol=rtol, atol=atol)
    _, torch16 = _reference(h, w, b, t, reduction, eps, go, dtype=dtype, **options)
    bound = [(g.double() - r).abs().max().item() for g, r in zip(torch16, want_grads)]
    _close_grads(grads, want_grads, bound)


def test_torch_options_no_grad_retain_graph_and_multi_dim():
    """With every option on: (B, T, H) input, the loss under no_grad equals
    the differentiable one, and a second backward (retain_graph) runs the
    chunks again and gives the same gradients as the float64 reference."""
    options = _options(1e-2, 2.0, True)
    h, w, b, t = _inputs(torch.float32, True, rows=24)
    with torch.no_grad():
        loss0 = tl.linear_cross_entropy(h, w, t, b, chunk_rows=5, **options)
    h3 = h.reshape(4, 6, HIDDEN).clone().requires_grad_()
    loss = tl.linear_cross_entropy(h3, w, t.reshape(4, 6), b, chunk_rows=5, **options)
    torch.testing.assert_close(loss0, loss.detach())
    (2 * loss).backward(retain_graph=True)
    first = h3.grad.clone()
    h3.grad = None
    (2 * loss).backward()
    torch.testing.assert_close(h3.grad, first)
    want, (dh, _, _) = _reference(h, w, b, t, "mean", 0.0, **options)
    torch.testing.assert_close(loss.double(), want, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(first.double().reshape(-1, HIDDEN), 2 * dh, rtol=1e-5, atol=1e-6)


def test_torch_options_every_row_ignored_and_zero_weights():
    """ "mean" with nothing to divide by (every row ignored, or every kept
    target weighted 0): a NaN loss and zero gradients, never a crash."""
    h, w, _, t = _inputs(torch.float32, False)
    for target, cw in ((torch.full_like(t, IGNORE), _class_weight()), (t, torch.zeros(CLASSES))):
        hg = h.clone().requires_grad_()
        loss = tl.linear_cross_entropy(hg, w, target, z_loss=1e-2, softcap=2.0, class_weight=cw)
        loss.backward()
        assert torch.isnan(loss)
        assert torch.count_nonzero(hg.grad) == 0


def test_torch_options_softcap_zero_is_off():
    """softcap=0 and z_loss=0 are the plain loss (the plain kernel runs)."""
    h, w, b, t = _inputs(torch.float32, True)
    plain = tl.linear_cross_entropy(h, w, t, b)
    torch.testing.assert_close(tl.linear_cross_entropy(h, w, t, b, softcap=0.0, z_loss=0), plain)


def test_torch_options_inplace_over_fp32_cpu_logits():
    """On the CPU the extended kernel may write dlogits over float32/float64
    logits (`inplace_safe`): in place equals into a buffer of its own."""
    x = torch.randn(29, 301, dtype=torch.float64) * 5
    t = torch.randint(0, 301, (29,))
    t[3] = IGNORE
    options = tl._options(x.device, IGNORE, 0.1, 1e-2, 3.0, _class_weight(classes=301))
    assert tl.inplace_safe(x, tl._extended(options)) and not tl.inplace_safe(x)
    loss, grad = torch.empty(29, dtype=x.dtype), torch.empty_like(x)
    tl.cross_entropy_into(loss, grad, x, t, options, "none")
    y, loss_in = x.clone(), torch.empty(29, dtype=x.dtype)
    tl.cross_entropy_into(loss_in, y, y, t, options, "none")
    assert torch.equal(loss_in, loss) and torch.equal(y, grad)


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


# Bad option values, each front door: (id, options given `array`, which
# makes a class-weight of the front door's kind from a list, error, match).
BAD_OPTIONS = [
    ("z_loss<0", lambda a: {"z_loss": -1e-4}, ValueError, "z_loss"),
    ("z_loss=nan", lambda a: {"z_loss": float("nan")}, ValueError, "z_loss"),
    ("z_loss=inf", lambda a: {"z_loss": float("inf")}, ValueError, "z_loss"),
    ("z_loss=str", lambda a: {"z_loss": "1e-4"}, TypeError, "z_loss"),
    ("z_loss=bool", lambda a: {"z_loss": True}, TypeError, "z_loss"),
    ("softcap<0", lambda a: {"softcap": -30.0}, ValueError, "softcap"),
    ("softcap=inf", lambda a: {"softcap": float("inf")}, ValueError, "softcap"),
    ("softcap=str", lambda a: {"softcap": "30"}, TypeError, "softcap"),
    ("cw-shape", lambda a: {"class_weight": a([1.0] * (CLASSES - 1))}, ValueError, "class_weight"),
    ("cw-2d", lambda a: {"class_weight": a([[1.0] * CLASSES])}, ValueError, "class_weight"),
    ("cw-bool", lambda a: {"class_weight": a([True] * CLASSES)}, TypeError, "class_weight"),
    ("chunk_rows=0", lambda a: {"chunk_rows": 0}, ValueError, "chunk_rows"),
]
BAD_IDS = [b[0] for b in BAD_OPTIONS]


@pytest.mark.parametrize(("name", "options", "error", "match"), BAD_OPTIONS, ids=BAD_IDS)
def test_torch_bad_options(name, options, error, match):
    h, w, b, t = _inputs(torch.float32, True)
    with pytest.raises(error, match=match):
        tl.linear_cross_entropy(h, w, t, b, **options(torch.tensor))


def test_torch_class_weight_not_a_tensor():
    h, w, _, t = _inputs(torch.float32, False)
    with pytest.raises(TypeError, match="class_weight"):
        tl.linear_cross_entropy(h, w, t, class_weight=[1.0] * CLASSES)


@pytest.mark.parametrize(("name", "options", "error", "match"), BAD_OPTIONS, ids=BAD_IDS)
def test_numpy_bad_options(name, options, error, match):
    h, w, b, t = (a.numpy() for a in _inputs(torch.float32, True))
    with pytest.raises(error, match=match):
        np_lce_grad(h, w, t, b, **options(np.asarray))


@pytest.mark.parametrize(("name", "options", "error", "match"), BAD_OPTIONS, ids=BAD_IDS)
def test_graph_bad_options(name, options, error, match):
    """Raised while the graph is built (nothing compiles)."""
    ref = DeviceRef.CPU()
    types = [
        TensorType(DType.float32, [ROWS, HIDDEN], ref),
        TensorType(DType.float32, [CLASSES, HIDDEN], ref),
        TensorType(DType.int64, [ROWS], ref),
    ]
    with Graph("lce_bad", input_types=types, custom_extensions=[max_softmax.KERNELS]) as g:
        ins = [v.tensor for v in g.inputs]
        with pytest.raises(error, match=match):
            graph_lce_grad(*ins, **options(np.asarray))


def test_chunk_rows_for_budget():
    budget = 256 * 2**20
    assert tl.chunk_rows_for(8192, 128256, 2, 1, budget) == 1024  # 1046, cut to whole 128s
    assert tl.chunk_rows_for(8192, 128256, 2, 2, budget) == 512
    assert tl.chunk_rows_for(100, 128256, 2, 1, budget) == 100
    assert tl.chunk_rows_for(10, 2**40, 4, 1, budget) == 1
    assert tl.chunk_rows_for(8192, 128256, 2, 1) == 2048  # CHUNK_BYTES, 512 MiB
    assert tl.chunk_rows_for(16384, 256000, 2, 1) == 2048  # Gemma-2: 1/8 of its logits


@pytest.mark.parametrize(
    ("logits_bytes", "budget"),
    [
        (16 * 2**20, 512 * 2**20),  # small logits: the least budget
        (8192 * 128256 * 2, 512 * 2**20),  # Llama-3: 1/8 is 263 MB, under 512 MiB
        (16384 * 256000 * 2, 16384 * 256000 * 2 // 8),  # Gemma-2's 8.4 GB: 1/8
        (8 * 2**30, 2**30),  # 1/8 of 8 GiB, the cap
        (64 * 2**30, 2**30),  # capped
    ],
)
def test_default_chunk_budget_grows_with_the_logits(logits_bytes, budget):
    """512 MiB, or 1/8 of the logits where that is more, at most 1 GiB."""
    assert tl.default_chunk_bytes(logits_bytes) == budget


@pytest.mark.parametrize("overlap", [False, True])
def test_torch_chunk_bytes_and_overlap_are_arguments(monkeypatch, overlap):
    """`chunk_bytes=` sizes the chunks (here 3 rows of float32 logits with
    their gradient buffer) and `overlap=` is taken (it acts on CUDA only):
    the loss and gradients still those of the float64 whole."""
    sizes = []
    real = tl.chunk_rows_for
    monkeypatch.setattr(
        tl, "chunk_rows_for", lambda *a, **k: sizes.append(real(*a, **k)) or sizes[-1]
    )
    h, w, b, t = _inputs(torch.float32, True)
    leaves = [a.clone().requires_grad_() for a in (h, w, b)]
    loss = tl.linear_cross_entropy(
        *leaves[:2], t, leaves[2], chunk_bytes=3 * CLASSES * 4 * 2, overlap=overlap
    )
    loss.backward()
    assert sizes == [3]
    ref = [a.double().requires_grad_() for a in (h, w, b)]
    want = F.cross_entropy(F.linear(ref[0], ref[1], ref[2]), t)
    want.backward()
    assert abs(loss.item() - want.item()) <= 1e-5 * abs(want.item())
    _close_grads([x.grad for x in leaves], [x.grad for x in ref])
    with pytest.raises(ValueError, match="chunk_bytes"):
        tl.linear_cross_entropy(h, w, t, chunk_bytes=0)


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


NP_DTYPES = [
    pytest.param(np.float32, id="float32"),
    pytest.param(np.float64, id="float64"),
    pytest.param(ml_dtypes.bfloat16, id="bfloat16"),
]


@pytest.mark.parametrize(("z_loss", "softcap", "cw"), OPTION_SETS)
@pytest.mark.parametrize("eps", SMOOTHING)
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("dtype", NP_DTYPES)
def test_numpy_options_match_reference(dtype, reduction, eps, z_loss, softcap, cw):
    """The numpy front door with z_loss, softcap and class weights (every
    combination, ignore_index, smoothing, each reduction): the loss and
    (dinput, dweight, dbias) against float64 autograd of the same
    (16-bit-valued) inputs."""
    options = _options(z_loss, softcap, cw)
    th, tw, tb, tt = _inputs(torch.float32, True)
    h, w, b = (a.numpy().astype(dtype) for a in (th, tw, tb))
    cw_array = None if options["class_weight"] is None else options["class_weight"].numpy()
    np_options = {**options, "class_weight": cw_array}
    out = np_lce_grad(
        h, w, tt.numpy(), b, reduction=reduction, label_smoothing=eps, chunk_rows=10, **np_options
    )
    as64 = [torch.from_numpy(np.asarray(a, dtype=np.float64)) for a in (h, w, b)]
    want, want_grads = _reference(*as64, tt, reduction, eps, **options)
    tol = {np.float64: 1e-10, np.float32: 1e-5}.get(dtype, 1e-2)
    assert out[0].dtype == (np.float64 if dtype == np.float64 else np.float32)
    loss = torch.from_numpy(np.asarray(out[0], dtype=np.float64))
    torch.testing.assert_close(loss, want, rtol=tol, atol=tol)
    for got, ref in zip(out[1:], want_grads):
        assert got.dtype == h.dtype
        err = np.abs(got.astype(np.float64) - ref.numpy()).max()
        assert err <= tol * max(ref.abs().max().item(), 1e-3) * (4 if tol == 1e-2 else 1), err
    only = np_lce(h, w, tt.numpy(), b, reduction=reduction, label_smoothing=eps, **np_options)
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


# The MAX graph front door with the options: one graph (a graph's compile
# takes minutes on a busy CPU) holds every (z_loss, softcap, class weights)
# combination once, the reductions taking turns so that each meets the class
# weights; class weights as a graph input for "sum", a host array otherwise.
# (The torch and numpy tests cover every combination x reduction x dtype on
# the same kernel.)

GRAPH_CASES = [(*p.values, ("mean", "sum", "none")[i % 3]) for i, p in enumerate(OPTION_SETS)]


@pytest.fixture(scope="module")
def graph_options_results():
    """{(z_loss, softcap, cw, reduction): [loss, dh, dw, db]} from one graph
    (static rows in chunks of 20: the last chunk is not full)."""
    th, tw, tb, tt = _inputs(torch.float32, True)
    cw = _class_weight()
    ref = DeviceRef.CPU()
    types = [
        TensorType(DType.float32, [ROWS, HIDDEN], ref),
        TensorType(DType.float32, [CLASSES, HIDDEN], ref),
        TensorType(DType.int64, [ROWS], ref),
        TensorType(DType.float32, [CLASSES], ref),
        TensorType(DType.float32, [CLASSES], ref),
    ]
    counts = []
    with Graph("lce_options", input_types=types, custom_extensions=[max_softmax.KERNELS]) as g:
        h, w, t, b, cw_in = (v.tensor for v in g.inputs)
        outs = []
        for z, cap, use_cw, reduction in GRAPH_CASES:
            weight = None
            if use_cw:
                weight = cw_in if reduction == "sum" else cw.numpy()
            got = graph_lce_grad(
                h,
                w,
                t,
                b,
                reduction=reduction,
                label_smoothing=0.1,
                z_loss=z,
                softcap=cap,
                class_weight=weight,
                chunk_rows=20,
            )
            counts.append(len(got))
            outs.extend(got)
        g.output(*outs)
    model = InferenceSession(devices=[CPU()]).load(g)
    arrays = [th.numpy(), tw.numpy(), tt.numpy(), tb.numpy(), cw.numpy()]
    flat = [o.to_numpy() for o in model.execute(*(Buffer.from_numpy(a) for a in arrays))]
    results, k = {}, 0
    for case, n in zip(GRAPH_CASES, counts):
        results[case] = flat[k : k + n]
        k += n
    return results


@pytest.mark.parametrize(("z_loss", "softcap", "cw", "reduction"), GRAPH_CASES)
def test_graph_options_match_reference(graph_options_results, z_loss, softcap, cw, reduction):
    """Loss and (dinput, dweight, dbias) of the graph ops against float64
    autograd, with label smoothing and ignored rows."""
    got = graph_options_results[(z_loss, softcap, cw, reduction)]
    th, tw, tb, tt = _inputs(torch.float32, True)
    want, want_grads = _reference(th, tw, tb, tt, reduction, 0.1, **_options(z_loss, softcap, cw))
    np.testing.assert_allclose(got[0], want.numpy(), rtol=1e-5, atol=1e-5)
    assert len(got) == 4
    for a, r in zip(got[1:], want_grads):
        np.testing.assert_allclose(a, r.numpy(), rtol=1e-4, atol=1e-6)
