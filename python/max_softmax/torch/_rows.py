"""The row ops (softmax, log_softmax and their backward ops) on torch
tensors: checks at the edge, a launch plan per shape for repeated calls,
and a registered torch custom op per op for torch.compile.

A call is lean: torch allocates the output, and the launch extension
(`_launch`), or else the op's destination-passing model (`_graph_path`),
writes into it, with no copy, no host synchronisation and no dispatcher
between.
"""

from __future__ import annotations

import torch

from ..models import into_model
from ..registry import OPS, op_spec
from ..validation import TensorMismatchError, normalize_axis
from . import _launch as torch_launch
from ._buffers import DTYPES
from ._device import check_device, device_kind, is_wrapped
from ._graph_path import execute


def _call(name: str, out: torch.Tensor, *inputs: torch.Tensor) -> None:
    """Write op `name` of (outer, n, inner) tensors `inputs` into `out`: by
    the launch extension (torch_launch), else by its destination-passing
    model or a replay of its captured graph (MAX_SOFTMAX_TORCH_LAUNCH=graph)."""
    if torch_launch.available(out.is_cuda):
        outer, n, inner = out.shape
        torch_launch.run(name, out, *inputs, outer=outer, n=n, inner=inner)
        return
    model = into_model(name, DTYPES[out.dtype], device_kind(out))
    execute(model, (out, *inputs), replay_key=name)


def _register(name: str) -> object:
    """Op `name` as a torch custom op mutating its first argument, for
    torch.compile (whose tracer cannot see into MAX). torch reads the op's
    schema from the signature, so each arity gets its own."""
    if op_spec(name).arity == 1:

        def run1(out: torch.Tensor, x: torch.Tensor) -> None:
            _call(name, out, x)

        fn = run1
    else:

        def run2(out: torch.Tensor, a: torch.Tensor, dy: torch.Tensor) -> None:
            _call(name, out, a, dy)

        fn = run2
    return torch.library.custom_op(f"max_softmax::{name}", fn, mutates_args=("out",))


# Registered at import, not on first use: torch.compile(fullgraph=True) must
# not trace their construction. Kernels still compile lazily, on first call.
_TORCH_OPS = {name: _register(name) for name, spec in OPS.items() if spec.kind == "row"}


def dims(shape: torch.Size, dim: int) -> tuple[int, int, int]:
    """The (outer, n, inner) dims of `shape` along `dim` (>= 0), without
    numpy: this is the bridge's per-call path."""
    outer = 1
    for s in shape[:dim]:
        outer *= s
    inner = 1
    for s in shape[dim + 1 :]:
        inner *= s
    return outer, shape[dim], inner


def _canonical(t: torch.Tensor, dim: int) -> torch.Tensor:
    """A contiguous (outer, n, inner) view of `t` along `dim`."""
    return t.contiguous().view(*dims(t.shape, dim))


_contiguous = torch.Tensor.contiguous
"""A tensor itself where contiguous, else a contiguous copy (a C call, no
Python frame under `map`)."""

_empty_like = torch.empty_like
"""A new tensor like a contiguous one: its own layout, which is contiguous
(~0.3 µs less than asking for `contiguous_format`, which a call on a
non-contiguous tensor needs: `_empty_contiguous`)."""


def _empty_contiguous(t: torch.Tensor) -> torch.Tensor:
    """A new contiguous tensor of `t`'s shape, dtype and device."""
    return torch.empty_like(t, memory_format=torch.contiguous_format)


_plans: dict[tuple, torch_launch.Launcher] = {}
"""Launches of the row ops by (op, dim, shape, dtype, device) of the first
tensor, made once that call passed `run`'s checks: a repeated call (a
training step's forward and backward) skips straight to the launch."""

PLAN_LIMIT = 4096
"""Plans kept at most: past it they are dropped and remade as calls come (a
model whose shapes never repeat must not grow the table without end)."""


def run(name: str, dim: int, *tensors: torch.Tensor) -> torch.Tensor:
    """Row op `name` of plain (not autograd-tracked) `tensors` along `dim`
    into a new tensor. Later tensors (a backward's dy) must be like the
    first; the checks run once per shape, dtype and device (`_plans` then
    launches)."""
    if torch.compiler.is_compiling():
        return _run_checked(name, dim, *tensors)
    return run_eager(name, dim, *tensors)


def run_eager(name: str, dim: int, *tensors: torch.Tensor) -> torch.Tensor:
    """`run` for a caller that knows torch.compile is not tracing it (an
    eager autograd Function's forward): the plan without asking again."""
    first = tensors[0]
    launch = _plans.get((name, dim, first.shape, first.dtype, first.device))
    if launch is None:
        return _run_checked(name, dim, *tensors)
    out = _empty_like(first) if first.is_contiguous() else _empty_contiguous(first)
    launch(out, *map(_contiguous, tensors))
    return out


def run_planned(name: str, x: torch.Tensor, dim: int) -> torch.Tensor | None:
    """`run_eager` of a forward op where its plan exists, else None: the
    whole path of a repeated call that neither autograd nor torch.compile
    sees (an inference step). None too where a torch.func transform wraps
    `x` (live or dead): a wrapper's address is no data (none, or 0 under
    `functionalize`), and the caller's path unwraps it or refuses it."""
    launch = _plans.get((name, dim, x.shape, x.dtype, x.device))
    if launch is None or is_wrapped(x):
        return None
    out = _empty_like(x) if x.is_contiguous() else _empty_contiguous(x)
    launch(out, _contiguous(x))
    return out


def _run_checked(name: str, dim: int, *tensors: torch.Tensor) -> torch.Tensor:
    """`run` for a call no plan covers: check, run, and keep a plan for the
    launch path."""
    first = tensors[0]
    if first.dtype not in DTYPES:
        raise TypeError(f"max_softmax: softmax needs a floating-point tensor, got {first.dtype}")
    axis = normalize_axis(dim, first.dim())
    for t in tensors[1:]:
        if (t.shape, t.dtype, t.device) != (first.shape, first.dtype, first.device):
            raise TensorMismatchError(
                f"max_softmax: {name} needs tensors of one shape, dtype and device: got "
                f"{t.dtype}{list(t.shape)} on {t.device} for {first.dtype}{list(first.shape)} "
                f"on {first.device}"
            )
    launching = first.device.type in ("cpu", "cuda") and torch_launch.available(first.is_cuda)
    check_device(first, name, launching)
    out = torch.empty_like(first, memory_format=torch.contiguous_format)
    if first.numel() == 0:
        return out
    if launching and not torch.compiler.is_compiling():
        # Raw addresses and dims: no (outer, n, inner) views to make.
        launch = torch_launch.launcher(name, first, *dims(first.shape, axis))
        launch(out, *[t.detach().contiguous() for t in tensors])
        if len(_plans) >= PLAN_LIMIT:
            _plans.clear()
        _plans[(name, dim, first.shape, first.dtype, first.device)] = launch
        return out
    views = [_canonical(t.detach(), axis) for t in tensors]
    out3 = out.view(views[0].shape)
    if torch.compiler.is_compiling():  # the tracer sees a torch custom op
        _TORCH_OPS[name](out3, *views)
    else:  # eager: no dispatcher between
        _call(name, out3, *views)
    return out
