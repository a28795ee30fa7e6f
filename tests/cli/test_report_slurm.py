"""`gpulens report --slurm JOBID`: its argument checks and the registry look-up (the reports
themselves against a real Slurm and Prometheus: tests/integration/test_slurm_metrics.py)."""

from __future__ import annotations

from datetime import UTC, datetime

import anyio
import httpx
import orjson

from gpulens.cli.main import app
from gpulens.cli.report import slurm_executions
from gpulens.domain.alerts import Channel, ChannelType, EventType, new_webhook_secret
from gpulens.planning.slurm import parse_job, plan_registrations
from gpulens.service.alerts.deliver import Deliverer
from gpulens.storage.alerts import AlertStore
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


def test_notify_queues_one_report_for_the_owner(db: str) -> None:
    """`report --slurm JOBID --notify` (the job-end hook): one `execution.report` event with a pending
    delivery to the owner's per-user channel and each --channel; `serve` delivers them. The job's
    executions are found as the hooks registered them (`--nodes`, no discovery)."""
    registry = Registry.from_url(db)
    try:
        registry.migrate()
        registry.ensure_org("acme")
        record = {
            "job_id": 12,
            "name": "train",
            "job_state": "COMPLETED",
            "exit_code": 0,
            "user_name": "alice",
            "account": "vision",
            "cluster": "hpc",
            "nodes": "n[1-2]",
            "gres_detail": ["gpu:2(IDX:0-1)", "gpu:2(IDX:0-1)"],
            "start_time": 1_796_000_000,
            "end_time": 1_796_003_600,
        }
        plan = plan_registrations([parse_job(record)], org="acme", cluster="hpc", now=datetime.now(UTC))
        for execution in plan.executions:  # as deploy/slurm's hooks register them: no workload, no pod
            registry.upsert_execution(execution)
        store = AlertStore(registry)
        now = datetime.now(UTC)
        mine = store.add_channel(
            Channel(
                "chn_mine",
                "acme",
                ChannelType.WEBHOOK,
                "https://h.example/u/{user}",
                new_webhook_secret(),
                now,
            )
        )
        team = store.add_channel(
            Channel(
                "chn_team", "acme", ChannelType.WEBHOOK, "https://h.example/team", new_webhook_secret(), now
            )
        )
        assert "goes with --notify" in one_line_error(
            invoke(app, "report", "--slurm", "12", "--channel", "x"), 2
        )
        assert "no registered executions" in one_line_error(invoke(app, "report", "--slurm", "12", "--json"))
        assert "goes with --slurm" in one_line_error(
            invoke(app, "report", "--slurm", "12", "--nodes", "n1"), 2
        )
        # the EpilogSlurmctld line (docs/operations.md): the hooks' ids from cluster, job and hostlist
        args = ["--slurm", "12", "--cluster", "hpc", "--nodes", "n[1-2]", "--json"]
        missing = invoke(app, "report", *args, "--notify", "--channel", "chn_nope")
        assert "no channel chn_nope" in missing.stderr and missing.exit_code == 2
        result = invoke(app, "report", *args, "--notify", "--channel", team.channel_id)
        assert result.exit_code == 0, result.stderr
        assert "queued for alice to chn_mine, chn_team" in result.stderr
        pending = store.deliveries("acme")
        assert sorted(d.channel_id for d in pending) == [mine.channel_id, team.channel_id]
        event = store.get_event(pending[0].event_id)
        assert event is not None and event.type is EventType.JOB_REPORT
        assert event.payload["user"] == "alice" and event.payload["job"] == {"cluster": "hpc", "id": "12"}
        assert [p["node"] for p in event.payload["executions"]] == ["n1", "n2"]
        assert event.payload["totals"]["gpuHours"] == 4.0  # 2 nodes x 2 GPUs x 1 h
        # serve's deliverer sends it: the webhook at the owner's address gets the event, signed
        got: list[httpx.Request] = []

        def receive(request: httpx.Request) -> httpx.Response:
            got.append(request)
            return httpx.Response(200)

        async def deliver() -> int:
            async with Deliverer(store, transport=httpx.MockTransport(receive)) as deliverer:
                return await deliverer.run_once()

        anyio.run(deliver)
        hooks = [r for r in got if r.url.host == "h.example" and r.url.path == "/u/alice"]
        assert len(hooks) == 1 and "webhook-signature" in hooks[0].headers
        assert [r.url.path for r in got if r.url.path == "/team"] == ["/team"]  # and the channel named
        assert orjson.loads(hooks[0].content)["type"] == "execution.report"
    finally:
        registry.dispose()
