"""The backend protocol every TSDB adapter implements."""

from __future__ import annotations

from typing import Protocol

from gpulens.domain.models import RangeQuery, Series


class MetricsBackend(Protocol):
    name: str  # for logs and cache keys; clients only ever see "the metrics backend"

    async def query_range(self, query: RangeQuery) -> list[Series]:
        """Evaluate one expression on one grid chunk; raise BackendError subclasses on failure."""
        ...

    async def query(self, expr: str, time_ms: int) -> list[Series]:
        """Evaluate one expression at one instant: each series holds one sample (a scalar: no labels)."""
        ...

    async def series_labels(self, match: str, label: str, start_ms: int, end_ms: int) -> list[str]:
        """Distinct values of `label` over series matching `match` in the time range."""
        ...

    async def series(self, match: str, start_ms: int, end_ms: int) -> list[dict[str, str]]:
        """Label sets (with `__name__`) of the series matching `match` that have samples in the range."""
        ...

    async def query_raw(self, match: str, start_ms: int, end_ms: int) -> list[Series]:
        """Every raw sample of every series matching the selector `match` in [start_ms, end_ms], each
        series with all of its labels (`__name__` included) and its samples as Prometheus' JSON has
        them: [unix seconds, "value as text"], in ascending time (what gpulens' archive copies)."""
        ...

    async def ready(self) -> None:
        """Return when the backend answers queries; raise BackendError otherwise."""
        ...

    async def aclose(self) -> None: ...
