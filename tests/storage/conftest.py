"""Registries to test against: a fresh SQLite file, and a real PostgreSQL on 127.0.0.1.

PostgreSQL: `GPULENS_TEST_POSTGRES_URL` (a server you run; each test module gets its own database
on it) or, by default, a throwaway server this module starts with the local `initdb`/`pg_ctl`
(found via `GPULENS_PG_BIN`, `pg_config --bindir`, /usr/lib/postgresql/*/bin or PATH) in a temp
directory, as an unprivileged user when run as root. Without a server the PostgreSQL cases are
skipped, except under `CI=true`, where they fail: CI must never pass by skipping them.
"""

from __future__ import annotations

import os
import subprocess
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NoReturn, TypeVar

import psycopg
import pytest
from sqlalchemy import text

from gpulens.storage.registry import Registry
from gpulens_testkit.postgres import PostgresUnavailable, start_postgres
from tests.conftest import missing_server, sqlite_registry

TABLES = (
    "usage_days",
    "usage_slices",
    "execution_summaries",
    "pods",
    "workloads",
    "executions",
    "api_keys",
    "orgs",
)
T = TypeVar("T")


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
        server = start_postgres()
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
