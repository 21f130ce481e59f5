"""Argument checks shared by the graph-level and array-level functions.

Every user mistake becomes a Python exception that names the problem,
before anything reaches MAX or Mojo.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from max.dtype import DType

SUPPORTED_DTYPES: tuple[DType, ...] = (
    DType.float32,
    DType.float16,
    DType.bfloat16,
    DType.float64,
)
"""Element types every op accepts (16-bit types compute in float32)."""


VARIANTS: tuple[str, ...] = (
    "auto",
    "warp",
    "block",
    "smem",
    "split",
    "split_stream",
)
"""Kernel families `variant=` accepts; "auto" uses the dispatch table in
op/dispatch.mojo. Others exist for benchmarks and tests."""

BACKWARD_VARIANTS: tuple[str, ...] = (
    "auto",
    "register",
    "smem",
    "cluster2",
    "cluster4",
    "split_stream",
    "block",
)
"""Strategies the backward ops' `variant=` forces (op/dispatch.mojo, `BackwardRows`)."""

CROSS_ENTROPY_VARIANTS: tuple[str, ...] = ("auto", "register", "smem", "pair", "block")
"""Strategies cross-entropy's `variant=` forces (op/gpu_cross_entropy.mojo, `CERows`)."""

MASKED_VARIANTS: tuple[str, ...] = ("auto", "register", "block")
"""Strategies the fused masked ops' `variant=` forces (op/gpu_masked_rows.mojo)."""

OP_VARIANTS: dict[str, tuple[str, ...]] = {
    "softmax": VARIANTS,
    "log_softmax": VARIANTS,
    "softmax_backward": BACKWARD_VARIANTS,
    "log_softmax_backward": BACKWARD_VARIANTS,
    "cross_entropy": CROSS_ENTROPY_VARIANTS,
    "cross_entropy_with_grad": CROSS_ENTROPY_VARIANTS,
    "softmax_masked": MASKED_VARIANTS,
    "log_softmax_masked": MASKED_VARIANTS,
}
"""The variants each op takes (one switch in Mojo: op/variants.mojo)."""


class SoftmaxInputError(ValueError):
    """Raised for input that max_softmax cannot take (dtype, rank, axis)."""


def check_dtype(dtype: DType) -> DType:
    """Return `dtype` if it is a supported floating type, else raise."""
    if dtype not in SUPPORTED_DTYPES:
        names = ", ".join(d.name for d in SUPPORTED_DTYPES)
        raise TypeError(
            f"max_softmax: softmax needs a floating-point tensor ({names}), got {dtype.name}"
        )
    return dtype


def check_variant(variant: str, device_kind: str, op: str = "softmax") -> str:
    """Return `variant` if it names a kernel family of `op` (`OP_VARIANTS`)
    that can run on `device_kind` ("cpu" or "gpu"), else raise: the CPU has
    one family."""
    names = OP_VARIANTS[op]
    if variant not in names:
        raise ValueError(
            f"max_softmax: unknown variant {variant!r} for {op}; choose one of {names}"
        )
    if variant != "auto" and device_kind != "gpu":
        raise ValueError(
            f"max_softmax: variant {variant!r} is a GPU kernel family; on the {device_kind} "
            "leave variant='auto'"
        )
    return variant


def check_dy_like(
    op: str, x: Any, dy: Any, dims: Callable[[Any], list] = lambda t: list(t.shape)
) -> None:
    """Raise ValueError unless `dy` has the dtype, dims and device of `x`:
    graph `TensorValue`s and eager `Tensor`s alike (`dims` lists a shape)."""
    x_device, dy_device = getattr(x, "device", "cpu"), getattr(dy, "device", "cpu")
    if dy.dtype != x.dtype or dims(dy) != dims(x) or dy_device != x_device:
        raise ValueError(
            f"max_softmax: {op} needs dy like its first input (same shape, dtype and "
            f"device): got {dy.dtype.name}{dims(dy)} on {dy_device} for "
            f"{x.dtype.name}{dims(x)} on {x_device}"
        )


def normalize_axis(axis: int, rank: int) -> int:
    """Map `axis` (negative counts from the end) into [0, rank), or raise."""
    if rank == 0:
        raise SoftmaxInputError(
            "max_softmax: softmax needs a tensor of rank >= 1, got a scalar (rank 0)"
        )
    if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)):
        raise TypeError(f"max_softmax: axis must be an int, got {axis!r}")
    if not -rank <= axis < rank:
        raise SoftmaxInputError(
            f"max_softmax: axis {axis} is out of range for a tensor of rank "
            f"{rank} (valid: {-rank} to {rank - 1})"
        )
    return int(axis) % rank


def canonical_shape(shape: tuple[int, ...], axis: int) -> tuple[int, int, int]:
    """The (outer, n, inner) view the kernels work on, for a concrete shape
    and an axis (negative counts from the end)."""
    axis = normalize_axis(axis, len(shape))
    # math.prod of Python ints: exact at any size, and ~10x cheaper than
    # np.prod on the array functions' per-call path.
    dims = [int(d) for d in shape]
    return math.prod(dims[:axis]), dims[axis], math.prod(dims[axis + 1 :])


REDUCTIONS: tuple[str, ...] = ("mean", "sum", "none")
"""What `reduction=` of the cross-entropy functions accepts (as torch)."""


def _is_real(value: Any) -> bool:
    """Whether `value` is a real number and not a bool. A float is answered
    first: `numbers.Real` is an ABC whose check costs a host call's worth of
    time. numbers.Real, not np.isscalar: torch.compile traces this check."""
    if type(value) is float:
        return True
    return not isinstance(value, bool) and isinstance(value, numbers.Real)


def check_cross_entropy_options(
    reduction: str, ignore_index: int, label_smoothing: float
) -> tuple[str, int, float]:
    """Return (reduction, ignore_index, label_smoothing) as the kernels take
    them, or raise: a reduction of `REDUCTIONS`, an int ignore_index (exact
    in the float64 the kernels read it from), smoothing in [0, 1] as torch."""
    if reduction not in REDUCTIONS:
        raise ValueError(f"max_softmax: reduction must be one of {REDUCTIONS}, got {reduction!r}")
    if isinstance(ignore_index, bool) or not isinstance(ignore_index, (int, np.integer)):
        raise TypeError(f"max_softmax: ignore_index must be an int, got {ignore_index!r}")
    if not -(2**53) <= int(ignore_index) <= 2**53:
        raise ValueError(f"max_softmax: ignore_index {ignore_index} is out of range (|i| <= 2^53)")
    if type(label_smoothing) is not float and not _is_real(label_smoothing):
        raise TypeError(f"max_softmax: label_smoothing must be a float, got {label_smoothing!r}")
    smoothing = float(label_smoothing)
    if not 0.0 <= smoothing <= 1.0:
        raise ValueError(f"max_softmax: label_smoothing must be in [0, 1], got {label_smoothing!r}")
    return reduction, int(ignore_index), smoothing


def check_cross_entropy_extras(z_loss: float, softcap: float | None) -> tuple[float, float]:
    """Return (z_loss, softcap) as the kernels take them (softcap None -> 0,
    off), or raise: both finite numbers >= 0."""
    if softcap is None and type(z_loss) is float and z_loss == 0.0:
        return 0.0, 0.0  # the defaults, answered without the checks below
    values = []
    for name, value in (("z_loss", z_loss), ("softcap", 0.0 if softcap is None else softcap)):
        if not _is_real(value):
            raise TypeError(f"max_softmax: {name} must be a float, got {value!r}")
        number = float(value)
        if not (math.isfinite(number) and number >= 0.0):
            raise ValueError(f"max_softmax: {name} must be a finite number >= 0, got {value!r}")
        values.append(number)
    return values[0], values[1]


def check_class_weight(shape: list, classes: Any) -> None:
    """Raise unless a class weight of `shape` fits `classes` classes: (C,),
    as torch's `weight=`."""
    if len(shape) != 1 or (isinstance(classes, int) and int(shape[0]) != classes):
        raise ValueError(
            f"max_softmax: cross_entropy weight must have shape ({classes},), one value "
            f"per class, got {tuple(shape)}"
        )


def check_class_weight_array(weight: np.ndarray, classes: Any) -> None:
    """`check_class_weight` for class weights given as a host array, which
    must also hold real numbers (floating or integer)."""
    check_class_weight(list(weight.shape), classes)
    if weight.dtype.kind not in "fiu":
        raise TypeError(f"max_softmax: cross_entropy weight must be real, got {weight.dtype}")


def check_same_device(
    op: str, what: str, got: object, device: object, owner: str = "the input's"
) -> None:
    """Raise ValueError unless `what` (an argument of `op`, on `got`) is on
    `device`, the device of `owner`'s tensor (MAX devices or torch's)."""
    if got != device:
        raise ValueError(f"max_softmax: {op} needs {what} on {owner} device ({device}), got {got}")


# The extended options' layout (op/cross_entropy_math.mojo, `extended_layout`):
# four values, then with class weights a weight a class and WEIGHTS_MARK
# zeros, then one zero a hint. The hints ride in the length, which the GPU
# launch reads without a sync: each tells it a term is off, so z-loss and a
# target's weight alone take the plain on-chip pass.
WEIGHTS_MARK = 4
HINT_NO_SOFTCAP = 1
HINT_NO_WEIGHTED_SMOOTHING = 2


def cross_entropy_hints(eps: float, softcap: float, weighted: bool) -> int:
    """The hints of extended options: the terms they leave out."""
    hints = HINT_NO_SOFTCAP if softcap == 0.0 else 0
    if not (weighted and eps != 0.0):
        hints |= HINT_NO_WEIGHTED_SMOOTHING
    return hints


def extended_tail(eps: float, softcap: float, weighted: bool) -> int:
    """The zeros that follow extended options' values (and their weights):
    the weights' mark where there are weights, then the hints. The one
    count every options builder (numpy, graph, torch) appends."""
    return (WEIGHTS_MARK if weighted else 0) + cross_entropy_hints(eps, softcap, weighted)


def cross_entropy_options(
    ignore_index: int,
    eps: float,
    z_loss: float = 0.0,
    softcap: float = 0.0,
    weight: np.ndarray | None = None,
) -> np.ndarray:
    """The float64 options the kernels read: (ignore_index, eps) for the
    plain loss; (ignore_index, eps, z_loss, softcap), then the class weights
    and their mark, then the hints (`cross_entropy_hints`), when z-loss,
    softcap or class weights are on (the kernels pick their extended
    family by this length)."""
    head = [ignore_index, eps]
    if z_loss == 0.0 and softcap == 0.0 and weight is None:
        return np.array(head, dtype=np.float64)
    extended = np.array(head + [z_loss, softcap], dtype=np.float64)
    weights = np.zeros(0) if weight is None else np.asarray(weight, np.float64).reshape(-1)
    tail = np.zeros(extended_tail(eps, softcap, weight is not None))
    return np.concatenate([extended, weights, tail])


SOFT_OPTIONS = 2
"""Soft-target options before the class weights: (eps, z_loss)
(op/soft_target_math.mojo)."""


def soft_cross_entropy_options(
    eps: float, z_loss: float = 0.0, weight: np.ndarray | None = None
) -> np.ndarray:
    """The float64 options the soft-target kernels read: (eps, z_loss),
    then the class weights where given (their length tells the kernels)."""
    head = np.array([eps, z_loss], dtype=np.float64)
    if weight is None:
        return head
    return np.concatenate([head, np.asarray(weight, np.float64).reshape(-1)])


def check_soft_targets(shape: Sequence[Any], target_shape: Sequence[Any]) -> None:
    """Raise ValueError unless class probabilities of `target_shape` fit
    logits of `shape` (the same shape, as torch's probability targets)."""
    if list(shape) != list(target_shape):
        raise ValueError(
            f"max_softmax: cross_entropy with class-probability targets needs the target "
            f"shaped as the input {tuple(shape)}, got {tuple(target_shape)}"
        )


def check_linear_cross_entropy_options(
    z_loss: float, softcap: float | None, chunk_rows: int | None
) -> tuple[float, float]:
    """The options every `linear_cross_entropy` front door (numpy, graph,
    torch) checks the same way: return (z_loss, softcap) as the kernels
    take them (`check_cross_entropy_extras`: softcap None -> 0, off), or
    raise; chunk_rows must be a positive int or None."""
    if chunk_rows is not None and (
        isinstance(chunk_rows, bool) or not isinstance(chunk_rows, int) or chunk_rows < 1
    ):
        raise ValueError(
            f"max_softmax: chunk_rows must be a positive int or None, got {chunk_rows!r}"
        )
    return check_cross_entropy_extras(z_loss, softcap)


def check_linear_class_weight(shape: Sequence, classes: Any) -> None:
    """Raise ValueError unless `linear_cross_entropy`'s `class_weight` has
    shape (V,), one value per class of the (V, H) weight (`classes` an int,
    or a symbolic graph dim, which is not compared)."""
    if len(shape) != 1 or (isinstance(classes, int) and int(shape[0]) != classes):
        raise ValueError(
            f"max_softmax: linear_cross_entropy class_weight must have shape ({classes},), "
            f"one value per class (the rows of weight), got {tuple(shape)}"
        )


def check_linear_cross_entropy_dtypes(
    input_dtype: object, weight_dtype: object, bias_dtype: object | None
) -> None:
    """Raise TypeError unless `linear_cross_entropy`'s weight (and bias,
    where given: `bias_dtype` not None) are in the input's dtype; any
    front door's dtype objects (numpy, MAX, torch)."""
    for name, dtype in (("weight", weight_dtype), ("bias", bias_dtype)):
        if dtype is not None and dtype != input_dtype:
            raise TypeError(
                f"max_softmax: linear_cross_entropy needs {name} in the input's dtype "
                f"({input_dtype}), got {dtype}"
            )


def check_linear_cross_entropy_shapes(
    input_shape: Sequence,
    weight_shape: Sequence,
    bias_shape: Sequence | None,
    target_shape: Sequence,
) -> None:
    """Raise ValueError unless `linear_cross_entropy` has input (..., H),
    weight (V, H), bias (V,) or None and target `input.shape[:-1]`. The
    shapes are all tuples or all lists (the messages show them as given)."""
    if len(input_shape) < 1 or len(weight_shape) != 2 or weight_shape[1] != input_shape[-1]:
        raise ValueError(
            f"max_softmax: linear_cross_entropy needs input (..., H) and weight (V, H), got "
            f"{input_shape} and {weight_shape}"
        )
    if bias_shape is not None and bias_shape != weight_shape[:1]:
        raise ValueError(
            f"max_softmax: linear_cross_entropy needs bias of shape {weight_shape[:1]}, "
            f"got {bias_shape}"
        )
    if target_shape != input_shape[:-1]:
        raise ValueError(
            f"max_softmax: linear_cross_entropy target of shape {target_shape} does not match "
            f"input of shape {input_shape} (expected {input_shape[:-1]})"
        )


EMPTY_LOSS: dict[str, float] = {"mean": float("nan"), "sum": 0.0, "none": 0.0}
"""Cross-entropy of an empty batch by reduction, as torch: the mean of
nothing is NaN."""


def check_integer_targets(is_integer: bool, dtype: object) -> None:
    """Raise TypeError unless cross-entropy's targets are integer class indices."""
    if not is_integer:
        raise TypeError(
            f"max_softmax: cross_entropy needs integer class-index targets, got {dtype}"
        )


def check_cross_entropy_shapes(logits_shape: list, targets_shape: list) -> None:
    """Raise unless logits are (..., classes) and targets (...): classes on
    the last axis, one target per row."""
    if len(logits_shape) == 0:
        raise SoftmaxInputError(
            "max_softmax: cross_entropy needs logits of rank >= 1 (..., classes), got a scalar"
        )
    if list(targets_shape) != list(logits_shape[:-1]):
        raise ValueError(
            "max_softmax: cross_entropy needs targets shaped like the logits without "
            f"their last (class) axis: logits {list(logits_shape)} want targets "
            f"{list(logits_shape[:-1])}, got {list(targets_shape)}"
        )


class TargetIndexError(IndexError, ValueError):
    """Raised for a cross-entropy target outside [0, classes): an IndexError
    as torch raises, and a ValueError as the other input checks."""


class TensorMismatchError(ValueError, RuntimeError):
    """Raised for tensors of one call that differ in shape, dtype or device
    (the backward's y and dy): a ValueError as the other input checks, and a
    RuntimeError as torch raises for them."""


def check_targets_in_range(targets: np.ndarray, classes: int, ignore_index: int) -> None:
    """Raise TargetIndexError naming the first target outside [0, classes)
    that is not ignore_index (host arrays only: checked before anything runs)."""
    flat = targets.reshape(-1)
    bad = (flat != ignore_index) & ((flat < 0) | (flat >= classes))
    if bad.any():
        i = int(np.argmax(bad))
        where = tuple(int(k) for k in np.unravel_index(i, targets.shape)) if targets.ndim else ()
        raise TargetIndexError(
            f"max_softmax: cross_entropy target {int(flat[i])} at index {where} "
            f"is out of range for {classes} classes (and is not ignore_index {ignore_index})"
        )


# Scaled, masked and causal softmax: the checks every front door shares, and
# how a mask is reduced to the (mask_rows, n) rows the kernels read.


def is_masked_call(scale: Any, mask: Any, causal: Any) -> bool:
    """Whether a softmax call asks for the masked op (any of scale, mask,
    causal given); plain calls keep the plain op, unchanged."""
    return scale is not None or mask is not None or bool(causal)


def check_scale(op: str, scale: Any) -> float:
    """`scale` as a float (None is 1.0), or raise: a finite real number
    (0 and negative values are fine; inf would make every row NaN)."""
    if scale is None:
        return 1.0
    if isinstance(scale, bool) or not isinstance(scale, (int, float, np.integer, np.floating)):
        raise TypeError(f"max_softmax: {op} scale must be a real number, got {scale!r}")
    value = float(scale)
    if not math.isfinite(value):  # math, not numpy: torch.compile traces this
        raise ValueError(f"max_softmax: {op} scale must be finite, got {scale!r}")
    return value


def check_masked_options(
    op: str, scale: Any, causal: Any, rank: int, axis: int, variant: str = "auto"
) -> tuple[float, bool]:
    """Return (scale, causal) as the kernels take them, or raise.

    `scale` must be a finite real number (None is 1); `causal` a bool and
    only along the last axis of a tensor of rank >= 2 (its rows are the
    last two axes); `variant` must stay "auto" (the plain op's families).
    """
    value = check_scale(op, scale)
    if not isinstance(causal, (bool, np.bool_)):
        raise TypeError(f"max_softmax: {op} causal must be a bool, got {causal!r}")
    if causal and rank < 2:
        raise SoftmaxInputError(
            f"max_softmax: {op} with causal=True needs rank >= 2 (rows over the last two "
            f"axes), got rank {rank}"
        )
    if causal and axis != rank - 1:
        raise SoftmaxInputError(
            f"max_softmax: {op} with causal=True works along the last axis only, got axis "
            f"{axis} of rank {rank}"
        )
    if variant != "auto":
        raise ValueError(
            f"max_softmax: variant= picks a plain softmax kernel family; leave it 'auto' "
            f"with scale, mask or causal (got {variant!r})"
        )
    return value, bool(causal)


def mask_suffix(op: str, x_shape: list, mask_shape: list, last_axis: bool) -> int:
    """How the kernels read a mask broadcastable to `x_shape`: k >= 1 when
    the mask without its leading size-1 axes is x_shape[-k:] (it is then
    (prod(x_shape[-k:-1]), n), and row r of x uses mask row r % that), 0
    when it must be broadcast to x's full shape (one mask row per row of
    x). Works on ints and on graph `Dim`s; raises ValueError naming both
    shapes if the mask does not broadcast to x."""
    xs, ms = list(x_shape), list(mask_shape)
    fits = len(ms) <= len(xs) and all(m == 1 or m == d for m, d in zip(reversed(ms), reversed(xs)))
    if not fits:
        raise ValueError(
            f"max_softmax: {op} needs a mask broadcastable to the input's shape "
            f"{[_dim_str(d) for d in xs]}, got {[_dim_str(d) for d in ms]}"
        )
    while ms and ms[0] == 1 and len(ms) > 1:
        ms = ms[1:]
    if not last_axis or not ms or ms[-1] != xs[-1]:
        return 0
    k = len(ms)
    return k if all(m == d for m, d in zip(ms, xs[-k:])) else 0


def _dim_str(d: Any) -> Any:
    try:
        return int(d)
    except (TypeError, ValueError):
        return str(d)


def masked_view(x_shape: list) -> list:
    """The (outer, L, n) view the masked op takes: L = the second-to-last
    dim (the causal rows), 1 for rank 1."""
    if len(x_shape) == 1:
        return [1, 1, x_shape[0]]
    outer = 1
    for d in x_shape[:-2]:
        outer = outer * d
    return [outer, x_shape[-2], x_shape[-1]]


MASK_FLAG = 1
"""The masked ops' flags bit: the mask is read (else it is a placeholder)."""

CAUSAL_FLAG = 2
"""The masked ops' flags bit: row i of each (L, n) matrix keeps columns j <= i."""


def masked_flags(has_mask: bool, causal: bool) -> int:
    """The flags of a masked call: MASK_FLAG | CAUSAL_FLAG as given."""
    return (MASK_FLAG if has_mask else 0) | (CAUSAL_FLAG if causal else 0)


def masked_options(value: float, flags: int) -> list[float]:
    """The masked ops' float64 options: the scale `value`, then `flags`
    zeros. Their length, 1 + flags, carries the flags: the op reads it from
    the shape on the host, the scale where it runs (op/masked_flags.mojo),
    so one compiled model serves every combination."""
    if not 0 <= flags <= MASK_FLAG | CAUSAL_FLAG:
        raise ValueError(f"max_softmax: masked flags must be 0 to 3, got {flags!r}")
    return [float(value)] + [0.0] * flags


def check_mask_dtype(op: str, is_bool: bool, is_float: bool, dtype: object) -> None:
    """Raise TypeError unless a mask is boolean (True keeps) or floating
    (added after scaling; -inf drops)."""
    if not (is_bool or is_float):
        raise TypeError(
            f"max_softmax: {op} needs a boolean mask (True keeps) or a floating-point "
            f"additive mask (-inf drops), got {dtype}"
        )
