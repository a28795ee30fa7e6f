"""The fleet usage table (docs/usage.md): how long `GET /api/v2/external/usage`'s query takes over
10,000 stored executions, on SQLite and on PostgreSQL.

Acceptance figure: "10,000 stored executions: usage answers in under 1 s on SQLite and on PostgreSQL".
A fresh registry of each kind holds 10,000 finished executions of one org (seeded: 1-48 h long,
started over the 30 days before a fixed end, 40 users, 12 projects, 4 hardware profiles, 50 hosts,
1-8 GPUs) and their hourly slices (about 250,000 rows), written as stored summaries write them. Each
query runs through the service the route uses (UsageService.table), `ROUNDS` times: the median is the
figure. Queries: 30 days by project and user; 30 days by day; the last 7 days by user (windows that
cut executions).

The baseline, printed as a ratio without a target, is what someone would otherwise run against the
same table: every slice of the window fetched and summed per group in Python.
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from datetime import UTC, datetime, timedelta
from pathlib import Path

import anyio
import psycopg
from sqlalchemy import insert, select

from bench.measure import Figure
from gpulens.domain.models import Principal
from gpulens.domain.usage import UsageSlice
from gpulens.service.usage import UsageService
from gpulens.storage.registry import Registry
from gpulens.storage.tables import ExecutionRow, OrgRow, UsageDayRow, UsageSliceRow
from gpulens.storage.usage import UsageStore, daily
from gpulens_testkit.postgres import PostgresUnavailable, start_postgres

NAME = "Usage"
EXECUTIONS = 10_000
ROUNDS = 5
TARGET_S = 1.0
H = 3_600_000
END = datetime(2026, 11, 30, tzinfo=UTC)  # a fixed past end: the data does not move with the clock
ORG = "bench-usage"
# (name, span, group keys, how long before END the window ends: off midnight, it has edge hours)
QUERIES: tuple[tuple[str, int, tuple[str, ...], int], ...] = (
    ("30 days by project and user", 30 * 24 * H, ("project", "user"), 0),
    ("30 days by day", 30 * 24 * H, ("day",), 0),
    ("7 days by user", 7 * 24 * H, ("user",), 0),
    ("30 days to 13:37 by project and user", 30 * 24 * H, ("project", "user"), 10 * H + 23 * 60_000),
    ("7 days to 13:37 by user", 7 * 24 * H, ("user",), 10 * H + 23 * 60_000),
)


@dataclass
class UsageQuery:
    backend: str  # sqlite | postgresql
    name: str
    seconds: list[float] = field(default_factory=list)
    baseline: list[float] = field(default_factory=list)
    groups: int = 0

    @property
    def p50(self) -> float:
        return statistics.median(self.seconds)

    @property
    def baseline_p50(self) -> float:
        return statistics.median(self.baseline)


@dataclass
class UsageResult:
    slices: int = 0
    queries: list[UsageQuery] = field(default_factory=list)
    checks: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)

    def figures(self) -> list[Figure]:
        out = []
        for q in self.queries:
            out.append(
                Figure(
                    f"{NAME} ({q.backend}): {q.name} over {EXECUTIONS:,} executions",
                    q.p50,
                    TARGET_S,
                    unit="s",
                    note=f"{q.groups} groups, {self.slices:,} slices; fetch-and-sum {q.baseline_p50:.2f} s",
                )
            )
        return out

    def lines(self) -> list[str]:
        out = [f"{NAME}: {EXECUTIONS:,} executions, {self.slices:,} hourly slices"]
        for q in self.queries:
            out.append(
                f"{NAME} ({q.backend}) {q.name}: p50 {q.p50 * 1000:.0f} ms ({q.groups} groups), "
                f"fetch-and-sum {q.baseline_p50 * 1000:.0f} ms ({q.p50 / q.baseline_p50:.2f}x)"
            )
        out += [f"{NAME}: {s}" for s in self.skipped]
        return out

    def as_json(self) -> dict[str, object]:
        return {
            "case": NAME,
            "executions": EXECUTIONS,
            "slices": self.slices,
            "queries": [
                {
                    "backend": q.backend,
                    "query": q.name,
                    "p50_s": q.p50,
                    "baseline_fetch_and_sum_p50_s": q.baseline_p50,
                    "groups": q.groups,
                    "target_s": TARGET_S,
                }
                for q in self.queries
            ],
            "skipped": self.skipped,
            "problems": self.checks,
        }


def fleet(seed: int = 7) -> tuple[list[dict[str, object]], list[dict[str, object]]]:
    """The executions' rows and their slices' rows (seeded)."""
    rng = random.Random(seed)
    end_ms = int(END.timestamp() * 1000)
    executions, slices = [], []
    for k in range(EXECUTIONS):
        hours = rng.randint(1, 48)
        start_ms = end_ms - rng.randint(hours, 30 * 24) * H + rng.randint(0, H - 1)
        stop_ms = start_ms + hours * H - rng.randint(0, H // 2)
        gpus = rng.randint(1, 8)
        price = rng.choice((2.5, 1.5, None))
        start = datetime.fromtimestamp(start_ms / 1000, UTC)
        executions.append(
            {
                "execution_id": f"u{k:05d}",
                "org": ORG,
                "project": f"project-{rng.randrange(12)}",
                "user_name": f"user{rng.randrange(40)}@example.com",  # the column of `user`
                "hostname": f"node-{rng.randrange(50)}",
                "gpus": [str(g) for g in range(gpus)],
                "status": "completed",
                "hardware_profile": f"gpu.profile{rng.randrange(4)}",
                "created_at": start,
                "updated_at": start,
                "start_time": start,
                "end_time": datetime.fromtimestamp(stop_ms / 1000, UTC),
                "system_errors": [],
            }
        )
        hour = start_ms - start_ms % H
        while hour < stop_ms:
            lo, hi = max(start_ms, hour), min(stop_ms, hour + H)
            gpu_ms = gpus * (hi - lo)
            idle = rng.randint(0, gpu_ms // 3)
            slices.append(
                {
                    "execution_id": f"u{k:05d}",
                    "hour_ms": hour,
                    "org": ORG,
                    "start_ms": lo,
                    "end_ms": hi,
                    "gpu_ms": gpu_ms,
                    "idle_ms": idle,
                    "idle_held_ms": rng.randint(0, (gpu_ms - idle) // 3),
                    "input_bound_ms": rng.randint(0, gpu_ms // 10),
                    "throttled_ms": rng.randint(0, gpu_ms // 20),
                    "useful_gpu_s": gpu_ms / 1000 * rng.random(),
                    "energy_j": gpu_ms / 1000 * 400 * rng.random(),
                    "cost": None if price is None else gpu_ms / H * price,
                }
            )
            hour += H
    return executions, slices


def load(
    registry: Registry, executions: Sequence[dict[str, object]], slices: Sequence[dict[str, object]]
) -> None:
    registry.migrate()
    with registry.engine.begin() as conn:
        conn.execute(insert(OrgRow), [{"slug": ORG, "name": ORG, "created_at": END - timedelta(days=60)}])
        conn.execute(insert(ExecutionRow), list(executions))
        for i in range(0, len(slices), 20_000):
            conn.execute(insert(UsageSliceRow), list(slices[i : i + 20_000]))
        days = rollup(slices)
        for i in range(0, len(days), 20_000):
            conn.execute(insert(UsageDayRow), days[i : i + 20_000])


def rollup(slices: Sequence[dict[str, object]]) -> list[dict[str, object]]:
    """The daily rollup's rows of the slices, as a stored summary writes them (storage/usage.daily)."""
    names = [f.name for f in fields(UsageSlice)]
    per: dict[tuple[object, object], list[UsageSlice]] = {}
    for row in slices:
        per.setdefault((row["execution_id"], row["org"]), []).append(UsageSlice(*(row[n] for n in names)))  # type: ignore[arg-type]
    return [{"execution_id": e, "org": o, **day} for (e, o), own in per.items() for day in daily(own)]


def fetch_and_sum(registry: Registry, start_ms: int, end_ms: int, keys: Sequence[str]) -> int:
    """What someone would write without the GROUP BY: every slice of the window with its execution's
    fields, prorated and summed per group in Python; the number of groups."""
    s, e = UsageSliceRow, ExecutionRow
    columns = [getattr(e, k).label(k) for k in keys if k != "day"]
    stmt = (
        select(s.hour_ms, s.start_ms, s.end_ms, s.gpu_ms, s.idle_ms, s.cost, *columns)
        .join(e, e.execution_id == s.execution_id)
        .where(s.org == ORG, s.end_ms > start_ms, s.start_ms < end_ms)
    )
    sums: dict[tuple[object, ...], list[float]] = {}
    with registry.engine.connect() as conn:
        for row in conn.execute(stmt):
            share = (min(row.end_ms, end_ms) - max(row.start_ms, start_ms)) / (row.end_ms - row.start_ms)
            key = tuple(row.hour_ms // 86_400_000 if k == "day" else getattr(row, k) for k in keys)
            acc = sums.setdefault(key, [0.0, 0.0, 0.0])
            acc[0] += row.gpu_ms * share
            acc[1] += row.idle_ms * share
            acc[2] += (row.cost or 0.0) * share
    return len(sums)


def _measure(result: UsageResult, backend: str, registry: Registry, progress: Callable[[str], None]) -> None:
    service = UsageService(UsageStore(registry))
    principal = Principal(org=ORG, subject="bench")
    for name, span, keys, before in QUERIES:
        end_ms = int(END.timestamp() * 1000) - before
        progress(f"{NAME} ({backend}): {name}")
        query = UsageQuery(backend, name)
        for _ in range(ROUNDS):
            t0 = time.perf_counter()
            table = anyio.run(service.table, principal, end_ms - span, end_ms, list(keys))
            query.seconds.append(time.perf_counter() - t0)
            query.groups = len(table.groups)
            t0 = time.perf_counter()
            groups = fetch_and_sum(registry, end_ms - span, end_ms, keys)
            query.baseline.append(time.perf_counter() - t0)
            if groups != query.groups:
                result.checks.append(f"{backend} {name}: {query.groups} groups, fetch-and-sum {groups}")
        result.queries.append(query)


def run_usage(work: Path, progress: Callable[[str], None]) -> UsageResult:
    result = UsageResult()
    progress(f"{NAME}: generating {EXECUTIONS:,} executions")
    executions, slices = fleet()
    result.slices = len(slices)
    progress(f"{NAME} (sqlite): loading")
    sqlite = Registry.from_url(f"sqlite:///{work / 'usage.db'}")
    try:
        load(sqlite, executions, slices)
        _measure(result, "sqlite", sqlite, progress)
    finally:
        sqlite.dispose()
    try:
        server = start_postgres()
    except (PostgresUnavailable, OSError) as exc:
        result.checks.append(f"PostgreSQL not measured: {exc}")
        return result
    try:
        maintenance = server.url.replace("postgresql+psycopg://", "postgresql://", 1)
        with psycopg.connect(maintenance, autocommit=True) as conn:
            conn.execute('CREATE DATABASE "usage"')
        registry = Registry.from_url(server.url.rsplit("/", 1)[0] + "/usage")
        try:
            progress(f"{NAME} (postgresql): loading")
            load(registry, executions, slices)
            with registry.engine.begin() as conn:
                conn.exec_driver_sql("ANALYZE")
            _measure(result, "postgresql", registry, progress)
        finally:
            registry.dispose()
    finally:
        server.stop()
    return result
