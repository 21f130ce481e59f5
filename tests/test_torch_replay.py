"""The torch bridge's replay policy (python/max_softmax/torch/_replay.py)
with a stand-in model: runs without a GPU."""

from __future__ import annotations

import pytest

pytest.importorskip("torch", reason="torch is not installed (extra [torch])")

from max_softmax.torch._replay import ReplayCache  # noqa: E402


class FakeTensor:
    def __init__(self, ptr: int, shape=(4, 8, 1), dtype="float32") -> None:
        self.ptr, self.shape, self.dtype = ptr, shape, dtype

    def data_ptr(self) -> int:
        return self.ptr


class FakeModel:
    """Records what the cache asks of a MAX model."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def capture(self, key, *bufs):
        self.calls.append(("capture", key, bufs))

    def replay(self, key, *bufs):
        self.calls.append(("replay", key, bufs))

    def release_captured_graph(self, key):
        self.calls.append(("release", key))


def kinds(model: FakeModel) -> list[str]:
    return [c[0] for c in model.calls]


def test_declines_twice_captures_third_replays_after():
    cache, model = ReplayCache(), FakeModel()
    call = [FakeTensor(100), FakeTensor(200)]
    ran = [cache.run(model, "softmax", call, buffer=lambda t: t.ptr) for _ in range(4)]
    assert ran == [False, False, True, True]  # False: the bridge computes it itself
    assert kinds(model) == ["capture", "replay", "replay"]
    assert model.calls[0][2] == (100, 200)  # buffers in order, output first
    assert cache.captures == 1


@pytest.mark.parametrize(
    "other",
    [
        [FakeTensor(101), FakeTensor(200)],  # another output address
        [FakeTensor(100), FakeTensor(200, shape=(8, 4, 1))],  # another shape
        [FakeTensor(100, dtype="bfloat16"), FakeTensor(200, dtype="bfloat16")],
    ],
)
def test_a_different_signature_is_not_replayed(other):
    cache, model = ReplayCache(), FakeModel()
    call = [FakeTensor(100), FakeTensor(200)]
    for _ in range(3):
        cache.run(model, "softmax", call, buffer=lambda t: t.ptr)
    model.calls.clear()
    assert not cache.run(model, "softmax", other, buffer=lambda t: t.ptr)
    assert not cache.run(model, "log_softmax", call, buffer=lambda t: t.ptr)
    assert model.calls == []


def test_captures_are_bounded_least_recently_used_first():
    cache, model = ReplayCache(limit=2), FakeModel()
    calls = [[FakeTensor(10 * i), FakeTensor(10 * i + 1)] for i in range(3)]
    for call in calls:
        for _ in range(3):
            cache.run(model, "softmax", call, buffer=lambda t: t.ptr)
    assert len(cache.live) == 2
    released = [c[1] for c in model.calls if c[0] == "release"]
    first_key = next(c[1] for c in model.calls if c[0] == "capture")
    assert released == [first_key]
    cache.clear()
    assert not cache.live and kinds(model)[-2:] == ["release", "release"]


def test_capturing_stops_when_addresses_churn():
    """Signatures seen three times, then never again: every capture is
    released unreplayed, and after `wasted_limit` of them the cache stops
    capturing (replay cannot pay there) and declines every call."""
    cache, model = ReplayCache(limit=1, wasted_limit=4), FakeModel()
    for i in range(20):
        call = [FakeTensor(1000 + i), FakeTensor(2000 + i)]
        for _ in range(3):
            cache.run(model, "softmax", call, buffer=lambda t: t.ptr)
    assert not cache.capturing
    assert not cache.run(model, "softmax", call, buffer=lambda t: t.ptr) and cache.wasted == 4
    assert cache.captures == 5  # the fifth is live when the fourth waste stops it
    assert kinds(model).count("capture") == 5
    assert cache.active  # the fifth capture is still live: it may replay
    cache.clear()
    assert not cache.active  # nothing to replay, nothing to capture


class FailingModel(FakeModel):
    def capture(self, key, *bufs):
        raise RuntimeError("Failed to capture graph: CUDA_ERROR_OUT_OF_MEMORY")


def test_a_failed_capture_falls_back_and_stops_capturing():
    """MAX reserves device memory to capture into; where torch holds it all
    the capture fails: the call runs its usual way, and no capture is tried again."""
    cache, model = ReplayCache(), FailingModel()
    call = [FakeTensor(100), FakeTensor(200)]
    ran = [cache.run(model, "softmax", call, buffer=lambda t: t.ptr) for _ in range(5)]
    assert ran == [False] * 5
    assert not cache.capturing and not cache.active and cache.captures == 0


@pytest.fixture
def fresh_caches(monkeypatch):
    """Every device's replay cache, fresh for the test."""
    from max_softmax.torch import _replay

    monkeypatch.setattr(_replay, "CACHE", ReplayCache())
    monkeypatch.setattr(_replay, "_caches", {})
    return _replay


def test_one_cache_a_device(fresh_caches):
    """cuda:0 has the module's CACHE; every other device has its own."""
    replay = fresh_caches
    assert replay.cache(0) is replay.CACHE
    one, two = replay.cache(1), replay.cache(2)
    assert one is replay.cache(1) and two is replay.cache(2)
    assert len({id(replay.CACHE), id(one), id(two)}) == 3


def test_devices_capture_and_stop_apart(fresh_caches):
    """A capture that fails on one device (its memory all taken) stops
    capturing there only; clear_all releases every device's captures."""
    replay = fresh_caches
    model, failing = FakeModel(), FailingModel()
    call = [FakeTensor(100), FakeTensor(200)]
    for _ in range(3):
        replay.cache(1).run(failing, "softmax", call, buffer=lambda t: t.ptr)
        replay.cache(0).run(model, "softmax", call, buffer=lambda t: t.ptr)
    assert not replay.cache(1).capturing and replay.cache(1).captures == 0
    assert replay.cache(0).capturing and replay.cache(0).captures == 1
    assert replay.cache(0).run(model, "softmax", call, buffer=lambda t: t.ptr)  # replayed
    replay.clear_all()
    assert not replay.cache(0).live and kinds(model)[-1] == "release"
