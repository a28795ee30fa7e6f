"""`GET /api/v2/external/usage`: the fleet usage table (docs/usage.md), as JSON or CSV."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query
from fastapi.responses import Response
from pydantic import BaseModel, Field, StringConstraints

from gpulens.api.deps import Caller, Ctx
from gpulens.api.lyceum.params import parse_param
from gpulens.api.responses import AUTH, TIME_QUERY, lyceum_errors
from gpulens.domain.timeparse import format_rfc3339_ms, parse_timestamp_ms
from gpulens.service.usage import UsageGroup, group_dict, usage_csv
from gpulens.storage.usage import GROUP_KEYS

router = APIRouter(prefix="/api/v2/external")
_KEY = "(?:" + "|".join(GROUP_KEYS) + ")"
GroupBy = Annotated[str, StringConstraints(pattern=f"^{_KEY}(?:,{_KEY})?$")]

DESCRIPTION = (
    "The caller's organization's GPU usage over a window, one row per group (`group_by`: one or two of "
    "user, project, hardware_profile, hostname, day; an admin key may also group by org, across orgs): "
    "executions, GPU-hours, useful GPU-hours (utilization integrated), GPU-hours idle, idle with memory "
    "held, input-bound and throttled, GPU energy and cost (null where nothing was priced). Figures come "
    "from the stored summaries of finished executions, cut by UTC hour: an execution that crosses the "
    "window's edge counts for the part inside it. Running executions count up to their provisional "
    "figures, refreshed every GPULENS_USAGE_INTERVAL (default 15 minutes), and `runningExecutions` says "
    "how many of a row's executions are running. `format=csv` answers the same table as CSV."
)


class TopFinding(BaseModel):
    kind: str = Field(description="A receipt line: idle, idle_held, input_bound or throttled")
    gpuHours: float


class UsageRowOut(BaseModel):
    group: dict[str, str | None] = Field(description="The group's key values (`day`: RFC 3339 date-time)")
    executions: int
    runningExecutions: int = Field(
        description="Of `executions`, those still running: counted up to their last provisional figures"
    )
    gpuHours: float
    usefulGpuHours: float
    idleGpuHours: float
    idleHeldGpuHours: float
    inputBoundGpuHours: float
    throttledGpuHours: float
    energyKwh: float
    cost: float | None = Field(description="What the priced GPU-hours cost; null when none was priced")
    pricedGpuHours: float = Field(
        description="Of `gpuHours`, those with a price (their hardware profile is priced): what `cost` covers"
    )
    topFindings: list[TopFinding]


class UsageOut(BaseModel):
    start: str
    end: str
    groupBy: list[str]
    currency: str | None
    rows: list[UsageRowOut]


def row_out(group: UsageGroup) -> UsageRowOut:
    return UsageRowOut.model_validate(group_dict(group))


@router.get(
    "/usage",
    tags=["Observability – GPU Metrics"],
    summary="Get GPU usage per user, project, profile, host or day",
    description=DESCRIPTION,
    responses={
        **lyceum_errors(*AUTH),
        200: {"description": "The table (JSON, or CSV with format=csv)", "content": {"text/csv": {}}},
    },
    response_model=UsageOut,
)
async def usage(
    ctx: Ctx,
    caller: Caller,
    group_by: Annotated[
        list[GroupBy],
        Query(
            min_length=1,
            max_length=2,
            description="One or two distinct group keys (comma-separated, or the parameter repeated)",
        ),
    ],
    start: Annotated[
        str | None,
        Query(description="ISO 8601 start (default: a week before end)", json_schema_extra=TIME_QUERY),
    ] = None,
    end: Annotated[
        str | None, Query(description="ISO 8601 end (default: now)", json_schema_extra=TIME_QUERY)
    ] = None,
    format: Annotated[str, Query(pattern="^(json|csv)$", description="json or csv")] = "json",
) -> UsageOut | Response:
    start_ms = parse_param("start", start, parse_timestamp_ms)
    end_ms = parse_param("end", end, parse_timestamp_ms)
    table = await ctx.usage.table(caller, start_ms, end_ms, group_by)
    if format == "csv":
        return Response(usage_csv(table), media_type="text/csv; charset=utf-8")
    return UsageOut(
        start=format_rfc3339_ms(table.start_ms),
        end=format_rfc3339_ms(table.end_ms),
        groupBy=list(table.group_by),
        currency=table.currency,
        rows=[row_out(g) for g in table.groups],
    )
