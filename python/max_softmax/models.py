"""The one place that builds, compiles and caches the MAX models.

A model runs one op on a rank-3 (outer, n, inner) tensor with symbolic
dims, so a model compiled once per (op, dtype, device, variant) serves every
shape, rank and axis. Compilation happens once per key even when many
threads ask at the same time.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from functools import cache

from max.dtype import DType
from max.engine import InferenceSession, Model
from max.graph import DeviceRef, Graph, TensorType

from . import ops
from ._paths import KERNELS
from .devices import device
from .validation import OP_ARITY


@cache
def session(kind: str) -> InferenceSession:
    """The one InferenceSession per device kind that loads every model."""
    return InferenceSession(devices=[device(kind)])


@dataclass(frozen=True)
class ModelKey:
    """What a compiled model is specialised on."""

    op: str
    dtype: DType
    device: str
    variant: str = "auto"


_models: dict[ModelKey, Model] = {}
_locks: dict[ModelKey, threading.Lock] = {}
_locks_guard = threading.Lock()
compile_count: dict[ModelKey, int] = {}
"""How many times each key was compiled (tests check it stays 1)."""


def get_model(key: ModelKey) -> Model:
    """The compiled model for `key`, compiling it on first use."""
    model = _models.get(key)
    if model is not None:
        return model
    with _locks_guard:
        lock = _locks.setdefault(key, threading.Lock())
    with lock:
        model = _models.get(key)
        if model is None:
            model = _compile(key)
            compile_count[key] = compile_count.get(key, 0) + 1
            _models[key] = model
    return model


def _compile(key: ModelKey) -> Model:
    dev = DeviceRef.GPU() if key.device == "gpu" else DeviceRef.CPU()
    input_type = TensorType(key.dtype, ["outer", "n", "inner"], device=dev)
    op = getattr(ops, key.op)
    arity = OP_ARITY[key.op]
    with Graph(
        f"max_softmax_{key.op}_{key.dtype.name}_{key.device}_{key.variant}",
        input_types=[input_type] * arity,
        custom_extensions=[KERNELS],
    ) as graph:
        inputs = [v.tensor for v in graph.inputs]
        if arity == 2:
            graph.output(op(*inputs, axis=1))
        else:
            graph.output(op(inputs[0], axis=1, variant=key.variant))
    return session(key.device).load(graph)
