"""The live alerts' tail read (SummaryService.live_findings) reads only what the detectors read and
finds what the summary finds on the same window: every demo execution, whole and in tails."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from gpulens import demo
from gpulens.api.app import build_context
from gpulens.cli.common import CLI_ADMIN
from gpulens.domain.models import RangeQuery, Series
from gpulens.domain.timeparse import datetime_to_ms
from gpulens.service.summary import SummaryService
from gpulens.shaping.findings_core import Finding


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[demo.DemoEnv]:
    with demo.prepare(Path(tmp_path_factory.mktemp("live")) / "demo") as prepared:
        yield prepared


def shown(found: list[Finding]) -> list[tuple[object, ...]]:
    return sorted((f.kind, f.start_ms, f.end_ms, f.gpus, f.message, str(f.evidence)) for f in found)


@pytest.mark.parametrize("name", ["healthy", "throttled", "oom", "input-bound", "cpu-only"])
def test_live_findings_are_the_summarys_on_the_same_window(env: demo.DemoEnv, name: str) -> None:
    backend = env.backend()
    asked: list[str] = []
    inner = backend.query_range

    async def counting(query: RangeQuery) -> list[Series]:
        asked.append(query.expr)
        return await inner(query)

    backend.query_range = counting  # type: ignore[method-assign]
    ctx = build_context(env.settings(), env.registry, backend)
    service = SummaryService(ctx.metrics)
    e = env.execution(name).execution
    assert e.start_time is not None and e.end_time is not None
    start, end = datetime_to_ms(e.start_time), datetime_to_ms(e.end_time)
    for lo in (start, max(start, end - 40 * 60_000)):  # the whole run, and a 40-minute tail

        async def both(lo: int = lo) -> tuple[list[Finding], list[Finding], int, int]:
            asked.clear()
            whole = await service.summary(CLI_ADMIN, e.execution_id, lo, end)
            n_summary = len(asked)
            asked.clear()
            live = await service.live_findings(CLI_ADMIN, e.execution_id, lo, end)
            return whole.findings, live.findings, n_summary, len(asked)

        whole, live, n_summary, n_live = anyio.run(both)
        assert shown(live) == shown(whole)
        assert n_live < n_summary  # fewer series read


def test_a_pass_on_the_embedded_store_fires_the_rule_of_what_it_finds(tmp_path: Path) -> None:
    """The embedded default (`gpulens serve` with nothing else installed): the demo's healthy run, whose
    GPUs sit idle with memory held for its last 5 minutes, made running at its last sample, and an
    idle_held rule of 3 minutes; one pass stores one firing with the finding's evidence and a pending
    delivery."""
    from datetime import timedelta

    from gpulens.domain.alerts import AlertRule, Channel, ChannelType
    from gpulens.domain.models import ExecutionStatus
    from gpulens.service.alerts.evaluate import EvalOptions, Evaluator
    from gpulens.service.live_tails import LiveTails
    from gpulens.storage.alerts import AlertStore

    with demo.prepare(tmp_path / "demo") as env:
        e = env.execution("healthy").execution
        assert e.end_time is not None
        now = e.end_time
        env.registry.update_execution(e.execution_id, {"status": ExecutionStatus.RUNNING, "end_time": None})
        ctx = build_context(env.settings(), env.registry, env.backend(), clock=lambda: now)
        store = AlertStore(env.registry)
        store.add_channel(Channel("chn_1", e.org, ChannelType.WEBHOOK, "http://127.0.0.1:9/h", None, now))
        store.add_rule(AlertRule("rul_1", e.org, "idle_held", 3 * 60_000, ("chn_1",), created_at=now))
        tails = LiveTails(ctx.summaries.summaries)
        evaluator = Evaluator(store, env.registry, tails, lambda: now, EvalOptions())
        report = anyio.run(evaluator.run_once)
        assert (report.executions, report.events, report.errors) == (1, 1, 0)
        (delivery,) = store.deliveries(e.org)
        event = store.get_event(delivery.event_id)
        assert event is not None and event.payload["finding"]["kind"] == "idle_held"
        assert event.payload["finding"]["evidence"] and event.payload["execution"]["id"] == e.execution_id
        later = now + timedelta(minutes=1)
        evaluator.clock = lambda: later
        assert anyio.run(evaluator.run_once).events == 0  # the same episode: nothing new
