"""deploy/slurm's hooks as the real Slurm runs them (the test kit's node, eight stand-in GPUs).

Prolog and Epilog register each job node through `gpulens executions add` with the fields
`gpulens discover slurm` gives the same job (same execution id, host, GPU indices, user, project,
state, exit code), write dcgm-exporter's job-mapping files and clear them at job end. With the
registry unreachable the EpilogSlurmctld hook queues its call, the job is not held up, and a later
`flush` delivers it; a job without GPUs is left alone.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import pytest

from gpulens.domain.models import Execution, ExecutionStatus
from gpulens.planning.slurm import execution_uuid, parse_gres_detail
from gpulens.service.slurm import SlurmRestSource, discover_slurm
from gpulens.storage.registry import Registry

pytestmark = pytest.mark.integration

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "slurm"
GPULENS = Path(__file__).resolve().parents[2] / ".venv" / "bin" / "gpulens"
UNREACHABLE = "postgresql://gpulens@127.0.0.1:1/gpulens"
SAME = (
    "execution_id",
    "org",
    "hostname",
    "gpus",
    "user",
    "project",
    "status",
    "return_code",
    "execution_type",
)


@dataclass
class Hooks:
    root: Path
    conf: Path
    url: str
    registry: Registry

    @property
    def queue(self) -> Path:
        return self.root / "spool" / "queue"

    def write_conf(self, database_url: str) -> None:
        self.conf.write_text(
            f"GLHOOK_ORG=acme\nGLHOOK_BIN={GPULENS}\nGPULENS_DATABASE_URL={database_url}\n"
            f"GLHOOK_SPOOL={self.root / 'spool'}\nGLHOOK_HPC_JOB_DIR={self.root / 'hpc'}/%n\n"
            "GLHOOK_TIMEOUT=90\n"  # a gpulens start on this shared test machine can take seconds
        )

    def wrapper(self, name: str, slurm_conf: Path) -> Path:
        """What Slurm runs: the deploy script with this test's settings file (and SLURM_CONF, which
        EpilogSlurmctld's environment lacks: a site's scontrol finds /etc/slurm/slurm.conf)."""
        path = self.root / f"run-{name}"
        settings = f"export GLHOOK_CONF={self.conf} SLURM_CONF={slurm_conf}"
        path.write_text(f"#!/bin/sh\n{settings}\nexec {DEPLOY / name}\n")
        path.chmod(0o755)
        return path

    def hpc_jobs(self, node: str, gpu: str) -> list[str]:
        path = self.root / "hpc" / node / gpu
        return path.read_text().split() if path.exists() else []


@pytest.fixture
def hooks(slurm: Any, tmp_path: Path) -> Iterator[Hooks]:
    url = f"sqlite:///{tmp_path / 'registry.db'}"
    registry = Registry.from_url(url)
    registry.migrate()
    found = Hooks(tmp_path, tmp_path / "gpulens-slurm.conf", url, registry)
    found.write_conf(url)
    try:
        yield found
    finally:
        for name in ("prolog", "epilog", "epilog_slurmctld"):
            slurm.install_hook(name, None)
        registry.dispose()
        states = slurm.run("sinfo", "-h", "-N", "-o", "%N %T").stdout.split("\n")
        drained = sorted({line.split()[0] for line in states if "drain" in line})
        for node in drained:  # a hook failed: other tests still get their nodes (this one fails)
            slurm.run("scontrol", "update", f"nodename={node}", "state=resume")
        if drained:
            pytest.fail(f"a hook drained {drained}: {slurm.log('slurmctld')[-500:]}")


def wait_for(what: str, ready: Callable[[], bool], timeout_s: float = 90, spool: Path | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    while not ready():
        if time.monotonic() > deadline:
            state = ""
            if spool is not None:
                queued = sorted(p.name for p in (spool / "queue").glob("*"))
                state = f"; queued {queued}, failed {sorted(p.name for p in (spool / 'failed').glob('*'))}"
                state += f", last error {_text(spool / '.last-error')[-500:]!r}"
            pytest.fail(f"{what}: not within {timeout_s} s{state}")
        time.sleep(0.2)


def discovered(slurm: Any, tmp_path: Path, registry: Registry | None = None) -> Registry:
    """The same jobs through `discover slurm` (slurmrestd), into a registry of their own."""
    if registry is None:
        registry = Registry.from_url(f"sqlite:///{tmp_path / 'discovered.db'}")
        registry.migrate()
    source = SlurmRestSource(slurm.rest_url, slurm.token())

    async def run() -> None:
        try:
            await discover_slurm(source, registry, "acme", since_ms=int(time.time() * 1000) - 3_600_000)
        finally:
            await source.aclose()

    anyio.run(run)
    return registry


def fields(e: Execution | None) -> tuple[Any, ...]:
    assert e is not None
    return tuple(getattr(e, f) for f in SAME)


def test_prolog_and_epilog_register_what_discovery_registers(
    slurm: Any, hooks: Hooks, tmp_path: Path
) -> None:
    slurm.install_hook("prolog", hooks.wrapper("prolog", slurm.conf))
    slurm.install_hook("epilog", hooks.wrapper("epilog", slurm.conf))
    gate, wait = slurm.gate("hooks")
    two = slurm.sbatch("--gres=gpu:2", "--account=physics", script=wait)
    failing = slurm.sbatch("--gres=gpu:1", "--account=chem", script=f"{wait}; exit 3")
    cpu = slurm.sbatch(script=wait)
    multi = slurm.sbatch(f"--partition={slurm.multi}", "--nodes=2", "--gres=gpu:1", script=wait)
    try:
        slurm.wait_running([two, failing, cpu, multi])
        truth: dict[tuple[int, str], tuple[str, ...]] = {}  # (job, node) -> GPU indices
        for job in (two, failing, multi):
            for node, gres in slurm.job_gres(job).items():
                parsed = parse_gres_detail(gres)
                assert parsed is not None and parsed.indices
                truth[(job, node)] = parsed.indices
        assert {n for j, n in truth if j == multi} == {slurm.node, slurm.node2}
        ids = {key: execution_uuid(slurm.cluster, *key) for key in truth}

        def registered(status: ExecutionStatus) -> bool:
            found = [hooks.registry.get_execution(i) for i in ids.values()]
            return all(e is not None and e.status is status for e in found)

        wait_for(
            "prolog registrations", lambda: registered(ExecutionStatus.RUNNING), spool=hooks.root / "spool"
        )
        for (job, node), gpus in truth.items():
            e = hooks.registry.get_execution(ids[(job, node)])
            assert e is not None and (e.hostname, e.gpus, e.user) == (node, gpus, "root")
            assert e.hardware_profile == slurm.gpu_type and e.start_time is not None
            assert all(str(job) in hooks.hpc_jobs(node, g) for g in gpus)
        assert hooks.registry.get_execution(execution_uuid(slurm.cluster, cpu, slurm.node)) is None

        other = discovered(slurm, tmp_path)
        try:
            for key in truth:
                assert fields(hooks.registry.get_execution(ids[key])) == fields(other.get_execution(ids[key]))
            gate.touch()
            slurm.wait_ended([two, failing, cpu, multi])
            wait_for(
                "epilog updates",
                lambda: not registered(ExecutionStatus.RUNNING) and not any(hooks.queue.iterdir()),
                spool=hooks.root / "spool",
            )
            done = hooks.registry.get_execution(ids[(two, slurm.node)])
            assert done is not None and (done.status, done.return_code) == (ExecutionStatus.COMPLETED, 0)
            failed = hooks.registry.get_execution(ids[(failing, slurm.node)])
            assert failed is not None and (failed.status, failed.return_code) == (ExecutionStatus.FAILED, 3)
            assert failed.project == "chem" and failed.end_time is not None
            assert failed.gpus == truth[(failing, slurm.node)]
            assert not any(str(j) in hooks.hpc_jobs(n, g) for (j, n), gpus in truth.items() for g in gpus)
            discovered(slurm, tmp_path, other)
            for key in truth:
                assert fields(hooks.registry.get_execution(ids[key])) == fields(other.get_execution(ids[key]))
        finally:
            other.dispose()
    finally:
        gate.touch()


def test_unreachable_registry_queues_and_epilog_slurmctld_delivers_later(slurm: Any, hooks: Hooks) -> None:
    hooks.write_conf(UNREACHABLE)
    slurm.install_hook("epilog_slurmctld", hooks.wrapper("epilog-slurmctld", slurm.conf))
    started = time.monotonic()
    job = slurm.sbatch("--gres=gpu:1", "--account=physics", "--job-name=eval", script="exit 0")
    cpu = slurm.sbatch(script="exit 0")
    slurm.wait_ended([job, cpu])
    assert time.monotonic() - started < 20  # the hook holds nothing up
    wait_for(
        "the failed delivery",
        lambda: "Connection refused" in _text(hooks.root / "spool" / ".last-error"),
        spool=hooks.root / "spool",
    )
    assert len(list(hooks.queue.iterdir())) == 1  # the GPU job only
    execution_id = execution_uuid(slurm.cluster, job, slurm.node)
    assert hooks.registry.get_execution(execution_id) is None

    hooks.write_conf(hooks.url)  # gpulens is back: a timer's (or the next hook's) flush delivers
    env = {**os.environ, "GLHOOK_CONF": str(hooks.conf)}

    def delivered() -> bool:  # (a flush returns at once while the hook's own flusher holds the lock)
        subprocess.run([DEPLOY / "gpulens-slurm-hook", "flush"], env=env, check=True, timeout=120)
        return not any(hooks.queue.iterdir())

    wait_for("the flush", delivered, spool=hooks.root / "spool")
    e = hooks.registry.get_execution(execution_id)
    assert e is not None
    assert (e.status, e.return_code, e.user, e.project, e.hostname, e.file_name) == (
        ExecutionStatus.COMPLETED,
        0,
        "root",
        "physics",
        slurm.node,
        "eval",
    )
    assert hooks.registry.get_execution(execution_uuid(slurm.cluster, cpu, slurm.node)) is None


def _text(path: Path) -> str:
    return path.read_text() if path.exists() else ""
