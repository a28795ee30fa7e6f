"""The archive against a real Prometheus (issue 8, items 3 and 4).

Finished executions (default scenario) and pods (k8s scenario) are archived with `gpulens archive`;
then every read, in both dialects and at several windows and steps, answers what Prometheus answered
(to 1e-9: the embedded evaluator against Prometheus' engine), and once gpulens points at an EMPTY
Prometheus the archived answers stay the same byte for byte, while an execution without an archive
comes back with empty arrays. Also: a PATCH of the window makes an archive stale (the empty Prometheus
then answers) until the next pass rebuilds it; archiving twice changes nothing and a forced rebuild
writes the same rows; `serve` archives a newly finished execution by itself; `--stats` counts what the
archive holds; the tables work on PostgreSQL; VictoriaMetrics gives the same raw samples.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from typer.testing import CliRunner

from gpulens.api.app import archive_options, create_app
from gpulens.backends.prometheus import PrometheusBackend, make_client
from gpulens.cli.main import app as cli_app
from gpulens.config import Settings
from gpulens.domain import catalog as c
from gpulens.domain.models import Execution, ExecutionStatus
from gpulens.domain.timeparse import format_rfc3339, format_rfc3339_ms
from gpulens.domain.workloads import PodPhase
from gpulens.service.archive import Archiver, execution_spec
from gpulens.service.discovery import discover_kubernetes
from gpulens.storage.archive import EXECUTION, ArchiveStore
from gpulens.storage.registry import Registry
from gpulens_testkit.promload import LoadedDataset, LoadedK8sDataset, ServerHandle, start_prometheus
from tests.api.conftest import Client
from tests.archive_reads import lyceum_reads
from tests.conftest import sqlite_registry
from tests.integration.conftest import serve_app
from tests.integration.lyceum_app import LiveApi, build
from tests.integration.test_embedded_api_differential import assert_same_json
from tests.storage.conftest import postgres_registry, postgres_server, postgres_url  # noqa: F401

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def empty_prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerHandle]:
    """A Prometheus that holds nothing (what is left once retention dropped a finished run)."""
    handle = start_prometheus(Path(tmp_path_factory.mktemp("empty-prom")) / "tsdb", block_s=7200)
    yield handle
    handle.stop()


def cli(*args: str) -> Any:
    result = CliRunner().invoke(cli_app, ["archive", *args])
    assert result.exit_code == 0, (result.stdout, result.stderr)
    return json.loads(result.stdout) if "--json" in args else result.stdout


@dataclass
class Apps:
    live: Client  # over the Prometheus holding the data
    empty: Client  # over the empty Prometheus
    key: str
    registry: Registry
    database: str
    url: str

    def get(self, client: Client, path: str, **params: str) -> httpx.Response:
        return client.get(path, params=params, headers={"Authorization": f"Bearer {self.key}"})


def apps(settings: Settings, registry: Registry, key: str, empty: ServerHandle) -> Apps:
    emptied = Settings(**{**settings.model_dump(), "prometheus_url": empty.url})
    assert settings.prometheus_url is not None
    return Apps(
        Client(create_app(settings, registry=registry)),
        Client(create_app(emptied, registry=registry)),
        key,
        registry,
        settings.resolved_database_url,
        settings.prometheus_url,
    )


# -- Lyceum -----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def lyceum(
    prom_dataset: LoadedDataset, empty_prometheus: ServerHandle, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[LiveApi, Apps]]:
    api = build(prom_dataset, Path(tmp_path_factory.mktemp("archive-lyceum")))
    yield api, apps(api.settings, api.registry, api.key, empty_prometheus)
    api.registry.dispose()


def test_archived_executions_answer_as_prometheus_did_and_survive_its_loss(
    lyceum: tuple[LiveApi, Apps],
) -> None:
    api, a = lyceum
    reads = lyceum_reads(api.data.scenario.executions)
    live = [a.get(a.live, path, **params) for path, params in reads]
    assert all(r.status_code == 200 for r in live)

    report = cli("--all-finished", "--json", "--prometheus-url", a.url, "--database", a.database)
    n = len(api.data.scenario.executions)
    assert (report["executions"], report["pods"], report["failed"]) == (n, 0, [])
    assert report["bytes_per_sample"] <= 2.0, report

    numbers = 0
    archived = [a.get(a.live, path, **params) for path, params in reads]
    for (path, params), want, got in zip(reads, live, archived, strict=True):
        assert got.status_code == 200, (path, params)
        numbers += assert_same_json(want.json(), got.json())
    assert numbers > 50_000
    gone = [a.get(a.empty, path, **params) for path, params in reads]
    assert [(r.status_code, r.content) for r in gone] == [(r.status_code, r.content) for r in archived]

    # without an archive, the empty Prometheus answers: no points
    e = api.data.scenario.executions[0]
    api.registry.upsert_execution(
        Execution(
            "not-archived", "acme", e.hostname, (), ExecutionStatus.RUNNING, e.start, start_time=e.start
        )
    )
    body = a.get(a.empty, "/api/v2/external/execution/not-archived/metrics", end=format_rfc3339(e.end)).json()
    assert all(body[k] == [] for k in c.LYCEUM_KEYS)

    stats = cli("--stats", "--json", "--database", a.database)
    totals = ArchiveStore(a.registry).totals()
    assert stats == {
        "executions": n,
        "pods": 0,
        "bytes": totals.bytes,
        "samples": totals.samples,
        "bytes_per_sample": round(totals.bytes / totals.samples, 3),
    }
    assert totals.samples == report["samples"] and totals.bytes == report["bytes"]


def test_archiving_again_changes_nothing_and_a_rebuild_writes_the_same_rows(
    lyceum: tuple[LiveApi, Apps],
) -> None:
    api, a = lyceum
    cli("--all-finished", "--prometheus-url", a.url, "--database", a.database)
    again = cli("--all-finished", "--json", "--prometheus-url", a.url, "--database", a.database)
    assert (again["executions"], again["pods"], again["unchanged"], again["failed"]) == (0, 0, 0, [])
    store = ArchiveStore(a.registry)
    eid = api.data.scenario.execution("healthy").execution_id
    first = store.get(EXECUTION, eid)
    assert first is not None
    rows = store.series(first.id)
    dry = cli(eid, "--dry-run", "--json", "--prometheus-url", a.url, "--database", a.database)
    assert [(d["id"], d["state"]) for d in dry] == [(eid, "archived")]
    forced = cli(eid, "--force", "--json", "--prometheus-url", a.url, "--database", a.database)
    assert forced["executions"] == 1
    second = store.get(EXECUTION, eid)
    assert second is not None and second.id != first.id
    assert store.series(second.id) == rows
    assert (second.sample_count, second.raw_count, second.byte_count) == (
        first.sample_count,
        first.raw_count,
        first.byte_count,
    )


def test_a_patched_window_is_read_live_until_the_next_pass(lyceum: tuple[LiveApi, Apps]) -> None:
    api, a = lyceum
    cli("--all-finished", "--prometheus-url", a.url, "--database", a.database)
    e = api.data.scenario.execution("throttled")
    path = f"/api/v2/external/execution/{e.execution_id}/metrics"
    assert a.get(a.empty, path, step="1m").json()["gpuPowerWatt"] != []
    new_end = format_rfc3339_ms(e.end_s * 1000 - 1_800_000)
    r = a.live.patch(
        f"/api/v2/admin/executions/{e.execution_id}",
        json={"end_time": new_end},
        headers={"Authorization": f"Bearer {api.admin_key}"},
    )
    assert r.status_code == 200, r.text
    assert a.get(a.empty, path, step="1m").json()["gpuPowerWatt"] == []  # stale: never served
    dry = cli("--all-finished", "--dry-run", "--json", "--prometheus-url", a.url, "--database", a.database)
    assert [(d["id"], d["state"]) for d in dry] == [(e.execution_id, "stale")]
    report = cli("--all-finished", "--json", "--prometheus-url", a.url, "--database", a.database)
    assert report["executions"] == 1
    for params in ({"step": "1m"}, {"step": "15s"}):
        live = a.get(a.live, path, **params)
        archived = a.get(a.empty, path, **params)
        assert archived.json()["timeRange"]["end"] == new_end.replace(".000", "")
        assert assert_same_json(live.json(), archived.json()) > 100


def test_serve_archives_newly_finished_executions(lyceum: tuple[LiveApi, Apps]) -> None:
    api, a = lyceum
    cli("--all-finished", "--prometheus-url", a.url, "--database", a.database)
    settings = Settings(**{**api.settings.model_dump(), "archive_interval": 1})
    e = api.data.scenario.execution("oom")
    with serve_app(create_app(settings, registry=api.registry)) as base:
        body = {
            "execution_id": "finished-while-serving",
            "org": "acme",
            "hostname": e.hostname,
            "status": "completed",
            "start_time": format_rfc3339(e.start),
            "end_time": format_rfc3339(e.end),
        }
        r = httpx.post(
            base + "/api/v2/admin/executions", json=body, headers={"Authorization": f"Bearer {api.admin_key}"}
        )
        assert r.status_code in (200, 201), r.text
        store = ArchiveStore(api.registry)
        deadline = time.monotonic() + 30
        while store.get(EXECUTION, "finished-while-serving") is None and time.monotonic() < deadline:
            time.sleep(0.1)
    assert store.get(EXECUTION, "finished-while-serving") is not None
    path = "/api/v2/external/execution/finished-while-serving/metrics"
    assert a.get(a.empty, path, step="1m").content == a.get(a.live, path, step="1m").content


# -- Run:ai -----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def runai(
    prom_k8s_dataset: LoadedK8sDataset,
    empty_prometheus: ServerHandle,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[LoadedK8sDataset, Apps]]:
    tmp = Path(tmp_path_factory.mktemp("archive-runai"))
    registry = sqlite_registry(tmp / "r.db")
    _, key = registry.create_key("acme", name="alice")
    sc = prom_k8s_dataset.scenario
    prom = PrometheusBackend(prom_k8s_dataset.url, make_client(30, False, 4))
    report = anyio.run(
        partial(
            discover_kubernetes, prom, registry, "acme", start_ms=sc.start_s * 1000, end_ms=sc.end_s * 1000
        )
    )
    assert report.pods_seen == len(sc.pods)
    for p in sc.pods:  # the pods still running at the data's end: ended there
        if p.end_s is None:
            registry.update_pod(
                workload_of(registry, p.pod_id),
                p.pod_id,
                {"phase": PodPhase.SUCCEEDED, "end_time": datetime.fromtimestamp(sc.end_s, UTC)},
            )
    settings = Settings(
        data_dir=tmp, prometheus_url=prom_k8s_dataset.url, database_url=f"sqlite:///{tmp / 'r.db'}"
    )
    yield prom_k8s_dataset, apps(settings, registry, key, empty_prometheus)
    anyio.run(prom.aclose)
    registry.dispose()


def workload_of(registry: Registry, pod_id: str) -> str:
    """The workload discovery registered the pod under (a UUIDv5 of its owner)."""
    pod = registry.get_pod(pod_id)
    assert pod is not None, pod_id
    return pod.workload_id


def test_archived_pods_and_workloads_answer_as_prometheus_did_and_survive_its_loss(
    runai: tuple[LoadedK8sDataset, Apps],
) -> None:
    data, a = runai
    sc = data.scenario
    start = sc.start_s * 1000
    reads: list[tuple[str, dict[str, str]]] = []
    workloads = {p.pod_id: workload_of(a.registry, p.pod_id) for p in sc.pods}
    for p in sc.pods:
        path = f"/api/v1/workloads/{workloads[p.pod_id]}/pods/{p.pod_id}/metrics"
        life = (p.start_s * 1000, sc.pod_end_s(p) * 1000)
        for n, (lo, hi) in (
            ("0", life),
            ("120", life),
            ("7", (start + 90_000, sc.end_s * 1000 + 600_000)),
            ("33", (life[0] - 600_000, life[1] + 300_000)),
        ):
            types = ",".join(m.type for m in c.POD_METRICS)
            window = {"start": format_rfc3339_ms(lo), "end": format_rfc3339_ms(hi)}
            reads.append((path, {"metricType": types, **window, "numberOfSamples": n}))
    for workload_id in sorted(set(workloads.values())):
        # up to a lookback after its last pod's end: kube-state-metrics reports a completed pod for as
        # long as it exists, the archive holds a pod's series to its end + lookback
        last = max(sc.pod_end_s(p) for p in sc.pods if workloads[p.pod_id] == workload_id) * 1000
        types = ",".join(m.type for m in c.WORKLOAD_METRICS)
        for n in ("0", "30"):
            window = {
                "start": format_rfc3339_ms(start + 90_000),
                "end": format_rfc3339_ms(last + c.LOOKBACK_MS),
            }
            reads.append(
                (
                    f"/api/v1/workloads/{workload_id}/metrics",
                    {"metricType": types, **window, "numberOfSamples": n},
                )
            )
    live = [a.get(a.live, path, **params) for path, params in reads]
    assert {r.status_code for r in live} <= {200, 207}

    ids = [p.pod_id for p in sc.pods]
    report = cli(*ids, "--json", "--prometheus-url", a.url, "--database", a.database)
    assert (report["executions"], report["pods"], report["failed"]) == (0, len(sc.pods), [])

    numbers = 0
    archived = [a.get(a.live, path, **params) for path, params in reads]
    for (path, params), want, got in zip(reads, live, archived, strict=True):
        assert got.status_code == want.status_code, (path, params)
        numbers += assert_same_json(want.json(), got.json())
    assert numbers > 10_000
    gone = [a.get(a.empty, path, **params) for path, params in reads]
    assert [(r.status_code, r.content) for r in gone] == [(r.status_code, r.content) for r in archived]
    csv_headers = {"Authorization": f"Bearer {a.key}", "Accept": "text/csv"}
    path, params = reads[1]
    assert (
        a.empty.get(path, params=params, headers=csv_headers).content
        == a.live.get(path, params=params, headers=csv_headers).content
    )
    stats = cli("--stats", "--json", "--database", a.database)
    assert stats["pods"] == len(sc.pods) and stats["samples"] == report["samples"]


# -- PostgreSQL and VictoriaMetrics ---------------------------------------------------------------------


def test_archives_on_a_postgresql_registry(
    prom_dataset: LoadedDataset,
    empty_prometheus: ServerHandle,
    postgres_registry: Registry,  # noqa: F811 - the fixture imported above
    tmp_path: Path,
) -> None:
    registry = postgres_registry
    _, key = registry.create_key("acme", name="pg")
    for e in prom_dataset.scenario.executions:
        registry.upsert_execution(
            Execution(
                e.execution_id,
                "acme",
                e.hostname,
                tuple(str(g) for g in e.gpus),
                e.status,
                e.start,
                start_time=e.start,
                end_time=e.end,
            )
        )
    settings = Settings(
        data_dir=tmp_path,
        prometheus_url=prom_dataset.url,
        database_url=str(registry.engine.url.render_as_string(hide_password=False)),
    )
    prom = PrometheusBackend(prom_dataset.url, make_client(30, False, 4))
    store = ArchiveStore(registry)
    archiver = Archiver(registry, store, prom, archive_options(settings))
    report = anyio.run(archiver.run_pass)
    n = len(prom_dataset.scenario.executions)
    assert report.executions == n and report.failed == []
    assert anyio.run(archiver.run_pass).executions == 0
    assert store.totals().executions == n
    # re-counted in Prometheus (count_over_time) an hour later: the same counts, nothing rebuilt
    later = datetime.now(UTC) + timedelta(hours=2)
    archiver.clock = lambda: later

    async def no_raw_reads(*_: object) -> None:
        raise AssertionError("a re-count reads no samples")

    prom.query_raw = no_raw_reads  # type: ignore[method-assign,assignment]
    recheck = anyio.run(archiver.run_pass)
    assert (recheck.executions, recheck.late, recheck.failed) == (0, 0, [])
    assert all(
        i.checked_at == later
        for i in store.get_many(
            EXECUTION, [e.execution_id for e in prom_dataset.scenario.executions]
        ).values()
    )
    a = apps(settings, registry, key, empty_prometheus)
    for e in prom_dataset.scenario.executions:
        path = f"/api/v2/external/execution/{e.execution_id}/metrics"
        live, gone = a.get(a.live, path, step="1m"), a.get(a.empty, path, step="1m")
        assert gone.status_code == 200 and gone.content == live.content
    anyio.run(prom.aclose)


def test_victoria_metrics_gives_the_same_raw_samples(
    prom_dataset: LoadedDataset, vm_dataset: LoadedDataset, tmp_path: Path
) -> None:
    e = prom_dataset.scenario.execution("oom")  # the host whose node-exporter instance is an IP
    execution = Execution(
        "x",
        "acme",
        e.hostname,
        tuple(str(g) for g in e.gpus),
        e.status,
        e.start,
        start_time=e.start,
        end_time=e.end,
    )
    options = archive_options(Settings(data_dir=tmp_path, prometheus_url=prom_dataset.url))
    spec = execution_spec(execution, options)
    assert spec is not None and (spec.from_ms, spec.to_ms) == (e.start_s * 1000 - 900_000, e.end_s * 1000)
    registry = sqlite_registry(tmp_path / "r.db")

    async def raw(url: str) -> dict[str, list[tuple[float, float]]]:
        backend = PrometheusBackend(url, make_client(30, False, 4))
        try:
            archiver = Archiver(registry, ArchiveStore(registry), backend, options)
            out: dict[str, list[tuple[float, float]]] = {}
            for selection in await archiver.selections(spec):
                for s in await backend.query_raw(selection.match, spec.from_ms, spec.to_ms):
                    out[json.dumps(s.labels, sort_keys=True)] = [(float(t), float(v)) for t, v in s.samples]
            return out
        finally:
            await backend.aclose()

    prom, vm = anyio.run(raw, prom_dataset.url), anyio.run(raw, vm_dataset.url)
    registry.dispose()
    assert len(prom) > 10 and sum(map(len, prom.values())) > 5_000
    assert prom.keys() == vm.keys()
    for key, samples in prom.items():
        assert vm[key] == samples, key
