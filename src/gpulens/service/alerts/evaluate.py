"""The live evaluation pass (docs/alerts.md, "Rules and episodes"): the tail of each running execution
that a rule concerns, read through the summary's plans and detectors, and one episode per (rule,
execution) kept in the registry between passes. Events are stored with the episode's new state in one
transaction, and sent by the deliverer (service/alerts/deliver.py)."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from gpulens.domain import catalog as c
from gpulens.domain.alerts import AlertEvent, AlertRule, ChannelType, EventType, new_id
from gpulens.domain.models import Execution, ExecutionStatus
from gpulens.domain.timeparse import datetime_to_ms, format_duration_ms, format_rfc3339_ms
from gpulens.service.live_tails import LiveTails, TailRequest
from gpulens.service.summary import LiveFindings
from gpulens.shaping.findings_core import Finding
from gpulens.storage.alerts import AlertStore, Episode
from gpulens.storage.registry import Registry

log = logging.getLogger(__name__)

LEASE = "alerts-eval"
ACTIVE = (ExecutionStatus.RUNNING,)


@dataclass(frozen=True, slots=True)
class EvalOptions:
    interval_s: float = 60.0
    smoothing_ms: int = 10 * 60_000  # read before the longest `for`: the detectors' hysteresis context
    # a finding ending this close to the window's end still holds (the newest samples lag a scrape or
    # two behind the clock): 3 scrape intervals
    end_slack_ms: int = 45_000
    enforce: bool = False  # GPULENS_ACTIONS=enforce: stop requests are not marked dryRun
    public_url: str | None = None  # the dashboard links
    repost_ms: int = 15 * 60_000  # a firing alert re-posted to Alertmanager channels this often
    max_executions: int = 1000  # running executions read a pass
    prices: Path | None = None  # the prices file: the currency of the digests' costs


@dataclass(slots=True)
class PassReport:
    held: bool = False  # this replica held the lease
    executions: int = 0
    events: int = 0
    errors: int = 0


class Evaluator:
    def __init__(
        self,
        store: AlertStore,
        registry: Registry,
        tails: LiveTails,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        options: EvalOptions | None = None,
        holder: str | None = None,
    ) -> None:
        self.store = store
        self.registry = registry
        self.clock = clock
        self.options = options or EvalOptions()
        self.holder = holder or f"gpulens-{uuid.uuid4().hex[:12]}"
        self.tails = tails

    async def run_forever(self) -> None:
        while True:
            try:
                await self.run_once()
            except asyncio.CancelledError:
                raise
            except Exception:  # a pass that fails is logged; the next one tries again
                log.exception("alert evaluation pass failed")
            await asyncio.sleep(self.options.interval_s)

    async def run_once(self) -> PassReport:
        report = PassReport()
        now = self.clock()
        ttl = timedelta(seconds=max(3 * self.options.interval_s, 30))
        if not await asyncio.to_thread(self.store.take_lease, LEASE, self.holder, now, ttl):
            return report
        report.held = True
        # digests are not about running executions: their own pass sends them (service/alerts/digest.py)
        rules = [r for r in await asyncio.to_thread(self.store.rules) if not r.is_digest]
        alertmanagers = {  # the channels a fired episode is re-posted to while it holds
            ch.channel_id
            for org in {r.org for r in rules}
            for ch in await asyncio.to_thread(self.store.channels, org)
            if ch.type is ChannelType.ALERTMANAGER
        }
        by_org: dict[str, list[AlertRule]] = {}
        for rule in rules:
            by_org.setdefault(rule.org, []).append(rule)
        running: dict[str, Execution] = {}
        for org in by_org:
            rows, _ = await asyncio.to_thread(
                self.registry.list_executions,
                org=org,
                statuses=ACTIVE,
                limit=self.options.max_executions,
            )
            running.update({e.execution_id: e for e in rows if e.hostname and e.start_time})
        snoozes = await asyncio.to_thread(self.store.snoozed_until, list(running))  # one read a pass
        episodes = {
            (e.rule_id, e.execution_id): e
            for e in await asyncio.to_thread(self.store.pass_episodes, list(running))
        }
        concerned = {
            execution_id: mine
            for execution_id, execution in running.items()
            if (mine := [r for r in by_org.get(execution.org, []) if r.matches(_fields(execution))])
        }
        end_ms = datetime_to_ms(now)
        # every tail read together: per host, a few tagged queries instead of a few per execution
        tails = await self.tails.findings(
            [self._request(running[execution_id], mine, end_ms) for execution_id, mine in concerned.items()]
        )
        for (execution_id, mine), tail in zip(concerned.items(), tails, strict=True):
            execution = running[execution_id]
            if isinstance(tail, Exception):
                report.errors += 1
                log.warning("alerts: %s not evaluated: tail read failed: %s", execution_id, tail)
                continue
            try:
                until = snoozes.get(execution_id)
                report.events += await self._execution(
                    execution, mine, tail, episodes, now, until, alertmanagers
                )
            except Exception as exc:  # one execution's failure does not stop the pass
                report.errors += 1
                log.warning("alerts: %s not evaluated: %s", execution_id, exc)
            else:
                report.executions += 1
        report.executions += len(running) - len(concerned)  # no rule concerns them: nothing to read
        # episodes left open on executions that no longer run (or rules gone): resolved
        rule_by_id = {r.rule_id: r for r in rules}
        for (rule_id, execution_id), episode in episodes.items():
            if execution_id in running or episode.resolved_at is not None or episode.fired_at is None:
                continue
            owner = rule_by_id.get(rule_id)
            if owner is None:
                continue
            ended: Execution | None = await asyncio.to_thread(self.registry.get_execution, execution_id)
            event = self._event(EventType.RESOLVED, owner, ended, episode, None, now)
            closed = replace(episode, resolved_at=now)
            await asyncio.to_thread(self.store.save_episode, closed, [(event, owner.channels)], now)
            report.events += 1
        return report

    def _request(self, execution: Execution, rules: Sequence[AlertRule], end_ms: int) -> TailRequest:
        """The execution's tail for its rules: the longest `for` and the smoothing before `end_ms` (an
        episode already going on when a rule is made, or gpulens restarted, is seen whole; a stop's
        `after` counts from the stored firing, not from what the tail shows), with the detectors'
        minimum duration lowered to the shortest `for` (a rule's `for` is the user's own minimum: the
        detectors' default, 2 minutes for reports after the fact, does not hold a shorter one back;
        min_samples still keeps blips out)."""
        assert execution.start_time is not None
        longest = max(r.for_ms for r in rules)
        start_ms = max(datetime_to_ms(execution.start_time), end_ms - longest - self.options.smoothing_ms)
        shortest = min(r.for_ms for r in rules)
        th = c.INSIGHT_THRESHOLDS
        thresholds = replace(th, min_duration_ms=min(th.min_duration_ms, shortest))
        return TailRequest(execution, start_ms, end_ms, thresholds, frozenset(r.kind for r in rules))

    async def _execution(
        self,
        execution: Execution,
        rules: Sequence[AlertRule],
        summary: LiveFindings,
        episodes: dict[tuple[str, str], Episode],
        now: datetime,
        snoozed_until: datetime | None,
        alertmanagers: set[str],
    ) -> int:
        """Each rule's episode on the execution's tail findings: saved with its events."""
        opts = self.options
        window_end = summary.window.end_ms
        events = 0
        for rule in rules:
            ongoing = [
                f
                for f in summary.findings
                if f.kind == rule.kind and f.end_ms >= window_end - opts.end_slack_ms
            ]
            finding = min(ongoing, key=lambda f: f.start_ms) if ongoing else None
            key = (rule.rule_id, execution.execution_id)
            before = episodes.get(key)
            state, produced = self.step(
                rule, execution, before, finding, now, snoozed_until, summary.window.start_ms
            )
            if state is not None and (state != before or produced):
                await asyncio.to_thread(
                    self.store.save_episode, state, [(e, rule.channels) for e in produced], now
                )
                episodes[key] = state
            events += len(produced)
            if state is not None and not produced:
                await self._repost(rule, state, now, alertmanagers)
        return events

    async def _repost(self, rule: AlertRule, state: Episode, now: datetime, alertmanagers: set[str]) -> None:
        """A fired, open episode's event sent again to the rule's Alertmanager channels every
        `repost_ms` (Alertmanager resolves an alert that is not re-posted before its endsAt)."""
        targets = [ch for ch in rule.channels if ch in alertmanagers]
        if not targets or state.fired_at is None or state.resolved_at is not None:
            return
        last = state.reposted_at or state.fired_at
        if now - last >= timedelta(milliseconds=self.options.repost_ms):
            await asyncio.to_thread(self.store.repost, state, targets, now)

    def step(
        self,
        rule: AlertRule,
        execution: Execution,
        episode: Episode | None,
        finding: Finding | None,
        now: datetime,
        snoozed_until: datetime | None = None,
        window_start_ms: int = 0,
    ) -> tuple[Episode | None, list[AlertEvent]]:
        """One rule on one execution for one pass: the episode's next state and the events it makes.

        An open episode continues while a finding of the rule's kind reaches the window's end and
        starts no later than the episode did, or than the window (`window_start_ms`: the tail cuts
        an episode longer than itself); a finding that starts later is a new episode, after the old
        one is resolved."""
        now_ms = datetime_to_ms(now)
        events: list[AlertEvent] = []
        slack = self.options.end_slack_ms
        open_episode = episode if episode is not None and episode.resolved_at is None else None
        if (
            open_episode is not None
            and finding is not None
            and finding.start_ms > max(open_episode.started_ms, window_start_ms) + slack
        ):
            # the old episode ended between two passes and a new one began
            if open_episode.fired_at is not None:
                events.append(self._event(EventType.RESOLVED, rule, execution, open_episode, None, now))
            episode = replace(open_episode, resolved_at=now)
            open_episode = None
        if finding is None:
            if open_episode is None:
                return (episode if events else None), events
            if open_episode.fired_at is not None:
                events.append(self._event(EventType.RESOLVED, rule, execution, open_episode, None, now))
            return replace(open_episode, resolved_at=now), events
        if open_episode is None:
            last_fired = episode.last_fired_at if episode is not None else None
            open_episode = Episode(
                rule.rule_id,
                execution.execution_id,
                execution.org,
                finding.start_ms,
                None,
                None,
                None,
                None,
                last_fired,
            )
        state = open_episode
        cooled = state.last_fired_at is None or now - state.last_fired_at >= timedelta(
            milliseconds=rule.cooldown_ms
        )
        if state.fired_at is None and now_ms - state.started_ms >= rule.for_ms and cooled:
            event = self._event(EventType.FIRING, rule, execution, state, finding, now)
            events.append(event)
            state = replace(state, fired_at=now, fired_event_id=event.event_id, last_fired_at=now)
        if (
            rule.action is not None
            and state.fired_at is not None
            and state.stop_event_id is None
            and now - state.fired_at >= timedelta(milliseconds=rule.action.after_ms)
            and (snoozed_until is None or snoozed_until <= now)
        ):
            event = self._event(EventType.STOP_REQUESTED, rule, execution, state, finding, now)
            events.append(event)
            state = replace(state, stop_event_id=event.event_id)
        return state, events

    def _event(
        self,
        kind: EventType,
        rule: AlertRule,
        execution: Execution | None,
        episode: Episode,
        finding: Finding | None,
        now: datetime,
    ) -> AlertEvent:
        event_id = new_id("evt")
        payload: dict[str, Any] = {
            "type": kind.value,
            "id": event_id,
            "timestamp": format_rfc3339_ms(datetime_to_ms(now)),
            "org": rule.org,
            "execution": _execution_json(execution, episode.execution_id),
            "finding": _finding_json(rule, episode, finding, now),
            "rule": {
                "id": rule.rule_id,
                "kind": rule.kind,
                "for": format_duration_ms(rule.for_ms),
                "severity": rule.severity,
            },
            "url": self._url(episode.execution_id),
        }
        if kind is EventType.STOP_REQUESTED:
            payload["dryRun"] = not self.options.enforce
        return AlertEvent(event_id, rule.org, kind, now, episode.execution_id, rule.rule_id, payload)

    def _url(self, execution_id: str) -> str:
        base = (self.options.public_url or "").rstrip("/")
        return f"{base}/ui/executions/{execution_id}"


def _fields(execution: Execution) -> dict[str, str | None]:
    return {
        "hardware_profile": execution.hardware_profile,
        "hostname": execution.hostname,
        "project": execution.project,
        "user": execution.user,
    }


def _execution_json(execution: Execution | None, execution_id: str) -> dict[str, Any]:
    if execution is None:
        return {"id": execution_id}
    start = execution.start_time
    return {
        "id": execution.execution_id,
        "hostname": execution.hostname,
        "gpus": list(execution.gpus),
        "status": execution.status.value,
        "start_time": None if start is None else format_rfc3339_ms(datetime_to_ms(start)),
    }


def _finding_json(
    rule: AlertRule, episode: Episode, finding: Finding | None, now: datetime
) -> dict[str, Any]:
    """The finding as the summary shows it (with its impact); for a resolved episode, its span."""
    if finding is None:
        return {
            "kind": rule.kind,
            "severity": rule.severity,
            "start": format_rfc3339_ms(episode.started_ms),
            "end": format_rfc3339_ms(datetime_to_ms(now)),
        }
    return {
        "kind": finding.kind,
        "severity": finding.severity,
        "start": format_rfc3339_ms(episode.started_ms),
        "end": format_rfc3339_ms(finding.end_ms),
        "gpus": list(finding.gpus),
        "message": finding.message,
        "evidence": dict(finding.evidence),
        "impact": {"gpuHours": finding.gpu_hours, "cost": finding.cost},
    }
