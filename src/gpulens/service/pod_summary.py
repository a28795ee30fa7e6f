"""Pod summary: a Run:ai pod's GPU and CPU series over its life (or a window of it), turned into
stats and the findings the series allow.

The pod's series are the Run:ai metric types (utilization, GPU memory in bytes, CPU cores and memory),
read through `PodMetricsService.pod_metrics` (same look-up, tenancy, backend and archive choice as the
pod metrics route) at the scrape interval, or the smallest multiple of it within MAX_POINTS a series.
Run:ai exposes no GPU power, FB total or clocks per pod, so the findings are those that utilization
alone tells (`idle`, `low_utilization`, `no_data`, an unused GPU beside busy ones); memory is reported
in bytes, not judged.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC

import numpy as np

from gpulens.domain import catalog as c
from gpulens.domain.errors import InvalidRequest, NotFound
from gpulens.domain.models import ExecutionStatus, Principal, Window
from gpulens.domain.timeparse import datetime_to_ms
from gpulens.domain.workloads import Pod, PodPhase, Workload
from gpulens.planning.chunking import interval_step
from gpulens.service.checks import run_sync
from gpulens.service.pod_metrics import PodMetricsService
from gpulens.shaping.insights import UTIL, Finding, RunInfo, Samples, findings
from gpulens.shaping.runai import Points as RunaiPoints
from gpulens.shaping.usage import SeriesStats, series_stats

MAX_POINTS = 11_000
STAT_TYPES = ("GPU_UTILIZATION", "GPU_MEMORY_USAGE_BYTES", "CPU_USAGE_CORES", "CPU_MEMORY_USAGE_BYTES")
PER_GPU_TYPE = "GPU_UTILIZATION_PER_GPU"


@dataclass(frozen=True, slots=True)
class PodSummary:
    workload: Workload
    pod: Pod
    window: Window
    stats: dict[str, SeriesStats]  # by Run:ai metric type
    per_gpu: dict[str, SeriesStats]  # GPU index -> its utilization's stats
    findings: list[Finding]


def as_samples(points: RunaiPoints) -> Samples:
    n = len(points)
    return Samples(
        np.fromiter(points.times, dtype=np.float64, count=n),
        np.fromiter(map(float, points.values), dtype=np.float64, count=n),
    )


def gpu_name(labels: dict[str, str]) -> str:
    """A per-GPU series' GPU as the Run:ai answer labels it: `gpu`, or `gpu/gpuInstance` for a MIG
    instance (each instance its own entry)."""
    gpu = labels.get(c.LABEL_GPU, "")
    instance = labels.get(c.RUNAI_LABEL_GPU_INSTANCE, "")
    return f"{gpu}/{instance}" if gpu and instance else gpu


def pod_status(pod: Pod, ended_ms: int | None) -> str:
    """The run status the findings read (a failed pod is a failed run: OOM at its end)."""
    if pod.phase is PodPhase.FAILED:
        return ExecutionStatus.FAILED.value
    return (ExecutionStatus.COMPLETED if ended_ms is not None else ExecutionStatus.RUNNING).value


class PodSummaryService:
    def __init__(self, pods: PodMetricsService) -> None:
        self.pods = pods

    async def summary(
        self,
        principal: Principal,
        workload_id: str,
        pod_id: str,
        start_ms: int | None,
        end_ms: int | None,
    ) -> PodSummary:
        workload, pod = await self.pods.workloads.get_pod_for(principal, workload_id, pod_id)
        if pod.start_time is None:
            raise NotFound("No metrics available for this pod yet")
        born = datetime_to_ms(pod.start_time)
        ended = datetime_to_ms(pod.end_time) if pod.end_time is not None else None
        now = datetime_to_ms(self.pods.clock().astimezone(UTC))
        lo = max(born, start_ms) if start_ms is not None else born
        hi = min(ended or now, end_ms) if end_ms is not None else (ended or now)
        if hi < lo:
            raise InvalidRequest("the window does not overlap the pod's life")
        interval = self.pods.options.scrape_interval_ms
        step = interval_step(hi - lo, interval, MAX_POINTS)
        samples = (hi - lo) // step  # Run:ai's numberOfSamples n: n + 1 points, n steps apart
        hi = lo + samples * step  # the grid's points land on the step (a last partial step dropped)
        types = [c.POD_METRICS_BY_TYPE[t] for t in (*STAT_TYPES, PER_GPU_TYPE)]
        answer = await self.pods.pod_metrics(principal, workload_id, pod_id, types, lo, hi, samples)
        grid = answer.grid
        series: dict[str, Samples] = {}
        per_gpu: dict[str, Samples] = {}
        for result in answer.results:
            if result.error is not None:  # a summary is whole or an error, never silently partial
                raise result.error
            if result.disabled:
                continue
            if result.metric.type == PER_GPU_TYPE:
                for labels, pts in result.measurements:
                    gpu = gpu_name(labels or {})
                    if gpu and pts:
                        per_gpu[gpu] = as_samples(pts)
            elif result.measurements:
                series[result.metric.type] = as_samples(result.measurements[0][1])
        step_ms = grid.step_ms
        run = RunInfo(
            grid.start_ms,
            grid.end_ms,
            step_ms,
            pod_status(pod, ended),
            ended,
            tuple(per_gpu),
            len(per_gpu) or len(pod.gpus),
        )
        return await run_sync(self._compute, workload, pod, grid, run, series, per_gpu)

    def _compute(
        self,
        workload: Workload,
        pod: Pod,
        grid: Window,
        run: RunInfo,
        series: dict[str, Samples],
        per_gpu: dict[str, Samples],
    ) -> PodSummary:
        lo, hi, step = grid.start_ms, grid.end_ms, grid.step_ms
        stats = {t: series_stats(series.get(t, ()), lo, hi, step) for t in STAT_TYPES}
        gpus = {g: series_stats(s, lo, hi, step) for g, s in per_gpu.items()}
        util = series.get("GPU_UTILIZATION")
        found: list[Finding] = []
        if util is not None and len(util):
            by_gpu = {g: {UTIL: s} for g, s in per_gpu.items()} if len(per_gpu) > 1 else None
            found = findings({UTIL: util}, run, per_gpu=by_gpu)
        return PodSummary(workload, pod, grid, stats, gpus, found)
