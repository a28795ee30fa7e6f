"""`GET /api/v1/workloads/{workloadId}/pods/{podId}/summary`: a pod's stats and findings (gpulens' own)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Query
from pydantic import BaseModel

from gpulens.api.deps import Caller, Ctx
from gpulens.api.lyceum.summary import Finding, MetricStats, finding_json, stats_json
from gpulens.api.responses import TIMESTAMP_PATTERN, runai_errors
from gpulens.api.runai.metrics import PodId, WorkloadId, parse_time
from gpulens.domain.timeparse import format_rfc3339_ms
from gpulens.service.pod_summary import STAT_TYPES, PodSummary, PodSummaryService

router = APIRouter()

DESCRIPTION = (
    "A pod's series over its life (or the `start`..`end` part of it) at the scrape interval (a "
    "multiple of it beyond 11,000 points): `stats` per metric type (" + ", ".join(STAT_TYPES) + "), "
    "`perGpu` utilization stats, and the findings utilization alone tells (`idle`, `low_utilization`, "
    "`no_data`, a GPU unused beside busy ones)."
)


class PodTimeRange(BaseModel):
    start: str
    end: str


class PodSummaryResponse(BaseModel):
    workloadId: str
    podId: str
    podName: str
    namespace: str
    node: str | None
    timeRange: PodTimeRange
    stepSeconds: float
    stats: dict[str, MetricStats]
    perGpu: dict[str, MetricStats]
    findings: list[Finding]


def _time(name: str, raw: str | None) -> int | None:
    """An optional bound: the metrics route's parser (its 400s), None when absent."""
    return parse_time(name, raw) if raw else None


@router.get(
    "/api/v1/workloads/{workloadId}/pods/{podId}/summary",
    operation_id="get_workload_pod_summary",
    tags=["Pods"],
    summary="Get a pod's summary and findings (gpulens).",
    description=DESCRIPTION,
    response_model=PodSummaryResponse,
    responses=runai_errors(400, 401, 403, 404, 502, 503, 504),
)
async def get_workload_pod_summary(
    workloadId: WorkloadId,
    podId: PodId,
    ctx: Ctx,
    caller: Caller,
    start: str | None = Query(
        None, description="ISO 8601 start (default: the pod's start)", pattern=TIMESTAMP_PATTERN
    ),
    end: str | None = Query(
        None, description="ISO 8601 end (default: the pod's end, or now)", pattern=TIMESTAMP_PATTERN
    ),
) -> dict[str, Any]:
    found = await PodSummaryService(ctx.pod_metrics).summary(
        caller, workloadId, podId, _time("start", start), _time("end", end)
    )
    return to_json(found)


def to_json(s: PodSummary) -> dict[str, Any]:
    return {
        "workloadId": s.workload.workload_id,
        "podId": s.pod.pod_id,
        "podName": s.pod.name,
        "namespace": s.pod.namespace,
        "node": s.pod.node,
        "timeRange": {
            "start": format_rfc3339_ms(s.window.start_ms),
            "end": format_rfc3339_ms(s.window.end_ms),
        },
        "stepSeconds": s.window.step_ms / 1000,
        "stats": {t: stats_json(st) for t, st in s.stats.items()},
        "perGpu": {g: stats_json(st) for g, st in s.per_gpu.items()},
        "findings": [finding_json(f) for f in s.findings],
    }
