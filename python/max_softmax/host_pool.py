"""Large host arrays on huge pages, reused: the numpy front door's outputs.

A fresh large numpy array pays page faults and zeroing on its first write
(a 64 MiB softmax output: 7.4 of the call's 10.9 ms on the 2-core VM). MAX's
host memory pool reuses memory, but maps it with 4 KiB pages, and memory
first touched that way stays so: a 64 MiB write there took 1.55x as long as
on 2 MiB pages (TLB misses; benchmarks/RESULTS.md, CPU). So the outputs come
from blocks of our own: anonymous maps, 2 MiB aligned, advised
`MADV_HUGEPAGE` before anything touches them, handed to numpy through
`__array_interface__`. numpy keeps the lease as the base of the array and of
every view of it; when the last of those is freed, the block goes back to a
free list for the next output of its size, its pages already mapped.
"""

from __future__ import annotations

import math
import mmap
import threading

import numpy as np

HUGE_PAGE = 2 << 20
"""Linux's transparent huge page on x86-64 (and the block size granule)."""
IDLE_BYTES = 1 << 30
"""Free blocks kept for reuse at most; a block returned past it is unmapped."""


class _Pool:
    """Blocks by size (a multiple of `HUGE_PAGE`), each a uint8 array over
    its own anonymous map."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._free: dict[int, list[np.ndarray]] = {}
        self._free_bytes = 0

    def take(self, size: int) -> np.ndarray:
        """A block of `size` bytes: a free one, else a new map."""
        with self._lock:
            free = self._free.get(size)
            if free:
                self._free_bytes -= size
                return free.pop()
        # One huge page more than asked, so the block can start on a 2 MiB
        # boundary: only whole aligned 2 MiB ranges get huge pages.
        region = mmap.mmap(-1, size + HUGE_PAGE)
        if hasattr(mmap, "MADV_HUGEPAGE"):
            region.madvise(mmap.MADV_HUGEPAGE)
        whole = np.frombuffer(region, dtype=np.uint8)
        start = -whole.ctypes.data % HUGE_PAGE
        return whole[start : start + size]

    def give(self, block: np.ndarray) -> None:
        """Return `block` for reuse, or let it go (unmapped with its last
        reference) past `IDLE_BYTES`."""
        with self._lock:
            if self._free_bytes + block.nbytes <= IDLE_BYTES:
                self._free.setdefault(block.nbytes, []).append(block)
                self._free_bytes += block.nbytes


_POOL = _Pool()


class _Lease:
    """One block while arrays view it: numpy holds the lease as their base,
    so it dies with the last of them and returns the block."""

    def __init__(self, block: np.ndarray) -> None:
        self.block = block
        self.__array_interface__ = {
            "version": 3,
            "shape": block.shape,
            "typestr": "|u1",
            "data": (block.ctypes.data, False),
        }

    def __del__(self) -> None:
        _POOL.give(self.block)


def empty(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """An uninitialised C-contiguous array of `shape` and `dtype` on a pooled
    huge-page block (2 MiB aligned). Meant for large arrays: a block is a
    whole number of 2 MiB pages."""
    dtype = np.dtype(dtype)
    nbytes = math.prod(shape) * dtype.itemsize
    size = max(1, -(-nbytes // HUGE_PAGE)) * HUGE_PAGE
    # Bytes first, then the view: the array interface names only numpy's
    # own types (bfloat16 from ml_dtypes would come out as raw 'V2').
    raw = np.asarray(_Lease(_POOL.take(size)))
    return raw[:nbytes].view(dtype).reshape(shape)
