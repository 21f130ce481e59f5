"""The graph-free launch path: our kernels on raw memory, without a MAX graph.

`Model.execute` of a compiled MAX graph costs 35-60 µs of host work a call
(more on a busy CPU), more than the op itself below a few MB. This module
builds and loads a small Mojo extension module (`launch_ext/launch_ext.mojo`)
that calls the same row functions MAX's ops call (`op/dispatch.mojo`) on raw
addresses, on MAX's own DeviceContext: ~1 µs of host work a call on the
CPU. The torch bridge (`torch/_launch.py`) launches torch tensors through it,
CPU and CUDA; the array functions (`arrays.py`) launch numpy arrays on the
CPU.

The extension is built once per kernel sources, compiler and target (~20 s
on 2 cores without a GPU target, 1-2 min with one) into the kernel cache
(`kernels.cache_dir()`), announced on stderr, and reused by every process.
`MAX_SOFTMAX_LAUNCH` (or its older name `MAX_SOFTMAX_TORCH_LAUNCH`) picks
the path: "auto" (default) launches here; where the extension is not built
yet, a call that may wait builds it at once, a call that should not (a CUDA
tensor, or a numpy array on a machine whose build has a GPU target) starts
the build in the background and takes `Model.execute` until it is loaded.
"extension" builds it at once for every call; "graph" never uses it.

What callers guarantee (they check at their edge; nothing here checks
again): every buffer is contiguous in the layout the dims name, of one dtype
among `DTYPE_CODES`, on one device; the output does not overlap an input;
the memory stays alive until the call returns (on CUDA, the caller's stream
orders any reuse after the kernel).
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import platform
import threading
from collections.abc import Callable
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

from . import kernels, registry, settings, validation, waits
from .devices import check_gpu_index, gpu_available, gpu_name
from .devices import device as max_device

_MODE = settings.get("MAX_SOFTMAX_LAUNCH")  # read once: the per-call path is ~1 µs

ENABLED: bool = _MODE != "graph"
"""Whether calls launch through the extension (MAX_SOFTMAX_LAUNCH "auto",
the default, or "extension") rather than `Model.execute` ("graph")."""

CUDA_ENABLED: bool = ENABLED
"""Whether CUDA tensors launch through the extension too (on the H100 it is
1.26x torch.softmax by wall clock at 4096 x 4096 fp32, where Model.execute
was 0.75x: benchmarks/RESULTS.md)."""

BUILD_IN_BACKGROUND: bool = _MODE == "auto"
"""Whether a call that should not wait for a build (see `available`) starts
it on a thread and takes the graph path meanwhile, rather than waiting."""

EXTENSION_SOURCE: Path = Path(__file__).resolve().parent / "launch_ext" / "launch_ext.mojo"
"""The extension's Mojo source."""

DTYPE_CODES: dict[str, int] = {"float32": 0, "float16": 1, "bfloat16": 2, "float64": 3}
"""The dtypes the extension takes, by name, and the codes it knows them by
(the order of `_dtype_of` in launch_ext.mojo)."""

REDUCTION_CODES: dict[str, int] = {"mean": 0, "sum": 1, "none": 2}
"""Cross-entropy reductions, and their codes (`_reduction_of`)."""

_ENTRY_OF_KIND: dict[str, Callable[[str], str]] = {
    "row": lambda name: name,
    "masked": lambda name: name,
    # One function serves the loss and the loss with its gradient, under
    # the plain options and the extended ones (their length picks the
    # kernels): the gradient is written where its address is not 0.
    "loss": lambda name: "cross_entropy",
    # Likewise the soft-target loss, with and without its gradient.
    "soft_loss": lambda name: "soft_cross_entropy",
}
"""How an op of each registry kind is reached in the extension: the name of
the function that serves it."""

ENTRIES: dict[str, str] = {
    name: _ENTRY_OF_KIND[spec.kind](name)
    for name, spec in registry.OPS.items()
    if spec.kind in _ENTRY_OF_KIND
}
"""The extension function that serves each op of the registry
(`registry.OPS`): every op, so a numpy or torch call of any op on the CPU
(and torch's on CUDA) waits for no graph compile. A test checks each is
in the built extension."""

HELPERS: tuple[str, ...] = ("scale_rows", "sharded_row_stats", "sharded_epilogue")
"""Extension functions beside the registry's ops: the cross-entropy
backward's scaling on CUDA, and the vocab-parallel ops' statistics and
epilogue (`torch/parallel.py`)."""

ROW_OPS: tuple[str, ...] = tuple(n for n, s in registry.OPS.items() if s.kind == "row")
"""The row ops the extension takes, (ctx, stream, dtype, out, *inputs,
outer, n, inner): the forward ops take one input, the backward ops two (the
forward's output, then dy)."""

MASKED_OPS: tuple[str, ...] = tuple(n for n, s in registry.OPS.items() if s.kind == "masked")
"""The masked ops the extension takes (`run_masked`)."""

# `run_masked`'s flags bits, as the masked ops' options carry them (MASK_FLAG,
# CAUSAL_FLAG in launch_ext.mojo and op/masked_flags.mojo).
MASK_FLAG = validation.MASK_FLAG
CAUSAL_FLAG = validation.CAUSAL_FLAG


class LaunchError(RuntimeError):
    """The extension could not be built or loaded, or a launch failed."""


# ---------------------------------------------------------------------------
# Build and load
# ---------------------------------------------------------------------------

_lock = threading.Lock()
_module: ModuleType | None = None
_failure: LaunchError | None = None
_announced = False
_builder: threading.Thread | None = None
_builder_lock = threading.Lock()


def target_accelerator() -> str | None:
    """The accelerator the extension is built for: $MAX_SOFTMAX_TARGET_ACCELERATOR
    (e.g. "sm_90"), else "auto" where MAX sees a GPU (the compiler targets the
    GPU present, as for MAX's own extensions), else None: a CPU-only build."""
    explicit = settings.get("MAX_SOFTMAX_TARGET_ACCELERATOR")
    if explicit:
        return explicit
    return "auto" if gpu_available() else None


def _target_key() -> str:
    """What the compiled code depends on beyond the sources: the accelerator
    and the host CPU (the build targets the host's CPU features, so a cache
    shared by unlike machines must not mix them)."""
    accelerator = target_accelerator()
    if accelerator == "auto":
        try:
            from max.driver import accelerator_architecture_name

            accelerator = f"auto:{accelerator_architecture_name()}"
        except Exception:  # an old MAX: the GPU's name from the device
            accelerator = f"auto:{max_device('gpu').architecture_name}"
    return f"{accelerator or 'cpu-only'};{platform.machine()};{_host_cpu()}"


def _host_cpu() -> str:
    """The host CPU's model name (Linux), else what platform knows."""
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


@cache
def fingerprint() -> str:
    """A hash of the kernel sources, compiler, extension source and target:
    the built extension is reused only while it holds."""
    digest = hashlib.sha256()
    digest.update(kernels.sources_fingerprint().encode())
    digest.update(EXTENSION_SOURCE.read_bytes())
    digest.update(_target_key().encode())
    return digest.hexdigest()[:16]


def extension_path() -> Path:
    """Where the built extension lives: the kernel cache, beside the
    precompiled kernel library."""
    return kernels.cache_dir() / f"max_softmax_launch_ext_{fingerprint()}.so"


def _build_args(include: Path, output: Path) -> list[str]:
    """The `mojo` command line (after `mojo`) that builds the extension."""
    args = ["build", "-I", str(include)]
    accelerator = target_accelerator()
    if accelerator is None:
        # No GPU to compile for: the GPU path is left out (it would fail
        # with "target 'unknown' is not supported").
        args += ["-D", "MAX_SOFTMAX_CPU_ONLY=1"]
    elif accelerator != "auto":
        args += ["--target-accelerator", accelerator]
    return [*args, str(EXTENSION_SOURCE), "--emit", "shared-lib", "-o", str(output)]


def _build(target: Path) -> None:
    """Build the extension into `target` (`kernels.build_into`)."""
    try:
        from mojo.paths import MojoCompilationError
    except ImportError as err:  # pragma: no cover - max always brings mojo
        raise LaunchError(f"max_softmax: the Mojo compiler is not installed ({err})") from err
    accelerator = target_accelerator()
    where = accelerator or "the CPU only"

    def args(output: Path) -> list[str]:
        # The extension imports the kernels as package `op`; a wheel carries
        # them as max_softmax/kernels_src, so the compiler gets a link named op.
        include = output.parent / "include"
        include.mkdir(exist_ok=True)
        (include / "op").symlink_to(kernels.KERNEL_SOURCES, target_is_directory=True)
        return _build_args(include, output)

    try:
        with waits.announced(
            "extension:cpu" if accelerator is None else "extension:gpu",
            f"building the launch extension for {where}",
            "built the launch extension",
        ):
            kernels.build_into(target, EXTENSION_SOURCE, args)
    except MojoCompilationError as error:
        raise LaunchError(f"max_softmax: building the launch extension failed:\n{error}") from error
    except OSError as err:
        raise LaunchError(f"max_softmax: could not build the launch extension: {err}") from err


_ENV_SET_BY_MOJO = ("PYTHONPATH", "PYTHONEXECUTABLE", "PYTHONHOME", "MOJO_PYTHON_LIBRARY")
"""Variables Mojo's Python interop writes into the process environment when
an extension module loads (seen: PYTHONPATH=":", PYTHONEXECUTABLE, the
library path), put back as they were."""


def _load(path: Path) -> ModuleType:
    """Import the built extension from `path` (its init function names it
    `launch_ext`; it is not entered in sys.modules)."""
    spec = importlib.util.spec_from_file_location("launch_ext", path)
    if spec is None or spec.loader is None:
        raise LaunchError(f"max_softmax: cannot load the launch extension at {path}")
    module = importlib.util.module_from_spec(spec)
    saved = {name: os.environ.get(name) for name in _ENV_SET_BY_MOJO}
    try:
        spec.loader.exec_module(module)
    finally:
        # Mojo's Python interop sets these in the C environment as it loads;
        # every child process would inherit them, and PYTHONEXECUTABLE makes
        # a virtualenv's python lose its site-packages.
        for name, value in saved.items():
            if value is None:
                os.unsetenv(name)
            else:
                os.putenv(name, value)
    return module


def extension() -> ModuleType:
    """The extension module, built on first use (once per version) and
    loaded once per process; raises LaunchError where it cannot be built."""
    global _module, _failure
    if _module is not None:
        return _module
    with _lock:
        if _module is None:
            if _failure is not None:
                raise _failure
            try:
                target = extension_path()
                if not target.is_file():
                    _build(target)
                module = _load(target)
            except LaunchError as err:
                _failure = err
                raise
            except (OSError, ImportError) as err:
                _failure = LaunchError(f"max_softmax: cannot load the launch extension: {err}")
                raise _failure from err
            _functions.update(_served(module))
            _module = module
    return _module


def _served(module: ModuleType) -> dict[str, Callable[..., Any]]:
    """The functions `module` serves, by op name (ENTRIES) and by their own
    name; an entry it lacks is left out (`function` then says so)."""
    found: dict[str, Callable[..., Any]] = {}
    for op, entry in ENTRIES.items():
        fn = getattr(module, entry, None)
        if fn is not None:
            found[op] = found[entry] = fn
    for name in HELPERS:
        fn = getattr(module, name, None)
        if fn is not None:
            found[name] = fn
    return found


def available(cuda: bool = False) -> bool:
    """Whether a call should launch through the extension: switched on
    (MAX_SOFTMAX_LAUNCH) and built and loaded. The first call builds it; a
    CUDA call (`cuda`) under "auto" builds it on a thread instead and gets
    False until it is loaded. A failed build is announced once; callers
    then use `Model.execute`."""
    return _available(cuda, background=cuda)


def available_for_arrays() -> bool:
    """`available` for a numpy call on the CPU: built at once where the
    build targets the CPU only (~20 s, as a model compile), on a thread
    where it has a GPU target (1-2 min): the array functions take
    `Model.execute` meanwhile."""
    if _module is not None and ENABLED:  # the per-call path: nothing to decide
        return True
    return _available(False, background=target_accelerator() is not None)


def _available(cuda: bool, background: bool) -> bool:
    if not (CUDA_ENABLED if cuda else ENABLED):
        return False
    if _module is not None:
        return True
    if _failure is not None and _announced:  # the graph path, call after call
        return False
    if _builder is not None:  # building: the graph path meanwhile
        return False
    if background and BUILD_IN_BACKGROUND and not extension_path().is_file():
        _build_in_background()
        return False
    return _load_or_announce()


def _load_or_announce() -> bool:
    """extension(), announcing a failure once: whether it is loaded."""
    global _announced
    try:
        extension()
    except LaunchError as err:
        if not _announced:
            _announced = True
            kernels.announce(f"{err}; calls fall back to Model.execute")
        return False
    return True


def _build_in_background() -> None:
    """Start building and loading the extension on a daemon thread, once;
    `available` is True from the call after it is loaded."""
    global _builder
    with _builder_lock:  # not _lock: the build holds that one throughout
        if _builder is None:
            _builder = threading.Thread(
                target=_load_or_announce, name="max-softmax-launch-ext", daemon=True
            )
            _builder.start()


# ---------------------------------------------------------------------------
# Devices, cached
# ---------------------------------------------------------------------------

_functions: dict[str, Callable[..., Any]] = {}
_gpu_contexts: dict[int, int] = {}
_devices: list[Any] = []  # keeps each Device, owner of its context, alive


@cache
def cpu_context() -> int:
    """MAX's CPU DeviceContext, as an address (its owner, the cached
    `devices.device("cpu")`, lives as long as the process)."""
    return max_device("cpu")._device_context_ptr()


def gpu_context(index: int) -> int:
    """MAX's DeviceContext for GPU `index` (MAX's `Accelerator(index)`,
    torch's `cuda:index`: its default queue, the one MAX's models on that
    device run on), as an address, made once per device. NoGPUError where
    MAX has no such GPU."""
    ctx = _gpu_contexts.get(index)
    if ctx is None:
        check_gpu_index(index, f"GPU {index} (cuda:{index})")
        try:
            dev = max_device(gpu_name(index))
        except Exception as err:
            raise LaunchError(f"max_softmax: MAX has no accelerator {index}: {err}") from err
        _devices.append(dev)
        ctx = _gpu_contexts[index] = dev.default_queue._device_context_ptr()
    return ctx


# ---------------------------------------------------------------------------
# Calls
# ---------------------------------------------------------------------------


def function(name: str) -> Callable[..., Any]:
    """The extension's function serving op `name` (a registry op, ENTRIES,
    or a helper, HELPERS), the extension built and loaded on first use;
    ValueError for a name it does not have."""
    fn = _functions.get(name)
    if fn is None:
        extension()
        fn = _functions.get(name)
        if fn is None:
            raise ValueError(
                f"max_softmax: no launch for op {name!r}; one of {tuple(ENTRIES) + HELPERS}"
            )
    return fn


def call(fn: Callable[..., Any], *args: Any) -> None:
    """`fn(*args)`, the extension's plain Exception raised as LaunchError."""
    try:
        fn(*args)
    except Exception as err:
        raise LaunchError(str(err)) from None


def run_rows(
    op: str,
    ctx: int,
    stream: int | None,
    dtype_code: int,
    out: int,
    inputs: list[int],
    outer: int,
    n: int,
    inner: int,
) -> None:
    """Row op `op` (one of ROW_OPS) of the buffers at addresses `inputs`
    (x, or the forward's output and dy) into `out`, contiguous (outer, n,
    inner) views on `ctx`'s device, ordered against `stream` on a GPU (None
    on the CPU, where it has run when this returns). The torch bridge's
    per-shape launchers inline this call (`torch_launch.launcher`)."""
    call(function(op), ctx, stream, dtype_code, out, *inputs, outer, n, inner)


def run_cross_entropy(
    ctx: int,
    stream: int | None,
    dtype_code: int,
    reduction: str,
    loss: int,
    dlogits: int | None,
    logits: int,
    targets: int,
    options: int,
    rows: int,
    classes: int,
    n_options: int = 2,
    soft: bool = False,
) -> None:
    """Cross-entropy of the (rows, classes) logits and (rows,) int64 targets
    at those addresses, with the `n_options` float64 `options`
    ((ignore_index, label_smoothing), or the extended options laid out by
    `validation.cross_entropy_options`, which run the extended kernels as
    MAX's op does), into `loss` ((1,) for "mean"/"sum", (rows,) for "none") and, unless
    None, d loss / d logits into `dlogits` (which may be `logits` where the
    kernels allow it); rows and classes >= 1. Ordering as `run_rows`.
    With `soft`, `targets` holds (rows, classes) class probabilities of the
    logits' dtype and `options` the soft-target ones
    (`validation.soft_cross_entropy_options`): the soft_cross_entropy op."""
    call(
        function("soft_cross_entropy" if soft else "cross_entropy"),
        ctx,
        stream,
        dtype_code,
        REDUCTION_CODES[reduction],
        loss,
        0 if dlogits is None else dlogits,
        logits,
        targets,
        options,
        n_options,
        rows,
        classes,
    )


def run_masked(
    op: str,
    ctx: int,
    stream: int | None,
    dtype_code: int,
    flags: int,
    out: int,
    x: int,
    mask: int,
    options: int,
    outer: int,
    causal_rows: int,
    n: int,
    mask_rows: int,
) -> None:
    """Masked op `op` (one of MASKED_OPS): softmax / log-softmax of scale *
    x + mask (and causal) of the contiguous (outer, causal_rows, n) buffer at
    `x` into `out`; row r = o * L + i reads mask row r % mask_rows of the
    (mask_rows, n) `mask` if `flags` has MASK_FLAG (else `mask` is not
    read), and keeps columns j <= i if it has CAUSAL_FLAG. `options` is the
    float64 buffer on `ctx`'s device whose first value is the scale (the
    masked ops' options, `validation.masked_options`, fit). Ordering as `run_rows`."""
    call(
        function(op),
        ctx,
        stream,
        dtype_code,
        flags,
        out,
        x,
        mask,
        options,
        outer,
        causal_rows,
        n,
        mask_rows,
    )
