"""Execution summary: the 12 Lyceum series at the scrape interval, then stats, energy, cost and findings.

The series come through `MetricsService.execution_metrics` (same look-up, tenant rules, backend and
archive choice as the metrics route) at step = the scrape interval, widened to a multiple of it only
when the window would exceed the per-series point limit.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from gpulens.domain import catalog as c
from gpulens.domain.errors import InvalidRequest
from gpulens.domain.models import Execution, Principal, RangeQuery, Sample, Window
from gpulens.domain.timeparse import datetime_to_ms
from gpulens.planning.chunking import chunks
from gpulens.planning.hosts import HostTarget, plan_host
from gpulens.planning.promql import eq, rename, selector
from gpulens.service.checks import run_sync
from gpulens.service.metrics import MetricsService
from gpulens.shaping.insights import Finding, Point, RunInfo, findings
from gpulens.shaping.merge import single
from gpulens.shaping.usage import Cost, Energy, Prices, SeriesStats, cost, energy, parse_prices, series_stats

_PRICES: dict[Path, tuple[int, Prices]] = {}  # path -> (mtime_ns, parsed)
# the series fetched per GPU too (for GPUs unused while others work), and for at most this many GPUs
PER_GPU_KEYS = ("gpuUtilizationPercent", "gpuMemoryUtilizationPercent")
MAX_PER_GPU = 16


def load_prices(path: Path) -> Prices:
    """The prices file, parsed again only when it changed."""
    try:
        mtime = path.stat().st_mtime_ns
        cached = _PRICES.get(path)
        if cached is not None and cached[0] == mtime:
            return cached[1]
        prices = parse_prices(path.read_text())
    except (OSError, ValueError) as exc:
        raise InvalidRequest(f"the prices file (GPULENS_PRICES) cannot be used: {exc}") from None
    _PRICES[path] = (mtime, prices)
    return prices


@dataclass(frozen=True, slots=True)
class ExecutionSummary:
    execution: Execution
    window: Window
    gpu_count: int
    stats: dict[str, SeriesStats]  # by Lyceum key
    energy: Energy | None
    cost: Cost | None
    findings: list[Finding]


class SummaryService:
    def __init__(
        self, metrics: MetricsService, prices: Path | None = None, carbon_g_per_kwh: float | None = None
    ) -> None:
        self.metrics = metrics
        self.prices = prices
        self.carbon = carbon_g_per_kwh

    def step_for(self, span_ms: int) -> int:
        """The scrape interval, or the smallest multiple of it within the per-series point limit."""
        interval = self.metrics.options.scrape_interval_ms
        limit = self.metrics.limits.max_points_per_series
        need = math.ceil(span_ms / max(1, limit - 1) / interval) if span_ms > 0 else 1
        return interval * max(1, need)

    async def summary(
        self, principal: Principal, execution_id: str, start_ms: int | None, end_ms: int | None
    ) -> ExecutionSummary:
        execution = await self.metrics.executions.get_for(principal, execution_id)
        step = self.metrics.options.scrape_interval_ms
        if execution.start_time is not None:
            probe = self.metrics.effective_window(execution, start_ms, end_ms, step)
            step = self.step_for(probe.end_ms - probe.start_ms)
        answer = await self.metrics.execution_metrics(principal, execution_id, start_ms, end_ms, step)
        execution, window = answer.execution, answer.window
        keys = [m.lyceum for m in answer.metrics]
        series: dict[str, list[Point]] = {k: [] for k in keys}
        try:
            async for index, samples in answer.chunks():
                series[keys[index]].extend(points(samples, window))
        finally:
            answer.cancel()

        host_gpus = None if execution.gpus else await self._host_gpus(execution, window)
        gpu_ids = execution.gpus or tuple(gpu for gpu, instance in host_gpus or () if gpu and not instance)
        gpu_count = len(execution.gpus) or len(host_gpus or ())
        per_gpu = None
        if 1 < gpu_count <= MAX_PER_GPU and len(gpu_ids) == gpu_count:
            per_gpu = await self._per_gpu(execution, window, gpu_ids)
        run = RunInfo(
            window.start_ms,
            window.end_ms,
            step,
            execution.status.value,
            datetime_to_ms(execution.end_time) if execution.end_time else None,
            execution.gpus,
            gpu_count,
        )
        price = self._price(execution)
        # pure, but seconds of CPU for a month at 15 s: off the event loop
        return await run_sync(self._compute, execution, window, run, series, per_gpu, price)

    def _compute(
        self,
        execution: Execution,
        window: Window,
        run: RunInfo,
        series: dict[str, list[Point]],
        per_gpu: dict[str, dict[str, list[Point]]] | None,
        price: tuple[str, float] | None,
    ) -> ExecutionSummary:
        step = run.interval_ms
        found = findings(series, run, per_gpu=per_gpu)
        stats = {
            k: series_stats(series.get(k, []), window.start_ms, window.end_ms, step) for k in c.LYCEUM_KEYS
        }
        used = energy(series.get("gpuPowerWatt", []), step, self.carbon)
        money = None
        if price is not None and run.gpu_count > 0:
            money = cost(
                start_ms=window.start_ms,
                end_ms=window.end_ms,
                interval_ms=step,
                gpu_count=run.gpu_count,
                price=price[1],
                currency=price[0],
                found=found,
                utilization=series.get("gpuUtilizationPercent", []),
            )
        return ExecutionSummary(execution, window, run.gpu_count, stats, used, money, found)

    def _price(self, execution: Execution) -> tuple[str, float] | None:
        if self.prices is None or not execution.hardware_profile:
            return None
        prices = load_prices(self.prices)
        price = prices.gpu_hour.get(execution.hardware_profile)
        return None if price is None else (prices.currency, price)

    async def _host_gpus(self, execution: Execution, window: Window) -> list[tuple[str, str]]:
        """(gpu, GPU_I_ID) of the host's GPUs (or MIG instances) with a utilization series in the window."""
        assert execution.hostname
        backend = await self.metrics.backend_for(execution)
        options = self.metrics.options
        seen: set[tuple[str, str]] = set()
        for name in (c.DCGM_GPU_UTIL, c.DCGM_GR_ENGINE_ACTIVE):
            for label in options.host_labels:
                match = selector(rename(name, options.metric_names), [eq(label, execution.hostname)])
                for labels in await backend.series(match, window.start_ms, window.end_ms):
                    seen.add((labels.get(c.LABEL_GPU, ""), labels.get(c.LABEL_GPU_INSTANCE, "")))
            if seen:
                break
        return sorted(seen, key=lambda g: (len(g[0]), g))

    async def _per_gpu(
        self, execution: Execution, window: Window, gpus: Sequence[str]
    ) -> dict[str, dict[str, list[Point]]]:
        """Utilization and FB % of each GPU alone, planned as the metrics route plans a host's GPUs."""
        assert execution.hostname
        backend = await self.metrics.backend_for(execution)
        metrics = [m for m in c.LYCEUM_METRICS if m.lyceum in PER_GPU_KEYS]
        options, limits = self.metrics.options, self.metrics.limits

        async def one(gpu: str) -> dict[str, list[Point]]:
            assert execution.hostname
            target = HostTarget(execution.hostname, (gpu,))
            layout = await self.metrics.layouts.layout(backend, metrics, target, window, window.step_ms)
            out: dict[str, list[Point]] = {}
            for planned in plan_host(metrics, target, window.step_ms, options, layout):
                got = out.setdefault(planned.metric.lyceum, [])
                if planned.expr is None:
                    continue
                for part in chunks(window, limits.max_points_per_query):
                    got.extend(
                        points(single(await backend.query_range(RangeQuery(planned.expr, part))), window)
                    )
            return out

        found = await asyncio.gather(*(one(gpu) for gpu in gpus))
        return dict(zip(gpus, found, strict=True))


def points(samples: Sequence[Sample], window: Window) -> list[Point]:
    """(ms, value) of the finite samples inside the window."""
    out: list[Point] = []
    for t, v in samples:
        ms, value = round(float(t) * 1000), float(v)
        if window.start_ms <= ms <= window.end_ms and math.isfinite(value):
            out.append((ms, value))
    return out
