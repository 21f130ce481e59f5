"""What the benchmark times (workloads, shapes) and what one measurement is (`Row`).

`cross_entropy`: one call is the loss (reduction "mean", ignore_index
-100) and its gradient dlogits of (rows, V) logits and int64 targets. GB/s
counts 2 x the logits' bytes: a fused kernel reads the logits once and
writes the gradient once (the targets, 8 bytes a row, are not counted).
`cross_entropy_loss`: the same loss alone, no gradient. GB/s counts 1 x
the logits' bytes (it only reads them), against the copy's 2 x: the
issue's target, loss time <= 0.55 x copy time, is loss GB/s >= 1 / (2 x
0.55) = 91% of copy GB/s (the table also gives the time ratio).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np

from ..dtypes import DTYPE_NAMES
from ..reference import (
    compare,
    compare_backward,
    compare_cross_entropy,
    cross_entropy_reference,
    masked_reference,
    reference,
)
from ..registry import OPS

ISSUE_SHAPES_GPU: list[tuple[int, int]] = [
    (4096, 1024),
    (4096, 4096),
    (4096, 16384),
    (4096, 65536),
    (8192, 50257),
    (32, 1 << 20),
]
"""The shapes the issue names (GPU)."""

SWEEP_GPU: list[tuple[int, int]] = [
    (16384, 32),
    (16384, 128),
    (16384, 512),
    (8192, 2048),
    (2048, 8192),
    (1024, 32768),
    (256, 131072),
    (64, 524288),
    (1, 1 << 20),
    (16, 1 << 20),
]
"""More row lengths on the GPU, from tiny rows to one row of a million."""

SHAPES_CPU: list[tuple[int, int]] = [
    (4096, 1024),
    (1024, 16384),
    (256, 65536),
    (16, 1 << 20),
    (2048, 128),
]
"""The CPU's default shapes (each >= 1 MB; most >= 16 MB)."""

SHAPES_CROSS_ENTROPY_GPU: list[tuple[int, int]] = [
    (4096, 32000),
    (8192, 50257),
    (16384, 32000),
    (4096, 128256),
]
"""Cross-entropy on the GPU: a batch of tokens against Llama-2's, GPT-2's and
Llama-3's vocabularies."""

SHAPES_CROSS_ENTROPY_CPU: list[tuple[int, int]] = [(512, 50257), (128, 128256)]
"""Cross-entropy on the CPU (the issue's target is 512 x 50257 float32)."""

COPY_TRANSFERS = 2
"""Tensor-sized transfers of the copy roof (read once, write once)."""

CROSS_ENTROPY_OPS = ("cross_entropy", "cross_entropy_loss")
"""The loss workloads: (logits, targets) in; (loss, dlogits), or the loss alone, out."""

LOSS_VS_COPY_TARGET = 0.55
"""The issue's target for the loss alone: at most this many copy times."""

IGNORE_INDEX = -100
"""The ignore_index of the cross-entropy workload (torch's default)."""

IGNORED_FRACTION = 0.05
"""About this share of the cross-entropy targets is IGNORE_INDEX."""

CROSS_ENTROPY_CHUNK = 64
"""Rows of the float64 reference computed at a time (bounded memory at any shape)."""

L2_BYTES = 50 << 20
"""The H100's L2: the K rotating inputs together must exceed it (4x)."""

CHECK_ROWS = 64
"""Rows of each provider's output checked against the float64 reference."""

MASK_SCALE = 0.125
"""The scale of the masked workloads (1 / sqrt(64), attention's head size 64)."""

MASK_DROPPED = 0.1
"""About this share of the masked workload's additive mask is -inf."""


BACKWARD_OPS = tuple(spec.backward for spec in OPS.values() if spec.backward)
"""The ops that read a forward's output and dy and write dx (the registry's
gradients of softmax and log_softmax)."""


@dataclass(frozen=True)
class Workload:
    """What one timed call computes: its inputs and how many tensor-sized
    transfers it must make (GB/s = transfers x tensor bytes / time; for
    cross_entropy the tensor is the logits)."""

    op: str
    transfers: int
    arity: int
    bytes_note: str = ""
    """What the GB/s counts, where it needs saying (the report's legend)."""
    copy_time_target: float | None = None
    """A target for ours' time as a fraction of the copy's, where the
    workload has one: the table then gives that ratio in a column."""
    moves_less: float = 1.0
    """Counted bytes / bytes a correct kernel must move (causal: j > i is
    never read, so 2 counted transfers over ~1.5 moved, 4/3):
    `flag_impossible` widens its limit by it."""

    def make_inputs(self, rng: np.random.Generator, rows: int, n: int, dtype: str) -> tuple:
        """Fresh random inputs of one call: (x,), (y, dy), (x, dy) or
        (logits, targets)."""
        x = (rng.standard_normal((rows, n), dtype=np.float32) * 4).astype(DTYPE_NAMES[dtype])
        if self.op == "softmax":
            return (x,)
        if self.op == "causal_softmax":  # (B, L, n): B attention matrices
            return (x.reshape(causal_batches(rows, n), -1, n),)
        if self.op == "masked_softmax":  # an additive float mask shaped like x
            m = rng.standard_normal((rows, n), dtype=np.float32)
            m[rng.random((rows, n)) < MASK_DROPPED] = -np.inf
            return (x, m.astype(x.dtype))
        if self.op in CROSS_ENTROPY_OPS:
            return (x, cross_entropy_targets(rng, rows, n))
        dy = rng.standard_normal((rows, n), dtype=np.float32).astype(DTYPE_NAMES[dtype])
        if self.op in BACKWARD_OPS:  # y = softmax(x) or log_softmax(x), in float32 to stay quick
            z = x.astype(np.float32) - x.max(axis=-1, keepdims=True).astype(np.float32)
            lse = np.log(np.exp(z).sum(axis=-1, keepdims=True))
            a = z - lse if self.op == "log_softmax_backward" else np.exp(z - lse)
            return (a.astype(x.dtype), dy)
        return (x, dy)

    def check(self, got: Any, inputs: tuple) -> tuple[bool, str]:
        """Whether `got` (its first CHECK_ROWS rows) matches the float64
        reference; for cross_entropy `got` is (loss, dlogits), the loss over
        the whole batch and dlogits of at least its first CHECK_ROWS rows;
        for cross_entropy_loss the loss alone."""
        if self.op == "cross_entropy":
            return check_cross_entropy(got[0], got[1], inputs[0], inputs[1])
        if self.op == "cross_entropy_loss":
            return check_cross_entropy(got, None, inputs[0], inputs[1])
        got = _head(np.asarray(got))
        first = [_head(a) for a in inputs]
        if self.op in ("masked_softmax", "causal_softmax"):
            mask = first[1] if self.op == "masked_softmax" else None
            # The first matrix's first rows keep j <= i.
            want = masked_reference(
                "softmax", first[0], -1, MASK_SCALE, mask, self.op == "causal_softmax"
            )
            c = compare("softmax", got, first[0], -1, ref=want)
        elif self.op == "softmax":
            c = compare("softmax", got, first[0], -1)
        else:
            y, dy = first
            if self.op == "torch_fwd_bwd":  # the y torch differentiates
                y = reference("softmax", y, -1).astype(dy.dtype)
            op = self.op if self.op in BACKWARD_OPS else "softmax_backward"
            c = compare_backward(op, got, y, dy, -1)
        return c.ok, f"max_rel_err={c.max_rel_err:.2g}"

    def rotations(self, nbytes: int, max_k: int) -> int:
        """K, the distinct input sets rotated per timing: `max_k` small
        cases or 3 large ones, always well over 4x the L2 in total (two K
        values only: each K is a graph to compile)."""
        return max_k if 3 * self.arity * nbytes < 4 * L2_BYTES else 3


def _head(a: np.ndarray) -> np.ndarray:
    """The rows a check looks at: the first CHECK_ROWS, of the first matrix
    where `a` holds several (the causal workload's (B, L, n))."""
    return a[0][:CHECK_ROWS] if a.ndim == 3 else a[:CHECK_ROWS]


def causal_batches(rows: int, n: int) -> int:
    """B, the causal workload's matrices in a `rows x n` shape: rows / n
    square (n, n) matrices where rows is a larger multiple of n (`--shape
    65536x4096` is attention's 16 x 4096 x 4096), else one (rows, n)."""
    return rows // n if rows > n and rows % n == 0 else 1


def cross_entropy_targets(rng: np.random.Generator, rows: int, n: int) -> np.ndarray:
    """int64 class indices uniform in [0, n), about IGNORED_FRACTION of them
    IGNORE_INDEX; row 0 is always kept, so the mean is over >= 1 row."""
    t = rng.integers(0, n, size=rows, dtype=np.int64)
    ignored = rng.random(rows) < IGNORED_FRACTION
    ignored[0] = False
    return np.where(ignored, IGNORE_INDEX, t)


_ce_cache: list[tuple[np.ndarray, np.ndarray, tuple[np.ndarray, np.ndarray]]] = []


def cross_entropy_expected(
    logits: np.ndarray, targets: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """The float64 reference of the workload (reduction "mean" over the
    whole batch): (loss, dlogits of the first CHECK_ROWS rows). The loss is
    summed chunk by chunk, so any shape fits in memory; dlogits of a row is
    (softmax(row) - onehot) / count, count the rows kept in the whole batch.
    The last answer is cached: every provider of a shape checks the same inputs."""
    for x, t, answer in _ce_cache:
        if x is logits and t is targets:
            return answer
    count = int(np.count_nonzero(targets != IGNORE_INDEX))
    total = 0.0
    for i in range(0, logits.shape[0], CROSS_ENTROPY_CHUNK):
        part = slice(i, i + CROSS_ENTROPY_CHUNK)
        total += float(cross_entropy_reference(logits[part], targets[part], IGNORE_INDEX, "sum")[0])
    first = slice(0, CHECK_ROWS)
    grad = cross_entropy_reference(logits[first], targets[first], IGNORE_INDEX, "sum")[1]
    with np.errstate(invalid="ignore", divide="ignore"):
        answer = (np.float64(total) / count, grad / count)
    _ce_cache[:] = [(logits, targets, answer)]
    return answer


def check_cross_entropy(
    loss: Any, dlogits: Any, logits: np.ndarray, targets: np.ndarray
) -> tuple[bool, str]:
    """Whether a provider's mean loss and the first CHECK_ROWS rows of its
    dlogits match the float64 reference of (logits, targets); `dlogits`
    None checks the loss alone."""
    loss = np.asarray(loss)
    if loss.size != 1:
        return False, f"max_rel_err=inf (the loss has shape {loss.shape}, not a scalar)"
    want_loss, want_grad = cross_entropy_expected(logits, targets)
    if dlogits is None:  # nothing to compare but the loss
        want_grad = got_grad = np.empty(0)
    else:
        got_grad = np.asarray(dlogits)[: want_grad.shape[0]]
    ok, loss_err, grad_err = compare_cross_entropy(
        loss.reshape(()), got_grad, want_loss, want_grad, np.dtype(logits.dtype).name
    )
    if dlogits is None:
        return ok, f"max_rel_err={loss_err:.2g} (loss)"
    worst = max(loss_err, grad_err)
    return ok, f"max_rel_err={worst:.2g} (loss {loss_err:.2g}, dlogits {grad_err:.2g})"


WORKLOADS: dict[str, Workload] = {
    "softmax": Workload("softmax", 2, 1),
    "softmax_backward": Workload("softmax_backward", 3, 2),
    "log_softmax_backward": Workload("log_softmax_backward", 3, 2),
    "torch_fwd_bwd": Workload("torch_fwd_bwd", 5, 2),
    "cross_entropy": Workload(
        "cross_entropy",
        2,
        2,
        "cross_entropy: one call = the mean loss and its gradient dlogits of (rows, N) "
        "logits and int64 targets (5% ignore_index); GB/s = 2 x logits bytes / time, as a "
        "fused kernel reads the logits once and writes dlogits once (targets not counted).",
    ),
    "cross_entropy_loss": Workload(
        "cross_entropy_loss",
        1,
        2,
        "cross_entropy_loss: one call = the mean loss alone, no gradient, of (rows, N) logits "
        "and int64 targets (5% ignore_index); GB/s = 1 x logits bytes / time, as it only reads "
        "the logits (targets not counted). The copy moves 2 x those bytes, so the target "
        f"'loss time <= {LOSS_VS_COPY_TARGET} x copy time' is 'loss GB/s >= "
        f"{100 / (2 * LOSS_VS_COPY_TARGET):.0f}% of copy GB/s': read it in the '% of copy' "
        "column, or directly in 'ours time / copy'.",
        copy_time_target=LOSS_VS_COPY_TARGET,
    ),
    "masked_softmax": Workload(
        "masked_softmax",
        3,
        2,
        f"masked_softmax: softmax(x * {MASK_SCALE} + mask), the additive float mask shaped "
        "like x (10% -inf); GB/s = 3 x tensor bytes / time (x and mask read, y written). "
        "Peers compute the unfused expression (MAX's built-in fuses it into its softmax).",
    ),
    "causal_softmax": Workload(
        "causal_softmax",
        2,
        1,
        f"causal_softmax: softmax(x * {MASK_SCALE}) keeping j <= i over the (rows, N) matrix, "
        "or over rows / N square (N, N) matrices where rows is a larger multiple of N (a causal "
        "mask computed, not read); GB/s = 2 x tensor bytes / time. Peers: torch's "
        "masked_fill with a precomputed boolean mask, torch.compile of the same.",
        moves_less=4 / 3,
    ),
}
"""Every `--op`, by name."""

FIGURES: tuple[str, ...] = ("exec", "replay", "device")
"""The three figures of a MAX provider: its K-op graph executed (`us`), the
same graph captured and replayed (`replay_us`), and GPU busy time (`device_us`)."""


@dataclass
class Row:
    """One provider at one shape and dtype.

    `us`/`gbps` is the headline: for a MAX provider its K-op graph executed
    (wall clock, marginal); for a peer its timed figure (see `extra["timer"]`).
    `replay_*` and `device_*` are the other two figures, None where not
    measured, with the reason in `notes["replay"]` / `notes["device"]`: a
    MAX graph captured and replayed, or a torch peer's K calls in a torch
    CUDA graph (`extra["replay"]`); GPU busy time.
    `ok`: True checked and timed, False a wrong answer, None not timed
    (an error, or a timing judged unreliable: `note` says which).
    """

    provider: str
    rows: int
    n: int
    dtype: str
    device: str
    us: float | None = None
    gbps: float | None = None
    ok: bool | None = None
    note: str = ""
    extra: dict = field(default_factory=dict)
    replay_us: float | None = None
    replay_gbps: float | None = None
    device_us: float | None = None
    device_gbps: float | None = None
    notes: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Row:
        """A Row from its JSON form (older files, lacking newer fields, too)."""
        names = {f.name for f in fields(cls)}
        row = cls(**{k: v for k, v in data.items() if k in names})
        if "device_us" not in data and row.is_graph:  # before replay: one figure
            if row.extra.get("timer") == "device":  # it was GPU time, wall in extra
                row.device_us, row.device_gbps = row.us, row.gbps
                row.us, row.gbps = row.extra.get("wall_us"), row.extra.get("wall_gbps")
            for which in ("replay", "device"):
                if row.figure(which)[1] is None:
                    row.notes.setdefault(which, f"{which}: not measured (older bench)")
        return row

    @property
    def shape_key(self) -> tuple[str, int, int]:
        """(dtype, rows, n): which table line the row belongs to."""
        return (self.dtype, self.rows, self.n)

    @property
    def is_graph(self) -> bool:
        """Whether this is a MAX graph provider (three figures) rather than a peer."""
        if "graph" in self.extra:
            return bool(self.extra["graph"])
        return self.provider == "max.ops.softmax" or (
            self.provider.startswith("ours") and self.provider != "ours:torch"
        )

    def figure(self, which: str) -> tuple[float | None, float | None]:
        """(µs, GB/s) of figure "exec", "replay" or "device"."""
        if which == "exec":
            return self.us, self.gbps
        return getattr(self, f"{which}_us"), getattr(self, f"{which}_gbps")

    def set_figure(self, which: str, secs: float | None, gbps: float | None) -> None:
        """Store figure `which` from seconds per call and GB/s (None: clear it)."""
        us = secs * 1e6 if secs is not None else None
        if which == "exec":
            self.us, self.gbps = us, gbps
        else:
            setattr(self, f"{which}_us", us)
            setattr(self, f"{which}_gbps", gbps)

    def why_missing(self, which: str) -> str:
        """The reason figure `which` has no value ("" if it has one)."""
        if self.figure(which)[1] is not None:
            return ""
        if which == "exec":
            return self.note or "not measured"
        return self.notes.get(which) or self.note or "not measured"
