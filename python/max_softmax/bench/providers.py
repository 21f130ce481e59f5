"""Everything the bench times: our op and MAX's built-in as K-op MAX graphs,
and the peers (torch, the Triton tutorial kernel, JAX, NumPy/SciPy, copies;
for cross_entropy torch, torch.compile, our torch bridge, Liger-Kernel and
QuACK, each a forward and a `.backward()` to the logits' gradient; for
cross_entropy_loss the same forwards alone, without a gradient).

A provider is prepared with K input tuples, then `run(k)` computes the
workload for the first k of them and waits for the results. MAX providers
also expose their K-op graph and its input buffers, for graph replay; torch
peers expose the body of `run` without its wait (`calls(k)`), which the
bench captures into a torch CUDA graph and replays.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import numpy as np

from ..devices import device as max_device
from ..dtypes import DTYPE_NAMES, max_dtype, to_buffer, to_numpy
from ..models import build_graph, compiled, device_ref
from ..registry import OPS
from .progress import say
from .workloads import (
    BACKWARD_OPS,
    CHECK_ROWS,
    COPY_TRANSFERS,
    CROSS_ENTROPY_OPS,
    IGNORE_INDEX,
    MASK_SCALE,
    WORKLOADS,
)

# JAX grabs 75% of GPU memory on first use unless told not to, which starves
# MAX's allocator for the large shapes measured after it.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")


class Provider:
    """Something that computes a workload along the last axis of a batch."""

    name = "?"
    transfers = 2  # tensor-sized transfers a call makes (copy: always 2)
    graph = False  # a MAX graph provider (three figures) or a peer (one)

    def prepare(self, xs: list[tuple[np.ndarray, ...]]) -> None:
        """Move the K input tuples to where the provider computes (untimed)."""

    def run(self, k: int) -> None:
        """Compute the workload for the first k inputs and wait for the results."""

    def output0(self) -> np.ndarray:
        """The result for input 0, as numpy."""
        raise NotImplementedError


_announced: set[tuple] = set()


class MaxGraphProvider(Provider):
    """Our op (any variant) or MAX's built-in ops.softmax, K ops per graph.

    The dims are symbolic, so one graph per (provider, op, dtype, device, K)
    serves the whole sweep; `models.compiled` caches it."""

    graph = True

    def __init__(
        self, kind: str, dtype: str, ours: bool, variant: str = "auto", op: str = "softmax"
    ) -> None:
        self.kind, self.dtype, self.ours, self.variant, self.op = kind, dtype, ours, variant, op
        self.name = (
            ("ours" if variant == "auto" else f"ours:{variant}") if ours else "max.ops.softmax"
        )
        self.transfers = WORKLOADS[op].transfers
        self.arity = WORKLOADS[op].arity
        self.bufs: list[Any] = []
        self.last: list[Any] = []

    def key(self, k: int) -> tuple:
        """The models cache key of the K-op graph."""
        return ("bench", self.name, self.op, self.dtype, self.kind, k)

    def model(self, k: int) -> Any:
        """The compiled K-op graph (compiled on first use, then cached)."""
        key = self.key(k)
        if key not in _announced:
            _announced.add(key)
            # A first compile is announced, with its estimate, by models.compiled.
            say(f"loading {self.name}'s {k}-op {self.op} graph ({self.dtype}) for {self.kind}...")
        spec, variant, ours, arity = OPS.get(self.op), self.variant, self.ours, self.arity

        def body(*xs: Any) -> list[Any]:
            from max.graph import ops as max_ops

            groups = [xs[i * arity : (i + 1) * arity] for i in range(k)]
            if self.op in CROSS_ENTROPY_OPS:  # (loss, dlogits) or (loss,) per op
                return [out for g in groups for out in _loss_graph(self.op, *g)]
            if self.op in MASKED_OPS:
                return [_masked_graph(self.op, ours, *g) for g in groups]
            if not ours:
                return [max_ops.softmax(g[0], axis=-1) for g in groups]
            kw = {"variant": variant} if spec.has_variants and variant != "auto" else {}
            return [spec.graph(*g, axis=-1, **kw) for g in groups]

        def build() -> Any:
            from max.dtype import DType
            from max.graph import TensorType

            ref = device_ref(self.kind)
            dims = ["b", "rows", "n"] if self.op == "causal_softmax" else ["rows", "n"]
            t = TensorType(max_dtype(DTYPE_NAMES[self.dtype]), dims, ref)
            types = [t] * arity
            if self.op in CROSS_ENTROPY_OPS:  # (logits, int64 targets) per op
                types = [t, TensorType(DType.int64, ["rows"], ref)]
            name = f"bench_{self.name.replace(':', '_').replace('.', '_')}_{self.op}_{k}"
            return build_graph(name, types * k, body)

        what = f"{self.name} {self.op} {self.dtype} ({k}-op bench graph)"
        return compiled(key, self.kind, build, what)

    def prepare(self, xs: list[tuple[np.ndarray, ...]]) -> None:
        """Copy every input to the device, once."""
        dev = max_device(self.kind)
        self.bufs = [to_buffer(np.ascontiguousarray(a)).to(dev) for case in xs for a in case]

    def inputs(self, k: int) -> list[Any]:
        """The input buffers of the K-op graph (the very ones a capture needs)."""
        return self.bufs[: k * self.arity]

    def sync(self) -> None:
        """Wait for the device (no-op on the CPU)."""
        if self.kind == "gpu":
            max_device("gpu").synchronize()

    def run(self, k: int) -> None:
        """Execute the K-op graph on the first k inputs and wait."""
        self.last = self.model(k).execute(*self.inputs(k))
        self.sync()

    def output0(self) -> Any:
        """Output 0 of the last execution, as numpy (for cross_entropy_loss
        op 0's loss); for cross_entropy (loss, dlogits) of op 0."""
        if self.op == "cross_entropy":
            return to_numpy(self.last[0]), to_numpy(self.last[1])
        return to_numpy(self.last[0])


LOSS_GRAPH_OPS = {"cross_entropy": "cross_entropy_with_grad", "cross_entropy_loss": "cross_entropy"}
"""The registry op each loss workload runs as our MAX graph."""


def _loss_graph(op: str, logits: Any, targets: Any) -> list[Any]:
    """One loss workload op in a graph: [loss, dlogits] or [loss] (mean)."""
    out = OPS[LOSS_GRAPH_OPS[op]].graph(logits, targets, ignore_index=IGNORE_INDEX)
    return list(out) if isinstance(out, tuple) else [out]


MASKED_OPS = ("masked_softmax", "causal_softmax")
"""The bench's scaled + masked / causal softmax workloads."""


def _masked_graph(op: str, ours: bool, x: Any, mask: Any = None) -> Any:
    """One masked workload op in a graph: ours fused, or MAX's built-in
    softmax of the unfused expression (which MAX fuses into its kernel)."""
    from max.graph import ops as max_ops

    from ..ops import softmax

    if ours:
        if op == "causal_softmax":
            return softmax(x, scale=MASK_SCALE, causal=True)
        return softmax(x, scale=MASK_SCALE, mask=mask)
    return max_ops.softmax(x * MASK_SCALE + mask, axis=-1)


class TorchProvider(Provider):
    """torch: the device-copy roof (copy=True), torch.softmax, its backward,
    or a forward + backward step through autograd."""

    def __init__(self, kind: str, copy: bool = False, op: str = "softmax") -> None:
        import torch

        self.torch, self.kind, self.copy, self.op = torch, kind, copy, op
        self.name = "copy" if copy else "torch"
        self.transfers = COPY_TRANSFERS if copy else WORKLOADS[op].transfers
        self.dev = torch.device("cuda" if kind == "gpu" else "cpu")

    def softmax(self, x: Any) -> Any:
        """The forward this provider differentiates (torch's own here)."""
        return self.torch.softmax(x, dim=-1)

    def masked(self, x: Any, mask: Any = None) -> Any:
        """The masked workloads, unfused: softmax(x * scale + mask), or
        x * scale with the upper triangle filled with -inf (causal)."""
        return self.expression(x, mask, self._upper(x) if mask is None else None)

    def expression(self, x: Any, mask: Any, upper: Any) -> Any:
        """softmax(x * scale + mask), or of x * scale with `upper` (j > i) dropped."""
        t = self.torch
        if mask is None:
            return t.softmax((x * MASK_SCALE).masked_fill(upper, -t.inf), dim=-1)
        return t.softmax(x * MASK_SCALE + mask, dim=-1)

    def _upper(self, x: Any) -> Any:
        """The causal workload's dropped positions (j > i), made once a shape."""
        if getattr(self, "_upper_mask", None) is None or self._upper_mask.shape != x.shape:
            t = self.torch
            ones = t.ones(x.shape, dtype=t.bool, device=x.device)
            self._upper_mask = t.triu(ones, diagonal=1)
        return self._upper_mask

    def prepare(self, xs: list[tuple[np.ndarray, ...]]) -> None:
        """Copy the inputs into torch tensors on the device."""
        t = self.torch
        self.xs = [tuple(to_torch(t, a, self.dev) for a in case) for case in xs]
        self.ys = [t.empty_like(case[0]) for case in self.xs]

    def run(self, k: int) -> None:
        """Compute the first k cases and wait."""
        self.calls(k)
        self.sync()

    def sync(self) -> None:
        """Wait for the GPU (no-op on the CPU)."""
        if self.kind == "gpu":
            self.torch.cuda.synchronize()

    def calls(self, k: int) -> None:
        """Queue the first k cases' work without waiting: the one body that
        `run` times and that a torch CUDA graph captures (subclasses
        override this, not `run`). Results land in `self.ys[:k]`."""
        t = self.torch
        for i, case in enumerate(self.xs[:k]):
            if self.copy:
                self.ys[i].copy_(case[0])
            elif self.op == "softmax":
                self.ys[i] = self.softmax(case[0])
            elif self.op in MASKED_OPS:
                self.ys[i] = self.masked(*case)
            elif self.op == "softmax_backward":
                y, dy = case
                self.ys[i] = t._softmax_backward_data(dy, y, -1, y.dtype)
            elif self.op == "log_softmax_backward":
                logp, dy = case
                self.ys[i] = t._log_softmax_backward_data(dy, logp, -1, logp.dtype)
            else:  # a training step's softmax: forward, then backward to x
                x = case[0].detach().requires_grad_()
                self.softmax(x).backward(case[1])
                self.ys[i] = x.grad

    def output0(self) -> Any:
        """The result of case 0, as numpy."""
        return self.output_of(self.ys[0])

    def output_of(self, y: Any) -> Any:
        """A result as `output0` gives it, as numpy (a replay reads the
        output its capture allocated this way)."""
        return from_torch(y)


class BridgeProvider(TorchProvider):
    """Our op called from torch through `max_softmax.torch` (bridge
    overhead included): its forward, or forward + backward via autograd."""

    def __init__(self, kind: str, op: str = "softmax") -> None:
        super().__init__(kind, op=op)
        from .. import torch as bridge

        self.bridge = bridge
        self.name = "ours:torch"

    def softmax(self, x: Any) -> Any:
        """Our softmax, through the torch bridge."""
        return self.bridge.softmax(x, dim=-1)

    def masked(self, x: Any, mask: Any = None) -> Any:
        """Our fused masked / causal softmax, through the torch bridge."""
        if mask is None:
            return self.bridge.softmax(x, dim=-1, scale=MASK_SCALE, causal=True)
        return self.bridge.softmax(x, dim=-1, scale=MASK_SCALE, mask=mask)


class CompiledMasked(TorchProvider):
    """torch.compile of the unfused masked expression (Inductor fuses the
    scale, the mask and the softmax into its own kernels)."""

    def __init__(self, kind: str, op: str) -> None:
        super().__init__(kind, op=op)
        self.name = "torch.compile"
        self.expression = self.torch.compile(TorchProvider.expression.__get__(self))


class TritonProvider(TorchProvider):
    """The Triton tutorial's fused softmax (a program per row, row in SRAM)."""

    def __init__(self, kind: str) -> None:
        super().__init__(kind)
        from .triton_softmax import triton_softmax

        self.fn = triton_softmax
        self.name = "triton"

    def calls(self, k: int) -> None:
        """Launch the kernel on the first k cases (no wait)."""
        for (x,), y in zip(self.xs[:k], self.ys[:k]):
            self.fn(x, y)


class QuackProvider(TorchProvider):
    """QuACK's CuTe-DSL softmax and softmax backward (Dao-AILab's
    quack-kernels; 2-D, N a multiple of the 16-byte vector), into
    preallocated outputs as ours runs."""

    def __init__(self, kind: str, op: str = "softmax") -> None:
        super().__init__(kind, op=op)
        # quack/__init__ exports a function `softmax` that shadows the module.
        self.q = importlib.import_module("quack.softmax")
        self.name = "quack"

    def calls(self, k: int) -> None:
        """Launch QuACK's kernel on the first k cases (no wait)."""
        for case, out in zip(self.xs[:k], self.ys[:k]):
            if self.op == "softmax":
                self.q._softmax_fwd(case[0], out)
            else:
                y, dy = case
                self.q._softmax_backward(dy, y, out)


class CrossEntropyProvider(TorchProvider):
    """torch's `F.cross_entropy(x, t, ignore_index=-100)` (mean) and
    `.backward()`, x a fresh leaf on the logits each call: (loss, x.grad);
    for `op="cross_entropy_loss"` the loss alone, under `torch.no_grad()`
    on logits that do not require grad: (loss, None). Subclasses swap the
    loss function: torch.compile, our torch bridge, Liger-Kernel, QuACK."""

    def __init__(self, kind: str, op: str = "cross_entropy") -> None:
        super().__init__(kind, op=op)
        import torch.nn.functional as F

        self.F = F
        self.grad = op == "cross_entropy"

    def loss(self, x: Any, t: Any) -> Any:
        """The scalar mean loss of logits `x` against targets `t`."""
        return self.F.cross_entropy(x, t, ignore_index=IGNORE_INDEX)

    def prepare(self, xs: list[tuple[np.ndarray, ...]]) -> None:
        """Copy the (logits, targets) pairs into torch tensors on the device."""
        self.xs = [tuple(to_torch(self.torch, a, self.dev) for a in case) for case in xs]
        self.ys: list[Any] = [None] * len(xs)

    def calls(self, k: int) -> None:
        """Loss and gradient (or the loss alone) of the first k cases (no wait)."""
        with self.torch.set_grad_enabled(self.grad):
            for i, (logits, targets) in enumerate(self.xs[:k]):
                self.ys[i] = self.call(logits, targets)

    def call(self, logits: Any, targets: Any) -> tuple[Any, Any]:
        """One call: (loss, dlogits) through `.backward()`, or (loss, None)."""
        if not self.grad:
            return self.loss(logits, targets), None
        x = logits.detach().requires_grad_()
        loss = self.loss(x, targets)
        loss.backward()
        return loss.detach(), x.grad

    def output_of(self, y: Any) -> Any:
        """(loss, the first CHECK_ROWS rows of dlogits) of a (loss, dlogits)
        result, as numpy; the loss alone for cross_entropy_loss."""
        loss, grad = y
        if grad is None:
            return from_torch(loss)
        return from_torch(loss), from_torch(grad[:CHECK_ROWS])


class CompiledCrossEntropy(CrossEntropyProvider):
    """`torch.compile` of the same loss function (static shapes; the
    backward is compiled by AOT autograd). Compiling is warm-up, untimed."""

    def __init__(self, kind: str, op: str = "cross_entropy") -> None:
        super().__init__(kind, op)
        # A fresh cache per shape: recompiles of one function past dynamo's
        # limit would silently fall back to eager.
        self.torch._dynamo.reset()
        self.fn = self.torch.compile(super().loss, dynamic=False)
        self.name = "torch.compile"

    def loss(self, x: Any, t: Any) -> Any:
        """The compiled loss."""
        return self.fn(x, t)


class BridgeCrossEntropy(CrossEntropyProvider):
    """Our fused cross-entropy from torch, `max_softmax.torch.cross_entropy`
    (its forward writes the gradient; backward scales it by the incoming
    gradient, on CUDA's launch path without reading rows whose factor is 1).
    On logits that do not require grad it runs the loss-only op."""

    def __init__(self, kind: str, op: str = "cross_entropy") -> None:
        super().__init__(kind, op)
        from .. import torch as bridge

        self.bridge = bridge
        self.name = "ours:torch"

    def loss(self, x: Any, t: Any) -> Any:
        """Our loss, through the torch bridge."""
        return self.bridge.cross_entropy(x, t, ignore_index=IGNORE_INDEX)


class LigerCrossEntropy(CrossEntropyProvider):
    """Liger-Kernel's Triton cross-entropy (`liger_cross_entropy`). Its
    forward writes the gradient over the logits (to save memory), so after
    the checked first call each call runs on the previous one's gradient:
    the same work, as its kernel does not depend on the values. For the
    loss alone it needs a Liger whose kernel skips the gradient on logits
    that do not require grad (its `HAS_GRADIENTS` flag); an older one
    always writes it, and is refused rather than timed as loss-only."""

    def __init__(self, kind: str, op: str = "cross_entropy") -> None:
        super().__init__(kind, op)
        from liger_kernel.transformers.functional import liger_cross_entropy

        if not self.grad and not liger_skips_gradient():
            raise RuntimeError(
                "this Liger-Kernel's forward always writes the gradient (no HAS_GRADIENTS "
                "flag): not a loss-only peer"
            )

        self.fn = liger_cross_entropy
        self.name = "liger"

    def loss(self, x: Any, t: Any) -> Any:
        """Liger's loss (its forward also computes the gradient)."""
        return self.fn(x, t, ignore_index=IGNORE_INDEX)


class QuackCrossEntropy(CrossEntropyProvider):
    """QuACK's CuTe-DSL cross-entropy, `quack.cross_entropy.cross_entropy`
    (forward kernel, then a backward kernel that reads the logits again).
    For the loss alone its forward suffices: the autograd function's
    forward launches only the loss kernel (writing a loss and an lse a
    row), the gradient kernel runs in its backward."""

    def __init__(self, kind: str, op: str = "cross_entropy") -> None:
        super().__init__(kind, op)
        # quack/__init__ exports names that shadow its submodules.
        self.q = importlib.import_module("quack.cross_entropy")
        self.name = "quack"

    def loss(self, x: Any, t: Any) -> Any:
        """QuACK's mean loss (float32 whatever the logits' dtype)."""
        return self.q.cross_entropy(x, t, ignore_index=IGNORE_INDEX, reduction="mean")


class JaxProvider(Provider):
    """jax.nn.softmax, jitted."""

    def __init__(self, kind: str) -> None:
        import jax

        self.jax = jax
        self.name = "jax"
        self.dev = jax.devices("gpu" if kind == "gpu" else "cpu")[0]
        self.fn = jax.jit(lambda x: jax.nn.softmax(x, axis=-1))

    def prepare(self, xs: list[tuple[np.ndarray, ...]]) -> None:
        """Put the inputs on the JAX device."""
        self.xs = [self.jax.device_put(case[0], self.dev) for case in xs]

    def run(self, k: int) -> None:
        """Compute the first k cases and block until ready."""
        self.ys = [self.fn(x) for x in self.xs[:k]]
        for y in self.ys:
            y.block_until_ready()

    def output0(self) -> np.ndarray:
        """The result of case 0, as numpy."""
        return np.asarray(self.ys[0])


class NumpyProvider(Provider):
    """CPU peers: scipy.special.softmax, a plain numpy softmax or backward
    (`op`), and np.copyto."""

    def __init__(self, which: str, op: str = "softmax") -> None:
        self.name, self.op = which, op
        self.transfers = COPY_TRANSFERS if which == "copy" else WORKLOADS[op].transfers

    def prepare(self, xs: list[tuple[np.ndarray, ...]]) -> None:
        """Keep the inputs; allocate the outputs."""
        self.xs = xs
        self.ys = [np.empty_like(case[0]) for case in xs]

    def run(self, k: int) -> None:
        """Compute the first k cases."""
        import scipy.special

        for case, y in zip(self.xs[:k], self.ys[:k]):
            x = case[0]
            if self.name == "copy":
                np.copyto(y, x)
            elif self.name == "scipy":
                y[...] = scipy.special.softmax(x, axis=-1)
            elif self.op == "softmax_backward":  # y * (dy - sum(dy * y))
                dy = case[1]
                np.multiply(x, dy - (dy * x).sum(axis=-1, keepdims=True), out=y)
            elif self.op == "log_softmax_backward":  # dy - exp(logp) * sum(dy)
                dy = case[1]
                np.subtract(dy, np.exp(x) * dy.sum(axis=-1, keepdims=True), out=y)
            else:
                e = np.exp(x - x.max(axis=-1, keepdims=True))
                np.divide(e, e.sum(axis=-1, keepdims=True), out=y)

    def output0(self) -> np.ndarray:
        """The result of case 0."""
        return self.ys[0]


class ArrayProvider(Provider):
    """Our array function (`max_softmax.softmax(x, -1, device="cpu")`, or
    the backward op on (y, dy)) on numpy arrays, end to end: what a numpy
    user gets (on the CPU through the launch extension, no graph)."""

    def __init__(self, op: str = "softmax") -> None:
        self.name, self.op = "ours:numpy", op
        self.transfers = WORKLOADS[op].transfers

    def prepare(self, xs: list[tuple[np.ndarray, ...]]) -> None:
        """Keep the inputs."""
        self.xs = xs
        self.ys: list[np.ndarray] = []

    def run(self, k: int) -> None:
        """Compute the first k cases (each call returns its result)."""
        from .. import arrays

        fn = getattr(arrays, self.op)
        self.ys = [fn(*case, -1, device="cpu") for case in self.xs[:k]]

    def output0(self) -> np.ndarray:
        """The result of case 0."""
        return self.ys[0]


def to_torch(torch: Any, x: np.ndarray, dev: Any) -> Any:
    """A torch tensor on `dev` with the values of `x` (bfloat16 included)."""
    if x.dtype == DTYPE_NAMES["bfloat16"]:
        return torch.from_numpy(x.view(np.uint16)).view(torch.bfloat16).to(dev)
    return torch.from_numpy(x).to(dev)


def from_torch(y: Any) -> np.ndarray:
    """A numpy copy of torch tensor `y` (bfloat16 as ml_dtypes.bfloat16)."""
    import torch

    y = y.detach().cpu()
    if y.dtype == torch.bfloat16:
        return y.view(torch.uint16).numpy().view(DTYPE_NAMES["bfloat16"])
    return y.numpy()


PEER_MODULES = ("torch", "triton", "jax", "quack", "liger_kernel")
"""The optional peers' top-level modules."""


def installed() -> set[str]:
    """Which optional peers are importable here: a subset of PEER_MODULES."""
    return {m for m in PEER_MODULES if importlib.util.find_spec(m)}


def is_max_graph(factory: Callable[[], Provider]) -> bool:
    """Whether `factory` makes a MAX graph provider (whose device memory
    stays in MAX's pool after it is freed)."""
    return isinstance(factory, partial) and factory.func is MaxGraphProvider


def bridged() -> tuple[type[Provider], ...]:
    """The providers that call our op through the torch bridge."""
    return (BridgeProvider, BridgeCrossEntropy)


def make_providers(
    kind: str,
    dtype: str,
    variants: Sequence[str],
    op: str = "softmax",
    bridge: bool = False,
    graph: bool = False,
) -> list[Callable[[], Provider]]:
    """Factories for every provider of `op` available on this machine, the
    copy roof first. On the CPU the softmax forward times ours as numpy
    users call it (`ours:numpy`, the launch extension, no graph) and as a
    MAX graph (`ours`: two more graphs to compile) only with `graph`."""
    out: list[Callable[[], Provider]] = []
    have = installed()
    if kind == "gpu" and "torch" in have:
        out.append(lambda: TorchProvider(kind, copy=True))
    if kind == "cpu":
        out.append(lambda: NumpyProvider("copy"))
    if op in CROSS_ENTROPY_OPS:
        return out + _cross_entropy_providers(kind, dtype, have, op)
    if op in MASKED_OPS:
        out.append(partial(MaxGraphProvider, kind, dtype, ours=True, op=op))
        if op == "masked_softmax":
            out.append(partial(MaxGraphProvider, kind, dtype, ours=False, op=op))
        if "torch" in have:
            out.append(lambda: TorchProvider(kind, op=op))
            if kind == "gpu":
                out.append(lambda: CompiledMasked(kind, op))
            if bridge:
                out.append(partial(BridgeProvider, kind, op))
        return out
    if op == "torch_fwd_bwd":
        if "torch" in have:
            out += [partial(BridgeProvider, kind, op), lambda: TorchProvider(kind, op=op)]
        return out
    if kind != "cpu" or graph or op != "softmax":
        out.append(partial(MaxGraphProvider, kind, dtype, ours=True, op=op))
    if kind == "cpu":
        out.append(partial(ArrayProvider, op))
    if op in BACKWARD_OPS:
        if "torch" in have:
            out.append(lambda: TorchProvider(kind, op=op))
        if kind == "cpu" and dtype in ("float32", "float64"):
            out.append(lambda: NumpyProvider("numpy", op))
        if kind == "gpu" and "quack" in have and op == "softmax_backward":
            out.append(lambda: QuackProvider(kind, op))
        return out
    for v in variants:
        out.append(partial(MaxGraphProvider, kind, dtype, ours=True, variant=v))
    if bridge and "torch" in have:
        out.append(partial(BridgeProvider, kind))
    out.append(partial(MaxGraphProvider, kind, dtype, ours=False))
    if "torch" in have:
        out.append(lambda: TorchProvider(kind))
    if kind == "gpu" and "triton" in have and "torch" in have:
        out.append(lambda: TritonProvider(kind))
    if kind == "gpu" and "quack" in have:
        out.append(lambda: QuackProvider(kind))
    if "jax" in have and dtype != "float16":
        out.append(lambda: JaxProvider(kind))
    if kind == "cpu" and dtype in ("float32", "float64"):
        out.append(lambda: NumpyProvider("scipy"))
        out.append(lambda: NumpyProvider("numpy"))
    return out


def _cross_entropy_providers(
    kind: str, dtype: str, have: set[str], op: str
) -> list[Callable[[], Provider]]:
    """Factories for `--op cross_entropy` / `cross_entropy_loss`: ours,
    then torch eager, its compiled twin (GPU), our torch bridge,
    Liger-Kernel and QuACK (GPU, where importable)."""
    out: list[Callable[[], Provider]] = [partial(MaxGraphProvider, kind, dtype, ours=True, op=op)]
    if "torch" not in have:
        return out
    classes = [CrossEntropyProvider, BridgeCrossEntropy]
    if kind == "gpu":
        classes.insert(1, CompiledCrossEntropy)
        classes += [c for m, c in GPU_LOSS_PEERS if m in have]
    return out + [partial(c, kind, op) for c in classes]


GPU_LOSS_PEERS = (("liger_kernel", LigerCrossEntropy), ("quack", QuackCrossEntropy))
"""The optional GPU peers of the loss workloads: (module, provider)."""


def liger_skips_gradient() -> bool:
    """Whether the installed Liger-Kernel's cross-entropy kernel can skip
    the gradient (its `HAS_GRADIENTS` flag, set from `input.requires_grad`)."""
    ops = importlib.import_module("liger_kernel.ops.cross_entropy")
    return "HAS_GRADIENTS" in (getattr(ops.liger_cross_entropy_kernel, "arg_names", None) or ())
