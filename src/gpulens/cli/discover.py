"""`gpulens discover`: find workloads and pods in the metrics backend and sync them into the registry."""

from __future__ import annotations

import json
import re
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
from gpulens.service.slurm import (
    JobSource,
    SlurmCliSource,
    SlurmDiscoveryReport,
    discover_slurm,
    slurm_rest_source,
)

_SLURM_JOB = re.compile(r"[0-9]{1,10}(?:[_+][0-9]{1,10})?")

app = typer.Typer(
    no_args_is_help=True,
    help="Discover workloads and pods from exporters in the metrics backend, or Slurm jobs.",
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


def slurm_report_dict(report: SlurmDiscoveryReport) -> dict[str, object]:
    n = report.counts
    return {
        "org": report.org,
        "source": report.source,
        "since": format_rfc3339_ms(report.start_ms),
        "until": format_rfc3339_ms(report.end_ms),
        "jobs_seen": report.jobs_seen,
        "jobs_registered": report.jobs_registered,
        "jobs": list(report.job_ids),
        "jobs_without_gpus": report.without_gpus,
        "executions": {
            "created": n.executions_created,
            "updated": n.executions_updated,
            "unchanged": n.executions_unchanged,
        },
        "workloads": {
            "created": n.workloads_created,
            "updated": n.workloads_updated,
            "unchanged": n.workloads_unchanged,
        },
        "gpus_unknown": list(report.unknown_gpus),
        "skipped": list(n.skipped),
        "ignored": list(report.ignored),
    }


@app.command("slurm")
def slurm(
    *,
    org: Annotated[str, typer.Option("--org", help="The org the jobs belong to (created if new)")],
    since: Annotated[
        str, typer.Option("--since", help="Jobs running now or ended this long ago (a duration: 24h, 7d)")
    ] = "24h",
    url: Annotated[
        str | None,
        typer.Option(
            "--url", help="slurmrestd's base URL; env GPULENS_SLURM_URL. Without: squeue/sacct here"
        ),
    ] = None,
    user: Annotated[
        str | None,
        typer.Option("--user", help="The token's Slurm user; env GPULENS_SLURM_USER (default: its sun)"),
    ] = None,
    cluster: Annotated[
        str | None,
        typer.Option(
            "--cluster", help="For records that do not name their cluster; env GPULENS_SLURM_CLUSTER"
        ),
    ] = None,
    job: Annotated[
        list[str] | None, typer.Option("--job", help="Only these jobs (12, 10_3, an array's id; repeatable)")
    ] = None,
    include_cpu_jobs: Annotated[
        bool, typer.Option("--include-cpu-jobs", help="Register jobs without GPUs too")
    ] = False,
    prometheus_url: Annotated[
        str | None,
        typer.Option(
            "--prometheus-url",
            help="Where dcgm-exporter's hpc_job series tell ended jobs' GPUs; env GPULENS_PROMETHEUS_URL",
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="The report as JSON")] = False,
    database: DatabaseOpt = None,
) -> None:
    """Register Slurm jobs that hold GPUs: an execution per node (GPU indices from the allocation) and
    a workload per job with a pod per node.

    From slurmrestd (GPULENS_SLURM_URL, GPULENS_SLURM_TOKEN or GPULENS_SLURM_TOKEN_FILE), else from
    `sacct --json` and `squeue --json` on this host. Running it again is harmless.
    """
    settings = load_settings(
        slurm_url=url,
        slurm_user=user,
        slurm_cluster=cluster,
        prometheus_url=prometheus_url,
        database_url=database,
    )
    try:
        window_ms = parse_duration_ms(since)
    except ValueError as exc:
        fail(f"--since: {exc}", 2)
    for wanted in job or ():
        if not _SLURM_JOB.fullmatch(wanted):
            fail(f"--job: not a Slurm job id: {wanted!r} (12, 10_3 or 20+1)", 2)
    now = datetime.now(UTC)

    from gpulens.service.wiring import make_backend

    with registry_for(database) as registry, registry_errors():
        source: JobSource = slurm_rest_source(settings) if settings.slurm_url else SlurmCliSource()
        backend = make_backend(settings) if settings.prometheus_url else None

        async def run() -> SlurmDiscoveryReport:
            try:
                return await discover_slurm(
                    source,
                    registry,
                    org,
                    since_ms=datetime_to_ms(now) - window_ms,
                    now=now,
                    cluster=settings.slurm_cluster,
                    include_cpu_jobs=include_cpu_jobs,
                    backend=backend,
                    only=job or (),
                )
            finally:
                await source.aclose()
                if backend is not None:
                    await backend.aclose()

        with err_console.status(f"asking {source.name} ..."):
            report = anyio.run(run)
    if as_json:
        typer.echo(json.dumps(slurm_report_dict(report), indent=2))
        return
    n = report.counts
    typer.echo(
        f"{report.jobs_seen} jobs seen ({report.source}), {report.jobs_registered} with GPUs, "
        f"{report.without_gpus} without"
    )
    typer.echo(
        f"executions: {n.executions_created} created, {n.executions_updated} updated, "
        f"{n.executions_unchanged} unchanged"
    )
    typer.echo(
        f"workloads: {n.workloads_created} created, {n.workloads_updated} updated, "
        f"{n.workloads_unchanged} unchanged"
    )
    for line in report.unknown_gpus:
        err_console.print(f"[yellow]GPU indices unknown:[/yellow] {line}", soft_wrap=True)
    for line in (*n.skipped, *report.ignored):
        err_console.print(f"[yellow]skipped:[/yellow] {line}", soft_wrap=True)
