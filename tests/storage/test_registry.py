"""The registry on SQLite and PostgreSQL: schema, orgs, keys, executions."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import text
from sqlalchemy.exc import IntegrityError

from gpulens.domain.errors import Conflict
from gpulens.domain.keys import hash_key
from gpulens.domain.models import Execution, ExecutionStatus
from gpulens.storage.registry import Registry
from gpulens.storage.tables import Base
from tests.storage.conftest import run_concurrently

T0 = datetime(2026, 11, 28, 10, 0, tzinfo=UTC)


def make(execution_id: str = "e1", org: str = "acme", **kw: object) -> Execution:
    base: dict[str, object] = {
        "execution_id": execution_id,
        "org": org,
        "hostname": "gpu-node-1",
        "gpus": ("0", "3"),
        "status": ExecutionStatus.RUNNING,
        "created_at": T0,
        "start_time": T0,
    }
    base.update(kw)
    return Execution(**base)  # type: ignore[arg-type]


# ---------------------------------------------------------------- schema


def test_migrations_create_exactly_the_models(registry: Registry) -> None:
    with registry.engine.connect() as conn:
        context = MigrationContext.configure(conn, opts={"compare_type": True})
        assert compare_metadata(context, Base.metadata) == []
        assert context.get_current_revision() == "0009"


def test_migrate_twice_is_a_no_op(registry: Registry) -> None:
    registry.ensure_org("acme")
    registry.migrate()
    assert registry.list_orgs() == ["acme"]
    registry.ping()


def test_migrate_works_from_any_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    registry = Registry.from_url(f"sqlite:///{tmp_path / 'x.db'}")
    try:
        registry.migrate()
        assert registry.list_orgs() == []
        with registry.engine.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
            assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
    finally:
        registry.dispose()


def test_in_memory_sqlite_keeps_one_database() -> None:
    registry = Registry.from_url("sqlite://")
    try:
        registry.migrate()
        registry.ensure_org("acme")
        assert registry.list_orgs() == ["acme"]
    finally:
        registry.dispose()


def test_postgres_urls_get_the_psycopg_driver() -> None:
    registry = Registry.from_url("postgresql://u:secret@db.example:5432/gpulens")
    try:
        assert registry.engine.url.drivername == "postgresql+psycopg"
        assert "secret" not in registry.url
    finally:
        registry.dispose()


RAW_INSERT = (
    "INSERT INTO executions (execution_id, org, gpus, status, created_at, updated_at, system_errors)"
    " VALUES ('x', :org, '[]', :status, :t, :t, '[]')"
)


def test_foreign_keys_and_status_check_are_enforced(registry: Registry) -> None:
    now = datetime.now(UTC).replace(tzinfo=None).isoformat(sep=" ")
    with pytest.raises(IntegrityError), registry.engine.begin() as conn:
        conn.execute(text(RAW_INSERT), {"org": "nobody", "status": "running", "t": now})
    registry.ensure_org("acme")
    with pytest.raises(IntegrityError), registry.engine.begin() as conn:
        conn.execute(text(RAW_INSERT), {"org": "acme", "status": "exploded", "t": now})


# ---------------------------------------------------------------- orgs


def test_orgs_are_created_once(registry: Registry) -> None:
    assert registry.ensure_org("acme", "Acme Inc.") is True
    assert registry.ensure_org("acme") is False
    assert registry.org_exists("acme")
    assert not registry.org_exists("other")
    registry.ensure_org("beta")
    assert registry.list_orgs() == ["acme", "beta"]


# ---------------------------------------------------------------- keys


def test_keys_are_stored_only_as_hashes(registry: Registry) -> None:
    key, plaintext = registry.create_key("acme", name="ci", now=T0)
    assert plaintext.startswith("lk_")
    assert len(plaintext) >= 40
    assert key.prefix == plaintext[:8]
    assert len(key.prefix) == 8
    assert key.org == "acme"
    assert key.is_active
    assert not key.is_admin
    assert key.projects is None
    assert key.created_at == T0
    assert registry.org_exists("acme")  # created with the key
    with registry.engine.connect() as conn:
        rows = conn.execute(text("SELECT * FROM api_keys")).all()
    assert len(rows) == 1
    assert all(plaintext not in str(value) for value in rows[0])
    assert registry.find_key(hash_key(plaintext)) == key
    assert registry.find_key(hash_key(plaintext + "x")) is None
    assert registry.get_key(key.key_id) == key
    assert registry.find_keys_by_prefix(key.prefix) == [key]


def test_key_attributes_round_trip(registry: Registry) -> None:
    expires = datetime(2027, 1, 1, 12, 0, tzinfo=timezone(timedelta(hours=2)))
    key, _ = registry.create_key(
        "acme", name="limited", is_admin=True, projects=["b", "a", "a"], expires_at=expires
    )
    again = registry.get_key(key.key_id)
    assert again is not None
    assert again.is_admin
    assert again.projects == frozenset({"a", "b"})
    assert again.expires_at == expires
    assert again.expires_at is not None
    assert again.expires_at.tzinfo == UTC
    assert again.refusal(datetime(2026, 12, 31, tzinfo=UTC)) is None
    assert again.refusal(datetime(2027, 1, 1, 10, 0, tzinfo=UTC)) == "API key has expired"


def test_revoke_keeps_the_row_and_notifies(registry: Registry) -> None:
    seen: list[str] = []
    registry.add_key_listener(seen.append)
    key, plaintext = registry.create_key("acme", name="a")
    other, _ = registry.create_key("acme", name="b")
    revoked = registry.revoke_key(key.key_id, now=T0)
    assert revoked is not None
    assert revoked.is_revoked
    assert not revoked.is_active
    assert revoked.revoked_at == T0
    assert seen == [key.key_id]
    assert registry.list_keys("acme") == [other]
    assert [k.key_id for k in registry.list_keys("acme", include_revoked=True)] == [key.key_id, other.key_id]
    found = registry.find_key(hash_key(plaintext))
    assert found is not None
    assert found.refusal(datetime.now(UTC)) == "API key has been revoked"
    assert registry.revoke_key("no-such-key") is None


def test_toggle_and_set_active(registry: Registry) -> None:
    key, _ = registry.create_key("acme", name="a")
    off = registry.set_key_active(key.key_id)
    assert off is not None
    assert not off.is_active
    assert off.refusal(datetime.now(UTC)) == "API key is inactive"
    on = registry.set_key_active(key.key_id)
    assert on is not None
    assert on.is_active
    assert registry.set_key_active(key.key_id, True) is not None
    assert registry.set_key_active("missing") is None
    registry.revoke_key(key.key_id)
    with pytest.raises(Conflict):
        registry.set_key_active(key.key_id, True)


def test_list_keys_by_org(registry: Registry) -> None:
    a, _ = registry.create_key("acme", name="a")
    b, _ = registry.create_key("beta", name="b")
    assert registry.list_keys("acme") == [a]
    assert {k.key_id for k in registry.list_keys()} == {a.key_id, b.key_id}


def test_touch_never_moves_backwards(registry: Registry) -> None:
    key, _ = registry.create_key("acme", name="a")
    registry.touch_key(key.key_id, T0)
    registry.touch_key(key.key_id, T0 - timedelta(minutes=5))
    got = registry.get_key(key.key_id)
    assert got is not None
    assert got.last_used_at == T0
    registry.touch_key(key.key_id, T0 + timedelta(minutes=1))
    got = registry.get_key(key.key_id)
    assert got is not None
    assert got.last_used_at == T0 + timedelta(minutes=1)


# ---------------------------------------------------------------- executions


def test_upsert_creates_then_updates_only_the_given_fields(registry: Registry) -> None:
    execution, created = registry.upsert_execution(make(file_name="train.py", hardware_profile="gpu.h100"))
    assert created
    assert execution == make(file_name="train.py", hardware_profile="gpu.h100")
    assert registry.get_execution("e1") == execution
    assert registry.org_exists("acme")

    end = T0 + timedelta(hours=1)
    change = make(
        status=ExecutionStatus.COMPLETED,
        end_time=end,
        file_name="ignored.py",
        created_at=T0 + timedelta(days=1),
    )
    updated, created = registry.upsert_execution(change, ["status", "end_time"])
    assert not created
    assert updated.status is ExecutionStatus.COMPLETED
    assert updated.end_time == end
    assert updated.file_name == "train.py"  # not in the field list
    assert updated.created_at == T0  # never changes
    assert registry.get_execution("e1") == updated


def test_who_ran_it_round_trips(registry: Registry) -> None:
    stored, _ = registry.upsert_execution(make(user="alice@example.com", project="vision"))
    assert (stored.user, stored.project) == ("alice@example.com", "vision")
    changed, _ = registry.upsert_execution(make(user="bob"), ["user"])
    assert changed.user == "bob" and changed.project == "vision"
    assert registry.get_execution("e1") == changed


def test_upsert_refuses_to_move_an_execution_to_another_org(registry: Registry) -> None:
    registry.upsert_execution(make())
    with pytest.raises(Conflict):
        registry.upsert_execution(make(org="beta"))
    again = registry.get_execution("e1")
    assert again is not None
    assert again.org == "acme"


def test_upsert_rejects_unknown_fields(registry: Registry) -> None:
    with pytest.raises(ValueError, match="not updatable"):
        registry.upsert_execution(make(), ["execution_id"])


def test_times_are_stored_in_utc_with_microseconds(registry: Registry) -> None:
    local = datetime(2026, 11, 28, 12, 0, 0, 123456, tzinfo=timezone(timedelta(hours=2)))
    execution, _ = registry.upsert_execution(make(start_time=local, end_time=None))
    assert execution.start_time == local
    assert execution.start_time is not None
    assert execution.start_time.tzinfo == UTC
    assert execution.start_time.hour == 10
    stored = registry.get_execution("e1")
    assert stored is not None
    assert stored.start_time == local
    assert stored.start_time is not None
    assert stored.start_time.tzinfo == UTC
    assert stored.start_time.microsecond == 123456
    assert stored.end_time is None


NAIVE = datetime(2026, 1, 1, 12, 0)


def test_naive_datetimes_reaching_the_registry_raise(registry: Registry) -> None:
    """Storage only takes aware datetimes: the services convert at the edges (naive = UTC), so a
    naive one here is a bug, raised as TypeError on every write path, and nothing is written."""
    with pytest.raises(TypeError, match="naive"):
        registry.upsert_execution(make(start_time=NAIVE))
    assert registry.get_execution("e1") is None
    with pytest.raises(TypeError, match="naive"):
        registry.upsert_execution(make(created_at=NAIVE))
    registry.upsert_execution(make())
    with pytest.raises(TypeError, match="naive"):
        registry.update_execution("e1", {"end_time": NAIVE})
    with pytest.raises(TypeError, match="naive"):
        registry.update_execution("e1", {"status": ExecutionStatus.FAILED}, now=NAIVE)
    with pytest.raises(TypeError, match="naive"):
        registry.ensure_org("beta", now=NAIVE)
    with pytest.raises(TypeError, match="naive"):
        registry.create_key("acme", name="k", expires_at=NAIVE)
    key, _ = registry.create_key("acme", name="k")
    with pytest.raises(TypeError, match="naive"):
        registry.touch_key(key.key_id, NAIVE)
    with pytest.raises(TypeError, match="naive"):
        registry.revoke_key(key.key_id, now=NAIVE)
    stored = registry.get_execution("e1")
    assert stored is not None and stored.end_time is None and stored.status is ExecutionStatus.RUNNING
    assert not registry.org_exists("beta")


def test_times_round_trip_as_aware_utc(registry: Registry) -> None:
    """What goes in at any offset comes back the same instant, in UTC, on every read path."""
    plus5 = timezone(timedelta(hours=5, minutes=30))
    start = datetime(2026, 11, 28, 15, 30, 0, 250000, tzinfo=plus5)
    registry.upsert_execution(make(created_at=start, start_time=start, end_time=None))
    registry.update_execution("e1", {"end_time": start + timedelta(hours=1)})
    [listed], _ = registry.list_executions(org="acme")
    for got in (registry.get_execution("e1"), listed):
        assert got is not None and got.start_time is not None and got.end_time is not None
        assert (
            got.created_at == got.start_time == start == datetime(2026, 11, 28, 10, 0, 0, 250000, tzinfo=UTC)
        )
        assert got.end_time - got.start_time == timedelta(hours=1)
        assert got.created_at.tzinfo is got.start_time.tzinfo is got.end_time.tzinfo is UTC


def test_lists_round_trip(registry: Registry) -> None:
    registry.upsert_execution(make(gpus=(), system_errors=("OOM", "node lost")))
    stored = registry.get_execution("e1")
    assert stored is not None
    assert stored.gpus == ()
    assert stored.system_errors == ("OOM", "node lost")
    registry.upsert_execution(make(gpus=("GPU-0b5e1c2a-aaaa-bbbb-cccc-000000000000", "MIG-1")))
    stored = registry.get_execution("e1")
    assert stored is not None
    assert stored.gpus == ("GPU-0b5e1c2a-aaaa-bbbb-cccc-000000000000", "MIG-1")


def test_update_execution(registry: Registry) -> None:
    registry.upsert_execution(make())
    updated = registry.update_execution(
        "e1",
        {"status": ExecutionStatus.FAILED, "return_code": 2, "system_errors": ("boom",), "hostname": None},
    )
    assert updated is not None
    assert updated.status is ExecutionStatus.FAILED
    assert updated.return_code == 2
    assert updated.system_errors == ("boom",)
    assert updated.hostname is None
    assert updated.gpus == ("0", "3")
    assert registry.get_execution("e1") == updated
    assert registry.update_execution("missing", {"status": ExecutionStatus.FAILED}) is None
    with pytest.raises(ValueError, match="not updatable"):
        registry.update_execution("e1", {"org": "beta"})


def test_list_filters_orders_and_counts(registry: Registry) -> None:
    statuses = [
        ExecutionStatus.RUNNING,
        ExecutionStatus.COMPLETED,
        ExecutionStatus.PENDING,
        ExecutionStatus.FAILED,
    ]
    for i, status in enumerate(statuses):
        registry.upsert_execution(make(f"a{i}", status=status, created_at=T0 + timedelta(minutes=i)))
    registry.upsert_execution(make("b0", org="beta", created_at=T0 + timedelta(hours=1)))
    registry.upsert_execution(make("a9", project="vision", created_at=T0 - timedelta(hours=1)))

    rows, total = registry.list_executions(org="acme")
    assert [e.execution_id for e in rows] == ["a3", "a2", "a1", "a0", "a9"]
    assert total == 5

    rows, total = registry.list_executions(org="acme", limit=2, offset=1)
    assert [e.execution_id for e in rows] == ["a2", "a1"]
    assert total == 5

    active = (ExecutionStatus.PENDING, ExecutionStatus.STARTING, ExecutionStatus.RUNNING)
    rows, total = registry.list_executions(org="acme", statuses=active)
    assert [e.execution_id for e in rows] == ["a2", "a0", "a9"]
    assert total == 3

    rows, total = registry.list_executions(org="acme", projects=["nlp"])
    assert "a9" not in [e.execution_id for e in rows]
    assert total == 4
    rows, _ = registry.list_executions(org="acme", projects=["vision"])
    assert "a9" in [e.execution_id for e in rows]

    rows, total = registry.list_executions(limit=None)
    assert total == 6
    assert rows[0].execution_id == "b0"

    counts = registry.count_by_status(org="acme")
    assert counts[ExecutionStatus.RUNNING] == 2
    assert counts[ExecutionStatus.COMPLETED] == 1
    assert counts[ExecutionStatus.ABORTED] == 0
    assert set(counts) == set(ExecutionStatus)
    assert registry.count_by_status(org="acme", projects=[])[ExecutionStatus.RUNNING] == 1


def test_concurrent_upserts_create_once(registry: Registry) -> None:
    created = run_concurrently(6, lambda i: registry.upsert_execution(make("race", return_code=i))[1])
    assert sorted(created) == [False] * 5 + [True]
