"""`gpulens archive`: copy finished executions and pods from Prometheus into gpulens' own archive."""

from __future__ import annotations

import json
from typing import Annotated, Any

import anyio
import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from gpulens.cli.common import DatabaseOpt, err_console, fail, load_settings, registry_errors, registry_for
from gpulens.domain.timeparse import datetime_to_ms, format_rfc3339_ms
from gpulens.gctuning import tune_allocator, tune_gc
from gpulens.service.archive import Archiver, PassReport, Target
from gpulens.storage.archive import ArchiveStore, ArchiveTotals


def totals_dict(totals: ArchiveTotals) -> dict[str, Any]:
    return {
        "executions": totals.executions,
        "pods": totals.pods,
        "bytes": totals.bytes,
        "samples": totals.samples,
        "bytes_per_sample": round(totals.bytes / totals.samples, 3) if totals.samples else None,
    }


def report_dict(report: PassReport) -> dict[str, Any]:
    return {
        "executions": report.executions,
        "pods": report.pods,
        "bytes": report.bytes,
        "samples": report.samples,
        "bytes_per_sample": round(report.bytes / report.samples, 3) if report.samples else None,
        "unchanged": report.unchanged,
        "failed": [{"id": i, "error": why} for i, why in report.failed],
    }


def target_dict(target: Target, now_ms: int) -> dict[str, Any]:
    spec = target.spec
    if target.fresh:
        state = "archived"
    elif spec.ready_ms > now_ms:
        state = "not ready"
    elif target.current is None:
        state = "new"
    else:
        state = "stale"
    return {
        "kind": target.kind,
        "id": target.object_id,
        "state": state,
        "from": format_rfc3339_ms(spec.from_ms),
        "to": format_rfc3339_ms(spec.to_ms),
        "ready": format_rfc3339_ms(spec.ready_ms),
    }


def archive(
    ids: Annotated[
        list[str] | None, typer.Argument(help="Execution or pod ids (default: none; see --all-finished)")
    ] = None,
    all_finished: Annotated[
        bool, typer.Option("--all-finished", help="Every finished execution and pod without a fresh archive")
    ] = False,
    force: Annotated[
        bool, typer.Option("--force", help="Rebuild the given ids' archives even if fresh")
    ] = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Only show what would be archived")] = False,
    stats: Annotated[
        bool, typer.Option("--stats", help="Print what the archive holds: executions, pods, bytes, samples")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="JSON output")] = False,
    prometheus_url: Annotated[
        str | None,
        typer.Option("--prometheus-url", help="Prometheus-compatible base URL; env GPULENS_PROMETHEUS_URL"),
    ] = None,
    database: DatabaseOpt = None,
) -> None:
    """Archive finished executions and pods: their raw samples, copied from the metrics backend into
    the registry, answer every later read of them (also once Prometheus has dropped them)."""
    settings = load_settings(prometheus_url=prometheus_url, database_url=database)
    wanted = list(ids or [])
    if not wanted and not all_finished and not stats:
        fail("give execution or pod ids, --all-finished, or --stats", 2)
    if (wanted or all_finished) and not settings.prometheus_url:
        fail(
            "archiving needs a Prometheus-compatible backend: pass --prometheus-url URL or set "
            "GPULENS_PROMETHEUS_URL (on the embedded default the local store is already the source)",
            2,
        )
    from gpulens.service.wiring import archive_options, make_backend

    tune_gc()  # it decodes answers of a million samples, as the server does
    tune_allocator()

    report = PassReport()
    with registry_for(database) as registry, registry_errors():
        store = ArchiveStore(registry)
        if wanted or all_finished:
            backend = make_backend(settings)
            archiver = Archiver(registry, store, backend, archive_options(settings))

            async def run() -> tuple[list[Target], list[str], PassReport]:
                try:
                    return await _archive(archiver, wanted, all_finished, force, dry_run, as_json)
                finally:
                    await backend.aclose()

            targets, unknown, report = anyio.run(run)
            now_ms = datetime_to_ms(archiver.clock())
            for object_id in unknown:
                err_console.print(f"[yellow]skipped:[/yellow] {object_id}: no such finished execution or pod")
            if dry_run:
                rows = [target_dict(t, now_ms) for t in targets]
                if as_json:
                    typer.echo(json.dumps(rows, indent=2))
                else:
                    for row in rows:
                        typer.echo(
                            f"{row['kind']:9} {row['id']}  {row['state']:9} {row['from']} -> {row['to']}"
                        )
                    typer.echo(f"{len(rows)} to look at")
            elif not stats:
                _print_report(report, as_json)
            if report.failed and not dry_run:
                for object_id, why in report.failed:
                    err_console.print(f"[red]failed:[/red] {object_id}: {why}", soft_wrap=True)
        if stats:
            _print_totals(store.totals(), as_json)
    if report.failed and not dry_run:
        raise typer.Exit(1)


async def _archive(
    archiver: Archiver, wanted: list[str], all_finished: bool, force: bool, dry_run: bool, quiet: bool
) -> tuple[list[Target], list[str], PassReport]:
    targets: list[Target] = []
    unknown: list[str] = []
    now_ms = datetime_to_ms(archiver.clock())
    for object_id in wanted:
        target = await anyio.to_thread.run_sync(archiver.target, object_id)
        if target is None:
            unknown.append(object_id)
        elif force and target.current is not None:
            targets.append(Target(target.kind, target.object_id, target.org, target.spec, target.updated_at))
        else:
            targets.append(target)
    if all_finished:
        seen = {t.object_id for t in targets}
        targets += [t for t in await anyio.to_thread.run_sync(archiver.pending) if t.object_id not in seen]
    report = PassReport()
    if dry_run:
        return targets, unknown, report
    todo = [t for t in targets if t.spec.ready_ms <= now_ms]
    for t in targets:
        if t.spec.ready_ms > now_ms:
            err_console.print(
                f"[yellow]not yet:[/yellow] {t.kind} {t.object_id} can be archived from "
                f"{format_rfc3339_ms(t.spec.ready_ms)} (its end + lookback + grace)"
            )
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=err_console, transient=True, disable=quiet) as progress:
        task = progress.add_task("archiving", total=len(todo))
        for target in todo:
            progress.update(task, description=f"{target.kind} {target.object_id}")
            await archiver.archive(target, report)
            progress.advance(task)
    return targets, unknown, report


def _print_report(report: PassReport, as_json: bool) -> None:
    data = report_dict(report)
    if as_json:
        typer.echo(json.dumps(data, indent=2))
        return
    per = f"{data['bytes_per_sample']:.2f}" if data["bytes_per_sample"] is not None else "-"
    typer.echo(
        f"archived {report.executions} executions and {report.pods} pods: {report.samples} samples in "
        f"{report.bytes} bytes ({per} bytes/sample); {report.unchanged} already archived"
    )


def _print_totals(totals: ArchiveTotals, as_json: bool) -> None:
    data = totals_dict(totals)
    if as_json:
        typer.echo(json.dumps(data))
        return
    per = f"{data['bytes_per_sample']:.2f}" if data["bytes_per_sample"] is not None else "-"
    typer.echo(f"executions archived: {totals.executions}")
    typer.echo(f"pods archived:       {totals.pods}")
    typer.echo(f"bytes:               {totals.bytes}")
    typer.echo(f"samples:             {totals.samples}")
    typer.echo(f"bytes per sample:    {per}")
