"""`GET /api/v2/external/execution-summaries`: what the dashboard's list shows of many executions, in one
request, from the stored summaries only (nothing is computed here)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query
from pydantic import BaseModel, Field, StringConstraints

from gpulens.api.deps import Caller, Ctx
from gpulens.api.responses import AUTH, lyceum_errors
from gpulens.domain import limits
from gpulens.domain.models import EXECUTION_ID_RE
from gpulens.service.summary_store import SummaryRow

router = APIRouter(prefix="/api/v2/external")

DESCRIPTION = (
    f"For up to {limits.SUMMARY_ROWS_MAX} executions of the caller's organization (repeat `execution_id`), "
    "what the dashboard's list shows, from the summaries gpulens stored: mean GPU utilization, cost and "
    "findings per kind (count, worst severity, summed impact in GPU-hours, worst first). A finished "
    "execution whose summary is not stored yet, and a running one, is `pending` (a finished one is "
    "queued to be computed in the background: ask again in a few seconds); one without a host or a start "
    "is `unavailable`. Ids that do not exist or that the caller may not see are left out. Rows come in "
    "the order asked, each id once."
)

ExecutionId = Annotated[
    str, StringConstraints(min_length=1, max_length=limits.EXECUTION_ID_MAX, pattern=f"^{EXECUTION_ID_RE}$")
]


class FindingKind(BaseModel):
    kind: str
    severity: str = Field(description="The worst severity of the findings of this kind")
    count: int
    gpuHours: float = Field(description="The GPU-hours the findings of this kind cost (their impact)")


class RowCost(BaseModel):
    total: float
    currency: str


class ExecutionSummaryRow(BaseModel):
    executionId: str
    status: Literal["ready", "pending", "unavailable"]
    meanGpuUtilizationPercent: float | None
    cost: RowCost | None
    findings: list[FindingKind]


class ExecutionSummaryRows(BaseModel):
    summaries: list[ExecutionSummaryRow]


NO_FIGURES: dict[str, Any] = {"meanGpuUtilizationPercent": None, "cost": None, "findings": []}


def row_model(row: SummaryRow) -> ExecutionSummaryRow:
    """The row as answered: its figures are stored in this spelling (service/summary_store.list_row)."""
    return ExecutionSummaryRow(executionId=row.execution_id, status=row.status, **(row.figures or NO_FIGURES))


@router.get(
    "/execution-summaries",
    tags=["Observability – GPU Metrics"],
    summary="Get the stored summaries of many executions",
    description=DESCRIPTION,
    responses=lyceum_errors(*AUTH),
)
async def execution_summaries(
    ctx: Ctx,
    caller: Caller,
    execution_id: Annotated[
        list[ExecutionId],
        Query(
            min_length=1,
            max_length=limits.SUMMARY_ROWS_MAX,
            description=f"An execution id; repeat the parameter for up to {limits.SUMMARY_ROWS_MAX}",
        ),
    ],
) -> ExecutionSummaryRows:
    rows = await ctx.summaries.rows(caller, execution_id)
    return ExecutionSummaryRows(summaries=[row_model(r) for r in rows])
