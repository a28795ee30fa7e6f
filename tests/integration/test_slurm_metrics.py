"""A Slurm job's GPUs, and only those, in both dialects and in `gpulens report --slurm`.

Two jobs share the test kit's node: a two-GPU job and a one-GPU job. After `discover slurm`
registered them, the test kit writes dcgm-exporter series for all eight GPUs of the node (GPU k at a
constant 10 + 7k percent, labelled as on a Slurm node: Hostname and gpu, no pod labels) into a
Prometheus. Each job node's Lyceum metrics and summary, and each job's Run:ai workload metrics, then
answer with that job's GPUs' values only.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import anyio
import pytest

from gpulens.api.app import create_app
from gpulens.backends.prometheus import PrometheusBackend, make_client
from gpulens.cli.main import app as cli
from gpulens.config import Settings
from gpulens.domain.timeparse import format_rfc3339_ms
from gpulens.planning.slurm import execution_uuid, parse_gres_detail, workload_uuid
from gpulens.service.archive import Archiver
from gpulens.service.slurm import SlurmRestSource, discover_slurm
from gpulens.service.wiring import archive_options
from gpulens.storage.archive import ArchiveStore
from gpulens.storage.registry import Registry
from gpulens_testkit.slurm import gpu_util_openmetrics, prometheus_with
from tests.api.conftest import Client
from tests.cli.conftest import invoke_ok
from tests.conftest import sqlite_registry

pytestmark = pytest.mark.integration


def util(gpu: int) -> float:
    return 10.0 + 7 * gpu


@dataclass
class Jobs:
    client: Client
    key: str
    registry: Registry
    db: str
    prometheus: str
    gpus: dict[int, tuple[str, ...]]  # job id -> its GPU indices
    node: str
    cluster: str
    start_ms: int
    end_ms: int
    settings: Settings
    handle: Any

    def get(self, path: str, **params: Any) -> Any:
        r = self.client.get(path, params=params, headers={"Authorization": f"Bearer {self.key}"})
        assert r.status_code == 200, r.text
        return r.json()


@pytest.fixture(scope="module")
def jobs(slurm: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Jobs]:
    tmp = Path(tmp_path_factory.mktemp("slurm-metrics"))
    db = f"sqlite:///{tmp / 'r.db'}"
    registry = sqlite_registry(tmp / "r.db")
    _, key = registry.create_key("acme", name="alice")
    gate, wait = slurm.gate("metrics")
    ids = [
        slurm.sbatch("--gres=gpu:2", "--account=physics", script=wait),
        slurm.sbatch("--gres=gpu:1", "--account=physics", script=wait),
    ]
    token = slurm.token()

    async def discover() -> None:
        source = SlurmRestSource(slurm.rest_url, token)  # an event loop a run: a client a run
        only = tuple(str(j) for j in ids)
        try:
            await discover_slurm(
                source, registry, "acme", since_ms=int(time.time() * 1000) - 600_000, only=only
            )
        finally:
            await source.aclose()

    handle = None
    try:
        slurm.wait_running(ids)
        gpus = {}
        for job in ids:
            parsed = parse_gres_detail(slurm.job_gres(job)[slurm.node])
            assert parsed is not None and parsed.indices is not None
            gpus[job] = parsed.indices
        anyio.run(discover)
        time.sleep(2)  # a few seconds of samples
        gate.touch()
        slurm.wait_ended(ids)
        anyio.run(discover)
        lives = [registry.get_execution(execution_uuid(slurm.cluster, j, slurm.node)) for j in ids]
        assert all(e is not None and e.start_time and e.end_time for e in lives)
        start_s = min(int(e.start_time.timestamp()) for e in lives if e and e.start_time) - 30
        end_s = max(int(e.end_time.timestamp()) for e in lives if e and e.end_time) + 30
        # each job's GPUs read another value outside its lifetime: a read by host and index must not
        # count what other jobs (or none) did with them before and after
        lifetimes = {
            int(g): (int(e.start_time.timestamp()), int(e.end_time.timestamp()))
            for j, e in zip(ids, lives, strict=True)
            if e and e.start_time and e.end_time
            for g in gpus[j]
        }
        utils = {k: util(k) for k in range(slurm.gpus)}
        text = gpu_util_openmetrics(slurm.node, utils, start_s, end_s, lifetimes=lifetimes)
        handle = prometheus_with(text, tmp / "prometheus")
        settings = Settings(data_dir=tmp, prometheus_url=handle.url, database_url=db, scrape_interval="1s")
        yield Jobs(
            Client(create_app(settings, registry=registry)),
            key,
            registry,
            db,
            handle.url,
            gpus,
            slurm.node,
            slurm.cluster,
            start_s * 1000,
            end_s * 1000,
            settings,
            handle,
        )
    finally:
        gate.touch()
        if handle is not None:
            handle.stop()
        registry.dispose()


def check_lyceum(jobs: Jobs) -> None:
    for job, gpus in jobs.gpus.items():
        execution_id = execution_uuid(jobs.cluster, job, jobs.node)
        body = jobs.get(f"/api/v2/external/execution/{execution_id}/metrics", step="1s")
        values = {float(p["value"]) for p in body["gpuUtilizationPercent"]}
        assert values == {sum(util(int(g)) for g in gpus) / len(gpus)}, (job, gpus, values)
        summary = jobs.get(f"/api/v2/external/execution/{execution_id}/summary")
        assert sorted(g["gpu"] for g in summary["perGpu"]) == sorted(gpus)
        for g in summary["perGpu"]:
            assert float(g["stats"]["gpuUtilizationPercent"]["mean"]) == pytest.approx(util(int(g["gpu"])))


def test_lyceum_metrics_and_summary_of_each_job_node(jobs: Jobs) -> None:
    check_lyceum(jobs)


def check_runai(jobs: Jobs) -> None:
    window = {
        "start": format_rfc3339_ms(jobs.start_ms + 20_000),
        "end": format_rfc3339_ms(jobs.end_ms - 20_000),
        "numberOfSamples": "5",
    }
    for job, gpus in jobs.gpus.items():
        workload = workload_uuid(jobs.cluster, job)
        body = jobs.get(f"/api/v1/workloads/{workload}/metrics", metricType="GPU_UTILIZATION", **window)
        (whole,) = body["measurements"]
        mean = sum(util(int(g)) for g in gpus) / len(gpus)
        assert {float(v["value"]) for v in whole["values"]} == {mean}, (job, gpus, body)
        pod = execution_uuid(jobs.cluster, job, jobs.node)  # a job node's pod id is its execution id
        body = jobs.get(
            f"/api/v1/workloads/{workload}/pods/{pod}/metrics", metricType="GPU_UTILIZATION_PER_GPU", **window
        )
        seen = {m["labels"]["gpu"]: {float(v["value"]) for v in m["values"]} for m in body["measurements"]}
        assert seen == {g: {util(int(g))} for g in gpus}, (job, gpus, body)


def test_runai_workload_and_pod_metrics_of_each_job(jobs: Jobs) -> None:
    check_runai(jobs)


def test_report_slurm_names_every_node_and_only_the_jobs_gpus(
    jobs: Jobs, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("GPULENS_DATABASE_URL", jobs.db)
    monkeypatch.setenv("GPULENS_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("GPULENS_PROMETHEUS_URL", jobs.prometheus)
    monkeypatch.setenv("GPULENS_SCRAPE_INTERVAL", "1s")
    job, gpus = next(iter(jobs.gpus.items()))
    body = json.loads(invoke_ok(cli, "report", "--slurm", str(job), "--json").stdout)
    assert body["slurmJob"] == str(job)
    (node,) = body["executions"]
    assert node["node"] == jobs.node and node["executionId"] == execution_uuid(jobs.cluster, job, jobs.node)
    assert sorted(g["gpu"] for g in node["summary"]["perGpu"]) == sorted(gpus)
    text = invoke_ok(cli, "report", "--slurm", str(job)).stdout
    assert f"Slurm job {job} on {jobs.node}" in text


def test_archived_jobs_answer_the_same_without_prometheus(jobs: Jobs) -> None:
    """The archive pass copies each job node's series (its pod's: by host and GPU index too); with
    Prometheus gone the reads answer from the archive, the same. (Last: it stops Prometheus.)"""
    backend = PrometheusBackend(jobs.prometheus, make_client(30, False, 4))
    archiver = Archiver(jobs.registry, ArchiveStore(jobs.registry), backend, archive_options(jobs.settings))
    later = datetime.now(UTC) + timedelta(hours=2)
    archiver.clock = lambda: later

    async def run() -> Any:
        try:
            return await archiver.run_pass()
        finally:
            await backend.aclose()

    report = anyio.run(run)
    assert report.failed == [] and report.executions >= len(jobs.gpus) and report.pods >= len(jobs.gpus)
    jobs.handle.stop()
    check_lyceum(jobs)
    check_runai(jobs)
