"""`GET /api/v1/workloads/{workloadId}/pods`: a Run:ai workload's pods, paged (tag Pods).

The vendor's pod object (`Pod1` in its OpenAPI) carries cluster and scheduling fields gpulens does
not have; the required ones are filled so generated clients (runapy) parse the answer:
`clusterId` is a fixed UUID per org, `tenantId` 0, `priorityClassName` "", `containers` [].
`createdAt` is the pod's start time (or, before it started, the workload's registration time);
`updatedAt` and `k8sPhaseUpdatedAt` are its end, else start, else creation time. `gpus` (GPU
indices or UUIDs, empty when GPU series are matched by pod labels) and `namespace` are gpulens'
own additions. Optional fields without a value are omitted. `next` is the offset of the next page,
present only when more pods follow.
"""

from __future__ import annotations

import uuid
from typing import Annotated

from fastapi import APIRouter, Path, Query
from pydantic import BaseModel, Field

from gpulens.api.admin_workloads import Workloads
from gpulens.api.deps import Caller
from gpulens.api.responses import UUID_PATH, runai_errors
from gpulens.domain import limits
from gpulens.domain.timeparse import format_optional, format_rfc3339
from gpulens.domain.workloads import Pod, Workload

router = APIRouter(tags=["Pods"])

_CLUSTER_NAMESPACE = uuid.UUID("5d0c2f36-51a4-4d1e-9f0a-3c8b7e2d6a41")


class WorkloadPod(BaseModel):
    id: str = Field(json_schema_extra={"format": "uuid"})
    name: str
    workloadId: str = Field(json_schema_extra={"format": "uuid"})
    workloadName: str
    projectName: str | None = None
    namespace: str
    nodeName: str | None = None
    k8sPhase: str = Field(description="Pending, Running, Succeeded, Failed or Unknown")
    createdAt: str
    startedAt: str | None = None
    completedAt: str | None = None
    gpus: list[str]
    clusterId: str = Field(json_schema_extra={"format": "uuid"})
    tenantId: int
    priorityClassName: str
    containers: list[dict[str, str]]
    updatedAt: str
    k8sPhaseUpdatedAt: str


class WorkloadPodsResponse(BaseModel):
    pods: list[WorkloadPod]
    next: int | None = Field(None, description="The offset of the next page; absent on the last page")


def cluster_id(org: str) -> str:
    return str(uuid.uuid5(_CLUSTER_NAMESPACE, org))


def runai_pod(workload: Workload, pod: Pod) -> WorkloadPod:
    created = pod.start_time or workload.created_at
    changed = pod.end_time or pod.start_time or created
    return WorkloadPod(
        id=pod.pod_id,
        name=pod.name,
        workloadId=pod.workload_id,
        workloadName=workload.name,
        projectName=workload.project,
        namespace=pod.namespace,
        nodeName=pod.node,
        k8sPhase=pod.phase.value,
        createdAt=format_rfc3339(created),
        startedAt=format_optional(pod.start_time),
        completedAt=format_optional(pod.end_time),
        gpus=list(pod.gpus),
        clusterId=cluster_id(workload.org),
        tenantId=0,
        priorityClassName="",
        containers=[],
        updatedAt=format_rfc3339(changed),
        k8sPhaseUpdatedAt=format_rfc3339(changed),
    )


@router.get(
    "/api/v1/workloads/{workloadId}/pods",
    operation_id="get_workload_pods",
    summary="Get workload pods by id.",
    description="Retrieve the details of workload pods by workload id.",
    response_model=WorkloadPodsResponse,
    response_model_exclude_none=True,
    responses={
        200: {"description": "Executed successfully."},
        **runai_errors(400, 401, 403, 404, 500, 503),
    },
)
async def get_workload_pods(
    workloads: Workloads,
    caller: Caller,
    workload_id: Annotated[
        str,
        Path(
            alias="workloadId",
            description="The  Universally Unique Identifier (UUID) of the workload.",
            json_schema_extra=UUID_PATH,
        ),
    ],
    offset: Annotated[
        int,
        Query(
            ge=0, le=limits.INT32_MAX, description="The offset of the first item returned in the collection."
        ),
    ] = 0,
    limit: Annotated[
        int, Query(ge=1, le=limits.RUNAI_PAGE_MAX, description="The maximum number of entries to return.")
    ] = 50,
) -> WorkloadPodsResponse:
    page = await workloads.list_pods_for(caller, workload_id, offset=offset, limit=limit)
    return WorkloadPodsResponse(pods=[runai_pod(page.workload, p) for p in page.pods], next=page.next)
