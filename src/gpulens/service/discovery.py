"""Workloads and pods discovered from kube-state-metrics in the metrics backend, synced into the registry.

For every pod seen in a window, kube-state-metrics tells its UID, namespace, name and node
(`kube_pod_info`), its owner (`kube_pod_owner`; a ReplicaSet is followed to its Deployment through
`kube_replicaset_owner`), and its creation, start and completion times (unix seconds). A pod
becomes a registry pod with pod_id = its UID; its workload is its owner, with
workload_id = uuid5(K8S_WORKLOAD_NAMESPACE, "<namespace>/<owner kind>/<owner name>") (a pod
without an owner is its own workload, kind "Pod"), name = the owner's name and, by default,
project = the namespace. GPUs are left empty: GPU series are matched by the pod's labels.

A pod whose series stopped more than GONE_AFTER_MS before the window's end has gone: its end time
is its completion time, else the time of its last `kube_pod_info` sample, and a pod that vanished
while Pending or Running is marked Unknown (it was deleted; Kubernetes no longer reports a phase).
Running a discovery again with the same window changes nothing.
"""

from __future__ import annotations

import logging
import math
import re
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from datetime import UTC, datetime
from functools import partial

import anyio

from gpulens.backends.base import MetricsBackend
from gpulens.domain import catalog as c
from gpulens.domain import limits
from gpulens.domain.errors import BackendError, InvalidRequest
from gpulens.domain.models import ORG_SLUG_RE, ORG_SLUG_TEXT, PROJECT_RE, Series
from gpulens.domain.timeparse import datetime_to_ms, format_rfc3339_ms, ms_to_datetime
from gpulens.domain.workloads import K8S_NAMESPACE_RE, K8S_POD_NAME_RE, UUID_RE, Pod, PodPhase, Workload
from gpulens.planning.discovery import DiscoveryQueries, discovery_queries
from gpulens.storage.registry import Registry, SyncCounts

log = logging.getLogger("gpulens.discovery")

# Fixed forever: workload ids derived from it are what clients store.
K8S_WORKLOAD_NAMESPACE = uuid.UUID("cae6897c-ebe5-40bf-8913-52a2c3aca4e0")
GONE_AFTER_MS = c.LOOKBACK_MS  # a live pod has a sample at least this recent
DEFAULT_FIRST_WINDOW_S = 86_400.0
DEFAULT_MAX_WINDOW_S = 86_400.0
DEFAULT_OVERLAP_S = 600.0
BARE_POD_KIND = "Pod"

_UUID = re.compile(UUID_RE)
_NAMESPACE = re.compile(K8S_NAMESPACE_RE)
_POD_NAME = re.compile(K8S_POD_NAME_RE)
_PROJECT = re.compile(PROJECT_RE)
_ORG = re.compile(ORG_SLUG_RE)
_OWNER_PART = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,252}")

ProjectFrom = Callable[[str], str | None]


def project_from_namespace(namespace: str) -> str | None:
    return namespace


def project_from_runai_namespace(namespace: str) -> str | None:
    """Run:ai puts project P's workloads in namespace `runai-P`."""
    return namespace.removeprefix("runai-")


def no_project(namespace: str) -> str | None:
    return None


PROJECT_FROM: dict[str, ProjectFrom] = {
    "namespace": project_from_namespace,
    "runai": project_from_runai_namespace,
    "none": no_project,
}


def workload_uuid(namespace: str, owner_kind: str, owner_name: str) -> str:
    return str(uuid.uuid5(K8S_WORKLOAD_NAMESPACE, f"{namespace}/{owner_kind}/{owner_name}"))


@dataclass(frozen=True, slots=True)
class DiscoveryReport:
    """What one discovery saw and did."""

    org: str
    start_ms: int
    end_ms: int
    pods_seen: int
    counts: SyncCounts
    ignored: tuple[str, ...] = ()  # pods whose labels are not usable (not a UUID uid, ...)

    @property
    def skipped(self) -> tuple[str, ...]:
        return self.counts.skipped

    def summary(self) -> str:
        n = self.counts
        text = (
            f"kubernetes discovery for org {self.org} "
            f"({format_rfc3339_ms(self.start_ms)} .. {format_rfc3339_ms(self.end_ms)}): "
            f"{self.pods_seen} pods seen; workloads {n.workloads_created} created, "
            f"{n.workloads_updated} updated, {n.workloads_unchanged} unchanged; "
            f"pods {n.pods_created} created, {n.pods_updated} updated, {n.pods_unchanged} unchanged"
        )
        if n.skipped:
            text += f"; {len(n.skipped)} skipped"
        if self.ignored:
            text += f"; {len(self.ignored)} ignored"
        return text


@dataclass(slots=True)
class _SeenPod:
    uid: str
    namespace: str
    name: str
    node: str | None = None
    created_by: tuple[str, str] | None = None
    owner: tuple[str, str] | None = None
    owner_is_controller: bool = False
    created_ms: int | None = None
    start_ms: int | None = None
    completion_ms: int | None = None
    last_seen_ms: int | None = None
    phase: PodPhase | None = None


def _value_ms(series: Series) -> int | None:
    """The sample's value (unix seconds) as ms, None if absent or not finite."""
    if not series.samples:
        return None
    try:
        seconds = float(series.samples[-1][1])
    except (TypeError, ValueError, IndexError):
        return None
    if not math.isfinite(seconds) or seconds <= 0:
        return None
    return round(seconds * 1000)


def _owner(kind: str | None, name: str | None) -> tuple[str, str] | None:
    if not kind or not name or c.KSM_NO_OWNER in (kind, name):
        return None
    if not (_OWNER_PART.fullmatch(kind) and _OWNER_PART.fullmatch(name)):
        return None
    return kind, name


def _collect(
    results: Mapping[str, list[Series]],
) -> tuple[dict[str, _SeenPod], dict[tuple[str, str], str], list[str]]:
    pods: dict[str, _SeenPod] = {}
    ignored: list[str] = []
    for s in results["info"]:
        uid, namespace, name = (
            s.labels.get(c.KSM_LABEL_UID, ""),
            s.labels.get(c.KSM_LABEL_NAMESPACE, ""),
            s.labels.get(c.KSM_LABEL_POD, ""),
        )
        if not (_UUID.fullmatch(uid) and _NAMESPACE.fullmatch(namespace) and _POD_NAME.fullmatch(name)):
            ignored.append(
                f"pod {namespace}/{name} (uid {uid!r}): labels are not a UUID and Kubernetes names"
            )
            continue
        uid = uid.lower()
        pod = pods.setdefault(uid, _SeenPod(uid, namespace, name))
        node = s.labels.get(c.KSM_LABEL_NODE) or None
        if node and pod.node is None:
            pod.node = node
        by = _owner(s.labels.get(c.KSM_LABEL_CREATED_BY_KIND), s.labels.get(c.KSM_LABEL_CREATED_BY_NAME))
        pod.created_by = pod.created_by or by

    def each(key: str) -> list[tuple[_SeenPod, Series]]:
        out = []
        for s in results[key]:
            pod = pods.get(s.labels.get(c.KSM_LABEL_UID, "").lower())
            if pod is not None:
                out.append((pod, s))
        return out

    for pod, s in each("owner"):
        owner = _owner(s.labels.get(c.KSM_LABEL_OWNER_KIND), s.labels.get(c.KSM_LABEL_OWNER_NAME))
        controller = s.labels.get(c.KSM_LABEL_OWNER_IS_CONTROLLER) == "true"
        if owner is not None and (pod.owner is None or (controller and not pod.owner_is_controller)):
            pod.owner, pod.owner_is_controller = owner, controller
    for attr, key in (
        ("created_ms", "created"),
        ("start_ms", "started"),
        ("completion_ms", "completed"),
        ("last_seen_ms", "last_seen"),
    ):
        for pod, s in each(key):
            value = _value_ms(s)
            if value is not None:
                current = getattr(pod, attr)
                setattr(pod, attr, value if current is None else max(current, value))
    for pod, s in each("phase"):
        try:
            pod.phase = PodPhase(s.labels.get(c.KSM_LABEL_PHASE, ""))
        except ValueError:
            pod.phase = PodPhase.UNKNOWN

    deployments: dict[tuple[str, str], str] = {}
    for s in results["replicaset_owner"]:
        namespace = s.labels.get(c.KSM_LABEL_NAMESPACE, "")
        replicaset = s.labels.get(c.KSM_LABEL_REPLICASET, "")
        owner = _owner(s.labels.get(c.KSM_LABEL_OWNER_KIND), s.labels.get(c.KSM_LABEL_OWNER_NAME))
        if namespace and replicaset and owner is not None:
            deployments[(namespace, replicaset)] = owner[1]
    return pods, deployments, ignored


def _workload_key(pod: _SeenPod, deployments: Mapping[tuple[str, str], str]) -> tuple[str, str]:
    kind, name = pod.owner or pod.created_by or (BARE_POD_KIND, pod.name)
    if kind == "ReplicaSet" and (pod.namespace, name) in deployments:
        kind, name = "Deployment", deployments[(pod.namespace, name)]
    return kind, name


def _to_pod(seen: _SeenPod, workload_id: str, end_ms: int) -> Pod:
    gone = seen.last_seen_ms is not None and seen.last_seen_ms < end_ms - GONE_AFTER_MS
    end = seen.completion_ms if seen.completion_ms is not None else (seen.last_seen_ms if gone else None)
    phase = seen.phase
    if phase is None:
        phase = PodPhase.RUNNING if seen.start_ms is not None else PodPhase.PENDING
    if gone and seen.completion_ms is None and phase in (PodPhase.PENDING, PodPhase.RUNNING):
        phase = PodPhase.UNKNOWN
    start = seen.start_ms
    if start is not None and end is not None and end < start:
        end = start
    return Pod(
        pod_id=seen.uid,
        workload_id=workload_id,
        name=seen.name,
        namespace=seen.namespace,
        node=seen.node,
        gpus=(),
        phase=phase,
        start_time=None if start is None else ms_to_datetime(start),
        end_time=None if end is None else ms_to_datetime(end),
    )


def build_workloads(
    results: Mapping[str, list[Series]],
    org: str,
    *,
    start_ms: int,
    end_ms: int,
    project_from: ProjectFrom = project_from_namespace,
) -> tuple[list[tuple[Workload, list[Pod]]], int, list[str]]:
    """Workloads with their pods from the query results (pure); also the pods seen and those ignored."""
    pods, deployments, ignored = _collect(results)
    groups: dict[tuple[str, str, str], list[_SeenPod]] = {}
    for seen in sorted(pods.values(), key=lambda p: (p.namespace, p.name, p.start_ms or 0, p.uid)):
        kind, name = _workload_key(seen, deployments)
        groups.setdefault((seen.namespace, kind, name), []).append(seen)
    items: list[tuple[Workload, list[Pod]]] = []
    for (namespace, kind, name), members in groups.items():
        workload_id = workload_uuid(namespace, kind, name)
        project = project_from(namespace)
        if project is not None and not _PROJECT.fullmatch(project):
            project = None
        first = [t for p in members for t in (p.created_ms, p.start_ms) if t is not None]
        created = ms_to_datetime(min(first) if first else start_ms)
        workload = Workload(workload_id, name[: limits.WORKLOAD_NAME_MAX], org, project, created)
        items.append((workload, [_to_pod(p, workload_id, end_ms) for p in members]))
    return items, len(pods), ignored


async def _run_queries(
    backend: MetricsBackend, queries: DiscoveryQueries, at_ms: int
) -> dict[str, list[Series]]:
    results: dict[str, list[Series]] = {}

    async def one(name: str, expr: str) -> None:
        results[name] = await backend.query(expr, at_ms)

    try:
        async with anyio.create_task_group() as tg:
            for f in fields(DiscoveryQueries):
                tg.start_soon(one, f.name, getattr(queries, f.name))
    except ExceptionGroup as group:  # the first failure is the story (they are usually all alike)
        first: BaseException = group
        while isinstance(first, BaseExceptionGroup):
            first = first.exceptions[0]
        raise first from None
    return results


async def discover_kubernetes(
    backend: MetricsBackend,
    registry: Registry,
    org: str,
    *,
    start_ms: int,
    end_ms: int,
    project_from: ProjectFrom = project_from_namespace,
    namespaces: Sequence[str] = (),
    metric_names: Mapping[str, str] | None = None,
    now: datetime | None = None,
) -> DiscoveryReport:
    """Find the pods kube-state-metrics reported in (start, end] and sync them into `org`."""
    if not isinstance(org, str) or not _ORG.fullmatch(org):
        raise InvalidRequest(f"org must be {ORG_SLUG_TEXT}, got {org!r}")
    if end_ms <= start_ms:
        raise InvalidRequest("the discovery window must end after it starts")
    for namespace in namespaces:
        if not _NAMESPACE.fullmatch(namespace):
            raise InvalidRequest(f"not a Kubernetes namespace: {namespace!r}")
    queries = discovery_queries(start_ms, end_ms, namespaces=namespaces, metric_names=metric_names)
    results = await _run_queries(backend, queries, end_ms)
    items, seen, ignored = build_workloads(
        results, org, start_ms=start_ms, end_ms=end_ms, project_from=project_from
    )
    counts = await anyio.to_thread.run_sync(
        partial(registry.sync_discovered, items, now=now or datetime.now(UTC))
    )
    return DiscoveryReport(org, start_ms, end_ms, seen, counts, tuple(ignored))


def next_window(
    last_end_ms: int | None,
    now_ms: int,
    *,
    first_window_s: float = DEFAULT_FIRST_WINDOW_S,
    max_window_s: float = DEFAULT_MAX_WINDOW_S,
    overlap_s: float = DEFAULT_OVERLAP_S,
) -> tuple[int, int]:
    """The (start, end) ms of the next discovery window (pure).

    The first looks back `first_window_s`; later ones start `overlap_s` before the last successful
    end. No window is longer than `max_window_s`: after an outage the loop catches up in windows of
    at most that length, oldest first, instead of one query over the whole gap.
    """
    longest = max(1000, round(max_window_s * 1000))
    if last_end_ms is None:
        return now_ms - min(round(first_window_s * 1000), longest), now_ms
    start_ms = min(last_end_ms - round(overlap_s * 1000), now_ms - 1000)
    # each window ends after the last one (progress even if the overlap exceeds the longest window)
    return start_ms, min(now_ms, max(start_ms + longest, last_end_ms + 1000))


async def discovery_task(
    backend: MetricsBackend,
    registry: Registry,
    org: str,
    *,
    interval_s: float,
    first_window_s: float = DEFAULT_FIRST_WINDOW_S,
    max_window_s: float = DEFAULT_MAX_WINDOW_S,
    overlap_s: float = DEFAULT_OVERLAP_S,
    project_from: ProjectFrom = project_from_namespace,
    metric_names: Mapping[str, str] | None = None,
    clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    on_report: Callable[[DiscoveryReport], None] | None = None,
) -> None:
    """Discover every `interval_s` until cancelled (serve's lifespan runs it when configured).

    The first run looks back `first_window_s`; later runs start `overlap_s` before the previous
    end, so pods that vanished between two runs are still seen once more. Failures are logged and
    retried at the next tick; they never end the loop. No window is longer than `max_window_s`
    (`next_window`): after failures the loop catches up window by window, without waiting between
    them, until a window reaches the present.
    """
    last_end_ms: int | None = None  # the end of the last successful window
    while True:
        now_ms = datetime_to_ms(clock())
        start_ms, end_ms = next_window(
            last_end_ms, now_ms, first_window_s=first_window_s, max_window_s=max_window_s, overlap_s=overlap_s
        )
        try:
            report = await discover_kubernetes(
                backend,
                registry,
                org,
                start_ms=start_ms,
                end_ms=end_ms,
                project_from=project_from,
                metric_names=metric_names,
                now=clock(),
            )
        except BackendError as exc:
            log.warning("kubernetes discovery failed: %s", exc.message)
        except Exception:
            log.exception("kubernetes discovery failed")
        else:
            last_end_ms = end_ms
            log.info("%s", report.summary())
            if on_report is not None:
                on_report(report)
            if end_ms < now_ms:  # catching up after an outage: the next window at once
                await anyio.sleep(0)
                continue
        await anyio.sleep(interval_s)
