"""Where the Mojo kernel package lives, installed or in a source checkout."""

from __future__ import annotations

from pathlib import Path


def _find_kernels() -> Path:
    here = Path(__file__).resolve().parent
    # A wheel carries the package as max_softmax/kernels (see pyproject.toml);
    # a source checkout or editable install uses the repository's op/.
    for candidate in (here / "kernels", here.parent.parent / "op"):
        if (candidate / "__init__.mojo").is_file():
            return candidate
    raise ImportError(
        f"max_softmax: Mojo kernels not found next to {here} "
        "(expected max_softmax/kernels or the repository's op/)"
    )


KERNELS: Path = _find_kernels()
"""The Mojo package to pass as `Graph(..., custom_extensions=[KERNELS])`."""
