"""The float64 options tensor the cross-entropy kernels read, on the logits'
device: one builder for `cross_entropy` and `linear_cross_entropy`."""

from __future__ import annotations

import torch

from ..validation import extended_tail
from ._graph_path import cached

NO_EXTRAS: tuple = (None, 0.0, 0.0)
"""(weight, z_loss, softcap) when none of them is on."""


def options_tensor(
    device: torch.device, ignore_index: int, eps: float, extras: tuple = NO_EXTRAS
) -> torch.Tensor:
    """The options (`validation.cross_entropy_options`' layout) for
    (ignore_index, label smoothing) and `extras` = (class weights or None,
    z_loss, softcap). The values around the weights are made once per
    (device, values), since on CUDA a fresh tensor costs a copy from the
    host, which waits for the device; the weights are joined to them on the
    device every call (their values may change between calls)."""
    weight, z_loss, cap = extras
    values = [ignore_index, eps]
    extended = bool(z_loss or cap or weight is not None)
    if extended:
        values += [z_loss, cap]
    if weight is None:
        # Plain Python values (torch.compile traces this).
        values += [0.0] * (extended_tail(eps, cap, weighted=False) if extended else 0)
        return cached(
            ("cross_entropy", device, *values),
            lambda: torch.tensor(values, dtype=torch.float64, device=device),
        )
    marks = extended_tail(eps, cap, weighted=True)
    head = cached(
        ("cross_entropy", device, *values),
        lambda: torch.tensor(values, dtype=torch.float64, device=device),
    )
    tail = cached(
        ("cross_entropy marks", device, marks),
        lambda: torch.zeros(marks, dtype=torch.float64, device=device),
    )
    return torch.cat([head, weight.detach().to(device=device, dtype=torch.float64), tail])
