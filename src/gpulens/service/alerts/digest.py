"""Usage digests (docs/alerts.md, "Digests"): a rule of kind `digest` sends, once per period, each user
whose idle GPU-hours reached the rule's threshold their row of the period's usage table and their
worst executions (to the rule's per-user channels, whose URL carries `{user}`), and one copy of the
whole table to its other channels; Job Defense Shield's weekly mail, from gpulens's receipts.

Periods are aligned on the rule's creation: from its UTC day when `every` is whole days (its UTC hour
otherwise), `every` long; a period is sent `settle_ms` after it ends (the stored summaries of what
ended just before are written by then). Only the latest ended period is sent: after a long stop
gpulens sends one digest, not a backlog. The period is recorded with its events and their deliveries
in one transaction whose key (rule, period end) refuses a second one, so two replicas, or a restart
in the middle, never send a period twice; the pass also runs only on the replica holding the
`alerts-digest` lease. The figures are the usage table's (storage/digests.py reads the same stored
slices), summed per execution and then per user."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

from gpulens.domain.alerts import AlertEvent, AlertRule, Channel, ChannelType, EventType, new_id, per_user
from gpulens.domain.timeparse import datetime_to_ms, format_duration_ms, format_rfc3339_ms
from gpulens.service.summary import load_prices
from gpulens.storage.alerts import AlertStore
from gpulens.storage.digests import DigestStore, ExecutionUsage

log = logging.getLogger(__name__)

LEASE = "alerts-digest"
HOUR_MS = 3_600_000
DAY_MS = 24 * HOUR_MS


@dataclass(frozen=True, slots=True)
class DigestOptions:
    interval_s: float = 60.0  # how often the pass looks for a period that ended
    settle_ms: int = 10 * 60_000  # a period is sent this long after it ends
    public_url: str | None = None  # the dashboard links
    prices: Path | None = None  # the prices file: the currency of the costs
    worst: int = 5  # executions in a user's digest
    table_worst: int = 10  # executions in the copy


@dataclass(slots=True)
class DigestReport:
    held: bool = False  # this replica held the lease
    sent: list[tuple[str, int]] = field(default_factory=list)  # (rule id, period end ms) stored now
    events: int = 0
    errors: int = 0


@dataclass(frozen=True, slots=True)
class Digest:
    """One period of one rule: each notified user's payload, and the copy with the whole table."""

    users: list[tuple[str, dict[str, Any]]]
    copy: dict[str, Any]


# -- the schedule ----------------------------------------------------------------------------------------


def anchor_ms(rule: AlertRule) -> int:
    """Where the rule's periods are counted from: its creation's UTC day when `every` is whole days,
    else its UTC hour."""
    assert rule.every_ms is not None and rule.created_at is not None
    created = datetime_to_ms(rule.created_at)
    grain = DAY_MS if rule.every_ms % DAY_MS == 0 else HOUR_MS
    return created - created % grain


def due_period(
    rule: AlertRule, last_end_ms: int | None, now_ms: int, settle_ms: int
) -> tuple[int, int] | None:
    """The period to send now: the latest one that ended at least `settle_ms` ago, unless it (or a
    later one) was sent; None when there is none."""
    every = rule.every_ms
    if every is None or every <= 0 or rule.created_at is None:
        return None
    anchor = anchor_ms(rule)
    ended = (now_ms - settle_ms - anchor) // every  # whole periods ended `settle_ms` ago
    if ended < 1:
        return None
    end = anchor + ended * every
    if last_end_ms is not None and end <= last_end_ms:
        return None
    return end - every, end


# -- the payloads ----------------------------------------------------------------------------------------


@dataclass(slots=True)
class _Sums:
    executions: int = 0
    running: int = 0
    gpu_ms: float = 0.0
    useful_gpu_s: float = 0.0
    idle_ms: float = 0.0
    idle_held_ms: float = 0.0
    input_bound_ms: float = 0.0
    throttled_ms: float = 0.0
    energy_j: float = 0.0
    cost: float | None = None

    def add(self, u: ExecutionUsage) -> None:
        self.executions += 1
        self.running += u.execution.status.is_active
        self.gpu_ms += u.gpu_ms
        self.useful_gpu_s += u.useful_gpu_s
        self.idle_ms += u.idle_ms
        self.idle_held_ms += u.idle_held_ms
        self.input_bound_ms += u.input_bound_ms
        self.throttled_ms += u.throttled_ms
        self.energy_j += u.energy_j
        if u.cost is not None:
            self.cost = (self.cost or 0.0) + u.cost

    @property
    def idle_hours(self) -> float:
        """The threshold's measure: idle and idle-with-memory-held GPU-hours."""
        return (self.idle_ms + self.idle_held_ms) / HOUR_MS


def _row(group: dict[str, str | None], s: _Sums) -> dict[str, Any]:
    """A row of the table, spelled as `GET /api/v2/external/usage` spells its rows."""
    lines = {
        "idle": s.idle_ms,
        "idle_held": s.idle_held_ms,
        "input_bound": s.input_bound_ms,
        "throttled": s.throttled_ms,
    }
    top = sorted(((k, ms / HOUR_MS) for k, ms in lines.items() if ms > 0), key=lambda kv: -kv[1])
    return {
        "group": group,
        "executions": s.executions,
        "runningExecutions": s.running,
        "gpuHours": s.gpu_ms / HOUR_MS,
        "usefulGpuHours": s.useful_gpu_s / 3600,
        "idleGpuHours": s.idle_ms / HOUR_MS,
        "idleHeldGpuHours": s.idle_held_ms / HOUR_MS,
        "inputBoundGpuHours": s.input_bound_ms / HOUR_MS,
        "throttledGpuHours": s.throttled_ms / HOUR_MS,
        "energyKwh": s.energy_j / 3_600_000,
        "cost": s.cost,
        "topFindings": [{"kind": k, "gpuHours": h} for k, h in top],
    }


def _waste(u: ExecutionUsage) -> tuple[float, float]:
    """How bad an execution was in the period: idle (with or without memory held) GPU-ms, then every
    wasted GPU-ms (input-bound and throttled too)."""
    idle = u.idle_ms + u.idle_held_ms
    return idle, idle + u.input_bound_ms + u.throttled_ms


def _time(when: datetime | None) -> str | None:
    return None if when is None else format_rfc3339_ms(datetime_to_ms(when))


class Links:
    """The dashboard's pages a digest links to (relative without a public URL)."""

    def __init__(self, public_url: str | None) -> None:
        self.base = (public_url or "").rstrip("/")

    def execution(self, execution_id: str) -> str:
        return f"{self.base}/ui/executions/{quote(execution_id, safe='')}"

    def usage(self, start_ms: int, end_ms: int) -> str:
        query = {"group_by": "user", "start": format_rfc3339_ms(start_ms), "end": format_rfc3339_ms(end_ms)}
        return f"{self.base}/ui/usage?{urlencode(query)}"

    def executions(self, user: str, start_ms: int, end_ms: int) -> str:
        """The executions page: the user's executions that ran in the period, worst first."""
        query = {
            "user": user,
            "start": format_rfc3339_ms(start_ms),
            "end": format_rfc3339_ms(end_ms),
            "order": "worst",
        }
        return f"{self.base}/?{urlencode(query)}"


def _execution(u: ExecutionUsage, links: Links) -> dict[str, Any]:
    e = u.execution
    return {
        "id": e.execution_id,
        "user": e.user,
        "project": e.project,
        "hostname": e.hostname,
        "hardware_profile": e.hardware_profile,
        "status": e.status.value,
        "start_time": _time(e.start_time),
        "end_time": _time(e.end_time),
        "gpuHours": u.gpu_ms / HOUR_MS,
        "idleGpuHours": u.idle_ms / HOUR_MS,
        "idleHeldGpuHours": u.idle_held_ms / HOUR_MS,
        "inputBoundGpuHours": u.input_bound_ms / HOUR_MS,
        "throttledGpuHours": u.throttled_ms / HOUR_MS,
        "cost": u.cost,
        "url": links.execution(e.execution_id),
    }


def _worst(usages: Sequence[ExecutionUsage], n: int, links: Links) -> list[dict[str, Any]]:
    """The `n` executions that wasted most, worst first (none that wasted nothing)."""
    wasted = [u for u in usages if _waste(u)[1] > 0]
    wasted.sort(key=lambda u: (*(-w for w in _waste(u)), u.execution.execution_id))
    return [_execution(u, links) for u in wasted[:n]]


def rule_json(rule: AlertRule) -> dict[str, Any]:
    assert rule.every_ms is not None
    return {
        "id": rule.rule_id,
        "kind": rule.kind,
        "every": format_duration_ms(rule.every_ms),
        "min_idle_gpu_hours": rule.min_idle_gpu_hours or 0.0,
        "match": dict(rule.match),
    }


def build_digest(
    rule: AlertRule,
    usages: Sequence[ExecutionUsage],
    start_ms: int,
    end_ms: int,
    now: datetime,
    *,
    public_url: str | None = None,
    currency: str | None = None,
    worst: int = 5,
    table_worst: int = 10,
) -> Digest:
    """The rule's digest of [start_ms, end_ms) from its org's executions' usage: the executions the
    rule's `match` concerns, summed per user; a payload per user whose idle and idle-held GPU-hours
    reach `min_idle_gpu_hours` (executions without a user: in the table, never notified); the copy with
    every user's row, the totals and the worst executions. Event ids are left to the caller (`id`)."""
    links = Links(public_url)
    mine = [
        u
        for u in usages
        if u.execution.org == rule.org
        and rule.matches(
            {
                "hardware_profile": u.execution.hardware_profile,
                "hostname": u.execution.hostname,
                "project": u.execution.project,
                "user": u.execution.user,
            }
        )
    ]
    by_user: dict[str | None, list[ExecutionUsage]] = {}
    for u in mine:
        by_user.setdefault(u.execution.user, []).append(u)
    sums: dict[str | None, _Sums] = {}
    total = _Sums()
    for user, runs in by_user.items():
        s = sums[user] = _Sums()
        for u in runs:
            s.add(u)
            total.add(u)
    threshold = rule.min_idle_gpu_hours or 0.0
    order = sorted(sums, key=lambda user: (-sums[user].idle_hours, -sums[user].gpu_ms, user or ""))
    notified = [user for user in order if user is not None and sums[user].idle_hours >= threshold]
    common = {
        "type": EventType.DIGEST.value,
        "timestamp": format_rfc3339_ms(datetime_to_ms(now)),
        "org": rule.org,
        "rule": rule_json(rule),
        "period": {"start": format_rfc3339_ms(start_ms), "end": format_rfc3339_ms(end_ms)},
        "currency": currency,
    }
    users = [
        (
            user,
            {
                **common,
                "user": user,
                "usage": _row({"user": user}, sums[user]),
                "worstExecutions": _worst(by_user[user], worst, links),
                "url": links.executions(user, start_ms, end_ms),
            },
        )
        for user in notified
    ]
    table = [{**_row({"user": user}, sums[user]), "notified": user in notified} for user in order]
    copy = {
        **common,
        "user": None,
        "totals": _row({}, total),
        "users": table,
        "notified": notified,
        "worstExecutions": _worst(mine, table_worst, links),
        "url": links.usage(start_ms, end_ms),
    }
    return Digest(users, copy)


def events_for(
    rule: AlertRule, digest: Digest, channels: Sequence[Channel], now: datetime
) -> list[tuple[AlertEvent, list[str]]]:
    """The digest's events with the channels each goes to: a user's to the rule's per-user channels,
    the copy to the others. A digest without per-user channels notifies no one but the copy's."""
    by_id = {c.channel_id: c for c in channels}
    rule_channels = [by_id[c] for c in rule.channels if c in by_id]
    # (an Alertmanager channel takes no digest: refused by the rule's validation, skipped here should
    # the operator's file turn a channel the rule names into one)
    rule_channels = [c for c in rule_channels if c.type is not ChannelType.ALERTMANAGER]
    personal = [c.channel_id for c in rule_channels if per_user(c.url)]
    shared = [c.channel_id for c in rule_channels if not per_user(c.url)]
    out: list[tuple[AlertEvent, list[str]]] = []

    def event(payload: dict[str, Any], targets: list[str]) -> None:
        event_id = new_id("evt")
        body = {"id": event_id, **payload}
        out.append((AlertEvent(event_id, rule.org, EventType.DIGEST, now, None, rule.rule_id, body), targets))

    if personal:
        for _, payload in digest.users:
            event(payload, personal)
    if shared:
        event(digest.copy, shared)
    return out


# -- the pass -------------------------------------------------------------------------------------------


class Digester:
    """Sends the digests whose period ended (`run_once`, every `interval_s` in `run_forever`)."""

    def __init__(
        self,
        store: AlertStore,
        usage: DigestStore,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        options: DigestOptions | None = None,
        holder: str | None = None,
    ) -> None:
        self.store = store
        self.usage = usage
        self.clock = clock
        self.options = options or DigestOptions()
        self.holder = holder or f"gpulens-{uuid.uuid4().hex[:12]}"

    async def run_forever(self) -> None:
        while True:
            try:
                await self.run_once()
            except asyncio.CancelledError:
                raise
            except Exception:  # a pass that fails is logged; the next one tries again
                log.exception("digest pass failed")
            await asyncio.sleep(self.options.interval_s)

    async def run_once(self) -> DigestReport:
        report = DigestReport()
        now = self.clock()
        ttl = timedelta(seconds=max(3 * self.options.interval_s, 30))
        if not await asyncio.to_thread(self.store.take_lease, LEASE, self.holder, now, ttl):
            return report
        report.held = True
        rules = [r for r in await asyncio.to_thread(self.store.rules) if r.is_digest]
        if not rules:
            return report
        last = await asyncio.to_thread(self.store.last_digests)
        now_ms = datetime_to_ms(now)
        for rule in rules:
            period = due_period(rule, last.get(rule.rule_id), now_ms, self.options.settle_ms)
            if period is None:
                continue
            try:
                report.events += await self._send(rule, *period, now, report)
            except Exception as exc:  # one rule's failure does not stop the others
                report.errors += 1
                log.warning("digest of rule %s not sent: %s", rule.rule_id, exc)
        return report

    async def _send(
        self, rule: AlertRule, start_ms: int, end_ms: int, now: datetime, report: DigestReport
    ) -> int:
        usages = await asyncio.to_thread(self.usage.executions_usage, rule.org, start_ms, end_ms)
        channels = await asyncio.to_thread(self.store.channels, rule.org)
        opts = self.options
        currency = None if opts.prices is None else load_prices(opts.prices).currency
        digest = build_digest(
            rule,
            usages,
            start_ms,
            end_ms,
            now,
            public_url=opts.public_url,
            currency=currency,
            worst=opts.worst,
            table_worst=opts.table_worst,
        )
        events = events_for(rule, digest, channels, now)
        stored = await asyncio.to_thread(
            self.store.save_digest, rule, start_ms, end_ms, events, len(digest.users), now
        )
        if not stored:  # another replica sent this period (or the rule is gone)
            return 0
        report.sent.append((rule.rule_id, end_ms))
        log.info(
            "digest of rule %s for %s..%s: %d users notified, %d events",
            rule.rule_id,
            format_rfc3339_ms(start_ms),
            format_rfc3339_ms(end_ms),
            len(digest.users),
            len(events),
        )
        return len(events)
