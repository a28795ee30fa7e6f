"""The stored summaries' table (storage/summaries.py) on SQLite and PostgreSQL: rows replaced whole,
bodies served only for their key, executions with their summaries in one query, what is pending."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from gpulens.domain.models import Execution, ExecutionStatus
from gpulens.domain.usage import UsageSlice
from gpulens.storage.registry import Registry
from gpulens.storage.summaries import SummaryInfo, SummaryStore

T0 = datetime(2026, 11, 20, 10, 0, tzinfo=UTC)
ROW = {
    "meanGpuUtilizationPercent": 61.25,
    "cost": {"total": 12.5, "currency": "USD"},
    "findings": [{"kind": "input_bound", "severity": "warning", "count": 2, "gpuHours": 3.5}],
}


def execution(execution_id: str, end: datetime | None, **kw: object) -> Execution:
    base: dict[str, object] = {
        "execution_id": execution_id,
        "org": "acme",
        "hostname": "gpu-node-1",
        "gpus": ("0",),
        "status": ExecutionStatus.COMPLETED,
        "created_at": T0,
        "start_time": T0,
        "end_time": end,
    }
    base.update(kw)
    return Execution(**base)  # type: ignore[arg-type]


def info(
    execution_id: str, key: str = "k1", settings: str = "s1", updated: datetime = T0, **kw: object
) -> SummaryInfo:
    base: dict[str, object] = {
        "execution_id": execution_id,
        "org": "acme",
        "key_digest": key,
        "settings_digest": settings,
        "source_updated_at": updated,
        "computed_at": T0 + timedelta(days=1),
        "compute_ms": 850,
        "byte_count": 5,
        "row": ROW,
    }
    base.update(kw)
    return SummaryInfo(**base)  # type: ignore[arg-type]


@pytest.fixture
def store(registry: Registry) -> SummaryStore:
    return SummaryStore(registry)


def test_a_body_is_served_only_for_its_key_and_replaced_whole(store: SummaryStore) -> None:
    assert store.body("e1", "k1") is None and store.get("e1") is None
    store.put(info("e1"), b'{"a":1}')
    assert store.body("e1", "k1") == b'{"a":1}'
    assert store.body("e1", "k2") is None  # stale: another key
    assert store.get("e1") == info("e1")
    body = bytes(range(256)) * 40  # any bytes, as they were given
    store.put(info("e1", key="k2", row={"cost": None}, byte_count=len(body)), body)
    assert store.body("e1", "k1") is None and store.body("e1", "k2") == body
    got = store.get("e1")
    assert got is not None and got.row == {"cost": None} and got.key_digest == "k2"
    assert store.get("other") is None and store.body("other", "k2") is None  # one row per execution


def test_executions_come_with_their_summaries_in_one_read(registry: Registry, store: SummaryStore) -> None:
    end = T0 + timedelta(hours=72)
    registry.upsert_execution(execution("e1", end), now=end)
    registry.upsert_execution(execution("e2", None, status=ExecutionStatus.RUNNING), now=T0)
    store.put(info("e1"), b"{}")
    found = store.executions(["e1", "e2", "nobody"])
    assert set(found) == {"e1", "e2"}
    assert found["e1"].execution == execution("e1", end) and found["e1"].updated_at == end
    assert found["e1"].summary == info("e1")
    assert found["e2"].summary is None
    assert store.executions([]) == {}


def test_pending_finished_executions(registry: Registry, store: SummaryStore) -> None:
    now = T0 + timedelta(days=10)
    ended = {f"e{i}": now - timedelta(hours=i + 1) for i in range(6)}
    for execution_id, end in ended.items():
        registry.upsert_execution(execution(execution_id, end), now=end)
    registry.upsert_execution(execution("running", None, status=ExecutionStatus.RUNNING), now=now)
    registry.upsert_execution(execution("no-host", now - timedelta(hours=1), hostname=None), now=now)
    registry.upsert_execution(execution("old", now - timedelta(days=9)), now=now)
    registry.upsert_execution(execution("just-ended", now - timedelta(minutes=1)), now=now)

    def pending(**kw: object) -> list[str]:
        args: dict[str, object] = {
            "ended_after": now - timedelta(days=7),
            "ready_before": now - timedelta(minutes=5),
            "settings_digest": "s1",
        }
        args.update(kw)
        return [r.execution.execution_id for r in store.pending(**args)]  # type: ignore[arg-type]

    assert pending() == ["e0", "e1", "e2", "e3", "e4", "e5"]  # newest first
    assert pending(limit=2) == ["e0", "e1"]
    assert pending(exclude=["e0", "e2"]) == ["e1", "e3", "e4", "e5"]
    store.put(info("e0", updated=ended["e0"]), b"{}")  # fresh for its row and the settings
    store.put(info("e1", settings="s0", updated=ended["e1"]), b"{}")  # other settings
    store.put(info("e2", updated=ended["e2"] - timedelta(seconds=1)), b"{}")  # its row changed since
    found = store.pending(ended_after=now - timedelta(days=7), ready_before=now, settings_digest="s1")
    assert [r.execution.execution_id for r in found] == ["just-ended", "e1", "e2", "e3", "e4", "e5"]
    assert [r.summary is not None for r in found] == [False, True, True, False, False, False]
    store.mark("e1", settings_digest="s1", source_updated_at=ended["e1"])
    store.mark("e2", settings_digest="s1", source_updated_at=ended["e2"])
    assert pending() == ["e3", "e4", "e5"]


def test_a_summary_stores_its_hourly_slices_and_replaces_them(store: SummaryStore) -> None:
    h = 1_763_632_800_000  # 2025-11-20 10:00 UTC, an hour's start
    first = [
        UsageSlice(h, h + 60_000, h + 3_600_000, 7_080_000, 600_000, 0, 30_000, 0, 3_100.5, 2.5e6, 1.25),
        UsageSlice(
            h + 3_600_000, h + 3_600_000, h + 5_400_000, 3_600_000, 0, 90_000, 0, 15_000, 1_000.0, 1e6
        ),
    ]
    store.put(info("e1"), b"{}", first)
    assert store.slices("e1") == first
    assert store.slices("e2") == []
    again = [first[0]]  # computed again (another key): the old slices go with the old body
    store.put(info("e1", key="k2"), b"{}", again)
    assert store.slices("e1") == again
    store.put(info("e1", key="k3"), b"{}")
    assert store.slices("e1") == []
