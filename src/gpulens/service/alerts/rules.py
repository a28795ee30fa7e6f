"""Live alerts as an org configures them (docs/alerts.md): rules, channels, snoozes and the deliveries'
record, validated here once for the API, the CLI and the operator's default file (GPULENS_ALERTS).

Every call names the org; another org's rule, channel, delivery or execution is as absent as a
missing one (NotFound, the same words for both)."""

from __future__ import annotations

import base64
import binascii
import hashlib
import logging
import math
import re
import tomllib
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from gpulens.domain import catalog, limits
from gpulens.domain.alerts import (
    DIGEST,
    ID_MAX,
    MATCH_FIELDS,
    RULE_KINDS,
    SEVERITIES,
    USER_PLACEHOLDER,
    AlertRule,
    Channel,
    ChannelType,
    Delivery,
    DeliveryStatus,
    StopAction,
    new_id,
    new_webhook_secret,
    per_user,
)
from gpulens.domain.errors import Conflict, Forbidden, InvalidParameter, InvalidRequest, NotFound, Overloaded
from gpulens.domain.models import (
    EXECUTION_ID_RE,
    HOSTNAME_RE,
    HOSTNAME_TEXT,
    ORG_SLUG_RE,
    ORG_SLUG_TEXT,
    PROJECT_RE,
    PROJECT_TEXT,
    USER_RE,
    USER_TEXT,
    Principal,
)
from gpulens.domain.timeparse import TIMESTAMP_RANGE, checked_datetime, format_duration_ms, parse_duration_ms
from gpulens.service.checks import bad, run_sync, utcnow
from gpulens.storage.alerts import AlertStore

__all__ = [
    "APPRISE_URL_PATTERN",
    "HTTP_URL_PATTERN",
    "MATCH_VALUE_PATTERN",
    "MAX_CHANNELS",
    "MAX_DURATION_MS",
    "MAX_IDLE_THRESHOLD",
    "MAX_RULES",
    "MAX_RULE_CHANNELS",
    "MAX_SNOOZE",
    "MIN_EVERY_MS",
    "URL_MAX",
    "WEBHOOK_SECRET_PATTERN",
    "AlertService",
    "ChannelTester",
    "DeliveryNotRunning",
    "ExecutionAlerts",
    "Firing",
    "display_url",
    "is_file_row",
]

log = logging.getLogger("gpulens.alerts")

MAX_DURATION_MS = 30 * 86_400_000  # the longest `for` and stop `after`: 30 days
MAX_SNOOZE = timedelta(days=30)  # the furthest a snooze reaches ahead
MIN_EVERY_MS = 3_600_000  # a digest's shortest period: an hour (the usage slices' grain)
MAX_IDLE_THRESHOLD = 1_000_000.0  # a digest's largest min_idle_gpu_hours
MAX_RULES = 200  # per org
MAX_CHANNELS = 50  # per org
MAX_RULE_CHANNELS = 10  # channels one rule names
URL_MAX = 2048

# An http(s) URL with a host name or an IPv4 address, an optional port and printable ASCII after (no
# credentials in it: a receiver that wants them takes them in the path or checks the signature).
HTTP_URL_PATTERN = r"^https?://[A-Za-z0-9][A-Za-z0-9.-]{0,252}(?::[1-9][0-9]{0,4})?(?:[/?#][\x21-\x7e]*)?$"
# An Apprise URL (https://github.com/caronc/apprise/wiki): `scheme://` and printable ASCII (tokens).
APPRISE_URL_PATTERN = r"^[A-Za-z][A-Za-z0-9+.-]{0,31}://[\x21-\x7e]+$"
# A Standard Webhooks secret: `whsec_` and the base64 of 24 to 66 random bytes.
WEBHOOK_SECRET_PATTERN = (
    r"^whsec_(?:[A-Za-z0-9+/]{4}){7,21}(?:[A-Za-z0-9+/]{4}|[A-Za-z0-9+/]{3}=|[A-Za-z0-9+/]{2}==)$"  # noqa: S105
)
# a hardware profile to match: one line of text without control characters
MATCH_VALUE_PATTERN = rf"^[^\x00-\x1f\x7f-\x9f]{{1,{limits.PROFILE_MAX}}}$"

_HTTP_URL = re.compile(HTTP_URL_PATTERN)
_APPRISE_URL = re.compile(APPRISE_URL_PATTERN)
_SECRET = re.compile(WEBHOOK_SECRET_PATTERN)
_MATCH_VALUE = re.compile(MATCH_VALUE_PATTERN)
_EXECUTION_ID = re.compile(EXECUTION_ID_RE)
_ORG = re.compile(ORG_SLUG_RE)
_HOSTNAME = re.compile(HOSTNAME_RE)
_PROJECT = re.compile(PROJECT_RE)
_USER = re.compile(USER_RE)
_FILE_ID = re.compile(r"[A-Za-z0-9_-]{1,40}")

ChannelTester = Callable[[Channel], Awaitable[tuple[bool, str | None]]]

RULE_NOT_FOUND = "Alert rule not found"
CHANNEL_NOT_FOUND = "Alert channel not found"
DELIVERY_NOT_FOUND = "Delivery not found"
EXECUTION_NOT_FOUND = "Execution not found"
PROJECT_KEYS = (
    "A key limited to projects cannot manage alerts: rules and channels concern every project of the "
    "organization"
)


class DeliveryNotRunning(Overloaded):
    """No sender is wired to test a channel with (503)."""

    retry_after_s = 60


def is_file_row(row_id: str) -> bool:
    """A rule or channel of the operator's default file (GPULENS_ALERTS), not of the API."""
    return row_id.startswith(("rul_file_", "chn_file_"))


def display_url(channel: Channel) -> str:
    """A channel's URL as lists show it: an Apprise URL carries its service's tokens, an http(s) URL
    may carry one in its query; both are cut to what says where the events go."""
    if channel.type is ChannelType.APPRISE:
        scheme, _, _ = channel.url.partition("://")
        return f"{scheme}://…"
    where, query, _ = channel.url.partition("?")
    where = where.partition("#")[0]
    return f"{where}?…" if query else where


def _duration(name: str, raw: object) -> int:
    """A positive duration text of at most 30 days, as milliseconds (422 naming the field)."""
    if not isinstance(raw, str):
        raise bad(name, raw, f"{name} must be a duration text such as 30m, 2h or 1h30m")
    try:
        ms = parse_duration_ms(raw)
    except ValueError as exc:
        if "zero or negative" in str(exc):  # its words are about query steps
            raise bad(name, raw, f"{name} must be a positive duration") from None
        raise bad(name, raw, f"{name}: {exc}") from None
    if ms <= 0:
        raise bad(name, raw, f"{name} must be a positive duration")
    if ms > MAX_DURATION_MS:
        raise bad(name, raw, f"{name} must be at most {format_duration_ms(MAX_DURATION_MS)} (30 days)")
    return ms


def _every(raw: object) -> int:
    """A digest's period: a duration of at least an hour and at most 30 days, as milliseconds."""
    ms = _duration("every", raw)
    if ms < MIN_EVERY_MS:
        raise bad("every", raw, "every must be at least 1h (the usage table's figures are hourly)")
    return ms


def _idle_threshold(raw: object) -> float:
    """A digest's per-user threshold in idle GPU-hours: a number >= 0 (default 0: every user with
    usage in the period)."""
    if raw is None:
        return 0.0
    if isinstance(raw, bool) or not isinstance(raw, int | float) or not math.isfinite(raw):
        raise bad("min_idle_gpu_hours", raw, "min_idle_gpu_hours must be a number of GPU-hours")
    if not 0 <= raw <= MAX_IDLE_THRESHOLD:
        raise bad(
            "min_idle_gpu_hours", raw, f"min_idle_gpu_hours must be between 0 and {MAX_IDLE_THRESHOLD:g}"
        )
    return float(raw)


def _text(name: str, raw: object, choices: Sequence[str]) -> str:
    if not isinstance(raw, str) or raw not in choices:
        raise bad(name, raw, f"{name} must be one of {', '.join(choices)}")
    return raw


def _action(raw: object) -> StopAction | None:
    if raw is None:
        return None
    if not isinstance(raw, Mapping) or raw.get("type") != "stop" or set(raw) - {"type", "after"}:
        raise bad("action", raw, 'action must be null or {"type": "stop", "after": "<duration>"}')
    return StopAction(_duration("action.after", raw.get("after")))


def _match(raw: object) -> dict[str, str]:
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise bad("match", raw, f"match must be an object with some of {', '.join(MATCH_FIELDS)}")
    out: dict[str, str] = {}
    for name, value in raw.items():
        if value is None:
            continue
        if name not in MATCH_FIELDS:
            raise bad("match", raw, f"match: unknown field {name!r}; known: {', '.join(MATCH_FIELDS)}")
        field = f"match.{name}"
        if name == "hostname":
            ok, what = isinstance(value, str) and _HOSTNAME.fullmatch(value), HOSTNAME_TEXT
        elif name == "project":
            ok, what = isinstance(value, str) and _PROJECT.fullmatch(value), PROJECT_TEXT
        elif name == "user":
            ok, what = isinstance(value, str) and _USER.fullmatch(value), USER_TEXT
        else:
            ok = isinstance(value, str) and _MATCH_VALUE.fullmatch(value)
            what = f"1-{limits.PROFILE_MAX} characters without control characters"
        if not ok:
            raise bad(field, value, f"{field} must be {what}")
        out[name] = value
    return out


def _channel_ids(raw: object) -> tuple[str, ...]:
    if isinstance(raw, str) or not isinstance(raw, Sequence) or not raw:
        raise bad("channels", raw, "channels must be a non-empty list of channel ids")
    if not all(isinstance(c, str) for c in raw):
        raise bad("channels", raw, "channels must be a list of channel ids (strings)")
    ids = tuple(dict.fromkeys(raw))
    if len(ids) > MAX_RULE_CHANNELS:
        raise bad("channels", raw, f"a rule names at most {MAX_RULE_CHANNELS} channels")
    return ids


def _url(kind: ChannelType, raw: object) -> str:
    if not isinstance(raw, str) or len(raw) > URL_MAX:
        raise bad("url", raw, f"url must be a string of at most {URL_MAX} characters")
    if kind is ChannelType.APPRISE:
        if not _APPRISE_URL.fullmatch(raw):
            raise bad("url", raw, "url must be an Apprise URL: scheme://... (printable ASCII, no spaces)")
        return raw
    if not _HTTP_URL.fullmatch(raw):
        raise bad(
            "url",
            raw,
            f"url of a {kind.value} channel must be an http(s) URL (http://host[:port]/path), without "
            "credentials or spaces",
        )
    _, _, port = raw.split("://", 1)[1].split("/", 1)[0].split("?", 1)[0].split("#", 1)[0].partition(":")
    if port and int(port) > 65535:
        raise bad("url", raw, "url's port must be 1-65535")
    return raw


def _secret(raw: object) -> str:
    if not isinstance(raw, str) or not _SECRET.fullmatch(raw):
        raise bad(
            "secret",
            "(not shown)",
            "secret must be whsec_ and the base64 of 24-66 random bytes (Standard Webhooks); leave it "
            "out to have one generated",
        )
    try:
        base64.b64decode(raw.removeprefix("whsec_"), validate=True)
    except (binascii.Error, ValueError):  # pragma: no cover - the pattern admits only base64
        raise bad("secret", "(not shown)", "secret must be whsec_ and base64") from None
    return raw


def _stable_id(prefix: str, org: str, given: str) -> str:
    """An id of the default file's row: readable (`chn_file_acme_ops`) where it fits the id column,
    else a digest of the same two names (stable across restarts either way)."""
    readable = f"{prefix}_file_{org}_{given}"
    if len(readable) <= ID_MAX:
        return readable
    digest = hashlib.sha256(f"{org}\0{given}".encode()).hexdigest()[:24]
    return f"{prefix}_file_{digest}"


@dataclass(frozen=True, slots=True)
class DefaultsLoaded:
    """What `load_defaults` changed."""

    orgs: int
    channels_written: int
    rules_written: int
    removed: int


@dataclass(frozen=True, slots=True)
class Firing:
    """A rule firing on an execution now: an open episode that fired."""

    rule_id: str
    kind: str
    severity: str
    since: datetime  # when it fired
    stop_requested: bool  # the episode's stop request was stored


@dataclass(frozen=True, slots=True)
class ExecutionAlerts:
    """An execution's live alert state, as its page shows it."""

    execution_id: str
    snoozed_until: datetime | None  # a snooze still in force
    firing: list[Firing]


class AlertService:
    """Rules, channels, snoozes and deliveries of an org, over the registry's alert tables."""

    def __init__(
        self,
        store: AlertStore,
        *,
        clock: Callable[[], datetime] = utcnow,
        tester: ChannelTester | None = None,
    ) -> None:
        self.store = store
        self.clock = clock
        # Sends a `channel.test` event to one channel: (delivered, error). Set by whoever runs the
        # deliveries (service/alerts/deliver.py); None: POST .../test answers 503.
        self.tester = tester

    # ------------------------------------------------------------------ callers

    @staticmethod
    def org_for(principal: Principal) -> str:
        """The org whose alerts the caller manages: its own; a key limited to projects manages none
        (a channel would receive events about every project of the org)."""
        if principal.projects is not None:
            raise Forbidden(PROJECT_KEYS)
        return principal.org

    # ------------------------------------------------------------------ rules

    def validate_rule(
        self,
        org: str,
        *,
        kind: object,
        for_: object = None,
        channels: object,
        severity: object = None,
        action: object = None,
        match: object = None,
        every: object = None,
        min_idle_gpu_hours: object = None,
        known_channels: Sequence[Channel] = (),
        rule_id: str | None = None,
    ) -> AlertRule:
        """The rule the fields describe, checked (422 naming the field); `known_channels`: the org's.

        A finding rule (`kind` a finding kind) needs `for` and takes no `every`; a digest (`kind`
        "digest") needs `every`, may set `min_idle_gpu_hours`, and takes neither `for` nor `action`.
        A per-user channel (its URL carries `{user}`) takes digests only; Alertmanager takes no
        digest (a table is no alert)."""
        kind = _text("kind", kind, RULE_KINDS)
        digest = kind == DIGEST
        every_ms = threshold = None
        for_ms = 0
        if digest:
            if for_ is not None:
                raise bad("for", for_, "a digest rule has no `for`: its period is `every`")
            every_ms = _every(every)
            threshold = _idle_threshold(min_idle_gpu_hours)
            if action is not None:
                raise bad("action", action, "a digest rule takes no action")
        else:
            if every is not None:
                raise bad("every", every, "every is for digest rules only (kind: digest)")
            if min_idle_gpu_hours is not None:
                raise bad(
                    "min_idle_gpu_hours", min_idle_gpu_hours, "min_idle_gpu_hours is for digest rules only"
                )
            if for_ is None:
                raise bad("for", None, "for is required: how long a finding lasts before the rule fires")
            for_ms = _duration("for", for_)
        if severity is not None:
            severity = _text("severity", severity, SEVERITIES)
        else:
            severity = "info" if digest else catalog.INSIGHT_SEVERITY[kind]
        ids = _channel_ids(channels)
        known = {c.channel_id: c for c in known_channels}
        for channel_id in ids:
            if channel_id not in known:
                raise bad(
                    "channels", list(ids), f"channels: {channel_id!r} is not a channel of this organization"
                )
            channel = known[channel_id]
            if digest and channel.type is ChannelType.ALERTMANAGER:
                raise bad(
                    "channels",
                    list(ids),
                    f"channels: {channel_id!r} is an Alertmanager channel: a digest goes to webhook and "
                    "Apprise channels",
                )
            if not digest and per_user(channel.url):
                raise bad(
                    "channels",
                    list(ids),
                    f"channels: {channel_id!r} is a per-user channel (its URL carries {USER_PLACEHOLDER}): "
                    "it takes digests only",
                )
        return AlertRule(
            rule_id=rule_id or new_id("rul"),
            org=org,
            kind=kind,
            for_ms=for_ms,
            channels=ids,
            severity=severity,
            action=None if digest else _action(action),
            match=_match(match),
            created_at=self.clock(),
            source="file" if rule_id is not None and is_file_row(rule_id) else "api",
            every_ms=every_ms,
            min_idle_gpu_hours=threshold,
        )

    async def create_rule(
        self,
        org: str,
        *,
        kind: object,
        for_: object = None,
        channels: object,
        severity: object = None,
        action: object = None,
        match: object = None,
        every: object = None,
        min_idle_gpu_hours: object = None,
    ) -> AlertRule:
        existing = await run_sync(self.store.channels, org)
        rule = self.validate_rule(
            org,
            kind=kind,
            for_=for_,
            channels=channels,
            severity=severity,
            action=action,
            match=match,
            every=every,
            min_idle_gpu_hours=min_idle_gpu_hours,
            known_channels=existing,
        )
        if len(await run_sync(self.store.rules, org)) >= MAX_RULES:
            raise Conflict(f"an organization has at most {MAX_RULES} alert rules: delete one first")
        await run_sync(self.store.registry.ensure_org, org)
        return await run_sync(self.store.add_rule, rule)

    async def list_rules(self, org: str) -> list[AlertRule]:
        return await run_sync(self.store.rules, org)

    async def get_rule(self, org: str, rule_id: str) -> AlertRule:
        rule = None if len(rule_id) > ID_MAX else await run_sync(self.store.get_rule, org, rule_id)
        if rule is None:
            raise NotFound(RULE_NOT_FOUND)
        return rule

    async def delete_rule(self, org: str, rule_id: str) -> AlertRule:
        rule = await self.get_rule(org, rule_id)
        if not await run_sync(self.store.delete_rule, org, rule_id):
            raise NotFound(RULE_NOT_FOUND)  # deleted in between
        return rule

    # ------------------------------------------------------------------ channels

    def validate_channel(
        self, org: str, *, type: object, url: object, secret: object = None, channel_id: str | None = None
    ) -> Channel:
        """The channel the fields describe, checked (422 naming the field); a webhook without a
        secret gets a new one."""
        try:
            kind = ChannelType(str(type) if isinstance(type, str) else "")
        except ValueError:
            raise bad(
                "type", type, f"type must be one of {', '.join(t.value for t in ChannelType)}"
            ) from None
        checked_url = _url(kind, url)
        if kind is ChannelType.WEBHOOK:
            checked_secret: str | None = new_webhook_secret() if secret is None else _secret(secret)
        elif secret is not None:
            raise bad("secret", "(not shown)", "secret is only for webhook channels")
        else:
            checked_secret = None
        return Channel(
            channel_id=channel_id or new_id("chn"),
            org=org,
            type=kind,
            url=checked_url,
            secret=checked_secret,
            created_at=self.clock(),
        )

    async def create_channel(self, org: str, *, type: object, url: object, secret: object = None) -> Channel:
        """A new channel of the org, with its secret (shown this once: lists never carry it)."""
        channel = self.validate_channel(org, type=type, url=url, secret=secret)
        if len(await run_sync(self.store.channels, org)) >= MAX_CHANNELS:
            raise Conflict(f"an organization has at most {MAX_CHANNELS} alert channels: delete one first")
        await run_sync(self.store.registry.ensure_org, org)
        return await run_sync(self.store.add_channel, channel)

    async def list_channels(self, org: str) -> list[Channel]:
        return await run_sync(self.store.channels, org)

    async def get_channel(self, org: str, channel_id: str) -> Channel:
        found = None if len(channel_id) > ID_MAX else await run_sync(self.store.get_channel, org, channel_id)
        if found is None:
            raise NotFound(CHANNEL_NOT_FOUND)
        return found

    async def delete_channel(self, org: str, channel_id: str) -> Channel:
        """Delete a channel no rule uses (409 naming the rules that do)."""
        channel = await self.get_channel(org, channel_id)
        users = [r.rule_id for r in await run_sync(self.store.rules, org) if channel_id in r.channels]
        if users:
            raise Conflict(
                f"channel {channel_id} is used by the rules {', '.join(users)}: delete them, or remove the "
                "channel from them, first"
            )
        if not await run_sync(self.store.delete_channel, org, channel_id):
            raise NotFound(CHANNEL_NOT_FOUND)
        return channel

    async def test_channel(self, org: str, channel_id: str) -> tuple[bool, str | None]:
        """Send a `channel.test` event to the channel now: (delivered, error)."""
        channel = await self.get_channel(org, channel_id)
        if self.tester is None:
            raise DeliveryNotRunning("delivery is not running")
        ok, error = await self.tester(channel)
        if ok and channel.failing_since is not None:  # a channel that works again is enabled again
            await run_sync(self.store.channel_succeeded, channel.channel_id)
        return ok, error

    # ------------------------------------------------------------------ snoozes

    async def snooze(self, org: str, execution_id: str, until: object) -> datetime:
        """No stop request for the org's execution until `until` (future, at most 30 days ahead)."""
        if not isinstance(until, datetime):
            raise bad("until", until, "until must be an RFC 3339 date-time")
        try:
            when = checked_datetime(until)
        except ValueError:
            raise bad("until", until.isoformat(), f"until must lie {TIMESTAMP_RANGE}") from None
        await self._execution(org, execution_id)
        now = self.clock()
        if when <= now:
            raise bad("until", when.isoformat(), "until must be in the future")
        if when - now > MAX_SNOOZE:
            raise bad("until", when.isoformat(), f"until must be at most {MAX_SNOOZE.days} days ahead")
        await run_sync(self.store.snooze, org, execution_id, when, now)
        return when

    async def execution_state(self, org: str, execution_id: str) -> ExecutionAlerts:
        """The org's execution's live alert state: its snooze (while it lasts) and the rules firing on
        it now (open episodes that fired), oldest first."""
        await self._execution(org, execution_id)
        episodes = await run_sync(self.store.episodes_for, org, execution_id)
        snoozed = (await run_sync(self.store.snoozed_until, [execution_id])).get(execution_id)
        if snoozed is not None and snoozed <= self.clock():
            snoozed = None
        rules = {r.rule_id: r for r in await run_sync(self.store.rules, org)} if episodes else {}
        firing = [
            Firing(
                rule_id=e.rule_id,
                kind=rules[e.rule_id].kind,
                severity=rules[e.rule_id].severity,
                since=e.fired_at,
                stop_requested=e.stop_event_id is not None,
            )
            for e in episodes
            if e.rule_id in rules and e.fired_at is not None
        ]
        return ExecutionAlerts(execution_id, snoozed, firing)

    async def _execution(self, org: str, execution_id: object) -> None:
        """NotFound unless `execution_id` is an execution of the org (another org's: the same words)."""
        execution = None
        if isinstance(execution_id, str) and _EXECUTION_ID.fullmatch(execution_id):
            execution = await run_sync(self.store.registry.get_execution, execution_id)
        if execution is None or execution.org != org:
            raise NotFound(EXECUTION_NOT_FOUND)

    # ------------------------------------------------------------------ deliveries

    async def list_deliveries(
        self, org: str, status: DeliveryStatus | str | None = None, limit: int = 100
    ) -> list[Delivery]:
        """The org's deliveries, newest first."""
        wanted = None
        if status is not None:
            try:
                wanted = DeliveryStatus(status)
            except ValueError:
                choices = ", ".join(s.value for s in DeliveryStatus)
                raise InvalidParameter(
                    "query", "status", status, f"status must be one of {choices}"
                ) from None
        return await run_sync(self.store.deliveries, org, wanted, max(1, min(limit, 500)))

    async def retry_delivery(self, org: str, delivery_id: str) -> Delivery:
        """A delivery made pending again, due now (its event and the event's id unchanged)."""
        retried = None
        if len(delivery_id) <= ID_MAX:
            retried = await run_sync(self.store.retry_delivery, org, delivery_id, self.clock())
        if retried is None:
            raise NotFound(DELIVERY_NOT_FOUND)
        return retried

    # ------------------------------------------------------------------ the operator's defaults

    def load_defaults(self, path: Path) -> DefaultsLoaded:
        """Bring the registry in line with the operator's TOML file (GPULENS_ALERTS; docs/alerts.md,
        "Operator defaults"): its channels and rules are written under stable ids (a changed row is
        written over, so its episodes and deliveries survive a restart or an edit) and the file's rows
        it no longer lists are removed. Raises InvalidRequest naming the file and the entry."""
        try:
            data = tomllib.loads(path.read_text(encoding="utf-8"))
        except OSError as exc:
            raise InvalidRequest(f"GPULENS_ALERTS: cannot read {path}: {exc.strerror}") from None
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise InvalidRequest(f"GPULENS_ALERTS: {path} is not valid TOML: {exc}") from None
        wanted = self._parse_defaults(path, data)
        written_channels = written_rules = removed = 0
        for org, (channels, rules) in wanted.items():
            self.store.registry.ensure_org(org)
            have_channels = {c.channel_id: c for c in self.store.channels(org)}
            have_rules = {r.rule_id: r for r in self.store.rules(org)}
            for channel in channels:
                old = have_channels.get(channel.channel_id)
                if old is not None and (old.type, old.url, old.secret) == (
                    channel.type,
                    channel.url,
                    channel.secret,
                ):
                    continue
                self.store.add_channel(channel)  # written over the old row: its deliveries stay
                written_channels += 1
            for rule in rules:
                old_rule = have_rules.get(rule.rule_id)
                if old_rule is not None and _same_rule(old_rule, rule):
                    continue
                self.store.add_rule(rule)  # written over the old row: its episodes stay
                written_rules += 1
            keep = {r.rule_id for r in rules} | {c.channel_id for c in channels}
            for rule_id in have_rules:
                if is_file_row(rule_id) and rule_id not in keep:
                    removed += self.store.delete_rule(org, rule_id)
            in_use = {c for r in self.store.rules(org) for c in r.channels}
            for channel_id in have_channels:
                if is_file_row(channel_id) and channel_id not in keep:
                    if channel_id in in_use:
                        log.warning(
                            "alerts file: channel %s is gone from %s but rules use it", channel_id, path
                        )
                        continue
                    removed += self.store.delete_channel(org, channel_id)
        loaded = DefaultsLoaded(len(wanted), written_channels, written_rules, removed)
        log.info(
            "alerts file %s: %d orgs; %d channels and %d rules written, %d removed",
            path,
            loaded.orgs,
            loaded.channels_written,
            loaded.rules_written,
            loaded.removed,
        )
        return loaded

    def _parse_defaults(
        self, path: Path, data: Mapping[str, Any]
    ) -> dict[str, tuple[list[Channel], list[AlertRule]]]:
        def fail(where: str, message: str) -> InvalidRequest:
            return InvalidRequest(f"GPULENS_ALERTS {path}: {where}: {message}")

        unknown = set(data) - {"org"}
        if unknown:
            raise fail("top level", f"unknown keys {sorted(unknown)}; expected [[org]] tables")
        orgs = data.get("org", [])
        if not isinstance(orgs, list):
            raise fail("org", "must be an array of tables: [[org]]")
        out: dict[str, tuple[list[Channel], list[AlertRule]]] = {}
        for i, entry in enumerate(orgs):
            where = f"org[{i}]"
            if not isinstance(entry, dict):
                raise fail(where, "must be a table")
            extra = set(entry) - {"slug", "channel", "rule"}
            if extra:
                raise fail(
                    where, f"unknown keys {sorted(extra)}; expected slug, [[org.channel]], [[org.rule]]"
                )
            org = entry.get("slug")
            if not isinstance(org, str) or not _ORG.fullmatch(org):
                raise fail(f"{where}.slug", f"must be {ORG_SLUG_TEXT}")
            if org in out:
                raise fail(f"{where}.slug", f"org {org} is listed twice")
            channels: list[Channel] = []
            given_ids: dict[str, str] = {}
            for j, raw in enumerate(_tables(entry.get("channel", []), f"{where}.channel", fail)):
                spot = f"{where}.channel[{j}]"
                extra = set(raw) - {"id", "type", "url", "secret"}
                if extra:
                    raise fail(spot, f"unknown keys {sorted(extra)}")
                given = raw.get("id")
                if not isinstance(given, str) or not _FILE_ID.fullmatch(given):
                    raise fail(f"{spot}.id", "must be 1-40 characters of [A-Za-z0-9_-]")
                if given in given_ids:
                    raise fail(f"{spot}.id", f"channel {given} is listed twice")
                if raw.get("type") == ChannelType.WEBHOOK.value and raw.get("secret") is None:
                    raise fail(
                        f"{spot}.secret",
                        "a webhook channel of the file needs its secret (whsec_...): its receiver checks "
                        "signatures with it",
                    )
                channel_id = _stable_id("chn", org, given)
                try:
                    channel = self.validate_channel(
                        org,
                        type=raw.get("type"),
                        url=raw.get("url"),
                        secret=raw.get("secret"),
                        channel_id=channel_id,
                    )
                except InvalidParameter as exc:
                    raise fail(spot, exc.message) from None
                given_ids[given] = channel_id
                channels.append(channel)
            rules: list[AlertRule] = []
            for k, raw in enumerate(_tables(entry.get("rule", []), f"{where}.rule", fail)):
                spot = f"{where}.rule[{k}]"
                extra = set(raw) - {
                    "kind",
                    "for",
                    "channels",
                    "severity",
                    "action",
                    "match",
                    "every",
                    "min_idle_gpu_hours",
                }
                if extra:
                    raise fail(spot, f"unknown keys {sorted(extra)}")
                names = raw.get("channels")
                ids = [given_ids.get(n, n) for n in names] if isinstance(names, list) else names
                try:
                    rule = self.validate_rule(
                        org,
                        kind=raw.get("kind"),
                        for_=raw.get("for"),
                        channels=ids,
                        severity=raw.get("severity"),
                        action=raw.get("action"),
                        match=raw.get("match"),
                        every=raw.get("every"),
                        min_idle_gpu_hours=raw.get("min_idle_gpu_hours"),
                        known_channels=channels,
                        rule_id=_stable_id("rul", org, str(k + 1)),
                    )
                except InvalidParameter as exc:
                    message = exc.message
                    if exc.name == "channels":
                        message += " (name a channel of this org's [[org.channel]] tables by its id)"
                    raise fail(spot, message) from None
                rules.append(rule)
            out[org] = (channels, rules)
        return out


def _tables(raw: object, where: str, fail: Callable[[str, str], InvalidRequest]) -> list[dict[str, Any]]:
    if not isinstance(raw, list) or not all(isinstance(t, dict) for t in raw):
        raise fail(where, "must be an array of tables")
    return raw


def _same_rule(old: AlertRule, new: AlertRule) -> bool:
    """The same rule but for when it was written."""
    return replace(old, created_at=None, source="") == replace(new, created_at=None, source="")
