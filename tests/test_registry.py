"""The op registry, the Mojo registrations and the kernel library agree."""

from __future__ import annotations

import re

import pytest

import max_softmax
from max_softmax.kernels import KERNEL_SOURCES, is_kernel_library, kernel_library
from max_softmax.registry import OPS, op_spec


def _registered_in_mojo() -> set[str]:
    names = set()
    for path in KERNEL_SOURCES.rglob("*.mojo"):
        names |= set(re.findall(r'@extensibility\.register\("([a-z_]+)"\)', path.read_text()))
    return names


def test_every_op_and_its_twin_is_registered_in_mojo():
    registered = _registered_in_mojo()
    for spec in OPS.values():
        assert spec.name in registered, spec.name
        assert spec.into in registered, spec.into
        assert spec.backward is None or spec.backward in OPS
    # The vocab-parallel building blocks (max_softmax.sharded) are ops of their own.
    # ...and so is the torch bridge's in-place scale (max_softmax.models.BRIDGE_OPS).
    sharded = set(max_softmax.sharded.SHARDED_OPS)
    bridge = set(max_softmax.models.BRIDGE_OPS)
    assert registered == set(OPS) | {s.into for s in OPS.values()} | sharded | bridge


def test_unknown_op():
    with pytest.raises(ValueError, match="unknown op 'nope'"):
        op_spec("nope")


def test_kernel_library_is_precompiled_and_cached():
    """KERNELS is a precompiled package (graph builds ~1 s, not ~7 s), built
    once per source version and reused."""
    lib = kernel_library()
    assert lib.suffix == ".mojoc" and lib.is_file(), lib
    assert kernel_library() == lib == max_softmax.KERNELS
    assert is_kernel_library(lib) and is_kernel_library(KERNEL_SOURCES)


def test_sources_stay_the_fallback(monkeypatch):
    monkeypatch.setenv("MAX_SOFTMAX_PRECOMPILE", "0")
    assert kernel_library() == KERNEL_SOURCES


@pytest.mark.parametrize(
    ("shape", "axis", "view"),
    [
        ((64, 256), -1, (64, 256, 1)),
        ((64, 256), 1, (64, 256, 1)),
        ((8, 100, 3), -2, (8, 100, 3)),
        ((2, 3, 4, 5), 0, (1, 2, 60)),
        ((7,), -1, (1, 7, 1)),
    ],
)
def test_canonical_shape_counts_negative_axes_from_the_end(shape, axis, view):
    from max_softmax.validation import canonical_shape

    assert canonical_shape(shape, axis) == view
