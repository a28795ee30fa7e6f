"""The look-up cache: TTL, least-recently-used eviction, single flight for concurrent misses."""

from __future__ import annotations

import asyncio

import pytest

from gpulens.service.cache import TtlCache


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_entries_expire_after_their_ttl() -> None:
    clock = Clock()
    cache: TtlCache[str, int | None] = TtlCache(10.0, timer=clock)
    cache.put("a", None)
    assert cache.get("a") == (None,)  # a cached None is a hit
    clock.now = 9.9
    assert cache.get("a") == (None,)
    clock.now = 10.1
    assert cache.get("a") is None
    assert (cache.hits, cache.misses) == (2, 1)


def test_each_entry_lives_its_own_ttl_and_the_least_recently_used_still_goes() -> None:
    clock = Clock()
    cache: TtlCache[int, str] = TtlCache(10.0, max_entries=3, timer=clock, ttl_for=lambda key: key)
    cache.put(5, "short")
    cache.put(60, "long")
    clock.now = 5.1
    assert cache.get(5) is None and cache.get(60) == ("long",)
    clock.now = 59.9
    assert cache.get(60) == ("long",)
    for k in (100, 200, 300):  # past max_entries: the least recently used goes, whatever its ttl
        cache.put(k, "x")
    assert len(cache) == 3 and cache.get(60) is None


def test_eviction_drops_the_least_recently_used_entry_only() -> None:
    cache: TtlCache[int, int] = TtlCache(60.0, max_entries=3)
    for k in range(3):
        cache.put(k, k)
    assert cache.get(0) == (0,)  # 0 used: 1 is now the least recently used
    cache.put(3, 3)
    assert len(cache) == 3
    assert cache.get(1) is None
    assert [cache.get(k) for k in (0, 2, 3)] == [(0,), (2,), (3,)]


async def test_concurrent_misses_share_one_load() -> None:
    cache: TtlCache[str, int] = TtlCache(60.0)
    calls = 0
    release = asyncio.Event()

    async def load() -> int:
        nonlocal calls
        calls += 1
        await release.wait()
        return 42

    waiters = [asyncio.ensure_future(cache.get_or_load("k", load)) for _ in range(5)]
    await asyncio.sleep(0)
    release.set()
    assert await asyncio.gather(*waiters) == [42] * 5
    assert calls == 1
    assert cache.shared == 4
    assert await cache.get_or_load("k", load) == 42  # kept
    assert calls == 1


async def test_a_failed_load_fails_its_waiters_and_is_not_kept() -> None:
    cache: TtlCache[str, int] = TtlCache(60.0)
    release = asyncio.Event()

    async def failing() -> int:
        await release.wait()
        raise RuntimeError("backend down")

    waiters = [asyncio.ensure_future(cache.get_or_load("k", failing)) for _ in range(3)]
    await asyncio.sleep(0)
    release.set()
    results = await asyncio.gather(*waiters, return_exceptions=True)
    assert all(isinstance(r, RuntimeError) for r in results)

    async def ok() -> int:
        return 7

    assert await cache.get_or_load("k", ok) == 7


async def test_a_cancelled_caller_does_not_cancel_the_shared_load() -> None:
    cache: TtlCache[str, int] = TtlCache(60.0)
    release = asyncio.Event()

    async def load() -> int:
        await release.wait()
        return 5

    first = asyncio.ensure_future(cache.get_or_load("k", load))
    await asyncio.sleep(0)
    second = asyncio.ensure_future(cache.get_or_load("k", load))
    await asyncio.sleep(0)
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    release.set()
    assert await second == 5
    assert cache.get("k") == (5,)


async def test_the_last_caller_leaving_cancels_the_load() -> None:
    cache: TtlCache[str, int] = TtlCache(60.0)
    started, cancelled = asyncio.Event(), asyncio.Event()

    async def load() -> int:
        started.set()
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return 1

    only = asyncio.ensure_future(cache.get_or_load("k", load))
    await started.wait()
    only.cancel()
    await asyncio.gather(only, return_exceptions=True)
    await asyncio.wait_for(cancelled.wait(), 5)
    assert cache.get("k") is None


async def test_a_fresh_value_the_caller_cannot_use_is_loaded_again_and_replaced() -> None:
    cache: TtlCache[str, int] = TtlCache(60.0)
    loads = iter([1, 2])

    async def load() -> int:
        return next(loads)

    assert await cache.get_or_load("k", load) == 1
    assert await cache.get_or_load("k", load, valid=lambda v: v >= 1) == 1  # it serves: a hit
    assert await cache.get_or_load("k", load, valid=lambda v: v >= 2) == 2  # it does not: loaded
    assert cache.get("k") == (2,)  # and replaced
    assert (cache.hits, cache.misses) == (2, 2)


def test_peek_answers_fresh_values_only_and_counts_hits_only() -> None:
    clock = Clock()
    cache: TtlCache[str, int] = TtlCache(10.0, timer=clock)
    assert cache.peek("a") is None and (cache.hits, cache.misses) == (0, 0)
    cache.put("a", 1)
    assert cache.peek("a") == 1 and cache.hits == 1
    clock.now += 11.0
    assert cache.peek("a") is None and (cache.hits, cache.misses) == (1, 0)
