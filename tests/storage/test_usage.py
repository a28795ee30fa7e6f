"""The fleet usage query (storage/usage.py) on SQLite and PostgreSQL: for any window and grouping, its
sums equal the hourly slices prorated by the part of each inside the window, summed in Python, although
whole days are read from the daily rollup; the rollup written with the summaries and the one the
migration fills from slices already stored equal the slices' daily sums."""

from __future__ import annotations

import math
import random
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import asdict, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

from alembic import command
from alembic.config import Config
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import delete, insert, select

from gpulens.domain.models import Execution, ExecutionStatus
from gpulens.domain.usage import UsageSlice
from gpulens.storage.registry import MIGRATIONS_DIR, Registry
from gpulens.storage.summaries import SummaryInfo, SummaryStore
from gpulens.storage.tables import ExecutionSummaryRow, OrgRow, UsageDayRow, UsageSliceRow
from gpulens.storage.usage import MS_PER_DAY, MS_PER_HOUR, UsageRow, UsageStore, daily

T0 = datetime(2026, 11, 20, tzinfo=UTC)
T0_MS = int(T0.timestamp() * 1000)
SPAN_MS = 5 * MS_PER_DAY
FIELDS = ("gpu_ms", "useful_gpu_s", "idle_ms", "idle_held_ms", "input_bound_ms", "throttled_ms", "energy_j")


def fleet(seed: int = 3) -> list[tuple[Execution, list[UsageSlice]]]:
    """Executions of two orgs over five days (some priced, some not, one of them partly) with slices
    as shaping/usage.hourly cuts them: inside their hour, the first and last partial."""
    rng = random.Random(seed)
    out = []
    for k in range(14):
        start = T0_MS + rng.randrange(0, SPAN_MS - MS_PER_HOUR)
        stop = min(T0_MS + SPAN_MS, start + rng.randrange(MS_PER_HOUR // 4, 60 * MS_PER_HOUR))
        gpus = rng.randint(1, 4)
        price = rng.choice((2.0, None, "partly"))
        slices = []
        hour = start - start % MS_PER_HOUR
        while hour < stop:
            lo, hi = max(start, hour), min(stop, hour + MS_PER_HOUR)
            gpu_ms = gpus * (hi - lo)
            idle = rng.randint(0, gpu_ms // 2)
            priced = price == 2.0 or (price == "partly" and rng.random() < 0.5)
            slices.append(
                UsageSlice(
                    hour, lo, hi, gpu_ms, idle, rng.randint(0, idle), rng.randint(0, gpu_ms // 4),
                    rng.randint(0, gpu_ms // 8), gpu_ms / 1000 * rng.random(), gpu_ms * 0.3 * rng.random(),
                    gpu_ms / MS_PER_HOUR * 2.0 if priced else None,
                )
            )  # fmt: skip
            hour += MS_PER_HOUR
        execution = Execution(
            execution_id=f"x{k}",
            org="acme" if k % 5 else "beta",
            hostname=f"node-{k % 3}",
            gpus=tuple(str(g) for g in range(gpus)),
            status=ExecutionStatus.COMPLETED,
            created_at=T0,
            start_time=datetime.fromtimestamp(start / 1000, UTC),
            end_time=datetime.fromtimestamp(stop / 1000, UTC),
            user=f"u{k % 3}",
            project=f"p{k % 4}",
            hardware_profile=f"gpu.h{k % 2}",
        )
        out.append((execution, slices))
    return out


def expected(
    data: Sequence[tuple[Execution, list[UsageSlice]]],
    org: str,
    start_ms: int,
    end_ms: int,
    keys: Sequence[str],
    projects: set[str] | None = None,
) -> dict[tuple[object, ...], dict[str, float]]:
    """Each slice prorated by the part of it inside the window, summed per group in Python."""
    out: dict[tuple[object, ...], dict[str, float]] = defaultdict(lambda: defaultdict(float))
    ids: dict[tuple[object, ...], set[str]] = defaultdict(set)
    costs: dict[tuple[object, ...], list[float]] = defaultdict(list)
    for execution, slices in data:
        if execution.org != org:
            continue
        if projects is not None and execution.project is not None and execution.project not in projects:
            continue
        for s in slices:
            lo, hi = max(s.start_ms, start_ms), min(s.end_ms, end_ms)
            if hi <= lo:
                continue
            share = (hi - lo) / (s.end_ms - s.start_ms)
            values = {
                "user": execution.user,
                "project": execution.project,
                "hostname": execution.hostname,
                "hardware_profile": execution.hardware_profile,
                "day": s.hour_ms - s.hour_ms % MS_PER_DAY,
            }
            group = tuple(values[k] for k in keys)
            ids[group].add(execution.execution_id)
            for name in FIELDS:
                out[group][name] += getattr(s, name) * share
            if s.cost is not None:
                costs[group].append(s.cost * share)
                out[group]["priced_ms"] += s.gpu_ms * share
    for group, sums in out.items():
        sums["executions"] = len(ids[group])
        sums["cost"] = math.fsum(costs[group]) if costs[group] else math.nan
    return out


def written(registry: Registry) -> list[tuple[Execution, list[UsageSlice]]]:
    data = fleet()
    store = SummaryStore(registry)
    for org in ("acme", "beta"):
        registry.ensure_org(org)
    for execution, slices in data:
        registry.upsert_execution(execution, now=T0)
        summary = SummaryInfo(
            execution.execution_id, execution.org, "k", "s", T0, T0 + timedelta(days=9), 1, 2, {}
        )
        store.put(summary, b"{}", slices)
    return data


def check(found: list[UsageRow], want: dict[tuple[object, ...], dict[str, float]]) -> None:
    got = {row.keys: row for row in found}
    assert set(got) == set(want)
    for group, sums in want.items():
        row = got[group]
        assert row.executions == sums["executions"]
        for name in (*FIELDS, "priced_ms"):
            assert math.isclose(getattr(row, name), sums[name], rel_tol=1e-9, abs_tol=1e-6), (group, name)
        if math.isnan(sums["cost"]):
            assert row.cost is None
        else:
            assert row.cost is not None and math.isclose(row.cost, sums["cost"], rel_tol=1e-9, abs_tol=1e-9)


GROUPINGS = [("user",), ("day",), ("project", "user"), ("hostname", "day"), ("hardware_profile",)]
# window edges: anywhere, on an hour, or on a UTC day (where the rollup takes over)
EDGE = st.one_of(
    st.integers(T0_MS - MS_PER_DAY, T0_MS + SPAN_MS + MS_PER_DAY),
    st.integers(-24, 6 * 24 + 24).map(lambda h: T0_MS + h * MS_PER_HOUR),
    st.integers(-1, 6).map(lambda d: T0_MS + d * MS_PER_DAY),
)


def test_any_window_sums_the_prorated_slices(registry: Registry) -> None:
    data = written(registry)
    usage = UsageStore(registry)

    @settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(EDGE, EDGE, st.sampled_from(GROUPINGS), st.sampled_from(["acme", "beta"]))
    def one(a: int, b: int, keys: tuple[str, ...], org: str) -> None:
        start_ms, end_ms = min(a, b), max(a, b) + 1
        found = usage.rows(org=org, projects=None, start_ms=start_ms, end_ms=end_ms, group_by=keys)
        check(found, expected(data, org, start_ms, end_ms, keys))

    one()
    # a key limited to projects: those and executions without one
    window = (T0_MS + 7 * MS_PER_HOUR, T0_MS + 4 * MS_PER_DAY + 5)
    found = usage.rows(
        org="acme", projects={"p1", "p2"}, start_ms=window[0], end_ms=window[1], group_by=["user"]
    )
    check(found, expected(data, "acme", *window, ["user"], projects={"p1", "p2"}))


def test_the_rollup_is_the_daily_sum_of_the_slices(registry: Registry) -> None:
    data = written(registry)
    d = UsageDayRow
    with registry.engine.connect() as conn:
        rows = conn.execute(select(d).order_by(d.execution_id, d.day_ms)).mappings().all()
    stored = defaultdict(list)
    for row in rows:
        stored[row["execution_id"]].append({k: v for k, v in row.items() if k not in ("execution_id", "org")})
    for execution, slices in data:
        want = daily(slices)
        got = stored[execution.execution_id]
        assert [g["day_ms"] for g in got] == [w["day_ms"] for w in want]
        for g, w in zip(got, want, strict=True):
            for name, value in w.items():
                if value is None:
                    assert g[name] is None
                else:
                    assert math.isclose(g[name], value, rel_tol=1e-12), name
    # replaced with the summary: a shorter receipt leaves no day of the longer one behind
    execution, slices = data[0]
    store = SummaryStore(registry)
    store.put(
        SummaryInfo(execution.execution_id, execution.org, "k2", "s", T0, T0, 1, 2, {}), b"{}", slices[:1]
    )
    with registry.engine.connect() as conn:
        days = conn.execute(select(d.day_ms).where(d.execution_id == execution.execution_id)).scalars().all()
    assert days == [slices[0].hour_ms - slices[0].hour_ms % MS_PER_DAY]


def test_the_migration_fills_the_rollup_from_stored_slices(tmp_path: Path) -> None:
    registry = Registry.from_url(f"sqlite:///{tmp_path / 'old.db'}")
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    try:
        with registry.engine.begin() as conn:
            config.attributes["connection"] = conn
            command.upgrade(config, "0007")
            conn.execute(insert(OrgRow), [{"slug": "acme", "name": "acme", "created_at": T0}])
            data = fleet()
            conn.execute(
                insert(UsageSliceRow),
                [{"execution_id": e.execution_id, "org": "acme", **asdict(s)} for e, s_ in data for s in s_],
            )
        registry.migrate()
        with registry.engine.connect() as conn:
            rows = conn.execute(select(UsageDayRow).order_by(UsageDayRow.execution_id, UsageDayRow.day_ms))
            got = [(r.execution_id, r.day_ms, r.gpu_ms, r.priced_ms, r.cost) for r in rows]
        want = [
            (e.execution_id, w["day_ms"], w["gpu_ms"], w["priced_ms"], w["cost"])
            for e, slices in sorted(data, key=lambda d: d[0].execution_id)
            for w in daily(slices)
        ]
        assert len(got) == len(want)
        for g, w in zip(got, want, strict=True):
            assert g[:4] == w[:4]
            assert (g[4] is None) == (w[4] is None) and (
                w[4] is None or math.isclose(g[4], w[4], rel_tol=1e-12)
            )
    finally:
        registry.dispose()


def test_running_executions_get_provisional_slices_until_their_summary(registry: Registry) -> None:
    data = written(registry)
    store = SummaryStore(registry)
    (execution, slices), (other, _) = data[0], data[1]
    for e in (execution, other):  # both running again, as if never finished
        registry.upsert_execution(replace(e, status=ExecutionStatus.RUNNING, end_time=None), now=T0)
    with registry.engine.begin() as conn:
        conn.execute(
            delete(ExecutionSummaryRow).where(ExecutionSummaryRow.execution_id == other.execution_id)
        )
        conn.execute(delete(UsageSliceRow).where(UsageSliceRow.execution_id == other.execution_id))
    # never sliced first, then by start; each with the hour of its last slice
    found = {e.execution_id: hour for e, hour in store.running(10)}
    assert next(iter(found)) == other.execution_id and found[other.execution_id] is None
    assert found[execution.execution_id] == slices[-1].hour_ms
    # a finished execution's stored summary is final: nothing is written
    assert not store.put_running(execution.execution_id, "acme", slices[0].hour_ms, slices[:1])
    # without it: the slices from that hour on are replaced, the earlier kept, the days rebuilt
    with registry.engine.begin() as conn:
        conn.execute(
            delete(ExecutionSummaryRow).where(ExecutionSummaryRow.execution_id == execution.execution_id)
        )
    cut = slices[len(slices) // 2].hour_ms
    kept = [s for s in slices if s.hour_ms < cut]
    new = [replace(s, gpu_ms=s.gpu_ms // 2) for s in slices if s.hour_ms >= cut][:2]
    assert store.put_running(execution.execution_id, execution.org, cut, [*kept[-1:], *new])
    assert store.slices(execution.execution_id) == [*kept, *new]
    d = UsageDayRow
    with registry.engine.connect() as conn:
        days = conn.execute(
            select(d.day_ms, d.gpu_ms).where(d.execution_id == execution.execution_id).order_by(d.day_ms)
        ).all()
    assert [(row["day_ms"], row["gpu_ms"]) for row in daily([*kept, *new])] == [tuple(r) for r in days]
