"""Device-graph replay for the torch bridge on CUDA.

In a training or inference loop torch's caching allocator hands the bridge
the same addresses call after call, and MAX replays a captured graph on
fresh DLPack buffers of the same memory (it keys a capture by the buffers'
addresses and shapes, and refuses others). Replaying skips most of MAX's
per-call host work: ~46 µs a call instead of ~77 for an execute at 64 x 128
on the H100 (benchmarks/RESULTS.md, "Replaying the bridge's graph").

A call signature (op, dtype, shape, addresses) is captured the second time
it is seen, so one-off calls never pay for a capture; at most `limit`
captures live at once, the least recently used released first.
`MAX_SOFTMAX_TORCH_REPLAY=0` turns it off.
"""

from __future__ import annotations

import itertools
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

from max.engine import Model

ENABLED = os.environ.get("MAX_SOFTMAX_TORCH_REPLAY", "1") != "0"
"""Whether the bridge replays on CUDA (env MAX_SOFTMAX_TORCH_REPLAY=0: never)."""


class ReplayCache:
    """Captured graphs of the bridge's destination-passing models, keyed by
    the call's op, dtype, shape and buffer addresses."""

    def __init__(self, limit: int = 32) -> None:
        self.limit = limit
        self.seen: set[tuple] = set()
        self.live: OrderedDict[tuple, tuple[Model, int]] = OrderedDict()
        self.captures = 0
        self._keys = itertools.count(1)
        self._lock = threading.Lock()

    def run(self, model: Model, name: str, tensors: Sequence[Any], buffer: Callable) -> None:
        """Run `model` on `tensors` (output first) through `buffer` (torch
        tensor -> MAX buffer): replay a capture of the same signature, or
        capture on a second sight, or execute."""
        first = tensors[0]
        sig = (name, first.dtype, *((t.data_ptr(), tuple(t.shape)) for t in tensors))
        bufs = [buffer(t) for t in tensors]
        with self._lock:
            hit = self.live.get(sig)
            if hit is not None:
                self.live.move_to_end(sig)
                hit[0].replay(hit[1], *bufs)
                return
            if sig not in self.seen:
                self.seen.add(sig)
                if len(self.seen) > 64 * self.limit:  # forget old one-offs
                    self.seen.clear()
                model.execute(*bufs)
                return
            key = next(self._keys)
            model.capture(key, *bufs)
            self.captures += 1
            self.live[sig] = (model, key)
            # A capture may only record the work: run it once for this call.
            model.replay(key, *bufs)
            while len(self.live) > self.limit:
                _, (old_model, old_key) = self.live.popitem(last=False)
                old_model.release_captured_graph(old_key)

    def clear(self) -> None:
        """Release every capture."""
        with self._lock:
            for model, key in self.live.values():
                model.release_captured_graph(key)
            self.live.clear()
            self.seen.clear()


CACHE = ReplayCache()
"""The bridge's one replay cache."""
