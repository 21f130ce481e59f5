"""Graph-level functions: add our ops to the user's own `max.graph.Graph`.

They mirror `max.graph.ops.softmax`: call them inside a `with Graph(...)`
block on a `TensorValue` of any rank, on CPU or GPU::

    with Graph("model", input_types=[...], custom_extensions=[KERNELS]) as g:
        logits = ops.matmul(x, w)
        probs = max_softmax.ops.softmax(logits, axis=-1)

If the graph was created without `custom_extensions=[max_softmax.KERNELS]`,
the first call adds the kernel library to the current graph.
"""

from __future__ import annotations

from functools import reduce
from operator import mul

from max.graph import Graph, TensorType, TensorValue, ops
from max.graph.dim import Dim

from .devices import check_graph_device
from .kernels import is_kernel_library, kernel_library
from .validation import (
    BASELINE_VARIANTS,
    check_dtype,
    check_dy_like,
    check_variant,
    normalize_axis,
)
from .validation import VARIANTS as VARIANTS  # re-exported: ops.VARIANTS


def softmax(x: TensorValue, axis: int = -1, *, variant: str = "auto") -> TensorValue:
    """Softmax of `x` along `axis`, computed by our Mojo kernels.

    Args:
        x: A floating-point tensor (float32, float16, bfloat16, float64) of
            rank >= 1 in the current graph; dims may be symbolic.
        axis: The axis to normalise; negative values count from the end.
        variant: GPU kernel family (see `VARIANTS`); "auto" picks by shape.

    Returns:
        A tensor of the shape, dtype and device of `x`.
    """
    return _row_op("softmax", x, axis, variant)


def log_softmax(x: TensorValue, axis: int = -1, *, variant: str = "auto") -> TensorValue:
    """Log-softmax of `x` along `axis`: x - max - log(sum(exp(x - max))).

    Same arguments and result as `softmax`.
    """
    return _row_op("log_softmax", x, axis, variant)


def softmax_backward(y: TensorValue, dy: TensorValue, axis: int = -1) -> TensorValue:
    """Gradient of softmax: dx = y * (dy - sum(dy * y, axis)).

    Args:
        y: The output of `softmax(x, axis)`.
        dy: The gradient of the loss with respect to `y`; same shape,
            dtype and device as `y`.
        axis: The axis softmax was taken along.

    Returns:
        dx, the gradient with respect to `x`, shaped like `y`.
    """
    return _row_op("softmax_backward", y, axis, "auto", dy)


def log_softmax_backward(logp: TensorValue, dy: TensorValue, axis: int = -1) -> TensorValue:
    """Gradient of log-softmax: dx = dy - exp(logp) * sum(dy, axis).

    Args:
        logp: The output of `log_softmax(x, axis)`.
        dy: The gradient of the loss with respect to `logp`.
        axis: The axis log_softmax was taken along.

    Returns:
        dx, the gradient with respect to `x`, shaped like `logp`.
    """
    return _row_op("log_softmax_backward", logp, axis, "auto", dy)


def _row_op(
    name: str, x: TensorValue, axis: int, variant: str, dy: TensorValue | None = None
) -> TensorValue:
    x = TensorValue(x)
    check_dtype(x.dtype)
    if dy is not None:
        dy = TensorValue(dy)
        check_dy_like(name, x, dy)
    check_graph_device(x.device, f"the input of {name}")
    check_variant(variant, x.device.device_type.value)
    shape = list(x.shape)
    axis = normalize_axis(axis, len(shape))
    _ensure_kernels_loaded()

    # One (outer, n, inner) view for every rank and axis, so each
    # (op, dtype, device) compiles once. The reshapes are free.
    def product(dims: list[Dim]) -> Dim:
        return reduce(mul, dims, Dim(1))

    view = [product(shape[:axis]), shape[axis], product(shape[axis + 1 :])]
    canonical = len(shape) == 3 and axis == 1
    values = [v if canonical else ops.reshape(v, view) for v in ([x] if dy is None else [x, dy])]
    x3 = values[0]
    parameters: dict[str, str | bool | int | float] = {}
    if variant != "auto":
        parameters["variant"] = variant
    # The baselines are ops of their own (op/baselines/registered_ops.mojo),
    # so the live package never imports them.
    kernel = f"{name}_baseline" if variant in BASELINE_VARIANTS else name
    (y3,) = ops.custom(
        name=kernel,
        device=x.device,
        values=values,
        out_types=[TensorType(x.dtype, x3.shape, x.device)],
        parameters=parameters or None,
    )
    y = y3.tensor
    return y if canonical else ops.reshape(y, shape)


def _ensure_kernels_loaded() -> None:
    graph = Graph.current
    if any(is_kernel_library(p) for p in graph.kernel_libraries_paths):
        return
    try:
        graph._import_kernels([kernel_library()])
    except Exception as err:  # pragma: no cover - depends on MAX internals
        raise RuntimeError(
            "max_softmax: could not add the kernel library to this graph; "
            "create it with Graph(..., custom_extensions=[max_softmax.KERNELS])"
        ) from err
