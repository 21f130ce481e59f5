"""The numpy front door's pooled outputs (host_pool): shape and layout, a
block reused only once nothing views it, its values safe while anything does."""

import gc

import ml_dtypes
import numpy as np
import pytest

from max_softmax import host_pool

MIB = 1 << 20


@pytest.mark.parametrize(
    ("shape", "dtype"),
    [
        ((1024, 2048), np.float32),
        ((3, 5, 4099), np.float64),
        ((7,), np.uint16),
        ((4, 300), ml_dtypes.bfloat16),
    ],
)
def test_arrays_are_c_contiguous_writable_and_aligned(shape, dtype):
    """An array of the asked shape and dtype, C-contiguous and writable, on a
    2 MiB boundary (so its pages can be huge)."""
    a = host_pool.empty(shape, np.dtype(dtype))
    assert a.shape == shape and a.dtype == dtype
    assert a.flags.c_contiguous and a.flags.writeable
    assert a.ctypes.data % host_pool.HUGE_PAGE == 0
    a[...] = 3
    assert np.all(a == 3)


def test_a_freed_block_is_reused_and_a_viewed_one_is_not():
    """Freeing the array returns its block (the next array of its size gets
    it); a view alone keeps the block, and its values, from the next array."""
    shape = (8 * MIB // 4,)
    first = host_pool.empty(shape, np.dtype(np.float32))
    address = first.ctypes.data
    del first
    gc.collect()
    second = host_pool.empty(shape, np.dtype(np.float32))
    assert second.ctypes.data == address
    second[...] = 1.5
    view = second[10:20]
    del second
    gc.collect()
    third = host_pool.empty(shape, np.dtype(np.float32))
    assert third.ctypes.data != address
    third[...] = -1.0
    assert np.all(view == 1.5)


def test_idle_blocks_are_capped(monkeypatch):
    """Past `IDLE_BYTES` of free blocks a returned block is let go."""
    pool = host_pool._Pool()
    monkeypatch.setattr(host_pool, "IDLE_BYTES", 4 * MIB)
    blocks = [pool.take(2 * MIB) for _ in range(3)]
    for b in blocks:
        pool.give(b)
    assert pool._free_bytes == 4 * MIB and len(pool._free[2 * MIB]) == 2
