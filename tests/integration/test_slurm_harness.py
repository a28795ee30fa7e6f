"""The test kit's Slurm: jobs asking for GPUs get stand-in GPUs as GRES, slurmrestd answers
with a JWT (and refuses a request without one), hooks run when installed."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import pytest

pytestmark = pytest.mark.integration


def test_gpu_job_gets_gres_indices_and_slurmrestd_answers(slurm: Any) -> None:
    job = slurm.sbatch("--gres=gpu:2", script="sleep 2")
    deadline = time.monotonic() + 20
    record: dict[str, Any] = {}
    while time.monotonic() < deadline:
        record = next(j for j in slurm.jobs() if j["job_id"] == job)
        if record["job_state"] == "RUNNING":
            break
        time.sleep(0.1)
    assert record["job_state"] == "RUNNING"
    assert record["gres_detail"][0].startswith(f"gpu:{slurm.gpu_type}:2(IDX:")
    headers = {"X-SLURM-USER-NAME": "root", "X-SLURM-USER-TOKEN": slurm.token()}
    resp = httpx.get(f"{slurm.rest_url}/slurm/v0.0.38/jobs", headers=headers, timeout=10)
    assert resp.status_code == 200
    assert job in [j["job_id"] for j in resp.json()["jobs"]]
    assert httpx.get(f"{slurm.rest_url}/slurm/v0.0.38/jobs", timeout=10).status_code == 401
    slurm.run("scancel", str(job))
    slurm.wait_ended([job])


def test_installed_hook_runs(slurm: Any, tmp_path: Path) -> None:
    out = tmp_path / "ran"
    hook = tmp_path / "hook.sh"
    hook.write_text(f'#!/bin/sh\necho "$SLURM_JOB_ID $SLURM_JOB_EXIT_CODE" >> {out}\n')
    hook.chmod(0o755)
    slurm.install_hook("epilog_slurmctld", hook)
    try:
        job = slurm.sbatch("--gres=gpu:1", script="exit 2")
        slurm.wait_ended([job])
        deadline = time.monotonic() + 10
        while not out.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        slurm.install_hook("epilog_slurmctld", None)
    assert out.read_text().split() == [str(job), str(2 << 8)]
