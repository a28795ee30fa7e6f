"""How an alert event looks on each channel type (docs/alerts.md, "Events"). Pure functions: an
`AlertEvent` in, bytes, a JSON-able list or text out; the sender (deliver.py) adds headers and time.

- webhook: the event payload itself (orjson), signed per Standard Webhooks (`webhook_headers`);
- Alertmanager: one alert for `POST /api/v2/alerts`; its labels identify the episode (same labels on
  `finding.firing` and `finding.resolved`, so the resolved post ends the firing alert);
- Apprise: a title and a short plain message (the finding's sentence and the dashboard link).

Payloads are read defensively: a missing field gives a shorter text, never an exception.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson

from gpulens.domain.alerts import AlertEvent, EventType
from gpulens.service.alerts.job_report import number, report_message, report_title

ALERTNAME_FINDING = "GpulensFinding"
ALERTNAME_STOP = "GpulensStopRequested"
ALERTNAME_TEST = "GpulensChannelTest"
SECRET_PREFIX = "whsec_"  # noqa: S105 - the prefix of Standard Webhooks secrets


def _section(payload: dict[str, Any], name: str) -> dict[str, Any]:
    value = payload.get(name)
    return value if isinstance(value, dict) else {}


def _text(value: Any) -> str:
    return "" if value is None else str(value)


def rfc3339(when: datetime) -> str:
    """UTC, second precision or finer, with a `Z` (what Alertmanager and the payloads use)."""
    text = when.astimezone(UTC).isoformat()
    return text.removesuffix("+00:00") + "Z"


# -- webhook --------------------------------------------------------------------------------------------


def webhook_body(event: AlertEvent) -> bytes:
    """The webhook's body: the event payload as JSON (the same bytes on every retry)."""
    return orjson.dumps(event.payload)


def signing_key(secret: str) -> bytes:
    """The HMAC key of a Standard Webhooks secret: base64 after the `whsec_` prefix (padding optional,
    as the reference library reads it)."""
    return base64.b64decode(secret.removeprefix(SECRET_PREFIX) + "==")


def webhook_signature(secret: str, msg_id: str, timestamp: int, body: bytes) -> str:
    """`v1,<base64 HMAC-SHA256 of "{id}.{timestamp}.{body}">` (Standard Webhooks)."""
    signed = f"{msg_id}.{timestamp}.".encode() + body
    digest = hmac.new(signing_key(secret), signed, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode("ascii")


def webhook_headers(event: AlertEvent, body: bytes, timestamp: int, secret: str | None) -> dict[str, str]:
    """The Standard Webhooks headers of one attempt: the event id (stable across retries), the
    attempt's unix time, and the signature (none for a channel without a secret)."""
    headers = {
        "content-type": "application/json",
        "webhook-id": event.event_id,
        "webhook-timestamp": str(timestamp),
    }
    if secret:
        headers["webhook-signature"] = webhook_signature(secret, event.event_id, timestamp, body)
    return headers


# -- shared texts -----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Summary:
    """What the texts of every channel are made of."""

    kind: str
    execution_id: str
    hostname: str
    severity: str
    message: str
    url: str


def summary(event: AlertEvent) -> Summary:
    payload = event.payload
    finding = _section(payload, "finding")
    execution = _section(payload, "execution")
    rule = _section(payload, "rule")
    kind = _text(finding.get("kind") or rule.get("kind"))
    # the rule's severity is the one the org chose (and routes on); the detector's is the fallback
    severity = _text(rule.get("severity") or finding.get("severity") or "warning")
    message = _text(finding.get("message") or payload.get("message"))
    return Summary(
        kind=kind,
        execution_id=_text(execution.get("id") or event.execution_id),
        hostname=_text(execution.get("hostname")),
        severity=severity,
        message=message,
        url=_text(payload.get("url")),
    )


def title(event: AlertEvent) -> str:
    """One line: `gpulens: idle_held on <execution id>` (resolved, stop and test say so)."""
    if event.type is EventType.DIGEST:
        return digest_title(event)
    if event.type is EventType.JOB_REPORT:
        return report_title(event)
    s = summary(event)
    target = s.execution_id or "an execution"
    what = s.kind or "finding"
    if event.type is EventType.RESOLVED:
        return f"gpulens: resolved: {what} on {target}"
    if event.type is EventType.STOP_REQUESTED:
        dry = " (dry run)" if event.payload.get("dryRun") else ""
        return f"gpulens: stop requested{dry} for {target} ({what})"
    if event.type is EventType.TEST:
        return "gpulens: test notification"
    return f"gpulens: {what} on {target}"


def description(event: AlertEvent) -> str:
    """A few facts of the event in one paragraph: host, GPUs, since when, GPU hours, the rule."""
    payload = event.payload
    finding = _section(payload, "finding")
    execution = _section(payload, "execution")
    rule = _section(payload, "rule")
    parts: list[str] = []
    if execution.get("hostname"):
        parts.append(f"host {execution['hostname']}")
    gpus = finding.get("gpus") or execution.get("gpus")
    if isinstance(gpus, list) and gpus:
        parts.append("GPUs " + ", ".join(str(g) for g in gpus))
    if finding.get("start"):
        parts.append(f"since {finding['start']}")
    if event.type is EventType.RESOLVED and finding.get("end"):
        parts.append(f"until {finding['end']}")
    hours = finding.get("gpuHours", _section(finding, "impact").get("gpuHours"))
    if isinstance(hours, int | float) and not isinstance(hours, bool):
        parts.append(f"{hours:.2f} GPU-hours")
    if rule.get("id"):
        held = f" (for {rule['for']})" if rule.get("for") else ""
        parts.append(f"rule {rule['id']}{held}")
    if event.type is EventType.STOP_REQUESTED:
        parts.append("stop requested (dry run)" if payload.get("dryRun") else "stop requested")
    return "; ".join(parts)


def message(event: AlertEvent) -> str:
    """The plain message of chat-like channels: the finding's sentence, the facts, the link."""
    if event.type is EventType.DIGEST:
        return digest_message(event)
    if event.type is EventType.JOB_REPORT:
        return report_message(event)
    s = summary(event)
    lines = [s.message or title(event)]
    facts = description(event)
    if facts:
        lines.append(facts)
    if s.url:
        lines.append(s.url)
    return "\n".join(lines)


# -- Alertmanager ---------------------------------------------------------------------------------------


def alertmanager_alerts(event: AlertEvent, now: datetime, hold: timedelta) -> list[dict[str, Any]]:
    """The body of `POST /api/v2/alerts`: one alert.

    A resolved event ends at the finding's end (else the event's time); a firing one at `now + hold`,
    so Alertmanager keeps it firing that long without another post (a later post, or the resolved
    event, moves the end). A test event lasts `hold` too.
    """
    payload = event.payload
    finding = _section(payload, "finding")
    s = summary(event)
    alertname = {
        EventType.STOP_REQUESTED: ALERTNAME_STOP,
        EventType.TEST: ALERTNAME_TEST,
    }.get(event.type, ALERTNAME_FINDING)
    labels = {
        "alertname": alertname,
        "kind": s.kind,
        "org": event.org,
        "execution_id": s.execution_id,
        "hostname": s.hostname,
        "severity": s.severity,
    }
    alert: dict[str, Any] = {
        # Alertmanager drops empty labels itself; sending none keeps the label set stable
        "labels": {name: value for name, value in labels.items() if value},
        "annotations": {"summary": s.message or title(event), "description": description(event)},
    }
    starts = _text(finding.get("start"))
    if starts:
        alert["startsAt"] = starts
    if event.type is EventType.RESOLVED:
        alert["endsAt"] = _text(finding.get("end") or payload.get("timestamp")) or rfc3339(now)
    else:
        alert["endsAt"] = rfc3339(now + hold)
    if s.url:
        alert["generatorURL"] = s.url
    return [alert]


# -- Apprise ----------------------------------------------------------------------------------------------


def apprise_notify_type(event: AlertEvent) -> str:
    """Apprise's notification type (its icon and colour): success for resolved, failure for critical."""
    if event.type is EventType.RESOLVED:
        return "success"
    if event.type in (EventType.TEST, EventType.DIGEST, EventType.JOB_REPORT):
        return "info"
    severity = summary(event).severity
    return {"critical": "failure", "warning": "warning"}.get(severity, "info")


# -- digests ----------------------------------------------------------------------------------------------

DIGEST_TEXT_ROWS = 20  # users and executions a digest's text lists (the webhook's JSON has them all)


def _day(stamp: Any) -> str:
    """`2026-11-25` of an RFC 3339 time (`2026-11-25 10:00` when not at midnight)."""
    text = _text(stamp)
    day, _, clock = text.partition("T")
    clock = clock[:5]
    return day if clock in ("", "00:00") else f"{day} {clock}"


def _period(payload: dict[str, Any]) -> str:
    period = _section(payload, "period")
    return f"{_day(period.get('start'))} to {_day(period.get('end'))} UTC"


def _cost(row: dict[str, Any], currency: Any) -> str:
    cost = row.get("cost")
    if not isinstance(cost, int | float) or isinstance(cost, bool):
        return ""
    return f"; cost {cost:,.2f}" + (f" {currency}" if currency else "")


def _usage_line(row: dict[str, Any], currency: Any) -> str:
    return (
        f"{number(row.get('gpuHours')):.1f} GPU-hours: {number(row.get('idleGpuHours')):.1f} idle, "
        f"{number(row.get('idleHeldGpuHours')):.1f} idle with memory held, "
        f"{number(row.get('inputBoundGpuHours')):.1f} input-bound, "
        f"{number(row.get('throttledGpuHours')):.1f} throttled" + _cost(row, currency)
    )


def _worst_lines(payload: dict[str, Any]) -> list[str]:
    runs = payload.get("worstExecutions")
    lines = []
    for run in runs if isinstance(runs, list) else []:
        if not isinstance(run, dict):
            continue
        idle = number(run.get("idleGpuHours")) + number(run.get("idleHeldGpuHours"))
        where = f" on {run['hostname']}" if run.get("hostname") else ""
        who = f" ({run['user']})" if run.get("user") and payload.get("user") is None else ""
        lines.append(
            f"- {_text(run.get('id'))}{where}{who}: {idle:.1f} idle of {number(run.get('gpuHours')):.1f} "
            f"GPU-hours {_text(run.get('url'))}".rstrip()
        )
    return lines[:DIGEST_TEXT_ROWS]


def digest_title(event: AlertEvent) -> str:
    payload = event.payload
    user = payload.get("user")
    if user:
        return f"gpulens: your GPU usage, {_period(payload)}"
    return f"gpulens: GPU usage digest of {event.org}, {_period(payload)}"


def digest_message(event: AlertEvent) -> str:
    """A user's digest: their row, their worst executions, the link to all of them. The copy: the
    totals, every user by idle GPU-hours (who was notified), the worst executions, the table's link."""
    payload = event.payload
    currency = payload.get("currency")
    rule = _section(payload, "rule")
    lines: list[str] = []
    if payload.get("user"):
        lines.append(
            f"{payload['user']}, {_period(payload)}: {_usage_line(_section(payload, 'usage'), currency)}."
        )
        worst = _worst_lines(payload)
        if worst:
            lines += ["Your executions that wasted most:", *worst]
        if payload.get("url"):
            lines.append(f"All your executions of the period, worst first: {payload['url']}")
        return "\n".join(lines)
    lines.append(f"{_period(payload)}: {_usage_line(_section(payload, 'totals'), currency)}.")
    users = [u for u in payload.get("users") or [] if isinstance(u, dict)]
    if users:
        threshold = number(rule.get("min_idle_gpu_hours"))
        lines.append(f"Users by idle GPU-hours (notified: {threshold:g} or more):")
        for u in users[:DIGEST_TEXT_ROWS]:
            name = _text(_section(u, "group").get("user")) or "(no user)"
            idle = number(u.get("idleGpuHours")) + number(u.get("idleHeldGpuHours"))
            mark = " (notified)" if u.get("notified") else ""
            lines.append(
                f"- {name}: {idle:.1f} idle of {number(u.get('gpuHours')):.1f} GPU-hours"
                + _cost(u, currency)
                + mark
            )
        if len(users) > DIGEST_TEXT_ROWS:
            lines.append(f"- and {len(users) - DIGEST_TEXT_ROWS} more")
    else:
        lines.append("No GPU usage in the period.")
    worst = _worst_lines(payload)
    if worst:
        lines += ["Executions that wasted most:", *worst]
    if payload.get("url"):
        lines.append(_text(payload["url"]))
    return "\n".join(lines)
