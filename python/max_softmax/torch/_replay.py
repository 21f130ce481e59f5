"""Device-graph replay for the torch bridge on CUDA.

In a training or inference loop torch's caching allocator hands the bridge
the same addresses call after call, and MAX replays a captured graph on
the bridge's buffer views of the same memory (it keys a capture by the
buffers' addresses and shapes, refuses others, and keeps no tensor alive).

Off by default (`MAX_SOFTMAX_TORCH_REPLAY=1` turns it on). On the H100 it
cuts a repeated 1 x 128 bridge call from ~125 to ~45 µs, but where
addresses churn (each new result allocated while the old one lives, many
inputs in turn) the captures cost more than the replays win: a rotating
4096 x 4096 forward fell from 1673 to 1012 GB/s, forward + backward to 0.30x
torch (benchmarks/RESULTS.md, "The torch bridge on reused buffer views").

Each CUDA device has its own cache (`cache(index)`): its own captures of
its own models, and its own policy below.

A capture costs far more than a call, so a call signature (op, dtype,
shapes, addresses, the output's included) is captured only on its third
sight; until then the bridge computes the call its usual way. At most
`limit` captures live at once (least recently used released first), and
capturing stops for the process when most captures were released without
ever being replayed: where addresses churn (many live results, rotating
inputs), replay cannot pay.
"""

from __future__ import annotations

import itertools
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

from max.engine import Model

from .. import settings


def enabled() -> bool:
    """Whether the bridge replays on CUDA (MAX_SOFTMAX_TORCH_REPLAY=1; off by default)."""
    return settings.flag("MAX_SOFTMAX_TORCH_REPLAY")


class _Capture:
    """A live capture: its model, its key, and how often it was replayed."""

    __slots__ = ("model", "key", "replays")

    def __init__(self, model: Model, key: int) -> None:
        self.model, self.key, self.replays = model, key, 0


class ReplayCache:
    """Captured graphs of the bridge's destination-passing models, keyed by
    the call's op, dtype, shapes and buffer addresses."""

    def __init__(self, limit: int = 32, sights: int = 3, wasted_limit: int = 8) -> None:
        self.limit, self.sights, self.wasted_limit = limit, sights, wasted_limit
        self.seen: dict[tuple, int] = {}
        self.live: OrderedDict[tuple, _Capture] = OrderedDict()
        self.captures = self.wasted = self.useful = 0
        self.failed = False
        self._keys = itertools.count(1)
        self._lock = threading.Lock()

    @property
    def capturing(self) -> bool:
        """False once most released captures were never replayed, or a
        capture failed (MAX reserves device memory for one; torch may hold it all)."""
        churn = self.wasted >= self.wasted_limit and self.wasted > 2 * self.useful
        return not (churn or self.failed)

    @property
    def active(self) -> bool:
        """Whether a call may still replay or capture (else the bridge
        skips building the call's signature)."""
        return self.capturing or bool(self.live)

    def run(self, model: Model, name: str, tensors: Sequence[Any], buffer: Callable) -> bool:
        """Replay `model` on `tensors` (output first; `buffer` gives a
        tensor's MAX buffer) if this signature was captured, or capture it on
        its third sight. False: nothing ran, the caller computes the call
        its own way."""
        first = tensors[0]
        sig = (name, first.dtype, *((t.data_ptr(), tuple(t.shape)) for t in tensors))
        with self._lock:
            hit = self.live.get(sig)
            if hit is not None:
                self.live.move_to_end(sig)
                hit.replays += 1
                hit.model.replay(hit.key, *(buffer(t) for t in tensors))
                return True
            if not self.capturing:
                return False
            count = self.seen.get(sig, 0) + 1
            if count < self.sights:
                if len(self.seen) >= 64 * self.limit:  # forget old one-offs
                    self.seen.clear()
                self.seen[sig] = count
                return False
            self.seen.pop(sig, None)
            bufs = [buffer(t) for t in tensors]
            capture = _Capture(model, next(self._keys))
            try:
                model.capture(capture.key, *bufs)
            except RuntimeError:  # e.g. no device memory left to capture into
                self.failed = True
                return False
            self.captures += 1
            self.live[sig] = capture
            # A capture may only record the work: run it once for this call.
            model.replay(capture.key, *bufs)
            while len(self.live) > self.limit:
                self._release(self.live.popitem(last=False)[1])
            return True

    def _release(self, capture: _Capture) -> None:
        if capture.replays:
            self.useful += 1
        else:
            self.wasted += 1
        capture.model.release_captured_graph(capture.key)

    def clear(self) -> None:
        """Release every capture and forget every signature."""
        with self._lock:
            for capture in self.live.values():
                capture.model.release_captured_graph(capture.key)
            self.live.clear()
            self.seen.clear()


CACHE = ReplayCache()
"""The replay cache of cuda:0 (`cache(0)`)."""

_caches: dict[int, ReplayCache] = {}
_caches_lock = threading.Lock()


def cache(index: int) -> ReplayCache:
    """The replay cache of cuda:`index`: one per device, since each device
    has its own models and captures, and its own memory to capture into (a
    capture that fails for want of it stops capturing on that device only)."""
    if index == 0:
        return CACHE  # looked up at call time: a test may swap it
    found = _caches.get(index)
    if found is None:
        with _caches_lock:
            found = _caches.setdefault(index, ReplayCache())
    return found


def clear_all() -> None:
    """Release every capture on every device."""
    CACHE.clear()
    for other in list(_caches.values()):
        other.clear()
