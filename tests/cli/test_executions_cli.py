"""`gpulens executions add|update|list`: the admin registration path from the command line."""

from __future__ import annotations

import json
import sqlite3
import uuid
from datetime import UTC, datetime

import pytest
from typer.testing import Result

from gpulens.cli.executions import app
from gpulens.domain.models import ExecutionStatus
from gpulens.storage.registry import Registry
from tests.cli.conftest import invoke, invoke_ok, one_line_error


def run(*args: str) -> Result:
    return invoke(app, *args)


def ok(*args: str) -> Result:
    return invoke_ok(app, *args)


def stored(url: str, execution_id: str):  # type: ignore[no-untyped-def]
    registry = Registry.from_url(url)
    try:
        return registry.get_execution(execution_id)
    finally:
        registry.dispose()


def test_add_prints_the_id_last(db: str) -> None:
    result = ok(
        "add",
        "--org", "acme",
        "--hostname", "gpu-node-1",
        "--gpu", "0",
        "--gpu", "GPU-0b5e1c2a-1111-2222-3333-444455556666",
        "--status", "running",
        "--start-time", "2026-11-28T11:00:00+01:00",
        "--hardware-profile", "gpu.h100",
        "--execution-type", "gpu.h100",
        "--file-name", "train.py",
        "--project", "vision",
        "--user", "alice@example.com",
    )  # fmt: skip
    execution_id = result.stdout.strip().splitlines()[-1]
    assert uuid.UUID(execution_id).version == 4
    execution = stored(db, execution_id)
    assert execution is not None
    assert execution.org == "acme"
    assert execution.hostname == "gpu-node-1"
    assert execution.gpus == ("0", "GPU-0b5e1c2a-1111-2222-3333-444455556666")
    assert execution.status is ExecutionStatus.RUNNING
    assert execution.start_time == datetime(2026, 11, 28, 10, 0, tzinfo=UTC)
    assert execution.hardware_profile == "gpu.h100"
    assert execution.file_name == "train.py"
    assert execution.project == "vision"
    assert execution.user == "alice@example.com"


def test_add_with_an_id_twice_updates(db: str) -> None:
    first = ok("add", "--org", "acme", "--execution-id", "run-1", "--hostname", "n1")
    assert "registered" in first.stdout
    assert first.stdout.strip().splitlines()[-1] == "run-1"
    second = ok("add", "--org", "acme", "--execution-id", "run-1", "--status", "completed")
    assert "updated" in second.stdout
    execution = stored(db, "run-1")
    assert execution is not None
    assert execution.status is ExecutionStatus.COMPLETED
    assert execution.hostname == "n1"
    assert "another org" in one_line_error(run("add", "--org", "beta", "--execution-id", "run-1"))


@pytest.mark.parametrize(
    ("args", "message", "code"),
    [
        (["--org", "ACME"], "--org", 2),
        (["--org", "acme", "--gpu", "gpu0"], "--gpu: gpus must be GPU indices", 2),
        (["--org", "acme", "--hostname", "bad host"], "--hostname", 2),
        (["--org", "acme", "--execution-id", "a/b"], "--execution-id", 2),
        (["--org", "acme", "--start-time", "noon"], "--start-time", 2),
        (
            ["--org", "acme", "--start-time", "2026-11-28T10:00:00Z", "--end-time", "2026-11-28T09:00:00Z"],
            "--end-time: end_time must not be before start_time",
            2,
        ),
    ],
)
def test_add_validation(db: str, args: list[str], message: str, code: int) -> None:
    assert message in one_line_error(run("add", *args), code)


def test_update(db: str) -> None:
    ok(
        "add",
        "--org",
        "acme",
        "--execution-id",
        "run-1",
        "--hostname",
        "n1",
        "--gpu",
        "1",
        "--start-time",
        "2026-11-28T10:00:00Z",
    )
    result = ok(
        "update",
        "run-1",
        "--status",
        "failed",
        "--end-time",
        "now",
        "--return-code",
        "2",
        "--system-error",
        "OOM",
    )
    assert "failed" in result.stdout
    execution = stored(db, "run-1")
    assert execution is not None
    assert execution.status is ExecutionStatus.FAILED
    assert execution.end_time is not None
    assert execution.return_code == 2
    assert execution.system_errors == ("OOM",)

    ok("update", "run-1", "--end-time", "none", "--all-gpus", "--status", "running")
    execution = stored(db, "run-1")
    assert execution is not None
    assert execution.end_time is None
    assert execution.gpus == ()
    assert execution.hostname == "n1"

    assert "not found" in one_line_error(run("update", "missing", "--status", "failed"))
    assert "nothing to update" in one_line_error(run("update", "run-1"), 2)
    assert "exclude" in one_line_error(run("update", "run-1", "--gpu", "0", "--all-gpus"), 2)


def test_list(db: str) -> None:
    assert "no executions" in ok("list").stdout
    ok(
        "add",
        "--org",
        "acme",
        "--execution-id",
        "a1",
        "--status",
        "running",
        "--created-at",
        "2026-11-01T00:00:00Z",
    )
    ok(
        "add",
        "--org",
        "acme",
        "--execution-id",
        "a2",
        "--status",
        "completed",
        "--created-at",
        "2026-11-02T00:00:00Z",
    )
    ok("add", "--org", "beta", "--execution-id", "b1", "--created-at", "2026-11-03T00:00:00Z")

    table = ok("list").stdout
    for name in ("a1", "a2", "b1", "running", "completed", "pending"):
        assert name in table
    body = json.loads(ok("list", "--json").stdout)
    assert [e["execution_id"] for e in body["executions"]] == ["b1", "a2", "a1"]
    assert body["total"] == 3
    assert body["executions"][0]["created_at"] == "2026-11-03T00:00:00Z"

    acme = json.loads(ok("list", "--org", "acme", "--status", "running", "--json").stdout)
    assert [e["execution_id"] for e in acme["executions"]] == ["a1"]
    paged = json.loads(ok("list", "--limit", "1", "--offset", "1", "--json").stdout)
    assert [e["execution_id"] for e in paged["executions"]] == ["a2"]
    assert run("list", "--status", "exploded").exit_code == 2


def test_a_registry_from_a_newer_release_is_a_one_line_error(db: str) -> None:
    ok("list")  # creates and migrates the registry
    path = db.removeprefix("sqlite:///")
    with sqlite3.connect(path) as con:
        con.execute("UPDATE alembic_version SET version_num = 'ffffffffffff'")
    message = one_line_error(run("list"), 2)
    assert "newer release" in message and "ffffffffffff" in message
