"""Slurm job records -> executions and workloads (pure): GRES parsing, host lists, states, exit codes,
array and heterogeneous jobs, and the record shapes of v0.0.38, v0.0.40+, squeue and sacct."""

from __future__ import annotations

import contextlib
import re
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpulens.domain.models import ExecutionStatus
from gpulens.domain.workloads import PodPhase
from gpulens.planning.slurm import (
    SLURM_NAMESPACE,
    SlurmFormatError,
    execution_uuid,
    expand_hostlist,
    job_status,
    merge_jobs,
    parse_gres_detail,
    parse_index_list,
    parse_job,
    parse_jobs,
    plan_registrations,
    pod_namespace,
    workload_uuid,
)

NOW = datetime(2026, 12, 2, 8, 0, tzinfo=UTC)


def v38(**over: Any) -> dict[str, Any]:
    """A running job as slurmrestd v0.0.38 (and squeue --json of 22.05) writes it."""
    job: dict[str, Any] = {
        "job_id": 12,
        "name": "train",
        "job_state": "RUNNING",
        "user_name": "alice",
        "account": "physics",
        "partition": "gpu",
        "cluster": "hpc",
        "nodes": "n[1-2]",
        "gres_detail": ["gpu:a100:2(IDX:0-1)", "gpu:a100:2(IDX:2-3)"],
        "tres_per_node": "gres:gpu:a100:2",
        "exit_code": 0,
        "submit_time": 1_796_000_000,
        "start_time": 1_796_000_010,
        "end_time": 1_827_000_000,  # start + time limit while running
        "array_job_id": 0,
        "array_task_id": None,
        "het_job_id": 0,
        "het_job_offset": 0,
        "job_resources": {"allocated_nodes": [{"nodename": "n1"}, {"nodename": "n2"}]},
    }
    if "nodes" in over and "job_resources" not in over:
        job["job_resources"] = None  # the node list then says which nodes
    job.update(over)
    return job


# -- parsers ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("entry", "gpu_type", "count", "indices"),
    [
        ("gpu:a100:2(IDX:0-1)", "a100", 2, ("0", "1")),
        ("gpu:2(IDX:0,2-3)", None, 2, ("0", "2", "3")),
        ("gpu:h100:1(IDX:7)", "h100", 1, ("7",)),
        ("gpu:1(IDX:N/A)", None, 1, None),
        ("gpu:h100:1(IDX:2),shard:0", "h100", 1, ("2",)),
        ("mps:100(0/100),gpu:a100:1(IDX:3)", "a100", 1, ("3",)),
        ("gpu:a100:1(IDX:0),gpu:v100:1(IDX:1)", "a100", 2, ("0", "1")),
        ("gpu:tesla_v100-sxm2:1(IDX:1)", "tesla_v100-sxm2", 1, ("1",)),
    ],
)
def test_gres_detail(entry: str, gpu_type: str | None, count: int, indices: tuple[str, ...] | None) -> None:
    parsed = parse_gres_detail(entry)
    assert parsed is not None
    assert (parsed.gpu_type, parsed.count, parsed.indices) == (gpu_type, count, indices)


def test_gres_detail_without_gpus() -> None:
    assert parse_gres_detail("") is None
    assert parse_gres_detail("shard:2(0/2)") is None


@pytest.mark.parametrize("bad", ["gpu:a100:2(IDX:1-0)", "gpu:2(IDX:x)", "gpu:1(IDX:99999)", "gpu a100"])
def test_gres_detail_refused(bad: str) -> None:
    with pytest.raises(SlurmFormatError):
        parse_gres_detail(bad)


@given(st.sets(st.integers(0, 63), min_size=1))
def test_index_list_round_trip(indices: set[int]) -> None:
    """Any set of indices written as Slurm writes them (runs as a-b) reads back as the same set."""
    ordered = sorted(indices)
    runs: list[list[int]] = []
    for k in ordered:
        if runs and k == runs[-1][-1] + 1:
            runs[-1].append(k)
        else:
            runs.append([k])
    text = ",".join(f"{r[0]}-{r[-1]}" if len(r) > 1 else str(r[0]) for r in runs)
    assert parse_index_list(text) == tuple(str(k) for k in ordered)
    parsed = parse_gres_detail(f"gpu:h100:{len(ordered)}(IDX:{text})")
    assert parsed is not None and parsed.indices == tuple(str(k) for k in ordered)


@given(st.text(max_size=40))
def test_gres_detail_never_crashes_otherwise(text: str) -> None:
    with contextlib.suppress(SlurmFormatError):
        parse_gres_detail(text)


@pytest.mark.parametrize(
    ("text", "names"),
    [
        ("n1", ("n1",)),
        ("gpu[01-03,7],cpu1", ("gpu01", "gpu02", "gpu03", "gpu7", "cpu1")),
        ("r[1-2]n[1-2]", ("r1n1", "r1n2", "r2n1", "r2n2")),
        ("a-b.example[9-10]", ("a-b.example9", "a-b.example10")),
    ],
)
def test_hostlist(text: str, names: tuple[str, ...]) -> None:
    assert expand_hostlist(text) == names


@given(
    st.from_regex(r"[a-z]{1,5}", fullmatch=True), st.integers(0, 50), st.integers(0, 50), st.integers(1, 4)
)
def test_hostlist_range(prefix: str, a: int, n: int, width: int) -> None:
    lo, hi = str(a).zfill(width), str(a + n).zfill(width)
    names = expand_hostlist(f"{prefix}[{lo}-{hi}]")
    assert len(names) == n + 1
    assert names[0] == prefix + (lo if lo.startswith("0") and len(lo) > 1 else str(a))


@pytest.mark.parametrize("bad", ["n[1-", "n]1[", "n[2-1]", "n[a-b]", "n[[1]]", "n[0-999999]"])
def test_hostlist_refused(bad: str) -> None:
    with pytest.raises(SlurmFormatError):
        expand_hostlist(bad)


@pytest.mark.parametrize(
    ("state", "status"),
    [
        ("PENDING", ExecutionStatus.PENDING),
        ("CONFIGURING", ExecutionStatus.STARTING),
        ("RUNNING", ExecutionStatus.RUNNING),
        ("COMPLETING", ExecutionStatus.RUNNING),
        ("COMPLETED", ExecutionStatus.COMPLETED),
        ("FAILED", ExecutionStatus.FAILED),
        ("TIMEOUT", ExecutionStatus.FAILED),
        ("OUT_OF_MEMORY", ExecutionStatus.FAILED),
        ("CANCELLED", ExecutionStatus.CANCELLED),
        ("PREEMPTED", ExecutionStatus.ABORTED),
        ("NODE_FAIL", ExecutionStatus.SYSTEM_FAILURE),
        ("BOOT_FAIL", ExecutionStatus.SYSTEM_FAILURE),
    ],
)
def test_states(state: str, status: ExecutionStatus) -> None:
    assert job_status(state) is status


# -- records ------------------------------------------------------------------------------------------


def test_v38_running_job() -> None:
    job = parse_job(v38())
    assert job.nodes == ("n1", "n2")
    assert job.gpus_by_node == {"n1": ("0", "1"), "n2": ("2", "3")}
    assert (job.user, job.account, job.partition, job.gpu_type, job.cluster) == (
        "alice",
        "physics",
        "gpu",
        "a100",
        "hpc",
    )
    assert job.status is ExecutionStatus.RUNNING
    assert job.end_ms is None  # v0.0.38's end of a running job is start + limit
    assert job.return_code is None


def test_v38_exit_status_is_a_wait_status() -> None:
    failed = parse_job(v38(job_state="FAILED", exit_code=3 << 8, gres_detail=[]))
    assert (failed.return_code, failed.signal) == (3, None)
    killed = parse_job(v38(job_state="CANCELLED", exit_code=9, gres_detail=[]))
    assert (killed.return_code, killed.signal) == (None, 9)


def test_v40_shapes() -> None:
    record = v38(
        job_state=["FAILED"],
        exit_code={"status": ["EXITED"], "return_code": {"set": True, "infinite": False, "number": 2}},
        start_time={"set": True, "infinite": False, "number": 1_796_000_010},
        end_time={"set": True, "infinite": False, "number": 1_796_000_100},
        submit_time={"set": True, "infinite": False, "number": 1_796_000_000},
        array_job_id={"set": True, "infinite": False, "number": 0},
        array_task_id={"set": False, "infinite": False, "number": 0},
        het_job_id={"set": True, "infinite": False, "number": 0},
        job_resources={"nodes": {"allocation": [{"name": "n1"}, {"name": "n2"}]}},
    )
    job = parse_job(record)
    assert job.status is ExecutionStatus.FAILED
    assert job.return_code == 2
    assert (job.start_ms, job.end_ms) == (1_796_000_010_000, 1_796_000_100_000)
    assert job.array_job_id is None and job.het_job_id is None
    assert job.nodes == ("n1", "n2")


def test_sacct_shape() -> None:
    record = {
        "job_id": 40,
        "name": "eval",
        "user": "bob",
        "account": "bio",
        "partition": "gpu",
        "cluster": "hpc",
        "nodes": "n3",
        "state": {"current": "COMPLETED", "reason": "None"},
        "exit_code": {"status": "SUCCESS", "return_code": 0},
        "time": {"submission": 1_796_000_000, "start": 1_796_000_001, "end": 1_796_000_300},
        "array": {"job_id": 0, "task_id": None},
        "het": {"job_id": 0, "job_offset": None},
        "tres": {"allocated": [{"type": "gres", "name": "gpu:h100", "count": 1}]},
    }
    job = parse_job(record)
    assert (job.user, job.account, job.nodes, job.state, job.return_code) == (
        "bob",
        "bio",
        ("n3",),
        "COMPLETED",
        0,
    )
    assert job.wants_gpus and job.gpu_type == "h100" and not job.gpus_by_node
    assert job.end_ms == 1_796_000_300_000


def test_unreadable_records_are_named_not_fatal() -> None:
    jobs, bad = parse_jobs(
        {"jobs": [v38(), {"job_id": "x"}, "nope", v38(job_id=13, nodes="n[1-", job_resources=None)]}
    )
    assert [j.job_id for j in jobs] == [12]
    assert len(bad) == 3
    with pytest.raises(SlurmFormatError):
        parse_jobs({"errors": []})


def test_merge_keeps_indices_from_the_live_record() -> None:
    ended = parse_job(v38(job_state="COMPLETED", gres_detail=[], end_time=1_796_000_500))
    running = parse_job(v38())
    (merged,) = merge_jobs([running], [ended])
    assert merged.status is ExecutionStatus.COMPLETED
    assert merged.gpus_by_node == {"n1": ("0", "1"), "n2": ("2", "3")}


# -- planning -----------------------------------------------------------------------------------------


def test_one_execution_per_node_and_one_workload_per_job() -> None:
    plan = plan_registrations([parse_job(v38())], org="acme", cluster="ignored", now=NOW)
    assert [(e.hostname, e.gpus) for e in plan.executions] == [("n1", ("0", "1")), ("n2", ("2", "3"))]
    first = plan.executions[0]
    assert first.execution_id == execution_uuid("hpc", 12, "n1")
    assert (first.user, first.project, first.hardware_profile, first.status) == (
        "alice",
        "physics",
        "a100",
        ExecutionStatus.RUNNING,
    )
    assert first.start_time == datetime.fromtimestamp(1_796_000_010, UTC) and first.end_time is None
    ((workload, pods),) = plan.workloads
    assert workload.workload_id == workload_uuid("hpc", 12)
    assert workload.project == "physics" and workload.name == "slurm-12 train"
    assert [(p.pod_id, p.node, p.gpus, p.namespace, p.name) for p in pods] == [
        (execution_uuid("hpc", 12, "n1"), "n1", ("0", "1"), "slurm-hpc", "job-12-n1"),
        (execution_uuid("hpc", 12, "n2"), "n2", ("2", "3"), "slurm-hpc", "job-12-n2"),
    ]
    assert all(p.phase is PodPhase.RUNNING for p in pods)
    assert plan.unknown_gpus == []


def test_ids_are_stable_and_distinct() -> None:
    # registered ids outlive releases: the id of (cluster, job, node) is this one, forever (a uuid5 in
    # SLURM_NAMESPACE, worked out once by hand), and deploy/slurm's hook computes it in the same namespace
    assert execution_uuid("hpc", 12, "n1") == "7af1a56d-4675-5a86-a84d-0d8a3a341116"
    hook = (Path(__file__).parents[2] / "deploy" / "slurm" / "gpulens-slurm-hook").read_text()
    assert re.search(r"^NAMESPACE=([0-9a-f-]+)", hook, re.MULTILINE)[1] == str(SLURM_NAMESPACE)  # type: ignore[index]
    assert (
        len(
            {
                execution_uuid("hpc", 12, "n1"),
                execution_uuid("hpc", 12, "n2"),
                execution_uuid("lab", 12, "n1"),
            }
        )
        == 3
    )


def test_array_tasks_are_jobs_of_their_own() -> None:
    tasks = [
        parse_job(
            v38(job_id=20 + k, array_job_id=20, array_task_id=k, nodes="n1", gres_detail=[f"gpu:1(IDX:{k})"])
        )
        for k in range(2)
    ]
    plan = plan_registrations(tasks, org="acme", cluster="x", now=NOW)
    assert [w.name for w, _ in plan.workloads] == ["slurm-20_0 train", "slurm-20_1 train"]
    assert [e.gpus for e in plan.executions] == [("0",), ("1",)]
    assert tasks[1].matches("20") and tasks[1].matches("20_1") and tasks[1].matches("21")
    assert not tasks[1].matches("20_0")


def test_heterogeneous_components_share_one_workload() -> None:
    parts = [
        parse_job(
            v38(job_id=30, het_job_id=30, het_job_offset=0, nodes="n1", gres_detail=["gpu:2(IDX:0-1)"])
        ),
        parse_job(v38(job_id=31, het_job_id=30, het_job_offset=1, nodes="n2", gres_detail=["gpu:1(IDX:3)"])),
    ]
    plan = plan_registrations(parts, org="acme", cluster="x", now=NOW)
    ((workload, pods),) = plan.workloads
    assert workload.workload_id == workload_uuid("hpc", 30)
    assert [(p.name, p.gpus) for p in pods] == [("job-30-0-n1", ("0", "1")), ("job-30-1-n2", ("3",))]
    assert parts[1].display_id == "30+1" and parts[1].matches("30")


def test_ended_job_states_and_codes() -> None:
    jobs = [
        parse_job(
            v38(job_id=40, job_state="FAILED", exit_code=3 << 8, gres_detail=[], end_time=1_796_000_100)
        ),
        parse_job(v38(job_id=41, job_state="TIMEOUT", exit_code=0, gres_detail=[], end_time=1_796_000_100)),
        parse_job(v38(job_id=42, job_state="COMPLETED", exit_code=0, gres_detail=[], end_time=1_796_000_100)),
    ]
    known = {(40, "n1"): ("5",)}
    plan = plan_registrations(jobs, org="acme", cluster="x", now=NOW, known_gpus=known)
    by_job = {e.execution_id: e for e in plan.executions}
    failed = by_job[execution_uuid("hpc", 40, "n1")]
    assert (failed.status, failed.return_code, failed.gpus) == (ExecutionStatus.FAILED, 3, ("5",))
    assert failed.end_time == datetime.fromtimestamp(1_796_000_100, UTC)
    timeout = by_job[execution_uuid("hpc", 41, "n1")]
    assert timeout.status is ExecutionStatus.FAILED and timeout.system_errors == ("slurm job state TIMEOUT",)
    assert by_job[execution_uuid("hpc", 42, "n2")].return_code == 0
    assert "job 40 on n2" in plan.unknown_gpus and "job 40 on n1" not in plan.unknown_gpus
    assert plan.workloads[0][1][0].phase is PodPhase.FAILED


def test_jobs_without_gpus_ignored_unless_asked() -> None:
    cpu = parse_job(v38(job_id=50, gres_detail=[], tres_per_node="", nodes="n1"))
    assert plan_registrations([cpu], org="acme", cluster="x", now=NOW).executions == []
    assert plan_registrations([cpu], org="acme", cluster="x", now=NOW).without_gpus == 1
    asked = plan_registrations([cpu], org="acme", cluster="x", now=NOW, include_cpu_jobs=True)
    assert [e.gpus for e in asked.executions] == [()]


def test_pending_jobs_wait_and_bad_fields_are_dropped() -> None:
    pending = parse_job(v38(job_id=60, job_state="PENDING", nodes="", gres_detail=[], job_resources=None))
    odd = parse_job(v38(job_id=61, user_name="-x", account="a b", nodes="n1", gres_detail=["gpu:1(IDX:0)"]))
    plan = plan_registrations([pending, odd], org="acme", cluster="x", now=NOW)
    (execution,) = plan.executions
    assert execution.user is None and execution.project is None
    assert len(plan.ignored) == 2


def test_pod_namespace_is_a_kubernetes_label() -> None:
    assert pod_namespace("HPC_Cluster.1") == "slurm-hpc-cluster-1"
    assert len(pod_namespace("x" * 200)) <= 63


def test_slurm_pods_target_their_host_gpus() -> None:
    """Run:ai reads of a Slurm job's pods select DCGM series by host and GPU index (no pod labels)."""
    from gpulens.domain import catalog as c
    from gpulens.planning.pods import PodPlanOptions, plan_pod_metric, pod_target, sample_grid

    plan = plan_registrations([parse_job(v38())], org="acme", cluster="x", now=NOW)
    ((_, pods),) = plan.workloads
    target = pod_target(pods)
    assert target.hosts == (("n1", ("0", "1")), ("n2", ("2", "3")))
    metric = c.WORKLOAD_METRICS_BY_TYPE["GPU_UTILIZATION"]
    grid = sample_grid(1_796_000_000_000, 1_796_000_060_000, 4)
    (query,) = plan_pod_metric(metric, target, grid, grid.step_ms, PodPlanOptions())
    assert 'Hostname="n1",gpu=~"0|1"' in query.expr and 'Hostname="n2",gpu=~"2|3"' in query.expr
    assert 'hostname="n1",gpu=~"0|1"' in query.expr  # the other spelling of the host label
    k8s = replace(pods[0], namespace="team-a")
    assert pod_target([k8s]).hosts == ()  # pods of other namespaces: by their pod labels only
    # GPULENS_DCGM_HOST_LABEL names the host label: only it is asked, for the pods and their archive
    (query,) = plan_pod_metric(metric, target, grid, grid.step_ms, PodPlanOptions(host_labels=("node",)))
    assert 'node="n1",gpu=~"0|1"' in query.expr and "ostname" not in query.expr
    from gpulens.planning.archive import pod_selections

    (p0, *_) = pods
    chosen = pod_selections(p0.namespace, p0.name, {}, p0.node, p0.gpus, host_labels=("node",))
    hosts = [s for s in chosen if any(m.label == "node" for m in s.matchers)]
    assert hosts and not any(m.label in ("Hostname", "hostname") for s in chosen for m in s.matchers)
