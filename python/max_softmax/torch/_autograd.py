"""Autograd for the row ops: softmax and log_softmax as `torch.autograd.Function`s
in the `setup_context` style, so reverse mode, `create_graph=True` (any
order), forward mode (`jvp`), and `torch.func` (`grad`, `jvp`, `vmap`) all
work.

First-order gradients run our backward ops (`softmax_backward`,
`log_softmax_backward`) directly. When something records or transforms the
backward itself (a gradient with `create_graph=True`, forward-over-reverse,
`torch.func`), it runs as a second-level Function whose forward is the same
backward op and whose own derivatives are torch ops; so the gradient's value
is our kernel's either way, and its derivatives are exact.

A `vmap`ped call becomes one call with the vmapped dim moved to the front:
the ops are row-wise, so it is one more leading dim.

Each Function comes in three variants: itself (setup_context style, for
torch.func), `for_eager` (ctx style, applied by torch's C apply: the
first-order path, as cheap a call as a plain Function) and `for_compile`.
`pick` chooses among them, or the op as is, once a call.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ..validation import normalize_axis
from ._device import is_wrapped, refuse_functional
from ._rows import run, run_eager

_forward_ad = torch.autograd.forward_ad
_transforms_active = torch._C._are_functorch_transforms_active
_grad_enabled = torch.is_grad_enabled
_apply_in_c = torch._C._FunctionBase.__dict__["apply"]
"""The apply under `Function.apply`: it skips the Python that binds a
setup_context Function's arguments, asks whether torch.func is active and
unwraps dead torch.func wrappers (~10 µs a call on a busy CPU). For eager
variants, which `choose` and `pick` take only where no transform is active
and no tensor is wrapped."""


def forward_mode() -> bool:
    """Whether forward-mode AD is on (a dual level is open)."""
    return _forward_ad._current_level >= 0


def needs_function(*tensors: torch.Tensor) -> bool:
    """Whether a call must go through an autograd Function: autograd records
    it, forward-mode AD is on, or a `torch.func` transform wraps a tensor.
    Else the op runs as is (no ~10 µs of Function bookkeeping a call)."""
    for t in tensors:
        if t.requires_grad and _grad_enabled():
            return True
    if torch.compiler.is_compiling():
        return False
    if _forward_ad._current_level >= 0:
        return True
    for t in tensors:
        if is_wrapped(t):
            return True
    return False


TRACED = object()
"""`pick`'s answer for a call that torch.compile traces and autograd does not
record: the op runs as is, by its traced path (a torch custom op)."""


def pick(
    functions: tuple[type[torch.autograd.Function], ...], *tensors: torch.Tensor
) -> type[torch.autograd.Function] | object | None:
    """The autograd Function of `functions` (`fn`, `for_eager(fn)`,
    `for_compile(fn)`) that a call on `tensors` applies; else `TRACED` where
    the op runs as is under torch.compile, or None where it runs as is in
    eager mode (`needs_function` is False): the one decision a call makes,
    with torch.compile asked once, so an eager caller need not ask again
    (`run_eager`)."""
    recorded = False
    for t in tensors:
        if t.requires_grad:
            recorded = _grad_enabled()
            break
    if torch.compiler.is_compiling():
        return functions[2] if recorded else TRACED
    for t in tensors:
        if is_wrapped(t):  # live, or dead (fn's apply unwraps it)
            refuse_functional(t, "this op")
            return functions[0]
    if recorded or _forward_ad._current_level >= 0:
        # Under a transform only a setup_context Function may be applied.
        return functions[0] if _transforms_active() else functions[1]
    return None


def leading(info: Any, in_dims: tuple, *tensors: torch.Tensor) -> tuple[list, int]:
    """`vmap` helper: `tensors` with their vmapped dim (in_dims) moved to the
    front (an unbatched one expanded to the batch), and the logical rank."""
    rank = None
    moved = []
    for t, b in zip(tensors, in_dims):
        if b is None:
            moved.append(t.expand(info.batch_size, *t.shape))
            rank = t.dim() if rank is None else rank
        else:
            moved.append(t.movedim(b, 0))
            rank = t.dim() - 1
    return moved, rank


def for_compile(fn: type[torch.autograd.Function]) -> type[torch.autograd.Function]:
    """Function `fn` without its `jvp` and `vmap`, for torch.compile: Dynamo
    does not trace a Function with a custom jvp (forward-mode AD under
    torch.compile then raises torch's "jvp is not implemented")."""
    parts = {k: fn.__dict__[k] for k in ("forward", "setup_context", "backward")}
    return type(f"{fn.__name__}Compiled", (torch.autograd.Function,), parts)


def for_eager(fn: type[torch.autograd.Function]) -> type[torch.autograd.Function]:
    """Function `fn` in the style whose forward takes ctx: the same forward,
    setup_context, backward and jvp (reverse mode to any order and forward
    mode), without the signature binding torch does on every `apply` of a
    setup_context Function, its apply torch's C one (`_apply_in_c`). For
    calls no torch.func transform wraps (`choose`, `pick`)."""
    forward, setup_context = fn.forward, fn.setup_context

    def eager_forward(ctx: Any, *args: Any) -> Any:
        out = forward(*args)
        setup_context(ctx, args, out)
        return out

    parts = {k: fn.__dict__[k] for k in ("backward", "jvp")}
    parts["forward"] = staticmethod(eager_forward)
    parts["apply"] = _apply_in_c
    return type(f"{fn.__name__}Eager", (torch.autograd.Function,), parts)


def choose(
    fn: type[torch.autograd.Function], eager: type[torch.autograd.Function], *tensors: torch.Tensor
) -> type[torch.autograd.Function]:
    """Function `fn` (setup_context style) for a call under a torch.func
    transform or on a wrapped tensor, else its `for_eager` variant `eager`.
    (Under torch.compile callers take the `for_compile` variant themselves:
    Dynamo traces a Function named by a global, not one picked here.)"""
    if _transforms_active():
        return fn
    for t in tensors:
        if is_wrapped(t):
            return fn
    return eager


def _keep(t: torch.Tensor, dim: int) -> torch.Tensor:
    return t.sum(dim, keepdim=True)


class SoftmaxBackward(torch.autograd.Function):
    """dx = y * (dy - <dy, y>) by our softmax_backward op, differentiable in
    y and dy (torch ops)."""

    @staticmethod
    def forward(y: torch.Tensor, dy: torch.Tensor, dim: int) -> torch.Tensor:  # type: ignore[override]
        return run("softmax_backward", dim, y, dy)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple, output: torch.Tensor) -> None:
        y, dy, dim = inputs
        ctx.save_for_backward(y, dy)
        ctx.save_for_forward(y, dy)
        ctx.dim = dim

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor):  # type: ignore[override]
        y, dy = ctx.saved_tensors
        d = ctx.dim
        gy = _keep(g * y, d)
        grad_y = g * (dy - _keep(dy * y, d)) - gy * dy if ctx.needs_input_grad[0] else None
        grad_dy = y * (g - gy) if ctx.needs_input_grad[1] else None
        return grad_y, grad_dy, None

    @staticmethod
    def jvp(ctx: Any, ty: torch.Tensor | None, tdy: torch.Tensor | None, _: None):  # type: ignore[override]
        y, dy = ctx.saved_tensors
        d = ctx.dim
        out = torch.zeros_like(y)
        if ty is not None:
            out = out + ty * (dy - _keep(dy * y, d)) - y * _keep(dy * ty, d)
        if tdy is not None:
            out = out + y * (tdy - _keep(tdy * y, d))
        return out

    @staticmethod
    def vmap(info: Any, in_dims: tuple, y: torch.Tensor, dy: torch.Tensor, dim: int):  # type: ignore[override]
        (y, dy), rank = leading(info, in_dims[:2], y, dy)
        return SoftmaxBackward.apply(y, dy, normalize_axis(dim, rank) + 1), 0


class LogSoftmaxBackward(torch.autograd.Function):
    """dx = dy - exp(z) * sum(dy) by our log_softmax_backward op,
    differentiable in z and dy (torch ops)."""

    @staticmethod
    def forward(z: torch.Tensor, dy: torch.Tensor, dim: int) -> torch.Tensor:  # type: ignore[override]
        return run("log_softmax_backward", dim, z, dy)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple, output: torch.Tensor) -> None:
        z, dy, dim = inputs
        ctx.save_for_backward(z, dy)
        ctx.save_for_forward(z, dy)
        ctx.dim = dim

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor):  # type: ignore[override]
        z, dy = ctx.saved_tensors
        d = ctx.dim
        p = z.exp()
        grad_z = -g * p * _keep(dy, d) if ctx.needs_input_grad[0] else None
        grad_dy = g - _keep(g * p, d) if ctx.needs_input_grad[1] else None
        return grad_z, grad_dy, None

    @staticmethod
    def jvp(ctx: Any, tz: torch.Tensor | None, tdy: torch.Tensor | None, _: None):  # type: ignore[override]
        z, dy = ctx.saved_tensors
        d = ctx.dim
        p = z.exp()
        out = torch.zeros_like(z)
        if tz is not None:
            out = out - p * tz * _keep(dy, d)
        if tdy is not None:
            out = out + tdy - p * _keep(tdy, d)
        return out

    @staticmethod
    def vmap(info: Any, in_dims: tuple, z: torch.Tensor, dy: torch.Tensor, dim: int):  # type: ignore[override]
        (z, dy), rank = leading(info, in_dims[:2], z, dy)
        return LogSoftmaxBackward.apply(z, dy, normalize_axis(dim, rank) + 1), 0


_BACKWARD = {"softmax_backward": SoftmaxBackward, "log_softmax_backward": LogSoftmaxBackward}
_BACKWARD_VARIANTS = {name: (fn, for_eager(fn), for_compile(fn)) for name, fn in _BACKWARD.items()}


def row_backward(name: str, out: torch.Tensor, dy: torch.Tensor, dim: int) -> torch.Tensor:
    """Backward op `name` of a forward's output `out` and gradient `dy`:
    the op itself, or its differentiable Function when something records or
    transforms the call (`pick`)."""
    fn = pick(_BACKWARD_VARIANTS[name], out, dy)
    if fn is None:
        return run_eager(name, dim, out, dy)
    if fn is TRACED:
        return run(name, dim, out, dy)
    return fn.apply(out, dy, dim)


def _row_function(
    name: str,
    op: str,
    jvp_of: Callable[[torch.Tensor, torch.Tensor, int], torch.Tensor],
    doc: str,
) -> type[torch.autograd.Function]:
    """The autograd Function `name` of forward row op `op` (setup_context
    style): our kernel forward, our `{op}_backward` op as its gradient,
    `jvp_of(out, tangent, dim)` as its jvp, vmap as one more leading dim.
    softmax and log_softmax differ in nothing else. Made by `type()`, as
    `for_eager` and `for_compile` make theirs, so that the class and its
    grad_fn ("SoftmaxFnBackward") carry `name`."""
    backward_op = f"{op}_backward"

    def forward(x: torch.Tensor, dim: int) -> torch.Tensor:
        return run(op, dim, x)

    def setup_context(ctx: Any, inputs: tuple, output: torch.Tensor) -> None:
        ctx.save_for_backward(output)
        ctx.save_for_forward(output)
        ctx.dim = inputs[1]

    def backward(ctx: Any, dy: torch.Tensor) -> tuple[torch.Tensor, None]:
        (out,) = ctx.saved_tensors
        return row_backward(backward_op, out, dy, ctx.dim), None

    def jvp(ctx: Any, t: torch.Tensor, _: None) -> torch.Tensor:
        (out,) = ctx.saved_tensors
        return jvp_of(out, t, ctx.dim)

    def vmap(info: Any, in_dims: tuple, x: torch.Tensor, dim: int) -> tuple[torch.Tensor, int]:
        (x,), rank = leading(info, in_dims[:1], x)
        return fn.apply(x, normalize_axis(dim, rank) + 1), 0

    namespace = {
        "__doc__": doc,
        "__module__": __name__,
        "forward": staticmethod(forward),
        "setup_context": staticmethod(setup_context),
        "backward": staticmethod(backward),
        "jvp": staticmethod(jvp),
        "vmap": staticmethod(vmap),
    }
    fn = type(name, (torch.autograd.Function,), namespace)
    return fn


def _row_eager(fn: type[torch.autograd.Function], op: str) -> type[torch.autograd.Function]:
    """`for_eager(fn)` of a `_row_function` Function, its forward written out
    (one Python call, not three): our kernel (`run_eager`: an eager Function
    runs outside torch.compile), then the output saved, for forward mode only
    where forward-mode AD is on (nothing calls the jvp otherwise)."""

    def forward(ctx: Any, x: torch.Tensor, dim: int) -> torch.Tensor:
        out = run_eager(op, dim, x)
        ctx.save_for_backward(out)
        if _forward_ad._current_level >= 0:
            ctx.save_for_forward(out)
        ctx.dim = dim
        return out

    eager = for_eager(fn)
    eager.forward = staticmethod(forward)
    return eager


SoftmaxFn = _row_function(
    "SoftmaxFn",
    "softmax",
    # The Jacobian is symmetric: the jvp is the backward op of the tangent.
    lambda y, t, dim: row_backward("softmax_backward", y, t, dim),
    """softmax(x) along `dim` by our kernel; its gradient is our
    softmax_backward op, its jvp the same op applied to the tangent (the
    Jacobian is symmetric).""",
)

LogSoftmaxFn = _row_function(
    "LogSoftmaxFn",
    "log_softmax",
    lambda z, t, dim: t - _keep(t * z.exp(), dim),
    """log_softmax(x) along `dim` by our kernel; its gradient is our
    log_softmax_backward op, its jvp t - <t, softmax>.""",
)


SoftmaxFnEager, SoftmaxFnCompiled = _row_eager(SoftmaxFn, "softmax"), for_compile(SoftmaxFn)
LogSoftmaxFnEager = _row_eager(LogSoftmaxFn, "log_softmax")
LogSoftmaxFnCompiled = for_compile(LogSoftmaxFn)
