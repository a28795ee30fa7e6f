"""The backend protocol every TSDB adapter implements."""

from __future__ import annotations

from typing import Protocol

from gpulens.domain.models import RangeQuery, Series


class MetricsBackend(Protocol):
    name: str  # used in error messages ("Prometheus at http://...")

    async def query_range(self, query: RangeQuery) -> list[Series]:
        """Evaluate one expression on one grid chunk; raise BackendError subclasses on failure."""
        ...

    async def query(self, expr: str, time_ms: int) -> list[Series]:
        """Evaluate one expression at one instant: each series holds one sample (a scalar: no labels)."""
        ...

    async def series_labels(self, match: str, label: str, start_ms: int, end_ms: int) -> list[str]:
        """Distinct values of `label` over series matching `match` in the time range."""
        ...

    async def ready(self) -> None:
        """Return when the backend answers queries; raise BackendError otherwise."""
        ...

    async def aclose(self) -> None: ...
