"""Execution summary: the 12 Lyceum series at the scrape interval, then stats, energy, cost and findings.

The series come through `MetricsService.execution_metrics` (same look-up, tenant rules, backend and
archive choice as the metrics route) at step = the scrape interval, widened to a multiple of it only
when the window would exceed the per-series point limit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from gpulens.domain import catalog as c
from gpulens.domain.errors import InvalidRequest
from gpulens.domain.models import Execution, Principal, Window
from gpulens.domain.timeparse import datetime_to_ms
from gpulens.planning.promql import eq, rename, selector
from gpulens.service.metrics import MetricsService
from gpulens.shaping.insights import Finding, Point, RunInfo, findings
from gpulens.shaping.usage import Cost, Energy, Prices, SeriesStats, cost, energy, parse_prices, series_stats

_PRICES: dict[Path, tuple[int, Prices]] = {}  # path -> (mtime_ns, parsed)


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
                out = series[keys[index]]
                for t, v in samples:
                    ms, value = round(float(t) * 1000), float(v)
                    if window.start_ms <= ms <= window.end_ms and math.isfinite(value):
                        out.append((ms, value))
        finally:
            answer.cancel()

        gpu_count = len(execution.gpus) or await self._host_gpus(execution, window)
        run = RunInfo(
            window.start_ms,
            window.end_ms,
            step,
            execution.status.value,
            datetime_to_ms(execution.end_time) if execution.end_time else None,
            execution.gpus,
            gpu_count,
        )
        found = findings(series, run)
        stats = {
            k: series_stats(series.get(k, []), window.start_ms, window.end_ms, step) for k in c.LYCEUM_KEYS
        }
        used = energy(series.get("gpuPowerWatt", []), step, self.carbon)
        price = self._price(execution)
        money = None
        if price is not None and gpu_count > 0:
            money = cost(
                start_ms=window.start_ms,
                end_ms=window.end_ms,
                interval_ms=step,
                gpu_count=gpu_count,
                price=price[1],
                currency=price[0],
                found=found,
                utilization=series.get("gpuUtilizationPercent", []),
            )
        return ExecutionSummary(execution, window, gpu_count, stats, used, money, found)

    def _price(self, execution: Execution) -> tuple[str, float] | None:
        if self.prices is None or not execution.hardware_profile:
            return None
        prices = load_prices(self.prices)
        price = prices.gpu_hour.get(execution.hardware_profile)
        return None if price is None else (prices.currency, price)

    async def _host_gpus(self, execution: Execution, window: Window) -> int:
        """GPUs (or MIG instances) of the host with a utilization series in the window."""
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
        return len(seen)
