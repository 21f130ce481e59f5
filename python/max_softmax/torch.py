"""PyTorch bridge: our Mojo kernels on `torch.Tensor`s, with autograd.

    from max_softmax.torch import softmax, log_softmax, Softmax
    y = softmax(x, dim=-1)          # instead of torch.softmax(x, dim=-1)
    loss = F.nll_loss(log_softmax(logits, dim=-1), target); loss.backward()

Runs on CPU and CUDA tensors; dtype and device follow the input, like
`torch.softmax`. The backward passes use our `softmax_backward` /
`log_softmax_backward` ops. Needs the `[torch]` extra; `import max_softmax`
works without torch.

A call is lean: torch allocates the output, and the op's destination-passing
model (`models.into_model`, one per (op, dtype, device), every shape) writes
into it through MAX buffer views of the tensors' memory that are made once
and reused (`torch_buffers`), with no copy, no host synchronisation and no
dispatcher between. On CUDA, with `MAX_SOFTMAX_TORCH_REPLAY=1`, a call that
recurs on the same memory replays a captured device graph (`torch_replay`).
Under `torch.compile` the op is a registered torch custom op
(`max_softmax::<op>`, opaque to the compiler) around the same call.
"""

from __future__ import annotations

import torch

from . import torch_buffers, torch_replay
from .models import into_model
from .registry import OPS, op_spec
from .torch_buffers import DTYPES
from .validation import normalize_axis


def _call(name: str, out: torch.Tensor, *inputs: torch.Tensor) -> None:
    """Write op `name` of (outer, n, inner) tensors `inputs` into `out`:
    its destination-passing model on reused buffer views of the tensors
    (torch_buffers), or a replay of its captured graph; on CUDA ordered
    against torch's stream on the device."""
    model = into_model(name, DTYPES[out.dtype], "gpu" if out.is_cuda else "cpu")
    tensors = (out, *inputs)
    if not out.is_cuda:
        model.execute(*(torch_buffers.view(t) for t in tensors))
        return
    stream = torch.cuda.current_stream(out.device)
    torch_buffers.max_waits_for(stream)
    replay = torch_replay.ENABLED and torch_replay.CACHE.active
    if not (replay and torch_replay.CACHE.run(model, name, tensors, torch_buffers.view)):
        model.execute(*(torch_buffers.view(t) for t in tensors))
    torch_buffers.waits_for_max(stream)


def _register(name: str) -> object:
    """Op `name` as a torch custom op mutating its first argument, for
    torch.compile (whose tracer cannot see into MAX). torch reads the op's
    schema from the signature, so each arity gets its own."""
    if op_spec(name).arity == 1:

        def run1(out: torch.Tensor, x: torch.Tensor) -> None:
            _call(name, out, x)

        fn = run1
    else:

        def run2(out: torch.Tensor, a: torch.Tensor, dy: torch.Tensor) -> None:
            _call(name, out, a, dy)

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
    if first.dtype not in DTYPES:
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
    if first.is_cuda:
        torch_buffers.check_cuda_device(first)
    out = torch.empty_like(first, memory_format=torch.contiguous_format)
    if first.numel() == 0:
        return out
    views = [_canonical(t.detach(), dim) for t in tensors]
    out3 = out.view(views[0].shape)
    if torch.compiler.is_compiling():  # the tracer sees a torch custom op
        _TORCH_OPS[name](out3, *views)
    else:  # eager: no dispatcher between
        _call(name, out3, *views)
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
