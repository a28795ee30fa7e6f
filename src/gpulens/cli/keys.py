"""`gpulens keys`: create, list, revoke and toggle API keys of any org, through the service the
API's key routes use (one set of checks: names, scopes, expiry)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Annotated

import anyio
import typer
from rich.table import Table

from gpulens.cli.common import (
    CLI_ADMIN,
    DatabaseOpt,
    out_console,
    parse_time,
    registry_errors,
    registry_for,
    short_time,
)
from gpulens.domain.keys import ApiKey
from gpulens.domain.timeparse import format_optional
from gpulens.service.executions import ExecutionService

app = typer.Typer(no_args_is_help=True, help="Create, list, revoke and toggle API keys.")
console = out_console()

# the service's field names -> this command's options
_FLAGS = {"key_name": "--name", "projects": "--project"}


def key_dict(key: ApiKey) -> dict[str, object]:
    return {
        "id": key.key_id,
        "org": key.org,
        "name": key.name,
        "prefix": key.prefix,
        "is_admin": key.is_admin,
        "is_active": key.is_active,
        "projects": None if key.projects is None else sorted(key.projects),
        "created_at": format_optional(key.created_at),
        "expires_at": format_optional(key.expires_at),
        "last_used_at": format_optional(key.last_used_at),
        "revoked_at": format_optional(key.revoked_at),
    }


def _state(key: ApiKey, now: datetime) -> str:
    if key.is_revoked:
        return "[red]revoked[/red]"
    if key.expires_at is not None and key.expires_at <= now:
        return "[yellow]expired[/yellow]"
    return "[green]active[/green]" if key.is_active else "[dim]inactive[/dim]"


@app.command("create")
def create(
    *,
    org: Annotated[str, typer.Option("--org", help="The org the key belongs to (created if new)")],
    admin: Annotated[
        bool, typer.Option("--admin", help="A platform service key: may register executions for any org")
    ] = False,
    name: Annotated[str, typer.Option("--name", help="A label for people")] = "default",
    project: Annotated[
        list[str] | None, typer.Option("--project", help="Limit the key to this project (repeatable)")
    ] = None,
    expires_at: Annotated[
        str | None, typer.Option("--expires-at", help="RFC 3339 time (or Unix seconds) the key stops working")
    ] = None,
    database: DatabaseOpt = None,
) -> None:
    """Create a key; the key itself is printed once, as the last line (only its hash is stored)."""
    expires = None if expires_at is None else parse_time(expires_at, "--expires-at")
    with registry_for(database) as registry, registry_errors(_FLAGS):
        service = ExecutionService(registry)
        key, plaintext = anyio.run(
            lambda: service.create_key_for(
                CLI_ADMIN, org, name, is_admin=admin, projects=project or None, expires_at=expires
            )
        )
    scope = "admin key" if admin else "key"
    limits = f", projects {', '.join(sorted(key.projects))}" if key.projects else ""
    expiry = f", expires {format_optional(key.expires_at)}" if key.expires_at else ""
    typer.echo(f"created {scope} {key.prefix} (id {key.key_id}) for org {org}{limits}{expiry}")
    typer.echo("this is the only time the key is shown:", err=True)
    typer.echo(plaintext)


@app.command("list")
def list_keys(
    org: Annotated[str | None, typer.Option("--org", help="Only this org's keys")] = None,
    all_keys: Annotated[bool, typer.Option("--all", help="Include revoked keys")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="JSON instead of a table")] = False,
    database: DatabaseOpt = None,
) -> None:
    """List keys by prefix (keys themselves are never stored)."""
    with registry_for(database) as registry, registry_errors(_FLAGS):
        service = ExecutionService(registry)
        keys = anyio.run(lambda: service.list_all_keys(CLI_ADMIN, org=org, include_revoked=all_keys))
    if as_json:
        typer.echo(json.dumps([key_dict(k) for k in keys], indent=2))
        return
    if not keys:
        console.print("[dim]no API keys[/dim]")
        return
    now = datetime.now(UTC)
    table = Table(title="API keys", caption="ids: gpulens keys list --json")
    table.add_column("Prefix", style="magenta", no_wrap=True)
    table.add_column("Org", style="cyan")
    table.add_column("Name")
    table.add_column("Scope")
    table.add_column("State", no_wrap=True)
    table.add_column("Last used", style="dim")
    table.add_column("Expires", style="dim")
    for k in keys:
        scope = "admin" if k.is_admin else "org"
        if k.projects is not None:
            scope += ": " + ", ".join(sorted(k.projects))
        table.add_row(
            k.prefix,
            k.org,
            k.name,
            scope,
            _state(k, now),
            short_time(k.last_used_at),
            short_time(k.expires_at),
        )
    console.print(table)


@app.command("revoke")
def revoke(
    key: Annotated[str, typer.Argument(help="The key's id or its 8-character prefix")],
    database: DatabaseOpt = None,
) -> None:
    """Revoke a key for good."""
    with registry_for(database) as registry, registry_errors(_FLAGS):
        service = ExecutionService(registry)
        revoked = anyio.run(lambda: service.revoke_any_key(CLI_ADMIN, key))
    typer.echo(f"revoked key {revoked.prefix} (id {revoked.key_id})")


@app.command("toggle")
def toggle(
    key: Annotated[str, typer.Argument(help="The key's id or its 8-character prefix")],
    database: DatabaseOpt = None,
) -> None:
    """Switch a key between active and inactive."""
    with registry_for(database) as registry, registry_errors(_FLAGS):
        service = ExecutionService(registry)
        changed = anyio.run(lambda: service.toggle_any_key(CLI_ADMIN, key))
    typer.echo(f"key {changed.prefix} is now {'active' if changed.is_active else 'inactive'}")
