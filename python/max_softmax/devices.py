"""Which device runs: "auto" / "cpu" / "gpu" / "gpu:N", and the MAX device objects.

Every entry point (arrays, graph-level ops, CLI, bench, the torch bridge)
resolves devices here, so a missing GPU is the same clear error everywhere.

A device name is "cpu", "gpu" (the first GPU, MAX's `Accelerator(0)`; also
spelled "gpu:0") or "gpu:N" (MAX's `Accelerator(N)`, the same GPU as torch's
`cuda:N`). `resolve_device` gives the canonical spelling ("gpu:0" becomes
"gpu"), so caches keyed by device name hold one entry per device.
"""

from __future__ import annotations

import re
from functools import cache

from max import driver
from max.graph import DeviceRef

DEVICE_CHOICES: tuple[str, ...] = ("auto", "cpu", "gpu")
"""The device names without an index (a GPU index is "gpu:N")."""

_GPU_NAME = re.compile(r"gpu:([0-9]+)")


class NoGPUError(RuntimeError):
    """Raised when a GPU is requested ("gpu", "gpu:N") that MAX does not find here."""


@cache
def gpu_count() -> int:
    """How many accelerators MAX sees (0 where it sees none, or fails to look)."""
    try:
        return driver.accelerator_count()
    except Exception:
        return 0


def gpu_available() -> bool:
    """True when MAX sees at least one accelerator."""
    return gpu_count() > 0


def gpu_name(index: int) -> str:
    """The canonical device name of GPU `index`: "gpu" for 0, else "gpu:N"."""
    return "gpu" if index == 0 else f"gpu:{index}"


def gpu_index(name: str) -> int | None:
    """The GPU index of canonical device name `name` ("gpu" is 0, "gpu:N" is
    N), or None for "cpu"."""
    if name == "cpu":
        return None
    if name == "gpu":
        return 0
    return int(name[4:])


def device_kind(name: str) -> str:
    """The kind of device name `name`: "cpu" or "gpu"."""
    return "cpu" if name == "cpu" else "gpu"


def _parse(name: object) -> tuple[str, int | None]:
    """("cpu", None), ("gpu", index) or ("auto", None) for a device name;
    ValueError naming what is accepted for anything else."""
    if isinstance(name, str):
        if name in DEVICE_CHOICES:
            return name, (0 if name == "gpu" else None)
        match = _GPU_NAME.fullmatch(name)
        if match:
            return "gpu", int(match.group(1))
    raise ValueError(
        "max_softmax: device must be one of 'auto', 'cpu', 'gpu' or 'gpu:N' (N a GPU "
        f"index; 'gpu' is 'gpu:0'), got {name!r}"
    )


def check_gpu_index(index: int, what: str) -> None:
    """Raise NoGPUError unless MAX has GPU `index`; `what` names the request
    (e.g. "device='gpu:1'") in the message."""
    count = gpu_count()
    if count == 0:
        raise NoGPUError(
            f"max_softmax: {what} was requested but MAX finds no accelerator on this "
            "machine; use device='cpu' or 'auto'"
        )
    if index >= count:
        have = "gpu:0" if count == 1 else f"gpu:0 to gpu:{count - 1}"
        raise NoGPUError(
            f"max_softmax: {what} was requested but MAX finds {count} "
            f"accelerator{'s' if count > 1 else ''} on this machine ({have})"
        )


def resolve_device(device: str) -> str:
    """Map a device name to the canonical name of the device that will run:
    "auto" to "gpu" (the first GPU) where MAX finds one, else "cpu"; "cpu"
    to "cpu"; "gpu" and "gpu:0" to "gpu"; "gpu:N" to "gpu:N". ValueError for
    a malformed name, NoGPUError for a GPU this machine lacks."""
    kind, index = _parse(device)
    if kind == "auto":
        return "gpu" if gpu_available() else "cpu"
    if index is None:
        return "cpu"
    check_gpu_index(index, f"device={device!r}")
    return gpu_name(index)


def canonical_name(name: str) -> str:
    """The canonical spelling of device name `name` ("gpu:0" is "gpu"; "auto"
    as `resolve_device` resolves it), without asking whether a GPU index
    exists here (`resolve_device` does)."""
    kind, index = _parse(name)
    if kind == "auto":
        return resolve_device(name)
    return "cpu" if index is None else gpu_name(index)


@cache
def _device(name: str) -> driver.Device:
    if name == "cpu":
        return driver.CPU()
    return driver.Accelerator(gpu_index(name))


def device(name: str) -> driver.Device:
    """The MAX device object for device name `name` ("cpu", "gpu", "gpu:N";
    "auto" as `resolve_device` takes it), made once per device."""
    return _device(canonical_name(name))


def device_ref(name: str) -> DeviceRef:
    """The graph-side reference of device name `name`: `DeviceRef.CPU()` or
    `DeviceRef.GPU(index)`."""
    index = gpu_index(canonical_name(name))
    return DeviceRef.CPU() if index is None else DeviceRef.GPU(index)


def check_graph_device(ref: DeviceRef, what: str) -> None:
    """Raise NoGPUError when a graph places `what` on a GPU this machine
    lacks: MAX would otherwise fail later, at load, with "Failed to compile
    the model"."""
    if ref.device_type.value != "gpu":
        return
    count = gpu_count()
    if ref.id >= count:
        where = "no accelerator" if count == 0 else f"{count} accelerator{'s' * (count > 1)}"
        raise NoGPUError(
            f"max_softmax: {what} is on {ref} in this graph, but MAX finds {where} on this "
            f"machine; build the graph with DeviceRef.CPU()"
            + ("" if count == 0 else f" or DeviceRef.GPU(0..{count - 1})")
        )
