"""Workloads and pods in the registry, on SQLite and PostgreSQL: upsert, listing, updates, discovery sync."""

from __future__ import annotations

import uuid
from dataclasses import replace
from datetime import UTC, datetime, timedelta, timezone

import pytest

from gpulens.domain.errors import Conflict
from gpulens.domain.workloads import Pod, PodPhase, Workload
from gpulens.storage.registry import Registry
from tests.storage.conftest import run_concurrently

T0 = datetime(2026, 11, 28, 10, 0, tzinfo=UTC)
W1 = "3f2b8c1e-5a4d-4e6f-9b7a-1c2d3e4f5a6b"
W2 = "9a8b7c6d-5e4f-4a3b-8c2d-1e0f9a8b7c6d"


def wl(workload_id: str = W1, org: str = "acme", **kw: object) -> Workload:
    base: dict[str, object] = {
        "workload_id": workload_id,
        "name": "llm-serve",
        "org": org,
        "project": "team-a",
        "created_at": T0,
    }
    base.update(kw)
    return Workload(**base)  # type: ignore[arg-type]


def pod(pod_id: str | None = None, workload_id: str = W1, **kw: object) -> Pod:
    base: dict[str, object] = {
        "pod_id": pod_id or str(uuid.uuid4()),
        "workload_id": workload_id,
        "name": "llm-serve-0",
        "namespace": "team-a",
        "node": "gpu-node-1",
        "gpus": ("0", "1"),
        "phase": PodPhase.RUNNING,
        "start_time": T0,
    }
    base.update(kw)
    return Pod(**base)  # type: ignore[arg-type]


def test_upsert_creates_then_updates(registry: Registry) -> None:
    p = pod()
    stored, created = registry.upsert_workload(wl(), [p], now=T0)
    assert created and stored == wl()
    assert registry.org_exists("acme")
    assert registry.get_pod(p.pod_id) == p

    later = T0 + timedelta(hours=1)
    stored, created = registry.upsert_workload(
        wl(name="renamed", project=None, created_at=later),
        [replace(p, phase=PodPhase.SUCCEEDED, end_time=later)],
    )
    assert not created
    assert stored.name == "renamed" and stored.project is None
    assert stored.created_at == T0  # kept
    got = registry.get_pod(p.pod_id)
    assert got is not None and got.phase is PodPhase.SUCCEEDED and got.end_time == later
    assert registry.get_workload(W1) == stored
    assert registry.get_workload(W2) is None and registry.get_pod(str(uuid.uuid4())) is None


def test_another_orgs_workload_id_or_another_workloads_pod_is_a_conflict(registry: Registry) -> None:
    p = pod()
    registry.upsert_workload(wl(), [p])
    with pytest.raises(Conflict):
        registry.upsert_workload(wl(org="beta"))
    registry.upsert_workload(wl(W2))
    with pytest.raises(Conflict):
        registry.upsert_workload(wl(W2, name="changed"), [replace(p, workload_id=W2)])
    # nothing of the refused call was written
    w2 = registry.get_workload(W2)
    assert w2 is not None and w2.name == "llm-serve"
    assert registry.get_pod(p.pod_id) == p


def test_pods_must_name_the_workload(registry: Registry) -> None:
    with pytest.raises(ValueError, match="names workload"):
        registry.upsert_workload(wl(), [pod(workload_id=W2)])


def test_times_are_utc_and_gpus_round_trip(registry: Registry) -> None:
    plus2 = timezone(timedelta(hours=2))
    p = pod(start_time=datetime(2026, 11, 28, 12, 0, 0, 123456, tzinfo=plus2), gpus=("GPU-abc-1", "3"))
    registry.upsert_workload(wl(created_at=T0.astimezone(plus2)), [p])
    got = registry.get_pod(p.pod_id)
    assert got is not None
    assert got.start_time == datetime(2026, 11, 28, 10, 0, 0, 123456, tzinfo=UTC)
    assert got.start_time.tzinfo == UTC
    assert got.gpus == ("GPU-abc-1", "3")
    w = registry.get_workload(W1)
    assert w is not None and w.created_at == T0 and w.created_at.tzinfo == UTC


def test_naive_workload_and_pod_times_raise(registry: Registry) -> None:
    """A naive created_at was once read as this machine's local time; now it is a bug, raised on
    every write path (upsert, update, discovery sync), and nothing is written."""
    naive = datetime(2026, 11, 28, 10, 0)
    with pytest.raises(TypeError, match="naive"):
        registry.upsert_workload(wl(created_at=naive))
    with pytest.raises(TypeError, match="naive"):
        registry.upsert_workload(wl(), [pod(start_time=naive)])
    with pytest.raises(TypeError, match="naive"):
        registry.sync_discovered([(wl(created_at=naive), [])])
    assert registry.get_workload(W1) is None
    p = pod()
    registry.upsert_workload(wl(), [p])
    with pytest.raises(TypeError, match="naive"):
        registry.sync_discovered([(wl(created_at=naive), [])])
    with pytest.raises(TypeError, match="naive"):
        registry.update_pod(W1, p.pod_id, {"end_time": naive})
    assert registry.get_pod(p.pod_id) == p


def test_list_workloads_filters_orders_and_counts(registry: Registry) -> None:
    ids = [str(uuid.UUID(int=i + 1)) for i in range(5)]
    for i, wid in enumerate(ids):
        registry.upsert_workload(
            wl(wid, org="acme" if i < 4 else "beta", project=("a", "b", None, "a", "a")[i],
               created_at=T0 + timedelta(minutes=i))
        )  # fmt: skip
    rows, total = registry.list_workloads(org="acme")
    assert total == 4 and [w.workload_id for w in rows] == ids[3::-1]  # newest first
    rows, total = registry.list_workloads(org="acme", projects=["a"])
    assert total == 3 and {w.project for w in rows} == {"a", None}  # no project: visible to all
    rows, total = registry.list_workloads(limit=2, offset=1)
    assert total == 5 and [w.workload_id for w in rows] == [ids[3], ids[2]]


def test_list_pods_orders_by_start_then_name(registry: Registry) -> None:
    pods = [
        pod(name="b", start_time=T0 + timedelta(minutes=5)),
        pod(name="a", start_time=T0 + timedelta(minutes=5)),
        pod(name="z", start_time=T0),
        pod(name="pending", start_time=None, phase=PodPhase.PENDING),
    ]
    registry.upsert_workload(wl(), pods)
    registry.upsert_workload(wl(W2), [pod(workload_id=W2)])
    rows, total = registry.list_pods(W1)
    assert total == 4 and [p.name for p in rows] == ["z", "a", "b", "pending"]
    rows, total = registry.list_pods(W1, limit=2, offset=2)
    assert total == 4 and [p.name for p in rows] == ["b", "pending"]
    assert registry.list_pods(str(uuid.uuid4())) == ([], 0)


def test_update_pod(registry: Registry) -> None:
    p = pod()
    registry.upsert_workload(wl(), [p])
    registry.upsert_workload(wl(W2))
    end = T0 + timedelta(hours=2)
    got = registry.update_pod(W1, p.pod_id, {"end_time": end, "phase": PodPhase.FAILED, "gpus": ()})
    assert got == replace(p, end_time=end, phase=PodPhase.FAILED, gpus=())
    assert registry.get_pod(p.pod_id) == got
    assert registry.update_pod(W2, p.pod_id, {"node": "x"}) is None  # another workload's pod
    assert registry.update_pod(W1, str(uuid.uuid4()), {"node": "x"}) is None
    with pytest.raises(ValueError, match="not updatable"):
        registry.update_pod(W1, p.pod_id, {"workload_id": W2})


def test_deleting_an_org_cascades(registry: Registry) -> None:
    p = pod()
    registry.upsert_workload(wl(), [p])
    with registry.engine.begin() as conn:
        conn.exec_driver_sql("DELETE FROM orgs WHERE slug = 'acme'")
    assert registry.get_workload(W1) is None and registry.get_pod(p.pod_id) is None


def test_sync_discovered_is_idempotent_and_never_forgets(registry: Registry) -> None:
    a, b = pod(name="web-0", gpus=()), pod(name="web-1", gpus=(), start_time=None, node=None)
    items = [(wl(), [a, b]), (wl(W2, name="db"), [pod(workload_id=W2, name="db-0", gpus=())])]
    first = registry.sync_discovered(items, now=T0)
    assert (first.workloads_created, first.pods_created) == (2, 3)
    again = registry.sync_discovered(items, now=T0)
    assert (again.workloads_created, again.workloads_updated, again.workloads_unchanged) == (0, 0, 2)
    assert (again.pods_created, again.pods_updated, again.pods_unchanged) == (0, 0, 3)

    # an admin set GPUs: discovery leaves them alone; unknown values never clear stored ones
    registry.update_pod(W1, a.pod_id, {"gpus": ("3",)})
    end = T0 + timedelta(hours=1)
    later = [(wl(created_at=T0 + timedelta(days=1)), [replace(a, node=None, start_time=None, end_time=end,
                                                              phase=PodPhase.SUCCEEDED)])]  # fmt: skip
    counts = registry.sync_discovered(later, now=end)
    assert (counts.workloads_unchanged, counts.pods_updated) == (1, 1)
    got = registry.get_pod(a.pod_id)
    assert got is not None
    assert (got.gpus, got.node, got.start_time, got.end_time) == (("3",), "gpu-node-1", T0, end)
    assert got.phase is PodPhase.SUCCEEDED
    w = registry.get_workload(W1)
    assert w is not None and w.created_at == T0  # only ever moves earlier
    registry.sync_discovered([(wl(created_at=T0 - timedelta(hours=1)), [])])
    w = registry.get_workload(W1)
    assert w is not None and w.created_at == T0 - timedelta(hours=1)


def test_sync_discovered_skips_other_orgs_and_workloads(registry: Registry) -> None:
    p = pod(workload_id=W2, gpus=())
    registry.upsert_workload(wl(org="beta"))
    registry.upsert_workload(wl(W2), [p])
    counts = registry.sync_discovered([(wl(), [pod()]), (wl(str(uuid.uuid4())), [replace(p, name="moved")])])
    assert counts.workloads_created == 1 and counts.pods_created == 0
    assert len(counts.skipped) == 2
    assert "another org" in counts.skipped[0] and "another workload" in counts.skipped[1]
    got = registry.get_pod(p.pod_id)
    assert got is not None and got.workload_id == W2 and got.name == "llm-serve-0"


def test_concurrent_registrations_and_syncs_create_once(registry: Registry) -> None:
    shared = pod(gpus=())

    def register_or_sync(i: int) -> int:
        """How many workloads this call created: odd i register, even i sync discovery."""
        if i % 2:
            _, created = registry.upsert_workload(wl(name=f"w{i}"), [shared])
            return int(created)
        return registry.sync_discovered([(wl(), [shared])]).workloads_created

    assert sum(run_concurrently(6, register_or_sync)) == 1
    assert registry.list_pods(W1)[1] == 1


def test_a_pod_with_its_workload_in_one_read(registry: Registry) -> None:
    """What a pod-metrics request resolves: the same objects as get_workload and get_pod."""
    p = pod(gpus=("GPU-1a2b", "3"), phase=PodPhase.FAILED, end_time=T0 + timedelta(hours=2))
    registry.upsert_workload(wl(project=None), [p], now=T0)
    assert registry.get_pod_with_workload(p.pod_id) == (registry.get_workload(W1), p)
    assert registry.get_pod_with_workload(p.pod_id) == (wl(project=None), p)
    assert registry.get_pod_with_workload(str(uuid.uuid4())) is None
    assert registry.get_workload(W2) is None and registry.get_pod(str(uuid.uuid4())) is None
