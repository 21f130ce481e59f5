"""MAX buffers over torch memory, and the order between torch's stream and MAX's.

The torch bridge runs our destination-passing models on torch tensors. A
tensor imported through DLPack costs MAX ~8 µs to wrap and ~50 µs more
inside `execute` (2-core CPU, 64 x 128: 146 µs a call with two imported
buffers, 43 µs with the same two buffers reused), more than the op itself
below a few MB. So the bridge wraps a tensor's memory once, as a buffer
that owns nothing (a DLPack capsule MAX makes over the raw address), and
reuses that view whenever a tensor of the same address, shape, dtype and
device comes back, as torch's caching allocator makes it do call after call.
A view never keeps memory alive and is only handed to MAX together with a
live tensor over the same bytes, so a view left over from a freed tensor
is harmless.

On CUDA MAX runs on its own queue of the tensor's device (MAX's
`Accelerator(N)` for `cuda:N`: its own session, models and views). The
bridge orders it against torch's current stream on that device, with an
event each way and no host wait: MAX's queue waits for the work torch
queued before the call, and torch's stream waits for MAX's op before
anything torch queues after it (so torch may reuse or free the memory at
once).
"""

from __future__ import annotations

import threading
from functools import cache
from typing import Any

import torch
from max._core.dlpack import make_dlpack_capsule
from max.driver import Buffer
from max.dtype import DType

from ..devices import check_gpu_index, device, gpu_name

DTYPES: dict[torch.dtype, DType] = {
    torch.float32: DType.float32,
    torch.float16: DType.float16,
    torch.bfloat16: DType.bfloat16,
    torch.float64: DType.float64,
}
"""The torch dtypes the bridge takes, and their MAX names."""

_VIEW_DTYPES: dict[torch.dtype, DType] = {**DTYPES, torch.int64: DType.int64}
"""What a view may hold: the float dtypes, and int64 for cross-entropy targets."""

_DLPACK_CPU, _DLPACK_CUDA = 1, 2
_LIMIT = 1024  # views kept; past this the cache starts over (a view costs ~3 µs)


class _Capsule:
    """A DLPack producer around a ready capsule, as `Buffer._from_dlpack` reads one."""

    __slots__ = ("capsule", "where")

    def __init__(self, capsule: Any, where: tuple[int, int]) -> None:
        self.capsule, self.where = capsule, where

    def __dlpack__(self, stream: Any = None, **kwargs: Any) -> Any:
        return self.capsule

    def __dlpack_device__(self) -> tuple[int, int]:
        return self.where


_NO_OWNER = _Capsule(None, (_DLPACK_CPU, 0))
"""What each view's capsule names as its owner: nothing that holds memory."""

_views: dict[tuple, Buffer] = {}
_views_lock = threading.Lock()


def view(t: torch.Tensor) -> Buffer:
    """A MAX buffer over contiguous tensor `t`'s memory, made once per
    (address, shape, dtype, device) and reused."""
    key = (t.data_ptr(), t.shape, t.dtype, t.device)
    buf = _views.get(key)
    if buf is None:
        buf = _make_view(t)
        with _views_lock:
            if len(_views) >= _LIMIT:
                _views.clear()
            _views[key] = buf
    return buf


def _make_view(t: torch.Tensor) -> Buffer:
    where = (_DLPACK_CUDA, t.device.index or 0) if t.is_cuda else (_DLPACK_CPU, 0)
    capsule = make_dlpack_capsule(
        _NO_OWNER,
        t.data_ptr(),
        where[0],
        where[1],
        _VIEW_DTYPES[t.dtype],
        list(t.shape),
        None,
        None,
    )
    if t.is_cuda:
        gpu = device(gpu_name(where[1]))
        return Buffer._from_dlpack(capsule, gpu, gpu.default_queue.native_stream_handle)
    return Buffer._from_dlpack(_Capsule(capsule, where))


def device_name(t: torch.Tensor) -> str:
    """The MAX device name of tensor `t`'s device: "cpu", or "gpu" / "gpu:N"
    for cuda:0 / cuda:N (`devices.gpu_name`), what the bridge's models are
    keyed by."""
    return gpu_name(t.device.index or 0) if t.is_cuda else "cpu"


@cache
def _max_stream(index: int = 0) -> torch.cuda.ExternalStream:
    """MAX's queue on GPU `index`, as torch sees it (on torch's cuda:`index`)."""
    handle = device(gpu_name(index)).default_queue.native_stream_handle
    return torch.cuda.ExternalStream(handle, device=torch.device("cuda", index))


_events = threading.local()


def _event(which: str, index: int) -> torch.cuda.Event:
    """One reusable event per thread, direction and device (a wait copies
    the event's state when it is queued, so the next record cannot disturb
    it; an event records on streams of one device only)."""
    events = getattr(_events, which, None)
    if events is None:
        events = {}
        setattr(_events, which, events)
    event = events.get(index)
    if event is None:
        event = events[index] = torch.cuda.Event()
    return event


def max_waits_for(stream: torch.cuda.Stream) -> None:
    """MAX's queue on `stream`'s device waits, on the device, for what
    torch's `stream` queued so far."""
    index = stream.device.index or 0
    event = _event("torch_done", index)
    event.record(stream)
    _max_stream(index).wait_event(event)


def waits_for_max(stream: torch.cuda.Stream) -> None:
    """Torch's `stream` waits, on the device, for what MAX queued so far on
    its queue of `stream`'s device."""
    index = stream.device.index or 0
    event = _event("max_done", index)
    event.record(_max_stream(index))
    stream.wait_event(event)


def check_cuda_device(t: torch.Tensor) -> None:
    """Raise NoGPUError unless MAX has an accelerator for CUDA tensor `t`'s
    device (MAX's `Accelerator(N)` is torch's `cuda:N`; both count the
    devices CUDA_VISIBLE_DEVICES leaves visible)."""
    index = t.device.index or 0
    check_gpu_index(index, f"a tensor on {t.device}")
