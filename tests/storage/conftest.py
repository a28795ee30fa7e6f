"""Registries to test against: a fresh SQLite file, and a real PostgreSQL on 127.0.0.1.

PostgreSQL: `GPULENS_TEST_POSTGRES_URL` (a server you run; each test module gets its own database
on it) or, by default, a throwaway server this module starts with the local `initdb`/`pg_ctl`
(found via `GPULENS_PG_BIN`, `pg_config --bindir`, /usr/lib/postgresql/*/bin or PATH) in a temp
directory, as an unprivileged user when run as root. Without a server the PostgreSQL cases are
skipped, except under `CI=true`, where they fail: CI must never pass by skipping them.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import psycopg
import pytest
from sqlalchemy import text

from gpulens.storage.registry import Registry
from gpulens_testkit.promload import free_port
from tests.conftest import missing_server, sqlite_registry

TABLES = ("execution_summaries", "pods", "workloads", "executions", "api_keys", "orgs")
T = TypeVar("T")


class PostgresUnavailable(Exception):
    pass


def _bindir() -> Path:
    candidates: list[Path] = []
    if os.environ.get("GPULENS_PG_BIN"):
        candidates.append(Path(os.environ["GPULENS_PG_BIN"]))
    pg_config = shutil.which("pg_config")
    if pg_config:
        out = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True, check=False)
        candidates.append(Path(out.stdout.strip()))
    versions = sorted(
        Path("/usr/lib/postgresql").glob("*/bin"),
        key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0,
    )
    candidates.extend(reversed(versions))
    initdb = shutil.which("initdb")
    if initdb:
        candidates.append(Path(initdb).parent)
    for path in candidates:
        if (path / "initdb").is_file() and (path / "pg_ctl").is_file():
            return path
    raise PostgresUnavailable("no initdb/pg_ctl found (set GPULENS_PG_BIN or GPULENS_TEST_POSTGRES_URL)")


def _run_as() -> dict[str, Any]:
    """PostgreSQL refuses to run as root: drop to an unprivileged user in the child processes."""
    if os.geteuid() != 0:
        return {}
    for name in filter(None, (os.environ.get("GPULENS_PG_USER"), "postgres", "nobody")):
        try:
            entry = pwd.getpwnam(name)
        except KeyError:
            continue
        return {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": []}
    raise PostgresUnavailable(
        "running as root and no unprivileged user (postgres, nobody) to run PostgreSQL as"
    )


@dataclass
class LocalPostgres:
    bindir: Path
    data: Path
    port: int
    demote: dict[str, Any]

    @property
    def url(self) -> str:
        return f"postgresql+psycopg://gpulens@127.0.0.1:{self.port}/postgres"

    def stop(self) -> None:
        subprocess.run(
            [str(self.bindir / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop"],
            capture_output=True,
            check=False,
            timeout=30,
            **self.demote,
        )
        shutil.rmtree(self.data.parent, ignore_errors=True)


def _start_local() -> LocalPostgres:
    bindir = _bindir()
    demote = _run_as()
    root = Path(tempfile.mkdtemp(prefix="gpulens-pg-"))
    data = root / "data"
    if demote:
        os.chown(root, demote["user"], demote["group"])
    init = subprocess.run(
        [
            str(bindir / "initdb"),
            "-D",
            str(data),
            "-U",
            "gpulens",
            "-A",
            "trust",
            "-E",
            "UTF8",
            "--locale=C",
            "--no-sync",
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
        **demote,
    )
    if init.returncode != 0:
        shutil.rmtree(root, ignore_errors=True)
        raise PostgresUnavailable(f"initdb failed: {init.stderr.strip()[-500:]}")
    last_error = ""
    for _attempt in range(3):  # another process may take the free port before the server binds it
        port = free_port()
        options = (
            f"-h 127.0.0.1 -p {port} -k {root} -c fsync=off -c synchronous_commit=off -c full_page_writes=off"
        )
        start = subprocess.run(
            [
                str(bindir / "pg_ctl"),
                "-D",
                str(data),
                "-l",
                str(root / "server.log"),
                "-w",
                "-t",
                "60",
                "-o",
                options,
                "start",
            ],
            capture_output=True,
            text=True,
            check=False,
            timeout=90,
            **demote,
        )
        if start.returncode == 0:
            return LocalPostgres(bindir, data, port, demote)
        log = root / "server.log"
        last_error = (start.stderr.strip() + " " + (log.read_text()[-500:] if log.exists() else "")).strip()
    shutil.rmtree(root, ignore_errors=True)
    raise PostgresUnavailable(f"pg_ctl start failed: {last_error}")


def _unavailable(reason: str) -> NoReturn:
    missing_server(f"PostgreSQL ({reason})")


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[str]:
    """A SQLAlchemy URL of a maintenance database on a running server."""
    given = os.environ.get("GPULENS_TEST_POSTGRES_URL")
    if given:
        yield given.replace("postgresql://", "postgresql+psycopg://", 1)
        return
    try:
        server = _start_local()
    except (PostgresUnavailable, OSError, subprocess.SubprocessError) as exc:
        _unavailable(str(exc))
    try:
        yield server.url
    finally:
        server.stop()


def _libpq(url: str) -> str:
    return url.replace("postgresql+psycopg://", "postgresql://", 1)


@pytest.fixture(scope="module")
def postgres_url(postgres_server: str) -> Iterator[str]:
    """A fresh database for one test module."""
    name = f"gpulens_test_{uuid.uuid4().hex[:12]}"
    base, _, _ = postgres_server.rpartition("/")
    try:
        with psycopg.connect(_libpq(postgres_server), autocommit=True, connect_timeout=10) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
    except psycopg.OperationalError as exc:
        _unavailable(f"cannot connect to {postgres_server}: {exc}")
    yield f"{base}/{name}"
    with psycopg.connect(_libpq(postgres_server), autocommit=True, connect_timeout=10) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="module")
def postgres_registry(postgres_url: str) -> Iterator[Registry]:
    registry = Registry.from_url(postgres_url)
    registry.migrate()
    yield registry
    registry.dispose()


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.integration)])
def registry(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Registry]:
    """A migrated, empty registry on each dialect."""
    if request.param == "sqlite":
        reg = sqlite_registry(tmp_path / "registry.db")
        yield reg
        reg.dispose()
        return
    reg = request.getfixturevalue("postgres_registry")
    with reg.engine.begin() as conn:
        conn.execute(text(f"TRUNCATE {', '.join(TABLES)} CASCADE"))  # and the alert tables
    yield reg


def run_concurrently(n: int, fn: Callable[[int], T]) -> list[T]:
    """fn(0), ..., fn(n - 1) in n threads released together by a barrier: their results, in order.

    Fails if any call raised, or a thread has not finished within a minute.
    """
    results: dict[int, T] = {}
    errors: list[BaseException] = []
    barrier = threading.Barrier(n)

    def worker(i: int) -> None:
        try:
            barrier.wait()
            results[i] = fn(i)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), "a worker is still running"
    assert errors == []
    assert sorted(results) == list(range(n))
    return [results[i] for i in range(n)]
