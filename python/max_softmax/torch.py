"""PyTorch bridge: our Mojo kernels on `torch.Tensor`s, with autograd.

    from max_softmax.torch import softmax, log_softmax, Softmax
    y = softmax(x, dim=-1)          # instead of torch.softmax(x, dim=-1)
    loss = F.nll_loss(log_softmax(logits, dim=-1), target); loss.backward()

Runs on CPU and CUDA tensors through MAX's `CustomOpLibrary`; dtype and
device follow the input, like `torch.softmax`. The backward passes use our
`softmax_backward` / `log_softmax_backward` ops. Needs the `[torch]` extra;
`import max_softmax` works without torch.
"""

from __future__ import annotations

import torch
from max.driver import accelerator_count
from max.dtype import DType
from max.experimental.torch.torch import CustomOpLibrary, MaxOp
from max.graph import DeviceRef, TensorType

from .kernels import kernel_library
from .models import ROW_DIMS, into_graph_body
from .registry import OPS, op_spec
from .validation import normalize_axis

_DTYPES = {
    torch.float32: DType.float32,
    torch.float16: DType.float16,
    torch.bfloat16: DType.bfloat16,
    torch.float64: DType.float64,
}


def _make_torch_ops() -> dict[tuple[str, torch.dtype, str], object]:
    """One torch custom op per (op, dtype, device kind), each taking the
    (outer, n, inner) view with symbolic dims, so MAX compiles it once and
    every shape reuses it (the bridge's default would compile per shape).

    Made at import, not on first use: torch.compile(fullgraph=True) must not
    trace their construction. Kernels still compile lazily, on first call.
    """
    library = CustomOpLibrary(kernel_library())
    kinds = {"cpu": DeviceRef.CPU()}
    if accelerator_count() > 0:
        kinds["cuda"] = DeviceRef.GPU()
    made = {}
    for name, spec in OPS.items():
        for tdtype, mdtype in _DTYPES.items():
            for kind, ref in kinds.items():
                view = TensorType(mdtype, ROW_DIMS, ref)
                made[(name, tdtype, kind)] = MaxOp(
                    into_graph_body(spec),
                    f"max_softmax_{name}_{mdtype.name}_{kind}",
                    library,
                    input_types=[view] * spec.arity,
                    output_types=[view],
                ).custom_op_def()
    return made


_TORCH_OPS = _make_torch_ops()


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
    out = torch.empty_like(first, memory_format=torch.contiguous_format)
    if first.numel() == 0:
        return out
    views = [_canonical(t.detach(), dim) for t in tensors]
    op = _TORCH_OPS.get((name, first.dtype, first.device.type))
    if op is None:
        raise ValueError(f"max_softmax: no {name} for tensors on {first.device}")
    op(out.view(views[0].shape), *views)
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


def softmax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """`torch.softmax(x, dim)` computed by our kernels, differentiable."""
    return _Softmax.apply(x, dim)


def log_softmax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """`torch.log_softmax(x, dim)` computed by our kernels, differentiable."""
    return _LogSoftmax.apply(x, dim)


class Softmax(torch.nn.Module):
    """Drop-in for `torch.nn.Softmax(dim)`."""

    def __init__(self, dim: int = -1):
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Softmax of `x` along `self.dim`."""
        return softmax(x, self.dim)
