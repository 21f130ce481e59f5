"""MAX eager: our ops on `max.experimental.tensor.Tensor`s.

`max_softmax.softmax(t)` (and `log_softmax`, the backward ops) route here
when `t` is a MAX `Tensor`; the result is a `Tensor` on the same device.
Each op is one `max.experimental.custom.declare` declaration, usable eagerly
and inside a `Graph` alike::

    from max.experimental.tensor import Tensor
    y = max_softmax.softmax(Tensor(np.random.randn(8, 1000).astype("float32")))

    with Graph("g", input_types=[...]) as g:      # the same declaration, staged
        g.output(max_softmax.eager.declaration("softmax")(g.inputs[0].tensor))

The declaration takes the (outer, n, inner) view with symbolic dims, like
the graph-level functions, so every shape reuses one compiled kernel. The
reshapes and the op are staged together under `functional.lazy()`: MAX
compiles that little chain once per shape and caches it, where running the
three ops one by one eagerly costs seconds per call.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from . import ops as graph_ops
from . import waits
from .dtypes import to_buffer
from .models import compile_marker, loss_declaration, masked_declaration
from .models import declaration as declaration  # re-exported: eager.declaration(op)
from .validation import (
    canonical_shape,
    check_dtype,
    check_dy_like,
    check_targets_in_range,
    normalize_axis,
)


def is_max_tensor(x: Any) -> bool:
    """True for a `max.experimental.tensor.Tensor` (without importing MAX's
    eager machinery for numpy callers)."""
    return type(x).__module__.startswith("max.experimental") and type(x).__name__ == "Tensor"


def run(op: str, x: Any, axis: int, dy: Any = None) -> Any:
    """`op` of MAX tensor `x` (and `dy`) along `axis`, as a MAX tensor."""
    from max.experimental import functional as F

    check_dtype(x.dtype)
    shape = _dims(x)
    axis = normalize_axis(axis, len(shape))
    operands = [x]
    if dy is not None:
        if not is_max_tensor(dy):
            raise TypeError(f"max_softmax: {op} got a MAX Tensor and dy of type {type(dy)}")
        check_dy_like(op, x, dy, _dims)
        operands.append(dy)
    view = list(canonical_shape(tuple(shape), axis))
    with F.lazy():
        out = F.reshape(declaration(op)(*[F.reshape(t, view) for t in operands]), shape)
    with _first_compile(x, op, len(shape)):
        return _realize(out)


def scaled(op: str, dx: Any, scale: float) -> Any:
    """A backward op's dx (a MAX tensor) times the forward's `scale`, as the
    graph level multiplies it (`ops._scaled`: in dx's dtype)."""
    from max.experimental import functional as F
    from max.experimental.tensor import Tensor
    from max.graph import TensorValue

    with F.lazy():
        out = Tensor.from_graph_value(graph_ops._scaled(TensorValue(dx), op, scale))
    with _first_compile(dx, f"{op} scaling", len(dx.shape)):
        return _realize(out)


def run_masked(op: str, x: Any, axis: int, scale: float | None, mask: Any, causal: bool) -> Any:
    """softmax / log_softmax (`op`) of MAX tensor `x` with scale, mask and
    causal, as a MAX tensor: the graph-level edge (`ops._masked`: checks,
    mask reduced to rows, axis moved last) staged with the declared masked
    op. A mask that is not a MAX Tensor is copied to x's device first
    (`_device_tensor`)."""
    from max.experimental import functional as F
    from max.experimental.tensor import Tensor
    from max.graph import TensorValue

    if mask is not None and not is_max_tensor(mask):  # a numpy array (arrays.as_array)
        mask = _device_tensor(mask, x.device)

    def kernel(x3: Any, m: Any, options: Any) -> Any:
        return masked_declaration(f"{op}_masked")(x3, m, options)

    with F.lazy():
        m = None if mask is None else TensorValue(mask)
        y = graph_ops._masked(op, TensorValue(x), axis, "auto", scale, m, causal, kernel=kernel)
        out = Tensor.from_graph_value(y)
    options = ("scale " if scale is not None else "") + ("mask " if mask is not None else "")
    with _first_compile(x, f"{op} ({options}{'causal' if causal else ''})", len(x.shape)):
        return _realize(out)


def _device_tensor(array: np.ndarray, device: Any) -> Any:
    """A numpy array as a MAX Tensor on `device` (bfloat16 included), so it
    is an input of the staged graph rather than a constant baked into it."""
    from max.experimental.tensor import Tensor

    return Tensor.from_dlpack(to_buffer(np.ascontiguousarray(array))).to(device)


def _dims(t: Any) -> list[int]:
    """An eager tensor's shape as ints."""
    return [int(d) for d in t.shape]


_compiled: set[tuple[str, ...]] = set()
_compiled_lock = threading.Lock()


@contextmanager
def _first_compile(x: Any, what: str, *variant: Any) -> Iterator[None]:
    """Announce the realization this block runs where it is the first of
    its chain (`what`, `variant`: what else shapes the staged graph) on x's
    dtype and device in this process and this machine never compiled it:
    MAX then compiles the chain as it would a model (`waits.BUILDS`); from
    its cache, or later in the process, it takes ~2-5 s or nothing."""
    device = x.device
    dtype = getattr(x.dtype, "name", str(x.dtype))
    key = ("eager", what, repr(variant), dtype, str(device))
    with _compiled_lock:
        first = key not in _compiled
        _compiled.add(key)
    marker = compile_marker(key)
    if not first or marker.is_file():
        yield
        return
    kind = "cpu" if device.is_host else "gpu"
    doing = f"{what} {dtype} for MAX eager on {kind}"
    with waits.announced(f"model:{kind}", f"compiling {doing}", f"compiled {doing}"):
        yield
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.touch()


def _realize(t: Any) -> Any:
    """Realize `t` on a private event loop and return it.

    MAX realizes through `asyncio.run`, whose SIGINT bookkeeping (CPython
    3.11/3.12, main thread) formats the repr of the finished task, i.e. of
    the result tensor, which MAX renders element by element: seconds for a
    few hundred elements. A private loop installs no SIGINT handler.
    """
    try:
        asyncio.get_running_loop()
        return t  # inside a running loop (Jupyter): MAX realizes on a worker thread
    except RuntimeError:
        pass
    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(t.realize)  # a property: the coroutine
    finally:
        loop.close()
    return t


def run_cross_entropy(
    logits: Any,
    targets: Any,
    ignore_index: int,
    reduction: str,
    label_smoothing: float,
    with_grad: bool,
    weight: Any = None,
    z_loss: float = 0.0,
    softcap: float | None = None,
) -> list[Any]:
    """Cross-entropy (and dlogits) of MAX tensor `logits` as MAX tensors on
    its device: the graph-level edge (`ops._cross_entropy`) staged with the
    declared loss op. `targets`: a MAX Tensor, or a numpy array copied to
    the logits' device. Targets on the host are checked in range before
    anything runs; on a GPU a bad one makes its row NaN (no host sync).
    `weight` (a MAX Tensor on the logits' device or an array), `z_loss`
    and `softcap` as `ops.cross_entropy`."""
    from max.experimental import functional as F
    from max.experimental.tensor import Tensor
    from max.graph import TensorValue

    host_targets = None
    if not is_max_tensor(targets):
        host_targets = targets
        targets = _device_tensor(targets, logits.device)
    elif targets.device.is_host:
        host_targets = np.from_dlpack(targets)

    def rows_op(*values: Any, reduction: str, with_grad: bool) -> list[Any]:
        op = "cross_entropy_with_grad" if with_grad else "cross_entropy"
        outs = loss_declaration(op, reduction)(*values)
        return list(outs) if isinstance(outs, (list, tuple)) else [outs]

    with F.lazy():
        outs = graph_ops._cross_entropy(
            TensorValue(logits),
            TensorValue(targets),
            ignore_index,
            reduction,
            label_smoothing,
            with_grad,
            TensorValue(weight) if is_max_tensor(weight) else weight,
            z_loss,
            softcap,
            rows_op=rows_op,
        )
        results = [Tensor.from_graph_value(v) for v in outs]
    if host_targets is not None:  # the shapes and dtypes passed the edge
        check_targets_in_range(host_targets, _dims(logits)[-1], ignore_index)
    extras = (weight is not None, z_loss != 0.0, softcap is not None)
    what = f"{'cross_entropy_with_grad' if with_grad else 'cross_entropy'} ({reduction})"
    with _first_compile(logits, what, extras):
        return [_realize(t) for t in results]
