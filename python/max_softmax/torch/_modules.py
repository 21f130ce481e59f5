"""`torch.nn` modules over the bridge's functions: drop-ins for
`nn.Softmax`, `nn.LogSoftmax`, `nn.Softmax2d` and `nn.CrossEntropyLoss`."""

from __future__ import annotations

import torch

from ._cross_entropy import check_no_legacy_reduction, cross_entropy
from ._functional import log_softmax, softmax


class _AlongDim(torch.nn.Module):
    """A module of one row op along `dim`, as torch's `nn.Softmax` and
    `nn.LogSoftmax` keep it (dim=None: torch's legacy implicit dim)."""

    def __init__(self, dim: int | None = -1):
        super().__init__()
        self.dim = dim

    def extra_repr(self) -> str:
        return f"dim={self.dim}"


class Softmax(_AlongDim):
    """Drop-in for `torch.nn.Softmax(dim)` (dim=None: torch's legacy implicit dim)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Softmax of `x` along `self.dim`."""
        return softmax(x, self.dim)


class LogSoftmax(_AlongDim):
    """Drop-in for `torch.nn.LogSoftmax(dim)`."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Log-softmax of `x` along `self.dim`."""
        return log_softmax(x, self.dim)


class Softmax2d(torch.nn.Module):
    """Drop-in for `torch.nn.Softmax2d`: softmax over the channels of a
    (N, C, H, W) or (C, H, W) input (dim -3)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Softmax of `x` over its channels."""
        if x.dim() not in (3, 4):
            raise ValueError(f"max_softmax: Softmax2d expects a 3-D or 4-D input, got {x.dim()}-D")
        return softmax(x, -3)


class CrossEntropyLoss(torch.nn.Module):
    """Drop-in for `torch.nn.CrossEntropyLoss` (arguments as
    `cross_entropy`, class weights a buffer as torch's), with our `z_loss`
    and `softcap`."""

    def __init__(
        self,
        weight: torch.Tensor | None = None,
        size_average: bool | None = None,
        ignore_index: int = -100,
        reduce: bool | None = None,
        reduction: str = "mean",
        label_smoothing: float = 0.0,
        *,
        z_loss: float = 0.0,
        softcap: float | None = None,
    ):
        super().__init__()
        self.register_buffer("weight", weight)
        self.z_loss = z_loss
        self.softcap = softcap
        check_no_legacy_reduction(size_average, reduce)
        self.ignore_index = ignore_index
        self.reduction = reduction
        self.label_smoothing = label_smoothing

    def forward(self, input: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """The loss of logits `input` against `target` (class indices or probabilities)."""
        return cross_entropy(
            input,
            target,
            weight=self.weight,
            ignore_index=self.ignore_index,
            reduction=self.reduction,
            label_smoothing=self.label_smoothing,
            z_loss=self.z_loss,
            softcap=self.softcap,
        )

    def extra_repr(self) -> str:
        return (
            f"ignore_index={self.ignore_index}, reduction={self.reduction!r}, "
            f"label_smoothing={self.label_smoothing}, z_loss={self.z_loss}, "
            f"softcap={self.softcap}"
        )
