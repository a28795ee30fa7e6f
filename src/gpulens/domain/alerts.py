"""Live alerts: rules on running executions, the channels events go to, the events and their
deliveries (docs/alerts.md). Value types only; the registry keeps them (storage/alerts.py)."""

from __future__ import annotations

import base64
import enum
import secrets
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from gpulens.domain import catalog as c

FINDING_KINDS = tuple(sorted(c.INSIGHT_SEVERITY))  # what a rule may watch: the summary's finding kinds
DIGEST = "digest"  # the rule kind that sends the period's usage table (docs/alerts.md, "Digests")
RULE_KINDS = (*FINDING_KINDS, DIGEST)
USER_PLACEHOLDER = "{user}"  # in a channel's URL: a per-user channel, filled with each digest's user
SEVERITIES = ("info", "warning", "critical")
MATCH_FIELDS = ("hardware_profile", "hostname", "project", "user")  # an execution's fields a rule may match
ID_MAX = 40  # rule, channel, event and delivery ids (the tables' id columns)


class ChannelType(enum.StrEnum):
    WEBHOOK = "webhook"
    ALERTMANAGER = "alertmanager"
    APPRISE = "apprise"


class EventType(enum.StrEnum):
    FIRING = "finding.firing"
    RESOLVED = "finding.resolved"
    STOP_REQUESTED = "execution.stop_requested"
    TEST = "channel.test"
    DIGEST = "usage.digest"
    JOB_REPORT = "execution.report"  # a finished job's receipt and findings, for its owner


class DeliveryStatus(enum.StrEnum):
    PENDING = "pending"
    DELIVERED = "delivered"
    FAILED = "failed"


def per_user(url: str) -> bool:
    """A channel whose URL carries `{user}`: it receives each user's digest, at the URL filled with the
    user's name, and nothing else."""
    return USER_PLACEHOLDER in url


def new_id(prefix: str) -> str:
    """`<prefix>_<22 url-safe characters>`: ids of rules, channels, events and deliveries."""
    return f"{prefix}_{secrets.token_urlsafe(16)}"


def new_webhook_secret() -> str:
    """A Standard Webhooks secret: `whsec_` and 32 random bytes in base64."""
    return "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode("ascii")


@dataclass(frozen=True, slots=True)
class StopAction:
    """Warn, then stop: `execution.stop_requested` when the episode still holds `after_ms` after firing."""

    after_ms: int


@dataclass(frozen=True, slots=True)
class AlertRule:
    rule_id: str
    org: str
    kind: str  # one of RULE_KINDS
    for_ms: int  # how long an episode lasts before it fires (0 for a digest)
    channels: tuple[str, ...]  # channel ids of the org
    severity: str = "warning"
    action: StopAction | None = None
    match: dict[str, str] = field(default_factory=dict)  # MATCH_FIELDS -> exact value
    cooldown_ms: int = 3_600_000  # between two firings of the rule on one execution
    created_at: datetime | None = None
    source: str = "api"  # "api", or "file" for the operator's defaults (GPULENS_ALERTS)
    every_ms: int | None = None  # a digest: its period
    min_idle_gpu_hours: float | None = None  # a digest: a user's idle GPU-hours that earn their copy

    @property
    def is_digest(self) -> bool:
        return self.kind == DIGEST

    def matches(self, fields: dict[str, str | None]) -> bool:
        return all(fields.get(name) == value for name, value in self.match.items())


@dataclass(frozen=True, slots=True)
class Channel:
    channel_id: str
    org: str
    type: ChannelType
    url: str
    secret: str | None = None  # webhooks: the signing secret (never shown after creation)
    created_at: datetime | None = None
    failing_since: datetime | None = None  # the first failed attempt since the last success
    disabled_at: datetime | None = None  # failed for the whole retry period: no more deliveries
    disabled_reason: str | None = None


@dataclass(frozen=True, slots=True)
class AlertEvent:
    """One event, as every channel receives it (the id is stable across retries)."""

    event_id: str
    org: str
    type: EventType
    created_at: datetime
    execution_id: str | None
    rule_id: str | None
    payload: dict[str, Any]  # the webhook body (docs/alerts.md), also what the other channels render


@dataclass(frozen=True, slots=True)
class Delivery:
    delivery_id: str
    event_id: str
    channel_id: str
    org: str
    status: DeliveryStatus
    attempts: int
    created_at: datetime
    next_attempt_at: datetime | None
    last_error: str | None = None
    delivered_at: datetime | None = None
