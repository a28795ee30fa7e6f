"""`gpulens workloads`: register Run:ai-style workloads with their pods, list them, list and update pods."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any, TypeVar

import anyio
import typer
from pydantic import ValidationError
from rich.table import Table

from gpulens.cli.common import (
    CLI_ADMIN,
    DatabaseOpt,
    fail,
    optional_time,
    out_console,
    page_json,
    registry_errors,
    registry_for,
    short_time,
    split_list,
)
from gpulens.domain import limits
from gpulens.domain.timeparse import format_optional, format_rfc3339
from gpulens.domain.workloads import Pod, PodPhase, Workload
from gpulens.service.workloads import PodFields, WorkloadFields, WorkloadService

app = typer.Typer(no_args_is_help=True, help="Register workloads with their pods; list workloads and pods.")
console = out_console()

T = TypeVar("T")

# the service's field names -> this command's options, where they differ (`pods.0.`: the one pod
# that `add` builds from its options)
_POD_OPTIONS = {"pod_id": "--pod-id", "name": "--pod-name", "gpus": "--gpu", "start_time": "--start-time"}
_POD_OPTIONS |= {"end_time": "--end-time", "namespace": "--namespace", "node": "--node", "phase": "--phase"}
_FLAGS = {"gpus": "--gpu"}
_ADD_FLAGS = {f"pods.0.{name}": option for name, option in _POD_OPTIONS.items()}

Gpus = Annotated[
    list[str] | None,
    typer.Option("--gpu", "--gpus", help="GPU indices or GPU/MIG UUIDs (repeatable or comma-separated)"),
]
Phase = Annotated[PodPhase | None, typer.Option("--phase", case_sensitive=False)]
StartTime = Annotated[str | None, typer.Option("--start-time", help="RFC 3339, Unix seconds or 'now'")]
EndTime = Annotated[str | None, typer.Option("--end-time", help="RFC 3339, Unix seconds, 'now' or 'none'")]
Node = Annotated[str | None, typer.Option("--node", help="The node (host) the pod runs on")]
AsJson = Annotated[bool, typer.Option("--json", help="JSON instead of a table")]


def pod_dict(pod: Pod) -> dict[str, object]:
    return {
        "pod_id": pod.pod_id,
        "workload_id": pod.workload_id,
        "name": pod.name,
        "namespace": pod.namespace,
        "node": pod.node,
        "gpus": list(pod.gpus),
        "phase": pod.phase.value,
        "start_time": format_optional(pod.start_time),
        "end_time": format_optional(pod.end_time),
    }


def workload_dict(workload: Workload) -> dict[str, object]:
    return {
        "workload_id": workload.workload_id,
        "name": workload.name,
        "org": workload.org,
        "project": workload.project,
        "created_at": format_rfc3339(workload.created_at),
    }


def _validation_message(exc: ValidationError) -> str:
    first = exc.errors()[0]
    where = ".".join(str(p) for p in first.get("loc", ())) or "body"
    more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
    return f"{where}: {first.get('msg', 'invalid')}{more}"


def _read_body(file: str) -> WorkloadFields:
    """The same body as POST /api/v2/admin/workloads, validated the same way."""
    try:
        text = sys.stdin.read() if file == "-" else Path(file).read_text()
    except OSError as exc:
        fail(f"--file: {exc.strerror or exc}: {file}", 2)
    from gpulens.api.admin_workloads import WorkloadRegistration  # the API stack only when it is used

    try:
        return WorkloadRegistration.model_validate_json(text).fields()
    except ValidationError as exc:
        fail(f"--file: {_validation_message(exc)}", 2)


@app.command("add")
def add(
    *,
    file: Annotated[
        str | None,
        typer.Option("--file", "-f", help="A JSON body as for POST /api/v2/admin/workloads ('-': stdin)"),
    ] = None,
    org: Annotated[str | None, typer.Option("--org", help="The org it belongs to (created if new)")] = None,
    name: Annotated[str | None, typer.Option("--name", help="The workload's name")] = None,
    workload_id: Annotated[
        str | None, typer.Option("--workload-id", help="Default: a new UUID; an existing id is updated")
    ] = None,
    project: Annotated[str | None, typer.Option("--project")] = None,
    pod_name: Annotated[str | None, typer.Option("--pod-name", help="Add one pod with this name")] = None,
    pod_id: Annotated[
        str | None, typer.Option("--pod-id", help="The pod's UID (default: derived from the names)")
    ] = None,
    namespace: Annotated[str | None, typer.Option("--namespace", help="The pod's namespace")] = None,
    node: Node = None,
    gpu: Gpus = None,
    phase: Phase = None,
    start_time: StartTime = None,
    end_time: EndTime = None,
    database: DatabaseOpt = None,
) -> None:
    """Register a workload (from --file, or from the options with at most one pod); prints its id last."""
    pod_options = (pod_id, namespace, node, gpu, phase, start_time, end_time)
    if file is not None:
        if any(v is not None for v in (org, name, workload_id, project, pod_name, *pod_options)):
            fail("--file excludes the other options", 2)
        fields = _read_body(file)
    else:
        if org is None or name is None:
            fail("give --file, or --org and --name (see --help)", 2)
        fields = WorkloadFields(org=org, name=name, workload_id=workload_id, project=project)
        if pod_name is not None:
            if namespace is None:
                fail("--pod-name needs --namespace", 2)
            pod = PodFields(
                pod_id=pod_id, name=pod_name, namespace=namespace, node=node, gpus=split_list(gpu)
            )
            if phase is not None:
                pod["phase"] = phase
            pod["start_time"] = optional_time(start_time, "--start-time")
            pod["end_time"] = optional_time(end_time, "--end-time")
            fields["pods"] = [pod]
        elif any(v is not None for v in pod_options):
            fail("the pod options need --pod-name", 2)
    with registry_for(database) as registry, registry_errors(None if file is not None else _ADD_FLAGS):
        service = WorkloadService(registry)
        workload, pods, created = anyio.run(lambda: service.register(CLI_ADMIN, fields))
    verb = "registered" if created else "updated"
    typer.echo(f"{verb} workload {workload.name} of org {workload.org} with {len(pods)} pod(s)")
    typer.echo(workload.workload_id)


@app.command("list")
def list_workloads(
    *,
    org: Annotated[str | None, typer.Option("--org", help="Only this org")] = None,
    limit: Annotated[int, typer.Option("--limit", min=1, max=limits.RUNAI_PAGE_MAX)] = 50,
    offset: Annotated[int, typer.Option("--offset", min=0)] = 0,
    as_json: AsJson = False,
    database: DatabaseOpt = None,
) -> None:
    """List workloads, newest first."""
    with registry_for(database) as registry, registry_errors(_FLAGS):
        service = WorkloadService(registry)
        page = anyio.run(lambda: service.list_workloads(CLI_ADMIN, org=org, limit=limit, offset=offset))
    if as_json:
        items = [workload_dict(w) for w in page.workloads]
        typer.echo(page_json("workloads", items, page.total, page.limit, page.offset))
        return
    if not page.workloads:
        console.print("[dim]no workloads[/dim]")
        return
    table = Table(title=f"Workloads ({len(page.workloads)} of {page.total}, newest first; times UTC)")
    table.add_column("ID", style="cyan", no_wrap=True)
    table.add_column("Name", overflow="fold")
    table.add_column("Org")
    table.add_column("Project")
    table.add_column("Created", style="dim", no_wrap=True)
    for w in page.workloads:
        table.add_row(w.workload_id, w.name, w.org, w.project or "—", short_time(w.created_at))
    console.print(table)


@app.command("pods")
def list_pods(
    *,
    workload_id: Annotated[str, typer.Argument(help="The workload's id")],
    limit: Annotated[int, typer.Option("--limit", min=1, max=limits.RUNAI_PAGE_MAX)] = 50,
    offset: Annotated[int, typer.Option("--offset", min=0)] = 0,
    as_json: AsJson = False,
    database: DatabaseOpt = None,
) -> None:
    """List a workload's pods, by start time."""
    with registry_for(database) as registry, registry_errors(_FLAGS):
        service = WorkloadService(registry)
        page = anyio.run(lambda: service.list_pods_for(CLI_ADMIN, workload_id, offset=offset, limit=limit))
    if as_json:
        body: dict[str, Any] = {
            "workload": workload_dict(page.workload),
            "pods": [pod_dict(p) for p in page.pods],
            "total": page.total,
            "limit": page.limit,
            "offset": page.offset,
        }
        typer.echo(json.dumps(body, indent=2))
        return
    if not page.pods:
        console.print(f"[dim]no pods in workload {page.workload.name}[/dim]")
        return
    table = Table(title=f"Pods of {page.workload.name} ({len(page.pods)} of {page.total}; times UTC)")
    table.add_column("ID", style="cyan", no_wrap=True)
    table.add_column("Namespace/Name", overflow="fold")
    table.add_column("Phase", no_wrap=True)
    table.add_column("Node", overflow="fold")
    table.add_column("GPUs", overflow="fold")
    table.add_column("Start", style="dim", no_wrap=True)
    table.add_column("End", style="dim", no_wrap=True)
    for p in page.pods:
        table.add_row(
            p.pod_id,
            f"{p.namespace}/{p.name}",
            p.phase.value,
            p.node or "—",
            ",".join(p.gpus) or "by pod labels",
            short_time(p.start_time),
            short_time(p.end_time),
        )
    console.print(table)


@app.command("update-pod")
def update_pod(
    *,
    workload_id: Annotated[str, typer.Argument(help="The workload's id")],
    pod_id: Annotated[str, typer.Argument(help="The pod's id")],
    node: Node = None,
    gpu: Gpus = None,
    phase: Phase = None,
    start_time: StartTime = None,
    end_time: EndTime = None,
    database: DatabaseOpt = None,
) -> None:
    """Change some fields of a pod (only the options given)."""
    changes = PodFields()
    if node is not None:
        changes["node"] = node
    if gpu:
        changes["gpus"] = split_list(gpu)
    if phase is not None:
        changes["phase"] = phase
    if start_time is not None:
        changes["start_time"] = optional_time(start_time, "--start-time")
    if end_time is not None:
        changes["end_time"] = optional_time(end_time, "--end-time")
    if not changes:
        fail("nothing to update: give at least one option (see --help)", 2)
    with registry_for(database) as registry, registry_errors(_FLAGS):
        service = WorkloadService(registry)
        pod = anyio.run(lambda: service.update_pod(CLI_ADMIN, workload_id, pod_id, changes))
    end = format_rfc3339(pod.end_time) if pod.end_time else "-"
    typer.echo(f"updated pod {pod.namespace}/{pod.name}: {pod.phase.value}, end {end}")
