"""Lyceum execution routes the public `lyceum` CLI reads: one execution, running ones, history."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query
from pydantic import BaseModel, Field

from gpulens.api.deps import Caller, Ctx
from gpulens.api.lyceum.params import parse_param
from gpulens.api.responses import AUTH, TENANT, TIME_QUERY, lyceum_errors
from gpulens.domain import limits
from gpulens.domain.models import HOSTNAME_RE, PROJECT_RE, USER_RE, Execution, ExecutionStatus
from gpulens.domain.timeparse import format_optional, format_rfc3339, ms_to_datetime, parse_timestamp_ms
from gpulens.storage.registry import ExecutionMatch

router = APIRouter(prefix="/api/v2/external")
_BY = "Only executions of this {0} (empty: those without one)"


class ExecutionSummary(BaseModel):
    """One execution as Lyceum lists it; `job_start`/`job_end` repeat `start_time`/`end_time`."""

    execution_id: str
    status: str
    hostname: str | None
    gpus: list[str] = Field(description="GPU indices or UUIDs; empty: every GPU of the host")
    file_name: str | None
    hardware_profile: str | None
    execution_type: str | None
    return_code: int | None
    created_at: str
    start_time: str | None
    end_time: str | None
    job_start: str | None
    job_end: str | None
    system_errors: list[str]
    billed: float | None = Field(None, description="Always null: gpulens does not bill")
    status_details: str | None = None


class ExecutionHistory(BaseModel):
    executions: list[ExecutionSummary]
    total_executions: int
    total_credits_spent: float
    limit: int
    offset: int
    counts_by_status: dict[str, int]


def summary(execution: Execution) -> ExecutionSummary:
    start = format_optional(execution.start_time)
    end = format_optional(execution.end_time)
    return ExecutionSummary(
        execution_id=execution.execution_id,
        status=execution.status.value,
        hostname=execution.hostname,
        gpus=list(execution.gpus),
        file_name=execution.file_name,
        hardware_profile=execution.hardware_profile,
        execution_type=execution.execution_type,
        return_code=execution.return_code,
        created_at=format_rfc3339(execution.created_at),
        start_time=start,
        end_time=end,
        job_start=start,
        job_end=end,
        system_errors=list(execution.system_errors),
        billed=None,
        status_details=_details(execution),
    )


def _details(execution: Execution) -> str | None:
    if (
        execution.status in (ExecutionStatus.FAILED, ExecutionStatus.SYSTEM_FAILURE)
        and execution.system_errors
    ):
        return execution.system_errors[0]
    return None


@router.get(
    "/execution/{execution_id}",
    tags=["Executions"],
    summary="Get execution",
    responses=lyceum_errors(*TENANT),
)
async def get_execution(
    ctx: Ctx, caller: Caller, execution_id: Annotated[str, Path(title="Execution Id")]
) -> ExecutionSummary:
    return summary(await ctx.executions.get_for(caller, execution_id))


@router.get(
    "/workloads/list",
    tags=["Workloads"],
    summary="List running workloads",
    responses=lyceum_errors(*AUTH),
)
async def list_workloads(ctx: Ctx, caller: Caller) -> list[ExecutionSummary]:
    """The caller's org's pending, starting and running executions, newest first."""
    return [summary(e) for e in await ctx.executions.list_active(caller)]


@router.get(
    "/billing/history",
    tags=["Billing & Credits"],
    summary="Get execution history",
    responses=lyceum_errors(*AUTH),
)
async def billing_history(
    ctx: Ctx,
    caller: Caller,
    limit: Annotated[int, Query(ge=1, le=limits.EXECUTION_PAGE_MAX)] = 50,
    offset: Annotated[int, Query(ge=0, le=limits.OFFSET_MAX)] = 0,
    user: Annotated[str | None, Query(pattern=f"^(?:{USER_RE})?$", description=_BY.format("user"))] = None,
    project: Annotated[
        str | None, Query(pattern=f"^(?:{PROJECT_RE})?$", description=_BY.format("project"))
    ] = None,
    hostname: Annotated[
        str | None, Query(pattern=f"^(?:{HOSTNAME_RE})?$", description=_BY.format("host"))
    ] = None,
    hardware_profile: Annotated[
        str | None, Query(max_length=limits.PROFILE_MAX, description=_BY.format("hardware profile"))
    ] = None,
    start: Annotated[
        str | None,
        Query(
            description="Only executions still running at this ISO 8601 time or later",
            json_schema_extra=TIME_QUERY,
        ),
    ] = None,
    end: Annotated[
        str | None,
        Query(description="Only executions started before this ISO 8601 time", json_schema_extra=TIME_QUERY),
    ] = None,
) -> ExecutionHistory:
    """The caller's org's executions, newest first. The optional filters (the usage table's group keys
    and window, so that a usage row links to its executions) keep the executions that match them all;
    `counts_by_status` counts the same executions."""
    keys = {"user": user, "project": project, "hostname": hostname, "hardware_profile": hardware_profile}
    start_ms = parse_param("start", start, parse_timestamp_ms)
    end_ms = parse_param("end", end, parse_timestamp_ms)
    match = ExecutionMatch(
        {k: v or None for k, v in keys.items() if v is not None},
        None if start_ms is None else ms_to_datetime(start_ms),
        None if end_ms is None else ms_to_datetime(end_ms),
    )
    page = await ctx.executions.history(caller, limit=limit, offset=offset, match=match)
    counts = page.counts_by_status or {}
    return ExecutionHistory(
        executions=[summary(e) for e in page.executions],
        total_executions=page.total,
        total_credits_spent=0,
        limit=page.limit,
        offset=page.offset,
        counts_by_status={status.value: n for status, n in counts.items()},
    )
