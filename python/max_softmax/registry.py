"""The one table of our ops: what each is called in Mojo, what it takes, its gradient.

Every front door (graph ops, arrays, MAX eager, the torch bridge, the
benchmark) looks an op up here instead of keeping its own list. Adding an op
means: register it in `op/registered_ops.mojo`, write its graph function in
`ops.py`, add one `OpSpec` below (see docs/ARCHITECTURE.md). The row ops
(softmax and friends) share every front door's generic path; the loss ops
(cross-entropy, registered in `op/cross_entropy_ops.mojo`) have their own
models and bridges (`kind="loss"`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from . import ops


@dataclass(frozen=True)
class OpSpec:
    """One op of the kernel library, as every front door sees it."""

    name: str
    """The name it is registered under in op/ and called by from Python."""
    inputs: tuple[str, ...]
    """Its tensor inputs, in order (the backward ops take the forward's output and dy)."""
    graph: Callable[..., Any]
    """The graph-level function in `ops.py`: `graph(*inputs, axis=...)` for
    row ops; for loss ops `graph(logits, targets, reduction=..., ...)`; for
    masked ops `graph(x, mask, options)`, the flags in the options' length."""
    into: str
    """Its destination-passing twin in op/, which writes into a given buffer."""
    backward: str | None = None
    """The op that computes its gradient from its output and dy, if any."""
    has_variants: bool = False
    """Whether `variant=` picks among GPU kernel families for it."""
    kind: str = "row"
    """"row": a row op on (outer, n, inner) tensors of one dtype, as
    `models.row_op_model` and the torch bridge's generic path run it;
    "loss": cross-entropy, on (rows, classes) logits, int64 targets and a
    float64 options tensor, with its own models (`models.cross_entropy_model`);
    "soft_loss": cross-entropy against class probabilities, on (rows,
    classes) logits and probabilities of one dtype and a float64 options
    tensor (eps, z_loss[, class weights]): `graph(logits, probs, options,
    reduction=...)`; the front doors reach it by a floating target;
    "masked": softmax / log_softmax of scale * x + mask (and causal), on an
    (outer, L, n) x, a (mask_rows, n) additive mask and a float64 options
    tensor (the scale; its length the mask / causal flags), with its own
    models (`models.masked_model`, one per op, dtype and device); the
    front doors reach it by `softmax(..., scale=, mask=, causal=)`."""

    @property
    def arity(self) -> int:
        """How many tensors it takes."""
        return len(self.inputs)


OPS: dict[str, OpSpec] = {
    spec.name: spec
    for spec in (
        OpSpec(
            "softmax",
            ("x",),
            ops.softmax,
            "softmax_into",
            backward="softmax_backward",
            has_variants=True,
        ),
        OpSpec(
            "log_softmax",
            ("x",),
            ops.log_softmax,
            "log_softmax_into",
            backward="log_softmax_backward",
            has_variants=True,
        ),
        OpSpec("softmax_backward", ("y", "dy"), ops.softmax_backward, "softmax_backward_into"),
        OpSpec(
            "log_softmax_backward",
            ("logp", "dy"),
            ops.log_softmax_backward,
            "log_softmax_backward_into",
        ),
        OpSpec(
            "softmax_masked",
            ("x", "mask", "options"),
            ops.softmax_masked,
            "softmax_masked_into",
            kind="masked",
        ),
        OpSpec(
            "log_softmax_masked",
            ("x", "mask", "options"),
            ops.log_softmax_masked,
            "log_softmax_masked_into",
            kind="masked",
        ),
        OpSpec(
            "cross_entropy",
            ("logits", "targets", "options"),
            ops.cross_entropy,
            "cross_entropy_into",
            kind="loss",
        ),
        OpSpec(
            "cross_entropy_with_grad",
            ("logits", "targets", "options"),
            ops.cross_entropy_with_grad,
            "cross_entropy_with_grad_into",
            kind="loss",
        ),
        OpSpec(
            "soft_cross_entropy",
            ("logits", "probs", "options"),
            ops.soft_cross_entropy_rows,
            "soft_cross_entropy_into",
            kind="soft_loss",
        ),
        OpSpec(
            "soft_cross_entropy_with_grad",
            ("logits", "probs", "options"),
            ops.soft_cross_entropy_with_grad_rows,
            "soft_cross_entropy_with_grad_into",
            kind="soft_loss",
        ),
    )
}
"""Every op, by name."""


def op_spec(name: str) -> OpSpec:
    """The spec of op `name`; ValueError naming the choices if there is none."""
    try:
        return OPS[name]
    except KeyError:
        raise ValueError(f"max_softmax: unknown op {name!r}; choose one of {tuple(OPS)}") from None
