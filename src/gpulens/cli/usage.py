"""`gpulens usage`: the fleet usage table (docs/usage.md) in the terminal, or as CSV/JSON: what
`GET /api/v2/external/usage` answers, read through the same service from the registry."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Annotated

import anyio
import typer
from rich.table import Table

from gpulens.cli.common import DatabaseOpt, fail, load_settings, out_console, registry_errors, registry_for
from gpulens.domain.errors import GpulensError
from gpulens.domain.models import Principal
from gpulens.domain.timeparse import datetime_to_ms, parse_duration_ms
from gpulens.service.usage import UsageService, group_dict, usage_csv
from gpulens.storage.usage import UsageStore

console = out_console()
COLUMNS = (
    ("executions", "executions", "{:d}"),
    ("runningExecutions", "running", "{:d}"),
    ("gpuHours", "GPU-h", "{:.1f}"),
    ("usefulGpuHours", "useful", "{:.1f}"),
    ("idleGpuHours", "idle", "{:.1f}"),
    ("idleHeldGpuHours", "idle held", "{:.1f}"),
    ("inputBoundGpuHours", "input-bound", "{:.1f}"),
    ("throttledGpuHours", "throttled", "{:.1f}"),
    ("energyKwh", "kWh", "{:.1f}"),
    ("cost", "cost", "{:.2f}"),
)


def usage(
    org: Annotated[str | None, typer.Option("--org", help="The org (default: every org, by org)")] = None,
    since: Annotated[str, typer.Option("--since", help="How far back (a duration: 24h, 7d, 30d)")] = "7d",
    group_by: Annotated[
        str,
        typer.Option("--group-by", help="One or two of user, project, hardware_profile, hostname, day, org"),
    ] = "project,user",
    as_csv: Annotated[bool, typer.Option("--csv", help="CSV instead of a table")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="JSON instead of a table")] = False,
    database: DatabaseOpt = None,
) -> None:
    """Who used which GPUs, who wasted them and what it cost, from the stored summaries."""
    try:
        span = parse_duration_ms(since)
    except ValueError as exc:
        fail(f"--since: {exc}", 2)
    settings = load_settings(database_url=database)
    # the operator's view: one org, or every org
    principal = Principal(org=org or "cli", subject="cli", is_admin=True)
    end = datetime_to_ms(datetime.now(UTC))
    with registry_for(database) as registry, registry_errors():
        service = UsageService(UsageStore(registry), settings.prices)
        try:
            table = anyio.run(service.table, principal, end - span, end, [group_by], org is None)
        except GpulensError as exc:
            fail(exc.message, 2)
    if as_csv:
        typer.echo(usage_csv(table), nl=False)
        return
    rows = [group_dict(g) for g in table.groups]
    if as_json:
        typer.echo(
            json.dumps({"groupBy": list(table.group_by), "currency": table.currency, "rows": rows}, indent=2)
        )
        return
    out = Table(title=f"GPU usage, the last {since}" + (f" ({table.currency})" if table.currency else ""))
    for key in table.group_by:
        out.add_column(key)
    for _, title, _ in COLUMNS:
        out.add_column(title, justify="right")
    for row in rows:
        cells = [str(v) if v is not None else "-" for v in row["group"].values()]
        cells += ["-" if row[f] is None else fmt.format(row[f]) for f, _, fmt in COLUMNS]
        out.add_row(*cells)
    console.print(out)
    if not rows:
        console.print(
            "no usage in this window (finished executions count once their summary is stored, running "
            "ones after `serve`'s next usage pass)"
        )
