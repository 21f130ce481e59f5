"""Which devices the bridge runs on: the one check every entry point makes."""

from __future__ import annotations

import torch

from . import _buffers as torch_buffers


def check_device(t: torch.Tensor, op: str, launching: bool) -> None:
    """Raise ValueError unless op `op` can run on `t`'s device: a CPU or CUDA
    tensor; on the graph path (`launching` false) a CUDA tensor's device
    must be one MAX sees (NoGPUError otherwise; cuda:N is MAX's
    Accelerator(N)). Both paths take any CUDA device."""
    if t.device.type not in ("cpu", "cuda"):
        raise ValueError(f"max_softmax: no {op} for tensors on {t.device}")
    if t.is_cuda and not launching:
        torch_buffers.check_cuda_device(t)


def device_kind(t: torch.Tensor) -> str:
    """The MAX device a model for tensor `t` is built for, by device name:
    "cpu", "gpu" for cuda:0, "gpu:N" for cuda:N (`devices.gpu_name`)."""
    return torch_buffers.device_name(t)
