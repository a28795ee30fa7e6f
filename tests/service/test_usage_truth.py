"""The fleet usage table against what the generator knows (docs/usage.md): 240 runs of six users, four
projects and two hardware profiles on 24 hosts, each a known sequence of idle, input-stalled, throttled
and working phases, stored in the embedded store and summarised by the background pass as `serve` does.
Per group, the usage rows equal the generator's truth within 1 % (measured: equal up to float rounding)
and the sum of the stored receipts exactly; and likewise on the demo's history (whose CPU-only run has
no GPU time, so no row counts it), priced by the demo's own prices."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import anyio
import orjson
import pytest
from sqlalchemy import select

from gpulens.api.app import create_app
from gpulens.backends.embedded import EmbeddedBackend
from gpulens.config import Settings
from gpulens.demo.env import prepare
from gpulens.domain.models import Principal
from gpulens.service.summary_store import StoredSummaries
from gpulens.service.usage import UsageService, UsageTable
from gpulens.storage.registry import Registry
from gpulens.storage.samples import SampleStore
from gpulens.storage.tables import ExecutionSummaryRow
from gpulens.storage.usage import UsageStore
from gpulens_testkit.fleet import TrueReceipt, fleet_scenario, true_receipts, write_fleet
from gpulens_testkit.history import generate
from tests.conftest import sqlite_registry

ORG = "fleet"
PRICES = 'currency = "EUR"\n[gpu_hour]\n"gpu.h100" = 2.5\n"gpu.a100" = 1.5\n'
H_MS = 3_600_000
# usage row field -> (the true receipt's field, its unit in that field's figure)
TRUE = {
    "gpu_hours": ("gpu_ms", H_MS),
    "idle_held_gpu_hours": ("idle_held_ms", H_MS),
    "input_bound_gpu_hours": ("input_bound_ms", H_MS),
    "throttled_gpu_hours": ("throttled_ms", H_MS),
    "useful_gpu_hours": ("useful_gpu_s", 3600),
    "energy_kwh": ("energy_j", 3_600_000),
}
GROUPINGS = (("user",), ("project",), ("hardware_profile",), ("hostname",), ("project", "user"), ("day",))


@dataclass
class Fleet:
    registry: Registry
    usage: UsageService
    truth: dict[str, TrueReceipt]
    window: tuple[int, int]
    org: str

    def table(self, keys: Sequence[str]) -> UsageTable:
        return anyio.run(self.usage.table, Principal(org=self.org, subject="t"), *self.window, list(keys))

    def receipts(self) -> dict[str, dict[str, object]]:
        """The stored summaries' bodies, by execution id."""
        with self.registry.engine.connect() as conn:
            rows = conn.execute(select(ExecutionSummaryRow.execution_id, ExecutionSummaryRow.body))
            return {execution_id: orjson.loads(body) for execution_id, body in rows}


def summarise_all(settings: Settings, registry: Registry, store: SampleStore, ids: Sequence[str]) -> None:
    """Every run's summary computed and stored by the background pass, as `serve` runs it."""
    app = create_app(settings, registry=registry, backend=EmbeddedBackend(store))
    stored = app.state.ctx.summaries
    assert isinstance(stored, StoredSummaries)
    for execution_id in ids:
        stored.enqueue(execution_id)

    async def run() -> None:
        report = await stored.run_pass(limit=len(ids))
        assert report.computed == len(ids) and not report.failed, report

    anyio.run(run)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    tmp = tmp_path_factory.mktemp("fleet")
    scenario = fleet_scenario()
    dataset = generate(scenario)
    store = SampleStore.from_path(tmp / "samples.db")
    registry = sqlite_registry(tmp / "registry.db")
    (tmp / "prices.toml").write_text(PRICES)
    try:
        write_fleet(scenario, dataset, store, registry, ORG)
        settings = Settings(
            data_dir=tmp,
            prometheus_url=None,
            database_url=f"sqlite:///{tmp / 'registry.db'}",
            prices=tmp / "prices.toml",
            scrape_interval=f"{scenario.scrape_interval_s}s",
        )
        summarise_all(settings, registry, store, [s.execution_id for s in scenario.executions])
        truth = {r.execution_id: r for r in true_receipts(scenario, dataset)}
        window = (scenario.start_s * 1000 - H_MS, scenario.end_s * 1000 + H_MS)
        yield Fleet(registry, UsageService(UsageStore(registry)), truth, window, ORG)
    finally:
        store.close()
        registry.dispose()


def true_groups(
    truth: dict[str, TrueReceipt], keys: Sequence[str]
) -> dict[tuple[object, ...], dict[str, float]]:
    out: dict[tuple[object, ...], dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for r in truth.values():
        group = tuple(getattr(r, k) for k in keys)
        for name, (field, unit) in TRUE.items():
            out[group][name] += getattr(r, field) / unit
        out[group]["executions"] += r.gpu_ms > 0  # a run without GPUs has no GPU time to count
    return {group: sums for group, sums in out.items() if sums["executions"]}


def assert_within(table: UsageTable, want: dict[tuple[object, ...], dict[str, float]], rel: float) -> float:
    """Each group's figures within `rel` of the truth; the largest relative difference seen."""
    got = {tuple(g.keys.values()): g for g in table.groups}
    assert set(got) == set(want)
    worst = 0.0
    for group, sums in want.items():
        row = got[group]
        assert row.executions == sums["executions"], group
        assert row.idle_gpu_hours == 0  # the fleet's idle phases keep their memory
        for name in TRUE:
            value, true = getattr(row, name), sums[name]
            assert math.isclose(value, true, rel_tol=rel, abs_tol=1e-9), (group, name, value, true)
            if true:
                worst = max(worst, abs(value - true) / true)
    return worst


@pytest.mark.parametrize("keys", GROUPINGS[:5], ids=lambda k: ",".join(k))
def test_every_group_matches_the_generators_truth(fleet: Fleet, keys: tuple[str, ...]) -> None:
    worst = assert_within(fleet.table(keys), true_groups(fleet.truth, keys), rel=0.01)
    assert worst < 1e-9  # not only within 1 %: the phases and integrals are found exactly


def test_the_fleet_has_every_story() -> None:
    """What the truth test covers: a few hundred runs, each line of the receipt present."""
    scenario = fleet_scenario()
    totals: dict[str, float] = defaultdict(float)
    runs: dict[str, int] = defaultdict(int)
    for spec in scenario.executions:
        runs[spec.user or ""] += 1
        for span in spec.spans():
            totals[span.phase.kind.value] += span.end_s - span.start_s
    assert len(scenario.executions) == 240 and len(runs) == 6
    assert {"idle", "input_stall", "throttle", "steady"} <= {k for k, v in totals.items() if v > 0}


@pytest.mark.parametrize("keys", [("user",), ("project", "user"), ("day",)], ids=lambda k: ",".join(k))
def test_every_group_is_the_sum_of_its_receipts(fleet: Fleet, keys: tuple[str, ...]) -> None:
    assert_sum_of_receipts(fleet, keys)


def assert_sum_of_receipts(fleet: Fleet, keys: tuple[str, ...]) -> None:
    """Each group's GPU-hours, idle-held GPU-hours and cost are the sums of its executions' stored
    receipts (a run without GPUs adds nothing)."""
    receipts = fleet.receipts()
    assert set(receipts) == set(fleet.truth)
    table = fleet.table(keys)
    if keys == ("day",):  # runs cross midnight: the days add up to the whole
        groups = [fleet.truth]
        rows = [
            {
                "gpu": math.fsum(g.gpu_hours for g in table.groups),
                "idle_held": math.fsum(g.idle_held_gpu_hours for g in table.groups),
                "cost": math.fsum(g.cost or 0.0 for g in table.groups),
            }
        ]
    else:
        by_group: dict[tuple[object, ...], dict[str, TrueReceipt]] = defaultdict(dict)
        for execution_id, r in fleet.truth.items():
            by_group[tuple(getattr(r, k) for k in keys)][execution_id] = r
        got = {tuple(g.keys.values()): g for g in table.groups}
        groups = [by_group[k] for k in got]
        rows = [
            {"gpu": g.gpu_hours, "idle_held": g.idle_held_gpu_hours, "cost": g.cost or 0.0}
            for g in got.values()
        ]
    for members, row in zip(groups, rows, strict=True):
        docs = [receipts[i] for i in members]
        times: list[dict[str, float]] = [d.get("gpuTime") or {} for d in docs]  # type: ignore[misc]
        costs: list[dict[str, float]] = [d.get("cost") or {} for d in docs]  # type: ignore[misc]
        gpu = math.fsum(t.get("total", 0.0) for t in times)
        held = math.fsum(t.get("idleHeld", 0.0) for t in times)
        cost = math.fsum(c.get("total") or 0.0 for c in costs)
        assert math.isclose(row["gpu"], gpu, rel_tol=1e-9)
        assert math.isclose(row["idle_held"], held, rel_tol=1e-9, abs_tol=1e-9)
        assert math.isclose(row["cost"], cost, rel_tol=1e-9)


def test_the_demo_matches_its_generators_truth(tmp_path: Path) -> None:
    with prepare(tmp_path / "demo") as env:
        ids = [e.execution_id for e in env.executions]
        summarise_all(env.settings(), env.registry, env.store, ids)
        truth = {r.execution_id: r for r in true_receipts(env.scenario, generate(env.scenario))}
        org = env.executions[0].execution.org
        window = (env.scenario.start_s * 1000 - H_MS, env.scenario.end_s * 1000 + H_MS)
        demo = Fleet(env.registry, UsageService(UsageStore(env.registry)), truth, window, org)
        for keys in (("user",), ("project", "user")):
            assert_within(demo.table(keys), true_groups(truth, keys), rel=0.01)
            assert_sum_of_receipts(demo, keys)
