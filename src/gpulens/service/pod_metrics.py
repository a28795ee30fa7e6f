"""Run:ai pod metrics: resolve the pod, plan each metricType, fetch them concurrently, shape.

Each metricType succeeds or fails on its own, so the API can answer 207 with the ones that worked.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from typing import Any

import anyio

from gpulens.backends.base import MetricsBackend
from gpulens.domain import catalog as c
from gpulens.domain import limits
from gpulens.domain.catalog import Kind, PodForm, PodMetricDef
from gpulens.domain.errors import BackendError, InvalidRequest
from gpulens.domain.models import Principal, RangeQuery, Series, Window
from gpulens.domain.timeparse import datetime_to_ms, ms_to_datetime
from gpulens.domain.workloads import Pod, Workload
from gpulens.planning.hosts import rate_window_ms
from gpulens.planning.pods import (
    DCGM_FORMS,
    QUANTILE_LABEL,
    PodLayout,
    PodPlanOptions,
    PodQuery,
    PodTarget,
    collapse_key,
    derive_pod_layout,
    histogram_sources,
    host_read_bounds,
    interval_ms,
    layout_matches,
    plan_pod_metric,
    pod_target,
    sample_grid,
)
from gpulens.planning.promql import rename
from gpulens.service.archived import ArchiveLookup
from gpulens.service.cache import TtlCache
from gpulens.service.workloads import WorkloadService
from gpulens.shaping.merge import single
from gpulens.shaping.pod_gpus import gpu_series, pod_aggregate
from gpulens.shaping.runai import BucketPoint, Points, bucket_counts, counts, gpu_sort_key, per_gpu, points

log = logging.getLogger(__name__)
LOOKBACK_MS = c.LOOKBACK_MS
LAYOUT_TTL_S = 60.0
LAYOUT_QUANTUM_MS = 600_000  # pod layouts are looked up over whole 10-minute spans
_LAST_MS = 253_402_300_799_000  # 9999-12-31T23:59:59Z, the last time a datetime holds


def _datetime(ms: int) -> datetime:
    return ms_to_datetime(min(max(ms, 0), _LAST_MS))


@dataclass(slots=True)
class TypeResult:
    metric: PodMetricDef
    measurements: list[tuple[dict[str, str] | None, Points]] = field(default_factory=list)
    histogram: list[BucketPoint] = field(default_factory=list)
    error: BackendError | None = None
    disabled: bool = False  # advanced metric while the flag is off

    @property
    def ok(self) -> bool:
        return self.error is None and not self.disabled


@dataclass(frozen=True, slots=True)
class PodMetricsAnswer:
    workload: Workload
    pods: tuple[Pod, ...]  # the pod asked for, or every pod of the workload
    grid: Window
    results: list[TypeResult]


class PodMetricsService:
    def __init__(
        self,
        workloads: WorkloadService,
        backend: MetricsBackend,
        options: PodPlanOptions,
        *,
        advanced_enabled: bool = True,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        archives: ArchiveLookup | None = None,
        max_pods_per_query: int = limits.PODS_PER_QUERY_DEFAULT,
    ) -> None:
        self.workloads = workloads
        self.max_pods_per_query = max_pods_per_query
        self.backend = backend
        self.archives = archives
        self.options = options
        self.advanced_enabled = advanced_enabled
        self.clock = clock
        # (layout, the time up to which its look-ups saw the backend), by pods and widened range
        self._layouts: TtlCache[tuple[object, ...], tuple[PodLayout, int]] = TtlCache(LAYOUT_TTL_S)

    def caches(self) -> dict[str, TtlCache[Any, Any]]:
        """The look-up caches by name (for gpulens' own metrics)."""
        return {"pod_layouts": self._layouts}

    async def pod_metrics(
        self,
        principal: Principal,
        workload_id: str,
        pod_id: str,
        metrics: Sequence[PodMetricDef],
        start_ms: int,
        end_ms: int,
        samples: int,
    ) -> PodMetricsAnswer:
        workload, pod = await self.resolve_pod(principal, workload_id, pod_id, start_ms, end_ms)
        return await self.answer(workload, (pod,), metrics, start_ms, end_ms, samples)

    async def resolve_pod(
        self, principal: Principal, workload_id: str, pod_id: str, start_ms: int, end_ms: int
    ) -> tuple[Workload, Pod]:
        """The workload and pod a read of [start, end] is about, if the caller may see them (an end
        before the start is refused first). A route resolves once and hands the pod to `answer`."""
        if end_ms < start_ms:
            raise InvalidRequest("end must not be before start")
        return await self.workloads.get_pod_for(principal, workload_id, pod_id, recent=True)

    async def workload_metrics(
        self,
        principal: Principal,
        workload_id: str,
        metrics: Sequence[PodMetricDef],
        start_ms: int,
        end_ms: int,
        samples: int,
    ) -> PodMetricsAnswer:
        """The workload's metricTypes over its pods (a distributed job's workers together): those
        that can have samples in the window (`workload_pods`)."""
        workload, pods = await self.resolve_workload(principal, workload_id, start_ms, end_ms, samples)
        return await self.answer(workload, pods, metrics, start_ms, end_ms, samples)

    async def resolve_workload(
        self, principal: Principal, workload_id: str, start_ms: int, end_ms: int, samples: int
    ) -> tuple[Workload, tuple[Pod, ...]]:
        """`workload_pods`, an end before the start refused first (as `resolve_pod`)."""
        if end_ms < start_ms:
            raise InvalidRequest("end must not be before start")
        return await self.workload_pods(principal, workload_id, start_ms, end_ms, samples)

    async def workload_pods(
        self, principal: Principal, workload_id: str, start_ms: int, end_ms: int, samples: int
    ) -> tuple[Workload, tuple[Pod, ...]]:
        """The workload (if the caller may see it) and its pods whose registered lifetime overlaps
        what a read of (start, end, samples) looks at: the grid, widened by the lookback and the
        longest range window before it and the lookback after it (slack for registered times).
        Not every pod a Deployment ever had: more than `max_pods_per_query` is refused (400) rather
        than sent as one giant selector; the read can be narrowed to a shorter window."""
        workload = await self.workloads.get_workload_for(principal, workload_id)
        grid = sample_grid(start_ms, end_ms, samples)
        interval = interval_ms(grid, start_ms, self.options.scrape_interval_ms)
        reach = LOOKBACK_MS + max(interval, rate_window_ms(interval, self.options.scrape_interval_ms))
        lookup = partial(
            self.workloads.registry.list_pods_overlapping,
            workload.workload_id,
            _datetime(grid.start_ms - reach),
            _datetime(grid.end_ms + LOOKBACK_MS),
            limit=self.max_pods_per_query,
        )
        pods, total = await anyio.to_thread.run_sync(lookup)
        if total > self.max_pods_per_query:
            raise InvalidRequest(
                f"the workload had {total} pods in this time range; at most {self.max_pods_per_query} "
                "are read in one request: ask for a shorter time range, or for one pod's metrics"
            )
        return workload, tuple(pods)

    async def answer(
        self,
        workload: Workload,
        pods: tuple[Pod, ...],
        metrics: Sequence[PodMetricDef],
        start_ms: int,
        end_ms: int,
        samples: int,
        ready: Callable[[TypeResult], None] | None = None,
    ) -> PodMetricsAnswer:
        """The metricTypes of resolved pods (`resolve_pod`, `resolve_workload`). `ready(result)` is
        called with each metricType's result (shaped, or failed) as soon as it is complete, while the
        others are still asked: a dialect encodes it then, not after the last answer."""
        if not self.advanced_enabled and all(m.advanced for m in metrics):
            raise InvalidRequest("Advanced GPU metrics are disabled")
        # a Slurm job's GPUs are read by host and index: only while its pods lived are they its own
        lo, hi = host_read_bounds(pods, start_ms, end_ms, datetime_to_ms(self.clock()))
        grid = sample_grid(lo, hi, samples) if lo <= hi else sample_grid(start_ms, end_ms, samples)
        interval = interval_ms(grid, lo, self.options.scrape_interval_ms)
        if not pods or hi < lo:  # no pods yet, or none alive in the window: no values
            return PodMetricsAnswer(workload, pods, grid, [TypeResult(m) for m in metrics])
        target = pod_target(pods)
        backend = await self.backend_for(pods)
        layout = await self._layout(backend, target, metrics, grid)
        plans = [self._plan(m, layout, target, grid, interval) for m in metrics]
        # a metricType and its _PER_GPU twin read the same GPU series: each query is sent once, and
        # each metricType is shaped as soon as its answers are in, while the others are still asked
        distinct = {q.expr: q for queries in plans if queries is not None for q in queries}
        answers = {expr: asyncio.ensure_future(self._fetch(backend, q)) for expr, q in distinct.items()}
        gpus = GpuSeries(collapse_key(target, self.options.host_labels))
        known = known_gpus(pods)

        async def complete(metric: PodMetricDef, queries: list[PodQuery] | None) -> TypeResult:
            result = await self._result(metric, queries, answers, grid, gpus)
            if result.ok and metric.per_gpu:
                result.measurements = with_every_gpu(result.measurements, known)
            if ready is not None:
                ready(result)
            return result

        try:
            results = await asyncio.gather(*(complete(m, q) for m, q in zip(metrics, plans, strict=True)))
        finally:
            for task in answers.values():  # none left running when the request ends early
                task.cancel()
                if task.done() and not task.cancelled():
                    task.exception()  # retrieved: a failure nobody awaited is not logged as lost
        return PodMetricsAnswer(workload, pods, grid, list(results))

    async def backend_for(self, pods: Sequence[Pod]) -> MetricsBackend:
        """The archive's backend when every pod is archived; else the live one."""
        if self.archives is not None:
            archived = await self.archives.for_pods(pods)
            if archived is not None:
                return archived
        return self.backend

    async def _layout(
        self, backend: MetricsBackend, target: PodTarget, metrics: Sequence[PodMetricDef], grid: Window
    ) -> PodLayout:
        """Which spellings, sources and histogram names the pods have: series look-ups over the
        window widened outward to LAYOUT_QUANTUM_MS boundaries, cached a minute under that range.
        A wider range finds a superset (the plan is conservative, its answer the same), and a client
        polling a moving window ("the last 24 h" every 10 s) keeps hitting. A window reaching past
        the moment of a look-up reuses it for one scrape interval after that moment: a series
        that appears later is looked for again within a scrape."""
        lo, hi = layout_range(grid)
        key = (backend.name, target, lo, hi, tuple(m.type for m in metrics))
        slack = self.options.scrape_interval_ms

        async def load() -> tuple[PodLayout, int]:
            seen_until = min(hi, datetime_to_ms(self.clock()))  # what the look-ups can have seen
            lookups = layout_matches(target, metrics, self.options)
            found = await asyncio.gather(*(backend.series(match, lo, hi) for _, match in lookups))
            layout = derive_pod_layout(
                metrics,
                [(sp, f) for (sp, _), f in zip(lookups, found, strict=True)],
                self.options,
            )
            return layout, seen_until

        layout, _ = await self._layouts.get_or_load(
            key, load, valid=lambda kept: grid.end_ms <= kept[1] + slack
        )
        return layout

    def _plan(
        self, metric: PodMetricDef, layout: PodLayout, target: PodTarget, grid: Window, interval: int
    ) -> list[PodQuery] | None:
        """The metricType's queries on the pods' layout; None for an advanced one while disabled."""
        if metric.advanced and not self.advanced_enabled:
            return None
        hist_series = None
        if metric.form in (PodForm.APP_HISTOGRAM, PodForm.APP_PERCENTILES):
            candidates = [rename(n, self.options.metric_names) for n in histogram_sources(metric)]
            hist_series = next((n for n in candidates if n in layout.present), None)
        return plan_pod_metric(metric, target, grid, interval, self.options, hist_series, layout)

    async def _fetch(self, backend: MetricsBackend, query: PodQuery) -> list[Series] | BackendError:
        try:
            return await backend.query_range(RangeQuery(query.expr, query.window))
        except BackendError as exc:
            return exc

    async def _result(
        self,
        metric: PodMetricDef,
        queries: list[PodQuery] | None,
        answers: Mapping[str, asyncio.Future[list[Series] | BackendError]],
        grid: Window,
        gpus: GpuSeries,
    ) -> TypeResult:
        """The metricType shaped from its queries' answers; failed with the first failure among them."""
        result = TypeResult(metric)
        if queries is None:
            result.disabled = True
            return result
        found: list[tuple[PodQuery, list[Series]]] = []
        for query in queries:
            answer = await answers[query.expr]
            if isinstance(answer, BackendError):
                log.warning("metricType %s failed: %s", metric.type, answer)
                result.error = answer
                return result
            found.append((query, answer))
        if metric.form in DCGM_FORMS:
            series = gpus.of(found)
            if metric.per_gpu:
                result.measurements = [(labels, pts) for labels, pts in per_gpu(series, grid)]
            else:
                result.measurements = [(None, pod_aggregate(series, metric.agg, grid))]
            return result
        self._shape(result, grid, found)
        return result

    def _shape(self, result: TypeResult, grid: Window, answers: list[tuple[PodQuery, list[Series]]]) -> None:
        metric = result.metric
        if metric.kind is Kind.HISTOGRAM:
            for _, series in answers:
                result.histogram = bucket_counts(series, grid)
            return
        if metric.kind is Kind.PERCENTILES:
            by_time: dict[int, dict[str, str]] = {}
            for _, series in answers:
                for one in series:
                    name = one.labels.get(QUANTILE_LABEL, "")
                    found = points(one.samples, grid)
                    for ms, value in zip(found.times, found.values, strict=True):
                        by_time.setdefault(ms, {})[name] = value
            wanted = [name for name, _ in c.PERCENTILES]
            result.histogram = [
                BucketPoint(t, {k: d[k] for k in wanted})
                for t, d in sorted(by_time.items())
                if all(k in d for k in wanted)
            ]
            return
        if metric.form is PodForm.APP_INCREASE:
            chosen = Points()
            for _, series in answers:  # the first source with series wins (NIM 1.x, then vLLM)
                if series:
                    chosen = counts(series, grid)
                    break
            result.measurements = [(None, chosen)]
            return
        if metric.per_gpu:
            series = answers[0][1] if answers else []
            result.measurements = [(labels, pts) for labels, pts in per_gpu(series, grid)]
            return
        series = answers[0][1] if answers else []
        result.measurements = [(None, points(single(series), grid))]


class GpuSeries:
    """One series per GPU of the DCGM answers of a read (`gpu_series`), made once for the queries of
    a metricType and its _PER_GPU twin."""

    def __init__(self, key: tuple[str, ...]) -> None:
        self.key = key
        self._made: dict[tuple[str, ...], list[Series]] = {}

    def of(self, found: Sequence[tuple[PodQuery, list[Series]]]) -> list[Series]:
        exprs = tuple(q.expr for q, _ in found)
        if exprs not in self._made:
            self._made[exprs] = gpu_series([series for _, series in found], self.key)
        return self._made[exprs]


def layout_range(grid: Window) -> tuple[int, int]:
    """What a pod layout's look-ups cover for a read on `grid`: from the lookback before its start to
    its end, widened outward to LAYOUT_QUANTUM_MS boundaries (the same range for nearby windows)."""
    q = LAYOUT_QUANTUM_MS
    return (grid.start_ms - LOOKBACK_MS) // q * q, -(-grid.end_ms // q) * q


def known_gpus(pods: Sequence[Pod]) -> list[str]:
    """The GPU indices the registry lists for the pods (UUIDs are not index labels)."""
    return sorted({g for p in pods for g in p.gpus if g.isdigit()}, key=int)


def with_every_gpu(
    measurements: list[tuple[dict[str, str] | None, Points]], known: Sequence[str]
) -> list[tuple[dict[str, str] | None, Points]]:
    """One measurement per GPU of the pod even without data (statements 15, 16, 19): the registered
    GPUs missing from the answer get empty values; with none known, one unlabelled empty one."""
    seen = {labels.get(c.RUNAI_LABEL_GPU) for labels, _ in measurements if labels is not None}
    filled = measurements + [({c.RUNAI_LABEL_GPU: g}, Points()) for g in known if g not in seen]
    if not filled:
        return [(None, Points())]
    return sorted(filled, key=lambda m: gpu_sort_key(m[0] or {}))
