"""Which device runs: "auto" / "cpu" / "gpu", and the MAX device objects.

Every entry point (arrays, graph-level ops, CLI, bench) resolves devices
here, so a missing GPU is the same clear error everywhere.
"""

from __future__ import annotations

from functools import cache

from max import driver
from max.graph import DeviceRef

DEVICE_CHOICES: tuple[str, ...] = ("auto", "cpu", "gpu")


class NoGPUError(RuntimeError):
    """Raised when device="gpu" is requested on a machine without one."""


@cache
def gpu_available() -> bool:
    """True when MAX sees at least one accelerator."""
    try:
        return driver.accelerator_count() > 0
    except Exception:
        return False


def resolve_device(device: str) -> str:
    """Map "auto" / "cpu" / "gpu" to the device kind that will run: "cpu" or "gpu"."""
    if device not in DEVICE_CHOICES:
        raise ValueError(f"max_softmax: device must be one of {DEVICE_CHOICES}, got {device!r}")
    if device == "auto":
        return "gpu" if gpu_available() else "cpu"
    if device == "gpu" and not gpu_available():
        raise NoGPUError(
            "max_softmax: device='gpu' was requested but MAX finds no "
            "accelerator on this machine; use device='cpu' or 'auto'"
        )
    return device


@cache
def device(kind: str) -> driver.Device:
    """The MAX device object for "cpu" or "gpu"."""
    return driver.Accelerator() if kind == "gpu" else driver.CPU()


def check_graph_device(ref: DeviceRef, what: str) -> None:
    """Raise NoGPUError when a graph places `what` on a GPU this machine
    lacks: MAX would otherwise fail later, at load, with "Failed to compile
    the model"."""
    if ref.device_type.value == "gpu" and not gpu_available():
        raise NoGPUError(
            f"max_softmax: {what} is on {ref} in this graph, but MAX finds no "
            "accelerator on this machine; build the graph with DeviceRef.CPU()"
        )
