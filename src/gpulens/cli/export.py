"""`gpulens export EXECUTION_ID --format csv|parquet|json -o FILE`: every sample, per GPU, to a file.

The same rows as `GET .../execution/{id}/export` (service/export.py), read an hour at a time, with a
progress bar on stderr. `-o -` (the default) writes to stdout (no progress bar then, unless stderr
is a terminal).
"""

from __future__ import annotations

import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Annotated, BinaryIO

import anyio
import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from gpulens.cli.common import CLI_ADMIN, DatabaseOpt, DemoOpt, PrometheusOpt, err_console, fail
from gpulens.cli.report import in_process, parse_bounds


def export(
    execution_id: Annotated[str, typer.Argument(help="The execution's id")],
    fmt: Annotated[str, typer.Option("--format", "-f", help="csv, parquet or json (JSON lines)")] = "csv",
    output: Annotated[str, typer.Option("--output", "-o", help="The file to write ('-': stdout)")] = "-",
    start: Annotated[str | None, typer.Option(help="RFC 3339 start (default: the execution's start)")] = None,
    end: Annotated[str | None, typer.Option(help="RFC 3339 end (default: its end, or now)")] = None,
    prometheus_url: PrometheusOpt = None,
    database: DatabaseOpt = None,
    demo: DemoOpt = False,
) -> None:
    """Export every sample of an execution (scrape resolution, per GPU) as CSV, Parquet or JSON lines."""
    from gpulens.service.export import FORMATS, ExportService, Row, encode

    if fmt not in FORMATS:
        fail(f"--format must be one of {', '.join(FORMATS)}", 2)
    if output == "-" and fmt == "parquet" and sys.stdout.isatty():
        fail("Parquet is binary: pass -o FILE", 2)
    start_ms, end_ms = parse_bounds(start, end)
    target = None if output == "-" else Path(output)
    partial = None if target is None else target.with_name(target.name + ".partial")
    with in_process(prometheus_url, database, demo) as ctx:

        async def run(sink: BinaryIO) -> int:
            opened = await ExportService(ctx.metrics).open(CLI_ADMIN, execution_id, start_ms, end_ms)
            rows = 0
            show = target is not None or err_console.is_terminal
            progress = Progress(
                TextColumn("[bold]export[/bold] {task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("hours"),
                TimeRemainingColumn(),
                console=err_console,
                disable=not show,
                transient=False,
            )
            task = progress.add_task(f"{fmt} {execution_id}", total=opened.chunk_count)

            async def counted() -> AsyncIterator[list[Row]]:
                nonlocal rows
                async for batch in opened.batches():
                    rows += len(batch)
                    yield batch
                    progress.advance(task)

            with progress:
                async for piece in encode(fmt, opened.hostname, counted()):
                    sink.write(piece)
            return rows

        try:
            if target is None or partial is None:
                rows = anyio.run(run, sys.stdout.buffer)
                sys.stdout.buffer.flush()
            else:
                with partial.open("wb") as sink:
                    rows = anyio.run(run, sink)
                os.replace(partial, target)
        except BrokenPipeError:  # `| head`: the reader has what it wanted
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            raise typer.Exit(0) from None
        except OSError as exc:
            fail(f"cannot write {output}: {exc.strerror or exc}")
        finally:
            if partial is not None:
                partial.unlink(missing_ok=True)
    if target is not None:
        err_console.print(f"{rows:,} rows → {target} ({target.stat().st_size:,} bytes)")
