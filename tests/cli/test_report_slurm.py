"""`gpulens report --slurm JOBID`: its argument checks and the registry look-up (the reports
themselves against a real Slurm and Prometheus: tests/integration/test_slurm_metrics.py)."""

from __future__ import annotations

from datetime import UTC, datetime

from gpulens.cli.main import app
from gpulens.cli.report import slurm_executions
from gpulens.planning.slurm import parse_job, plan_registrations
from gpulens.storage.registry import Registry
from tests.cli.conftest import invoke, one_line_error


def test_one_of_execution_id_or_slurm(db: str) -> None:
    assert "one of them" in one_line_error(invoke(app, "report"), 2)
    assert "one of them" in one_line_error(invoke(app, "report", "abc", "--slurm", "12"), 2)
    assert "not a Slurm job id" in one_line_error(invoke(app, "report", "--slurm", "12; rm"), 2)
    assert "no registered executions" in one_line_error(invoke(app, "report", "--slurm", "12"), 1)


def test_slurm_executions_by_job_array_and_cluster(registry: Registry) -> None:
    def job(job_id: int, **over: object) -> object:
        record = {
            "job_id": job_id,
            "name": "t",
            "job_state": "RUNNING",
            "user_name": "alice",
            "cluster": "hpc",
            "nodes": "n[1-2]",
            "gres_detail": ["gpu:1(IDX:0)", "gpu:1(IDX:1)"],
            "start_time": 1_796_000_000,
            **over,
        }
        return parse_job(record)

    jobs = [job(12), job(20, array_job_id=19, array_task_id=1), job(19, array_job_id=19, array_task_id=0)]
    plan = plan_registrations(jobs, org="acme", cluster="x", now=datetime.now(UTC))  # type: ignore[arg-type]
    for workload, pods in plan.workloads:
        registry.upsert_workload(workload, pods)
    assert [n for _, n in slurm_executions(registry, "12", None)] == ["n1", "n2"]
    assert len(slurm_executions(registry, "19_1", None)) == 2
    assert len(slurm_executions(registry, "19", None)) == 4  # the whole array
    assert slurm_executions(registry, "1", None) == []
    assert slurm_executions(registry, "12", "other") == []
