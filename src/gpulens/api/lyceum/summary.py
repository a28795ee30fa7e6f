"""`GET /api/v2/external/execution/{execution_id}/summary`: stats, energy, cost and findings."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response
from pydantic import BaseModel, create_model

from gpulens.api.deps import Caller, Ctx
from gpulens.api.disconnect import client_closed, unless_disconnected
from gpulens.api.lyceum.metrics import TimeRange
from gpulens.api.lyceum.params import Window
from gpulens.api.responses import EXECUTION_READ, lyceum_errors
from gpulens.domain import catalog as c
from gpulens.domain.timeparse import format_rfc3339_ms
from gpulens.service.summary import GPU_KEYS, ExecutionSummary
from gpulens.shaping.insights import Finding as FindingResult
from gpulens.shaping.usage import Cost, Energy, SeriesStats
from gpulens.shaping.usage import GpuTime as GpuTimeResult

router = APIRouter()


DESCRIPTION = (
    "How the execution used its GPUs, from its 12 Lyceum series at the scrape interval: per-series "
    "statistics (mean, min, max, p50, p95, samples, coverage), energy (trapezoid integral of the GPU "
    "power), GPU time and cost (when GPULENS_PRICES prices the execution's hardware profile; each "
    "GPU-second charged to at most one of idle, idleHeld, inputBound, throttled) and findings, one per "
    "episode, each with its impact (GPU-hours and cost), ordered by severity then impact: "
    + ", ".join(f"`{k}` ({s})" for k, s in c.INSIGHT_SEVERITY.items())
    + ". `start`/`end` default to the execution and are clamped to it."
)


class MetricStats(BaseModel):
    mean: float | None
    min: float | None
    max: float | None
    p50: float | None
    p95: float | None
    samples: int
    coverage: float


class SummaryEnergy(BaseModel):
    kwh: float
    source: str
    method: str
    co2eKg: float | None
    carbonIntensityGPerKwh: float | None


class SummaryCost(BaseModel):
    currency: str
    gpuHourPrice: float
    gpuHours: float
    total: float
    active: float
    idle: float
    idleHeld: float
    inputBound: float
    throttled: float
    usefulGpuHours: float
    perUsefulGpuHour: float | None


class Impact(BaseModel):
    """The GPU-time a finding concerns (its duration x the GPUs it concerns) that no finding before it
    in the detectors' order already claims, so impacts add up to at most the execution's GPU-hours;
    and that time's cost at the execution's price (null when unpriced)."""

    gpuHours: float
    cost: float | None


class Finding(BaseModel):
    kind: str
    severity: str
    start: str
    end: str
    gpus: list[str]
    message: str
    evidence: dict[str, Any]
    impact: Impact


class GpuTime(BaseModel):
    """Where the execution's GPU-hours went: each GPU-second is charged to at most one of idle,
    idleHeld, inputBound, throttled (that priority), so active + idle + idleHeld = total and
    inputBound + throttled <= active."""

    total: float
    active: float
    idle: float
    idleHeld: float
    inputBound: float
    throttled: float


SummaryStats = create_model(
    "SummaryStats",
    **{k: (MetricStats, ...) for k in c.LYCEUM_KEYS},  # type: ignore[call-overload]
)


GpuStats = create_model(
    "GpuStats",
    **{k: (MetricStats, ...) for k in GPU_KEYS},  # type: ignore[call-overload]
)


class GpuSummaryModel(BaseModel):
    """One GPU: its own 9 series' stats at `stepSeconds` (the scrape interval, or a multiple of it
    for windows beyond 11,000 points) and its energy (power integral)."""

    gpu: str
    uuid: str
    stepSeconds: float
    stats: GpuStats
    energyKwh: float | None


class ExecutionSummaryResponse(BaseModel):
    executionId: str
    hostname: str
    gpus: list[str]
    gpuCount: int
    timeRange: TimeRange
    stepSeconds: float
    stats: SummaryStats
    energy: SummaryEnergy | None
    cost: SummaryCost | None
    gpuTime: GpuTime | None
    findings: list[Finding]
    perGpu: list[GpuSummaryModel]


def stats_json(s: SeriesStats) -> dict[str, Any]:
    return {
        "mean": s.mean,
        "min": s.min,
        "max": s.max,
        "p50": s.p50,
        "p95": s.p95,
        "samples": s.samples,
        "coverage": round(s.coverage, 6),
    }


def _energy(e: Energy | None) -> dict[str, Any] | None:
    if e is None:
        return None
    return {
        "kwh": e.kwh,
        "source": e.source,
        "method": e.method,
        "co2eKg": e.co2e_kg,
        "carbonIntensityGPerKwh": e.carbon_intensity_g_per_kwh,
    }


def _cost(m: Cost | None) -> dict[str, Any] | None:
    if m is None:
        return None
    return {
        "currency": m.currency,
        "gpuHourPrice": m.gpu_hour_price,
        "gpuHours": m.gpu_hours,
        "total": m.total,
        "active": m.active,
        "idle": m.idle,
        "idleHeld": m.idle_held,
        "inputBound": m.input_bound,
        "throttled": m.throttled,
        "usefulGpuHours": m.useful_gpu_hours,
        "perUsefulGpuHour": m.per_useful_gpu_hour,
    }


def to_json(summary: ExecutionSummary, execution_id: str) -> dict[str, Any]:
    w = summary.window
    return {
        "executionId": execution_id,
        "hostname": summary.execution.hostname or "",
        "gpus": list(summary.execution.gpus),
        "gpuCount": summary.gpu_count,
        "timeRange": {"start": format_rfc3339_ms(w.start_ms), "end": format_rfc3339_ms(w.end_ms)},
        "stepSeconds": w.step_ms / 1000,
        "stats": {k: stats_json(s) for k, s in summary.stats.items()},
        "energy": _energy(summary.energy),
        "cost": _cost(summary.cost),
        "gpuTime": _gpu_time(summary.gpu_time),
        "perGpu": [
            {
                "gpu": g.gpu,
                "uuid": g.uuid,
                "stepSeconds": g.step_ms / 1000,
                "stats": {k: stats_json(st) for k, st in g.stats.items()},
                "energyKwh": g.energy_kwh,
            }
            for g in summary.per_gpu
        ],
        "findings": [finding_json(f) for f in summary.findings],
    }


def finding_json(f: FindingResult) -> dict[str, Any]:
    return {
        "kind": f.kind,
        "severity": f.severity,
        "start": format_rfc3339_ms(f.start_ms),
        "end": format_rfc3339_ms(f.end_ms),
        "gpus": list(f.gpus),
        "message": f.message,
        "evidence": f.evidence,
        "impact": {
            "gpuHours": round(f.gpu_hours, 6),
            "cost": None if f.cost is None else round(f.cost, 6),
        },
    }


def _gpu_time(t: GpuTimeResult | None) -> dict[str, float] | None:
    if t is None:
        return None
    return {
        "total": t.total,
        "active": t.active,
        "idle": t.idle,
        "idleHeld": t.idle_held,
        "inputBound": t.input_bound,
        "throttled": t.throttled,
    }


SUMMARY_ROUTE = "/api/v2/external/execution/{execution_id}/summary"


@router.get(
    SUMMARY_ROUTE,
    tags=["Observability – GPU Metrics"],
    summary="Get an execution's summary and findings",
    description=DESCRIPTION,
    response_model=ExecutionSummaryResponse,
    responses=lyceum_errors(*EXECUTION_READ),
)
async def get_execution_summary(
    request: Request,
    ctx: Ctx,
    caller: Caller,
    window: Window,
) -> Response:
    # a finished execution's whole life is served as stored (service/summary_store.py); the rest is
    # computed, a bounded number at once, and cancelled when the client goes away
    work = ctx.summaries.body(caller, window.execution_id, window.start_ms, window.end_ms)
    body = await unless_disconnected(request, work)
    if body is None:
        return client_closed()
    return Response(body, media_type="application/json")
