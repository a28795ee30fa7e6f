"""`GET /api/v1/workloads/{workloadId}/pods/{podId}/metrics`: Run:ai pod metrics (JSON or CSV)."""

from __future__ import annotations

import csv
import io
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, ClassVar

import numpy as np
import orjson
from fastapi import APIRouter, Path, Request
from fastapi.responses import Response
from pydantic import BaseModel

from gpulens.api import archived
from gpulens.api.deps import Caller, Ctx
from gpulens.api.responses import TIMESTAMP_PATTERN, UUID_PATH
from gpulens.domain import catalog as c
from gpulens.domain import limits
from gpulens.domain.catalog import Kind, PodMetricDef
from gpulens.domain.errors import InvalidRequest
from gpulens.domain.timeparse import format_rfc3339_ms, parse_timestamp_ms
from gpulens.domain.workloads import Pod, Workload
from gpulens.service.pod_metrics import PodMetricsAnswer, PodMetricsService, TypeResult
from gpulens.shaping.cells import csv_cell
from gpulens.shaping.gridtime import LAST_GRID_MS, GridCache, grid_texts, times_texts
from gpulens.shaping.runai import Points

router = APIRouter()

# Documented as UUIDs (a path id that is not one is a 400); checked by the service, in this dialect.
WorkloadId = Annotated[
    str,
    Path(
        description="The Universally Unique Identifier (UUID) of the workload.",
        json_schema_extra=UUID_PATH,
    ),
]
PodId = Annotated[
    str,
    Path(description="The Universally Unique Identifier (UUID) of the pod.", json_schema_extra=UUID_PATH),
]

MAX_SAMPLES = limits.RUNAI_SAMPLES_MAX


class MeasurementValue(BaseModel):
    value: str
    timestamp: str | None


class MeasurementResponse(BaseModel):
    type: str
    labels: dict[str, str] | None = None
    values: list[MeasurementValue] | None


class HistogramValue(BaseModel):
    timestamp: str | None
    data: dict[str, str]


class HistogramSeries(BaseModel):
    type: str
    values: list[HistogramValue]


class MetricsCompositeResponse(BaseModel):
    measurements: list[MeasurementResponse]
    histogram: list[HistogramSeries] | None = None


class Error(BaseModel):
    code: int
    message: str
    details: str | None = None


def _missing(name: str) -> InvalidRequest:
    return InvalidRequest(f"Required parameter is missing: {name}")


def parse_metric_types(raw: list[str], table: Mapping[str, PodMetricDef]) -> list[PodMetricDef]:
    """Comma-separated and/or repeated; duplicates collapsed; order of first appearance."""
    seen: dict[str, PodMetricDef] = {}
    for item in raw:
        for part in item.split(","):
            name = part.strip()
            if not name:
                continue
            metric = table.get(name)
            if metric is None:
                raise InvalidRequest(f"Invalid metricType: {name[:100]!r}")
            seen.setdefault(name, metric)
    if not seen:
        raise _missing("metricType")
    return list(seen.values())


def parse_time(name: str, raw: str | None) -> int:
    if raw is None or raw == "":
        raise _missing(name)
    try:
        return parse_timestamp_ms(raw)
    except ValueError as exc:
        raise InvalidRequest(f"Invalid {name}: {exc}") from None


def parse_samples(raw: str | None) -> int:
    if raw is None or raw == "":
        return 20
    text = raw.strip()
    # ASCII digits only ("²" is a digit to str.isdigit, not to int), and never int() of a huge string
    if not (text.isascii() and text.isdigit()) or len(text) > 8 or int(text) > MAX_SAMPLES:
        raise InvalidRequest(f"numberOfSamples must be an integer between 0 and {MAX_SAMPLES}")
    return int(text)


class _Times:
    """RFC 3339 text of an answer's times. A grid's (a `range`: what a gap-free series has) is formatted
    at once (`grid_texts`) and kept for later answers (a dashboard asks for the same grids again and
    again; at most LIMIT times kept); the times of a grid with gaps are formatted at once too
    (`times_texts`), a few times one by one, each once per answer."""

    _grids: ClassVar[GridCache[tuple[int, int, int], list[str]]] = GridCache(
        50_000,
        lambda key: grid_texts(*key),  # about 4 MB: 50 grids of 1,000 points
    )

    def __init__(self) -> None:
        self.texts: dict[int, str] = {}

    def one(self, ms: int) -> str:
        text = self.texts.get(ms)
        if text is None:
            text = self.texts[ms] = format_rfc3339_ms(ms)
        return text

    def of(self, times: Sequence[int]) -> list[str]:
        if isinstance(times, range) and len(times) > 1 and times[0] >= 0 and times[-1] <= LAST_GRID_MS:
            return self._grids.get((times.start, times.step, len(times)))
        if len(times) > 16:  # a grid with gaps: its times all at once
            ms = np.array(times, dtype=np.int64)
            if ms.min() >= 0 and ms.max() <= LAST_GRID_MS:
                return times_texts(ms)
        return [self.one(ms) for ms in times]


_OPEN, _TIME, _CLOSE, _LAST = '[{"value":"', '","timestamp":"', '"},{"value":"', '"}]'


def _values_json(points: Points, times: _Times) -> orjson.Fragment:
    """`[{"value": "...", "timestamp": "..."}, ...]` as JSON text, put together by one C join (a day
    of 1,000 points for ~50 series is 50,000 items). Values are plain decimal text and times RFC 3339:
    neither needs escaping."""
    n = len(points)
    if n == 0:
        return orjson.Fragment(b"[]")
    pieces = [_TIME] * (4 * n)
    pieces[0::4] = points.values
    pieces[2::4] = times.of(points.times)
    pieces[3::4] = [_CLOSE] * n
    pieces[-1] = _LAST
    return orjson.Fragment((_OPEN + "".join(pieces)).encode())


Items = list[dict[str, Any]]


class Body:
    """The JSON body of an answer, each metricType's items made as soon as it is ready (`ready`, the
    service's hook: a day's points are encoded while the last answers are still on their way, not
    after them); `of(answer)` puts them together (making any not made yet)."""

    def __init__(self) -> None:
        self.times = _Times()
        self._made: dict[int, tuple[Items, Items]] = {}  # by id of a result the answer holds

    def ready(self, result: TypeResult) -> None:
        self._made[id(result)] = _items(result, self.times)

    def of(self, answer: PodMetricsAnswer) -> dict[str, Any]:
        measurements: Items = []
        histogram: Items = []
        for result in answer.results:
            made = self._made.get(id(result))
            m, h = made if made is not None else _items(result, self.times)
            measurements += m
            histogram += h
        body: dict[str, Any] = {"measurements": measurements}
        if any(r.metric.kind is not Kind.MEASUREMENT for r in answer.results):
            body["histogram"] = histogram
        return body


def _items(result: TypeResult, times: _Times) -> tuple[Items, Items]:
    """(measurements, histogram) items of a metricType's result: none for a failed one."""
    if not result.ok:
        return [], []
    metric = result.metric
    if metric.kind is Kind.MEASUREMENT:
        measurements: Items = []
        for labels, pts in result.measurements:
            item: dict[str, Any] = {"type": metric.type}
            if labels is not None:
                item["labels"] = labels
            item["values"] = _values_json(pts, times)
            measurements.append(item)
        return measurements, []
    values = [{"timestamp": times.one(b.ms), "data": b.counts} for b in result.histogram]
    return [], [{"type": metric.type, "values": values}]


def csv_of(answer: PodMetricsAnswer) -> str:
    """The `text/csv` answer: `type, gpu, timestamp, value`. The `gpu` cell is the backend's label: one a
    spreadsheet would run as a formula gets a leading `'` (shaping/cells.py); the values are plain
    decimals, numbers as they are."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["type", "gpu", "timestamp", "value"])
    for result in answer.results:
        if not result.ok or result.metric.kind is not Kind.MEASUREMENT:
            continue
        kind = csv_cell(result.metric.type)
        for labels, pts in result.measurements:
            gpu = (labels or {}).get(c.RUNAI_LABEL_GPU, "")
            if labels and labels.get(c.RUNAI_LABEL_GPU_INSTANCE):
                gpu = f"{gpu}/{labels[c.RUNAI_LABEL_GPU_INSTANCE]}"
            gpu = csv_cell(gpu)
            for p in pts:
                writer.writerow([kind, gpu, format_rfc3339_ms(p.ms), csv_cell(p.value)])
    return out.getvalue()


def partial_failure(results: list[TypeResult]) -> bool:
    """Raise when nothing worked; True when some types failed or were flag-gated (207)."""
    failed = [r for r in results if not r.ok]
    if not failed:
        return False
    if len(failed) == len(results):
        raise next(
            (r.error for r in failed if r.error is not None),
            InvalidRequest("Advanced GPU metrics are disabled"),
        )
    return True


_ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": Error, "description": text}
    for code, text in (
        (400, "Bad request."),
        (401, "Unauthorized."),
        (403, "Forbidden."),
        (404, "Not found."),
        (500, "Unexpected error."),
        (502, "Bad gateway: the metrics backend failed."),
        (503, "Unavailable."),
        (504, "Gateway timeout: the metrics backend did not answer in time."),
    )
}


RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {"description": "Executed successfully.", "content": {"text/csv": {"schema": {"type": "string"}}}},
    207: {"model": MetricsCompositeResponse, "description": "Partial success."},
    **_ERRORS,
}


def parameters(types: Sequence[PodMetricDef]) -> list[dict[str, Any]]:
    """The query parameters as Run:ai documents them (`metricType` comma-separated: explode false)."""
    return [
        {
            "name": "metricType",
            "in": "query",
            "required": True,
            "style": "form",
            "explode": False,
            "description": "Specify which metric data to request. Advanced GPU metrics are only supported "
            "if the 'Advanced GPU Metrics' feature flag in the settings is enabled.",
            "schema": {
                "type": "array",
                "minItems": 1,
                "items": {"type": "string", "enum": [m.type for m in types]},
            },
        },
        {
            "name": "start",
            "in": "query",
            "required": True,
            "description": "Start date of time range to fetch data in ISO 8601 timestamp format.",
            "schema": {"type": "string", "format": "date-time", "pattern": TIMESTAMP_PATTERN},
        },
        {
            "name": "end",
            "in": "query",
            "required": True,
            "description": "End date of time range to fetch data in ISO 8601 timestamp format.",
            "schema": {"type": "string", "format": "date-time", "pattern": TIMESTAMP_PATTERN},
        },
        {
            "name": "numberOfSamples",
            "in": "query",
            "required": False,
            "description": "The number of samples to take in the specified time range.",
            "schema": {"type": "integer", "minimum": 0, "maximum": MAX_SAMPLES, "default": 20},
        },
    ]


@router.get(
    "/api/v1/workloads/{workloadId}/pods/{podId}/metrics",
    operation_id="get_workload_pod_metrics",
    tags=["Pods"],
    summary="Get pod metrics data.",
    description="Retrieve pod's metrics data for use in analysis applications.",
    response_model=MetricsCompositeResponse,
    responses=RESPONSES,
    openapi_extra={"parameters": parameters(c.POD_METRICS)},
)
async def get_workload_pod_metrics(
    workloadId: WorkloadId, podId: PodId, request: Request, ctx: Ctx, caller: Caller
) -> Response:
    types, start_ms, end_ms, samples = parse_query(request, c.POD_METRICS_BY_TYPE)
    service = ctx.pod_metrics
    workload, pod = await service.resolve_pod(caller, workloadId, podId, start_ms, end_ms)  # once a request
    pods = (pod,)
    slot = await archived.runai_slot(request, ctx, workloadId, podId, pods, types, start_ms, end_ms, samples)
    if slot is not None and (hit := slot.hit()) is not None:
        return hit
    return await answered(request, service, slot, workload, pods, types, start_ms, end_ms, samples)


@router.get(
    "/api/v1/workloads/{workloadId}/metrics",
    operation_id="get_workload_metrics",
    tags=["Workloads"],
    summary="Get workload metrics data.",
    description="Retrieve workload's metrics data, aggregated over all of its pods.",
    response_model=MetricsCompositeResponse,
    responses=RESPONSES,
    openapi_extra={"parameters": parameters(c.WORKLOAD_METRICS)},
)
async def get_workload_metrics(
    workloadId: WorkloadId, request: Request, ctx: Ctx, caller: Caller
) -> Response:
    types, start_ms, end_ms, samples = parse_query(request, c.WORKLOAD_METRICS_BY_TYPE)
    service = ctx.pod_metrics
    workload, pods = await service.resolve_workload(caller, workloadId, start_ms, end_ms, samples)
    slot = await archived.runai_slot(request, ctx, workloadId, None, pods, types, start_ms, end_ms, samples)
    if slot is not None and (hit := slot.hit()) is not None:
        return hit
    return await answered(request, service, slot, workload, pods, types, start_ms, end_ms, samples)


def parse_query(
    request: Request, table: Mapping[str, PodMetricDef]
) -> tuple[list[PodMetricDef], int, int, int]:
    params = request.query_params
    types = parse_metric_types(params.getlist("metricType"), table)
    start_ms = parse_time("start", params.get("start"))
    end_ms = parse_time("end", params.get("end"))
    samples = parse_samples(params.get("numberOfSamples"))
    return types, start_ms, end_ms, samples  # the service refuses end < start


async def answered(
    request: Request,
    service: PodMetricsService,
    slot: archived.AnswerSlot | None,
    workload: Workload,
    pods: tuple[Pod, ...],
    types: list[PodMetricDef],
    start_ms: int,
    end_ms: int,
    samples: int,
) -> Response:
    """The read and its response, each metricType's JSON made as soon as it is shaped (a CSV answer
    is written whole at the end)."""
    body = Body()
    ready = None if _wants_csv(request) else body.ready
    answer = await service.answer(workload, pods, types, start_ms, end_ms, samples, ready)
    return respond(request, answer, body, slot)


def _wants_csv(request: Request) -> bool:
    return "text/csv" in request.headers.get("accept", "")


def respond(
    request: Request, answer: PodMetricsAnswer, body: Body, slot: archived.AnswerSlot | None = None
) -> Response:
    status = 207 if partial_failure(answer.results) else 200
    if status == 200 and _wants_csv(request):
        response = Response(csv_of(answer), media_type="text/csv")
    else:
        text = orjson.dumps(body.of(answer))
        response = Response(text, status_code=status, media_type="application/json")
    if slot is not None:  # archived pods: keep the answer for the next read
        slot.keep(answer.pods, response)
    return response
