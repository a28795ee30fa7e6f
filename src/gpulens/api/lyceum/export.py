"""`GET /api/v2/external/execution/{execution_id}/export`: every sample, per GPU, as a file."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query
from fastapi.responses import Response, StreamingResponse

from gpulens.api.deps import Caller, Ctx
from gpulens.api.lyceum.params import Window
from gpulens.api.responses import EXECUTION_READ, lyceum_errors
from gpulens.service.export import FORMATS, MEDIA_TYPES, ExportService, encode

router = APIRouter()

EXTENSIONS = {"csv": "csv", "parquet": "parquet", "json": "jsonl"}

DESCRIPTION = (
    "Every sample of the execution at the scrape interval (`GPULENS_SCRAPE_INTERVAL`), in long format: "
    "`timestamp, hostname, gpu, uuid, metric, value`. `metric` is the Lyceum name; the 9 GPU series "
    "come once per GPU (with dcgm-exporter's `gpu` index and `UUID`), the 3 host series with an empty "
    "`gpu` and `uuid`. Rows are sorted by timestamp, then GPU, then metric, and streamed an hour of "
    "data at a time. `format`: `csv` (header row, RFC 3339 timestamps), `json` (JSON lines, one object "
    "per row) or `parquet` (one row group per hour; timestamp as UTC milliseconds). Same keys, tenants "
    "and errors as `/metrics`; `start`/`end` default to the execution and are clamped to it."
)


async def format_param(
    format: str = Query(
        "csv", description="csv, parquet or json (JSON lines)", pattern="^(csv|parquet|json)$"
    ),
) -> str:
    """The file format (a dependency, so the document lists it after the window's parameters)."""
    return format


Format = Annotated[str, Depends(format_param)]


@router.get(
    "/api/v2/external/execution/{execution_id}/export",
    tags=["Observability – GPU Metrics"],
    summary="Export an execution's samples at full resolution",
    description=DESCRIPTION,
    response_class=StreamingResponse,
    responses={
        200: {
            "description": "The rows, streamed",
            "content": {MEDIA_TYPES[f]: {} for f in FORMATS},
        },
        **lyceum_errors(*EXECUTION_READ),
    },
)
async def get_execution_export(
    ctx: Ctx,
    caller: Caller,
    window: Window,
    format: Format,
) -> Response:
    execution_id = window.execution_id
    export = await ExportService(ctx.metrics).open(caller, execution_id, window.start_ms, window.end_ms)
    headers: dict[str, Any] = {
        "Content-Disposition": f'attachment; filename="{execution_id}.{EXTENSIONS[format]}"'
    }
    body = encode(format, export.hostname, export.batches())
    return StreamingResponse(body, media_type=MEDIA_TYPES[format], headers=headers)
