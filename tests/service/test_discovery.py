"""Kubernetes discovery against a real Prometheus holding kube-state-metrics history (promtool backfill).

The cluster, in namespace team-a unless noted, over the three hours before END (30 s scrapes):
- Deployment `web` -> ReplicaSet `web-5d8f7c9b6` -> two pods, running throughout;
- StatefulSet `db`: pod `db-0` deleted at END-60m and replaced by a new `db-0` (new UID) at END-59m;
- Job `train`: one pod that ran END-100m .. END-40m and completed (it stays reported afterwards);
- a bare pod `debug` in namespace `runai-vision`: Pending from END-35m, Running from END-30m;
- a pod whose uid is not a UUID (ignored), and one that disappeared before the window (not seen).
"""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import anyio
import httpx
import pytest
from typer.testing import CliRunner

from gpulens.api.app import create_app
from gpulens.backends.prometheus import PrometheusBackend
from gpulens.cli.main import app as cli_app
from gpulens.config import Settings
from gpulens.domain.errors import InvalidRequest
from gpulens.domain.timeparse import ms_to_datetime
from gpulens.domain.workloads import Pod, PodPhase
from gpulens.planning.discovery import discovery_queries
from gpulens.service.discovery import (
    PROJECT_FROM,
    DiscoveryReport,
    discover_kubernetes,
    discovery_task,
    workload_uuid,
)
from gpulens.storage.registry import Registry
from gpulens_testkit.promload import ServerHandle, backfill, start_prometheus
from tests.conftest import missing_server

END = 1_767_225_600  # 2026-01-01T00:00:00Z, a multiple of the 2 h block
SCRAPE = 30
DATA_START = END - 3 * 3600
WINDOW = (END - 2 * 3600) * 1000, END * 1000
PHASES = ("Pending", "Running", "Succeeded", "Failed", "Unknown")

U_WEB1, U_WEB2, U_DB_OLD, U_DB_NEW, U_TRAIN, U_DEBUG, U_GONE = (str(uuid.uuid4()) for _ in range(7))


@dataclass
class KsmPod:
    uid: str
    name: str
    first: int  # first and last scrape that reports the pod (unix seconds)
    last: int
    owner: tuple[str, str] | None
    node: str = "gpu-node-1"
    namespace: str = "team-a"
    created: int = 0
    started: int | None = None
    completed: int | None = None
    phases: list[tuple[int, str]] = field(default_factory=list)  # (from, phase), ascending

    def phase_at(self, t: int) -> str:
        current = "Pending"
        for since, phase in self.phases:
            if t >= since:
                current = phase
        return current


def cluster() -> list[KsmPod]:
    m = 60
    rs = ("ReplicaSet", "web-5d8f7c9b6")
    return [
        KsmPod(U_WEB1, "web-5d8f7c9b6-abcde", DATA_START, END, rs, created=DATA_START - 600,
               started=DATA_START - 590, phases=[(0, "Running")]),
        KsmPod(U_WEB2, "web-5d8f7c9b6-fghij", DATA_START, END, rs, node="gpu-node-2",
               created=DATA_START - 600, started=DATA_START - 580, phases=[(0, "Running")]),
        KsmPod(U_DB_OLD, "db-0", DATA_START, END - 60 * m, ("StatefulSet", "db"),
               created=DATA_START - 900, started=DATA_START - 890, phases=[(0, "Running")]),
        KsmPod(U_DB_NEW, "db-0", END - 59 * m, END, ("StatefulSet", "db"), node="gpu-node-2",
               created=END - 59 * m, started=END - 59 * m + 5, phases=[(0, "Running")]),
        KsmPod(U_TRAIN, "train-x7k2p", END - 100 * m, END, ("Job", "train"), created=END - 100 * m,
               started=END - 100 * m + 3, completed=END - 40 * m,
               phases=[(0, "Running"), (END - 40 * m, "Succeeded")]),
        KsmPod(U_DEBUG, "debug", END - 35 * m, END, None, namespace="runai-vision", created=END - 35 * m,
               started=END - 30 * m, phases=[(0, "Pending"), (END - 30 * m, "Running")]),
        KsmPod("abc-123-xxx", "odd", END - 20 * m, END, None, created=END - 20 * m, started=END - 20 * m,
               phases=[(0, "Running")]),
        KsmPod(U_GONE, "old-0", DATA_START, END - 150 * m, ("StatefulSet", "old"), created=DATA_START - 60,
               started=DATA_START - 50, phases=[(0, "Running")]),
    ]  # fmt: skip


def _labels(**labels: str) -> str:
    return "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}"


def openmetrics(pods: list[KsmPod]) -> str:
    """kube-state-metrics history as OpenMetrics: families contiguous, each series in time order."""
    families: dict[str, list[str]] = {
        name: []
        for name in (
            "kube_pod_info",
            "kube_pod_owner",
            "kube_pod_created",
            "kube_pod_start_time",
            "kube_pod_completion_time",
            "kube_pod_status_phase",
            "kube_replicaset_owner",
        )
    }

    def series(name: str, labels: str, points: list[tuple[int, float]]) -> None:
        families[name].extend(f"{name}{labels} {float(value)!r} {t}\n" for t, value in points)

    for p in pods:
        ident = {"namespace": p.namespace, "pod": p.name, "uid": p.uid}
        times = list(range(p.first, p.last + 1, SCRAPE))
        kind, owner = p.owner or ("<none>", "<none>")
        by = {"created_by_kind": kind, "created_by_name": owner} if p.owner else {}
        info = _labels(**ident, node=p.node, **by, host_ip="10.0.0.1", pod_ip="10.1.0.1")
        series("kube_pod_info", info, [(t, 1) for t in times])
        controller = "true" if p.owner else "<none>"
        owned = _labels(**ident, owner_kind=kind, owner_name=owner, owner_is_controller=controller)
        series("kube_pod_owner", owned, [(t, 1) for t in times])
        series("kube_pod_created", _labels(**ident), [(t, p.created) for t in times])
        if p.started is not None:
            series("kube_pod_start_time", _labels(**ident), [(t, p.started) for t in times if t >= p.started])
        if p.completed is not None:
            done = [(t, p.completed) for t in times if t >= p.completed]
            series("kube_pod_completion_time", _labels(**ident), done)
        for phase in PHASES:
            points = [(t, 1.0 if p.phase_at(t) == phase else 0.0) for t in times]
            series("kube_pod_status_phase", _labels(**ident, phase=phase), points)
    rs = _labels(namespace="team-a", replicaset="web-5d8f7c9b6", owner_kind="Deployment", owner_name="web",
                 owner_is_controller="true")  # fmt: skip
    series("kube_replicaset_owner", rs, [(t, 1) for t in range(DATA_START, END + 1, SCRAPE)])
    out = []
    for name, lines in families.items():
        out.append(f"# TYPE {name} gauge\n")
        out.extend(lines)
    out.append("# EOF\n")
    return "".join(out)


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerHandle]:
    for binary in ("prometheus", "promtool"):
        if shutil.which(binary) is None:
            missing_server(binary)
    work = tmp_path_factory.mktemp("ksm")
    data = work / "ksm.om"
    data.write_text(openmetrics(cluster()))
    backfill([data], work / "tsdb", 7200)
    handle = start_prometheus(work / "tsdb", block_s=7200, scrape_interval_s=SCRAPE)
    try:
        yield handle
    finally:
        handle.stop()


def discover(prometheus: ServerHandle, registry: Registry, **kw: object) -> DiscoveryReport:
    async def go() -> DiscoveryReport:
        backend = PrometheusBackend(prometheus.url, httpx.Client())
        try:
            kw.setdefault("start_ms", WINDOW[0])
            kw.setdefault("end_ms", WINDOW[1])
            return await discover_kubernetes(backend, registry, "acme", **kw)  # type: ignore[arg-type]
        finally:
            await backend.aclose()

    return anyio.run(go)


def at(seconds: int) -> datetime:
    return ms_to_datetime(seconds * 1000)


def pod(registry: Registry, uid: str) -> Pod:
    found = registry.get_pod(uid)
    assert found is not None, uid
    return found


def test_discovery_builds_workloads_from_owners(prometheus: ServerHandle, registry: Registry) -> None:
    report = discover(prometheus, registry)
    n = report.counts
    assert (n.workloads_created, n.pods_created, n.workloads_updated, n.pods_updated) == (4, 6, 0, 0)
    assert report.pods_seen == 6 and len(report.ignored) == 1 and "abc-123-xxx" in report.ignored[0]
    assert registry.get_pod(U_GONE) is None  # gone before the window

    web = registry.get_workload(workload_uuid("team-a", "Deployment", "web"))  # followed the ReplicaSet
    assert web is not None and (web.name, web.org, web.project) == ("web", "acme", "team-a")
    assert web.created_at == at(DATA_START - 600)
    pods, total = registry.list_pods(web.workload_id)
    assert total == 2 and {p.pod_id for p in pods} == {U_WEB1, U_WEB2}
    web2 = pod(registry, U_WEB2)
    assert (web2.node, web2.phase, web2.gpus) == ("gpu-node-2", PodPhase.RUNNING, ())
    assert (web2.start_time, web2.end_time, web2.namespace) == (at(DATA_START - 580), None, "team-a")

    db = workload_uuid("team-a", "StatefulSet", "db")
    pods, total = registry.list_pods(db)
    assert total == 2 and [p.pod_id for p in pods] == [U_DB_OLD, U_DB_NEW]  # by start time
    old, new = pods
    assert (old.phase, old.end_time) == (PodPhase.UNKNOWN, at(END - 3600))  # deleted: its last sample
    assert (new.phase, new.end_time, new.node) == (PodPhase.RUNNING, None, "gpu-node-2")
    assert new.start_time == at(END - 59 * 60 + 5)

    train = pod(registry, U_TRAIN)
    assert train.workload_id == workload_uuid("team-a", "Job", "train")
    assert (train.phase, train.start_time, train.end_time) == (
        PodPhase.SUCCEEDED,
        at(END - 100 * 60 + 3),
        at(END - 40 * 60),
    )

    debug = pod(registry, U_DEBUG)  # no owner: its own workload
    assert debug.workload_id == workload_uuid("runai-vision", "Pod", "debug")
    assert (debug.phase, debug.start_time, debug.namespace) == (
        PodPhase.RUNNING,
        at(END - 1800),
        "runai-vision",
    )
    workload = registry.get_workload(debug.workload_id)
    assert workload is not None and (workload.name, workload.project) == ("debug", "runai-vision")


def test_discovery_is_idempotent(prometheus: ServerHandle, registry: Registry) -> None:
    discover(prometheus, registry)
    before = {p: registry.get_pod(p) for p in (U_WEB1, U_WEB2, U_DB_OLD, U_DB_NEW, U_TRAIN, U_DEBUG)}
    again = discover(prometheus, registry).counts
    assert (again.workloads_created, again.workloads_updated, again.workloads_unchanged) == (0, 0, 4)
    assert (again.pods_created, again.pods_updated, again.pods_unchanged) == (0, 0, 6)
    assert {p: registry.get_pod(p) for p in before} == before


def test_an_earlier_window_sees_the_pod_still_running(prometheus: ServerHandle, registry: Registry) -> None:
    # at END-45m the training pod ran and the old db-0 existed; the later window then completes them
    early = discover(prometheus, registry, end_ms=(END - 45 * 60) * 1000)
    assert early.pods_seen == 5  # web x2, both db-0, train; no debug yet
    assert pod(registry, U_TRAIN).end_time is None and pod(registry, U_TRAIN).phase is PodPhase.RUNNING
    assert pod(registry, U_DB_OLD).end_time == at(END - 3600)  # already gone at END-45m
    late = discover(prometheus, registry).counts
    assert (late.workloads_created, late.pods_created, late.pods_updated) == (1, 1, 1)
    assert pod(registry, U_TRAIN).end_time == at(END - 40 * 60)


def test_namespaces_and_project_mapping(prometheus: ServerHandle, registry: Registry) -> None:
    report = discover(prometheus, registry, namespaces=["runai-vision"], project_from=PROJECT_FROM["runai"])
    assert report.pods_seen == 1 and report.counts.pods_created == 1
    workload = registry.get_workload(workload_uuid("runai-vision", "Pod", "debug"))
    assert workload is not None and workload.project == "vision"


def test_bad_arguments(registry: Registry) -> None:
    async def go(**kw: object) -> None:
        await discover_kubernetes(None, registry, **kw)  # type: ignore[arg-type]

    for kw in (
        {"org": "Bad Org", "start_ms": 0, "end_ms": 1000},
        {"org": "acme", "start_ms": 1000, "end_ms": 1000},
        {"org": "acme", "start_ms": 0, "end_ms": 1000, "namespaces": ['x"}']},
    ):
        with pytest.raises(InvalidRequest):
            anyio.run(lambda kw=kw: go(**kw))


def test_queries_are_built_from_quoted_parts() -> None:
    q = discovery_queries(
        0, 2 * 3600 * 1000, namespaces=["team-a", "b.c"], metric_names={"kube_pod_info": "ksm_info"}
    )
    assert q.info == 'last_over_time(ksm_info{namespace=~"team\\\\-a|b\\\\.c"}[2h])'
    assert q.phase.endswith("[2h]) == 1") and q.phase.startswith("last_over_time(kube_pod_status_phase{")
    assert q.last_seen == 'max_over_time(timestamp(ksm_info{namespace=~"team\\\\-a|b\\\\.c"})[2h:15s])'
    assert 'owner_kind="Deployment"' in q.replicaset_owner
    long = discovery_queries(0, 30 * 86_400_000)
    assert long.last_seen.endswith("[30d:4m])")


def test_discovery_task_reports_and_keeps_going(prometheus: ServerHandle, registry: Registry) -> None:
    reports: list[DiscoveryReport] = []
    clock_values = iter([END, END, END + 600, END + 600, END + 600])

    def clock() -> datetime:
        return at(next(clock_values, END + 600))

    async def go() -> None:
        backend = PrometheusBackend(prometheus.url, httpx.Client())
        try:
            async with anyio.create_task_group() as tg:

                def on_report(report: DiscoveryReport) -> None:
                    reports.append(report)
                    if len(reports) == 2:
                        tg.cancel_scope.cancel()

                tg.start_soon(
                    lambda: discovery_task(
                        backend, registry, "acme", interval_s=0.01, first_window_s=7200, clock=clock,
                        on_report=on_report,
                    )
                )  # fmt: skip
        finally:
            await backend.aclose()

    anyio.run(go)
    first, second = reports
    assert (first.start_ms, first.end_ms) == (WINDOW[0], WINDOW[1])
    assert first.counts.pods_created == 6
    assert (second.start_ms, second.end_ms) == ((END - 600) * 1000, (END + 600) * 1000)  # overlaps
    assert second.counts.pods_created == 0


def test_discovery_task_survives_a_backend_failure(
    registry: Registry, caplog: pytest.LogCaptureFixture
) -> None:
    async def go() -> None:
        backend = PrometheusBackend("http://127.0.0.1:9", httpx.Client(timeout=1))
        try:
            with anyio.move_on_after(0.5):
                await discovery_task(backend, registry, "acme", interval_s=0.05, clock=lambda: at(END))
        finally:
            await backend.aclose()

    anyio.run(go)
    # it logs and tries again on the next interval: more than one failure in half a second
    assert sum("kubernetes discovery failed" in r.getMessage() for r in caplog.records) >= 2


def test_serve_runs_discovery_when_configured(
    prometheus: ServerHandle, registry: Registry, tmp_path: Path
) -> None:
    settings = Settings(
        data_dir=tmp_path, prometheus_url=prometheus.url, discovery_interval=3600, discovery_org="acme"
    )
    app = create_app(settings, registry=registry, clock=lambda: at(END))

    async def go() -> None:
        async with app.router.lifespan_context(app):
            with anyio.fail_after(20):
                while registry.get_pod(U_DEBUG) is None:
                    await anyio.sleep(0.05)

    anyio.run(go)
    assert registry.list_workloads(org="acme")[1] == 5  # the first run looks back 24 h: old-0 too
    assert pod(registry, U_GONE).end_time == at(END - 150 * 60)


def test_settings_need_an_org_for_discovery(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="GPULENS_DISCOVERY_ORG"):
        Settings(data_dir=tmp_path, discovery_interval=60)
    with pytest.raises(ValueError, match="org slug"):
        Settings(data_dir=tmp_path, discovery_org="Not A Slug")


def test_cli_discover(prometheus: ServerHandle, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    db = f"sqlite:///{tmp_path / 'cli.db'}"
    monkeypatch.setenv("GPULENS_DATA_DIR", str(tmp_path))
    args = ["discover", "kubernetes", "--org", "acme", "--since", "2h", "--until", "2026-01-01T00:00:00Z",
            "--prometheus-url", prometheus.url, "--database", db]  # fmt: skip
    first = CliRunner().invoke(cli_app, args)
    assert first.exit_code == 0, (first.stdout, first.stderr)
    assert "6 pods seen" in first.stdout
    assert "workloads: 4 created, 0 updated, 0 unchanged" in first.stdout
    assert "pods: 6 created, 0 updated, 0 unchanged" in first.stdout
    assert "abc-123-xxx" in first.stderr
    second = CliRunner().invoke(cli_app, [*args, "--json"])
    assert second.exit_code == 0
    assert '"unchanged": 6' in second.stdout and '"created": 0' in second.stdout

    bad = CliRunner().invoke(cli_app, ["discover", "kubernetes", "--org", "acme", "--since", "soon",
                                       "--prometheus-url", prometheus.url, "--database", db])  # fmt: skip
    assert bad.exit_code == 2 and "--since" in bad.stderr
    unreachable = "http://127.0.0.1:9"
    down = CliRunner().invoke(cli_app, ["discover", "kubernetes", "--org", "acme",
                                        "--prometheus-url", unreachable, "--database", db])  # fmt: skip
    assert down.exit_code == 1 and down.stderr.startswith("error:") and "unreachable" in down.stderr


def test_started_at_is_utc() -> None:
    assert at(END) == datetime(2026, 1, 1, tzinfo=UTC)
