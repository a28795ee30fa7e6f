"""Execution summary: the 12 Lyceum series at the scrape interval, then stats, energy, cost and findings.

The series come through `MetricsService.read` (same look-up, tenant rules, backend and
archive choice as the metrics route) at step = the scrape interval, widened to a multiple of it only
when the window would exceed the per-series point limit.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Collection, Mapping, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field, replace
from functools import partial
from operator import itemgetter
from pathlib import Path

import anyio
import numpy as np

from gpulens.domain import catalog as c
from gpulens.domain.catalog import InsightThresholds, MetricDef
from gpulens.domain.errors import InvalidRequest
from gpulens.domain.models import (
    Execution,
    GridPoints,
    GridSamples,
    Principal,
    RangeQuery,
    Sample,
    Series,
    Window,
)
from gpulens.domain.timeparse import datetime_to_ms
from gpulens.domain.usage import UsageSlice
from gpulens.planning.chunking import chunks, interval_step
from gpulens.planning.hosts import HostTarget, energy_counter_expr, plan_host
from gpulens.planning.promql import eq, rename, selector
from gpulens.planning.segments import Run, runs_per_item
from gpulens.service.export import GPU_METRICS
from gpulens.service.layouts import per_piece
from gpulens.service.metrics import ExecutionMetrics, MetricsService, as_is
from gpulens.service.priority import LOW, Priority
from gpulens.shaping.findings_core import MS_PER_HOUR
from gpulens.shaping.insights import DETECTOR_KEYS, Finding, RunInfo, Samples, findings, priced
from gpulens.shaping.usage import (
    Cost,
    Energy,
    GpuTime,
    Prices,
    SeriesStats,
    cost,
    energy,
    gpu_time,
    hourly,
    parse_prices,
    series_stats,
)

_PRICES: dict[Path, tuple[int, Prices]] = {}  # path -> (mtime_ns, parsed)
_COMPUTING = threading.Lock()  # the detectors of one summary at a time (the process')
# Each GPU's 9 series are read for at most this many GPUs, at the scrape interval up to this many points
# a series (about 45 h at 15 s; one backend query each), at the smallest multiple of it within them beyond.
MAX_PER_GPU = 16
PER_GPU_POINTS = 11_000
# The host's 12 series are read at the scrape interval up to this many points a series (a week at 15 s),
# at the smallest multiple of it within them beyond: what one summary holds and computes on is bounded
# by the window's points, not its length (35 days and a year cost the same; docs/operations.md).
SUMMARY_POINTS = 40_321  # a week at 15 s, both ends included
# A summary of more points than this a series at the scrape interval (45 h at 15 s) is computed at low
# priority: it steps aside while other requests are served (service/priority.py). Shorter ones are
# as cheap as a metrics read and are served as one.
LOW_PRIORITY_POINTS = 11_000
# ... and reads at most this many points a backend query: a query in flight when another request comes
# costs the backend (and the decoding) little (a year at 795 s: 18 days a query).
LOW_PRIORITY_CHUNK = 2_000
# What one summary may hold at its peak (traced: every Python object and numpy array it makes): the 12
# host series and each GPU's 9 at their point limits as arrays, the answers in flight, the detectors'
# work arrays. Measured (tests/service/test_summary_bounds.py, bench load): 17 MB with 2 GPUs, 38 MB
# with 8, 67 MB with 16, the same for 35 days and a year.
MEMORY_BASE_BYTES = 16 << 20
MEMORY_PER_GPU_BYTES = 4 << 20


def memory_bound(gpus: int) -> int:
    """The documented bound of one summary's memory (docs/operations.md): per GPU read (up to
    MAX_PER_GPU; beyond, none is read per GPU) 4 MiB more than the 16 MiB of the host's series."""
    return MEMORY_BASE_BYTES + MEMORY_PER_GPU_BYTES * (gpus if gpus <= MAX_PER_GPU else 0)


GPU_KEYS = tuple(m.lyceum for m in GPU_METRICS)
GPU_LABELS = (c.LABEL_GPU, c.LABEL_UUID)  # one per-GPU series per device (MIG instances folded)
FINDING_KEYS = ("gpuUtilizationPercent", "gpuMemoryUtilizationPercent")
# what the detectors read (shaping/insights.py): the live alerts' tail read asks for these only
DETECTOR_METRICS = tuple(m for m in c.LYCEUM_METRICS if m.lyceum in DETECTOR_KEYS)
FINDING_GPU_METRICS = tuple(m for m in GPU_METRICS if m.lyceum in FINDING_KEYS)


@dataclass(frozen=True, slots=True)
class LiveFindings:
    execution: Execution
    window: Window
    findings: list[Finding]


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
class GpuSummary:
    """One GPU of the execution: its 9 series' stats (at `step_ms`) and its energy."""

    gpu: str  # dcgm-exporter's index ("" when only the UUID is known)
    uuid: str
    step_ms: int
    stats: dict[str, SeriesStats]  # by Lyceum key, the GPU series only
    energy_kwh: float | None


@dataclass(frozen=True, slots=True)
class ExecutionSummary:
    execution: Execution
    window: Window
    gpu_count: int
    stats: dict[str, SeriesStats]  # by Lyceum key
    energy: Energy | None
    cost: Cost | None
    findings: list[Finding]  # with their impact, by severity then impact
    per_gpu: list[GpuSummary] = field(default_factory=list)
    gpu_time: GpuTime | None = None  # where the GPU-hours went (None: GPU count unknown)
    slices: list[UsageSlice] = field(default_factory=list)  # gpu_time and energy by UTC hour


class SummaryService:
    def __init__(
        self,
        metrics: MetricsService,
        prices: Path | None = None,
        carbon_g_per_kwh: float | None = None,
        priority: Priority | None = None,
    ) -> None:
        self.metrics = metrics
        self.prices = prices
        self.carbon = carbon_g_per_kwh
        self.priority = priority or Priority()  # the process' (the app's), or one of its own

    def step_for(self, span_ms: int) -> int:
        """The scrape interval, or the smallest multiple of it within SUMMARY_POINTS (and the
        per-series point limit)."""
        limit = min(SUMMARY_POINTS, self.metrics.limits.max_points_per_series)
        return interval_step(span_ms, self.metrics.options.scrape_interval_ms, limit)

    async def summary(
        self,
        principal: Principal,
        execution_id: str,
        start_ms: int | None,
        end_ms: int | None,
        thresholds: InsightThresholds = c.INSIGHT_THRESHOLDS,
        *,
        slices: bool = False,
    ) -> ExecutionSummary:
        """`thresholds`: the detectors' (live alerts shorten the minimum duration to a rule's `for`);
        `slices`: also cut its receipt by UTC hour (`ExecutionSummary.slices`, what is stored for the
        usage table; else empty). A window of more than LOW_PRIORITY_POINTS at the scrape interval is
        summarized at low priority (service/priority.py: it steps aside while other requests are
        served)."""
        execution = await self.metrics.executions.get_for(principal, execution_id)
        interval = step = self.metrics.options.scrape_interval_ms
        long = False
        if execution.start_time is not None:
            probe = self.metrics.effective_window(execution, start_ms, end_ms, step)
            step = self.step_for(probe.end_ms - probe.start_ms)
            long = (probe.end_ms - probe.start_ms) // interval > LOW_PRIORITY_POINTS
        with self.priority.low_priority() if long else nullcontext():
            return await self._summary(execution, start_ms, end_ms, step, thresholds, slices)

    async def _summary(
        self,
        execution: Execution,
        start_ms: int | None,
        end_ms: int | None,
        step: int,
        thresholds: InsightThresholds,
        slices: bool = False,
    ) -> ExecutionSummary:
        chunk = LOW_PRIORITY_CHUNK if LOW.get() else None
        answer = await self.metrics.read(execution, start_ms, end_ms, step, as_is, chunk_points=chunk)
        window = answer.window

        async def read_series() -> dict[str, Samples]:
            return await _series(answer)

        async def read_per_gpu() -> tuple[int, PerGpuSeries | None]:
            return await self._gpus(execution, window, GPU_METRICS, 1)

        async def read_energy() -> float | None:
            """mJ from DCGM's energy counter over the window (None when it is not exported)."""
            assert execution.hostname
            if window.end_ms <= window.start_ms:
                return None
            backend = await self.metrics.backend_for(execution)
            target = HostTarget(execution.hostname, execution.gpus)
            expr = energy_counter_expr(target, self.metrics.options, window.end_ms - window.start_ms)
            found = [one.samples[-1] for one in await backend.query(expr, window.end_ms) if one.samples]
            return float(found[0][1]) if found else None

        # all at once: the backend works on the per-GPU queries while gpulens reads the host series;
        # the first error is raised as it is (the other reads are cancelled and awaited)
        reads = (
            asyncio.ensure_future(read_series()),
            asyncio.ensure_future(read_per_gpu()),
            asyncio.ensure_future(read_energy()),
        )
        try:
            series, (gpu_count, per_gpu), counter_mj = await asyncio.gather(*reads)
        except BaseException:
            for task in reads:
                task.cancel()
            await asyncio.gather(*reads, return_exceptions=True)
            raise
        run = run_info(execution, window, step, gpu_count)
        price = self._price(execution)
        # pure, but up to a second of CPU for a month at 15 s: off the event loop. A request cancelled
        # meanwhile (its client went away) does not wait for it: the thread stops at its next step.
        stop = threading.Event()
        spent = self.priority.yielded()  # a long one steps aside for other requests (its budget)
        pause = partial(self.priority.pause_sync, spent) if spent is not None else None
        work = partial(
            self._compute,
            execution,
            window,
            run,
            series,
            per_gpu,
            price,
            counter_mj,
            stop,
            thresholds,
            pause,
            slices,
        )
        try:
            return await anyio.to_thread.run_sync(work, abandon_on_cancel=True)
        except BaseException:
            stop.set()
            raise

    async def live_findings(
        self,
        principal: Principal,
        execution_id: str,
        start_ms: int,
        end_ms: int,
        thresholds: InsightThresholds = c.INSIGHT_THRESHOLDS,
        kinds: Collection[str] | None = None,
    ) -> LiveFindings:
        """The findings of a running execution's tail, for live alerts: only the series the detectors
        read (the host's 8 of 12, each GPU's utilization and FB %), no energy, statistics or cost, at
        the scrape interval; the same findings `summary` gives on that window (`kinds`: only those
        the rules watch, as `findings` gives them)."""
        execution = await self.metrics.executions.get_for(principal, execution_id)
        step = self.metrics.options.scrape_interval_ms
        answer = await self.metrics.read(execution, start_ms, end_ms, step, as_is, DETECTOR_METRICS)
        window = answer.window
        # each GPU's series only where there are two or more (per-GPU findings compare GPUs)
        series, (gpu_count, per_gpu) = await asyncio.gather(
            _series(answer), self._gpus(execution, window, FINDING_GPU_METRICS, 2)
        )
        return live_result(execution, window, step, series, gpu_count, per_gpu, thresholds, kinds)

    def _compute(
        self,
        execution: Execution,
        window: Window,
        run: RunInfo,
        series: dict[str, Samples],
        per_gpu: PerGpuSeries | None,
        price: tuple[str, float] | None,
        counter_mj: float | None = None,
        stop: threading.Event | None = None,
        thresholds: InsightThresholds = c.INSIGHT_THRESHOLDS,
        pause: Callable[[], None] | None = None,
        with_slices: bool = False,
    ) -> ExecutionSummary:
        """The summary of the series read; raises Stopped between its steps once `stop` is set, and
        calls `pause` there (a low-priority summary waits while other requests are served)."""

        def step_done() -> None:
            if pause is not None:
                pause()
            if stop is not None and stop.is_set():
                raise Stopped

        step_done()
        step = run.interval_ms
        by_gpu = None
        if per_gpu is not None and len(per_gpu.series) > 1:
            by_gpu = {  # what the per-GPU findings read: utilization and FB %
                per_gpu.names.get(key, key[0] or key[1]): {k: s[k] for k in FINDING_KEYS if k in s}
                for key, s in per_gpu.series.items()
            }
        interval = per_gpu.step_ms if per_gpu else None
        # the long ones one at a time: they share one GIL with the event loop (service/priority.py)
        with _COMPUTING if pause is not None else nullcontext():
            step_done()  # (its client may have gone while it waited for the lock)
            found = findings(
                series, run, thresholds, per_gpu=by_gpu, per_gpu_interval_ms=interval, between=step_done
            )
        step_done()
        gpus = [] if per_gpu is None else per_gpu.summaries(window)
        step_done()
        stats = {
            k: series_stats(series.get(k, []), window.start_ms, window.end_ms, step) for k in c.LYCEUM_KEYS
        }
        step_done()
        used = energy(series.get("gpuPowerWatt", []), step, self.carbon, counter_mj)
        names = run.gpus or tuple(by_gpu or ())
        money, time = None, None
        if run.gpu_count > 0:
            time = gpu_time(
                start_ms=window.start_ms,
                end_ms=window.end_ms,
                interval_ms=step,
                gpu_count=run.gpu_count,
                found=found,
                gpus=names,
            )
        if price is not None and time is not None:
            money = cost(
                time,
                price=price[1],
                currency=price[0],
                utilization=series.get("gpuUtilizationPercent", []),
                interval_ms=step,
                gpu_count=run.gpu_count,
            )
        step_done()
        slices: list[UsageSlice] = []
        if with_slices and run.gpu_count > 0:
            slices = hourly(
                start_ms=window.start_ms,
                end_ms=window.end_ms,
                interval_ms=step,
                gpu_count=run.gpu_count,
                found=found,
                gpus=names,
                utilization=series.get("gpuUtilizationPercent", []),
                power=series.get("gpuPowerWatt", []),
            )
            if price is not None:
                slices = [replace(s, cost=s.gpu_ms / MS_PER_HOUR * price[1]) for s in slices]
        found = priced(found, None if price is None or run.gpu_count == 0 else price[1])
        return ExecutionSummary(
            execution, window, run.gpu_count, stats, used, money, found, gpus, time, slices
        )

    def _price(self, execution: Execution) -> tuple[str, float] | None:
        if self.prices is None or not execution.hardware_profile:
            return None
        prices = load_prices(self.prices)
        price = prices.gpu_hour.get(execution.hardware_profile)
        return None if price is None else (prices.currency, price)

    async def _gpus(
        self, execution: Execution, window: Window, metrics: Sequence[MetricDef], least: int
    ) -> tuple[int, PerGpuSeries | None]:
        """(how many GPUs the execution has, each GPU's `metrics` when there are `least` to
        MAX_PER_GPU of them)."""
        count = await self.gpu_count(execution, window)
        if not least <= count <= MAX_PER_GPU:
            return count, None
        return count, await self._per_gpu(execution, window, metrics)

    async def gpu_count(self, execution: Execution, window: Window) -> int:
        """How many GPUs the execution has: those registered, else the host's with a series."""
        if execution.gpus:
            return len(execution.gpus)
        return len(await self._host_gpus(execution, window))

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
        self, execution: Execution, window: Window, metrics: Sequence[MetricDef] = GPU_METRICS
    ) -> PerGpuSeries:
        """Each GPU's 9 series, at most PER_GPU_POINTS a series: one backend query per series giving
        every GPU of the execution (`plan_host` grouped by GPU and UUID, the host's own layout)."""
        assert execution.hostname
        grid = self.gpu_grid(window)
        step = grid.step_ms
        backend = await self.metrics.backend_for(execution)
        target = HostTarget(execution.hostname, execution.gpus)
        # guards only where the data is irregular: each metric per run of pieces sharing its plan
        leaves = await self.metrics.layouts.leaves(backend, metrics, target, grid, step)
        options = self.metrics.options
        plans = per_piece(
            leaves,
            lambda layout: [
                p.expr for p in plan_host(metrics, target, step, options, layout, group=GPU_LABELS)
            ],
        )
        size = LOW_PRIORITY_CHUNK if LOW.get() else PER_GPU_POINTS  # one query a run unless low priority
        asked = [
            (metric, Run(part, run.value))
            for metric, runs in zip(metrics, runs_per_item(grid, plans), strict=True)
            for run in runs
            if run.value is not None
            for part in chunks(run.window, size)
        ]

        async def read(expr: str, window: Window) -> dict[tuple[str, str], list[Samples]]:
            """One query's series as arrays, as soon as it is answered (the decoded answer is dropped
            then: what the summary holds of each GPU is 16 bytes a point)."""
            parts: dict[tuple[str, str], dict[str, list[Samples]]] = {}
            add_per_gpu(parts, "", await backend.query_range(RangeQuery(expr, window)), window)
            return {gpu: by_key[""] for gpu, by_key in parts.items()}

        answers = await asyncio.gather(*(read(run.value, run.window) for _, run in asked))
        joined: dict[tuple[str, str], dict[str, list[Samples]]] = {}
        for (metric, _), answer in zip(asked, answers, strict=True):  # runs in time order per metric
            for gpu, parts in answer.items():
                joined.setdefault(gpu, {}).setdefault(metric.lyceum, []).extend(parts)
        return per_gpu_series(execution, step, joined)

    def gpu_grid(self, window: Window) -> Window:
        """The per-GPU series' grid: the scrape interval, or the smallest multiple of it within
        PER_GPU_POINTS a series."""
        span = window.end_ms - window.start_ms
        step = interval_step(span, self.metrics.options.scrape_interval_ms, PER_GPU_POINTS)
        return Window(window.start_ms, window.start_ms + span // step * step, step)


def add_per_gpu(
    joined: dict[tuple[str, str], dict[str, list[Samples]]],
    key: str,
    answer: Sequence[Series],
    window: Window,
) -> None:
    """An answer of per-GPU series (grouped by GPU index and UUID) added to `joined` under `key`."""
    for one in answer:
        gpu = (one.labels.get(c.LABEL_GPU, ""), one.labels.get(c.LABEL_UUID, ""))
        joined.setdefault(gpu, {}).setdefault(key, []).append(points(one.samples, window))


def per_gpu_series(
    execution: Execution, step_ms: int, joined: Mapping[tuple[str, str], Mapping[str, Sequence[Samples]]]
) -> PerGpuSeries:
    """Each GPU's series (its runs joined in time order), named as the execution names the GPU."""
    series = {
        key: {name: parts[0] if len(parts) == 1 else _joined(parts) for name, parts in by_name.items()}
        for key, by_name in joined.items()
    }
    wanted = set(execution.gpus)
    names = {key: next((k for k in key if k in wanted), key[0] or key[1]) for key in series}
    return PerGpuSeries(step_ms, dict(sorted(series.items(), key=lambda kv: gpu_order(kv[0]))), names)


def run_info(execution: Execution, window: Window, step_ms: int, gpu_count: int) -> RunInfo:
    """What the detectors know of the execution around its series."""
    return RunInfo(
        window.start_ms,
        window.end_ms,
        step_ms,
        execution.status.value,
        datetime_to_ms(execution.end_time) if execution.end_time else None,
        execution.gpus,
        gpu_count,
    )


def live_result(
    execution: Execution,
    window: Window,
    step_ms: int,
    series: Mapping[str, Samples],
    gpu_count: int,
    per_gpu: PerGpuSeries | None,
    thresholds: InsightThresholds,
    kinds: Collection[str] | None = None,
) -> LiveFindings:
    """The findings of a tail read (the series the detectors read, each GPU's when there are two or
    more)."""
    run = run_info(execution, window, step_ms, gpu_count)
    by_gpu = None
    if per_gpu is not None and len(per_gpu.series) > 1:
        by_gpu = {per_gpu.names.get(key, key[0] or key[1]): s for key, s in per_gpu.series.items()}
    interval = per_gpu.step_ms if per_gpu else None
    found = findings(series, run, thresholds, per_gpu=by_gpu, per_gpu_interval_ms=interval, kinds=kinds)
    return LiveFindings(execution, window, found)


async def _series(answer: ExecutionMetrics[Sequence[Sample]]) -> dict[str, Samples]:
    """Each series of a metrics read, by Lyceum key, as arrays (the read cancelled at the end)."""
    keys = [m.lyceum for m in answer.metrics]
    parts: dict[str, list[Samples]] = {k: [] for k in keys}
    try:
        async for index, samples in answer.chunks():
            parts[keys[index]].append(points(samples, answer.window))
    finally:
        answer.cancel()
    return {k: Samples.join(p) for k, p in parts.items()}


class Stopped(Exception):
    """A summary's computation stopped because nobody waits for it any more (never reaches a caller:
    the awaiting request was cancelled before)."""


def gpu_order(key: tuple[str, str]) -> tuple[int, str, str]:
    return (int(key[0]) if key[0].isdigit() else 1 << 30, key[0], key[1])


@dataclass(frozen=True, slots=True)
class PerGpuSeries:
    """Per GPU (index, UUID): its series by Lyceum key, on the grid of `step_ms`."""

    step_ms: int
    series: dict[tuple[str, str], dict[str, Samples]]
    names: dict[tuple[str, str], str]  # how the execution names each GPU (findings name them so)

    def summaries(self, window: Window) -> list[GpuSummary]:
        out = []
        for (gpu, uuid), series in self.series.items():
            stats = {
                k: series_stats(series.get(k, []), window.start_ms, window.end_ms, self.step_ms)
                for k in GPU_KEYS
            }
            used = energy(series.get("gpuPowerWatt", []), self.step_ms)
            out.append(GpuSummary(gpu, uuid, self.step_ms, stats, None if used is None else used.kwh))
        return out


def _joined(parts: Sequence[Samples]) -> Samples:
    """Runs' samples, in time order, as one series."""
    return Samples(np.concatenate([p.t for p in parts]), np.concatenate([p.v for p in parts]))


def points(samples: Sequence[Sample], window: Window) -> Samples:
    """(ms, value) of the finite samples inside the window (parsed as arrays: a month at 15 s is
    millions of samples per summary)."""
    if not samples:
        return Samples(np.empty(0), np.empty(0))
    n = len(samples)
    if isinstance(samples, GridSamples):  # finite numbers on a grid: no per-sample work at all
        first, step = samples.first_ms, samples.step_ms
        lo = max(0, -(-(window.start_ms - first) // step))  # the grid's points inside the window
        hi = min(n - 1, (window.end_ms - first) // step)
        if hi < lo:
            return Samples(np.empty(0), np.empty(0))
        ms = np.arange(lo, hi + 1, dtype=np.float64) * step + first
        numbers = samples.numbers if lo == 0 and hi == n - 1 else samples.numbers[lo : hi + 1]
        return Samples(ms, np.array(numbers, dtype=np.float64), step)  # a run of the grid: a grid
    if isinstance(samples, GridPoints):  # on a grid with gaps or NaN: its offsets and numbers as arrays
        ms = np.array(samples.offsets, dtype=np.float64) * samples.step_ms + samples.first_ms
        v = np.array(samples.numbers, dtype=np.float64)
        keep = (ms >= window.start_ms) & (ms <= window.end_ms) & np.isfinite(v)
        return Samples(ms[keep], v[keep])
    ms = np.rint(np.fromiter(map(itemgetter(0), samples), dtype=np.float64, count=n) * 1000.0)
    v = np.array(list(map(itemgetter(1), samples)), dtype=np.float64)  # value text: "1.5", "NaN", "+Inf"
    keep = (ms >= window.start_ms) & (ms <= window.end_ms) & np.isfinite(v)
    return Samples(ms[keep], v[keep])
