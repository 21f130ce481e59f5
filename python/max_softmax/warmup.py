"""`softmax warmup`: build ahead of time what a first call would wait for.

A fresh install (a container image, a CI runner) pays each build once, on
the first call that needs it: the precompiled kernel library, the launch
extension, and a MAX model per (op, dtype, device) that runs through a
graph. `warmup` builds them all now, into the caches every later process
reuses (max-softmax's, `kernels.cache_dir()`; MAX's, ~/.cache/modular), so
that an image or a CI cache can carry them.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass

from . import kernels, launch, models, registry
from .devices import DEVICE_CHOICES, NoGPUError, device_kind, resolve_device
from .dtypes import DTYPE_NAMES, max_dtype

ROW_OPS: tuple[str, ...] = tuple(n for n, s in registry.OPS.items() if s.kind == "row")
"""The ops whose models `warmup` compiles (`models.row_op_model`)."""

COMMON_OPS: tuple[str, ...] = ("softmax", "log_softmax")
"""The ops whose models `warmup` compiles by default."""

COMMON_DTYPES: dict[str, tuple[str, ...]] = {
    # On the CPU the launch extension serves numpy and torch without a
    # model; the models serve MAX_SOFTMAX_LAUNCH=graph.
    "cpu": ("float32",),
    # On a GPU numpy calls run the models (torch launches through the
    # extension), bf16 as often as fp32.
    "gpu": ("float32", "bfloat16"),
}
"""The dtypes of the models `warmup` compiles by default, per device kind."""


def common_models(kind: str) -> list[tuple[str, str]]:
    """The (op, dtype) models `warmup` compiles by default on a device of
    `kind` ("cpu" or "gpu")."""
    return [(op, dt) for op in COMMON_OPS for dt in COMMON_DTYPES[kind]]


@dataclass(frozen=True)
class Step:
    """One thing `warmup` made ready: what, where it lives (a file, or the
    model's device), whether it was built now (else found cached), and the
    seconds it took."""

    what: str
    where: str
    built: bool
    seconds: float


def warmup(
    device: str = "auto",
    models_to_compile: Sequence[tuple[str, str]] | None = None,
    train: bool = False,
) -> list[Step]:
    """Build the kernel library, the launch extension (unless
    MAX_SOFTMAX_LAUNCH=graph) and the models `models_to_compile` ((op,
    dtype) pairs; default `common_models` of the device's kind) on `device`
    ("auto", "cpu", "gpu", "gpu:N"), and with `train` the step graph of
    `softmax train` (~140 s cold on 2 cores), each unless already cached;
    return what was done, in order. Each build is announced on stderr as a first call
    would announce it. Raises LaunchError where the extension cannot be
    built, NoGPUError for a GPU this machine lacks."""
    name = resolve_device(device)
    pairs = common_models(device_kind(name)) if models_to_compile is None else models_to_compile
    for op, dtype in pairs:  # bad names fail before anything is built
        if op not in ROW_OPS:
            raise ValueError(f"max_softmax: warmup compiles the row ops {ROW_OPS}, not {op!r}")
        max_dtype(DTYPE_NAMES[dtype])
    steps = []

    library = kernels.library_path()
    cached = library.is_file()
    start = time.perf_counter()
    path = kernels.kernel_library()  # the sources where precompiling is off or fails
    built = path == library and not cached
    steps.append(Step("kernel library", str(path), built, time.perf_counter() - start))

    if launch.ENABLED:
        ext = launch.extension_path()
        cached = ext.is_file()
        start = time.perf_counter()
        launch.extension()
        steps.append(Step("launch extension", str(ext), not cached, time.perf_counter() - start))

    for op, dtype in pairs:
        key = models.ModelKey(op, max_dtype(DTYPE_NAMES[dtype]), name)
        cached = models.compile_marker(key).is_file()
        start = time.perf_counter()
        models.row_op_model(key)
        steps.append(Step(f"model {op} {dtype}", name, not cached, time.perf_counter() - start))

    if train:
        from . import train as demo

        problem = demo.make_problem()
        cached = demo.step_graph_cached(problem, name)
        start = time.perf_counter()
        demo.Trainer(problem, name)
        steps.append(
            Step("softmax train step graph", name, not cached, time.perf_counter() - start)
        )
    return steps


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of `softmax warmup`."""
    p = argparse.ArgumentParser(
        prog="softmax warmup",
        description="Build the kernel library, the launch extension and the common "
        "models ahead of time, into the caches every later process reuses: run it "
        "once in a container image or a CI cache step so that no first call waits.",
    )
    p.add_argument("--device", choices=list(DEVICE_CHOICES), default="auto")
    p.add_argument(
        "--op",
        nargs="*",
        choices=list(ROW_OPS),
        help="the ops whose models to compile (default: softmax and log_softmax; --op alone: none)",
    )
    p.add_argument(
        "--dtype",
        nargs="+",
        choices=list(DTYPE_NAMES),
        help="their dtypes (default: float32 on the CPU, float32 and bfloat16 on a GPU)",
    )
    p.add_argument(
        "--train",
        action="store_true",
        help="also compile the step graph of 'softmax train' (~140 s cold on 2 cores), "
        "so that it trains in the graph from its first step",
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """`softmax warmup`: 0 when everything is built, 2 when something could
    not be (the reason on stderr)."""
    args = build_parser().parse_args(argv)
    try:
        name = resolve_device(args.device)
        ops = COMMON_OPS if args.op is None else args.op
        dtypes = args.dtype or COMMON_DTYPES[device_kind(name)]
        steps = warmup(name, [(op, dt) for op in ops for dt in dtypes], train=args.train)
    except (NoGPUError, launch.LaunchError, ValueError) as err:
        print(f"softmax warmup: error: {err}", file=sys.stderr)
        return 2
    for step in steps:
        done = f"built in {step.seconds:.1f} s" if step.built else "cached"
        print(f"{step.what:<28} {done:<18} {step.where}")
    return 0
