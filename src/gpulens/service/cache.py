"""A small time-to-live cache for backend lookups that change slowly (which series a host or pod has)."""

from __future__ import annotations

import time
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class TtlCache(Generic[K, V]):
    """Entries live `ttl_s` seconds; past `max_entries` the whole cache starts over (no LRU needed
    for a few thousand hosts or pods)."""

    def __init__(self, ttl_s: float, max_entries: int = 4096) -> None:
        self._ttl = ttl_s
        self._max = max_entries
        self._data: dict[K, tuple[float, V]] = {}
        self.hits = 0  # look-ups answered / not (gpulens_cache_lookups_total)
        self.misses = 0

    def get(self, key: K) -> tuple[V] | None:
        """`(value,)` while fresh (the value may itself be None), else None."""
        hit = self._data.get(key)
        if hit is None or hit[0] < time.monotonic():
            self.misses += 1
            return None
        self.hits += 1
        return (hit[1],)

    def __len__(self) -> int:
        return len(self._data)

    def put(self, key: K, value: V) -> None:
        if len(self._data) > self._max:
            self._data.clear()
        self._data[key] = (time.monotonic() + self._ttl, value)
