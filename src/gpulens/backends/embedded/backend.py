"""`MetricsBackend` over an embedded sample source: PromQL evaluated in-process, answers shaped like
Prometheus' JSON (timestamps in seconds, values as Go formats them), so shaping cannot tell the two apart.
"""

from __future__ import annotations

import math
from decimal import Decimal

import anyio

from gpulens.backends.embedded.evaluate import Grid, SampleSource, evaluate, matrix
from gpulens.backends.embedded.promql import PromQLError, VectorSelector, parse
from gpulens.domain.errors import BackendBadResponse
from gpulens.domain.models import RangeQuery, Series

MAX_POINTS = 11_000  # Prometheus' limit: (end - start) / step may be at most this


def format_value(value: float) -> str:
    """Go's strconv.FormatFloat(v, 'f', -1, 64) as Prometheus writes sample values."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    text = repr(value)
    if "e" in text or "E" in text:
        text = format(Decimal(text), "f")
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return text


def format_time(ms: int) -> float | int:
    """The timestamp as Prometheus' JSON decodes: whole seconds are integers, else seconds.millis."""
    whole, frac = divmod(ms, 1000)
    return whole if frac == 0 else ms / 1000


def formatted(points: list[tuple[int, float]]) -> list[list[float | int | str]]:
    """[[time, value text]] as Prometheus' JSON has them. Values repeat (utilization in whole percent,
    clocks, limits), so each distinct one is formatted once."""
    texts: dict[float, str] = {}
    out: list[list[float | int | str]] = []
    for t, v in points:
        text = texts.get(v)
        if text is None:
            text = format_value(v)
            if v != 0.0:  # 0.0 == -0.0 as keys, but Go writes "-0"
                texts[v] = text
        whole, frac = divmod(t, 1000)
        out.append([whole if frac == 0 else t / 1000, text])
    return out


class EmbeddedBackend:
    """Evaluates the planners' PromQL over `source` (e.g. a `SampleStore`) in worker threads."""

    def __init__(self, source: SampleSource, *, concurrency: int = 4, name: str = "embedded store") -> None:
        self.name = name
        self._source = source
        self._limiter = anyio.CapacityLimiter(concurrency)

    # -- synchronous core (also handy for tests) -------------------------------------------------
    def range_sync(self, expr: str, start_ms: int, end_ms: int, step_ms: int) -> list[Series]:
        if step_ms <= 0:
            raise BackendBadResponse(self.name, f"{self.name}: zero or negative query resolution step")
        if end_ms < start_ms:
            raise BackendBadResponse(self.name, f"{self.name}: end timestamp must not be before start time")
        if (end_ms - start_ms) // step_ms > MAX_POINTS:
            raise BackendBadResponse(
                self.name,
                f"{self.name}: exceeded maximum resolution of 11,000 points per timeseries. "
                "Try decreasing the query resolution (?step=XX)",
            )
        grid = Grid(start_ms, end_ms, step_ms)
        try:
            result = matrix(evaluate(self._source, parse(expr), grid), grid)
        except PromQLError as exc:
            raise BackendBadResponse(self.name, f"{self.name} cannot evaluate {expr!r}: {exc}") from exc
        return [Series(labels, formatted(points)) for labels, points in result]

    def series_sync(self, match: str, start_ms: int, end_ms: int) -> list[dict[str, str]]:
        try:
            sel = parse(match)
        except PromQLError as exc:
            raise BackendBadResponse(self.name, f"{self.name} cannot parse {match!r}: {exc}") from exc
        if not isinstance(sel, VectorSelector):
            raise BackendBadResponse(self.name, f"{self.name}: a series match must be a selector: {match!r}")
        return [dict(labels) for labels, _ in self._source.select(sel.name, sel.matchers, start_ms, end_ms)]

    def raw_sync(self, match: str, start_ms: int, end_ms: int) -> list[Series]:
        """Every sample of the series `match` selects in [start_ms, end_ms], as Prometheus' JSON has them."""
        try:
            sel = parse(match)
        except PromQLError as exc:
            raise BackendBadResponse(self.name, f"{self.name} cannot parse {match!r}: {exc}") from exc
        if not isinstance(sel, VectorSelector):
            raise BackendBadResponse(self.name, f"{self.name}: a raw query needs a selector: {match!r}")
        return [
            Series(dict(labels), [[format_time(t), format_value(v)] for t, v in pts])
            for labels, pts in self._source.select(sel.name, sel.matchers, start_ms, end_ms)
            if pts
        ]

    # -- MetricsBackend -------------------------------------------------------------------------
    async def query_range(self, query: RangeQuery) -> list[Series]:
        w = query.window
        return await anyio.to_thread.run_sync(
            self.range_sync, query.expr, w.start_ms, w.end_ms, w.step_ms, limiter=self._limiter
        )

    async def query(self, expr: str, time_ms: int) -> list[Series]:
        series = await anyio.to_thread.run_sync(
            self.range_sync, expr, time_ms, time_ms, 1, limiter=self._limiter
        )
        return series

    async def series_labels(self, match: str, label: str, start_ms: int, end_ms: int) -> list[str]:
        found = await self.series(match, start_ms, end_ms)
        return sorted({labels[label] for labels in found if label in labels})

    async def series(self, match: str, start_ms: int, end_ms: int) -> list[dict[str, str]]:
        return await anyio.to_thread.run_sync(
            self.series_sync, match, start_ms, end_ms, limiter=self._limiter
        )

    async def query_raw(self, match: str, start_ms: int, end_ms: int) -> list[Series]:
        return await anyio.to_thread.run_sync(self.raw_sync, match, start_ms, end_ms, limiter=self._limiter)

    async def ready(self) -> None:
        return None

    async def aclose(self) -> None:
        return None  # the source belongs to whoever built it (close the SampleStore there)
