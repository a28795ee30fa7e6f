"""The job-end report sent to a job's owner (docs/alerts.md, "Job-end reports"): the receipt and the
biggest findings of each execution of a finished job (a Slurm job's nodes, or one execution), as one
`execution.report` event for the org's per-user channels and the channels named.

`gpulens report --slurm JOBID --notify` (from an `EpilogSlurmctld`) computes the summaries and stores
the event with one pending delivery per channel; `serve`'s deliverer sends them with its retries, so
the job's end is never slowed by a receiver. Pure: built from the summary route's documents.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from gpulens.domain.alerts import AlertEvent, Channel, ChannelType, EventType, new_id, per_user
from gpulens.domain.timeparse import datetime_to_ms, format_rfc3339_ms

TOP_FINDINGS = 5  # per execution, by GPU-hours
LINES = ("idle", "idleHeld", "inputBound", "throttled")  # the receipt's lines (gpuTime), in its order


def number(value: Any) -> float:
    """A payload's number, 0 for anything else (payloads are read defensively)."""
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0.0


def execution_part(doc: dict[str, Any], node: str | None, public_url: str | None) -> dict[str, Any]:
    """One execution of the report, from its summary document: where it ran, its receipt (GPU-hours by
    line, cost) and its biggest findings."""
    gpu_time = doc.get("gpuTime") or {}
    cost = doc.get("cost") or {}
    findings = sorted(
        (f for f in doc.get("findings") or [] if number((f.get("impact") or {}).get("gpuHours")) > 0),
        key=lambda f: -number(f["impact"]["gpuHours"]),
    )
    execution_id = str(doc.get("executionId", ""))
    return {
        "id": execution_id,
        "node": node,
        "hostname": doc.get("hostname"),
        "gpus": doc.get("gpus") or [],
        "timeRange": doc.get("timeRange"),
        "gpuHours": number(gpu_time.get("total")),
        **{f"{line}GpuHours": number(gpu_time.get(line)) for line in LINES},
        "cost": cost.get("total"),
        "currency": cost.get("currency"),
        "findings": [
            {
                "kind": f.get("kind"),
                "severity": f.get("severity"),
                "start": f.get("start"),
                "end": f.get("end"),
                "gpuHours": number(f["impact"].get("gpuHours")),
                "cost": f["impact"].get("cost"),
                "message": f.get("message"),
            }
            for f in findings[:TOP_FINDINGS]
        ],
        "url": None if not public_url else f"{public_url.rstrip('/')}/ui/executions/{execution_id}",
    }


def report_event(
    org: str,
    user: str | None,
    job: dict[str, str | None] | None,
    parts: Sequence[dict[str, Any]],
    now: datetime,
) -> AlertEvent:
    """The event: the job (Slurm cluster and id, or None for one execution), its owner, each
    execution's part and the totals."""
    totals: dict[str, Any] = {"gpuHours": sum(p["gpuHours"] for p in parts)}
    for line in LINES:
        totals[f"{line}GpuHours"] = sum(p[f"{line}GpuHours"] for p in parts)
    priced = [p["cost"] for p in parts if isinstance(p.get("cost"), int | float)]
    totals["cost"] = sum(priced) if priced else None
    totals["currency"] = next((p["currency"] for p in parts if p.get("currency")), None)
    event_id = new_id("evt")
    payload = {
        "type": EventType.JOB_REPORT.value,
        "id": event_id,
        "timestamp": format_rfc3339_ms(datetime_to_ms(now)),
        "org": org,
        "user": user,
        "job": job,
        "executions": list(parts),
        "totals": totals,
    }
    single = parts[0]["id"] if len(parts) == 1 else None
    return AlertEvent(event_id, org, EventType.JOB_REPORT, now, single, None, payload)


def report_channels(channels: Sequence[Channel], user: str | None, named: Sequence[str]) -> list[Channel]:
    """Where the report goes: the org's per-user channels when the owner is known, and the channels
    named (any kind but Alertmanager, which takes alerts, not reports); disabled ones left out."""
    by_id = {c.channel_id: c for c in channels}
    chosen = [c for c in channels if user and per_user(c.url)]
    for channel_id in named:
        channel = by_id.get(channel_id)
        if channel is not None and channel not in chosen:
            chosen.append(channel)
    return [c for c in chosen if c.disabled_at is None and c.type is not ChannelType.ALERTMANAGER]


def report_title(event: AlertEvent) -> str:
    payload = event.payload
    job = payload.get("job") or {}
    parts = payload.get("executions") or []
    if job.get("id"):
        where = f"Slurm job {job['id']}" + (f" on {job['cluster']}" if job.get("cluster") else "")
    else:
        where = f"execution {parts[0]['id']}" if parts else "an execution"
    nodes = f" ({len(parts)} nodes)" if len(parts) > 1 else ""
    return f"gpulens: report of {where}{nodes}"


def report_message(event: AlertEvent) -> str:
    """The text of chat and mail channels: the totals, then each execution's receipt and findings."""
    payload = event.payload
    totals = payload.get("totals") or {}
    currency = totals.get("currency") or ""

    def money(value: Any) -> str:
        return f", {value:.2f} {currency}".rstrip() if isinstance(value, int | float) else ""

    def receipt(p: dict[str, Any]) -> str:
        waste = ", ".join(
            f"{label} {p[f'{line}GpuHours']:.2f}"
            for line, label in zip(
                LINES, ("idle", "idle with memory held", "input-bound", "throttled"), strict=True
            )
            if p.get(f"{line}GpuHours")
        )
        return f"{p['gpuHours']:.2f} GPU-hours{money(p.get('cost'))}" + (
            f" (of which {waste})" if waste else ""
        )

    lines = [report_title(event), f"In all: {receipt(totals)}"]
    for p in payload.get("executions") or []:
        where = p.get("node") or p.get("hostname") or ""
        lines.append(f"- {where} ({p['id']}): {receipt(p)}")
        for f in p.get("findings") or []:
            lines.append(f"  - {f['kind']}: {f['gpuHours']:.2f} GPU-hours{money(f.get('cost'))}")
        if p.get("url"):
            lines.append(f"  {p['url']}")
    return "\n".join(lines)
