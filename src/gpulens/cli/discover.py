"""`gpulens discover`: find workloads and pods in the metrics backend and sync them into the registry."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Annotated

import anyio
import typer

from gpulens.cli.common import (
    DatabaseOpt,
    err_console,
    fail,
    load_settings,
    parse_time,
    registry_errors,
    registry_for,
)
from gpulens.domain.timeparse import datetime_to_ms, format_rfc3339_ms, parse_duration_ms
from gpulens.service.discovery import PROJECT_FROM, DiscoveryReport, discover_kubernetes

app = typer.Typer(
    no_args_is_help=True, help="Discover workloads and pods from exporters in the metrics backend."
)


def report_dict(report: DiscoveryReport) -> dict[str, object]:
    n = report.counts
    return {
        "org": report.org,
        "start": format_rfc3339_ms(report.start_ms),
        "end": format_rfc3339_ms(report.end_ms),
        "pods_seen": report.pods_seen,
        "workloads": {
            "created": n.workloads_created,
            "updated": n.workloads_updated,
            "unchanged": n.workloads_unchanged,
        },
        "pods": {"created": n.pods_created, "updated": n.pods_updated, "unchanged": n.pods_unchanged},
        "skipped": list(n.skipped),
        "ignored": list(report.ignored),
    }


@app.command("kubernetes")
def kubernetes(
    *,
    org: Annotated[str, typer.Option("--org", help="The org the workloads belong to (created if new)")],
    since: Annotated[str, typer.Option("--since", help="How far back to look (a duration: 24h, 7d)")] = "24h",
    until: Annotated[
        str | None, typer.Option("--until", help="End of the window (RFC 3339 or Unix seconds; default now)")
    ] = None,
    namespace: Annotated[
        list[str] | None, typer.Option("--namespace", help="Only these namespaces (repeatable)")
    ] = None,
    project_from: Annotated[
        str,
        typer.Option(
            "--project-from",
            help="A workload's project: its namespace, 'runai' (namespace runai-P -> P) or none",
        ),
    ] = "namespace",
    prometheus_url: Annotated[
        str | None,
        typer.Option("--prometheus-url", help="Prometheus-compatible base URL; env GPULENS_PROMETHEUS_URL"),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="The report as JSON")] = False,
    database: DatabaseOpt = None,
) -> None:
    """Sync pods seen by kube-state-metrics (kube_pod_info, kube_pod_owner, ...) into the registry.

    Pod ids are the pods' UIDs; a workload is the pod's owner (a Deployment for ReplicaSet pods).
    Running it again is harmless: what is already known is left unchanged.
    """
    settings = load_settings(prometheus_url=prometheus_url, database_url=database)
    if not settings.prometheus_url:
        fail("no metrics backend configured: pass --prometheus-url URL or set GPULENS_PROMETHEUS_URL", 2)
    if project_from not in PROJECT_FROM:
        fail(f"--project-from must be one of {', '.join(PROJECT_FROM)}", 2)
    try:
        window = timedelta(milliseconds=parse_duration_ms(since))
    except ValueError as exc:
        fail(f"--since: {exc}", 2)
    end = parse_time(until, "--until") if until is not None else datetime.now(UTC)
    start_ms, end_ms = datetime_to_ms(end - window), datetime_to_ms(end)

    from gpulens.service.wiring import make_backend

    with registry_for(database) as registry, registry_errors():
        backend = make_backend(settings)

        async def run() -> DiscoveryReport:
            try:
                return await discover_kubernetes(
                    backend,
                    registry,
                    org,
                    start_ms=start_ms,
                    end_ms=end_ms,
                    project_from=PROJECT_FROM[project_from],
                    namespaces=namespace or (),
                    metric_names=settings.metric_names,
                )
            finally:
                await backend.aclose()

        with err_console.status(f"querying {settings.prometheus_url} ..."):
            report = anyio.run(run)
    if as_json:
        typer.echo(json.dumps(report_dict(report), indent=2))
        return
    n = report.counts
    typer.echo(
        f"{report.pods_seen} pods seen from {format_rfc3339_ms(start_ms)} to {format_rfc3339_ms(end_ms)}"
    )
    typer.echo(
        f"workloads: {n.workloads_created} created, {n.workloads_updated} updated, "
        f"{n.workloads_unchanged} unchanged"
    )
    typer.echo(f"pods: {n.pods_created} created, {n.pods_updated} updated, {n.pods_unchanged} unchanged")
    for line in (*n.skipped, *report.ignored):
        err_console.print(f"[yellow]skipped:[/yellow] {line}", soft_wrap=True)
