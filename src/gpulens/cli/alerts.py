"""`gpulens alerts`: an org's live-alert rules, channels and deliveries (docs/alerts.md), read through the
service the API's alert routes use. Secrets are never printed; listed URLs lose their tokens."""

from __future__ import annotations

import json
from typing import Annotated

import anyio
import typer
from rich.table import Table

from gpulens.cli.common import DatabaseOpt, out_console, registry_errors, registry_for, short_time
from gpulens.domain.alerts import AlertRule, Channel, Delivery, DeliveryStatus
from gpulens.domain.timeparse import format_duration_ms, format_optional, format_rfc3339
from gpulens.service.alerts.rules import AlertService, display_url, is_file_row
from gpulens.storage.alerts import AlertStore

app = typer.Typer(no_args_is_help=True, help="List an org's alert rules, channels and deliveries.")
console = out_console()

Org = Annotated[str, typer.Option("--org", help="The org whose alerts to list")]
AsJson = Annotated[bool, typer.Option("--json", help="JSON instead of a table")]


def rule_dict(rule: AlertRule) -> dict[str, object]:
    return {
        "id": rule.rule_id,
        "org": rule.org,
        "kind": rule.kind,
        "for": None if rule.is_digest else format_duration_ms(rule.for_ms),
        "every": None if rule.every_ms is None else format_duration_ms(rule.every_ms),
        "min_idle_gpu_hours": rule.min_idle_gpu_hours,
        "channels": list(rule.channels),
        "severity": rule.severity,
        "action": None
        if rule.action is None
        else {"type": "stop", "after": format_duration_ms(rule.action.after_ms)},
        "match": dict(rule.match),
        "source": "file" if is_file_row(rule.rule_id) else "api",
        "created_at": format_optional(rule.created_at),
    }


def channel_dict(channel: Channel) -> dict[str, object]:
    return {
        "id": channel.channel_id,
        "org": channel.org,
        "type": channel.type.value,
        "url": display_url(channel),
        "source": "file" if is_file_row(channel.channel_id) else "api",
        "created_at": format_optional(channel.created_at),
        "failing_since": format_optional(channel.failing_since),
        "disabled_at": format_optional(channel.disabled_at),
        "disabled_reason": channel.disabled_reason,
    }


def delivery_dict(delivery: Delivery) -> dict[str, object]:
    return {
        "id": delivery.delivery_id,
        "org": delivery.org,
        "event_id": delivery.event_id,
        "channel_id": delivery.channel_id,
        "status": delivery.status.value,
        "attempts": delivery.attempts,
        "created_at": format_rfc3339(delivery.created_at),
        "next_attempt_at": format_optional(delivery.next_attempt_at),
        "delivered_at": format_optional(delivery.delivered_at),
        "last_error": delivery.last_error,
    }


@app.command("rules")
def rules(org: Org, as_json: AsJson = False, database: DatabaseOpt = None) -> None:
    """The org's rules, oldest first."""
    with registry_for(database) as registry, registry_errors():
        service = AlertService(AlertStore(registry))
        found = anyio.run(service.list_rules, org)
    if as_json:
        typer.echo(json.dumps([rule_dict(r) for r in found], indent=2))
        return
    if not found:
        console.print(f"[dim]no alert rules for org {org}[/dim]")
        return
    table = Table(title=f"Alert rules of {org}", caption="ids: gpulens alerts rules --json")
    table.add_column("Id", style="magenta", no_wrap=True)
    table.add_column("Kind", style="cyan")
    table.add_column("For / every", justify="right")
    table.add_column("Severity")
    table.add_column("Channels")
    table.add_column("Action")
    table.add_column("Match")
    table.add_column("Created", style="dim")
    for r in found:
        action = "—" if r.action is None else f"stop after {format_duration_ms(r.action.after_ms)}"
        match = ", ".join(f"{k}={v}" for k, v in sorted(r.match.items())) or "—"
        if r.every_ms is not None:  # a digest: its period, and its threshold where it has one
            every = f"every {format_duration_ms(r.every_ms)}"
            action = f"idle ≥ {r.min_idle_gpu_hours:g} GPU-h" if r.min_idle_gpu_hours else "—"
        table.add_row(
            r.rule_id,
            r.kind,
            every if r.every_ms is not None else format_duration_ms(r.for_ms),
            r.severity,
            ", ".join(r.channels),
            action,
            match,
            short_time(r.created_at),
        )
    console.print(table)


@app.command("channels")
def channels(org: Org, as_json: AsJson = False, database: DatabaseOpt = None) -> None:
    """The org's channels (their secrets are never shown; URLs without their tokens)."""
    with registry_for(database) as registry, registry_errors():
        service = AlertService(AlertStore(registry))
        found = anyio.run(service.list_channels, org)
    if as_json:
        typer.echo(json.dumps([channel_dict(c) for c in found], indent=2))
        return
    if not found:
        console.print(f"[dim]no alert channels for org {org}[/dim]")
        return
    table = Table(title=f"Alert channels of {org}")
    table.add_column("Id", style="magenta", no_wrap=True)
    table.add_column("Type", style="cyan")
    table.add_column("URL")
    table.add_column("State", no_wrap=True)
    table.add_column("Created", style="dim")
    for c in found:
        if c.disabled_at is not None:
            state = f"[red]disabled[/red] {short_time(c.disabled_at)}"
        elif c.failing_since is not None:
            state = f"[yellow]failing since[/yellow] {short_time(c.failing_since)}"
        else:
            state = "[green]ok[/green]"
        table.add_row(c.channel_id, c.type.value, display_url(c), state, short_time(c.created_at))
    console.print(table)


@app.command("deliveries")
def deliveries(
    org: Org,
    status: Annotated[DeliveryStatus | None, typer.Option("--status", case_sensitive=False)] = None,
    limit: Annotated[int, typer.Option("--limit", min=1, max=500)] = 100,
    as_json: AsJson = False,
    database: DatabaseOpt = None,
) -> None:
    """The org's deliveries, newest first."""
    with registry_for(database) as registry, registry_errors():
        service = AlertService(AlertStore(registry))
        found = anyio.run(service.list_deliveries, org, status, limit)
    if as_json:
        typer.echo(json.dumps([delivery_dict(d) for d in found], indent=2))
        return
    if not found:
        console.print(f"[dim]no deliveries for org {org}[/dim]")
        return
    colour = {
        DeliveryStatus.DELIVERED: "green",
        DeliveryStatus.FAILED: "red",
        DeliveryStatus.PENDING: "yellow",
    }
    table = Table(title=f"Alert deliveries of {org}")
    table.add_column("Id", style="magenta", no_wrap=True)
    table.add_column("Event", no_wrap=True)
    table.add_column("Channel", no_wrap=True)
    table.add_column("Status", no_wrap=True)
    table.add_column("Attempts", justify="right")
    table.add_column("Created", style="dim")
    table.add_column("Next attempt", style="dim")
    table.add_column("Last error")
    for d in found:
        table.add_row(
            d.delivery_id,
            d.event_id,
            d.channel_id,
            f"[{colour[d.status]}]{d.status.value}[/{colour[d.status]}]",
            str(d.attempts),
            short_time(d.created_at),
            short_time(d.next_attempt_at),
            d.last_error or "—",
        )
    console.print(table)
