"""Stored summaries (service/summary_store.py): computed once for a finished execution and served from
the registry while its key holds; recomputed when the registration, the price or the settings change;
not stored before the grace; shared by concurrent requests; bounded; the background pass and the
list's rows."""

from __future__ import annotations

import asyncio
import itertools
import math
from datetime import timedelta
from pathlib import Path
from typing import Any

import orjson
import pytest

from gpulens.domain.errors import NotFound, Overloaded
from gpulens.domain.models import ExecutionStatus, Principal
from gpulens.domain.timeparse import datetime_to_ms
from gpulens.service.summary import SummaryService
from gpulens.service.summary_store import row_figures
from gpulens.shaping.findings_core import MS_PER_HOUR
from gpulens.shaping.insights import Finding
from gpulens.shaping.usage import Cost
from gpulens.storage.summaries import SummaryStore
from tests.service.summary_env import (
    DONE,
    END,
    RUNNING,
    START,
    Env,
    build,
    env_fixture,  # noqa: F401 - the `env` fixture
    execution,
)

ACME = Principal(org="acme", subject="alice")
BETA = Principal(org="beta", subject="bob")


class Counting:
    """Counts the summaries `service` computes (SummaryService.summary calls)."""

    def __init__(self, service: SummaryService, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: list[tuple[str, int | None, int | None]] = []
        original = service.summary

        async def summary(
            principal: Principal, execution_id: str, start_ms: int | None, end_ms: int | None, **kw: Any
        ) -> Any:
            self.calls.append((execution_id, start_ms, end_ms))
            return await original(principal, execution_id, start_ms, end_ms, **kw)

        monkeypatch.setattr(service, "summary", summary)


def summary_store(env: Env) -> SummaryStore:
    return env.stored.store


async def test_a_finished_summary_is_computed_once_then_served_as_stored(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    stored = env.stored
    count = Counting(stored.summaries, monkeypatch)
    first = await stored.body(ACME, DONE, None, None)
    second = await stored.body(ACME, DONE, None, None)
    assert first == second
    assert len(count.calls) == 1 and (stored.misses, stored.hits) == (1, 1)
    doc = orjson.loads(first)
    assert doc["executionId"] == DONE and doc["stats"]["gpuUtilizationPercent"]["samples"] > 0
    info = summary_store(env).get(DONE)
    assert info is not None and info.org == "acme" and info.byte_count == len(first)
    # the row's figures are the body's (what the list shows is what the summary says)
    kinds = {f["kind"] for f in doc["findings"]}
    assert info.row["meanGpuUtilizationPercent"] == doc["stats"]["gpuUtilizationPercent"]["mean"]
    assert {k["kind"]: k["count"] for k in info.row["findings"]} == {
        k: sum(f["kind"] == k for f in doc["findings"]) for k in kinds
    }
    assert info.row["cost"] == {"total": doc["cost"]["total"], "currency": "USD"}


async def test_a_stored_summary_keeps_its_receipt_by_hour(env: Env) -> None:
    """The hourly slices stored with a summary add up to its receipt (GPU-hours by line, cost) and
    tile its window (docs/usage.md)."""
    stored = env.stored
    doc = orjson.loads(await stored.body(ACME, DONE, None, None))
    slices = summary_store(env).slices(DONE)
    assert slices and slices[0].start_ms == datetime_to_ms(START) and slices[-1].end_ms == datetime_to_ms(END)
    assert all(a.end_ms == b.start_ms for a, b in itertools.pairwise(slices))
    summary = await stored.summaries.summary(ACME, DONE, None, None, slices=True)
    time = summary.gpu_time
    assert time is not None and summary.slices == slices
    assert (await stored.summaries.summary(ACME, DONE, None, None)).slices == []  # a request's: not cut
    assert sum(s.gpu_ms for s in slices) / MS_PER_HOUR == time.total
    assert sum(s.idle_ms for s in slices) / MS_PER_HOUR == time.idle
    assert sum(s.idle_held_ms for s in slices) / MS_PER_HOUR == time.idle_held
    assert sum(s.input_bound_ms for s in slices) / MS_PER_HOUR == time.input_bound
    assert sum(s.throttled_ms for s in slices) / MS_PER_HOUR == time.throttled
    costs = [s.cost for s in slices]
    assert all(c is not None for c in costs)
    assert math.isclose(math.fsum(c for c in costs if c is not None), doc["cost"]["total"], rel_tol=1e-9)


async def test_the_stored_body_is_what_the_same_window_computes(env: Env) -> None:
    """The stored whole life equals a computed summary of the same window (explicit bounds are never
    served from the store)."""
    stored = env.stored
    whole = await stored.body(ACME, DONE, None, None)
    again = await stored.body(ACME, DONE, datetime_to_ms(START), datetime_to_ms(END))
    assert orjson.loads(whole) == orjson.loads(again)
    assert whole == again


async def test_a_changed_registration_is_recomputed_an_unrelated_field_is_not(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    stored = env.stored
    count = Counting(stored.summaries, monkeypatch)
    await stored.body(ACME, DONE, None, None)
    env.registry.update_execution(DONE, {"file_name": "train.py"}, now=END + timedelta(minutes=30))
    await stored.body(ACME, DONE, None, None)
    assert len(count.calls) == 1  # the file name is not what a summary is made of
    for change in (
        {"end_time": END - timedelta(minutes=10)},
        {"gpus": ("0",)},
        {"status": ExecutionStatus.FAILED},
        {"hardware_profile": "gpu.a100"},
        {"start_time": START + timedelta(minutes=1)},
    ):
        env.registry.update_execution(DONE, change, now=END + timedelta(minutes=40))
        body = orjson.loads(await stored.body(ACME, DONE, None, None))
        calls = len(count.calls)
        assert orjson.loads(await stored.body(ACME, DONE, None, None)) == body  # then stored again
        assert len(count.calls) == calls
    assert len(count.calls) == 6
    assert body["gpus"] == ["0"] and body["cost"]["gpuHourPrice"] == 1.5  # the last registration's


async def test_a_changed_price_is_recomputed_another_profiles_is_not(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    stored = env.stored
    count = Counting(stored.summaries, monkeypatch)
    before = orjson.loads(await stored.body(ACME, DONE, None, None))
    env.prices.write_text('currency = "USD"\n[gpu_hour]\n"gpu.h100" = 2.5\n"gpu.a100" = 9.0\n')
    bump_mtime(env.prices)
    assert orjson.loads(await stored.body(ACME, DONE, None, None)) == before
    assert len(count.calls) == 1
    env.prices.write_text('currency = "EUR"\n[gpu_hour]\n"gpu.h100" = 3.0\n')
    bump_mtime(env.prices)
    after = orjson.loads(await stored.body(ACME, DONE, None, None))
    assert len(count.calls) == 2
    assert (after["cost"]["currency"], after["cost"]["gpuHourPrice"]) == ("EUR", 3.0)
    assert after["cost"]["total"] == pytest.approx(before["cost"]["total"] * 3.0 / 2.5)


def bump_mtime(path: Path) -> None:
    """A file rewritten within the clock's resolution: move its mtime so its reader sees the change."""
    import os

    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))


async def test_a_summary_is_stored_only_once_the_execution_ended_grace_ago(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    stored = env.stored
    count = Counting(stored.summaries, monkeypatch)
    env.now[0] = END + timedelta(minutes=2)  # late samples may still come (grace: 5 min)
    await stored.body(ACME, DONE, None, None)
    await stored.body(ACME, DONE, None, None)
    assert len(count.calls) == 2 and summary_store(env).get(DONE) is None
    env.now[0] = END + timedelta(minutes=6)
    await stored.body(ACME, DONE, None, None)
    await stored.body(ACME, DONE, None, None)
    assert len(count.calls) == 3 and summary_store(env).get(DONE) is not None


async def test_running_executions_and_windows_are_computed_every_time(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    stored = env.stored
    count = Counting(stored.summaries, monkeypatch)
    for _ in range(2):
        await stored.body(ACME, RUNNING, None, None)
        await stored.body(ACME, DONE, datetime_to_ms(START), datetime_to_ms(START + timedelta(minutes=30)))
    assert len(count.calls) == 4
    assert summary_store(env).get(RUNNING) is None and summary_store(env).get(DONE) is None


async def test_tenants_are_checked_before_anything_stored_is_read(env: Env) -> None:
    stored = env.stored
    await stored.body(ACME, DONE, None, None)
    for who, execution_id in ((BETA, DONE), (ACME, "nobody"), (BETA, "nobody")):
        with pytest.raises(NotFound) as caught:
            await stored.body(who, execution_id, None, None)
        assert caught.value.message == "Execution not found"


async def test_concurrent_requests_share_one_computation(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    stored = env.stored
    count = Counting(stored.summaries, monkeypatch)
    bodies = await asyncio.gather(*(stored.body(ACME, DONE, None, None) for _ in range(4)))
    assert len(set(bodies)) == 1 and len(count.calls) == 1


async def test_a_shared_computation_outlives_a_waiter_that_leaves(env: Env) -> None:
    stored, backend = env.stored, env.backend
    backend.held = True
    leaving = asyncio.ensure_future(stored.body(ACME, DONE, None, None))
    staying = asyncio.ensure_future(stored.body(ACME, DONE, None, None))
    _, asked = backend._events()
    await asyncio.wait_for(asked.wait(), 10)
    leaving.cancel()
    await asyncio.gather(leaving, return_exceptions=True)
    backend.release()
    body = await asyncio.wait_for(staying, 30)
    assert orjson.loads(body)["executionId"] == DONE and backend.cancelled == 0
    assert summary_store(env).get(DONE) is not None


async def test_the_last_waiter_leaving_cancels_the_work(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    stored, backend = env.stored, env.backend
    computed: list[str] = []
    monkeypatch.setattr(stored.summaries, "_compute", lambda *a: computed.append("x"))
    backend.held = True
    one = asyncio.ensure_future(stored.body(ACME, DONE, None, None))
    _, asked = backend._events()
    await asyncio.wait_for(asked.wait(), 10)
    one.cancel()
    await asyncio.gather(one, return_exceptions=True)
    await asyncio.sleep(0.1)
    assert backend.cancelled >= 1 and computed == []
    state = stored._state()
    assert state.flights == {} and state.computing == 0
    backend.release()


async def test_at_most_concurrency_compute_a_request_waits_then_is_refused(tmp_path: Path) -> None:
    env = build(tmp_path, concurrency=1, wait_s=2.0)
    try:
        stored, backend = env.stored, env.backend
        backend.held = True
        first = asyncio.ensure_future(stored.body(ACME, RUNNING, None, None))
        _, asked = backend._events()
        await asyncio.wait_for(asked.wait(), 10)
        assert stored._state().computing == 1
        with pytest.raises(Overloaded):  # the one slot stays busy past the wait
            await stored.body(ACME, DONE, None, None)
        second = asyncio.ensure_future(stored.body(ACME, DONE, None, None))
        await asyncio.sleep(0.05)
        assert stored._state().waiting == 1
        backend.release()
        assert orjson.loads(await first)["executionId"] == RUNNING
        assert orjson.loads(await second)["executionId"] == DONE  # it got the slot within the wait
        assert stored._state().computing == 0 and stored._state().waiting == 0
    finally:
        env.close()


async def test_the_list_rows(env: Env) -> None:
    stored = env.stored
    env.registry.upsert_execution(execution("no-host", hostname=None), now=END)
    env.registry.upsert_execution(execution("beta-1", org="beta"), now=END)
    env.registry.upsert_execution(execution("nlp-1", project="nlp"), now=END)
    ids = [DONE, RUNNING, "no-host", "beta-1", "nobody", "nlp-1", DONE]
    rows = await stored.rows(ACME, ids)
    assert [(r.execution_id, r.status) for r in rows] == [
        (DONE, "pending"),
        (RUNNING, "pending"),
        ("no-host", "unavailable"),
        ("nlp-1", "pending"),
    ]
    assert list(stored._queue) == [DONE, "nlp-1"]  # finished ones go to the background
    limited = Principal(org="acme", subject="v", projects=frozenset({"vision"}))
    assert [r.execution_id for r in await stored.rows(limited, ids)] == [DONE, RUNNING, "no-host"]
    assert [r.execution_id for r in await stored.rows(BETA, ids)] == ["beta-1"]
    report = await stored.run_pass()
    assert report.computed == 3 and not report.failed  # the two queued, then beta-1 (ended recently)
    rows = await stored.rows(ACME, [DONE, RUNNING])
    ready = rows[0]
    assert (ready.status, rows[1].status) == ("ready", "pending")
    doc = orjson.loads(await stored.body(ACME, DONE, None, None))
    assert ready.figures is not None
    assert ready.figures["meanGpuUtilizationPercent"] == doc["stats"]["gpuUtilizationPercent"]["mean"]
    assert ready.figures["cost"] == {"total": doc["cost"]["total"], "currency": "USD"}
    assert sum(f["count"] for f in ready.figures["findings"]) == len(doc["findings"])
    hours = sum(f["impact"]["gpuHours"] for f in doc["findings"])
    assert sum(f["gpuHours"] for f in ready.figures["findings"]) == pytest.approx(hours, abs=1e-5)
    assert stored.hits == 1 and stored.misses == 0  # the pass stored it: the route reads it


async def test_the_background_pass_records_rows_that_still_hold_and_skips_failures(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    stored = env.stored
    assert (await stored.run_pass()).computed == 1  # done-1 ended an hour ago (within the horizon)
    assert (await stored.run_pass()).computed == 0
    env.registry.update_execution(DONE, {"file_name": "x.py"}, now=env.now[0])
    report = await stored.run_pass()
    assert (report.computed, report.unchanged) == (0, 1)
    assert (await stored.run_pass()).unchanged == 0

    async def broken(*args: object, **kw: object) -> None:
        raise NotFound("No metrics available for this execution yet")

    later = env.now[0] + timedelta(seconds=1)
    env.registry.update_execution(DONE, {"end_time": END - timedelta(minutes=1)}, now=later)
    monkeypatch.setattr(stored.summaries, "summary", broken)
    report = await stored.run_pass()
    assert [i for i, _ in report.failed] == [DONE]
    assert (await stored.run_pass()).failed == []  # left alone for a while


async def test_the_background_yields_to_requests(env: Env) -> None:
    """A background computation starts only while no request computes or waits for a slot."""
    stored, backend = env.stored, env.backend
    backend.held = True
    request = asyncio.ensure_future(stored.body(ACME, RUNNING, None, None))
    _, asked = backend._events()
    await asyncio.wait_for(asked.wait(), 10)
    asked_before = backend.asked
    background = asyncio.ensure_future(stored.run_pass())
    await asyncio.sleep(0.5)
    assert backend.asked == asked_before  # the pass waits
    backend.release()
    await request
    assert (await asyncio.wait_for(background, 30)).computed == 1


def test_list_row_sums_each_kind_worst_first() -> None:
    def finding(kind: str, severity: str, hours: float) -> Finding:
        return Finding(kind, severity, 0, 0, (), "", {}, gpu_hours=hours)

    found = [
        finding("input_bound", "warning", 2.0),
        finding("idle", "warning", 0.5),
        finding("input_bound", "warning", 1.25),
        finding("idle", "critical", 0.25),
        finding("no_data", "info", 0.0),
        finding("memory_pressure", "info", 0.0),
    ]
    money = Cost("USD", 2.5, 5.0, 12.5, 10.0, 2.5, 0.0, 0.0, 0.0, 2.0, 6.25)
    assert row_figures(found, money, 41.5) == {
        "meanGpuUtilizationPercent": 41.5,
        "cost": {"total": 12.5, "currency": "USD"},
        "findings": [
            {"kind": "idle", "severity": "critical", "count": 2, "gpuHours": 0.75},
            {"kind": "input_bound", "severity": "warning", "count": 2, "gpuHours": 3.25},
            {"kind": "memory_pressure", "severity": "info", "count": 1, "gpuHours": 0.0},
            {"kind": "no_data", "severity": "info", "count": 1, "gpuHours": 0.0},
        ],
    }
    assert row_figures([], None, None) == {"meanGpuUtilizationPercent": None, "cost": None, "findings": []}
