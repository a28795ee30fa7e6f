"""A backend that makes a short recorded history look as long as anyone asks: a year-long execution
for the tests and the benchmark of bounded summaries, without storing a year of samples.

`TiledBackend(inner, source)` answers every range query with what `inner` answers over `source` (a
window that holds data, e.g. an hour of the embedded store) at the query's step, repeated end to end
over the window asked, gap-free and decoded as the Prometheus backend decodes a clean answer
(`GridSamples`). Look-ups (series, labels, instant queries) are answered over `source`, so every
series the source has exists all along. The values are the source's: deterministic for a given
source (seeded data in, the same tiles out), and dense (a sample at every grid point: the most a
summary can be asked to read).
"""

from __future__ import annotations

import anyio

from gpulens.backends.base import MetricsBackend
from gpulens.domain.models import GridSamples, RangeQuery, Series, Window


class TiledBackend:
    """`inner`'s answers over `source`, tiled over any window asked (see the module's docstring)."""

    def __init__(self, inner: MetricsBackend, source: Window, name: str = "tiled") -> None:
        self.inner = inner
        self.source = source
        self.name = name
        self.ranges = 0  # range queries answered
        self.points = 0  # ... and the samples they held

    async def query_range(self, query: RangeQuery) -> list[Series]:
        w = query.window
        step = w.step_ms
        src_end = max(self.source.end_ms, self.source.start_ms + step)
        tile = await self.inner.query_range(
            RangeQuery(query.expr, Window(self.source.start_ms, src_end, step))
        )
        count = (w.end_ms - w.start_ms) // step + 1
        # in a worker thread, as the Prometheus backend decodes its answers
        out = await anyio.to_thread.run_sync(_tiled, tile, w, count)
        self.ranges += 1
        self.points += count * len(out)
        return out

    async def query(self, expr: str, time_ms: int) -> list[Series]:
        return await self.inner.query(expr, min(time_ms, self.source.end_ms))

    async def series_labels(self, match: str, label: str, start_ms: int, end_ms: int) -> list[str]:
        return await self.inner.series_labels(match, label, self.source.start_ms, self.source.end_ms)

    async def series(self, match: str, start_ms: int, end_ms: int) -> list[dict[str, str]]:
        return await self.inner.series(match, self.source.start_ms, self.source.end_ms)

    async def query_raw(self, match: str, start_ms: int, end_ms: int) -> list[Series]:
        return await self.inner.query_raw(match, self.source.start_ms, self.source.end_ms)

    async def ready(self) -> None:
        await self.inner.ready()

    async def aclose(self) -> None:
        await self.inner.aclose()


def _tiled(tile: list[Series], w: Window, count: int) -> list[Series]:
    out = []
    for one in tile:
        values = [float(v) for _, v in one.samples]
        if not values:
            continue
        n = len(values)
        offset = (w.start_ms // w.step_ms) % n  # where the window's first point falls in the tile
        numbers = (values[offset:] + values * (count // n + 1))[:count]
        texts = [repr(x).encode() for x in numbers]
        out.append(Series(dict(one.labels), GridSamples(w.start_ms, w.step_ms, texts, numbers)))
    return out
