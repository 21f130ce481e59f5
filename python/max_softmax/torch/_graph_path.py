"""The bridge's MAX-graph path: a destination-passing model run on buffer
views of torch tensors (`_buffers`), ordered against torch's CUDA stream and
replayed where enabled (`_replay`); and the small constant tensors the ops
read, made once."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from . import _buffers as torch_buffers
from . import _replay as torch_replay


def execute(model: Any, tensors: tuple[torch.Tensor, ...], replay_key: str | None = None) -> None:
    """Run `model` on reused buffer views of `tensors` (torch_buffers); on
    CUDA ordered against torch's stream on the device, and replayed where
    `replay_key` is given and replay is on."""
    first = tensors[0]
    if not first.is_cuda:
        model.execute(*(torch_buffers.view(t) for t in tensors))
        return
    # The tensors' device current: MAX makes a view's stream event in the
    # current CUDA context, and one of another device is an invalid handle
    # (CUDA_ERROR_INVALID_HANDLE on cuda:N with cuda:M current, seen on 4 H100s).
    with torch.cuda.device(first.device):
        stream = torch.cuda.current_stream(first.device)
        torch_buffers.max_waits_for(stream)
        cache = torch_replay.cache(first.device.index or 0)  # each device its own
        replay = replay_key is not None and torch_replay.enabled() and cache.active
        if not (replay and cache.run(model, replay_key, tensors, torch_buffers.view)):
            model.execute(*(torch_buffers.view(t) for t in tensors))
        torch_buffers.waits_for_max(stream)


_small_tensors: dict[tuple, torch.Tensor] = {}


def cached(key: tuple, make: Callable[[], torch.Tensor]) -> torch.Tensor:
    """A small tensor made once per key (on CUDA a fresh one would cost a
    copy from the host every call)."""
    t = _small_tensors.get(key)
    if t is None:
        t = make()
        if len(_small_tensors) >= 64:
            _small_tensors.clear()
        _small_tensors[key] = t
    return t
