"""PyTorch bridge: our Mojo kernels on `torch.Tensor`s, with autograd.

    from max_softmax.torch import softmax, log_softmax, Softmax
    y = softmax(x, dim=-1)          # instead of torch.softmax(x, dim=-1)
    loss = F.nll_loss(log_softmax(logits, dim=-1), target); loss.backward()

Runs on CPU and CUDA tensors; dtype and device follow the input, like
`torch.softmax`. The backward passes use our `softmax_backward` /
`log_softmax_backward` ops. Needs the `[torch]` extra; `import max_softmax`
works without torch.

A call is lean: the op's cached model (one per (op, dtype, device), every
shape) runs on the tensors through DLPack, with no copy and no dispatcher
between; on CUDA, with `MAX_SOFTMAX_TORCH_REPLAY=1`, a call that recurs on
the same memory replays a captured device graph (`torch_replay`). Under `torch.compile` the op is a
registered torch custom op (`max_softmax::<op>`, opaque to the compiler)
whose destination-passing twin (`models.into_model`) writes into the output
torch allocates.
"""

from __future__ import annotations

import torch
from max.driver import Buffer
from max.dtype import DType
from max.engine import Model

from . import torch_replay
from .models import ModelKey, into_model, row_op_model
from .registry import OPS, op_spec
from .validation import normalize_axis

_DTYPES = {
    torch.float32: DType.float32,
    torch.float16: DType.float16,
    torch.bfloat16: DType.bfloat16,
    torch.float64: DType.float64,
}


def _buffer(t: torch.Tensor) -> Buffer:
    """A MAX buffer sharing `t`'s memory. On CUDA the stream is handed over
    directly: torch's `__dlpack__(stream=...)` negotiation costs ~60 µs a
    tensor, this ~15 (as MAX's own torch bridge does)."""
    if t.device.type == "cuda":
        from max.experimental.torch.torch import max_device

        try:
            stream = torch.cuda.current_stream(t.device).cuda_stream
            return Buffer._from_dlpack(t.__dlpack__(), max_device(t.device), stream)
        except Exception:  # e.g. a tensor made on another thread: torch syncs
            return Buffer.from_dlpack(t)
    return Buffer.from_dlpack(t)


def _kind(t: torch.Tensor) -> str:
    return "gpu" if t.device.type == "cuda" else "cpu"


def _execute(name: str, out: torch.Tensor, *inputs: torch.Tensor) -> None:
    """Run op `name` on (outer, n, inner) tensors, writing into `out` (the
    torch.compile path, where torch owns every buffer)."""
    model = into_model(name, _DTYPES[out.dtype], _kind(out))
    model.execute(_buffer(out), *(_buffer(t) for t in inputs))


_eager_models: dict[tuple[str, torch.dtype, str], Model] = {}


def _eager(name: str, *inputs: torch.Tensor) -> torch.Tensor:
    """Run op `name` on (outer, n, inner) tensors eagerly: MAX allocates the
    result and torch takes it over through DLPack, no copy (~50 µs a call
    cheaper on the CPU than wrapping a torch-made output: each buffer MAX
    gets from DLPack costs it ~50 µs at execute). On CUDA with replay on,
    when the same memory comes back, a captured graph writing into a
    torch-made output is replayed instead (torch_replay)."""
    first = inputs[0]
    if first.is_cuda and torch_replay.ENABLED and torch_replay.CACHE.active:
        out = torch.empty_like(first)
        model = into_model(name, _DTYPES[first.dtype], "gpu")
        if torch_replay.CACHE.run(model, name, [out, *inputs], _buffer):
            return out
        del out
    key = (name, first.dtype, first.device.type)
    model = _eager_models.get(key)
    if model is None:
        model = row_op_model(ModelKey(name, _DTYPES[first.dtype], _kind(first)))
        _eager_models[key] = model
    (out,) = model.execute(*(_buffer(t) for t in inputs))
    return torch.from_dlpack(out)


def _register(name: str) -> object:
    """Op `name` as a torch custom op mutating its first argument, for
    torch.compile (whose tracer cannot see into MAX). torch reads the op's
    schema from the signature, so each arity gets its own."""
    if op_spec(name).arity == 1:

        def run1(out: torch.Tensor, x: torch.Tensor) -> None:
            _execute(name, out, x)

        fn = run1
    else:

        def run2(out: torch.Tensor, a: torch.Tensor, dy: torch.Tensor) -> None:
            _execute(name, out, a, dy)

        fn = run2
    return torch.library.custom_op(f"max_softmax::{name}", fn, mutates_args=("out",))


# Registered at import, not on first use: torch.compile(fullgraph=True) must
# not trace their construction. Kernels still compile lazily, on first call.
_TORCH_OPS = {name: _register(name) for name in OPS}


def _canonical(t: torch.Tensor, dim: int) -> torch.Tensor:
    """A contiguous (outer, n, inner) view of `t` along `dim`."""
    shape = t.shape
    outer = 1
    for s in shape[:dim]:
        outer *= s
    inner = 1
    for s in shape[dim + 1 :]:
        inner *= s
    return t.contiguous().view(outer, shape[dim], inner)


def _run(name: str, dim: int, *tensors: torch.Tensor) -> torch.Tensor:
    first = tensors[0]
    if first.dtype not in _DTYPES:
        raise TypeError(f"max_softmax: softmax needs a floating-point tensor, got {first.dtype}")
    dim = normalize_axis(dim, first.dim())
    for t in tensors[1:]:
        if (t.shape, t.dtype, t.device) != (first.shape, first.dtype, first.device):
            raise ValueError(
                f"max_softmax: {name} needs tensors of one shape, dtype and device: got "
                f"{t.dtype}{list(t.shape)} on {t.device} for {first.dtype}{list(first.shape)} "
                f"on {first.device}"
            )
    if first.device.type not in ("cpu", "cuda"):
        raise ValueError(f"max_softmax: no {name} for tensors on {first.device}")
    if first.numel() == 0:
        return torch.empty_like(first, memory_format=torch.contiguous_format)
    views = [_canonical(t.detach(), dim) for t in tensors]
    if not torch.compiler.is_compiling():  # eager: no dispatcher, no extra buffer
        return _eager(name, *views).view(first.shape)
    out = torch.empty_like(first, memory_format=torch.contiguous_format)
    _TORCH_OPS[name](out.view(views[0].shape), *views)
    return out


def _differentiable(forward: str) -> type[torch.autograd.Function]:
    """An autograd Function running op `forward`, whose gradient is its
    backward op (registry) applied to the saved output and the incoming gradient."""
    backward = op_spec(forward).backward

    class RowOp(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x: torch.Tensor, dim: int) -> torch.Tensor:
            out = _run(forward, dim, x)
            ctx.save_for_backward(out)
            ctx.dim = dim
            return out

        @staticmethod
        def backward(ctx, dy: torch.Tensor):
            (out,) = ctx.saved_tensors
            return _run(backward, ctx.dim, out, dy), None

    RowOp.__name__ = RowOp.__qualname__ = f"MaxSoftmax_{forward}"
    return RowOp


_Softmax = _differentiable("softmax")
_LogSoftmax = _differentiable("log_softmax")


def _needs_grad(x: torch.Tensor) -> bool:
    """Whether autograd must record this call (else the Function's ~10 µs
    of bookkeeping a call is skipped)."""
    return x.requires_grad and torch.is_grad_enabled()


def softmax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """`torch.softmax(x, dim)` computed by our kernels, differentiable."""
    return _Softmax.apply(x, dim) if _needs_grad(x) else _run("softmax", dim, x)


def log_softmax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """`torch.log_softmax(x, dim)` computed by our kernels, differentiable."""
    return _LogSoftmax.apply(x, dim) if _needs_grad(x) else _run("log_softmax", dim, x)


class Softmax(torch.nn.Module):
    """Drop-in for `torch.nn.Softmax(dim)`."""

    def __init__(self, dim: int = -1):
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Softmax of `x` along `self.dim`."""
        return softmax(x, self.dim)
