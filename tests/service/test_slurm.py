"""Slurm discovery's service: version negotiation, the token's user, slurmrestd over a mock
transport, the squeue/sacct source with a fake runner, and the sync (idempotent, never clearing
GPU indices a pass stored while the job ran)."""

from __future__ import annotations

import base64
import json
import subprocess
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import anyio
import httpx
import pytest

from gpulens.domain.errors import InvalidRequest
from gpulens.domain.models import ExecutionStatus
from gpulens.planning.slurm import execution_uuid, workload_uuid
from gpulens.service.slurm import (
    KNOWN_VERSIONS,
    SlurmCliSource,
    SlurmError,
    SlurmRestSource,
    choose_version,
    discover_slurm,
    token_user,
)
from gpulens.storage.registry import Registry

NOW = datetime(2026, 12, 2, 8, 0, tzinfo=UTC)
NOW_S = int(NOW.timestamp())


def jwt(claims: dict[str, Any]) -> str:
    def part(obj: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(obj).encode()).decode().rstrip("=")

    return f"{part({'alg': 'HS256'})}.{part(claims)}.sig"


def running(job_id: int = 7, **over: Any) -> dict[str, Any]:
    job: dict[str, Any] = {
        "job_id": job_id,
        "name": "train",
        "job_state": "RUNNING",
        "user_name": "alice",
        "account": "physics",
        "partition": "gpu",
        "cluster": "hpc",
        "nodes": "n1",
        "gres_detail": ["gpu:h100:2(IDX:2-3)"],
        "tres_per_node": "gres:gpu:2",
        "exit_code": 0,
        "submit_time": NOW_S - 100,
        "start_time": NOW_S - 90,
        "end_time": NOW_S + 10_000,
    }
    job.update(over)
    return job


def ended(job_id: int = 7, **over: Any) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "job_state": "FAILED",
        "exit_code": 4 << 8,
        "gres_detail": [],
        "end_time": NOW_S - 5,
    }
    return running(job_id, **{**fields, **over})


# -- negotiation and token ------------------------------------------------------------------------------


def test_choose_version_takes_the_newest_known() -> None:
    paths = [
        "/slurm/v0.0.38/jobs",
        "/slurm/v0.0.40/jobs",
        "/slurm/v0.0.40/job/{job_id}",
        "/slurmdb/v0.0.40/jobs",
    ]
    assert choose_version(paths) == "v0.0.40"
    assert choose_version(["/slurm/v0.0.38/jobs", "/slurm/v0.0.99/jobs"]) == "v0.0.38"


def test_unknown_version_names_the_known_ones() -> None:
    with pytest.raises(SlurmError) as err:
        choose_version(["/slurm/v0.0.37/jobs", "/slurm/v0.0.36/jobs"])
    assert "v0.0.37" in err.value.message and all(v in err.value.message for v in KNOWN_VERSIONS)
    with pytest.raises(SlurmError, match="lists no"):
        choose_version(["/openapi"])


def test_token_user() -> None:
    assert token_user(jwt({"sun": "gpulens", "exp": 1})) == "gpulens"
    assert token_user(jwt({"exp": 1})) is None
    assert token_user("not-a-jwt") is None
    assert token_user("a.!!!.c") is None


def test_rest_source_needs_a_user() -> None:
    with pytest.raises(SlurmError, match="GPULENS_SLURM_USER"):
        SlurmRestSource("http://x", jwt({"exp": 1}))
    with pytest.raises(SlurmError, match="token"):
        SlurmRestSource("http://x", "  ")
    assert SlurmRestSource("http://x", jwt({"exp": 1}), user="root").user == "root"
    with pytest.raises(SlurmError, match="not a Slurm user"):
        SlurmRestSource("http://x", jwt({"exp": 1}), user="root\r\nX-Evil: 1")
    with pytest.raises(SlurmError, match="not a JWT"):
        SlurmRestSource("http://x", "abc def", user="root")


# -- slurmrestd over a mock transport --------------------------------------------------------------------


def rest(
    versions: Sequence[str] = ("v0.0.38",), jobs: list[dict[str, Any]] | None = None, status: int = 200
) -> tuple[httpx.MockTransport, list[httpx.Request]]:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if status != 200:
            return httpx.Response(status, text="Authentication failure")
        if request.url.path == "/openapi/v3":
            return httpx.Response(200, json={"paths": {f"/slurm/{v}/jobs": {} for v in versions}})
        if request.url.path.endswith("/jobs"):
            return httpx.Response(200, json={"meta": {}, "errors": [], "jobs": jobs or []})
        return httpx.Response(404)

    return httpx.MockTransport(handler), seen


def test_rest_source_negotiates_and_sends_both_headers() -> None:
    transport, seen = rest(("v0.0.38", "v0.0.39"), [running()])
    source = SlurmRestSource("http://slurm:6820", jwt({"sun": "gpulens"}), transport=transport)

    async def go() -> Any:
        try:
            return await source.jobs(0)
        finally:
            await source.aclose()

    jobs, bad = anyio.run(go)
    assert [j.job_id for j in jobs] == [7] and bad == []
    assert [r.url.path for r in seen] == ["/openapi/v3", "/slurm/v0.0.39/jobs"]
    assert seen[1].headers["X-SLURM-USER-NAME"] == "gpulens"
    assert seen[1].headers["X-SLURM-USER-TOKEN"].count(".") == 2


@pytest.mark.parametrize(("status", "words"), [(401, "refused the token"), (500, "answered 500")])
def test_rest_source_errors_are_clear(status: int, words: str) -> None:
    transport, _ = rest(status=status)
    source = SlurmRestSource("http://slurm:6820", jwt({"sun": "gpulens"}), transport=transport)
    with pytest.raises(SlurmError, match=words):
        anyio.run(source.jobs, 0)


def test_rest_source_unreachable() -> None:
    source = SlurmRestSource("http://127.0.0.1:9", jwt({"sun": "gpulens"}), timeout_s=2)
    with pytest.raises(SlurmError, match="unreachable"):
        anyio.run(source.jobs, 0)


def test_rest_source_unknown_version() -> None:
    transport, _ = rest(("v0.0.36",))
    source = SlurmRestSource("http://slurm:6820", jwt({"sun": "gpulens"}), transport=transport)
    with pytest.raises(SlurmError, match=r"v0\.0\.36"):
        anyio.run(source.jobs, 0)


# -- squeue/sacct -------------------------------------------------------------------------------------


def test_cli_source_merges_accounting_and_queue(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("shutil.which", lambda name: f"/usr/bin/{name}")
    calls: list[list[str]] = []

    def runner(argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
        calls.append(list(argv))
        if argv[0] == "sacct":
            accounted = {
                "job_id": 5,
                "user": "bob",
                "account": "bio",
                "nodes": "n2",
                "state": {"current": "COMPLETED"},
                "exit_code": {"status": "SUCCESS", "return_code": 0},
                "time": {"submission": NOW_S - 500, "start": NOW_S - 400, "end": NOW_S - 300},
                "tres": {"allocated": [{"type": "gres", "name": "gpu", "count": 1}]},
            }
            return subprocess.CompletedProcess(argv, 0, json.dumps({"jobs": [accounted]}), "")
        return subprocess.CompletedProcess(argv, 0, json.dumps({"jobs": [running()]}), "")

    jobs, _ = anyio.run(SlurmCliSource(runner=runner).jobs, (NOW_S - 3600) * 1000)
    assert [(j.job_id, j.user) for j in jobs] == [(5, "bob"), (7, "alice")]
    assert calls[0][:2] == ["sacct", "--json"] and calls[1][:2] == ["squeue", "--json"]


def test_cli_source_without_accounting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("shutil.which", lambda name: f"/usr/bin/{name}")

    def runner(argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
        if argv[0] == "sacct":
            return subprocess.CompletedProcess(argv, 1, "", "Slurm accounting storage is disabled")
        return subprocess.CompletedProcess(argv, 0, json.dumps({"jobs": [running()]}), "")

    source = SlurmCliSource(runner=runner)
    jobs, _ = anyio.run(source.jobs, 0)
    assert [j.job_id for j in jobs] == [7]
    assert "accounting storage is disabled" in source.notes[0]


def test_cli_source_squeue_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("shutil.which", lambda name: f"/usr/bin/{name}")

    def runner(argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess(argv, 1, "", "Unable to contact slurm controller")

    with pytest.raises(SlurmError, match="Unable to contact"):
        anyio.run(SlurmCliSource(runner=runner, sacct=None).jobs, 0)


# -- the sync ------------------------------------------------------------------------------------------


class Fixed:
    name = "fixed"

    def __init__(self, *records: dict[str, Any]) -> None:
        self.records = list(records)

    async def jobs(self, since_ms: int) -> Any:
        from gpulens.planning.slurm import parse_jobs

        return parse_jobs({"jobs": self.records})

    async def aclose(self) -> None:
        return None


def discover(registry: Registry, source: Fixed, **kw: Any) -> Any:
    return anyio.run(
        lambda: discover_slurm(source, registry, "acme", since_ms=(NOW_S - 86_400) * 1000, now=NOW, **kw)
    )


def test_sync_is_idempotent_and_keeps_indices_once_the_job_ended(registry: Registry) -> None:
    first = discover(registry, Fixed(running()))
    assert (first.counts.executions_created, first.counts.workloads_created) == (1, 1)
    again = discover(registry, Fixed(running()))
    assert (again.counts.executions_unchanged, again.counts.workloads_unchanged) == (1, 1)
    done = discover(registry, Fixed(ended()))
    assert done.counts.executions_updated == 1 and done.unknown_gpus == ()
    execution = registry.get_execution(execution_uuid("hpc", 7, "n1"))
    assert execution is not None
    assert (execution.status, execution.return_code, execution.gpus) == (
        ExecutionStatus.FAILED,
        4,
        ("2", "3"),
    )
    assert (execution.user, execution.project, execution.org) == ("alice", "physics", "acme")
    pod = registry.get_pod(execution_uuid("hpc", 7, "n1"))
    assert pod is not None and pod.gpus == ("2", "3") and pod.workload_id == workload_uuid("hpc", 7)
    assert discover(registry, Fixed(ended())).counts.executions_unchanged == 1


def test_a_job_first_seen_ended_is_registered_without_indices(registry: Registry) -> None:
    report = discover(registry, Fixed(ended(9)))
    assert report.counts.executions_created == 1
    assert report.unknown_gpus == (f"execution {execution_uuid('hpc', 9, 'n1')} on n1",)


def test_window_and_job_filter(registry: Registry) -> None:
    old = ended(3, end_time=NOW_S - 3 * 86_400)
    report = discover(registry, Fixed(old, running(4), running(5)), only=("4",))
    assert report.job_ids == ("4",)
    assert discover(registry, Fixed(old, running(4))).job_ids == ("4",)  # ended before the window


def test_bad_org_refused(registry: Registry) -> None:
    with pytest.raises(InvalidRequest):
        anyio.run(lambda: discover_slurm(Fixed(), registry, "Bad Org", since_ms=0, now=NOW))


class SeriesOnly:
    """A metrics backend that only answers series look-ups (what hpc_job_gpus asks)."""

    name = "fake"

    def __init__(self, series: list[dict[str, str]]) -> None:
        self.found = series
        self.matches: list[str] = []

    async def series(self, match: str, start_ms: int, end_ms: int) -> list[dict[str, str]]:
        self.matches.append(match)
        return self.found


def test_ended_jobs_get_their_gpus_from_hpc_job_series(registry: Registry) -> None:
    backend = SeriesOnly(
        [
            {"__name__": "DCGM_FI_DEV_GPU_UTIL", "Hostname": "n1", "gpu": "5", "hpc_job": "9"},
            {"__name__": "DCGM_FI_DEV_GPU_UTIL", "Hostname": "n1", "gpu": "6", "hpc_job": "9"},
            {"__name__": "DCGM_FI_DEV_GPU_UTIL", "Hostname": "n1", "gpu": "7", "hpc_job": "10"},
        ]
    )
    report = discover(registry, Fixed(ended(9)), backend=backend)
    assert report.unknown_gpus == ()
    assert backend.matches == ['{__name__=~"DCGM_FI_DEV_GPU_UTIL",hpc_job=~"9"}']
    execution = registry.get_execution(execution_uuid("hpc", 9, "n1"))
    assert execution is not None and execution.gpus == ("5", "6")


def test_cpu_jobs_when_asked_are_not_reported_without_gpus(registry: Registry) -> None:
    cpu = ended(11, gres_detail=[], tres_per_node="")
    assert discover(registry, Fixed(cpu)).jobs_registered == 0
    report = discover(registry, Fixed(cpu), include_cpu_jobs=True)
    assert report.counts.executions_created == 1 and report.unknown_gpus == ()


def test_the_serve_loop_reads_the_token_again_every_pass(registry: Registry) -> None:
    """A rotated token (GPULENS_SLURM_TOKEN_FILE) is used from the next pass on; the version is kept."""
    from gpulens.service.slurm import slurm_discovery_task

    transport, seen = rest(("v0.0.38",), [running()])
    tokens = [jwt({"sun": "gpulens", "n": n}) for n in range(3)]
    made: list[SlurmRestSource] = []

    def make() -> SlurmRestSource:
        made.append(SlurmRestSource("http://slurm:6820", tokens[min(len(made), 2)], transport=transport))
        return made[-1]

    async def three_passes() -> None:
        reports: list[Any] = []
        async with anyio.create_task_group() as tg:

            def seen_report(report: Any) -> None:
                reports.append(report)
                if len(reports) == 3:
                    tg.cancel_scope.cancel()

            tg.start_soon(
                lambda: slurm_discovery_task(make, registry, "acme", interval_s=0, on_report=seen_report)
            )

    anyio.run(three_passes)
    sent = [r.headers["X-SLURM-USER-TOKEN"] for r in seen if r.url.path.endswith("/jobs")]
    assert sent == tokens
    assert [r.url.path for r in seen].count("/openapi/v3") == 1  # negotiated once
