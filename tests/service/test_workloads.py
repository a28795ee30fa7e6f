"""WorkloadService: who sees which workload and pod, paging, admin registration and pod updates."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime, timedelta, timezone
from functools import partial

import pytest

from gpulens.domain.errors import Conflict, Forbidden, InvalidParameter, InvalidRequest, NotFound
from gpulens.domain.models import Principal
from gpulens.domain.workloads import PodPhase
from gpulens.service.workloads import PodFields, WorkloadFields, WorkloadService, derived_pod_id
from gpulens.storage.registry import Registry

NOW = datetime(2026, 11, 28, 12, 0, tzinfo=UTC)
W = "3f2b8c1e-5a4d-4e6f-9b7a-1c2d3e4f5a6b"
P = "7e1d2c3b-4a59-4687-8b9c-0d1e2f3a4b5c"
W_OTHER = "9a8b7c6d-5e4f-4a3b-8c2d-1e0f9a8b7c6d"
P_OTHER = "0f1e2d3c-4b5a-4968-8776-5a4b3c2d1e0f"

ADMIN = Principal(org="platform", subject="svc", is_admin=True)
ACME = Principal(org="acme", subject="lk_acme1")
BETA = Principal(org="beta", subject="lk_beta1")
LIMITED = Principal(org="acme", subject="lk_lim01", projects=frozenset({"team-z"}))
TEAM_A = Principal(org="acme", subject="lk_team1", projects=frozenset({"team-a"}))


@pytest.fixture
def service(registry: Registry) -> WorkloadService:
    return WorkloadService(registry, clock=lambda: NOW)


def body(workload_id: str | None = W, pod_id: str | None = P, **kw: object) -> WorkloadFields:
    pod = PodFields(
        pod_id=pod_id,
        name="llm-serve-0",
        namespace="team-a",
        node="gpu-node-1",
        gpus=["0", "1", "0"],
        start_time=datetime(2026, 11, 28, 11, 0, tzinfo=timezone(timedelta(hours=1))),
    )
    fields = WorkloadFields(
        workload_id=workload_id, name="llm-serve", org="acme", project="team-a", pods=[pod]
    )
    fields.update(kw)  # type: ignore[typeddict-item]
    return fields


async def registered(service: WorkloadService) -> None:
    await service.register(ADMIN, body())
    await service.register(ADMIN, body(W_OTHER, P_OTHER, project="team-b", name="other"))


async def test_register_defaults_and_normalises(service: WorkloadService) -> None:
    workload, pods, created = await service.register(ADMIN, body(workload_id=W.upper()))
    assert created and workload.workload_id == W and workload.created_at == NOW
    (pod,) = pods
    assert pod.pod_id == P and pod.workload_id == W
    assert pod.gpus == ("0", "1")  # repeats dropped
    assert pod.start_time == datetime(2026, 11, 28, 10, 0, tzinfo=UTC)
    assert pod.phase is PodPhase.RUNNING  # started, not ended
    _, _, created = await service.register(ADMIN, body(name="renamed"))
    assert not created
    assert (await service.get_workload_for(ADMIN, W)).name == "renamed"


async def test_pod_ids_are_derived_when_absent_so_registration_is_idempotent(
    service: WorkloadService,
) -> None:
    _, (first,), _ = await service.register(ADMIN, body(pod_id=None))
    _, (second,), created = await service.register(ADMIN, body(pod_id=None))
    assert not created and first.pod_id == second.pod_id == derived_pod_id(W, "team-a", "llm-serve-0")
    page = await service.list_pods_for(ADMIN, W)
    assert page.total == 1


async def test_register_generates_a_workload_id(service: WorkloadService) -> None:
    workload, _, created = await service.register(ADMIN, body(workload_id=None, pods=[]))
    assert created and uuid.UUID(workload.workload_id).version == 4


@pytest.mark.parametrize(
    ("change", "name"),
    [
        ({"org": "Not A Slug"}, "org"),
        ({"workload_id": "not-a-uuid"}, "workload_id"),
        ({"name": ""}, "name"),
        ({"name": "bad\nname"}, "name"),
        ({"project": "../etc"}, "project"),
        ({"pods": [{"name": "UPPER", "namespace": "ns"}]}, "pods.0.name"),
        ({"pods": [{"name": "ok", "namespace": "Bad_NS"}]}, "pods.0.namespace"),
        ({"pods": [{"name": "ok"}]}, "pods.0.namespace"),
        ({"pods": [{"name": "ok", "namespace": "ns", "node": "bad node"}]}, "pods.0.node"),
        ({"pods": [{"name": "ok", "namespace": "ns", "gpus": ["0", "GPU 1"]}]}, "pods.0.gpus"),
        ({"pods": [{"name": "ok", "namespace": "ns", "phase": "Sleeping"}]}, "pods.0.phase"),
        ({"pods": [{"name": "ok", "namespace": "ns", "pod_id": "x"}]}, "pods.0.pod_id"),
        ({"pods": [{"name": "ok", "namespace": "ns", "color": "red"}]}, "pods.0.color"),
        ({"pods": [{"name": "a", "namespace": "ns"}, {"name": "a", "namespace": "ns"}]}, "pods.1.pod_id"),
        (
            {"pods": [{"name": "ok", "namespace": "ns", "start_time": NOW, "end_time": NOW - timedelta(1)}]},
            "pods.0.end_time",
        ),
    ],
)
async def test_register_validates(service: WorkloadService, change: dict[str, object], name: str) -> None:
    with pytest.raises(InvalidParameter) as info:
        await service.register(ADMIN, body(**change))
    assert info.value.name == name


async def test_only_admins_register_and_orgs_never_change(service: WorkloadService) -> None:
    with pytest.raises(Forbidden):
        await service.register(ACME, body())
    await service.register(ADMIN, body())
    with pytest.raises(Conflict):
        await service.register(ADMIN, body(org="beta"))


@pytest.mark.parametrize("recent", [False, True], ids=["read", "recent"])
async def test_get_pod_for_applies_the_access_rules(service: WorkloadService, recent: bool) -> None:
    """The same rules whether the pod is read now or as kept from a read a moment ago: what is kept
    is the registry's row, never whether someone may see it."""
    await registered(service)
    get_pod_for = partial(service.get_pod_for, recent=recent)
    workload, pod = await get_pod_for(ACME, W, P)
    assert workload.workload_id == W and pod.pod_id == P
    assert (await get_pod_for(ACME, W.upper(), P.upper()))[1].pod_id == P
    assert (await get_pod_for(TEAM_A, W, P))[1].pod_id == P
    assert (await get_pod_for(ADMIN, W, P))[1].pod_id == P

    for principal, wid, pid in (
        (BETA, W, P),  # another org: not found, not forbidden
        (ACME, str(uuid.uuid4()), P),  # unknown workload
        (ACME, W, str(uuid.uuid4())),  # unknown pod
        (ACME, W, P_OTHER),  # a pod of another workload
        (ACME, W_OTHER, P),
    ):
        with pytest.raises(NotFound, match=r"Resource id not found\."):
            await get_pod_for(principal, wid, pid)
    with pytest.raises(Forbidden):
        await get_pod_for(LIMITED, W, P)
    with pytest.raises(Forbidden):
        await get_pod_for(TEAM_A, W_OTHER, P_OTHER)
    for wid, pid in (("nope", P), (W, "nope"), (W + "0", P), ("", P)):
        with pytest.raises(InvalidRequest, match="must be a UUID"):
            await get_pod_for(ACME, wid, pid)


async def test_recent_reads_share_one_registry_read_and_see_changes_made_here(
    service: WorkloadService, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Metrics reads (`recent`) resolve a running pod once per RECENT_READ_TTL_S, concurrent ones
    together; a pod unknown a moment ago is looked for again at once, an ended one every time; an
    update or registration through this service is seen by the next read."""
    reads: list[str] = []
    read = service.registry.get_pod_with_workload
    monkeypatch.setattr(service.registry, "get_pod_with_workload", lambda pid: reads.append(pid) or read(pid))
    with pytest.raises(NotFound):
        await service.get_pod_for(ACME, W, P, recent=True)
    await registered(WorkloadService(service.registry, clock=lambda: NOW))  # by another replica
    found = await asyncio.gather(*(service.get_pod_for(ACME, W, P, recent=True) for _ in range(5)))
    assert {pod for _, pod in found} == {found[0][1]} and reads == [P, P]
    await service.get_pod_for(ACME, W, P, recent=True)
    assert reads == [P, P]
    await service.get_pod_for(ACME, W, P)  # a read now (what an update checks against) always reads
    assert reads == [P, P, P]
    end = NOW + timedelta(hours=1)
    await service.update_pod(ADMIN, W, P, PodFields(end_time=end))
    reads.clear()
    for _ in range(2):  # ended: read as it is now (a change would make its archive stale)
        assert (await service.get_pod_for(ACME, W, P, recent=True))[1].end_time == end
    assert reads == [P, P]
    await service.register(ADMIN, body(project="team-z"))  # moved to another project
    with pytest.raises(Forbidden):
        await service.get_pod_for(TEAM_A, W, P, recent=True)


async def test_uuid_check_comes_before_any_lookup(service: WorkloadService) -> None:
    # another org's workload with a malformed pod id: 400, like an unknown one
    await registered(service)
    with pytest.raises(InvalidRequest):
        await service.get_pod_for(BETA, W, "x")


async def test_list_pods_pages(service: WorkloadService) -> None:
    pods = [
        PodFields(name=f"web-{i}", namespace="team-a", start_time=NOW + timedelta(minutes=i))
        for i in range(5)
    ]
    await service.register(ADMIN, body(pods=pods))
    page = await service.list_pods_for(ACME, W, offset=0, limit=2)
    assert [p.name for p in page.pods] == ["web-0", "web-1"] and page.total == 5 and page.next == 2
    page = await service.list_pods_for(ACME, W, offset=4, limit=2)
    assert [p.name for p in page.pods] == ["web-4"] and page.next is None
    page = await service.list_pods_for(ACME, W, offset=10, limit=2)
    assert page.pods == () and page.next is None
    with pytest.raises(NotFound):
        await service.list_pods_for(BETA, W)
    for offset, limit in ((-1, 10), (0, 0), (0, 501)):
        with pytest.raises(InvalidRequest):
            await service.list_pods_for(ACME, W, offset=offset, limit=limit)


async def test_list_workloads(service: WorkloadService) -> None:
    await registered(service)
    await service.register(ADMIN, body(str(uuid.uuid4()), str(uuid.uuid4()), org="beta"))
    assert (await service.list_workloads(ADMIN)).total == 3
    assert (await service.list_workloads(ADMIN, org="beta")).total == 1
    assert (await service.list_workloads(ACME)).total == 2
    assert [w.workload_id for w in (await service.list_workloads(TEAM_A)).workloads] == [W]
    with pytest.raises(Forbidden):
        await service.list_workloads(ACME, org="beta")


async def test_update_pod(service: WorkloadService) -> None:
    await registered(service)
    end = NOW + timedelta(hours=1)
    pod = await service.update_pod(ADMIN, W, P, PodFields(end_time=end, phase="Succeeded", gpus=None))
    assert pod.end_time == end and pod.phase is PodPhase.SUCCEEDED and pod.gpus == ()
    with pytest.raises(InvalidParameter) as info:
        await service.update_pod(ADMIN, W, P, PodFields(end_time=NOW - timedelta(days=1)))
    assert info.value.name == "end_time"
    with pytest.raises(InvalidParameter):
        await service.update_pod(ADMIN, W, P, PodFields(phase=None))
    with pytest.raises(InvalidParameter):
        await service.update_pod(ADMIN, W, P, {"pod_id": P_OTHER})  # type: ignore[typeddict-unknown-key]
    with pytest.raises(NotFound):
        await service.update_pod(ADMIN, W, P_OTHER, PodFields(node="n"))
    with pytest.raises(Forbidden):
        await service.update_pod(ACME, W, P, PodFields(node="n"))
