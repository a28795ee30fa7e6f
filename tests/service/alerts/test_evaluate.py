"""The evaluation pass: one firing per episode once it lasted `for`, one resolved when it ends, the
cool-down, warn-then-stop (snoozable, dry-run by default), and one replica at a time (the lease)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from gpulens.domain.alerts import AlertRule, Channel, ChannelType, EventType, StopAction
from gpulens.domain.catalog import INSIGHT_THRESHOLDS, InsightThresholds
from gpulens.domain.models import Execution, ExecutionStatus, Window
from gpulens.domain.timeparse import datetime_to_ms
from gpulens.service.alerts.evaluate import EvalOptions, Evaluator
from gpulens.service.live_tails import TailRequest
from gpulens.shaping.findings_core import Finding
from gpulens.storage.alerts import AlertStore
from gpulens.storage.registry import Registry

T0 = datetime(2026, 12, 1, 10, 0, tzinfo=UTC)
MIN = 60_000


def finding(start: datetime, end: datetime, kind: str = "idle_held") -> Finding:
    return Finding(kind, "warning", datetime_to_ms(start), datetime_to_ms(end), (), f"{kind} for a while")


@dataclass
class FakeSummary:
    """What LiveTails.findings answers for one execution: the findings the test says hold at each call."""

    window: Window
    findings: list[Finding]


@dataclass
class FakeSummaries:
    found: list[Finding] = field(default_factory=list)
    thresholds: InsightThresholds = INSIGHT_THRESHOLDS
    calls: list[tuple[str, int, int]] = field(default_factory=list)

    async def findings(self, requests: Sequence[TailRequest]) -> list[FakeSummary]:
        out = []
        for r in requests:
            self.thresholds = r.thresholds
            self.calls.append((r.execution.execution_id, r.start_ms, r.end_ms))
            out.append(FakeSummary(Window(r.start_ms, r.end_ms, 15_000), list(self.found)))
        return out


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        return self.now


@pytest.fixture
def setup(tmp_path: Path) -> Any:
    registry = Registry.from_url(f"sqlite:///{tmp_path / 'registry.db'}")
    registry.migrate()
    registry.ensure_org("acme")
    registry.ensure_org("other")
    store = AlertStore(registry)
    store.add_channel(
        Channel("chn_a", "acme", ChannelType.WEBHOOK, "http://127.0.0.1:9/hook", "whsec_eA==", T0)
    )
    registry.upsert_execution(
        Execution(
            "job-1",
            "acme",
            "node-1",
            ("0",),
            ExecutionStatus.RUNNING,
            T0 - timedelta(hours=2),
            start_time=T0 - timedelta(hours=2),
            hardware_profile="h100",
        )
    )
    clock = Clock()
    summaries = FakeSummaries()
    evaluator = Evaluator(store, registry, summaries, clock, EvalOptions(interval_s=5))  # type: ignore[arg-type]
    yield registry, store, clock, summaries, evaluator
    registry.dispose()


def rule(store: AlertStore, **kw: Any) -> AlertRule:
    fields: dict[str, Any] = {
        "rule_id": "rul_1",
        "org": "acme",
        "kind": "idle_held",
        "for_ms": 30 * MIN,
        "channels": ("chn_a",),
        "created_at": T0,
    }
    return store.add_rule(AlertRule(**{**fields, **kw}))


def events(store: AlertStore) -> list[str]:
    """The org's events in time order (one pass's resolved before the firing of the next episode)."""
    found = [store.get_event(d.event_id) for d in store.deliveries("acme")]
    ordered = sorted(
        (e for e in found if e is not None), key=lambda e: (e.created_at, e.type.value != "finding.resolved")
    )
    return [e.type.value for e in ordered]


async def test_one_firing_once_the_episode_lasted_for_and_one_resolved_when_it_ends(setup: Any) -> None:
    _, store, clock, summaries, evaluator = setup
    rule(store)
    idle_from = T0 - timedelta(minutes=20)
    summaries.found = [finding(idle_from, T0)]
    assert (await evaluator.run_once()).events == 0  # 20 of 30 minutes
    for minutes in (5, 10, 11, 12):  # reaches 30 minutes at +10: one firing, then nothing new
        clock.now = T0 + timedelta(minutes=minutes)
        summaries.found = [finding(idle_from, clock.now)]
        await evaluator.run_once()
    assert events(store) == ["finding.firing"]
    clock.now += timedelta(minutes=1)
    summaries.found = []  # the GPUs work again
    await evaluator.run_once()
    await evaluator.run_once()
    assert events(store) == ["finding.firing", "finding.resolved"]
    fired = store.get_event(store.deliveries("acme")[-1].event_id)
    assert fired is not None and fired.payload["finding"]["kind"] == "idle_held"
    assert fired.payload["execution"]["id"] == "job-1" and fired.payload["url"].endswith(
        "/ui/executions/job-1"
    )


async def test_a_new_episode_within_the_cooldown_does_not_fire_again(setup: Any) -> None:
    _, store, clock, summaries, evaluator = setup
    rule(store, for_ms=5 * MIN, cooldown_ms=60 * MIN)
    summaries.found = [finding(T0 - timedelta(minutes=6), T0)]
    await evaluator.run_once()
    clock.now = T0 + timedelta(minutes=1)
    summaries.found = []
    await evaluator.run_once()  # resolved
    clock.now = T0 + timedelta(minutes=20)  # idle again, 10 minutes long: inside the hour's cool-down
    summaries.found = [finding(T0 + timedelta(minutes=10), clock.now)]
    await evaluator.run_once()
    assert events(store) == ["finding.firing", "finding.resolved"]
    clock.now = T0 + timedelta(minutes=70)  # the same episode, past the cool-down: fires
    summaries.found = [finding(T0 + timedelta(minutes=10), clock.now)]
    await evaluator.run_once()
    assert events(store) == ["finding.firing", "finding.resolved", "finding.firing"]


async def test_warn_then_stop_unless_snoozed_and_dry_run_by_default(setup: Any) -> None:
    _, store, clock, summaries, evaluator = setup
    rule(store, for_ms=10 * MIN, action=StopAction(60 * MIN))
    start = T0 - timedelta(minutes=10)
    summaries.found = [finding(start, T0)]
    await evaluator.run_once()  # fires (the warning)
    clock.now = T0 + timedelta(minutes=30)
    store.snooze("acme", "job-1", T0 + timedelta(minutes=90), clock.now)
    for minutes in (61, 75):  # the hour after firing passes while snoozed: no stop
        clock.now = T0 + timedelta(minutes=minutes)
        summaries.found = [finding(start, clock.now)]
        await evaluator.run_once()
    assert events(store) == ["finding.firing"]
    clock.now = T0 + timedelta(minutes=91)
    summaries.found = [finding(start, clock.now)]
    await evaluator.run_once()
    await evaluator.run_once()
    assert events(store) == ["finding.firing", "execution.stop_requested"]
    stop = store.get_event(store.deliveries("acme")[0].event_id)
    assert stop is not None and stop.type is EventType.STOP_REQUESTED and stop.payload["dryRun"] is True


async def test_an_episode_that_ends_and_restarts_between_passes_resolves_then_starts_anew(setup: Any) -> None:
    _, store, clock, summaries, evaluator = setup
    rule(store, for_ms=5 * MIN, cooldown_ms=0)
    summaries.found = [finding(T0 - timedelta(minutes=6), T0)]
    await evaluator.run_once()
    clock.now = T0 + timedelta(minutes=30)  # a new idle stretch began at +20 (the old ended before)
    summaries.found = [finding(T0 + timedelta(minutes=20), clock.now)]
    await evaluator.run_once()
    assert events(store) == ["finding.firing", "finding.resolved", "finding.firing"]


async def test_rules_match_fields_and_an_ended_execution_resolves_its_episode(setup: Any) -> None:
    registry, store, clock, summaries, evaluator = setup
    rule(store, for_ms=MIN, match={"hardware_profile": "a100"})  # not this execution's profile
    summaries.found = [finding(T0 - timedelta(minutes=5), T0)]
    await evaluator.run_once()
    assert events(store) == [] and summaries.calls == []
    rule(store, rule_id="rul_2", for_ms=MIN, match={"hardware_profile": "h100"})
    await evaluator.run_once()
    assert events(store) == ["finding.firing"]
    registry.update_execution(
        "job-1", {"status": ExecutionStatus.COMPLETED, "end_time": T0 + timedelta(minutes=1)}
    )
    clock.now = T0 + timedelta(minutes=2)
    await evaluator.run_once()
    assert events(store) == ["finding.firing", "finding.resolved"]


async def test_the_tail_read_is_the_longest_rule_and_smoothing_not_the_whole_execution(setup: Any) -> None:
    _, store, _, summaries, evaluator = setup
    rule(store, for_ms=30 * MIN)
    rule(store, rule_id="rul_2", kind="idle", for_ms=5 * MIN, action=StopAction(120 * MIN))
    await evaluator.run_once()
    (_, start_ms, end_ms), *_ = summaries.calls
    assert end_ms == datetime_to_ms(T0)
    assert end_ms - start_ms == 30 * MIN + 10 * MIN  # the longest `for` and the smoothing
    assert summaries.thresholds.min_duration_ms == 2 * MIN  # the detectors' own (shorter than 5 min)
    store.delete_rule("acme", "rul_2")
    rule(store, rule_id="rul_3", for_ms=MIN)
    await evaluator.run_once()
    assert summaries.thresholds.min_duration_ms == MIN  # a rule's shorter `for`


async def test_one_replica_evaluates_at_a_time(setup: Any) -> None:
    registry, store, clock, summaries, evaluator = setup
    rule(store, for_ms=MIN)
    summaries.found = [finding(T0 - timedelta(minutes=5), T0)]
    other = Evaluator(store, registry, summaries, clock, EvalOptions(interval_s=5))  # type: ignore[arg-type]
    first, second = await evaluator.run_once(), await other.run_once()
    assert first.held and not second.held
    assert events(store) == ["finding.firing"]
    clock.now = T0 + timedelta(seconds=31)  # the holder's lease (30 s at least) ran out: the other takes over
    assert (await other.run_once()).held
    assert events(store) == ["finding.firing"]  # the episode is shared state: no second firing


async def test_a_firing_alert_is_re_posted_to_alertmanager_channels_while_it_holds(setup: Any) -> None:
    _, store, clock, summaries, evaluator = setup
    store.add_channel(Channel("chn_am", "acme", ChannelType.ALERTMANAGER, "http://127.0.0.1:9", None, T0))
    rule(store, for_ms=5 * MIN, channels=("chn_a", "chn_am"))
    start = T0 - timedelta(minutes=6)
    summaries.found = [finding(start, T0)]
    await evaluator.run_once()  # fires: one delivery per channel
    for minutes in (5, 16, 20, 32):  # re-posted at +16 and +32 (every 15 minutes), to Alertmanager only
        clock.now = T0 + timedelta(minutes=minutes)
        summaries.found = [finding(start, clock.now)]
        await evaluator.run_once()
    deliveries = store.deliveries("acme")
    assert sorted(d.channel_id for d in deliveries) == ["chn_a", "chn_am", "chn_am", "chn_am"]
    assert len({d.event_id for d in deliveries}) == 1  # the same event, its id stable


async def test_an_episode_longer_than_the_tail_holds_and_stops_after_its_delay(setup: Any) -> None:
    """The tail is the longest `for` and the smoothing: an episode longer than that shows as a finding
    starting at the window's start, pass after pass; it neither resolves nor fires again, and its
    stop request comes `after` the firing."""
    _, store, clock, summaries, evaluator = setup
    rule(store, for_ms=10 * MIN, action=StopAction(120 * MIN))
    summaries.found = [finding(T0 - timedelta(minutes=10), T0)]
    await evaluator.run_once()
    for minutes in range(15, 135, 15):
        clock.now = T0 + timedelta(minutes=minutes)
        window_start = clock.now - timedelta(minutes=20)  # what the tail read shows: cut at its start
        summaries.found = [finding(window_start, clock.now)]
        await evaluator.run_once()
    assert events(store) == ["finding.firing", "execution.stop_requested"]


async def test_a_digest_rule_is_no_concern_of_the_live_pass(setup: Any) -> None:
    _, store, _, summaries, evaluator = setup
    store.add_rule(
        AlertRule("rul_d", "acme", "digest", 0, ("chn_a",), "info", created_at=T0, every_ms=7 * 24 * 60 * MIN)
    )
    summaries.found = [finding(T0 - timedelta(hours=1), T0)]
    report = await evaluator.run_once()
    assert report.held and report.errors == 0 and report.events == 0
    assert summaries.calls == []  # no tail read: no finding rule concerns the running execution
    assert store.episodes() == [] and events(store) == []
