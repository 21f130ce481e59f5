"""The float64 options tensor the cross-entropy kernels read, on the logits'
device: one builder for `cross_entropy` and `linear_cross_entropy`."""

from __future__ import annotations

import torch

from ..validation import WEIGHTS_MARK, cross_entropy_hints
from ._graph_path import cached

NO_EXTRAS: tuple = (None, 0.0, 0.0)
"""(weight, z_loss, softcap) when none of them is on."""


def options_tensor(
    device: torch.device, ignore_index: int, eps: float, extras: tuple = NO_EXTRAS
) -> torch.Tensor:
    """The options (`validation.cross_entropy_options`' layout) for
    (ignore_index, label smoothing) and `extras` = (class weights or None,
    z_loss, softcap): made once per (device, values), since on CUDA a fresh
    one costs a host copy; except with class weights (their values may
    change between calls)."""
    weight, z_loss, cap = extras
    if weight is None:
        # Plain Python values (torch.compile traces this).
        values = [ignore_index, eps]
        if z_loss or cap:
            values += [z_loss, cap] + [0.0] * cross_entropy_hints(eps, cap, weighted=False)
        return cached(
            ("cross_entropy", device, *values),
            lambda: torch.tensor(values, dtype=torch.float64, device=device),
        )
    head = torch.tensor([ignore_index, eps, z_loss, cap], dtype=torch.float64, device=device)
    tail = torch.zeros(
        WEIGHTS_MARK + cross_entropy_hints(eps, cap, weighted=True),
        dtype=torch.float64,
        device=device,
    )
    return torch.cat([head, weight.detach().to(device=device, dtype=torch.float64), tail])
