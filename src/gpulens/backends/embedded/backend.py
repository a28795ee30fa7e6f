"""`MetricsBackend` over an embedded sample source: PromQL evaluated in-process, answers shaped like
Prometheus' JSON (timestamps in seconds, values as Go formats them), so shaping cannot tell the two apart.
"""

from __future__ import annotations

import math
from decimal import Decimal
from functools import lru_cache

import anyio
import numpy as np
import numpy.typing as npt

from gpulens.backends.embedded.evaluate import Grid, SampleSource, evaluate, matrix
from gpulens.backends.embedded.promql import Expr, PromQLError, VectorSelector, parse
from gpulens.domain.errors import BackendBadResponse
from gpulens.domain.models import RangeQuery, Sample, Series

MAX_POINTS = 11_000  # Prometheus' limit: (end - start) / step may be at most this
# on an in-memory source, smaller grids are evaluated without a thread hop: a 24 h read at 15 s
# (5,761 points) takes ~2 ms a query on the loop, less than the hop and the GIL hand-overs it saves
INLINE_POINTS = 6_000


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


@lru_cache(maxsize=1024)
def parsed(expr: str) -> Expr:
    """`parse`, remembered: a read asks the same dozen expressions at every window and step (the AST
    is immutable, so one copy serves every evaluation)."""
    return parse(expr)


_NEGATIVE_ZERO = np.float64(-0.0).view(np.int64)


# value texts by the values' bits: reads of one archive at other windows and steps answer the same
# sums and means again (~130 bytes an entry; emptied when full)
_TEXTS: dict[int, str] = {}
TEXTS_MAX = 100_000


def _texts(values: npt.NDArray[np.float64]) -> npt.NDArray[np.object_]:
    """`format_value` of each value: whole numbers through int, the others through repr where it has
    no exponent (repr's shortest round trip is Go's 'f', -1 there), the rest one by one."""
    out = np.empty(len(values), dtype=object)
    size = np.abs(values)
    with np.errstate(invalid="ignore"):
        plain = np.isfinite(values) & (size < 1e15) & ((size >= 1e-4) | (values == 0))
        plain &= values.view(np.int64) != _NEGATIVE_ZERO  # Go writes "-0"
        whole = plain & (values == np.floor(values))
    fraction = plain & ~whole
    if whole.any():
        out[whole] = list(map(str, values[whole].astype(np.int64).tolist()))
    if fraction.any():
        out[fraction] = list(map(repr, values[fraction].tolist()))
    rest = ~plain
    if rest.any():
        out[rest] = [format_value(v) for v in values[rest].tolist()]
    return out


def format_points(times: npt.NDArray[np.int64], values: npt.NDArray[np.float64]) -> list[Sample]:
    """[(time, value text)] as Prometheus' JSON has them, from arrays. Values repeat (utilization in
    whole percent, clocks, limits), so each distinct one (by its bits: -0 is not 0) is formatted once."""
    if not len(times):
        return []
    bits, inverse = np.unique(values.view(np.int64), return_inverse=True)
    keys = bits.tolist()
    texts = list(map(_TEXTS.get, keys))
    if None in texts:
        missing = [i for i, known in enumerate(texts) if known is None]
        if len(_TEXTS) > TEXTS_MAX:
            _TEXTS.clear()
        for i, fresh in zip(missing, _texts(bits[missing].view(np.float64)).tolist(), strict=True):
            texts[i] = _TEXTS[keys[i]] = fresh
    text = np.array(texts, dtype=object)[inverse.reshape(-1)].tolist()
    whole = times % 1000 == 0
    if whole.all():
        stamps: list[float | int] = (times // 1000).tolist()
    else:
        stamps = [
            s if w else f
            for s, f, w in zip((times // 1000).tolist(), (times / 1000).tolist(), whole.tolist(), strict=True)
        ]
    return list(zip(stamps, text, strict=True))


class EmbeddedBackend:
    """Evaluates the planners' PromQL over `source` (e.g. a `SampleStore`) in worker threads; over a
    source that says it is `in_memory` (a decoded archive), small grids and series look-ups inline."""

    def __init__(self, source: SampleSource, *, concurrency: int = 4, name: str = "embedded store") -> None:
        self.name = name
        self._source = source
        self._limiter = anyio.CapacityLimiter(concurrency)
        self._in_memory = source.in_memory  # e.g. a decoded archive

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
            result = matrix(evaluate(self._source, parsed(expr), grid), grid)
        except PromQLError as exc:
            raise BackendBadResponse(self.name, f"{self.name} cannot evaluate {expr!r}: {exc}") from exc
        return [Series(labels, format_points(times, values)) for labels, times, values in result]

    def series_sync(self, match: str, start_ms: int, end_ms: int) -> list[dict[str, str]]:
        try:
            sel = parsed(match)
        except PromQLError as exc:
            raise BackendBadResponse(self.name, f"{self.name} cannot parse {match!r}: {exc}") from exc
        if not isinstance(sel, VectorSelector):
            raise BackendBadResponse(self.name, f"{self.name}: a series match must be a selector: {match!r}")
        return self._source.select_labels(sel.name, sel.matchers, start_ms, end_ms)

    def raw_sync(self, match: str, start_ms: int, end_ms: int) -> list[Series]:
        """Every sample of the series `match` selects in [start_ms, end_ms], as Prometheus' JSON has them."""
        try:
            sel = parsed(match)
        except PromQLError as exc:
            raise BackendBadResponse(self.name, f"{self.name} cannot parse {match!r}: {exc}") from exc
        if not isinstance(sel, VectorSelector):
            raise BackendBadResponse(self.name, f"{self.name}: a raw query needs a selector: {match!r}")
        return [
            Series(dict(labels), format_points(t, v))
            for labels, t, v in self._source.select_arrays(sel.name, sel.matchers, start_ms, end_ms)
            if len(t)
        ]

    # -- MetricsBackend -------------------------------------------------------------------------
    def _inline(self, start_ms: int, end_ms: int, step_ms: int) -> bool:
        """Evaluate on the event loop rather than hop to a worker thread: a source in memory (no I/O)
        and a grid small enough to take a few milliseconds (look-ups, checks, a day at 15 s)."""
        return self._in_memory and step_ms > 0 and (end_ms - start_ms) // step_ms < INLINE_POINTS

    async def query_range(self, query: RangeQuery) -> list[Series]:
        w = query.window
        if self._inline(w.start_ms, w.end_ms, w.step_ms):
            return self.range_sync(query.expr, w.start_ms, w.end_ms, w.step_ms)
        return await anyio.to_thread.run_sync(
            self.range_sync, query.expr, w.start_ms, w.end_ms, w.step_ms, limiter=self._limiter
        )

    async def query(self, expr: str, time_ms: int) -> list[Series]:
        if self._in_memory:
            return self.range_sync(expr, time_ms, time_ms, 1)
        series = await anyio.to_thread.run_sync(
            self.range_sync, expr, time_ms, time_ms, 1, limiter=self._limiter
        )
        return series

    async def series_labels(self, match: str, label: str, start_ms: int, end_ms: int) -> list[str]:
        found = await self.series(match, start_ms, end_ms)
        return sorted({labels[label] for labels in found if label in labels})

    async def series(self, match: str, start_ms: int, end_ms: int) -> list[dict[str, str]]:
        if self._in_memory:  # labels only, no samples read: cheaper than the hop
            return self.series_sync(match, start_ms, end_ms)
        return await anyio.to_thread.run_sync(
            self.series_sync, match, start_ms, end_ms, limiter=self._limiter
        )

    async def query_raw(self, match: str, start_ms: int, end_ms: int) -> list[Series]:
        return await anyio.to_thread.run_sync(self.raw_sync, match, start_ms, end_ms, limiter=self._limiter)

    async def ready(self) -> None:
        return None

    async def aclose(self) -> None:
        return None  # the source belongs to whoever built it (close the SampleStore there)
