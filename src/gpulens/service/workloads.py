"""Workloads and pods as callers see them: id checks, org/project visibility, admin registration.

Visibility follows executions: a workload of another org is "not found" (as are unknown ids and a
pod that belongs to another workload), one of the caller's org in a project the caller's key is not
limited to is "forbidden". Ids must be UUIDs (InvalidRequest otherwise: 400 on the Run:ai routes);
they are stored and compared in lower case. Admin principals see and register every org's workloads.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from functools import partial
from typing import Any, TypedDict, TypeVar

from gpulens.domain import limits
from gpulens.domain.errors import Forbidden, InvalidRequest, NotFound
from gpulens.domain.models import HOSTNAME_RE, ORG_SLUG_RE, ORG_SLUG_TEXT, PROJECT_RE, PROJECT_TEXT, Principal
from gpulens.domain.workloads import K8S_NAMESPACE_RE, K8S_POD_NAME_RE, UUID_RE, Pod, PodPhase, Workload
from gpulens.service.cache import RECENT_READ_TTL_S, TtlCache
from gpulens.service.checks import (
    bad,
    check_visible,
    gpu_list,
    match,
    require_admin,
    run_sync,
    utc,
    utcnow,
)
from gpulens.storage.registry import Registry

T = TypeVar("T")

NOT_FOUND = "Resource id not found."
FORBIDDEN = "You do not have sufficient permissions."

_UUID = re.compile(UUID_RE)
_ORG = re.compile(ORG_SLUG_RE)
_PROJECT = re.compile(PROJECT_RE)
_NAMESPACE = re.compile(K8S_NAMESPACE_RE)
_POD_NAME = re.compile(K8S_POD_NAME_RE)
_HOSTNAME = re.compile(HOSTNAME_RE)
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


class PodFields(TypedDict, total=False):
    """A pod in a registration (pod_id optional: derived from workload id, namespace and name), or
    the fields of an update (absent keys are left alone). Times may carry any offset (naive = UTC)."""

    pod_id: str | None
    name: str
    namespace: str
    node: str | None
    gpus: Sequence[str] | None
    phase: PodPhase | str | None
    start_time: datetime | None
    end_time: datetime | None


class WorkloadFields(TypedDict, total=False):
    """A registration: workload_id optional (a new UUID 4), pods upserted with it."""

    workload_id: str | None
    name: str
    org: str
    project: str | None
    created_at: datetime | None
    pods: Sequence[PodFields]


@dataclass(frozen=True, slots=True)
class PodPage:
    """One page of a workload's pods and the number of all of them."""

    workload: Workload
    pods: tuple[Pod, ...]
    total: int
    limit: int
    offset: int

    @property
    def next(self) -> int | None:
        """The offset of the next page, None on the last one."""
        following = self.offset + len(self.pods)
        return following if following < self.total and self.pods else None


@dataclass(frozen=True, slots=True)
class WorkloadPage:
    workloads: tuple[Workload, ...]
    total: int
    limit: int
    offset: int


def parse_uuid(name: str, raw: str) -> str:
    """A request's UUID in the form the registry stores (lower case); InvalidRequest otherwise."""
    if not isinstance(raw, str) or not _UUID.fullmatch(raw):
        raise InvalidRequest(f"{name} must be a UUID")
    return raw.lower()


def derived_pod_id(workload_id: str, namespace: str, name: str) -> str:
    """A stable pod id for a registration without one: the same body twice names the same pod."""
    return str(uuid.uuid5(uuid.UUID(workload_id), f"{namespace}/{name}"))


def _phase(name: str, value: object) -> PodPhase:
    try:
        if not isinstance(value, str):
            raise ValueError(value)
        return PodPhase(value)
    except ValueError:
        allowed = ", ".join(p.value for p in PodPhase)
        raise bad(name, value, f"{name} must be one of {allowed}") from None


def _clean_pod_fields(fields: Mapping[str, Any], where: str) -> dict[str, Any]:
    """Validated Pod attributes for the keys present (pod_id apart)."""
    out: dict[str, Any] = {}
    for key, value in fields.items():
        name = f"{where}{key}"
        if key == "pod_id":
            continue
        if key == "name":
            out[key] = match(name, value, _POD_NAME, "a Kubernetes pod name (RFC 1123 subdomain)")
        elif key == "namespace":
            out[key] = match(name, value, _NAMESPACE, "a Kubernetes namespace (RFC 1123 label)")
        elif key == "node":
            out[key] = None if value is None else match(name, value, _HOSTNAME, "a node name")
        elif key == "gpus":
            out[key] = gpu_list(name, value)
        elif key == "phase":
            if value is None:
                raise bad(name, value, f"{name} must not be null")
            out[key] = _phase(name, value)
        elif key in ("start_time", "end_time"):
            out[key] = utc(name, value)
        else:
            raise bad(name, value, f"unknown field {key!r}")
    return out


def _default_phase(start: datetime | None, end: datetime | None) -> PodPhase:
    if end is not None:
        return PodPhase.SUCCEEDED
    return PodPhase.RUNNING if start is not None else PodPhase.PENDING


def _check_order(pod: Pod, where: str) -> None:
    if pod.start_time and pod.end_time and pod.end_time < pod.start_time:
        raise bad(f"{where}end_time", pod.end_time.isoformat(), "end_time must not be before start_time")


def _workload_name(value: object) -> str:
    longest = limits.WORKLOAD_NAME_MAX
    if not isinstance(value, str) or not 1 <= len(value) <= longest or _CONTROL.search(value):
        raise bad("name", value, f"name must be 1-{longest} characters without control characters")
    return value


class WorkloadService:
    """What the Run:ai, admin and CLI front ends do with workloads and pods (all async)."""

    def __init__(self, registry: Registry, *, clock: Callable[[], datetime] = utcnow) -> None:
        self.registry = registry
        self.clock = clock
        # pod id -> (workload, pod) as the registry had them; who may see them is checked every read
        self._pods: TtlCache[str, tuple[Workload, Pod] | None] = TtlCache(RECENT_READ_TTL_S, 4096)

    # ------------------------------------------------------------------ reading

    async def _visible(self, principal: Principal, workload_id: str) -> Workload:
        workload = await run_sync(self.registry.get_workload, workload_id)
        if workload is None:
            raise NotFound(NOT_FOUND)
        check_visible(principal, workload.org, workload.project, NOT_FOUND, FORBIDDEN)
        return workload

    async def get_workload_for(self, principal: Principal, workload_id: str) -> Workload:
        """The workload if the caller may see it (InvalidRequest, NotFound, Forbidden otherwise)."""
        return await self._visible(principal, parse_uuid("workloadId", workload_id))

    async def get_pod_for(
        self, principal: Principal, workload_id: str, pod_id: str, *, recent: bool = False
    ) -> tuple[Workload, Pod]:
        """The workload and its pod; unknown ids and a pod of another workload are NotFound.
        `recent`: a running pod as read up to RECENT_READ_TTL_S ago (metrics reads), else as the
        registry has it now."""
        wid = parse_uuid("workloadId", workload_id)
        pid = parse_uuid("podId", pod_id)
        read = partial(run_sync, self.registry.get_pod_with_workload, pid)  # one read, the common case
        if recent:
            found = await self._pods.get_or_load(pid, read, valid=_still_running)
        else:
            found = await read()
        if found is None or found[1].workload_id != wid:
            await self._visible(principal, wid)  # the workload's own answer first (404 or 403), as always
            raise NotFound(NOT_FOUND)
        workload, pod = found
        check_visible(principal, workload.org, workload.project, NOT_FOUND, FORBIDDEN)
        return workload, pod

    async def list_pods_for(
        self, principal: Principal, workload_id: str, *, offset: int = 0, limit: int = 50
    ) -> PodPage:
        """A page of the workload's pods (by start time, then name)."""
        wid = parse_uuid("workloadId", workload_id)
        _check_paging(offset, limit)
        workload = await self._visible(principal, wid)
        pods, total = await run_sync(self.registry.list_pods, wid, limit=limit, offset=offset)
        return PodPage(workload, tuple(pods), total, limit, offset)

    async def list_workloads(
        self, principal: Principal, *, org: str | None = None, offset: int = 0, limit: int = 50
    ) -> WorkloadPage:
        """Newest first: every org's (or `org`'s) for admins, else the caller's org and projects."""
        _check_paging(offset, limit)
        if principal.is_admin:
            rows, total = await run_sync(self.registry.list_workloads, org=org, limit=limit, offset=offset)
        else:
            if org is not None and org != principal.org:
                raise Forbidden(FORBIDDEN)
            rows, total = await run_sync(
                self.registry.list_workloads,
                org=principal.org,
                projects=principal.projects,
                limit=limit,
                offset=offset,
            )
        return WorkloadPage(tuple(rows), total, limit, offset)

    # ------------------------------------------------------------------ writing (admin)

    async def register(
        self, principal: Principal, fields: WorkloadFields
    ) -> tuple[Workload, tuple[Pod, ...], bool]:
        """Create a workload or update an existing one (same org; name and project), and upsert the
        given pods: (workload, the pods as stored, created). Pods not in `fields` are left alone."""
        require_admin(principal)
        org = match("org", fields.get("org"), _ORG, ORG_SLUG_TEXT)
        raw_id = fields.get("workload_id")
        if raw_id is None:
            workload_id = str(uuid.uuid4())
        else:
            workload_id = match("workload_id", raw_id, _UUID, "a UUID").lower()
        name = _workload_name(fields.get("name"))
        project = fields.get("project")
        if project is not None:
            project = match("project", project, _PROJECT, PROJECT_TEXT)
        created_at = utc("created_at", fields.get("created_at")) or self.clock()
        raw_pods = fields.get("pods") or ()
        if len(raw_pods) > limits.PODS_MAX:
            raise bad("pods", len(raw_pods), f"at most {limits.PODS_MAX} pods per registration")
        pods: list[Pod] = []
        seen: set[str] = set()
        for i, raw in enumerate(raw_pods):
            pods.append(self._new_pod(workload_id, raw, f"pods.{i}."))
            if pods[-1].pod_id in seen:
                raise bad(f"pods.{i}.pod_id", pods[-1].pod_id, "the same pod appears twice")
            seen.add(pods[-1].pod_id)
        workload = Workload(workload_id, name, org, project, created_at)
        stored, created = await run_sync(self.registry.upsert_workload, workload, pods, now=self.clock())
        self._pods.clear()  # every pod of the workload as registered from here on (its project too)
        return stored, tuple(pods), created  # every field of each given pod was written as given

    @staticmethod
    def _new_pod(workload_id: str, raw: Mapping[str, Any], where: str) -> Pod:
        if not isinstance(raw, Mapping):
            raise bad(where.rstrip("."), raw, "a pod must be an object")
        given = _clean_pod_fields(raw, where)
        for required in ("name", "namespace"):
            if required not in given:
                raise bad(f"{where}{required}", None, f"{required} is required")
        raw_id = raw.get("pod_id")
        if raw_id is None:
            pod_id = derived_pod_id(workload_id, given["namespace"], given["name"])
        else:
            pod_id = match(f"{where}pod_id", raw_id, _UUID, "a UUID").lower()
        start, end = given.get("start_time"), given.get("end_time")
        pod = Pod(
            pod_id=pod_id,
            workload_id=workload_id,
            name=given["name"],
            namespace=given["namespace"],
            node=given.get("node"),
            gpus=given.get("gpus", ()),
            phase=given.get("phase") or _default_phase(start, end),
            start_time=start,
            end_time=end,
        )
        _check_order(pod, where)
        return pod

    async def update_pod(
        self, principal: Principal, workload_id: str, pod_id: str, changes: PodFields
    ) -> Pod:
        """Set some fields of a pod (never its id or workload)."""
        require_admin(principal)
        if "pod_id" in changes:
            raise bad("pod_id", changes.get("pod_id"), "pod_id cannot be changed")
        given = _clean_pod_fields(changes, "")
        _, pod = await self.get_pod_for(principal, workload_id, pod_id)
        _check_order(replace(pod, **given), "")
        updated = await run_sync(
            self.registry.update_pod, pod.workload_id, pod.pod_id, given, now=self.clock()
        )
        self._pods.discard(pod.pod_id)
        if updated is None:  # deleted in between
            raise NotFound(NOT_FOUND)
        return updated


def _still_running(kept: tuple[Workload, Pod] | None) -> bool:
    """Whether a kept row serves a recent read: one of a pod without an end. An unknown one is looked
    for again at once (it may be registered any moment), and an ended one read as it is now (a change
    to it makes its archive stale: never served, not even for a moment)."""
    return kept is not None and kept[1].end_time is None


def _check_paging(offset: int, limit: int) -> None:
    if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
        raise InvalidRequest("offset must be a non-negative integer")
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= limits.RUNAI_PAGE_MAX:
        raise InvalidRequest(f"limit must be an integer from 1 to {limits.RUNAI_PAGE_MAX}")
