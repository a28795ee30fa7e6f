"""`gpulens run -- CMD [ARGS]`: run a command as an execution of this host, sampled while it runs.

The command keeps its stdin/stdout/stderr and its exit code; gpulens only writes to stderr: the
execution id at the start and a one-line summary at the end. It registers the execution through the
service the admin API uses (the same checks) and writes the sample store itself, so it works with or
without a running `gpulens serve`, and finishes if that dies.
"""

from __future__ import annotations

import getpass
import os
import re
import signal
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from types import FrameType
from typing import Annotated

import anyio
import typer

from gpulens.agent.samples import Sample
from gpulens.cli.common import CLI_ADMIN, DatabaseOpt, fail, load_settings, open_registry, registry_errors
from gpulens.cli.local import LOCAL_ORG, open_local
from gpulens.domain import catalog as c
from gpulens.domain import limits
from gpulens.domain.models import GPU_ID_RE, GPU_ID_TEXT, USER_RE, Execution, ExecutionStatus
from gpulens.service.executions import ExecutionFields, ExecutionService

_GPU = re.compile(GPU_ID_RE)


def gpu_list(flag: str | None, environ: dict[str, str]) -> tuple[str, ...]:
    """--gpus, else CUDA_VISIBLE_DEVICES, else every GPU (empty). Invalid entries are refused."""
    raw = flag if flag is not None else environ.get("CUDA_VISIBLE_DEVICES")
    if raw is None or raw.strip() in ("", "all"):
        return ()
    gpus = tuple(g.strip() for g in raw.split(",") if g.strip())
    bad = [g for g in gpus if not _GPU.fullmatch(g)]
    if bad:
        raise ValueError(f"not a GPU index or UUID: {bad[0]!r} (give {GPU_ID_TEXT})")
    if len(gpus) > limits.GPUS_MAX:
        raise ValueError(f"at most {limits.GPUS_MAX} GPUs")
    return gpus


_SUMMARY_SERIES = frozenset({c.DCGM_GPU_UTIL, c.DCGM_FB_USED, c.DCGM_TOTAL_ENERGY_CONSUMPTION})


USER_PATTERN = re.compile(USER_RE)


def login_name() -> str | None:
    """The login running gpulens (`getpass.getuser`: LOGNAME, USER, the password database), when it
    is a valid user name (a name with other characters is left out, not refused)."""
    try:
        name = getpass.getuser()
    except (KeyError, OSError):  # no such variable and no password entry (a container's bare uid)
        return None
    return name if USER_PATTERN.fullmatch(name) else None


@dataclass(slots=True)
class Summary:
    """What the end-of-run line reports, accumulated pass by pass (a sink of the collector)."""

    gpus: frozenset[str]  # indices or UUIDs; empty = every GPU
    util_sum: float = 0.0
    util_count: int = 0
    peak_fb_mib: float = 0.0
    energy_first: dict[str, float] = field(default_factory=dict)
    energy_last: dict[str, float] = field(default_factory=dict)

    def _mine(self, s: Sample) -> bool:
        return not self.gpus or s.label(c.LABEL_GPU) in self.gpus or s.label(c.LABEL_UUID) in self.gpus

    def write(self, samples: Sequence[Sample]) -> None:
        for s in samples:
            if s.name not in _SUMMARY_SERIES or not self._mine(s):
                continue
            if s.name == c.DCGM_GPU_UTIL:
                self.util_sum += s.value
                self.util_count += 1
            elif s.name == c.DCGM_FB_USED:
                self.peak_fb_mib = max(self.peak_fb_mib, s.value)
            elif s.name == c.DCGM_TOTAL_ENERGY_CONSUMPTION:
                gpu = s.label(c.LABEL_GPU)
                self.energy_first.setdefault(gpu, s.value)
                self.energy_last[gpu] = s.value

    def line(self, execution_id: str, seconds: float, status: str, code: int) -> str:
        parts = [f"gpulens: {execution_id} {status} (exit {code}) after {seconds:.1f} s"]
        if self.util_count:
            energy_j = sum(self.energy_last[g] - self.energy_first[g] for g in self.energy_last) / 1000
            parts.append(f"mean GPU util {self.util_sum / self.util_count:.1f} %")
            parts.append(f"peak GPU memory {self.peak_fb_mib / 1024:.1f} GiB")
            parts.append(
                f"energy {energy_j / 3600:.3f} Wh" if energy_j >= 3600 else f"energy {energy_j:.0f} J"
            )
        else:
            parts.append("no GPU readings")
        return ", ".join(parts)


def run_command(
    command: Annotated[list[str], typer.Argument(help="The command and its arguments (after --)")],
    name: Annotated[
        str | None, typer.Option("--name", help="A name for the run (default: the program)")
    ] = None,
    gpus: Annotated[
        str | None,
        typer.Option("--gpus", help="GPU indices/UUIDs, e.g. 0,1 (default: CUDA_VISIBLE_DEVICES, else all)"),
    ] = None,
    database: DatabaseOpt = None,
) -> None:
    """Run a command as an execution of this host; its exit code is gpulens's."""
    settings = load_settings(database_url=database)
    try:
        gpu_ids = gpu_list(gpus, dict(os.environ))
    except ValueError as exc:
        fail(str(exc), 2)
    registry = open_registry(settings)
    service = ExecutionService(registry)
    local = open_local(settings)
    summary = Summary(frozenset(gpu_ids))
    local.collector.sinks.append(summary)
    started = datetime.now(UTC)
    registration = ExecutionFields(
        org=LOCAL_ORG,
        execution_id=None,  # a new UUID
        hostname=local.hostname,
        gpus=gpu_ids,
        status=ExecutionStatus.RUNNING,
        created_at=started,
        start_time=started,
        file_name=(name or os.path.basename(command[0]))[: limits.FILE_NAME_MAX],
        execution_type="local",
    )
    user = login_name()
    if user is not None:
        registration["user"] = user  # who ran it, for the usage table and alert rules
    with registry_errors():
        execution, _ = anyio.run(lambda: service.register(CLI_ADMIN, registration))
    print(f"gpulens: execution {execution.execution_id} on {local.hostname}", file=sys.stderr, flush=True)
    local.start()
    interrupted: list[int] = []
    try:
        child = subprocess.Popen(command)  # noqa: S603 - the user's own command, as given
    except OSError as exc:
        local.close()
        error = str(exc)[: limits.SYSTEM_ERROR_MAX]
        _finish(service, execution, ExecutionFields(status=ExecutionStatus.FAILED, system_errors=(error,)))
        fail(f"cannot run {command[0]!r}: {exc.strerror or exc}", 127)

    def forward(signum: int, frame: FrameType | None) -> None:
        interrupted.append(signum)
        if child.poll() is None:
            child.send_signal(signum)

    # a signal this process was started ignoring (`nohup`, `cmd &` in a script) stays ignored: the
    # command inherited that too, so forwarding it would only mark a run aborted that goes on
    previous = {
        sig: signal.signal(sig, forward)
        for sig in (signal.SIGINT, signal.SIGTERM)
        if signal.getsignal(sig) is not signal.SIG_IGN
    }
    try:
        code = child.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    local.collector.collect()  # a last pass at the end of the run
    local.close()
    ended = datetime.now(UTC)
    exit_code = code if code >= 0 else 128 - code  # killed by a signal: the shell's convention
    if interrupted:
        status = ExecutionStatus.ABORTED
    else:
        status = ExecutionStatus.COMPLETED if code == 0 else ExecutionStatus.FAILED
    _finish(service, execution, ExecutionFields(status=status, end_time=ended, return_code=exit_code))
    seconds = (ended - started).total_seconds()
    print(summary.line(execution.execution_id, seconds, status.value, exit_code), file=sys.stderr, flush=True)
    try:
        from gpulens.cli.report import finding_lines  # the API stack only now, once the command ended

        for line in finding_lines(settings, registry, execution.execution_id):
            print(line, file=sys.stderr, flush=True)
    finally:
        registry.dispose()
    raise typer.Exit(exit_code)


def _finish(service: ExecutionService, execution: Execution, changes: ExecutionFields) -> None:
    """Record how the run ended (its end time defaults to now)."""
    changes.setdefault("end_time", datetime.now(UTC))
    with registry_errors():
        anyio.run(lambda: service.update(CLI_ADMIN, execution.execution_id, changes))
