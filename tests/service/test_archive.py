"""The archive end to end over the embedded backend (no server needed): archived answers are the live
ones, byte for byte, also once the backend holds nothing; a PATCH makes an archive stale until the next
pass rebuilds it; passes are idempotent; late samples rebuild young archives; the loop picks up newly
finished executions; repeat reads come from the answer cache.

The live backend here is an embedded store holding a synthetic scenario (tests/integration does the
same against a real Prometheus): both sides of every comparison are then the same evaluator, so
answers must be identical, not merely close.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import pytest
from typer.testing import CliRunner

from gpulens.agent.samples import Sample
from gpulens.api.app import archive_options, create_app
from gpulens.backends.embedded import EmbeddedBackend
from gpulens.cli.main import app as cli_app
from gpulens.config import Settings
from gpulens.demo.history import Dataset, generate
from gpulens.demo.scenario import default_scenario
from gpulens.domain import catalog as c
from gpulens.domain.models import Execution, ExecutionStatus
from gpulens.domain.timeparse import format_rfc3339_ms
from gpulens.domain.workloads import Pod, PodPhase, Workload
from gpulens.service.archive import (
    AnswerCache,
    Archiver,
    ArchiveService,
    PassReport,
    archive_task,
)
from gpulens.storage.archive import EXECUTION, POD, ArchiveSource, ArchiveStore
from gpulens.storage.registry import Registry
from gpulens.storage.samples import SampleStore
from gpulens_testkit.k8s_generate import K8sDataset
from gpulens_testkit.k8s_scenario import k8s_scenario
from tests.api.conftest import Client
from tests.archive_reads import lyceum_reads
from tests.conftest import sqlite_registry

NOW = datetime(2026, 1, 2, tzinfo=UTC)  # a day after the scenarios end


def fill(store: SampleStore, dataset: Dataset | K8sDataset) -> None:
    for s in dataset.series:
        store.write(Sample(s.name, s.labels, float(v), t * 1000) for t, v in dataset.samples(s))
    store.flush()


@dataclass
class World:
    tmp: Path
    registry: Registry
    store: SampleStore
    settings: Settings
    live: Client
    key: str
    archiver: Archiver
    clock: list[datetime]

    def app(self, backend: Any) -> Client:
        return Client(create_app(self.settings, registry=self.registry, backend=backend, clock=self.now))

    def now(self) -> datetime:
        return self.clock[0]

    def get(self, client: Client, path: str, **params: str) -> tuple[int, bytes]:
        r = client.get(path, params=params, headers={"Authorization": f"Bearer {self.key}"})
        return r.status_code, r.content

    def run_pass(self) -> PassReport:
        return anyio.run(self.archiver.run_pass)


def world(tmp: Path, dataset: Dataset | K8sDataset) -> World:
    registry = sqlite_registry(tmp / "r.db")
    _, key = registry.create_key("acme", name="alice")
    store = SampleStore.from_path(tmp / "samples.db")
    fill(store, dataset)
    settings = Settings(data_dir=tmp, database_url=f"sqlite:///{tmp / 'r.db'}")
    clock = [NOW]
    backend = EmbeddedBackend(store)
    live = Client(create_app(settings, registry=registry, backend=backend, clock=lambda: clock[0]))
    archiver = Archiver(
        registry, ArchiveStore(registry), backend, archive_options(settings), lambda: clock[0]
    )
    return World(tmp, registry, store, settings, live, key, archiver, clock)


@pytest.fixture(scope="module")
def lyceum(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[World, Dataset]]:
    dataset = generate(default_scenario())
    w = world(Path(tmp_path_factory.mktemp("archive-lyceum")), dataset)
    for e in dataset.scenario.executions:
        w.registry.upsert_execution(
            Execution(
                e.execution_id,
                "acme",
                e.hostname,
                tuple(str(g) for g in e.gpus),
                e.status,
                e.start,
                start_time=e.start,
                end_time=e.end,
            ),
            now=e.end,
        )
    yield w, dataset
    w.store.close()
    w.registry.dispose()


def test_archived_execution_answers_are_the_live_ones_and_need_no_backend(
    lyceum: tuple[World, Dataset],
) -> None:
    w, dataset = lyceum
    reads = lyceum_reads(dataset.scenario.executions)
    before = [w.get(w.live, path, **params) for path, params in reads]
    assert all(status == 200 for status, _ in before)
    report = w.run_pass()
    assert report.executions == len(dataset.scenario.executions) and report.failed == []
    assert report.bytes / report.samples <= 2.0, report
    after = [w.get(w.live, path, **params) for path, params in reads]
    assert after == before
    empty = w.app(EmbeddedBackend(ArchiveSource([])))
    assert [w.get(empty, path, **params) for path, params in reads] == before
    # the backend really was not asked: an unarchived execution on the empty backend has no points
    e = dataset.scenario.executions[0]
    w.registry.upsert_execution(
        Execution("unarchived", "acme", e.hostname, (), ExecutionStatus.RUNNING, e.start, start_time=e.start)
    )
    status, body = w.get(
        empty, "/api/v2/external/execution/unarchived/metrics", end=format_rfc3339_ms(e.end_s * 1000)
    )
    assert status == 200
    data = __import__("json").loads(body)
    assert all(data[k] == [] for k in c.LYCEUM_KEYS)


def test_rate_windows_up_to_lookback_plus_lead_are_exact(
    lyceum: tuple[World, Dataset], tmp_path: Path
) -> None:
    """A long execution's archive reaches back 1/50 of its duration when that exceeds the margin: a
    rate window as long as lookback + that lead, at the first step, still sees every sample it needs."""
    w, dataset = lyceum
    registry = sqlite_registry(tmp_path / "r.db")
    _, key = registry.create_key("acme", name="alice")
    settings = Settings(data_dir=tmp_path, database_url=f"sqlite:///{tmp_path / 'r.db'}", archive_margin="1m")
    e = dataset.scenario.execution("healthy")
    execution = Execution(
        "coarse",
        "acme",
        e.hostname,
        tuple(str(g) for g in e.gpus),
        e.status,
        e.start,
        start_time=e.start,
        end_time=e.end,
    )
    registry.upsert_execution(execution)
    options = archive_options(settings)
    lead = options.lead_ms(e.start_s * 1000, e.end_s * 1000)
    assert lead == (e.end_s - e.start_s) * 1000 // 50 > 60_000
    step = f"{(c.LOOKBACK_MS + lead) // 1000}s"
    backend = EmbeddedBackend(w.store)
    archiver = Archiver(registry, ArchiveStore(registry), backend, options, lambda: NOW)
    live = Client(create_app(settings, registry=registry, backend=backend, clock=lambda: NOW))
    empty = Client(create_app(settings, registry=registry, backend=EmbeddedBackend(ArchiveSource([]))))
    headers = {"Authorization": f"Bearer {key}"}
    path = "/api/v2/external/execution/coarse/metrics"
    before = live.get(path, params={"step": step}, headers=headers).content
    assert b"systemCpuUsagePercent" in before
    assert anyio.run(archiver.run_pass).executions == 1
    assert empty.get(path, params={"step": step}, headers=headers).content == before
    registry.dispose()


def test_repeat_reads_of_an_archived_execution_come_from_the_answer_cache(
    lyceum: tuple[World, Dataset],
) -> None:
    w, dataset = lyceum
    assert w.registry.get_execution(dataset.scenario.executions[1].execution_id) is not None
    w.run_pass()
    client = w.app(EmbeddedBackend(ArchiveSource([])))
    answers = client.app.state.ctx.answers
    assert isinstance(answers, AnswerCache)
    path = f"/api/v2/external/execution/{dataset.scenario.executions[1].execution_id}/metrics"
    first = w.get(client, path, step="1m")
    assert answers.hits == 0 and len(answers) == 1
    assert w.get(client, path, step="1m") == first
    assert answers.hits == 1
    w.get(client, path, step="2m")  # other parameters: another answer
    assert len(answers) == 2 and answers.hits == 1
    # a caller who may not see the execution is refused, cache or not
    _, other = w.registry.create_key("beta", name="bob")
    r = client.get(path, params={"step": "1m"}, headers={"Authorization": f"Bearer {other}"})
    assert r.status_code == 404


def copy_of(w: World, dataset: Dataset, new_id: str, index: int = 0) -> Execution:
    e = dataset.scenario.executions[index]
    execution = Execution(
        new_id,
        "acme",
        e.hostname,
        tuple(str(g) for g in e.gpus),
        e.status,
        e.start,
        start_time=e.start,
        end_time=e.end,
    )
    w.registry.upsert_execution(execution, now=e.end)
    return execution


def test_a_patch_makes_the_archive_stale_until_the_next_pass(lyceum: tuple[World, Dataset]) -> None:
    w, dataset = lyceum
    execution = copy_of(w, dataset, "patch-me")
    w.run_pass()
    service = ArchiveService(ArchiveStore(w.registry), w.archiver.options)
    assert anyio.run(service.for_execution, execution) is not None
    first = w.archiver.store.get(EXECUTION, "patch-me")
    assert first is not None
    path = "/api/v2/external/execution/patch-me/metrics"
    empty = w.app(EmbeddedBackend(ArchiveSource([])))
    assert b'"value"' in w.get(empty, path, step="1m")[1]

    assert execution.end_time is not None
    new_end = execution.end_time - timedelta(minutes=20)
    patched = w.registry.update_execution("patch-me", {"end_time": new_end}, now=NOW)
    assert patched is not None
    assert anyio.run(service.for_execution, patched) is None  # stale: never served
    status, body = w.get(empty, path, step="1m")
    assert status == 200 and b'"value"' not in body  # the live (empty) backend answered

    pending = w.archiver.pending()
    assert [t.object_id for t in pending] == ["patch-me"] and not pending[0].fresh
    report = w.run_pass()
    assert report.executions == 1
    second = w.archiver.store.get(EXECUTION, "patch-me")
    assert second is not None and second.id != first.id and second.to_ms < first.to_ms
    assert anyio.run(service.for_execution, patched) is not None
    assert w.get(empty, path, step="1m") == w.get(w.live, path, step="1m")

    # a PATCH that does not change what the archive holds only records the row's new timestamp
    w.registry.update_execution("patch-me", {"return_code": 3}, now=NOW + timedelta(seconds=1))
    report = w.run_pass()
    assert (report.executions, report.unchanged) == (0, 1)
    assert w.archiver.store.get(EXECUTION, "patch-me").id == second.id  # type: ignore[union-attr]
    assert w.archiver.pending() == []


def test_archiving_twice_changes_nothing_and_a_rebuild_is_identical(lyceum: tuple[World, Dataset]) -> None:
    w, dataset = lyceum
    copy_of(w, dataset, "twice", 1)
    w.run_pass()
    again = w.run_pass()
    assert (again.executions, again.pods, again.unchanged) == (0, 0, 0)
    store = w.archiver.store
    first = store.get(EXECUTION, "twice")
    assert first is not None
    rows = store.series(first.id)
    target = w.archiver.execution_target("twice")
    assert target is not None and target.fresh
    rebuilt = anyio.run(w.archiver.build, replace(target, current=None))
    assert rebuilt.info.id != first.id and store.get(EXECUTION, "twice") == rebuilt.info
    assert store.series(rebuilt.info.id) == rows
    assert store.series(first.id) == []
    same = ("series_count", "sample_count", "raw_count", "byte_count", "spec_digest", "from_ms", "to_ms")
    assert all(getattr(rebuilt.info, f) == getattr(first, f) for f in same)


def test_late_samples_rebuild_a_young_archive(lyceum: tuple[World, Dataset]) -> None:
    w, dataset = lyceum
    copy_of(w, dataset, "late", 2)
    w.run_pass()
    first = w.archiver.store.get(EXECUTION, "late")
    assert first is not None
    try:
        w.clock[0] = NOW + timedelta(hours=2)  # due for a check
        report = PassReport()
        anyio.run(w.archiver.recheck, report)
        assert report.late == 0
        assert w.archiver.store.get(EXECUTION, "late") == replace(first, checked_at=w.clock[0])
        # a sample arrives late, inside the window, for a series the archive holds (the host's RAM)
        labels = w.archiver.store.load(first.id).select(c.NODE_MEM_TOTAL, [], first.from_ms, first.to_ms)[0][
            0
        ]
        pairs = tuple((k, v) for k, v in labels.items() if k != "__name__")
        w.store.write([Sample(c.NODE_MEM_TOTAL, pairs, 1.0, first.to_ms - 7)])  # between two scrapes
        w.clock[0] = NOW + timedelta(hours=4)
        report = PassReport()
        anyio.run(w.archiver.recheck, report)
        assert report.late >= 1  # this one, and the other archives of that host that cover the sample
        second = w.archiver.store.get(EXECUTION, "late")
        assert second is not None and second.id != first.id
        assert second.sample_count == first.sample_count + 1
        # archives older than a day are not checked again
        w.clock[0] = NOW + timedelta(days=3)
        assert w.archiver.store.due_for_check(NOW + timedelta(days=2), w.clock[0]) == []
    finally:
        w.clock[0] = NOW


def test_unfinished_executions_wait(lyceum: tuple[World, Dataset]) -> None:
    w, dataset = lyceum
    e = dataset.scenario.executions[0]
    w.registry.upsert_execution(
        Execution("running", "acme", e.hostname, (), ExecutionStatus.RUNNING, e.start, start_time=e.start)
    )
    just_ended = NOW - timedelta(minutes=6)  # end + lookback passed, the grace not yet
    w.registry.upsert_execution(
        Execution(
            "just-ended",
            "acme",
            e.hostname,
            (),
            ExecutionStatus.COMPLETED,
            e.start,
            start_time=e.start,
            end_time=just_ended,
        )
    )
    assert {t.object_id for t in w.archiver.pending()}.isdisjoint({"running", "just-ended"})
    try:
        w.clock[0] = NOW + timedelta(minutes=5)
        assert "just-ended" in {t.object_id for t in w.archiver.pending()}
    finally:
        w.clock[0] = NOW


def test_the_loop_archives_newly_finished_executions(lyceum: tuple[World, Dataset]) -> None:
    w, dataset = lyceum
    w.run_pass()
    found: list[bool] = []

    async def main() -> None:
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(lambda: archive_task(w.archiver, interval_s=0.05))
            await anyio.sleep(0.2)  # a pass or more with nothing to do
            copy_of(w, dataset, "newly-finished", 3)
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                if w.archiver.store.get(EXECUTION, "newly-finished") is not None:
                    found.append(True)
                    break
                await anyio.sleep(0.05)
            tasks.cancel_scope.cancel()

    anyio.run(main)
    assert found == [True]


def test_stats_count_what_the_archive_holds(lyceum: tuple[World, Dataset]) -> None:
    w, _ = lyceum
    w.run_pass()
    totals = w.archiver.store.totals()
    result = CliRunner().invoke(
        cli_app, ["archive", "--stats", "--json", "--database", f"sqlite:///{w.tmp / 'r.db'}"]
    )
    assert result.exit_code == 0, result.output
    data = __import__("json").loads(result.output)
    assert data == {
        "executions": totals.executions,
        "pods": 0,
        "bytes": totals.bytes,
        "samples": totals.samples,
        "bytes_per_sample": round(totals.bytes / totals.samples, 3),
    }
    assert totals.executions >= 5 and 0 < data["bytes_per_sample"] <= 2.0
    text = CliRunner().invoke(cli_app, ["archive", "--stats", "--database", f"sqlite:///{w.tmp / 'r.db'}"])
    assert text.exit_code == 0 and f"executions archived: {totals.executions}" in text.output
    refused = CliRunner().invoke(cli_app, ["archive", "x", "--database", f"sqlite:///{w.tmp / 'r.db'}"])
    assert refused.exit_code == 2 and "GPULENS_PROMETHEUS_URL" in refused.output


# -- Run:ai ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def runai(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[World, K8sDataset]]:
    dataset = K8sDataset(k8s_scenario())
    sc = dataset.scenario
    w = world(Path(tmp_path_factory.mktemp("archive-runai")), dataset)
    by_workload: dict[str, list[Pod]] = {}
    for p in sc.pods:
        end = p.end_s if p.end_s is not None else sc.end_s  # every pod has ended by NOW
        phase = p.final_phase if p.end_s is not None else PodPhase.SUCCEEDED
        by_workload.setdefault(p.workload_id, []).append(
            Pod(
                p.pod_id,
                p.workload_id,
                p.name,
                p.namespace,
                p.node,
                tuple(s.key for s in p.slots),
                phase,
                datetime.fromtimestamp(p.start_s, UTC),
                datetime.fromtimestamp(end, UTC),
            )
        )
    for workload_id, pods in by_workload.items():
        created = min(p.start_time for p in pods if p.start_time is not None)
        w.registry.upsert_workload(Workload(workload_id, pods[0].name, "acme", None, created), pods)
    yield w, dataset
    w.store.close()
    w.registry.dispose()


def test_archived_pod_and_workload_answers_are_the_live_ones(runai: tuple[World, K8sDataset]) -> None:
    w, dataset = runai
    sc = dataset.scenario
    start, end = sc.start_s * 1000, sc.end_s * 1000
    reads: list[tuple[str, dict[str, str]]] = []
    for p in sc.pods:
        path = f"/api/v1/workloads/{p.workload_id}/pods/{p.pod_id}/metrics"
        life = (p.start_s * 1000, sc.pod_end_s(p) * 1000)
        for n, (lo, hi) in (("0", life), ("120", life), ("7", (start + 90_000, end + 600_000))):
            reads.append(
                (
                    path,
                    {
                        "metricType": ",".join(m.type for m in c.POD_METRICS),
                        "start": format_rfc3339_ms(lo),
                        "end": format_rfc3339_ms(hi),
                        "numberOfSamples": n,
                    },
                )
            )
    for workload_id in sorted({p.workload_id for p in sc.pods}):
        # up to a lookback after its last pod's end: kube-state-metrics reports a completed pod for as
        # long as it exists, an archive holds its series to end + lookback
        last = max(sc.pod_end_s(p) for p in sc.pods if p.workload_id == workload_id) * 1000
        reads.append(
            (
                f"/api/v1/workloads/{workload_id}/metrics",
                {
                    "metricType": ",".join(m.type for m in c.WORKLOAD_METRICS),
                    "start": format_rfc3339_ms(start + 90_000),
                    "end": format_rfc3339_ms(last + c.LOOKBACK_MS),
                    "numberOfSamples": "30",
                },
            )
        )
    before = [w.get(w.live, path, **params) for path, params in reads]
    assert {status for status, _ in before} <= {200, 207}
    report = w.run_pass()
    assert report.pods == len(sc.pods) and report.failed == []
    # DCGM's profiling ratios are full-precision floats (about 7 bytes a sample whatever the codec),
    # and short pod lives make label text count; the Lyceum series above stay under 2
    assert report.bytes / report.samples <= 3.5, report
    empty = w.app(EmbeddedBackend(ArchiveSource([])))
    assert [w.get(empty, path, **params) for path, params in reads] == before
    csv = empty.get(
        reads[0][0], params=reads[0][1], headers={"Authorization": f"Bearer {w.key}", "Accept": "text/csv"}
    )
    live_csv = w.live.get(
        reads[0][0], params=reads[0][1], headers={"Authorization": f"Bearer {w.key}", "Accept": "text/csv"}
    )
    assert csv.status_code == live_csv.status_code and csv.content == live_csv.content
    assert empty.app.state.ctx.answers.hits == 0
    assert [w.get(empty, path, **params) for path, params in reads[:3]] == before[:3]
    assert empty.app.state.ctx.answers.hits == 3


def test_a_workload_with_an_unarchived_pod_is_read_live(runai: tuple[World, K8sDataset]) -> None:
    w, dataset = runai
    w.run_pass()
    pod = next(p for p in dataset.scenario.pods if p.end_s is not None)
    stored = w.registry.get_pod(pod.pod_id)
    assert stored is not None and stored.start_time is not None
    service = ArchiveService(ArchiveStore(w.registry), w.archiver.options)
    _, pods = anyio.run(lambda: _all_pods(w, pod.workload_id))
    assert anyio.run(service.for_pods, pods) is not None
    w.registry.update_pod(
        pod.workload_id, pod.pod_id, {"start_time": stored.start_time + timedelta(minutes=1)}
    )
    _, pods = anyio.run(lambda: _all_pods(w, pod.workload_id))
    assert anyio.run(service.for_pods, pods) is None
    assert w.run_pass().pods == 1
    _, pods = anyio.run(lambda: _all_pods(w, pod.workload_id))
    assert anyio.run(service.for_pods, pods) is not None
    assert w.archiver.store.get(POD, pod.pod_id) is not None


async def _all_pods(w: World, workload_id: str) -> tuple[Workload, tuple[Pod, ...]]:
    page, _ = w.registry.list_pods(workload_id, limit=None)
    workload = w.registry.get_workload(workload_id)
    assert workload is not None
    return workload, tuple(page)


def test_decoded_archives_are_bounded_by_bytes(runai: tuple[World, K8sDataset]) -> None:
    w, dataset = runai
    w.run_pass()
    small = ArchiveService(ArchiveStore(w.registry), w.archiver.options, cache_bytes=1)
    pods = [w.registry.get_pod(p.pod_id) for p in dataset.scenario.pods[:2]]
    assert all(p is not None for p in pods)
    a = anyio.run(small.for_pods, [pods[0]])
    b = anyio.run(small.for_pods, [pods[0]])
    assert a is not None and b is not None and a is not b  # too big to keep: decoded again
    roomy = ArchiveService(ArchiveStore(w.registry), w.archiver.options)
    assert anyio.run(roomy.for_pods, [pods[0]]) is anyio.run(roomy.for_pods, [pods[0]])
    both = anyio.run(roomy.for_pods, pods)
    assert both is not None and both.name != a.name
    _ = np  # numpy is used by the helpers above
