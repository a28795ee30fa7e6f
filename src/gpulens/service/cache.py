"""Time-to-live caches for backend look-ups that change slowly (which series a host or pod has).

Entries live `ttl_s` seconds, or each its own `ttl_for(key)`; past `max_entries` the least recently
used entry goes (cachetools' `TTLCache`, `TLRUCache`). `get_or_load` is single-flight: concurrent
misses for one key share one call of the loader, so a burst of reads of one execution asks the
backend once, not once per read.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, TypeVar

from cachetools import TLRUCache, TTLCache

# How long a metrics read may use a registry row (an execution, a pod and its workload) as read
# before, by this replica or another, whatever changed it since: as an API key is kept
# (service/auth.py). A dashboard polling one execution reads its row once every 2 s instead of once a
# request (a worker thread's round trip); who may see it is checked on every read.
RECENT_READ_TTL_S = 2.0

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class TtlCache(Generic[K, V]):
    """A TTL + LRU cache with hit/miss counters (gpulens_cache_lookups_total) and single flight."""

    def __init__(
        self,
        ttl_s: float,
        max_entries: int = 4096,
        timer: Callable[[], float] = time.monotonic,
        ttl_for: Callable[[K], float] | None = None,
    ) -> None:
        """`ttl_for`: each entry's own lifetime in seconds, from its key, when it is kept (instead
        of `ttl_s` for all: a look-up of a settled past lives longer than one reaching now)."""
        self._data: TTLCache[K, V] | TLRUCache[K, V]
        if ttl_for is None:
            self._data = TTLCache(maxsize=max_entries, ttl=ttl_s, timer=timer)
        else:
            lifetime = ttl_for
            self._data = TLRUCache(
                maxsize=max_entries, ttu=lambda key, _value, now: now + lifetime(key), timer=timer
            )
        # loads in progress, per event loop (a CLI command's loop is not the server's)
        self._flights: dict[tuple[int, K], _Flight[V]] = {}
        self.hits = 0  # look-ups answered / not
        self.misses = 0
        self.shared = 0  # misses that waited for another caller's load instead of loading

    def get(self, key: K) -> tuple[V] | None:
        """`(value,)` while fresh (the value may itself be None), else None."""
        try:
            value = self._data[key]
        except KeyError:
            self.misses += 1
            return None
        self.hits += 1
        return (value,)

    def peek(self, key: K) -> V | None:
        """The fresh value, counted as a hit; None when there is none (or a kept None), counted as
        nothing: the caller then calls `get_or_load`, which counts what it finds."""
        value = self._data.get(key)
        if value is not None:
            self.hits += 1
        return value

    def __len__(self) -> int:
        return len(self._data)

    def put(self, key: K, value: V) -> None:
        self._data[key] = value

    def discard(self, key: K) -> None:
        """Forget the key's value (a change made here): the next look-up loads it again."""
        self._data.pop(key, None)

    def clear(self) -> None:
        """Forget every value."""
        self._data.clear()

    async def get_or_load(
        self, key: K, load: Callable[[], Awaitable[V]], valid: Callable[[V], bool] | None = None
    ) -> V:
        """The fresh value, else what `load()` gives (kept); concurrent misses share one `load()`.

        `valid`: whether a fresh value also serves this caller (a miss, loaded again and replaced,
        when not); a caller joining a load in flight takes its value as it comes.
        A failed load is not kept and fails every caller waiting on it. A caller that is cancelled
        does not cancel the load the others wait for; the last one leaving does."""
        try:
            kept = self._data[key]
        except KeyError:
            pass
        else:
            if valid is None or valid(kept):
                self.hits += 1
                return kept
        self.misses += 1
        flight_key = (id(asyncio.get_running_loop()), key)
        flight = self._flights.get(flight_key)
        if flight is None:

            async def run() -> V:
                try:
                    value = await load()
                    self.put(key, value)
                    return value
                finally:
                    self._flights.pop(flight_key, None)

            flight = _Flight(asyncio.ensure_future(run()))
            self._flights[flight_key] = flight
        else:
            self.shared += 1
        return await flight.wait()


class _Flight(Generic[V]):
    """One load and how many callers wait for it: the last one to leave cancels it (nobody would read
    its answer), the others leaving do not."""

    def __init__(self, task: asyncio.Task[V]) -> None:
        self.task = task
        self.waiters = 0
        # retrieved even when every waiter is gone: no "exception was never retrieved" warnings
        task.add_done_callback(lambda t: t.cancelled() or t.exception())

    async def wait(self) -> V:
        self.waiters += 1
        try:
            return await asyncio.shield(self.task)
        finally:
            self.waiters -= 1
            if self.waiters == 0 and not self.task.done():
                self.task.cancel()
