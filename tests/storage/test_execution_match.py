"""`ExecutionMatch`: the execution listing's filters (the usage page's links to a group's executions)
on each dialect: the group keys (None: without one, or an empty one), the window (ran in it), and the
counts by status over the same executions."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from gpulens.domain.models import Execution, ExecutionStatus
from gpulens.storage.registry import ExecutionMatch, Registry

T0 = datetime(2026, 11, 28, 10, 0, tzinfo=UTC)
H = timedelta(hours=1)


def seed(registry: Registry) -> None:
    rows: list[tuple[str, dict[str, object]]] = [
        ("a", {"user": "alice", "project": "nlp", "hardware_profile": "gpu.h100", "end_time": T0 + 10 * H}),
        ("b", {"user": "alice", "project": "vision", "hardware_profile": "", "end_time": T0 + 2 * H}),
        ("c", {"user": "bob", "hostname": "gpu-node-2", "end_time": None}),  # still running
        ("d", {"start_time": None, "status": ExecutionStatus.PENDING}),
        ("x", {"org": "beta", "user": "alice"}),
    ]
    for i, (execution_id, changes) in enumerate(rows):
        fields: dict[str, object] = {
            "execution_id": execution_id,
            "org": "acme",
            "hostname": "gpu-node-1",
            "gpus": ("0",),
            "status": ExecutionStatus.COMPLETED if changes.get("end_time") else ExecutionStatus.RUNNING,
            "created_at": T0 + i * timedelta(minutes=1),
            "start_time": T0,
        }
        fields.update(changes)
        registry.upsert_execution(Execution(**fields))  # type: ignore[arg-type]


def ids(registry: Registry, match: ExecutionMatch, projects: list[str] | None = None) -> list[str]:
    rows, total = registry.list_executions(org="acme", projects=projects, match=match, limit=None)
    counts = registry.count_by_status(org="acme", projects=projects, match=match)
    assert total == len(rows) == sum(counts.values())
    return [e.execution_id for e in rows]


def test_keys_window_and_counts(registry: Registry) -> None:
    seed(registry)
    assert ids(registry, ExecutionMatch()) == ["d", "c", "b", "a"]
    assert ids(registry, ExecutionMatch({"user": "alice"})) == ["b", "a"]  # never beta's
    assert ids(registry, ExecutionMatch({"user": "alice", "project": "nlp"})) == ["a"]
    assert ids(registry, ExecutionMatch({"user": None})) == ["d"]
    assert ids(registry, ExecutionMatch({"project": None, "user": "bob"})) == ["c"]
    assert ids(registry, ExecutionMatch({"hostname": "gpu-node-2"})) == ["c"]
    assert ids(registry, ExecutionMatch({"hardware_profile": None})) == ["d", "c", "b"]  # "" is none too
    # ran in [since, until): started before until, not ended by since (a running one has not ended)
    assert ids(registry, ExecutionMatch(since=T0 + 3 * H, until=T0 + 4 * H)) == ["c", "a"]
    assert ids(registry, ExecutionMatch(since=T0 + 2 * H)) == ["c", "a"]
    assert ids(registry, ExecutionMatch(until=T0)) == []
    assert ids(registry, ExecutionMatch(until=T0 + H)) == ["c", "b", "a"]  # the pending one never ran
    assert ids(registry, ExecutionMatch({"user": "alice"}), projects=["vision"]) == ["b"]
