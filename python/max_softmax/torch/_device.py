"""Which devices the bridge runs on: the one check every entry point makes,
and the tensors no kernel can read (`torch.func.functionalize`'s)."""

from __future__ import annotations

import torch

from . import _buffers as torch_buffers


def check_device(t: torch.Tensor, op: str, launching: bool) -> None:
    """Raise ValueError unless op `op` can run on `t`'s device: a CPU or CUDA
    tensor; on the graph path (`launching` false) a CUDA tensor's device
    must be one MAX sees (NoGPUError otherwise; cuda:N is MAX's
    Accelerator(N)). Both paths take any CUDA device."""
    refuse_functional(t, op)
    if t.device.type not in ("cpu", "cuda"):
        raise ValueError(f"max_softmax: no {op} for tensors on {t.device}")
    if t.is_cuda and not launching:
        torch_buffers.check_cuda_device(t)


def refuse_functional(t: torch.Tensor, op: str) -> None:
    """Raise RuntimeError for a tensor `torch.func.functionalize` made (live,
    or escaped from it): its storage address is 0, so a kernel launched on
    it would read and write address 0 (a crash, not an error)."""
    # torch.compile traces our ops as custom ops on its own tensors, and
    # Dynamo cannot trace this C check.
    if not torch.compiler.is_compiling() and _is_functional(t):
        raise RuntimeError(
            f"max_softmax: {op} cannot run on a tensor of torch.func.functionalize "
            "(it holds no address a kernel can read); call torch's op there"
        )


_is_functional = torch._is_functional_tensor

is_wrapped = torch._C._functorch.is_functorch_wrapped_tensor
"""Whether a torch.func transform wraps a tensor (live, or dead after it
escaped): such a tensor's address is no data, so no launch takes it as is."""


def device_kind(t: torch.Tensor) -> str:
    """The MAX device a model for tensor `t` is built for, by device name:
    "cpu", "gpu" for cuda:0, "gpu:N" for cuda:N (`devices.gpu_name`)."""
    return torch_buffers.device_name(t)
