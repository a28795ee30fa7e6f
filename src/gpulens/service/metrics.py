"""Execution metrics: resolve the execution, plan, fetch chunks in order, hand series to a dialect."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Generic, TypeVar

from gpulens.backends.base import MetricsBackend
from gpulens.domain import catalog as c
from gpulens.domain.catalog import MetricDef
from gpulens.domain.errors import InvalidRequest, NotFound
from gpulens.domain.models import Execution, RangeQuery, Sample, Window
from gpulens.domain.timeparse import datetime_to_ms
from gpulens.planning.chunking import check_size, chunks
from gpulens.planning.hosts import HostPlanOptions, HostTarget, plan_host
from gpulens.planning.promql import eq, rename, selector
from gpulens.planning.segments import runs_per_item
from gpulens.service.archived import ArchiveLookup
from gpulens.service.cache import TtlCache
from gpulens.service.executions import ExecutionService
from gpulens.service.fetch import OrderedFetch
from gpulens.service.layouts import HostLayouts, per_piece
from gpulens.shaping.merge import single

LOOKBACK_MS = c.LOOKBACK_MS


@dataclass(frozen=True, slots=True)
class MetricsLimits:
    max_points_per_query: int = 11_000
    max_points_per_series: int = 200_000
    in_flight: int = 12


T = TypeVar("T")
Shape = Callable[[Window, Sequence[Sample]], T]


def as_is(window: Window, samples: Sequence[Sample]) -> Sequence[Sample]:
    return samples


@dataclass(slots=True)
class ExecutionMetrics(Generic[T]):
    """An answer being fetched: iterate `chunks()` to receive (metric index, shaped chunk) in order."""

    execution: Execution
    window: Window
    metrics: Sequence[MetricDef]
    _fetch: OrderedFetch[tuple[int, RangeQuery | None], tuple[int, T]]

    @property
    def in_hand(self) -> bool:
        """Every chunk has arrived already (a window of one batch of queries)."""
        return self._fetch.one_batch

    async def chunks(self) -> AsyncIterator[tuple[int, T]]:
        async for item in self._fetch.results():
            yield item

    def cancel(self) -> None:
        self._fetch.cancel()


class MetricsService:
    def __init__(
        self,
        executions: ExecutionService,
        backend: MetricsBackend,
        options: HostPlanOptions,
        limits: MetricsLimits,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        archives: ArchiveLookup | None = None,
    ) -> None:
        self.executions = executions
        self.backend = backend
        self.archives = archives
        self.options = options
        self.limits = limits
        self.clock = clock
        self._instances: TtlCache[tuple[str, ...], tuple[str, ...]] = TtlCache(60.0)
        self.layouts = HostLayouts(options)

    def caches(self) -> dict[str, TtlCache[Any, Any]]:
        """The look-up caches by name (for gpulens' own metrics)."""
        return {
            "host_layouts": self.layouts.cache,
            "host_lookups": self.layouts.looked_cache,
            "host_layout_pieces": self.layouts.piece_cache,
            "node_instances": self._instances,
        }

    async def read(
        self,
        execution: Execution,
        start_ms: int | None,
        end_ms: int | None,
        step_ms: int,
        shape: Shape[T],
        metrics: Sequence[MetricDef] = c.LYCEUM_METRICS,
        chunk_points: int | None = None,
    ) -> ExecutionMetrics[T]:
        """The metrics of an execution the caller was found to see (`ExecutionService.get_for`, which a
        route that needs the execution itself too calls once). Each chunk as `shape(window, samples)`
        makes it, as soon as it arrives (a dialect encodes its answer while the backend still computes
        the rest); `chunk_points`: at most this many points a query (fewer than the backend's limit:
        a long summary's smaller steps)."""
        if execution.start_time is None or not execution.hostname:
            raise NotFound("No metrics available for this execution yet")
        window = self.effective_window(execution, start_ms, end_ms, step_ms)
        check_size(window, self.limits.max_points_per_series)
        backend = await self.backend_for(execution)

        instances: tuple[str, ...] = ()
        if self.options.node_match in ("auto", "nodename"):
            instances = await self.node_instances(backend, execution.hostname, window)
        target = HostTarget(execution.hostname, execution.gpus, instances)
        leaves = await self.layouts.leaves(backend, metrics, target, window, step_ms)
        # each metric asked per run of pieces that share its expression: guards only where needed
        plans = per_piece(
            leaves, lambda layout: [p.expr for p in plan_host(metrics, target, step_ms, self.options, layout)]
        )
        per_query = min(chunk_points or self.limits.max_points_per_query, self.limits.max_points_per_query)
        jobs = [
            (i, None if run.value is None else RangeQuery(run.value, w))
            for i, runs in enumerate(runs_per_item(window, plans))
            for run in runs
            for w in chunks(run.window, per_query)
        ]

        async def run(job: tuple[int, RangeQuery | None]) -> tuple[int, T]:
            i, query = job
            if query is None:  # no source series exists: an empty series, nothing to ask
                return i, shape(window, [])
            return i, shape(window, single(await backend.query_range(query)))

        # chunks started while those not yet handed on hold at most twice the backend's concurrency
        # in full chunks' points: a slow chunk at the head of the line does not leave the backend
        # idle, and a read of many short pieces (a day around a restart: ~30) starts all of them at
        # once, as a person's fan-out does, not its last few when the first are handed on; the
        # costliest (host CPU's rate) first, so it is not the read's tail: started with the first
        # chunks wherever it stands (the last metric), held until its turn
        def costly(job: tuple[int, RangeQuery | None]) -> bool:
            return job[1] is not None and metrics[job[0]].form.reads_ranges

        fetch = OrderedFetch(
            jobs,
            run,
            self.limits.in_flight,
            ahead=2 * self.limits.in_flight * per_query,
            weight=lambda job: 1 if job[1] is None else job[1].window.points,
            rank=lambda job: 0 if costly(job) else 1,
            early=costly,
        )
        await fetch.prime()
        return ExecutionMetrics(execution, window, list(metrics), fetch)

    async def backend_for(self, execution: Execution) -> MetricsBackend:
        """The archive's backend for a finished, archived execution; else the live one."""
        if self.archives is not None:
            archived = await self.archives.for_execution(execution)
            if archived is not None:
                return archived
        return self.backend

    def effective_window(
        self, execution: Execution, start_ms: int | None, end_ms: int | None, step_ms: int
    ) -> Window:
        """Defaults to the whole execution; explicit bounds are clamped to it (statements 7, 11, 13)."""
        assert execution.start_time is not None
        if start_ms is not None and end_ms is not None and end_ms < start_ms:
            raise InvalidRequest("end timestamp must not be before start time")
        lo = datetime_to_ms(execution.start_time)
        hi = datetime_to_ms(execution.end_time) if execution.end_time else datetime_to_ms(self.clock())
        hi = max(hi, lo)
        start = lo if start_ms is None else min(max(start_ms, lo), hi)
        end = hi if end_ms is None else min(max(end_ms, lo), hi)
        if end < start:
            raise InvalidRequest("end timestamp must not be before start time")
        return Window(start, end, step_ms)

    async def node_instances(self, backend: MetricsBackend, hostname: str, window: Window) -> tuple[str, ...]:
        """node-exporter `instance`s whose node_uname_info names this host (cached for a minute)."""
        key = (backend.name, hostname, str(window.start_ms // 3_600_000), str(window.end_ms // 3_600_000))
        match = selector(
            rename(c.NODE_UNAME_INFO, self.options.metric_names), [eq(c.LABEL_NODENAME, hostname)]
        )

        async def load() -> tuple[str, ...]:
            return tuple(
                await backend.series_labels(
                    match, c.LABEL_INSTANCE, window.start_ms - LOOKBACK_MS, window.end_ms
                )
            )

        return await self._instances.get_or_load(key, load)
