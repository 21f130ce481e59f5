"""The Mojo kernel package: where its sources live, and its precompiled form.

MAX accepts a kernel library as a source directory or as a precompiled
`.mojoc` package. Given the directory, MAX re-packages the sources at every
`Graph(...)` (~7 s on a 2-core machine, every process); given a `.mojoc`,
building a graph takes ~1 s. So we precompile once (`mojo precompile`,
~3 s) into a cache keyed by the sources and the compiler, and hand MAX that.
The sources stay the fallback where the compiler cannot run.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import threading
from collections.abc import Callable
from functools import cache
from pathlib import Path

from . import settings
from .waits import announce, announced


def _find_sources() -> Path:
    here = Path(__file__).resolve().parent
    # A wheel carries the package as max_softmax/kernels_src (pyproject.toml);
    # a source checkout or editable install uses the repository's op/.
    for candidate in (here / "kernels_src", here.parent.parent / "op"):
        if (candidate / "__init__.mojo").is_file():
            return candidate
    raise ImportError(
        f"max_softmax: Mojo kernels not found next to {here} "
        "(expected max_softmax/kernels_src or the repository's op/)"
    )


KERNEL_SOURCES: Path = _find_sources()
"""The Mojo package's source directory (op/ in a checkout)."""

_lock = threading.Lock()


def cache_dir() -> Path:
    """Where max-softmax keeps what it builds: $MAX_SOFTMAX_CACHE, else
    $XDG_CACHE_HOME/max-softmax, else ~/.cache/max-softmax."""
    explicit = settings.get("MAX_SOFTMAX_CACHE")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "max-softmax"


@cache
def sources_fingerprint() -> str:
    """A hash of every kernel source and of the compiler and MAX versions:
    a precompiled package or a compiled model is reused only while it holds."""
    digest = hashlib.sha256()
    for name in ("max", "mojo-compiler"):
        try:
            digest.update(f"{name}={importlib.metadata.version(name)};".encode())
        except importlib.metadata.PackageNotFoundError:
            digest.update(f"{name}=?;".encode())
    for path in sorted(KERNEL_SOURCES.rglob("*.mojo")):
        digest.update(str(path.relative_to(KERNEL_SOURCES)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def library_path() -> Path:
    """Where the precompiled library of the current sources lives (built or not)."""
    return cache_dir() / f"max_softmax_kernels_{sources_fingerprint()}.mojoc"


def kernel_library() -> Path:
    """The kernel package to pass as `Graph(..., custom_extensions=[...])`:
    the precompiled `.mojoc` (built on first use, ~3 s, then cached), or the
    source directory where precompiling is switched off
    (MAX_SOFTMAX_PRECOMPILE=0) or the Mojo compiler cannot be found."""
    if not settings.flag("MAX_SOFTMAX_PRECOMPILE"):
        return KERNEL_SOURCES
    target = library_path()
    if target.is_file():
        return target
    with _lock:
        if not target.is_file():
            _precompile(target)
    return target if target.is_file() else KERNEL_SOURCES


def _precompile(target: Path) -> None:
    """Build `target` with `mojo precompile` (`build_into`)."""
    try:
        from mojo.run import subprocess_run_mojo  # noqa: F401 - is the compiler here?
    except ImportError:  # pragma: no cover - max always brings mojo
        return
    try:
        with announced(
            "kernel_library",
            "precompiling the kernel library",
            "precompiled the kernel library",
        ):
            build_into(
                target,
                KERNEL_SOURCES,
                lambda out: ["precompile", str(KERNEL_SOURCES), "-o", str(out)],
            )
    except (OSError, RuntimeError) as err:  # no compiler here: MAX packages the sources
        announce(f"could not precompile the kernels ({err}); using the sources")


def build_into(target: Path, source: Path, args: Callable[[Path], list[str]]) -> None:
    """Run `mojo *args(output)` and publish `output` as `target` by an atomic
    rename, so concurrent processes never read half a file. `output` carries
    the final name (the compiler names a module after its file) in a private
    staging directory, which `args` may also use and which is removed after.
    Raises MojoCompilationError (naming `source`) when the compiler fails."""
    import shutil

    from mojo.paths import MojoCompilationError
    from mojo.run import subprocess_run_mojo

    staging = target.parent / f".staging-{os.getpid()}-{threading.get_ident()}"
    output = staging / target.name
    staging.mkdir(parents=True, exist_ok=True)
    try:
        cmd = args(output)
        result = subprocess_run_mojo(cmd, capture_output=True, text=True)
        if result.returncode != 0:
            raise MojoCompilationError(source, cmd, result.stdout, result.stderr)
        os.replace(output, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)  # links inside are unlinked, not followed


def is_kernel_library(path: Path) -> bool:
    """Whether `path` is our kernel package, as sources or precompiled."""
    path = Path(path)
    return path == KERNEL_SOURCES or (
        path.suffix == ".mojoc"
        and path.name.startswith("max_softmax_kernels_")
        and path.parent == cache_dir()
    )
