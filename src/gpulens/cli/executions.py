"""`gpulens executions`: register, update and list executions (as the platform admin would over HTTP)."""

from __future__ import annotations

from typing import Annotated, Any, TypeVar

import anyio
import typer
from rich.table import Table

from gpulens.cli.common import (
    CLI_ADMIN,
    DatabaseOpt,
    fail,
    optional_time,
    out_console,
    page_json,
    parse_time,
    registry_errors,
    registry_for,
    short_time,
    split_list,
)
from gpulens.domain import limits
from gpulens.domain.models import Execution, ExecutionStatus
from gpulens.domain.timeparse import format_optional, format_rfc3339
from gpulens.service.executions import ExecutionFields, ExecutionService

app = typer.Typer(no_args_is_help=True, help="Register, update and list executions.")
console = out_console()

T = TypeVar("T")

# the service's field names -> this command's options, where they differ
_FLAGS = {"gpus": "--gpu", "system_errors": "--system-error"}

Hostname = Annotated[str | None, typer.Option("--hostname", help="The host it runs on")]
Gpus = Annotated[
    list[str] | None,
    typer.Option(
        "--gpu",
        "--gpus",
        help="GPU indices or GPU/MIG UUIDs (repeatable or comma-separated); none: every GPU of the host",
    ),
]
Status = Annotated[ExecutionStatus | None, typer.Option("--status", case_sensitive=False)]
StartTime = Annotated[str | None, typer.Option("--start-time", help="RFC 3339, Unix seconds or 'now'")]
EndTime = Annotated[str | None, typer.Option("--end-time", help="RFC 3339, Unix seconds, 'now' or 'none'")]
Profile = Annotated[str | None, typer.Option("--hardware-profile", help="e.g. gpu.h100")]
ExecType = Annotated[str | None, typer.Option("--execution-type", help="e.g. gpu.h100")]
FileName = Annotated[str | None, typer.Option("--file-name")]
Project = Annotated[str | None, typer.Option("--project")]
User = Annotated[str | None, typer.Option("--user", help="Who ran it: a login or an e-mail address")]
ReturnCode = Annotated[int | None, typer.Option("--return-code")]
SystemErrors = Annotated[list[str] | None, typer.Option("--system-error", help="Repeatable")]


def _fields(
    *,
    hostname: str | None,
    gpus: list[str] | None,
    status: ExecutionStatus | None,
    start_time: str | None,
    end_time: str | None,
    hardware_profile: str | None,
    execution_type: str | None,
    file_name: str | None,
    project: str | None,
    user: str | None,
    return_code: int | None,
    system_errors: list[str] | None,
) -> ExecutionFields:
    """Only the options given (None = not given; 'none' clears a time)."""
    fields = ExecutionFields()
    plain: dict[str, Any] = {
        "hostname": hostname,
        "status": status,
        "hardware_profile": hardware_profile,
        "execution_type": execution_type,
        "file_name": file_name,
        "project": project,
        "user": user,
        "return_code": return_code,
    }
    for name, value in plain.items():
        if value is not None:
            fields[name] = value  # type: ignore[literal-required]
    if gpus:
        fields["gpus"] = split_list(gpus)
    if system_errors:
        fields["system_errors"] = system_errors
    if start_time is not None:
        fields["start_time"] = optional_time(start_time, "--start-time")
    if end_time is not None:
        fields["end_time"] = optional_time(end_time, "--end-time")
    return fields


def execution_dict(execution: Execution) -> dict[str, object]:
    t = format_optional
    return {
        "execution_id": execution.execution_id,
        "org": execution.org,
        "project": execution.project,
        "user": execution.user,
        "hostname": execution.hostname,
        "gpus": list(execution.gpus),
        "status": execution.status.value,
        "hardware_profile": execution.hardware_profile,
        "execution_type": execution.execution_type,
        "file_name": execution.file_name,
        "created_at": t(execution.created_at),
        "start_time": t(execution.start_time),
        "end_time": t(execution.end_time),
        "return_code": execution.return_code,
        "system_errors": list(execution.system_errors),
    }


@app.command("add")
def add(
    *,
    org: Annotated[str, typer.Option("--org", help="The org it belongs to (created if new)")],
    execution_id: Annotated[
        str | None, typer.Option("--execution-id", help="Default: a new UUID; an existing id is updated")
    ] = None,
    hostname: Hostname = None,
    gpu: Gpus = None,
    status: Status = None,
    start_time: StartTime = None,
    end_time: EndTime = None,
    hardware_profile: Profile = None,
    execution_type: ExecType = None,
    file_name: FileName = None,
    project: Project = None,
    user: User = None,
    return_code: ReturnCode = None,
    system_error: SystemErrors = None,
    created_at: Annotated[str | None, typer.Option("--created-at", help="Default: now")] = None,
    database: DatabaseOpt = None,
) -> None:
    """Register an execution (status defaults to pending); prints its id as the last line."""
    fields = _fields(
        hostname=hostname,
        gpus=gpu,
        status=status,
        start_time=start_time,
        end_time=end_time,
        hardware_profile=hardware_profile,
        execution_type=execution_type,
        file_name=file_name,
        project=project,
        user=user,
        return_code=return_code,
        system_errors=system_error,
    )
    fields["org"] = org
    fields["execution_id"] = execution_id
    if created_at is not None:
        fields["created_at"] = parse_time(created_at, "--created-at")
    with registry_for(database) as registry, registry_errors(_FLAGS):
        service = ExecutionService(registry)
        execution, created = anyio.run(lambda: service.register(CLI_ADMIN, fields))
    verb = "registered" if created else "updated"
    typer.echo(
        f"{verb} execution of org {execution.org}: {execution.status.value} on {execution.hostname or '-'}"
    )
    typer.echo(execution.execution_id)


@app.command("update")
def update(
    *,
    execution_id: Annotated[str, typer.Argument(help="The execution to change")],
    hostname: Hostname = None,
    gpu: Gpus = None,
    all_gpus: Annotated[
        bool, typer.Option("--all-gpus", help="Forget the GPU list: every GPU of the host")
    ] = False,
    status: Status = None,
    start_time: StartTime = None,
    end_time: EndTime = None,
    hardware_profile: Profile = None,
    execution_type: ExecType = None,
    file_name: FileName = None,
    project: Project = None,
    user: User = None,
    return_code: ReturnCode = None,
    system_error: SystemErrors = None,
    database: DatabaseOpt = None,
) -> None:
    """Change some fields of an execution (only the options given)."""
    fields = _fields(
        hostname=hostname,
        gpus=gpu,
        status=status,
        start_time=start_time,
        end_time=end_time,
        hardware_profile=hardware_profile,
        execution_type=execution_type,
        file_name=file_name,
        project=project,
        user=user,
        return_code=return_code,
        system_errors=system_error,
    )
    if all_gpus:
        if gpu:
            fail("--gpu and --all-gpus exclude each other", 2)
        fields["gpus"] = ()
    if not fields:
        fail("nothing to update: give at least one option (see --help)", 2)
    with registry_for(database) as registry, registry_errors(_FLAGS):
        service = ExecutionService(registry)
        execution = anyio.run(lambda: service.update(CLI_ADMIN, execution_id, fields))
    end = format_rfc3339(execution.end_time) if execution.end_time else "-"
    typer.echo(f"updated {execution.execution_id}: {execution.status.value}, end {end}")


@app.command("list")
def list_executions(
    *,
    org: Annotated[str | None, typer.Option("--org", help="Only this org")] = None,
    status: Annotated[
        list[ExecutionStatus] | None, typer.Option("--status", case_sensitive=False, help="Repeatable")
    ] = None,
    limit: Annotated[int, typer.Option("--limit", min=1, max=limits.EXECUTION_PAGE_MAX)] = 50,
    offset: Annotated[int, typer.Option("--offset", min=0)] = 0,
    as_json: Annotated[
        bool, typer.Option("--json", help="JSON {executions, total, limit, offset} instead of a table")
    ] = False,
    database: DatabaseOpt = None,
) -> None:
    """List executions, newest first."""
    with registry_for(database) as registry, registry_errors():
        service = ExecutionService(registry)
        page = anyio.run(
            lambda: service.list_all(CLI_ADMIN, org=org, statuses=status, limit=limit, offset=offset)
        )
    if as_json:
        items = [execution_dict(e) for e in page.executions]
        typer.echo(page_json("executions", items, page.total, page.limit, page.offset))
        return
    if not page.executions:
        console.print("[dim]no executions[/dim]")
        return
    table = Table(title=f"Executions ({len(page.executions)} of {page.total}, newest first; times UTC)")
    table.add_column("ID", style="cyan", overflow="fold", min_width=8)
    table.add_column("Org")
    table.add_column("Status", no_wrap=True)
    table.add_column("Host", overflow="fold")
    table.add_column("GPUs", overflow="fold")
    table.add_column("Profile", style="magenta")
    table.add_column("Start", style="dim", no_wrap=True)
    table.add_column("End", style="dim", no_wrap=True)
    for e in page.executions:
        table.add_row(
            e.execution_id,
            e.org,
            e.status.value,
            e.hostname or "—",
            ",".join(e.gpus) or "all",
            e.hardware_profile or "—",
            short_time(e.start_time),
            short_time(e.end_time),
        )
    console.print(table)
