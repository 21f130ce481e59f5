"""The torch bridge's launch path: our kernels on torch tensors without a graph.

`Model.execute` of a compiled MAX graph costs 35-60 µs of host work a call,
more than the op itself below a few MB, so the bridge loses to
`torch.softmax` by wall clock. This module runs the same row functions MAX's
ops call (`op/dispatch.mojo`) through a small Mojo extension module
(`bridge_ext/torch_ext.mojo`) that takes raw addresses: ~1 µs of host work a
call on the CPU.

On CUDA the extension launches on MAX's own queue for the device (the
DeviceContext MAX made, so kernels, workspace allocator and compiled-function
cache are MAX's), ordered against torch's current stream with an event each
way: MAX's queue waits for what torch queued before the call, torch's stream
waits for the kernel before anything it queues after. Nothing waits on the
host. On the CPU the kernel runs before `run` returns.

The extension is built once per kernel sources, compiler and target (~1 min
on 2 cores without a GPU target, longer with one) into the kernel cache
(`kernels.cache_dir()`), announced on stderr, and reused by every process.
`MAX_SOFTMAX_TORCH_LAUNCH` picks the path: "auto" (default) launches CPU and
CUDA tensors here; where the extension is not built yet, a CPU call builds it
at once, a CUDA call starts the build in the background (~1-2 min with a GPU
target) and the bridge runs `Model.execute` until it is loaded. "extension"
builds it at once for either; "graph" never uses it.

What the caller guarantees (the bridge checks at its edge; nothing here
checks again):

- every tensor is contiguous in the (outer, n, inner) layout the dims name
  (any storage offset; the kernels check alignment themselves), of one dtype
  among `DTYPE_CODES`, on one device, CPU or CUDA;
- the output does not overlap an input unless the op is elementwise-safe
  (the kernels read a row before writing it, but the bridge never relies on
  it);
- the tensors stay alive until `run` returns (torch's stream then orders any
  reuse of their memory after the kernel).
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import platform
import threading
from collections.abc import Callable
from functools import cache, partial
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from . import kernels
from .devices import device as max_device
from .devices import gpu_available
from .validation import EMPTY_LOSS

_MODE = os.environ.get("MAX_SOFTMAX_TORCH_LAUNCH", "auto") or "auto"
if _MODE not in ("auto", "extension", "graph"):
    raise ValueError(
        "max_softmax: MAX_SOFTMAX_TORCH_LAUNCH must be 'auto', 'extension' or 'graph', "
        f"got {_MODE!r}"
    )

ENABLED: bool = _MODE != "graph"
"""Whether CPU tensors launch through the extension (env
MAX_SOFTMAX_TORCH_LAUNCH: "auto", the default, or "extension") rather than
`Model.execute` ("graph")."""

CUDA_ENABLED: bool = _MODE != "graph"
"""Whether CUDA tensors launch through the extension too (on the H100 it is
1.26x torch.softmax by wall clock at 4096 x 4096 fp32, where Model.execute
was 0.75x: benchmarks/RESULTS.md)."""

BUILD_IN_BACKGROUND: bool = _MODE == "auto"
"""Whether a CUDA call that finds no built extension starts the build on a
thread and takes the graph path meanwhile (a GPU target takes ~1-2 min to
build, a graph ~15-20 s to compile), rather than waiting for it."""

EXTENSION_SOURCE: Path = Path(__file__).resolve().parent / "bridge_ext" / "torch_ext.mojo"
"""The extension's Mojo source."""

DTYPE_CODES: dict[torch.dtype, int] = {
    torch.float32: 0,
    torch.float16: 1,
    torch.bfloat16: 2,
    torch.float64: 3,
}
"""The dtypes the extension takes, and the codes it knows them by (the order
of `_dtype_of` in torch_ext.mojo)."""

REDUCTION_CODES: dict[str, int] = {"mean": 0, "sum": 1, "none": 2}
"""Cross-entropy reductions, and their codes (`_reduction_of`)."""

ROW_OPS: tuple[str, ...] = (
    "softmax",
    "log_softmax",
    "softmax_backward",
    "log_softmax_backward",
)
"""The row ops `run` takes: the forward ops take one input, the backward
ops two (the forward's output, then dy)."""


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
    explicit = os.environ.get("MAX_SOFTMAX_TARGET_ACCELERATOR")
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
    return kernels.cache_dir() / f"max_softmax_torch_ext_{fingerprint()}.so"


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
    where = target_accelerator() or "the CPU only"
    kernels.announce(
        f"building the torch launch extension for {where} (once per version, about a minute)"
    )

    def args(output: Path) -> list[str]:
        # The extension imports the kernels as package `op`; a wheel carries
        # them as max_softmax/kernels_src, so the compiler gets a link named op.
        include = output.parent / "include"
        include.mkdir(exist_ok=True)
        (include / "op").symlink_to(kernels.KERNEL_SOURCES, target_is_directory=True)
        return _build_args(include, output)

    try:
        kernels.build_into(target, EXTENSION_SOURCE, args)
    except MojoCompilationError as error:
        raise LaunchError(
            f"max_softmax: building the torch launch extension failed:\n{error}"
        ) from error
    except OSError as err:
        raise LaunchError(
            f"max_softmax: could not build the torch launch extension: {err}"
        ) from err


_ENV_SET_BY_MOJO = ("PYTHONPATH", "PYTHONEXECUTABLE", "PYTHONHOME", "MOJO_PYTHON_LIBRARY")
"""Variables Mojo's Python interop writes into the process environment when
an extension module loads (seen: PYTHONPATH=":", PYTHONEXECUTABLE, the
library path), put back as they were."""


def _load(path: Path) -> ModuleType:
    """Import the built extension from `path` (its init function names it
    `torch_ext`; it is not entered in sys.modules)."""
    spec = importlib.util.spec_from_file_location("torch_ext", path)
    if spec is None or spec.loader is None:
        raise LaunchError(f"max_softmax: cannot load the torch launch extension at {path}")
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
                _failure = LaunchError(
                    f"max_softmax: cannot load the torch launch extension: {err}"
                )
                raise _failure from err
            _functions.update({name: getattr(module, name) for name in ROW_OPS})
            _functions["cross_entropy"] = module.cross_entropy
            _functions["scale_rows"] = module.scale_rows
            _module = module
    return _module


def available(cuda: bool = False) -> bool:
    """Whether the bridge should launch through the extension for CPU
    tensors (or CUDA ones, `cuda`): switched on (MAX_SOFTMAX_TORCH_LAUNCH)
    and built and loaded. The first call builds it, on a thread for a CUDA
    call under "auto" (False until it is loaded). A failed build is announced
    once; the bridge then uses `Model.execute`."""
    if not (CUDA_ENABLED if cuda else ENABLED):
        return False
    if _module is not None:
        return True
    if _failure is not None and _announced:  # the graph path, call after call
        return False
    if _builder is not None:  # building: the graph path meanwhile
        return False
    if cuda and BUILD_IN_BACKGROUND and not extension_path().is_file():
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
            kernels.announce(f"{err}; the torch bridge falls back to Model.execute")
        return False
    return True


def _build_in_background() -> None:
    """Start building and loading the extension on a daemon thread, once;
    `available` is True from the call after it is loaded."""
    global _builder
    with _builder_lock:  # not _lock: the build holds that one throughout
        if _builder is None:
            _builder = threading.Thread(
                target=_load_or_announce, name="max-softmax-torch-ext", daemon=True
            )
            _builder.start()


# ---------------------------------------------------------------------------
# Devices and streams, cached
# ---------------------------------------------------------------------------

_functions: dict[str, Callable[..., Any]] = {}
_gpu_contexts: dict[int, int] = {}
_devices: list[Any] = []  # keeps each Device, owner of its context, alive
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


@cache
def _cpu_context() -> int:
    """MAX's CPU DeviceContext, as an address (its owner, the cached
    `devices.device("cpu")`, lives as long as the process)."""
    return max_device("cpu")._device_context_ptr()


def _gpu_context(index: int) -> int:
    """MAX's DeviceContext for CUDA device `index` (its default queue, the
    one MAX's models run on), as an address, made once per device."""
    ctx = _gpu_contexts.get(index)
    if ctx is None:
        from max import driver

        try:
            dev = max_device("gpu") if index == 0 else driver.Accelerator(index)
        except Exception as err:
            raise LaunchError(f"max_softmax: MAX has no accelerator {index}: {err}") from err
        _devices.append(dev)
        ctx = _gpu_contexts[index] = dev.default_queue._device_context_ptr()
    return ctx


# ---------------------------------------------------------------------------
# Calls
# ---------------------------------------------------------------------------


def _context_and_stream(t: torch.Tensor) -> tuple[int, int | None]:
    """MAX's DeviceContext for `t`'s device, as an address, and torch's
    current raw stream there (None on the CPU)."""
    index = t.get_device()
    if index < 0:
        return _cpu_context(), None
    return _gpu_contexts.get(index) or _gpu_context(index), _raw_stream(index)


def _function(name: str) -> Callable[..., Any]:
    """The extension's function `name`, the extension built and loaded on
    first use; ValueError for a name it does not have."""
    fn = _functions.get(name)
    if fn is None:
        extension()
        fn = _functions.get(name)
        if fn is None:
            raise ValueError(f"max_softmax: no launch for op {name!r}; one of {ROW_OPS}")
    return fn


def _launch(fn: Callable[..., Any], *args: Any) -> None:
    """`fn(*args)`, the extension's plain Exception raised as LaunchError."""
    try:
        fn(*args)
    except Exception as err:
        raise LaunchError(str(err)) from None


Launcher = Callable[..., None]
"""`launch(out, *inputs)`: one row op on tensors of a fixed shape, dtype
and device (see `launcher`)."""


def launcher(op: str, like: torch.Tensor, outer: int, n: int, inner: int) -> Launcher:
    """A launch of row op `op` (one of ROW_OPS) on contiguous (outer, n,
    inner) tensors of `like`'s dtype and device: `launch(out, *inputs)`
    writes the op of `inputs` into `out` (see the module docstring for what
    the caller guarantees). Everything but the addresses and, on CUDA,
    torch's current stream is looked up here once, so a caller that keeps
    the launcher pays ~1 µs a call (the torch bridge's per-shape plans).

    Forward ops take the input x; backward ops take the forward's output
    (y, or log p) and dy, and write dx. On CUDA the op is queued in order on
    torch's current stream of the device and the launch returns at once; on
    the CPU it has run when the launch returns. Raises LaunchError where the
    extension cannot be built or a launch fails (e.g. a row too long for the
    GPU), ValueError for an unknown op, TypeError for a dtype not in
    DTYPE_CODES.
    """
    fn = _function(op)
    code = DTYPE_CODES.get(like.dtype)
    if code is None:
        raise TypeError(f"max_softmax: no {op} launch for {like.dtype}")
    index = like.get_device()
    ctx = _cpu_context() if index < 0 else _gpu_context(index)
    stream = (lambda: None) if index < 0 else partial(_raw_stream, index)
    if outer * n * inner == 0:
        return lambda out, *inputs: None

    def launch(out: torch.Tensor, *inputs: torch.Tensor) -> None:
        # `_launch` inlined: this is the bridge's per-call path.
        try:
            fn(
                ctx,
                stream(),
                code,
                out.data_ptr(),
                *[t.data_ptr() for t in inputs],
                outer,
                n,
                inner,
            )
        except Exception as err:  # the extension raises plain Exception
            raise LaunchError(str(err)) from None

    return launch


def run(op: str, out: torch.Tensor, *inputs: torch.Tensor, outer: int, n: int, inner: int) -> None:
    """Write row op `op` of `inputs` into `out`, all contiguous (outer, n,
    inner) tensors of one dtype on one device: `launcher(op, out, outer, n,
    inner)(out, *inputs)`, for one call. Nothing is done when a dim is 0."""
    launcher(op, out, outer, n, inner)(out, *inputs)


def cross_entropy(
    loss: torch.Tensor,
    dlogits: torch.Tensor | None,
    logits: torch.Tensor,
    targets: torch.Tensor,
    options: torch.Tensor,
    reduction: str,
) -> None:
    """Cross-entropy of contiguous (rows, classes) `logits` against (rows,)
    int64 `targets` into `loss` ((1,) for "mean"/"sum", (rows,) for "none"),
    and d loss / d logits into `dlogits` where given. `options` is the
    float64 (2,) tensor (ignore_index, label_smoothing) on the logits'
    device. With no rows or no classes the loss is `EMPTY_LOSS[reduction]`
    and dlogits zeros, as the bridge's graph path gives. Ordering and
    guarantees as `run`."""
    rows, classes = logits.shape
    if rows == 0 or classes == 0:
        loss.fill_(EMPTY_LOSS[reduction])
        if dlogits is not None:
            dlogits.zero_()
        return
    ctx, stream = _context_and_stream(logits)
    _launch(
        _function("cross_entropy"),
        ctx,
        stream,
        DTYPE_CODES[logits.dtype],
        REDUCTION_CODES[reduction],
        loss.data_ptr(),
        0 if dlogits is None else dlogits.data_ptr(),
        logits.data_ptr(),
        targets.data_ptr(),
        options.data_ptr(),
        rows,
        classes,
    )


def scale_rows(data: torch.Tensor, factor: torch.Tensor) -> None:
    """`data *= factor` in place for a contiguous CUDA (rows, n) `data` and a
    contiguous `factor` of its dtype and device, of one element or one a row
    ((rows,) or (rows, 1)), leaving rows whose factor is 1 unread and
    unwritten (`op/gpu_scale_rows.mojo`): the cross-entropy backward's
    scaling by an incoming gradient that is nearly always 1, without a pass
    over the gradient or a host sync. Ordering and guarantees as `run`."""
    rows, n = data.shape
    ctx, stream = _context_and_stream(data)
    _launch(
        _function("scale_rows"),
        ctx,
        stream,
        DTYPE_CODES[data.dtype],
        data.data_ptr(),
        factor.data_ptr(),
        rows,
        n,
        int(factor.numel() > 1),
    )
