"""Admin routes for Run:ai-style workloads and pods (`/api/v2/admin/workloads...`): register, list, update."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Path, Query, Request, Response
from pydantic import BaseModel, ConfigDict, Field, StringConstraints
from pydantic.json_schema import SkipJsonSchema

from gpulens.api.deps import Admin, get_ctx
from gpulens.api.responses import AUTH, BODY, UUID_PATH, Timestamp, lyceum_errors
from gpulens.domain import limits
from gpulens.domain.models import GPU_ID_RE, HOSTNAME_RE, ORG_SLUG_RE, PROJECT_RE
from gpulens.domain.timeparse import format_optional, format_rfc3339
from gpulens.domain.workloads import K8S_NAMESPACE_RE, K8S_POD_NAME_RE, UUID_RE, Pod, PodPhase, Workload
from gpulens.service.workloads import PodFields, WorkloadFields, WorkloadService

router = APIRouter(prefix="/api/v2/admin", tags=["Admin"], responses=lyceum_errors(*AUTH))


async def get_workload_service(request: Request) -> WorkloadService:
    """The app's WorkloadService (built once by create_app)."""
    return (await get_ctx(request)).workloads


Workloads = Annotated[WorkloadService, Depends(get_workload_service)]

Uuid = Annotated[str, StringConstraints(pattern=f"^{UUID_RE}$")]
OrgSlug = Annotated[str, StringConstraints(pattern=f"^{ORG_SLUG_RE}$")]
Project = Annotated[str, StringConstraints(pattern=f"^{PROJECT_RE}$")]
Namespace = Annotated[
    str, StringConstraints(pattern=f"^(?:{K8S_NAMESPACE_RE})$", max_length=limits.NAMESPACE_MAX)
]
PodName = Annotated[
    str, StringConstraints(pattern=f"^(?:{K8S_POD_NAME_RE})$", max_length=limits.POD_NAME_MAX)
]
Node = Annotated[str, StringConstraints(pattern=f"^{HOSTNAME_RE}$")]
GpuId = Annotated[str, StringConstraints(pattern=f"^(?:{GPU_ID_RE})$")]
WorkloadName = Annotated[
    str, StringConstraints(min_length=1, max_length=limits.WORKLOAD_NAME_MAX, pattern=r"^[^\x00-\x1f\x7f]+$")
]

_TIMES = "RFC 3339 date-time with any offset (stored and returned in UTC)"


class PodChange(BaseModel):
    """Fields an update may set; only those present in the body change (null clears node/times)."""

    model_config = ConfigDict(extra="forbid")

    node: Node | None = Field(None, description="The node (host) the pod runs on")
    gpus: list[GpuId] | None = Field(
        None,
        max_length=limits.GPUS_MAX,
        description="GPU indices or GPU/MIG UUIDs; empty: matched by pod labels",
    )
    phase: PodPhase | SkipJsonSchema[None] = Field(None, description="Not null")
    start_time: Timestamp | None = Field(None, description=_TIMES)
    end_time: Timestamp | None = Field(None, description=_TIMES)

    def fields(self) -> PodFields:
        given = PodFields()
        for name in self.model_fields_set:
            given[name] = getattr(self, name)  # type: ignore[literal-required]
        return given


class PodIn(PodChange):
    """One pod of a registration; its fields replace those of a stored pod with the same id."""

    pod_id: Uuid | None = Field(
        None, description="The Kubernetes pod UID; when absent, derived from workload id, namespace and name"
    )
    name: PodName
    namespace: Namespace
    phase: PodPhase | SkipJsonSchema[None] = Field(
        None, description="Default: Succeeded with an end_time, Running with a start_time, else Pending"
    )

    def fields(self) -> PodFields:
        given = super().fields()
        given["name"] = self.name
        given["namespace"] = self.namespace
        given["pod_id"] = self.pod_id
        return given


class WorkloadRegistration(BaseModel):
    """A new workload, or new values for an existing one (same id and org), with pods to upsert."""

    model_config = ConfigDict(extra="forbid")

    workload_id: Uuid | None = Field(None, description="Generated (UUID 4) when absent")
    name: WorkloadName
    org: OrgSlug
    project: Project | None = None
    created_at: Timestamp | None = Field(None, description="Defaults to now; kept when the workload exists")
    pods: list[PodIn] = Field(default_factory=list, max_length=limits.PODS_MAX)

    def fields(self) -> WorkloadFields:
        return WorkloadFields(
            workload_id=self.workload_id,
            name=self.name,
            org=self.org,
            project=self.project,
            created_at=self.created_at,
            pods=[p.fields() for p in self.pods],
        )


class PodOut(BaseModel):
    pod_id: str
    workload_id: str
    name: str
    namespace: str
    node: str | None
    gpus: list[str]
    phase: PodPhase
    start_time: str | None
    end_time: str | None


class WorkloadOut(BaseModel):
    workload_id: str
    name: str
    org: str
    project: str | None
    created_at: str
    pods: list[PodOut] = Field(description="The pods of this request (registration), as stored")


class WorkloadListOut(BaseModel):
    workloads: list[WorkloadOut] = Field(description="Without their pods (see .../pods)")
    total: int
    limit: int
    offset: int


class PodListOut(BaseModel):
    pods: list[PodOut]
    total: int
    limit: int
    offset: int


def pod_out(pod: Pod) -> PodOut:
    return PodOut(
        pod_id=pod.pod_id,
        workload_id=pod.workload_id,
        name=pod.name,
        namespace=pod.namespace,
        node=pod.node,
        gpus=list(pod.gpus),
        phase=pod.phase,
        start_time=format_optional(pod.start_time),
        end_time=format_optional(pod.end_time),
    )


def workload_out(workload: Workload, pods: tuple[Pod, ...] = ()) -> WorkloadOut:
    return WorkloadOut(
        workload_id=workload.workload_id,
        name=workload.name,
        org=workload.org,
        project=workload.project,
        created_at=format_rfc3339(workload.created_at),
        pods=[pod_out(p) for p in pods],
    )


@router.post(
    "/workloads",
    status_code=201,
    summary="Register a workload with its pods (or update it: 200)",
    responses={
        200: {"model": WorkloadOut, "description": "An existing workload was updated"},
        **lyceum_errors(409, *BODY),
    },
)
async def register_workload(
    workloads: Workloads, admin: Admin, body: WorkloadRegistration, response: Response
) -> WorkloadOut:
    workload, pods, created = await workloads.register(admin, body.fields())
    response.status_code = 201 if created else 200
    return workload_out(workload, pods)


@router.get("/workloads", summary="List workloads of every org (or one), newest first")
async def list_workloads(
    *,
    workloads: Workloads,
    admin: Admin,
    org: Annotated[str | None, Query(pattern=f"^{ORG_SLUG_RE}$")] = None,
    limit: Annotated[int, Query(ge=1, le=limits.RUNAI_PAGE_MAX)] = 50,
    offset: Annotated[int, Query(ge=0, le=limits.OFFSET_MAX)] = 0,
) -> WorkloadListOut:
    page = await workloads.list_workloads(admin, org=org, limit=limit, offset=offset)
    return WorkloadListOut(
        workloads=[workload_out(w) for w in page.workloads],
        total=page.total,
        limit=page.limit,
        offset=page.offset,
    )


@router.get(
    "/workloads/{workload_id}/pods",
    summary="A workload's pods, by start time",
    responses=lyceum_errors(400, 404),
)
async def list_workload_pods(
    *,
    workloads: Workloads,
    admin: Admin,
    workload_id: Annotated[str, Path(json_schema_extra=UUID_PATH)],
    limit: Annotated[int, Query(ge=1, le=limits.RUNAI_PAGE_MAX)] = 50,
    offset: Annotated[int, Query(ge=0, le=limits.OFFSET_MAX)] = 0,
) -> PodListOut:
    page = await workloads.list_pods_for(admin, workload_id, offset=offset, limit=limit)
    return PodListOut(
        pods=[pod_out(p) for p in page.pods], total=page.total, limit=page.limit, offset=page.offset
    )


@router.patch(
    "/workloads/{workload_id}/pods/{pod_id}",
    summary="Update fields of a pod",
    responses=lyceum_errors(400, 404, *BODY),
)
async def update_pod(
    workloads: Workloads,
    admin: Admin,
    workload_id: Annotated[str, Path(json_schema_extra=UUID_PATH)],
    pod_id: Annotated[str, Path(json_schema_extra=UUID_PATH)],
    body: PodChange,
) -> PodOut:
    return pod_out(await workloads.update_pod(admin, workload_id, pod_id, body.fields()))
