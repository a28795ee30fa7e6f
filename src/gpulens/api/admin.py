"""Admin routes (`/api/v2/admin/...`): the platform registers and updates executions of any org."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query, Response
from pydantic import BaseModel, ConfigDict, Field, StringConstraints
from pydantic.json_schema import SkipJsonSchema

from gpulens.api.deps import Admin, Ctx
from gpulens.api.responses import AUTH, BODY, Timestamp, lyceum_errors
from gpulens.domain import limits
from gpulens.domain.models import (
    EXECUTION_ID_RE,
    GPU_ID_RE,
    HOSTNAME_RE,
    ORG_SLUG_RE,
    PROJECT_RE,
    USER_RE,
    Execution,
    ExecutionStatus,
)
from gpulens.domain.timeparse import format_optional, format_rfc3339
from gpulens.service.executions import ExecutionFields, ExecutionPage

router = APIRouter(prefix="/api/v2/admin", tags=["Admin"], responses=lyceum_errors(*AUTH))

ExecutionId = Annotated[str, StringConstraints(pattern=f"^{EXECUTION_ID_RE}$")]
OrgSlug = Annotated[str, StringConstraints(pattern=f"^{ORG_SLUG_RE}$")]
Hostname = Annotated[str, StringConstraints(pattern=f"^{HOSTNAME_RE}$")]
Project = Annotated[str, StringConstraints(pattern=f"^{PROJECT_RE}$")]
User = Annotated[str, StringConstraints(pattern=f"^{USER_RE}$")]
GpuId = Annotated[str, StringConstraints(pattern=f"^(?:{GPU_ID_RE})$")]
Profile = Annotated[str, StringConstraints(max_length=limits.PROFILE_MAX)]
FileName = Annotated[str, StringConstraints(max_length=limits.FILE_NAME_MAX)]
ErrorText = Annotated[str, StringConstraints(max_length=limits.SYSTEM_ERROR_MAX)]
ReturnCode = Annotated[int, Field(ge=limits.INT32_MIN, le=limits.INT32_MAX)]

_TIMES = "RFC 3339 date-time with any offset (stored and returned in UTC)"


class ExecutionChange(BaseModel):
    """Fields an update may set; only those present in the body change (null clears a field)."""

    model_config = ConfigDict(extra="forbid")

    project: Project | None = None
    user: User | None = Field(None, description="Who ran it: a login or an e-mail address")
    hostname: Hostname | None = Field(None, description="The host the execution runs on")
    gpus: list[GpuId] | None = Field(
        None,
        max_length=limits.GPUS_MAX,
        description="GPU indices or GPU/MIG UUIDs; omitted or empty: every GPU of the host",
    )
    status: ExecutionStatus | SkipJsonSchema[None] = Field(None, description="Not null")
    start_time: Timestamp | None = Field(None, description=_TIMES)
    end_time: Timestamp | None = Field(None, description=_TIMES)
    hardware_profile: Profile | None = None
    execution_type: Profile | None = None
    file_name: FileName | None = None
    return_code: ReturnCode | None = None
    system_errors: list[ErrorText] | None = Field(None, max_length=limits.SYSTEM_ERRORS_MAX)

    def fields(self) -> ExecutionFields:
        """The fields present in the body (an explicit null included)."""
        given = ExecutionFields()
        for name in self.model_fields_set:
            given[name] = getattr(self, name)  # type: ignore[literal-required]
        return given


class ExecutionRegistration(ExecutionChange):
    """A new execution, or new values for an existing one (same id and org)."""

    execution_id: ExecutionId | None = Field(None, description="Generated (UUID 4) when absent")
    org: OrgSlug
    created_at: Timestamp | None = Field(None, description="Defaults to now; kept when the execution exists")


class ExecutionOut(BaseModel):
    execution_id: str
    org: str
    project: str | None
    user: str | None
    hostname: str | None
    gpus: list[str]
    status: ExecutionStatus
    hardware_profile: str | None
    execution_type: str | None
    file_name: str | None
    created_at: str
    start_time: str | None
    end_time: str | None
    return_code: int | None
    system_errors: list[str]


class ExecutionListOut(BaseModel):
    executions: list[ExecutionOut]
    total: int
    limit: int
    offset: int


def execution_out(execution: Execution) -> ExecutionOut:
    return ExecutionOut(
        execution_id=execution.execution_id,
        org=execution.org,
        project=execution.project,
        user=execution.user,
        hostname=execution.hostname,
        gpus=list(execution.gpus),
        status=execution.status,
        hardware_profile=execution.hardware_profile,
        execution_type=execution.execution_type,
        file_name=execution.file_name,
        created_at=format_rfc3339(execution.created_at),
        start_time=format_optional(execution.start_time),
        end_time=format_optional(execution.end_time),
        return_code=execution.return_code,
        system_errors=list(execution.system_errors),
    )


def _page(page: ExecutionPage) -> ExecutionListOut:
    return ExecutionListOut(
        executions=[execution_out(e) for e in page.executions],
        total=page.total,
        limit=page.limit,
        offset=page.offset,
    )


@router.post(
    "/executions",
    status_code=201,
    summary="Register an execution (or update it: 200)",
    responses={
        200: {"model": ExecutionOut, "description": "An existing execution was updated"},
        **lyceum_errors(409, *BODY),
    },
)
async def register_execution(
    ctx: Ctx, admin: Admin, body: ExecutionRegistration, response: Response
) -> ExecutionOut:
    fields = body.fields()
    fields["org"] = body.org
    fields["execution_id"] = body.execution_id
    execution, created = await ctx.executions.register(admin, fields)
    response.status_code = 201 if created else 200
    return execution_out(execution)


@router.get("/executions", summary="List executions of every org (or one), newest first")
async def list_executions(
    *,
    ctx: Ctx,
    admin: Admin,
    org: Annotated[str | None, Query(pattern=f"^{ORG_SLUG_RE}$")] = None,
    status: Annotated[list[ExecutionStatus] | None, Query()] = None,
    limit: Annotated[int, Query(ge=1, le=limits.EXECUTION_PAGE_MAX)] = 50,
    offset: Annotated[int, Query(ge=0, le=limits.OFFSET_MAX)] = 0,
) -> ExecutionListOut:
    page = await ctx.executions.list_all(admin, org=org, statuses=status, limit=limit, offset=offset)
    return _page(page)


@router.get("/executions/{execution_id}", summary="One execution of any org", responses=lyceum_errors(404))
async def get_execution(ctx: Ctx, admin: Admin, execution_id: Annotated[str, Path()]) -> ExecutionOut:
    return execution_out(await ctx.executions.get_for(admin, execution_id))


@router.patch(
    "/executions/{execution_id}",
    summary="Update fields of an execution",
    responses=lyceum_errors(404, *BODY),
)
async def update_execution(
    ctx: Ctx, admin: Admin, execution_id: Annotated[str, Path()], body: ExecutionChange
) -> ExecutionOut:
    return execution_out(await ctx.executions.update(admin, execution_id, body.fields()))
