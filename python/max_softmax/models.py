"""The one place that builds, compiles and caches MAX graphs holding our ops.

Every front door comes here: the array functions (`row_op_model`), MAX
eager (`declaration`), the torch bridge (`into_model`) and the
benchmark (`build_graph` + `compiled`). A row-op model runs one op on a
rank-3 (outer, n, inner) tensor with symbolic dims, so one model per
(op, dtype, device, variant) serves every shape, rank and axis. A device is
a device name ("cpu", "gpu" = "gpu:0", "gpu:N": `devices`); each device has
its own session and its own models. Each key
compiles once, even when many threads ask at the same time, and its first
compile is announced on stderr (see `kernels.announce`).
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from max.dtype import DType
from max.engine import InferenceSession, Model
from max.graph import (
    BufferType,
    BufferValue,
    Graph,
    TensorType,
    TensorValue,
    Type,
    ops,
)

from . import ops as graph_ops
from . import waits
from .devices import canonical_name, device, device_kind
from .devices import device_ref as device_ref  # re-exported: graph builders take it here
from .kernels import cache_dir, kernel_library, sources_fingerprint
from .registry import op_spec

ROW_DIMS = ["outer", "n", "inner"]
"""The symbolic (outer, n, inner) view every op works on (see ops.py)."""


def session(kind: str) -> InferenceSession:
    """The one InferenceSession per device that loads every model of it;
    `kind` is a device name ("cpu", "gpu" = "gpu:0", "gpu:N")."""
    return _session(canonical_name(kind))


@cache
def _session(name: str) -> InferenceSession:
    return InferenceSession(devices=[device(name)])


def _tag(kind: str) -> str:
    """Device name `kind` as it goes into a graph's name ("gpu:1" as "gpu1")."""
    return kind.replace(":", "")


def row_type(dtype: DType, kind: str) -> TensorType:
    """The (outer, n, inner) tensor type with symbolic dims on device `kind`."""
    return TensorType(dtype, ROW_DIMS, device=device_ref(kind))


def build_graph(
    name: str, input_types: Sequence[Type], body: Callable[..., Sequence[TensorValue]]
) -> Graph:
    """A graph with our kernel library whose outputs are `body(*inputs)`:
    tensor values for `TensorType` inputs, buffer values for `BufferType`s."""
    with (
        waits.our_graph(),  # compiled by `compiled`, which announces it
        Graph(name, input_types=input_types, custom_extensions=[kernel_library()]) as graph,
    ):
        values = [
            v.buffer if isinstance(t, BufferType) else v.tensor
            for v, t in zip(graph.inputs, input_types)
        ]
        graph.output(*body(*values))
    return graph


_models: dict[Hashable, Model] = {}
_locks: dict[Hashable, threading.Lock] = {}
_locks_guard = threading.Lock()
compile_count: dict[Hashable, int] = {}
"""How many times each key was compiled (tests check it stays 1)."""


def compiled(
    key: Hashable, kind: str, build: Callable[[], Graph], what: str, cost: str = "model"
) -> Model:
    """The model cached under `key`, made on first use by loading `build()`
    into the session of device `kind` (a device name); `what` names it for the
    announcement of a first compile, `cost` the measured build it costs like
    (`waits.BUILDS`: "model", or a graph that takes longer to compile, such
    as "train_step")."""
    model = _models.get(key)
    if model is not None:
        return model
    with _locks_guard:
        lock = _locks.setdefault(key, threading.Lock())
    with lock:
        model = _models.get(key)
        if model is None:
            model = _load_announced(key, kind, build, what, cost)
            compile_count[key] = compile_count.get(key, 0) + 1
            _models[key] = model
    return model


def compile_marker(key: Hashable) -> Path:
    """The file that says this machine compiled the model of `key` for the
    current kernels (MAX's cache then serves it in ~2 s, unannounced)."""
    digest = hashlib.sha256(repr(key).encode()).hexdigest()[:16]
    return cache_dir() / "compiled" / f"{sources_fingerprint()}-{digest}"


def _load_announced(
    key: Hashable, kind: str, build: Callable[[], Graph], what: str, cost: str
) -> Model:
    """Build and load, saying so first unless this machine compiled the same
    key for the same kernels before (then MAX's cache serves it in ~1 s)."""
    marker = compile_marker(key)
    if marker.is_file():
        return session(kind).load(build())
    build_kind = f"{cost}:{device_kind(kind)}"
    if build_kind not in waits.BUILDS:  # not measured on this kind of device
        build_kind = f"model:{device_kind(kind)}"
    with waits.announced(build_kind, f"compiling {what} for {kind}", f"compiled {what} for {kind}"):
        model = session(kind).load(build())
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.touch()
    return model


@dataclass(frozen=True)
class ModelKey:
    """What a compiled row-op model is specialised on."""

    op: str
    dtype: DType
    device: str
    variant: str = "auto"

    def __post_init__(self) -> None:
        # "gpu:0" and "gpu" are one device: one model.
        object.__setattr__(self, "device", canonical_name(self.device))


def row_op_model(key: ModelKey) -> Model:
    """The compiled model running `key.op` on (outer, n, inner) tensors
    along n, compiling it on first use."""
    spec = op_spec(key.op)
    kwargs: dict[str, Any] = {"axis": 1}
    if spec.has_variants:
        kwargs["variant"] = key.variant

    def body(*inputs: TensorValue) -> list[TensorValue]:
        return [spec.graph(*inputs, **kwargs)]

    name = f"max_softmax_{key.op}_{key.dtype.name}_{_tag(key.device)}_{key.variant}"
    what = key.op + (f" (variant {key.variant})" if key.variant != "auto" else "")
    return compiled(
        key,
        key.device,
        lambda: build_graph(name, [row_type(key.dtype, key.device)] * spec.arity, body),
        f"{what} {key.dtype.name}",
    )


def into_model(op: str, dtype: DType, kind: str) -> Model:
    """The compiled model writing `op`'s result into a given buffer, its
    first input, by the op's destination-passing twin (op/registered_ops);
    then `op`'s inputs, all (outer, n, inner). The torch bridge runs these:
    returning a value instead would make MAX copy it into torch's output,
    twice the traffic of a memory-bound op."""
    key = ("into", op, dtype, kind)
    model = _models.get(key)  # the bridge's hot path: nothing built before this
    if model is not None:
        return model
    spec = op_spec(op)

    def body(out: BufferValue, *values: TensorValue) -> list[TensorValue]:
        ops.inplace_custom(name=spec.into, device=out.device, values=[out, *values], out_types=[])
        return []

    def build() -> Graph:
        out_type = BufferType(dtype, ROW_DIMS, device=device_ref(kind))
        return build_graph(
            f"max_softmax_{spec.into}_{dtype.name}_{_tag(kind)}",
            [out_type] + [row_type(dtype, kind)] * spec.arity,
            body,
        )

    return compiled(key, kind, build, f"{op} (into a buffer) {dtype.name}")


def _cross_entropy_types(dtype: DType, kind: str) -> list[TensorType]:
    """The inputs of a cross-entropy model: (rows, n) logits, (rows,) int64
    targets, float64 options ((ignore_index, label_smoothing), or the
    extended (ignore_index, label_smoothing, z_loss, softcap[, weights]):
    `validation.cross_entropy_options`), all symbolic, so one model serves
    every shape, option and value (the kernels pick by the options' length)."""
    ref = device_ref(kind)
    return [
        TensorType(dtype, ["rows", "n"], device=ref),
        TensorType(DType.int64, ["rows"], device=ref),
        TensorType(DType.float64, ["n_options"], device=ref),
    ]


def cross_entropy_model(with_grad: bool, dtype: DType, kind: str, reduction: str) -> Model:
    """The compiled model running cross-entropy (with its gradient) on
    (logits, targets, options) as `_cross_entropy_types` lists them; its
    outputs are the loss ((1,) or (rows,) for "none") and, `with_grad`,
    dlogits. One per (op, dtype, device, reduction)."""
    op = "cross_entropy_with_grad" if with_grad else "cross_entropy"
    key = (op, dtype, kind, reduction)

    def body(logits: TensorValue, targets: TensorValue, options: TensorValue) -> list:
        return graph_ops.cross_entropy_rows(
            logits, targets, options, reduction=reduction, with_grad=with_grad
        )

    return compiled(
        key,
        kind,
        lambda: build_graph(
            f"max_softmax_{op}_{dtype.name}_{_tag(kind)}_{reduction}",
            _cross_entropy_types(dtype, kind),
            body,
        ),
        f"{op} ({reduction}) {dtype.name}",
    )


def soft_cross_entropy_model(with_grad: bool, dtype: DType, kind: str, reduction: str) -> Model:
    """The compiled model running soft-target cross-entropy (with its
    gradient) on (rows, n) logits and probabilities of `dtype` and the
    float64 options (any length), all symbolic: one per (op, dtype, device,
    reduction). Its outputs: the loss ((1,), or (rows,) for "none") and,
    `with_grad`, dlogits."""
    op = "soft_cross_entropy_with_grad" if with_grad else "soft_cross_entropy"
    ref = device_ref(kind)
    rows = TensorType(dtype, ["rows", "n"], device=ref)
    types = [rows, rows, TensorType(DType.float64, ["n_options"], device=ref)]

    def body(logits: TensorValue, probs: TensorValue, options: TensorValue) -> list:
        return graph_ops.soft_cross_entropy_rows(
            logits, probs, options, reduction=reduction, with_grad=with_grad
        )

    return compiled(
        (op, dtype, kind, reduction),
        kind,
        lambda: build_graph(f"max_softmax_{op}_{dtype.name}_{_tag(kind)}_{reduction}", types, body),
        f"{op} ({reduction}) {dtype.name}",
    )


def cross_entropy_into_model(with_grad: bool, dtype: DType, kind: str, reduction: str) -> Model:
    """The compiled model writing cross-entropy into given buffers, by the
    op's destination-passing twin: inputs loss ((1,), or (rows,) for
    "none"), dlogits (rows, n) where `with_grad`, then logits, targets and
    options as in `cross_entropy_model`. The torch bridge runs these."""
    op = "cross_entropy_with_grad" if with_grad else "cross_entropy"

    def inputs() -> list[Any]:
        ref = device_ref(kind)
        loss_dims: list[str | int] = ["rows"] if reduction == "none" else [1]
        outs = [BufferType(dtype, loss_dims, device=ref)]
        if with_grad:
            outs.append(BufferType(dtype, ["rows", "n"], device=ref))
        return outs + _cross_entropy_types(dtype, kind)

    return _inplace_model(
        ("into", op, dtype, kind, reduction),
        op,
        kind,
        {"reduction": reduction},
        inputs,
        f"{dtype.name}_{_tag(kind)}_{reduction}",
        f"{op} ({reduction}, into buffers) {dtype.name}",
    )


BRIDGE_OPS = ("scale_rows",)
"""Mojo ops only the torch bridge runs (no graph op, no registry entry)."""


def scale_rows_into_model(dtype: DType, kind: str, per_row: bool) -> Model:
    """The compiled model scaling (rows, n) `data` in place by `factor`, a
    buffer of (rows,) factors where `per_row`, else of one (1,); rows whose
    factor is 1 are left unread (op/scale_ops.mojo). Inputs: data, factor.
    The torch bridge's cross-entropy backward runs it on the graph path."""
    key = ("into", "scale_rows", dtype, kind, per_row)
    model = _models.get(key)
    if model is not None:
        return model
    ref = device_ref(kind)
    types: list[Any] = [
        BufferType(dtype, ["rows", "n"], device=ref),
        TensorType(dtype, ["rows"] if per_row else [1], device=ref),
    ]

    def body(data: BufferValue, factor: TensorValue) -> list[TensorValue]:
        ops.inplace_custom(
            name="scale_rows", device=ref, values=[data, factor], out_types=[], parameters={}
        )
        return []

    def build() -> Graph:
        tag = "rows" if per_row else "one"
        return build_graph(f"max_softmax_scale_rows_{dtype.name}_{_tag(kind)}_{tag}", types, body)

    return compiled(
        key, kind, build, f"scale_rows ({'per row' if per_row else 'one'}) {dtype.name}"
    )


def _inplace_model(
    key: Hashable,
    op: str,
    kind: str,
    parameters: dict[str, Any],
    inputs: Callable[[], list[Any]],
    suffix: str,
    what: str,
) -> Model:
    """The compiled model (cached under `key`) that runs `op`'s
    destination-passing twin with compile-time `parameters` on `inputs()`,
    the buffers it writes first. The bridge's hot path: a cached model
    returns before anything is built."""
    model = _models.get(key)
    if model is not None:
        return model
    spec = op_spec(op)

    def body(*values: Any) -> list[TensorValue]:
        ops.inplace_custom(
            name=spec.into,
            device=device_ref(kind),
            values=list(values),
            out_types=[],
            parameters=parameters,
        )
        return []

    def build() -> Graph:
        return build_graph(f"max_softmax_{spec.into}_{suffix}", inputs(), body)

    return compiled(key, kind, build, what)


@cache
def declaration(op: str) -> Any:
    """The MAX eager `CustomOp` for `op` on an (outer, n, inner) tensor of
    any float dtype; works on eager `Tensor`s and on graph `TensorValue`s."""
    from max.experimental import custom

    spec = op_spec(op)
    view = custom.TemplateType(custom.DTypeVar("T"), custom.Symbols(*ROW_DIMS))
    return custom.declare(
        op,
        inputs={name: view for name in spec.inputs},
        outputs=[view],
        custom_extensions=[kernel_library()],
    )


@cache
def loss_declaration(op: str, reduction: str) -> Any:
    """The MAX eager `CustomOp` for cross-entropy op `op` ("cross_entropy" or
    "cross_entropy_with_grad") with `reduction`, on (rows, classes) logits,
    (rows,) int64 targets and the float64 options (any length), as
    `ops.cross_entropy_rows` stages it: loss (rows,) for "none", else (1,);
    and dlogits like the logits for the gradient op."""
    from max.experimental import custom

    spec = op_spec(op)
    dtype = custom.DTypeVar("T")
    logits = custom.TemplateType(dtype, custom.Symbols("rows", "classes"))
    loss = custom.TemplateType(dtype, custom.Symbols("rows") if reduction == "none" else [1])
    return custom.declare(
        op,
        inputs={
            "logits": logits,
            "targets": custom.TemplateType(DType.int64, custom.Symbols("rows")),
            "options": custom.TemplateType(DType.float64, custom.Symbols("n_options")),
        },
        outputs=[loss, logits] if spec.name == "cross_entropy_with_grad" else [loss],
        parameters={"reduction": reduction},
        custom_extensions=[kernel_library()],
    )


MASKED_DIMS = ["outer", "L", "n"]
"""The symbolic (outer, L, n) view of x the masked ops take (see ops.py)."""


@cache
def masked_declaration(op: str) -> Any:
    """The MAX eager `CustomOp` for masked op `op` ("softmax_masked" or
    "log_softmax_masked") on x (outer, L, n), the additive mask (mask_rows,
    mask_n) in x's dtype and the float64 options (any length: the flags are
    in it, `validation.masked_options`): what lets MAX's eager interpreter
    run it (an undeclared custom op falls back to a compiled model per
    graph, with a warning). One per op serves every mask and causal
    combination."""
    from max.experimental import custom

    op_spec(op)  # a clear error for an unknown op
    dtype = custom.DTypeVar("T")
    x = custom.TemplateType(dtype, custom.Symbols(*MASKED_DIMS))
    return custom.declare(
        op,
        inputs={
            "x": x,
            "mask": custom.TemplateType(dtype, custom.Symbols("mask_rows", "mask_n")),
            "options": custom.TemplateType(DType.float64, custom.Symbols("n_options")),
        },
        outputs=[x],
        custom_extensions=[kernel_library()],
    )


def _masked_types(dtype: DType, kind: str) -> list[TensorType]:
    """The inputs of a masked model: x (outer, L, n), the additive mask
    (mask_rows, mask_n) in x's dtype ((1, 1) placeholder without a mask),
    the float64 options (`validation.masked_options`: the scale, its length
    the flags), all symbolic, so one model serves every shape, scale and
    mask / causal combination."""
    ref = device_ref(kind)
    return [
        TensorType(dtype, MASKED_DIMS, device=ref),
        TensorType(dtype, ["mask_rows", "mask_n"], device=ref),
        TensorType(DType.float64, ["n_options"], device=ref),
    ]


def masked_model(op: str, dtype: DType, kind: str) -> Model:
    """The compiled model running `op` ("softmax_masked" or
    "log_softmax_masked") on (x, mask, options) as `_masked_types` lists
    them. One per (op, dtype, device): the options' length picks the mask /
    causal combination at run time, each its own specialised kernel."""
    key = (op, dtype, kind)
    spec = op_spec(op)

    def body(x: TensorValue, mask: TensorValue, options: TensorValue) -> list[TensorValue]:
        return [spec.graph(x, mask, options)]

    return compiled(
        key,
        kind,
        lambda: build_graph(
            f"max_softmax_{op}_{dtype.name}_{_tag(kind)}", _masked_types(dtype, kind), body
        ),
        f"{op} {dtype.name}",
    )


def masked_into_model(op: str, dtype: DType, kind: str) -> Model:
    """The compiled model writing `op` into a given (outer, L, n) buffer, its
    first input, by the op's destination-passing twin; then x, mask and
    options as in `masked_model` (one model serves every combination). The
    torch bridge runs these."""
    return _inplace_model(
        ("into", op, dtype, kind),
        op,
        kind,
        {},
        lambda: [
            BufferType(dtype, MASKED_DIMS, device=device_ref(kind)),
            *_masked_types(dtype, kind),
        ],
        f"{dtype.name}_{_tag(kind)}",
        f"{op} (into a buffer) {dtype.name}",
    )
