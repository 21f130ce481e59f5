"""Vocab-parallel softmax, log-softmax and cross-entropy over gloo: 2 and 3
processes on 127.0.0.1, uneven slices of the class axis, values and
gradients against a float64 torch reference of the whole row.

One spawn per world size runs every case (a process start and a MAX model
load cost seconds each); a failing case raises in its worker with its name.
On GPUs the same worker runs over NCCL, 2, 3 and 4 processes, one GPU
each, through the launch extension: `pytest --nccl` (tests/conftest.py).
"""

from __future__ import annotations

import datetime
import os
import socket

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from max_softmax.reference import CROSS_ENTROPY_TOLERANCES  # noqa: E402

TOL = {torch.float32: 2e-5, torch.float64: 1e-10, torch.bfloat16: 1.6e-2}
WIDTHS = {1: (14,), 2: (5, 9), 3: (1, 16, 3), 4: (2, 7, 1, 5)}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _close(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype, what: str) -> None:
    g, w = got.detach().to(torch.float64).cpu(), want.detach().to(torch.float64).cpu()
    assert g.shape == w.shape, (what, g.shape, w.shape)
    assert torch.equal(torch.isnan(g), torch.isnan(w)), (what, g, w)
    finite = w[torch.isfinite(w)].abs()
    size = max(float(finite.max()) if finite.numel() else 0.0, 1e-30)
    same = torch.isnan(w) | (g == w)
    diff = torch.where(same, torch.zeros_like(g), (g - w).abs())
    tol = TOL[dtype]
    bound = tol * size + tol * torch.where(same, torch.zeros_like(w), w).abs()
    assert bool((diff <= bound).all()), (what, float(diff.max()), size)


def _slice(full: torch.Tensor, widths, rank: int) -> torch.Tensor:
    start = sum(widths[:rank])
    return full[..., start : start + widths[rank]].contiguous()


def _row_cases(rank, widths, device, dtype):
    from max_softmax.torch.parallel import vocab_parallel_log_softmax, vocab_parallel_softmax

    g = torch.Generator().manual_seed(1)
    for shape in [(6,), (3, 4)]:
        full = torch.randn(*shape, sum(widths), generator=g, dtype=torch.float64) * 3
        full[..., 0, 1] = -float("inf")
        dy = torch.randn(full.shape, generator=g, dtype=torch.float64)
        for kind, fn, ref in [
            ("softmax", vocab_parallel_softmax, torch.softmax),
            ("log_softmax", vocab_parallel_log_softmax, torch.log_softmax),
        ]:
            x = _slice(full, widths, rank).to(device, dtype).requires_grad_()
            y = fn(x)
            y.backward(_slice(dy, widths, rank).to(device, dtype))
            xr = full.clone().requires_grad_()
            yr = ref(xr, -1)
            yr.backward(dy)
            _close(y, _slice(yr, widths, rank), dtype, f"{kind} {shape} {dtype}")
            _close(x.grad, _slice(xr.grad, widths, rank), dtype, f"d{kind} {shape} {dtype}")
    # The class axis first.
    full = torch.randn(sum(widths), 5, generator=g, dtype=torch.float64)
    start = sum(widths[:rank])
    x = full[start : start + widths[rank]].to(device, dtype)
    y = vocab_parallel_softmax(x, dim=0)
    want = torch.softmax(full, 0)[start : start + widths[rank]]
    _close(y, want, dtype, f"softmax dim=0 {dtype}")


def _ce_cases(rank, widths, device, dtype):
    from max_softmax.torch.parallel import vocab_parallel_cross_entropy

    classes = sum(widths)
    g = torch.Generator().manual_seed(2)
    for shape in [(9,), (2, 5)]:
        full = torch.randn(*shape, classes, generator=g, dtype=torch.float64) * 3
        t = torch.randint(0, classes, shape, generator=g)
        t.view(-1)[1] = -100
        t.view(-1)[2] = classes - 1
        t.view(-1)[3] = 0
        for reduction in ["mean", "sum", "none"]:
            for eps in [0.0, 0.1]:
                what = f"ce {shape} {reduction} eps={eps} {dtype}"
                x = _slice(full, widths, rank).to(device, dtype).requires_grad_()
                loss = vocab_parallel_cross_entropy(
                    x, t.to(device), reduction=reduction, label_smoothing=eps
                )
                dl = torch.rand(loss.shape, generator=g, dtype=torch.float64) + 0.5
                loss.backward(dl.to(device, dtype))
                xr = full.clone().requires_grad_()
                lr = F.cross_entropy(
                    xr.movedim(-1, 1) if xr.dim() > 2 else xr,
                    t,
                    reduction=reduction,
                    label_smoothing=eps,
                )
                lr.backward(dl)
                _close(loss, lr, dtype, what)
                _close(x.grad, _slice(xr.grad, widths, rank), dtype, "d" + what)
                # The same loss on every rank.
                everyone = [torch.empty_like(loss) for _ in range(len(widths))]
                dist.all_gather(everyone, loss.detach().contiguous())
                assert all(torch.equal(e, everyone[0]) for e in everyone), what
    # z-loss and softcap, against the same terms written in float64 torch.
    full = torch.randn(2, 5, classes, generator=g, dtype=torch.float64) * 3
    t = torch.randint(0, classes, (2, 5), generator=g)
    t[0, 1] = -100
    for reduction, z, cap in [("mean", 1e-3, None), ("sum", 0.05, 4.0), ("none", 0.0, 2.5)]:
        what = f"ce {reduction} z_loss={z} softcap={cap} {dtype}"
        x = _slice(full, widths, rank).to(device, dtype).requires_grad_()
        loss = vocab_parallel_cross_entropy(
            x, t.to(device), reduction=reduction, label_smoothing=0.1, z_loss=z, softcap=cap
        )
        dl = torch.rand(loss.shape, generator=g, dtype=torch.float64) + 0.5
        loss.backward(dl.to(device, dtype))
        xr = full.clone().requires_grad_()
        y = xr if cap is None else cap * torch.tanh(xr / cap)
        kept = t != -100
        rows = F.cross_entropy(y.movedim(-1, 1), t, reduction="none", label_smoothing=0.1)
        rows = rows + z * torch.where(kept, torch.logsumexp(y, -1) ** 2, torch.zeros_like(rows))
        lr = {"none": rows, "sum": rows.sum(), "mean": rows.sum() / kept.sum()}[reduction]
        lr.backward(dl)
        _close(loss, lr, dtype, what)
        _close(x.grad, _slice(xr.grad, widths, rank), dtype, "d" + what)
    _weighted_cases(rank, widths, device, dtype, g)
    # ignore_index of another value, every row ignored, and a bad target.
    full = torch.randn(4, classes, generator=g, dtype=torch.float64)
    x = _slice(full, widths, rank).to(device, dtype)
    t = torch.tensor([3, 7, 7, 0])
    got = vocab_parallel_cross_entropy(x, t.to(device), ignore_index=7, reduction="none")
    _close(got, F.cross_entropy(full, t, ignore_index=7, reduction="none"), dtype, "ignore 7")
    x = x.clone().requires_grad_()
    loss = vocab_parallel_cross_entropy(x, torch.full((4,), -100, device=device))
    loss.backward()
    assert torch.isnan(loss) and bool((x.grad == 0).all()), "every row ignored"
    if device == "cpu":
        with pytest.raises(ValueError, match="out of range"):
            vocab_parallel_cross_entropy(x, torch.tensor([0, 1, classes, 2]))


WEIGHTED = [
    (reduction, eps, z, cap)
    for reduction in ["mean", "sum", "none"]
    for eps, z, cap in [(0.0, 0.0, None), (0.1, 0.0, None), (0.2, 1e-3, 3.0), (0.0, 0.05, None)]
]


def _weighted_cases(rank, widths, device, dtype, g):
    """Class weights (the whole vector on every rank, one of them 0, one
    target row ignored) against F.cross_entropy(weight=) of the whole row in
    float64; the z-loss is unweighted and inside the mean, as the one-GPU
    cross_entropy's."""
    from max_softmax.torch.parallel import vocab_parallel_cross_entropy

    classes = sum(widths)
    full = torch.randn(2, 5, classes, generator=g, dtype=torch.float64) * 3
    t = torch.randint(0, classes, (2, 5), generator=g)
    t[0, 1] = -100
    t[1, 2] = classes - 1
    w = torch.rand(classes, generator=g, dtype=torch.float64) * 2
    w[t[1, 3]] = 0.0
    for reduction, eps, z, cap in WEIGHTED:
        what = f"weighted ce {reduction} eps={eps} z_loss={z} softcap={cap} {dtype}"
        x = _slice(full, widths, rank).to(device, dtype).requires_grad_()
        loss = vocab_parallel_cross_entropy(
            x,
            t.to(device),
            reduction=reduction,
            label_smoothing=eps,
            z_loss=z,
            softcap=cap,
            weight=w.to(device, dtype),
        )
        dl = torch.rand(loss.shape, generator=g, dtype=torch.float64) + 0.5
        loss.backward(dl.to(device, dtype))
        xr = full.clone().requires_grad_()
        y = xr if cap is None else cap * torch.tanh(xr / cap)
        kept = t != -100
        # The weight as the kernels see it (rounded to the logits' dtype).
        wr = w.to(dtype).to(torch.float64)
        rows = F.cross_entropy(
            y.movedim(-1, 1), t, weight=wr, reduction="none", label_smoothing=eps
        )
        rows = rows + z * torch.where(kept, torch.logsumexp(y, -1) ** 2, torch.zeros_like(rows))
        w_t = torch.where(kept, wr[t.clamp_min(0)], torch.zeros_like(rows))
        lr = {"none": rows, "sum": rows.sum(), "mean": rows.sum() / w_t.sum()}[reduction]
        if reduction == "mean" and not z:
            plain = F.cross_entropy(y.movedim(-1, 1), t, weight=wr, label_smoothing=eps)
            assert torch.allclose(lr, plain), what  # torch's own mean, the same
        lr.backward(dl)
        _close(loss, lr, dtype, what)
        _close(x.grad, _slice(xr.grad, widths, rank), dtype, "d" + what)
    x = _slice(full, widths, rank).to(device, dtype)
    with pytest.raises(ValueError, match="weight"):
        vocab_parallel_cross_entropy(x, t.to(device), weight=w[:-1].to(device, dtype))


def _worker(rank: int, world: int, port: int, backend: str, forced: str | None) -> None:
    os.environ.setdefault("MAX_SOFTMAX_QUIET", "1")
    use_cuda = backend == "nccl"
    device = f"cuda:{rank}" if use_cuda else "cpu"
    if use_cuda:
        torch.cuda.set_device(rank)
        # The launch extension at once (built by the first rank, loaded by the rest),
        # not MAX models while it builds in the background.
        os.environ.setdefault("MAX_SOFTMAX_LAUNCH", "extension")
    # A bounded timeout: a rank that dies makes its peers' collectives fail in minutes,
    # not after the default half hour (mp.spawn then reports the failure).
    dist.init_process_group(
        backend,
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(minutes=10),
    )
    try:
        from max_softmax.torch import parallel

        parallel._FORCED = forced
        widths = WIDTHS[world]
        if use_cuda:
            probe = torch.empty(1, 1, device=device)
            assert parallel.backend(probe) == "extension", parallel.backend(probe)
        # On the CPU the graph path compiles a model per (op, dtype): float32
        # only there (tests/test_sharded.py runs the float64 kernels).
        dtypes = [torch.float32, torch.float64, torch.bfloat16]
        if not use_cuda:
            dtypes = [torch.float32, torch.float64] if forced != "graph" else [torch.float32]
        for dtype in dtypes:
            _row_cases(rank, widths, device, dtype)
            _ce_cases(rank, widths, device, dtype)
    finally:
        dist.destroy_process_group()


@pytest.fixture
def nccl(request) -> bool:
    """Whether this run is over NCCL on GPUs (`pytest --nccl`)."""
    return bool(request.config.getoption("--nccl"))


def _spawn(world: int, nccl: bool, forced: str | None = "graph") -> None:
    backend = "nccl" if nccl else "gloo"
    if nccl:
        forced = None
        if torch.cuda.device_count() < world:
            pytest.skip(f"needs {world} GPUs")
    mp.spawn(_worker, args=(world, _free_port(), backend, forced), nprocs=world, join=True)


@pytest.mark.parametrize("world", [2, 3, 4])
def test_matches_whole_row(world, nccl):
    if world == 4 and not nccl:
        pytest.skip("gloo runs 2 and 3 processes; 4 runs over NCCL on 4 GPUs")
    _spawn(world, nccl)


def test_one_gpu_over_nccl():
    """One rank on one GPU over NCCL (world 1: the collectives are copies),
    through the launch extension: the CUDA kernels with every case, the
    weighted ones included, where no second GPU is at hand."""
    _spawn(1, True)


def test_extension_matches_whole_row(nccl):
    """The launch extension's sharded entries (the path CUDA takes) on the CPU."""
    if nccl:
        pytest.skip("the NCCL run takes the extension already")
    _spawn(2, False, forced="extension")


def test_torch_fallback_matches_whole_row(nccl):
    if nccl:
        pytest.skip("the fallback runs on CPU here")
    _spawn(2, False, forced="torch")


def test_needs_an_initialised_group():
    from max_softmax.torch.parallel import vocab_parallel_softmax

    with pytest.raises(RuntimeError, match="torch.distributed"):
        vocab_parallel_softmax(torch.zeros(2, 3))


@pytest.mark.parametrize(
    "kw, error",
    [
        ({"z_loss": -1.0}, ValueError),
        ({"softcap": float("inf")}, ValueError),
        ({"z_loss": "x"}, TypeError),
    ],
)
def test_bad_cross_entropy_options_are_refused(kw, error):
    """z_loss and softcap are checked before any communication, as the
    one-GPU cross_entropy checks them."""
    from max_softmax.torch.parallel import vocab_parallel_cross_entropy

    with pytest.raises(error, match="z_loss|softcap"):
        vocab_parallel_cross_entropy(torch.zeros(2, 3), torch.zeros(2, dtype=torch.int64), **kw)


def test_cross_entropy_tolerances_are_the_packages():
    assert TOL[torch.float32] == CROSS_ENTROPY_TOLERANCES["float32"]
