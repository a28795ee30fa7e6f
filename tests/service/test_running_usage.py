"""The provisional usage of running executions (service/running_usage.py, docs/usage.md): a pass
slices each running execution up to now, the usage table counts it and says it runs, later passes
recompute only from the hour of the last slice, and the whole-life summary replaces it all once
the execution has finished."""

from __future__ import annotations

import asyncio
import math
from datetime import timedelta
from functools import partial

import anyio

from gpulens.domain.models import ExecutionStatus, Principal
from gpulens.domain.timeparse import datetime_to_ms
from gpulens.service.running_usage import RunningUsage
from tests.api.conftest import Client
from tests.service.summary_env import (
    RUNNING,
    START,
    Env,
    env_fixture,  # noqa: F401 - the `env` fixture
    execution,
)

H = 3_600_000


def running(env: Env) -> RunningUsage:
    return RunningUsage(env.stored, clock=lambda: env.now[0])


def test_a_running_execution_counts_up_to_the_last_pass(env: Env) -> None:
    env.registry.upsert_execution(
        execution("done-1", status=ExecutionStatus.RUNNING, end_time=None), now=START
    )
    env.now[0] = START + timedelta(minutes=35)
    report = anyio.run(running(env).run_pass)
    assert report.computed == 2 and not report.failed  # run-1 and done-1, both running now
    slices = env.stored.store.slices(RUNNING)
    assert slices and slices[-1].end_ms == datetime_to_ms(env.now[0])
    assert sum(s.gpu_ms for s in slices) == 2 * 35 * 60_000  # two GPUs for 35 minutes
    # the next pass, later: from the hour of the last slice, up to the new now
    env.now[0] = START + timedelta(minutes=80)
    anyio.run(running(env).run_pass)
    slices = env.stored.store.slices(RUNNING)
    assert sum(s.gpu_ms for s in slices) == 2 * 80 * 60_000
    whole = anyio.run(
        partial(env.stored.summaries.summary, slices=True),
        Principal(org="acme", subject="t", is_admin=True),
        RUNNING,
        None,
        datetime_to_ms(env.now[0]),
    )
    assert [(s.hour_ms, s.gpu_ms, s.idle_ms) for s in slices] == [
        (s.hour_ms, s.gpu_ms, s.idle_ms) for s in whole.slices
    ]
    for got, want in zip(slices, whole.slices, strict=True):
        assert math.isclose(got.useful_gpu_s, want.useful_gpu_s, rel_tol=1e-9, abs_tol=1e-9)


def test_the_table_marks_running_executions_and_the_summary_replaces_them(env: Env) -> None:
    env.now[0] = START + timedelta(minutes=50)
    anyio.run(running(env).run_pass)
    client = Client(env.app)
    headers = {"Authorization": f"Bearer {env.key}"}
    params = {"group_by": "hostname", "start": "2026-11-28T00:00:00Z", "end": "2026-11-29T00:00:00Z"}
    body = client.get("/api/v2/external/usage", params=params, headers=headers).json()
    (row,) = body["rows"]
    assert row["executions"] == 1 and row["runningExecutions"] == 1  # done-1 has no stored summary yet
    assert math.isclose(row["gpuHours"], 2 * 50 / 60)  # two GPUs for the 50 minutes up to now
    csv = client.get("/api/v2/external/usage", params={**params, "format": "csv"}, headers=headers).text
    assert csv.splitlines()[0].startswith("hostname,executions,runningExecutions,")
    # it finishes; its whole-life summary is stored and replaces the provisional slices
    end = START + timedelta(minutes=40)
    env.registry.upsert_execution(
        execution(RUNNING, status=ExecutionStatus.COMPLETED, end_time=end, hardware_profile=None), now=end
    )
    env.now[0] = START + timedelta(hours=2)
    r = client.get(f"/api/v2/external/execution/{RUNNING}/summary", headers=headers)
    assert r.status_code == 200
    assert sum(s.gpu_ms for s in env.stored.store.slices(RUNNING)) == 2 * 40 * 60_000
    assert not env.stored.store.put_running(RUNNING, "acme", datetime_to_ms(START), [])  # final now
    report = anyio.run(running(env).run_pass)
    assert report.computed == 0  # nothing runs
    (row,) = client.get("/api/v2/external/usage", params=params, headers=headers).json()["rows"]
    assert row["runningExecutions"] == 0 and math.isclose(row["gpuHours"], 2 * 40 / 60)


def test_the_pass_computes_in_a_summary_slot(env: Env) -> None:
    """Its summaries count in GPULENS_MAX_CONCURRENT_SUMMARIES like the requests' and the background's."""
    env.now[0] = START + timedelta(minutes=35)
    env.backend.held = True

    async def run() -> int:
        task = asyncio.create_task(running(env).run_pass())
        _, first_asked = env.backend._events()
        await asyncio.wait_for(first_asked.wait(), 10)
        computing = env.stored.figures().computing
        env.backend.release()
        report = await task
        assert report.computed == 1
        return computing

    assert anyio.run(run) == 1
