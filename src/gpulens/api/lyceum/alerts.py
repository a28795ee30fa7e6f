"""Live alerts' routes (`/api/v2/external/alerts/...`, docs/alerts.md): the caller's org's rules,
channels, deliveries and snoozes, in the Lyceum dialect (`{"detail": ...}` errors, 422 for a field).

The bodies' shapes are checked here (unknown fields refused); what they mean (kinds, durations,
URLs, the org's channel ids, times) by service/alerts/rules.py, which the CLI and the operator's
default file share."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Path, Query
from pydantic import BaseModel, ConfigDict, Field

from gpulens.api.deps import Caller, Ctx
from gpulens.api.responses import AUTH, BODY, DURATION_PATTERN, TENANT, Timestamp, lyceum_errors
from gpulens.domain import limits
from gpulens.domain.alerts import (
    DIGEST,
    FINDING_KINDS,
    ID_MAX,
    RULE_KINDS,
    AlertRule,
    Channel,
    Delivery,
    DeliveryStatus,
)
from gpulens.domain.models import EXECUTION_ID_RE, HOSTNAME_RE, PROJECT_RE, USER_RE
from gpulens.domain.timeparse import format_duration_ms, format_optional, format_rfc3339
from gpulens.service.alerts.rules import (
    APPRISE_URL_PATTERN,
    HTTP_URL_PATTERN,
    MATCH_VALUE_PATTERN,
    MAX_IDLE_THRESHOLD,
    MAX_RULE_CHANNELS,
    URL_MAX,
    WEBHOOK_SECRET_PATTERN,
    display_url,
    is_file_row,
)

router = APIRouter(prefix="/api/v2/external/alerts", tags=["Alerts"], responses=lyceum_errors(*AUTH))

RuleId = Annotated[str, Path(title="Rule Id", max_length=ID_MAX)]
ChannelId = Annotated[str, Path(title="Channel Id", max_length=ID_MAX)]
DeliveryId = Annotated[str, Path(title="Delivery Id", max_length=ID_MAX)]

DURATION_TEXT = (
    "A duration such as 30m, 2h or 1h30m (Prometheus units ms, s, m, h, d; also seconds as a number), "
    "at most 30 days"
)


def _pattern(pattern: str, description: str | None = None) -> dict[str, Any]:
    """A string's pattern for the document only: the service checks the value and says what is wrong
    in words (a pattern in the model would answer with the regular expression)."""
    extra: dict[str, Any] = {"pattern": pattern}
    if description:
        extra["description"] = description
    return extra


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


# ------------------------------------------------------------------ rules


class StopActionBody(Strict):
    """Warn, then ask the scheduler to stop the execution when the episode still holds `after` after
    the rule fired (an `execution.stop_requested` event; dryRun unless GPULENS_ACTIONS=enforce)."""

    type: Literal["stop"]
    after: str = Field(max_length=32, json_schema_extra=_pattern(DURATION_PATTERN, DURATION_TEXT))


class RuleMatch(Strict):
    """The running executions a rule concerns: those whose fields equal every one given."""

    hardware_profile: str | None = Field(
        None, max_length=limits.PROFILE_MAX, json_schema_extra=_pattern(MATCH_VALUE_PATTERN)
    )
    hostname: str | None = Field(
        None, max_length=limits.HOSTNAME_MAX, json_schema_extra=_pattern(f"^{HOSTNAME_RE}$")
    )
    project: str | None = Field(
        None, max_length=limits.PROJECT_MAX, json_schema_extra=_pattern(f"^{PROJECT_RE}$")
    )
    user: str | None = Field(None, max_length=limits.USER_MAX, json_schema_extra=_pattern(f"^{USER_RE}$"))


def _rule_variants(schema: dict[str, Any]) -> None:
    """The two kinds of rule the one body model takes, for the document: a finding rule names a finding
    kind and `for` (no digest field); a digest names `every` (neither `for` nor `action`). The service
    says which field is wrong in words; the model only checks each field's shape."""
    schema["oneOf"] = [
        {
            "title": "Finding rule",
            "properties": {
                "kind": {"enum": list(FINDING_KINDS)},
                "for": {"type": "string"},
                "every": {"type": "null"},
                "min_idle_gpu_hours": {"type": "null"},
            },
            "required": ["kind", "for"],
        },
        {
            "title": "Digest rule",
            "properties": {
                "kind": {"const": DIGEST},
                "every": {"type": "string"},
                "for": {"type": "null"},
                "action": {"type": "null"},
            },
            "required": ["kind", "every"],
        },
    ]


class RuleCreate(Strict):
    """A finding rule (`kind` a finding kind, with `for`) or a usage digest (`kind: digest`, with
    `every` and `min_idle_gpu_hours`; docs/alerts.md, "Digests")."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, json_schema_extra=_rule_variants)

    kind: str = Field(
        max_length=40,
        description="The finding kind the rule watches (docs/insights.md), or `digest`",
        json_schema_extra={"enum": list(RULE_KINDS)},
    )
    for_: str | None = Field(
        None,
        alias="for",
        max_length=32,
        json_schema_extra=_pattern(
            DURATION_PATTERN,
            "How long a finding lasts before the rule fires (required, finding rules only). " + DURATION_TEXT,
        ),
    )
    every: str | None = Field(
        None,
        max_length=32,
        json_schema_extra=_pattern(
            DURATION_PATTERN,
            "A digest's period (required, digests only): at least 1h. " + DURATION_TEXT,
        ),
    )
    min_idle_gpu_hours: float | None = Field(
        None,
        ge=0,
        le=MAX_IDLE_THRESHOLD,
        description="A digest's threshold: a user receives their digest when their idle and idle-held "
        "GPU-hours of the period reach it (default 0: every user with usage)",
    )
    channels: list[Annotated[str, Field(max_length=ID_MAX)]] = Field(
        min_length=1,
        max_length=MAX_RULE_CHANNELS,
        description="Ids of channels of the caller's organization (a digest: per-user channels, whose URL "
        "carries {user}, receive each user's digest; the others the copy with the whole table)",
    )
    severity: Literal["info", "warning", "critical"] | None = Field(
        None, description="Default: the finding kind's own severity (a digest's: info)"
    )
    action: StopActionBody | None = None
    match: RuleMatch | None = None


class StopActionItem(BaseModel):
    type: Literal["stop"]
    after: str


class RuleItem(BaseModel):
    model_config = ConfigDict(populate_by_name=True)

    id: str
    kind: str
    for_: str | None = Field(
        alias="for", description="The duration, in its shortest form (90m reads 1h30m); null for a digest"
    )
    every: str | None = Field(description="A digest's period, in its shortest form; null for other rules")
    min_idle_gpu_hours: float | None = Field(description="A digest's threshold; null for other rules")
    channels: list[str]
    severity: str
    action: StopActionItem | None
    match: dict[str, str]
    source: Literal["api", "file"] = Field(description="file: the operator's defaults (GPULENS_ALERTS)")
    created_at: str | None


def rule_item(rule: AlertRule) -> RuleItem:
    action = None
    if rule.action is not None:
        action = StopActionItem(type="stop", after=format_duration_ms(rule.action.after_ms))
    return RuleItem(
        id=rule.rule_id,
        kind=rule.kind,
        for_=None if rule.is_digest else format_duration_ms(rule.for_ms),
        every=None if rule.every_ms is None else format_duration_ms(rule.every_ms),
        min_idle_gpu_hours=rule.min_idle_gpu_hours,
        channels=list(rule.channels),
        severity=rule.severity,
        action=action,
        match=dict(rule.match),
        source="file" if is_file_row(rule.rule_id) else "api",
        created_at=format_optional(rule.created_at),
    )


# ------------------------------------------------------------------ channels


class WebhookChannelCreate(Strict):
    """Standard Webhooks: a signed JSON POST of each event to `url`."""

    type: Literal["webhook"]
    url: str = Field(max_length=URL_MAX, json_schema_extra=_pattern(HTTP_URL_PATTERN))
    secret: str | None = Field(
        None,
        max_length=128,
        json_schema_extra=_pattern(
            WEBHOOK_SECRET_PATTERN,
            "The signing secret (whsec_ and base64); generated when absent. Shown once, in this answer",
        ),
    )


class AlertmanagerChannelCreate(Strict):
    """A Prometheus Alertmanager (its base URL): events become alerts."""

    type: Literal["alertmanager"]
    url: str = Field(max_length=URL_MAX, json_schema_extra=_pattern(HTTP_URL_PATTERN))


class AppriseChannelCreate(Strict):
    """Any Apprise URL (Slack, Teams, email, ntfy, ...): https://github.com/caronc/apprise/wiki"""

    type: Literal["apprise"]
    url: str = Field(max_length=URL_MAX, json_schema_extra=_pattern(APPRISE_URL_PATTERN))


ChannelCreate = Annotated[
    WebhookChannelCreate | AlertmanagerChannelCreate | AppriseChannelCreate, Field(discriminator="type")
]


class ChannelItem(BaseModel):
    id: str
    type: str
    url: str = Field(description="Where events go, without the tokens it may carry")
    source: Literal["api", "file"]
    created_at: str | None
    failing_since: str | None = Field(description="The first failed attempt since the last success")
    disabled_at: str | None = Field(description="Failed for the whole retry period: no more deliveries")
    disabled_reason: str | None


class ChannelCreated(ChannelItem):
    secret: str | None = Field(description="The webhook's signing secret: shown this once, never listed")


def channel_item(channel: Channel) -> ChannelItem:
    return ChannelItem(
        id=channel.channel_id,
        type=channel.type.value,
        url=display_url(channel),
        source="file" if is_file_row(channel.channel_id) else "api",
        created_at=format_optional(channel.created_at),
        failing_since=format_optional(channel.failing_since),
        disabled_at=format_optional(channel.disabled_at),
        disabled_reason=channel.disabled_reason,
    )


class ChannelTest(BaseModel):
    ok: bool = Field(description="The channel took the test event")
    error: str | None = Field(description="Why not, when it did not")


# ------------------------------------------------------------------ deliveries, snoozes


class DeliveryItem(BaseModel):
    id: str
    event_id: str = Field(description="The event's id: the same on every attempt")
    channel_id: str
    status: str
    attempts: int
    created_at: str
    next_attempt_at: str | None
    delivered_at: str | None
    last_error: str | None


def delivery_item(delivery: Delivery) -> DeliveryItem:
    return DeliveryItem(
        id=delivery.delivery_id,
        event_id=delivery.event_id,
        channel_id=delivery.channel_id,
        status=delivery.status.value,
        attempts=delivery.attempts,
        created_at=format_rfc3339(delivery.created_at),
        next_attempt_at=format_optional(delivery.next_attempt_at),
        delivered_at=format_optional(delivery.delivered_at),
        last_error=delivery.last_error,
    )


class SnoozeCreate(Strict):
    execution_id: str = Field(
        max_length=limits.EXECUTION_ID_MAX, json_schema_extra=_pattern(f"^{EXECUTION_ID_RE}$")
    )
    until: Timestamp = Field(
        description="No stop request for the execution before then: future, at most 30 days ahead"
    )


class Snoozed(BaseModel):
    execution_id: str
    until: str


class FiringItem(BaseModel):
    rule_id: str
    kind: str = Field(description="The finding kind the rule watches")
    severity: str = Field(description="The rule's severity")
    since: str = Field(description="When the rule fired on the execution (RFC 3339)")
    stop_requested: bool = Field(description="The rule's stop request for this episode was sent")


class ExecutionAlertsItem(BaseModel):
    execution_id: str
    snoozed_until: str | None = Field(description="No stop request before then (a snooze in force)")
    firing: list[FiringItem] = Field(description="The rules firing on the execution now, oldest first")


class Deleted(BaseModel):
    id: str
    message: str


# ------------------------------------------------------------------ routes


@router.post("/rules", status_code=201, summary="Create alert rule", responses=lyceum_errors(*BODY, 403, 409))
async def create_rule(ctx: Ctx, caller: Caller, body: RuleCreate) -> RuleItem:
    org = ctx.alerts.org_for(caller)
    rule = await ctx.alerts.create_rule(
        org,
        kind=body.kind,
        for_=body.for_,
        channels=body.channels,
        severity=body.severity,
        action=None if body.action is None else body.action.model_dump(),
        match=None if body.match is None else body.match.model_dump(exclude_none=True),
        every=body.every,
        min_idle_gpu_hours=body.min_idle_gpu_hours,
    )
    return rule_item(rule)


@router.get("/rules", summary="List alert rules", responses=lyceum_errors(403))
async def list_rules(ctx: Ctx, caller: Caller) -> list[RuleItem]:
    return [rule_item(r) for r in await ctx.alerts.list_rules(ctx.alerts.org_for(caller))]


@router.delete("/rules/{rule_id}", summary="Delete alert rule", responses=lyceum_errors(*TENANT))
async def delete_rule(ctx: Ctx, caller: Caller, rule_id: RuleId) -> Deleted:
    rule = await ctx.alerts.delete_rule(ctx.alerts.org_for(caller), rule_id)
    return Deleted(id=rule.rule_id, message="Alert rule deleted")


@router.post(
    "/channels", status_code=201, summary="Create alert channel", responses=lyceum_errors(*BODY, 403, 409)
)
async def create_channel(ctx: Ctx, caller: Caller, body: ChannelCreate) -> ChannelCreated:
    org = ctx.alerts.org_for(caller)
    secret = body.secret if isinstance(body, WebhookChannelCreate) else None
    channel = await ctx.alerts.create_channel(org, type=body.type, url=body.url, secret=secret)
    shown = channel_item(channel)
    return ChannelCreated(**{**shown.model_dump(), "url": channel.url}, secret=channel.secret)


@router.get("/channels", summary="List alert channels", responses=lyceum_errors(403))
async def list_channels(ctx: Ctx, caller: Caller) -> list[ChannelItem]:
    return [channel_item(c) for c in await ctx.alerts.list_channels(ctx.alerts.org_for(caller))]


@router.delete(
    "/channels/{channel_id}", summary="Delete alert channel", responses=lyceum_errors(*TENANT, 409)
)
async def delete_channel(ctx: Ctx, caller: Caller, channel_id: ChannelId) -> Deleted:
    channel = await ctx.alerts.delete_channel(ctx.alerts.org_for(caller), channel_id)
    return Deleted(id=channel.channel_id, message="Alert channel deleted")


@router.post(
    "/channels/{channel_id}/test",
    summary="Send a test event to a channel",
    responses=lyceum_errors(*TENANT),
)
async def test_channel(ctx: Ctx, caller: Caller, channel_id: ChannelId) -> ChannelTest:
    """A `channel.test` event, sent now; 503 while gpulens sends no deliveries."""
    ok, error = await ctx.alerts.test_channel(ctx.alerts.org_for(caller), channel_id)
    return ChannelTest(ok=ok, error=error)


@router.get("/deliveries", summary="List alert deliveries", responses=lyceum_errors(403))
async def list_deliveries(
    ctx: Ctx,
    caller: Caller,
    status: Annotated[Literal["pending", "delivered", "failed"] | None, Query()] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
) -> list[DeliveryItem]:
    """The org's deliveries, newest first."""
    wanted = None if status is None else DeliveryStatus(status)
    found = await ctx.alerts.list_deliveries(ctx.alerts.org_for(caller), wanted, limit)
    return [delivery_item(d) for d in found]


@router.post(
    "/deliveries/{delivery_id}/retry", summary="Retry an alert delivery", responses=lyceum_errors(*TENANT)
)
async def retry_delivery(ctx: Ctx, caller: Caller, delivery_id: DeliveryId) -> DeliveryItem:
    """The delivery is pending again and due now (the event and its id unchanged)."""
    return delivery_item(await ctx.alerts.retry_delivery(ctx.alerts.org_for(caller), delivery_id))


@router.post(
    "/snooze", summary="Snooze an execution's stop requests", responses=lyceum_errors(*BODY, *TENANT)
)
async def snooze(ctx: Ctx, caller: Caller, body: SnoozeCreate) -> Snoozed:
    until: datetime = await ctx.alerts.snooze(ctx.alerts.org_for(caller), body.execution_id, body.until)
    return Snoozed(execution_id=body.execution_id, until=format_rfc3339(until))


@router.get(
    "/executions/{execution_id}",
    summary="An execution's live alert state",
    responses=lyceum_errors(*TENANT),
)
async def execution_alerts(
    ctx: Ctx, caller: Caller, execution_id: Annotated[str, Path(title="Execution Id")]
) -> ExecutionAlertsItem:
    """The rules firing on the execution now (open episodes that fired) and its snooze, if any."""
    state = await ctx.alerts.execution_state(ctx.alerts.org_for(caller), execution_id)
    return ExecutionAlertsItem(
        execution_id=state.execution_id,
        snoozed_until=format_optional(state.snoozed_until),
        firing=[
            FiringItem(
                rule_id=f.rule_id,
                kind=f.kind,
                severity=f.severity,
                since=format_rfc3339(f.since),
                stop_requested=f.stop_requested,
            )
            for f in state.firing
        ],
    )
