"""`gpulens metrics EXECUTION_ID`: an execution's Lyceum series as a table with sparklines, JSON or CSV."""

from __future__ import annotations

import csv
import sys
from typing import Annotated, Any

import anyio
import orjson
import typer
from rich.table import Table

from gpulens.cli.common import CLI_ADMIN, DatabaseOpt, DemoOpt, PrometheusOpt, fail, out_console
from gpulens.domain import catalog as c
from gpulens.domain.timeparse import parse_duration_ms, parse_timestamp_ms

BARS = "▁▂▃▄▅▆▇█"


def sparkline(values: list[float], width: int = 30) -> str:
    """Bucket means scaled between the series' min and max; empty for no values."""
    if not values:
        return ""
    buckets = [values[i * len(values) // width : (i + 1) * len(values) // width] for i in range(width)]
    means = [sum(b) / len(b) for b in buckets if b]
    lo, hi = min(means), max(means)
    if hi - lo <= 1e-9 * max(abs(hi), abs(lo), 1.0):  # flat, up to float noise
        return BARS[3] * len(means)
    return "".join(BARS[min(len(BARS) - 1, int((m - lo) / (hi - lo) * len(BARS)))] for m in means)


def human(value: float, unit: str) -> str:
    if unit == "bytes":
        for suffix in ("B", "KiB", "MiB", "GiB", "TiB"):
            if abs(value) < 1024:
                return f"{value:.1f} {suffix}"
            value /= 1024
        return f"{value:.1f} PiB"
    if unit == "bytes_per_second":
        return human(value, "bytes") + "/s"
    return f"{value:.1f}"


def fetch(
    settings_args: dict[str, Any],
    execution_id: str,
    start: str | None,
    end: str | None,
    step: str,
    demo: bool = False,
) -> bytes:
    """The metrics route's body, from the services built in-process (embedded store, Prometheus or demo)."""
    from gpulens.api.lyceum.metrics import lyceum_points, stream_body  # the API stack only when it is used
    from gpulens.cli.report import in_process

    try:
        start_ms = parse_timestamp_ms(start) if start else None
        end_ms = parse_timestamp_ms(end) if end else None
        step_ms = parse_duration_ms(step)
    except ValueError as exc:
        fail(str(exc), 2)
    with in_process(settings_args.get("prometheus_url"), settings_args.get("database_url"), demo) as ctx:

        async def collect() -> bytes:
            execution = await ctx.executions.get_for(CLI_ADMIN, execution_id)
            answer = await ctx.metrics.read(execution, start_ms, end_ms, step_ms, lyceum_points)
            return b"".join([part async for part in stream_body(answer, execution_id)])

        return anyio.run(collect)


def metrics(
    execution_id: Annotated[str, typer.Argument(help="The execution's id")],
    start: Annotated[str | None, typer.Option(help="RFC 3339 start (default: the execution's start)")] = None,
    end: Annotated[str | None, typer.Option(help="RFC 3339 end (default: its end, or now)")] = None,
    step: Annotated[str, typer.Option(help="Resolution, e.g. 15s, 1m")] = "15s",
    as_json: Annotated[bool, typer.Option("--json", help="Print exactly what the API answers")] = False,
    as_csv: Annotated[bool, typer.Option("--csv", help="metric,timestamp,value rows")] = False,
    prometheus_url: PrometheusOpt = None,
    database: DatabaseOpt = None,
    demo: DemoOpt = False,
) -> None:
    """Show an execution's GPU and system series (the Lyceum endpoint's answer)."""
    body = fetch(
        {"prometheus_url": prometheus_url, "database_url": database}, execution_id, start, end, step, demo
    )
    if as_json:
        sys.stdout.write(body.decode() + "\n")
        return
    data = orjson.loads(body)
    if as_csv:
        writer = csv.writer(sys.stdout, lineterminator="\n")
        writer.writerow(["metric", "timestamp", "value"])
        for key in c.LYCEUM_KEYS:
            for point in data[key]:
                writer.writerow([key, point["timestamp"], point["value"]])
        return
    table = Table(
        title=f"{data['executionId']} on {data['hostname']}: "
        f"{data['timeRange']['start']} → {data['timeRange']['end']} (step {step})"
    )
    for header, justify in (
        ("metric", "left"),
        ("unit", "left"),
        ("points", "right"),
        ("mean", "right"),
        ("max", "right"),
        ("last", "right"),
        ("", "left"),
    ):
        table.add_column(header, justify=justify)  # type: ignore[arg-type]
    for m in c.LYCEUM_METRICS:
        values = [float(p["value"]) for p in data[m.lyceum]]
        if not values:
            table.add_row(m.lyceum, c.UNIT_LABELS[m.unit], "0", "—", "—", "—", "[dim]no data[/dim]")
            continue
        mean = sum(values) / len(values)
        table.add_row(
            m.lyceum,
            c.UNIT_LABELS[m.unit],
            str(len(values)),
            human(mean, m.unit),
            human(max(values), m.unit),
            human(values[-1], m.unit),
            f"[cyan]{sparkline(values)}[/cyan]",
        )
    out_console().print(table)
