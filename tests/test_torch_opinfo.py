"""torch's own test samples against the bridge, on the CPU (and CUDA where
there is one; those cases carry a "-cuda" id and are skipped without): the OpInfo
samples of `softmax`, `log_softmax` (and their `with_dtype` variants),
`_softmax_backward_data` and `nn.functional.cross_entropy`, and the
ModuleInfo samples of Softmax, LogSoftmax, Softmax2d and CrossEntropyLoss.

Each sample checks values against torch's (float32/float64 at torch's
tolerances; in 16 bits our error against float64 is at most torch's plus
one unit in the last place), float64 gradcheck, gradgradcheck and
forward-AD checks, and `torch.func.grad`, `jvp` and `vmap` against torch's.
Class-weighted samples run too. Needs torch and expecttest (torch.testing._internal imports it).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (extra [torch])")
pytest.importorskip("expecttest", reason="torch.testing._internal needs expecttest")
mst = pytest.importorskip("max_softmax.torch")

from torch.func import grad, jvp, vmap  # noqa: E402
from torch.testing._internal.common_methods_invocations import op_db  # noqa: E402
from torch.testing._internal.common_modules import module_db  # noqa: E402

from max_softmax.torch._autograd import row_backward  # noqa: E402

F = torch.nn.functional
FLOATS = (torch.float32, torch.float64, torch.bfloat16, torch.float16)
NO_CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")


DEVICES = (("cpu", "", []), ("cuda", "-cuda", [NO_CUDA]))
"""(device, id suffix, marks): CPU cases keep their plain ids; CUDA ones are
skipped without CUDA."""


def _sampled_on(device: str) -> str:
    """Where to count a device's samples: CUDA can have more (float32
    `_softmax_backward_data` adds float16 outputs there); without CUDA its
    cases are skipped, and the CPU's count stands in."""
    return "cpu" if device == "cuda" and not torch.cuda.is_available() else device


def _sbd(grad_output, output, dim, input_dtype):
    """torch._softmax_backward_data by our softmax_backward op (differentiable)."""
    assert input_dtype == output.dtype
    return row_backward("softmax_backward", output, grad_output, dim)


OURS = {
    "softmax": mst.softmax,
    "log_softmax": mst.log_softmax,
    "_softmax_backward_data": _sbd,
    "nn.functional.cross_entropy": mst.cross_entropy,
}
OPS = [op for op in op_db if op.name in OURS]


def _op_cases(dtypes: tuple) -> list:
    """(op, dtype, sample index, device) params, with a readable id; samples
    needing what the bridge refuses are marked skip."""
    cases = []
    for op in OPS:
        variant = f".{op.variant_test_name}" if op.variant_test_name else ""
        extra = (torch.int64,) if op.variant_test_name == "with_dtype" else ()
        for dtype in (*dtypes, *extra) if len(dtypes) > 1 else dtypes:
            for device, suffix, marks in DEVICES:
                for i, _ in enumerate(op.sample_inputs(_sampled_on(device), dtype)):
                    name = f"{op.name}{variant}-{str(dtype)[6:]}-{i}{suffix}"
                    cases.append(pytest.param(op, dtype, i, device, id=name, marks=marks))
    return cases


def _sample(op, dtype, i, device, requires_grad=False):
    return list(op.sample_inputs(device, dtype, requires_grad=requires_grad))[i]


def _call(fn, sample, *tensors):
    """`fn` on a sample, with its input and tensor args replaced by `tensors`
    (in order) where given."""
    it = iter(tensors)
    inp = next(it, sample.input)
    args = [next(it, a) if isinstance(a, torch.Tensor) else a for a in sample.args]
    if tensors:  # _softmax_backward_data's input_dtype follows the tensors
        args = [inp.dtype if isinstance(a, torch.dtype) else a for a in args]
    kwargs = sample.kwargs
    if tensors:  # a float64 reference widens tensor kwargs (class weights) too
        wide = any(t.dtype == torch.float64 for t in tensors if isinstance(t, torch.Tensor))
        kwargs = {
            k: v.double() if wide and isinstance(v, torch.Tensor) and v.is_floating_point() else v
            for k, v in kwargs.items()
        }
    return fn(inp, *args, **kwargs)


def _float_tensors(sample) -> list:
    """The sample's input and tensor args, and which are differentiable."""
    tensors = [sample.input, *(a for a in sample.args if isinstance(a, torch.Tensor))]
    return tensors, [t.is_floating_point() for t in tensors]


def _ulp(ref: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """One unit in the last place of `ref` in `dtype` (float64 result)."""
    tiny = torch.finfo(dtype).tiny
    return ref.abs().clamp_min(tiny) * torch.finfo(dtype).eps


@pytest.mark.parametrize("op,dtype,i,device", _op_cases(FLOATS))
def test_op_values(op, dtype, i, device):
    """Values against torch: fp32/fp64 at assert_close's tolerances; in 16
    bits our error against float64 at most torch's plus one ulp."""
    sample = _sample(op, dtype, i, device)
    try:
        want = _call(op.op, sample)
    except Exception as e:  # torch refuses the sample: so must we
        with pytest.raises(type(e)):
            _call(OURS[op.name], sample)
        return
    got = _call(OURS[op.name], sample)
    assert got.dtype == want.dtype and got.shape == want.shape
    if want.dtype in (torch.float32, torch.float64):
        torch.testing.assert_close(got, want, equal_nan=True)
        return
    tensors, floats = _float_tensors(sample)
    wide = [t.double() if f else t for t, f in zip(tensors, floats)]
    exact = _call(op.op, sample, *wide)
    ours, theirs = (got.double() - exact).abs(), (want.double() - exact).abs()
    assert bool((ours <= theirs + _ulp(exact, want.dtype) + 1e-30).all()), (
        f"max |ours - float64| {ours.max():.3g} vs torch's {theirs.max():.3g}"
    )


def _differentiable(op, sample):
    """(f, inputs): the sample as a function of its float tensors (float64,
    requiring grad), for gradcheck and torch.func."""
    tensors, floats = _float_tensors(sample)
    idx = [k for k, f in enumerate(floats) if f]

    def make(fn):
        def f(*xs):
            full = list(tensors)
            for k, x in zip(idx, xs):
                full[k] = x
            return _call(fn, sample, *full)

        return f

    inputs = tuple(tensors[k].detach().requires_grad_() for k in idx)
    return make(OURS[op.name]), make(op.op), inputs


@pytest.mark.parametrize("op,dtype,i,device", _op_cases((torch.float64,)))
def test_op_gradcheck(op, dtype, i, device):
    """float64 gradcheck (with forward AD) and gradgradcheck (with forward
    over reverse)."""
    f, _, inputs = _differentiable(op, _sample(op, dtype, i, device))
    # Full Jacobians for small samples; random projections (fast_mode) for
    # the few of hundreds of elements, whose full checks take minutes on 2 cores.
    fast = sum(x.numel() for x in inputs) > 64
    assert torch.autograd.gradcheck(f, inputs, check_forward_ad=True, fast_mode=fast)
    assert torch.autograd.gradgradcheck(f, inputs, check_fwd_over_rev=True, fast_mode=fast)


@pytest.mark.parametrize("op,dtype,i,device", _op_cases((torch.float64,)))
def test_op_torch_func(op, dtype, i, device):
    """torch.func.grad, jvp and vmap (vmapped dim 0 of every float tensor)
    against torch's."""
    ours, theirs, inputs = _differentiable(op, _sample(op, dtype, i, device))
    plain = tuple(x.detach() for x in inputs)
    gen = torch.Generator().manual_seed(i)
    out = theirs(*plain)
    w = torch.randn(out.shape, generator=gen, dtype=out.dtype).to(device)
    argnums = tuple(range(len(plain)))
    g_ours = grad(lambda *xs: (ours(*xs) * w).sum(), argnums)(*plain)
    g_theirs = grad(lambda *xs: (theirs(*xs) * w).sum(), argnums)(*plain)
    torch.testing.assert_close(g_ours, g_theirs)
    tangents = tuple(torch.randn(x.shape, generator=gen, dtype=x.dtype).to(device) for x in plain)
    torch.testing.assert_close(jvp(ours, plain, tangents), jvp(theirs, plain, tangents))
    batched = tuple(torch.stack([x, 2 * x - 1, -x]) for x in plain)
    torch.testing.assert_close(vmap(ours)(*batched), vmap(theirs)(*batched))


def test_torch_ships_the_samples():
    """torch still ships the samples this file runs (a rename would silently
    leave fewer)."""
    names = {op.name for op in OPS}
    assert {"softmax", "log_softmax", "nn.functional.cross_entropy"} <= names


# --- ModuleInfo ---

OUR_MODULES = {
    torch.nn.Softmax: mst.Softmax,
    torch.nn.LogSoftmax: mst.LogSoftmax,
    torch.nn.Softmax2d: mst.Softmax2d,
    torch.nn.CrossEntropyLoss: mst.CrossEntropyLoss,
}
MODULES = [m for m in module_db if m.module_cls in OUR_MODULES]


def _module_samples(info, dtype, device="cpu", requires_grad=False):
    return info.module_inputs_func(
        info, device=device, dtype=dtype, requires_grad=requires_grad, training=True
    )


def _module_cases() -> list:
    cases = []
    for info in MODULES:
        for device, suffix, marks in DEVICES:
            for i, s in enumerate(_module_samples(info, torch.float64, _sampled_on(device))):
                name = f"{info.module_cls.__name__}-{s.desc or i}{suffix}"
                cases.append(pytest.param(info, i, device, id=name, marks=marks))
    return cases


@pytest.mark.parametrize("info,i,device", _module_cases())
def test_module(info, i, device):
    """A ModuleInfo sample in float32 and float64 (values and gradients at
    torch's tolerances) and float64 gradcheck with forward AD."""
    for dtype in (torch.float32, torch.float64):
        sample = _module_samples(info, dtype, device, requires_grad=True)[i]
        c, fwd = sample.constructor_input, sample.forward_input
        ours = OUR_MODULES[info.module_cls](*c.args, **c.kwargs)
        theirs = info.module_cls(*c.args, **c.kwargs)
        xs = [a for a in fwd.args if isinstance(a, torch.Tensor) and a.is_floating_point()]
        got, want = ours(*fwd.args, **fwd.kwargs), theirs(*fwd.args, **fwd.kwargs)
        torch.testing.assert_close(got, want, equal_nan=True)  # all rows ignored: NaN, as torch
        g = torch.ones_like(want)
        torch.testing.assert_close(
            torch.autograd.grad(got, xs, g), torch.autograd.grad(want, xs, g), equal_nan=True
        )
    if not bool(torch.isfinite(want).all()):
        return  # e.g. every row ignored under "mean": NaN, matched above; no Jacobian to check
    idx = [k for k, a in enumerate(fwd.args) if isinstance(a, torch.Tensor)]

    def f(*ts):
        args = list(fwd.args)
        for k, t in zip(idx, ts):
            args[k] = t
        return ours(*args, **fwd.kwargs)

    inputs = tuple(
        fwd.args[k].detach().requires_grad_(fwd.args[k].is_floating_point()) for k in idx
    )
    # fast_mode (random projections): the op tests above check full Jacobians.
    assert torch.autograd.gradcheck(f, inputs, check_forward_ad=True, fast_mode=True)


# --- A gradient penalty: create_graph=True through our ops ---


@pytest.mark.parametrize(
    "name,device",
    [
        pytest.param(name, device, id=f"{name}{suffix}", marks=marks)
        for name in ["softmax", "log_softmax", "cross_entropy", "soft_cross_entropy"]
        for device, suffix, marks in DEVICES
    ],
)
def test_gradient_penalty_matches_torch(name, device):
    """d/dx [||d f / d x||^2 + ||x||^2] through our ops equals torch's: the
    gradient's own gradient is not lost (it was, silently, before
    create_graph was supported)."""
    gen = torch.Generator().manual_seed(5)
    x0 = (torch.randn(6, 9, generator=gen, dtype=torch.float64) * 2).to(device)
    w = torch.randn(6, 9, generator=gen, dtype=torch.float64).to(device)
    t = torch.randint(0, 9, (6,), generator=gen)
    t[2] = -100
    t = t.to(device)
    q = torch.softmax(torch.randn(6, 9, generator=gen, dtype=torch.float64), -1).to(device)
    fns = {
        "softmax": (lambda a: (mst.softmax(a, 1) * w).sum(), lambda a: (a.softmax(1) * w).sum()),
        "log_softmax": (
            lambda a: (mst.log_softmax(a, 1) * w).sum(),
            lambda a: (a.log_softmax(1) * w).sum(),
        ),
        "cross_entropy": (
            lambda a: mst.cross_entropy(a, t, label_smoothing=0.1),
            lambda a: F.cross_entropy(a, t, label_smoothing=0.1),
        ),
        "soft_cross_entropy": (
            lambda a: mst.cross_entropy(a, q, label_smoothing=0.1),
            lambda a: F.cross_entropy(a, q, label_smoothing=0.1),
        ),
    }

    def penalty_grad(f):
        x = x0.clone().requires_grad_()
        (g,) = torch.autograd.grad(f(x), x, create_graph=True)
        assert g.grad_fn is not None
        (d,) = torch.autograd.grad((g**2).sum() + (x**2).sum(), x)
        return d

    ours, theirs = fns[name]
    torch.testing.assert_close(penalty_grad(ours), penalty_grad(theirs))


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_weighted_samples_match_torch(reduction):
    """Class weights (torch's rules for the mean) against torch in float64."""
    x = torch.randn(5, 3, dtype=torch.float64)
    t, w = torch.tensor([0, 2, 1, 2, 0]), torch.rand(3, dtype=torch.float64) + 0.5
    got = mst.cross_entropy(x, t, weight=w, reduction=reduction)
    torch.testing.assert_close(got, F.cross_entropy(x, t, weight=w, reduction=reduction))
