"""`gpulens discover slurm` against a real Slurm (the test kit's two nodes with stand-in GPUs).

Jobs submitted with `sbatch --gres`: a two-GPU job of account physics, a two-task array as user
nobody, a job that fails with exit code 3, and a CPU-only job. Discovery while they run (slurmrestd)
registers one execution per job node with the GPU indices `scontrol -d show job` shows, the user,
the account, the state; after they end a pass from `squeue --json` (no slurmrestd) sets the states
and exit codes and keeps the indices. A job that ran and ended while gpulens was not running is
registered by the first pass of the serve loop after it is back.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio
import pytest

from gpulens.api.app import create_app
from gpulens.cli.discover import app
from gpulens.config import Settings
from gpulens.domain.models import ExecutionStatus
from gpulens.planning.slurm import execution_uuid, parse_gres_detail, workload_uuid
from gpulens.service.slurm import SlurmDiscoveryReport, SlurmRestSource, discover_slurm, slurm_discovery_task
from gpulens.storage.registry import Registry
from tests.cli.conftest import invoke_ok
from tests.integration.conftest import serve_app

pytestmark = pytest.mark.integration


def indices(gres: str) -> tuple[str, ...]:
    parsed = parse_gres_detail(gres)
    assert parsed is not None and parsed.indices is not None, gres
    return parsed.indices


@pytest.fixture(scope="module")
def jobs(slurm: Any) -> Iterator[dict[str, Any]]:
    """The jobs, running; `release()` lets them end. GPU truth from `scontrol -d show job`."""
    gate, wait = slurm.gate("discovery")
    two = slurm.sbatch("--gres=gpu:2", "--account=physics", "--job-name=train", script=wait)
    array = slurm.sbatch("--gres=gpu:1", "--array=0-1", "--uid=nobody", "--gid=nogroup", script=wait)
    failing = slurm.sbatch("--gres=gpu:2", "--account=chem", script=f"{wait}; exit 3")
    cpu = slurm.sbatch(script=wait)
    records = slurm.wait_running([two, array, failing, cpu])
    tasks = sorted((r for r in records if r.get("array_job_id") == array), key=lambda r: r["array_task_id"])
    truth = {
        r["job_id"]: indices(slurm.job_gres(r["job_id"])[slurm.node]) for r in records if r["job_id"] != cpu
    }
    info = {
        "two": two,
        "tasks": [t["job_id"] for t in tasks],
        "array": array,
        "failing": failing,
        "cpu": cpu,
        "truth": truth,
        "release": lambda: gate.touch(),
    }
    try:
        yield info
    finally:
        gate.touch()
        slurm.wait_ended([two, array, failing, cpu])


@pytest.fixture
def db(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    url = f"sqlite:///{tmp_path / 'registry.db'}"
    monkeypatch.setenv("GPULENS_DATABASE_URL", url)
    monkeypatch.setenv("GPULENS_DATA_DIR", str(tmp_path))
    return url


def registry_at(url: str) -> Registry:
    registry = Registry.from_url(url)
    registry.migrate()
    return registry


def test_discovery_registers_running_and_ended_jobs(
    slurm: Any, jobs: dict[str, Any], db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SLURM_CONF", str(slurm.conf))
    monkeypatch.setenv("GPULENS_SLURM_URL", slurm.rest_url)
    monkeypatch.setenv("GPULENS_SLURM_TOKEN", slurm.token())
    # only these jobs: the session's Slurm holds other tests' jobs too (an array by its own id)
    mine = [f"--job={j}" for j in (jobs["two"], jobs["array"], jobs["failing"], jobs["cpu"])]
    first = json.loads(invoke_ok(app, "slurm", "--org", "acme", "--json", *mine).stdout)
    assert first["source"] == "slurmrestd"
    gpu_jobs = [jobs["two"], *jobs["tasks"], jobs["failing"]]
    assert first["executions"]["created"] == len(gpu_jobs) and first["workloads"]["created"] == len(gpu_jobs)
    assert first["jobs_without_gpus"] >= 1 and first["gpus_unknown"] == []
    truth = jobs["truth"]
    assert len({g for gs in truth.values() for g in gs}) == 6, (truth, jobs)  # disjoint: 2 + 1 + 1 + 2

    registry = registry_at(db)
    try:
        cluster = slurm.cluster
        for job_id in gpu_jobs:
            e = registry.get_execution(execution_uuid(cluster, job_id, slurm.node))
            assert e is not None, job_id
            assert (e.org, e.hostname, e.gpus, e.status) == (
                "acme",
                slurm.node,
                truth[job_id],
                ExecutionStatus.RUNNING,
            )
            assert e.start_time is not None and e.end_time is None
        two = registry.get_execution(execution_uuid(cluster, jobs["two"], slurm.node))
        assert two is not None and (two.user, two.project, two.file_name) == ("root", "physics", "train")
        assert two.hardware_profile == slurm.gpu_type
        for task in jobs["tasks"]:
            e = registry.get_execution(execution_uuid(cluster, task, slurm.node))
            assert e is not None and e.user == "nobody"
        assert registry.get_execution(execution_uuid(cluster, jobs["cpu"], slurm.node)) is None
        workload = registry.get_workload(workload_uuid(cluster, jobs["two"]))
        assert workload is not None and workload.project == "physics"
        pods, _ = registry.list_pods(workload.workload_id)
        assert [(p.node, p.gpus) for p in pods] == [(slurm.node, truth[jobs["two"]])]

        again = json.loads(invoke_ok(app, "slurm", "--org", "acme", "--json", *mine).stdout)
        assert again["executions"]["unchanged"] == len(gpu_jobs) and again["workloads"]["unchanged"] == len(
            gpu_jobs
        )

        jobs["release"]()
        slurm.wait_ended([jobs["two"], jobs["failing"], *jobs["tasks"]])
        monkeypatch.delenv("GPULENS_SLURM_URL")  # the squeue/sacct path
        ended = json.loads(invoke_ok(app, "slurm", "--org", "acme", "--json", *mine).stdout)
        assert ended["source"] == "squeue/sacct"
        assert ended["executions"]["updated"] == len(gpu_jobs) and ended["gpus_unknown"] == []
        failed = registry.get_execution(execution_uuid(cluster, jobs["failing"], slurm.node))
        assert failed is not None
        assert (failed.status, failed.return_code, failed.project) == (ExecutionStatus.FAILED, 3, "chem")
        assert failed.gpus == truth[jobs["failing"]] and failed.end_time is not None
        done = registry.get_execution(execution_uuid(cluster, jobs["two"], slurm.node))
        assert done is not None and (done.status, done.return_code) == (ExecutionStatus.COMPLETED, 0)
        assert done.gpus == truth[jobs["two"]] and done.hardware_profile == slurm.gpu_type
        only = json.loads(
            invoke_ok(app, "slurm", "--org", "acme", "--json", "--job", str(jobs["tasks"][0])).stdout
        )
        assert only["executions"]["unchanged"] == 1 and len(only["jobs"]) == 1
    finally:
        registry.dispose()


def test_a_job_that_ended_while_gpulens_was_down(slurm: Any, tmp_path: Path) -> None:
    registry = registry_at(f"sqlite:///{tmp_path / 'r.db'}")
    reports: list[SlurmDiscoveryReport] = []
    token = slurm.token()

    async def serve_until(passes: int) -> None:
        async with anyio.create_task_group() as tg:

            def seen(report: SlurmDiscoveryReport) -> None:
                reports.append(report)
                if len(reports) >= passes:
                    tg.cancel_scope.cancel()

            tg.start_soon(
                lambda: slurm_discovery_task(
                    lambda: SlurmRestSource(slurm.rest_url, token),
                    registry,
                    "acme",
                    interval_s=0.2,
                    on_report=seen,
                    clock=lambda: datetime.now(UTC),
                )
            )

    try:
        anyio.run(serve_until, 1)  # up, then down
        job = slurm.sbatch("--gres=gpu:1", "--account=physics", script="exit 5")
        slurm.wait_ended([job])
        execution_id = execution_uuid(slurm.cluster, job, slurm.node)
        assert registry.get_execution(execution_id) is None
        anyio.run(serve_until, 2)  # back: its first pass registers the job
        e = registry.get_execution(execution_id)
        assert e is not None
        assert (e.status, e.return_code, e.user, e.project) == (ExecutionStatus.FAILED, 5, "root", "physics")
        assert e.gpus == ()  # slurmctld no longer says which; no hpc_job series here either
        assert f"execution {execution_id} on {slurm.node}" in reports[1].unknown_gpus
    finally:
        registry.dispose()


def test_serve_discovers_slurm_jobs(slurm: Any, tmp_path: Path) -> None:
    """`serve` with GPULENS_SLURM_URL, a token and the discovery interval registers a running job."""
    gate, wait = slurm.gate("serve")
    job = slurm.sbatch("--gres=gpu:1", "--account=physics", script=wait)
    registry = registry_at(f"sqlite:///{tmp_path / 'r.db'}")
    try:
        slurm.wait_running([job])
        gpus = indices(slurm.job_gres(job)[slurm.node])
        settings = Settings(
            data_dir=tmp_path,
            database_url=f"sqlite:///{tmp_path / 'r.db'}",
            prometheus_url="http://127.0.0.1:9",  # none there: Kubernetes discovery fails, quietly
            discovery_interval=1,
            discovery_org="acme",
            slurm_url=slurm.rest_url,
            slurm_token=slurm.token(),
            archive_interval=0,
            summary_interval=0,
        )
        execution_id = execution_uuid(slurm.cluster, job, slurm.node)
        with serve_app(create_app(settings, registry=registry)):
            deadline = time.monotonic() + 30
            while registry.get_execution(execution_id) is None:
                assert time.monotonic() < deadline, "serve did not register the job within 30 s"
                time.sleep(0.2)
        e = registry.get_execution(execution_id)
        assert e is not None and (e.org, e.gpus, e.project, e.status) == (
            "acme",
            gpus,
            "physics",
            ExecutionStatus.RUNNING,
        )
    finally:
        gate.touch()
        slurm.wait_ended([job])
        registry.dispose()


def test_multi_node_and_heterogeneous_jobs(slurm: Any, tmp_path: Path) -> None:
    """One execution per node of a two-node job, each with that node's GPUs, and one workload with a
    pod per node; a heterogeneous job's components (one a node) are one workload."""
    gate, wait = slurm.gate("multi")
    multi = slurm.sbatch(
        f"--partition={slurm.multi}", "--nodes=2", "--gres=gpu:2", "--account=physics", script=wait
    )
    het_script = slurm.root / "gates" / "het.sh"
    het_script.write_text(f"#!/bin/sh\n{wait}\n")
    het_script.chmod(0o755)
    out = slurm.run(
        "sbatch",
        "--parsable",
        "--output=/dev/null",
        "--chdir=/tmp",
        f"--partition={slurm.multi}",
        "--gres=gpu:1",
        ":",
        f"--partition={slurm.multi}",
        "--gres=gpu:1",
        str(het_script),
    ).stdout
    het = int(out.strip().split(";")[0].split("+")[0])
    registry = registry_at(f"sqlite:///{tmp_path / 'r.db'}")
    try:
        slurm.wait_running([multi, het])
        components = sorted(
            (r for r in slurm.jobs() if r.get("het_job_id") == het), key=lambda r: r["het_job_offset"]
        )
        assert len(components) == 2 and all(r["job_state"] == "RUNNING" for r in components)
        truth = slurm.job_gres(multi)
        assert sorted(truth) == sorted([slurm.node, slurm.node2])
        source = SlurmRestSource(slurm.rest_url, slurm.token())

        async def discover() -> Any:
            try:
                only = (str(multi), str(het))
                return await discover_slurm(
                    source, registry, "acme", since_ms=int(time.time() * 1000) - 600_000, only=only
                )
            finally:
                await source.aclose()

        report = anyio.run(discover)
        assert report.counts.executions_created == 4 and report.counts.workloads_created == 2
        for node, gres in truth.items():
            e = registry.get_execution(execution_uuid(slurm.cluster, multi, node))
            assert e is not None and (e.hostname, e.gpus, e.project) == (node, indices(gres), "physics")
        pods, total = registry.list_pods(workload_uuid(slurm.cluster, multi))
        assert total == 2 and sorted(p.node or "" for p in pods) == sorted(truth)
        het_pods, total = registry.list_pods(workload_uuid(slurm.cluster, het))
        assert total == 2
        for record in components:
            node = record["nodes"]
            e = registry.get_execution(execution_uuid(slurm.cluster, record["job_id"], node))
            assert e is not None and e.gpus == indices(slurm.job_gres(record["job_id"])[node])
        assert {p.name for p in het_pods} == {
            f"job-{het}-{r['het_job_offset']}-{r['nodes']}" for r in components
        }
    finally:
        gate.touch()
        slurm.wait_ended([multi, het])
        registry.dispose()
