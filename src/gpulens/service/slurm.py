"""Slurm jobs discovered and synced into the registry (planning/slurm.py says what becomes what).

Two sources of job records: slurmrestd (`SlurmRestSource`: the API version negotiated from the
server's OpenAPI listing, JWT auth) and the client commands on this host (`SlurmCliSource`:
`sacct --json` for the accounting view where slurmdbd runs, then `squeue --json`, whose records of
running jobs hold the GPU indices).

slurmctld gives GPU indices only while a job holds its allocation. A sync never clears indices the
registry already holds (a pass that saw the job running stored them); for a job first seen after
it ended, the indices come from dcgm-exporter's `hpc_job` label (`--hpc-job-mapping-dir`) when a
metrics backend is given, else the job is registered without them and named in the report.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import re
import shutil
import subprocess
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from functools import partial
from typing import Any, Protocol

import anyio
import httpx

from gpulens.backends.base import MetricsBackend
from gpulens.config import Settings
from gpulens.domain import catalog as c
from gpulens.domain.errors import BackendError, Conflict, GpulensError, InvalidRequest
from gpulens.domain.models import ORG_SLUG_RE, ORG_SLUG_TEXT, Execution
from gpulens.domain.timeparse import datetime_to_ms
from gpulens.domain.workloads import Pod, Workload
from gpulens.planning.promql import one_of, series_match
from gpulens.planning.slurm import (
    SlurmFormatError,
    SlurmJob,
    SlurmPlan,
    merge_jobs,
    parse_jobs,
    plan_registrations,
)
from gpulens.storage.registry import MUTABLE_FIELDS, Registry

log = logging.getLogger("gpulens.slurm")

# slurmrestd's job APIs gpulens reads, oldest first (22.05's v0.0.38 .. 24.x/25.x's v0.0.42)
KNOWN_VERSIONS = ("v0.0.38", "v0.0.39", "v0.0.40", "v0.0.41", "v0.0.42")
OPENAPI_PATHS = ("/openapi/v3", "/openapi.json", "/openapi")
_JOBS_PATH = re.compile(r"^/slurm/(v\d+\.\d+\.\d+)/jobs/?$")
_ORG = re.compile(ORG_SLUG_RE)
_VERSION_KEY = re.compile(r"\d+")
_TOKEN = re.compile(r"[A-Za-z0-9_=-]+\.[A-Za-z0-9_=-]+\.[A-Za-z0-9_=-]*")
_SLURM_USER = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,127}")
DEFAULT_CLUSTER = "slurm"
HPC_JOB_LABEL = "hpc_job"  # dcgm-exporter --hpc-job-mapping-dir
HPC_JOB_METRIC = "DCGM_FI_DEV_GPU_UTIL"


class SlurmError(GpulensError):
    """Slurm (slurmrestd or the client commands) could not be asked, or answered something unusable."""


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(n) for n in _VERSION_KEY.findall(version))


def choose_version(paths: Iterable[str]) -> str:
    """The newest job API gpulens knows among the OpenAPI `paths` slurmrestd lists (pure)."""
    offered = sorted({m[1] for p in paths if (m := _JOBS_PATH.match(p))}, key=_version_key)
    usable = [v for v in offered if v in KNOWN_VERSIONS]
    if usable:
        return usable[-1]
    known = ", ".join(KNOWN_VERSIONS)
    if offered:
        raise SlurmError(
            f"slurmrestd offers the job API in {', '.join(offered)}; gpulens knows {known} "
            "(start slurmrestd with one of those, e.g. -s openapi/v0.0.38)"
        )
    raise SlurmError(f"slurmrestd lists no /slurm/<version>/jobs API; gpulens knows {known}")


def token_user(token: str) -> str | None:
    """The `sun` claim (Slurm user name) of a Slurm JWT, read without verifying it (slurmctld does)."""
    parts = token.split(".")
    if len(parts) != 3:
        return None
    payload = parts[1] + "=" * (-len(parts[1]) % 4)
    try:
        claims = json.loads(base64.urlsafe_b64decode(payload))
    except (binascii.Error, ValueError):
        return None
    sun = claims.get("sun") if isinstance(claims, dict) else None
    return sun if isinstance(sun, str) and sun else None


class JobSource(Protocol):
    name: str

    async def jobs(self, since_ms: int) -> tuple[list[SlurmJob], list[str]]:
        """The job records slurmctld (and the accounting, where asked) hold; lines of unreadable ones."""
        ...

    async def aclose(self) -> None: ...


@dataclass
class SlurmRestSource:
    """slurmrestd at `url`, with a JWT and the user name it belongs to (default: the token's `sun`)."""

    url: str
    token: str
    user: str | None = None
    timeout_s: float = 30.0
    transport: httpx.AsyncBaseTransport | None = None
    version: str | None = None  # negotiated on first use
    name: str = "slurmrestd"
    _client: httpx.AsyncClient | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if not self.token.strip():
            raise SlurmError("slurmrestd needs a token (GPULENS_SLURM_TOKEN or GPULENS_SLURM_TOKEN_FILE)")
        self.token = self.token.strip()
        if not _TOKEN.fullmatch(self.token):
            raise SlurmError("the Slurm token is not a JWT (three base64url parts joined by dots)")
        self.user = self.user or token_user(self.token)
        if not self.user:
            raise SlurmError("the Slurm token names no user (`sun` claim): set GPULENS_SLURM_USER")
        if not _SLURM_USER.fullmatch(self.user):
            raise SlurmError(f"not a Slurm user name: {self.user[:60]!r} (letters, digits, ._-)")

    def _http(self) -> httpx.AsyncClient:
        if self._client is None:
            self._client = httpx.AsyncClient(
                base_url=self.url.rstrip("/"),
                timeout=self.timeout_s,
                transport=self.transport,
                headers={"X-SLURM-USER-NAME": self.user or "", "X-SLURM-USER-TOKEN": self.token},
            )
        return self._client

    async def _get(self, path: str) -> Any:
        try:
            resp = await self._http().get(path)
        except httpx.HTTPError as exc:
            raise SlurmError(f"slurmrestd at {self.url} unreachable: {type(exc).__name__}: {exc}") from None
        if resp.status_code in (401, 403):
            raise SlurmError(
                f"slurmrestd refused the token for user {self.user!r} ({resp.status_code}): "
                "check GPULENS_SLURM_TOKEN and GPULENS_SLURM_USER"
            )
        if resp.status_code == 404:
            return None
        if resp.status_code >= 400:
            raise SlurmError(f"slurmrestd answered {resp.status_code} to GET {path}: {resp.text[:200]}")
        try:
            return resp.json()
        except ValueError:
            raise SlurmError(f"slurmrestd answered GET {path} with something that is not JSON") from None

    async def negotiate(self) -> str:
        if self.version is None:
            for path in OPENAPI_PATHS:
                spec = await self._get(path)
                if isinstance(spec, Mapping) and isinstance(spec.get("paths"), Mapping):
                    self.version = choose_version(spec["paths"])
                    break
            else:
                raise SlurmError(
                    f"slurmrestd at {self.url} lists no OpenAPI paths ({', '.join(OPENAPI_PATHS)})"
                )
        return self.version

    async def jobs(self, since_ms: int) -> tuple[list[SlurmJob], list[str]]:
        version = await self.negotiate()
        payload = await self._get(f"/slurm/{version}/jobs")
        if payload is None:
            raise SlurmError(f"slurmrestd has no /slurm/{version}/jobs")
        errors = payload.get("errors") if isinstance(payload, Mapping) else None
        if errors and not payload.get("jobs"):
            raise SlurmError(f"slurmrestd: {str(errors)[:300]}")
        try:
            return parse_jobs(payload)
        except SlurmFormatError as exc:
            raise SlurmError(f"slurmrestd /slurm/{version}/jobs: {exc}") from None

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None


Runner = Callable[[Sequence[str]], "subprocess.CompletedProcess[str]"]


def _run(argv: Sequence[str], timeout_s: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(  # noqa: S603 - Slurm's client commands, no shell
        list(argv), capture_output=True, text=True, check=False, timeout=timeout_s
    )


@dataclass
class SlurmCliSource:
    """`sacct --json` (when accounting answers) and `squeue --json` on this host."""

    squeue: str = "squeue"
    sacct: str | None = "sacct"
    runner: Runner = _run
    name: str = "squeue/sacct"
    notes: list[str] = field(default_factory=list)

    def _json(self, argv: Sequence[str]) -> Any:
        try:
            done = self.runner(argv)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise SlurmError(f"{argv[0]}: {exc}") from None
        if done.returncode != 0:
            raise SlurmError(f"{' '.join(argv[:2])} failed ({done.returncode}): {done.stderr.strip()[:300]}")
        try:
            return json.loads(done.stdout)
        except ValueError:
            raise SlurmError(f"{' '.join(argv[:2])} printed something that is not JSON") from None

    def _collect(self, since_ms: int) -> tuple[list[SlurmJob], list[str]]:
        if shutil.which(self.squeue) is None:
            raise SlurmError(f"{self.squeue} is not on PATH (and no GPULENS_SLURM_URL is set)")
        bad: list[str] = []
        accounted: list[SlurmJob] = []
        if self.sacct and shutil.which(self.sacct) is not None:
            since = datetime.fromtimestamp(since_ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%S")
            try:  # accounting: every job since, also those slurmctld has forgotten
                payload = self._json(
                    [self.sacct, "--json", "--allusers", "--allocations", f"--starttime={since}"]
                )
                accounted, bad = parse_jobs(payload)
            except (SlurmError, SlurmFormatError) as exc:
                self.notes.append(f"sacct not used: {exc}")
        try:
            live, more = parse_jobs(self._json([self.squeue, "--json", "--states=all"]))
        except SlurmFormatError as exc:
            raise SlurmError(f"squeue --json: {exc}") from None
        return merge_jobs(accounted, live), bad + more

    async def jobs(self, since_ms: int) -> tuple[list[SlurmJob], list[str]]:
        return await anyio.to_thread.run_sync(partial(self._collect, since_ms))

    async def aclose(self) -> None:
        return None


@dataclass(frozen=True, slots=True)
class SlurmCounts:
    executions_created: int = 0
    executions_updated: int = 0
    executions_unchanged: int = 0
    workloads_created: int = 0
    workloads_updated: int = 0
    workloads_unchanged: int = 0
    skipped: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class SlurmDiscoveryReport:
    org: str
    source: str
    start_ms: int
    end_ms: int
    jobs_seen: int
    jobs_registered: int
    without_gpus: int
    counts: SlurmCounts
    unknown_gpus: tuple[str, ...] = ()
    ignored: tuple[str, ...] = ()
    job_ids: tuple[str, ...] = ()

    def summary(self) -> str:
        n = self.counts
        text = (
            f"slurm discovery ({self.source}) for org {self.org}: {self.jobs_seen} jobs seen, "
            f"{self.jobs_registered} with GPUs; executions {n.executions_created} created, "
            f"{n.executions_updated} updated, {n.executions_unchanged} unchanged; workloads "
            f"{n.workloads_created} created, {n.workloads_updated} updated, {n.workloads_unchanged} unchanged"
        )
        for what, items in (("skipped", n.skipped), ("GPU indices unknown", self.unknown_gpus)):
            if items:
                text += f"; {len(items)} {what}"
        return text


def _in_window(job: SlurmJob, since_ms: int) -> bool:
    """Active jobs, and ended ones that ended (or, without an end, started or were submitted) since."""
    if job.status.is_active:
        return True
    last = job.end_ms or job.start_ms or job.submit_ms
    return last is None or last >= since_ms


async def hpc_job_gpus(
    backend: MetricsBackend, jobs: Sequence[SlurmJob], start_ms: int, end_ms: int
) -> dict[tuple[int, str], tuple[str, ...]]:
    """(job id, host) -> GPU indices from dcgm-exporter's `hpc_job` label, for `jobs` (pure look-up)."""
    ids = sorted({str(j.job_id) for j in jobs})
    out: dict[tuple[int, str], set[str]] = {}
    for chunk in (ids[k : k + 200] for k in range(0, len(ids), 200)):
        match = series_match([one_of(c.LABEL_METRIC_NAME, [HPC_JOB_METRIC]), one_of(HPC_JOB_LABEL, chunk)])
        for labels in await backend.series(match, start_ms, end_ms):
            host = next((labels[k] for k in c.DCGM_HOST_LABELS if labels.get(k)), None)
            gpu = labels.get(c.LABEL_GPU, "")
            # one file per GPU may list several jobs: the label holds them comma- or newline-separated
            for job in re.split(r"[,\s]+", labels.get(HPC_JOB_LABEL, "")):
                if job.isdigit() and host and gpu.isdigit():
                    out.setdefault((int(job), host), set()).add(gpu)
    return {k: tuple(sorted(v, key=int)) for k, v in out.items()}


def _stored_gpus(registry: Registry, plan: SlurmPlan) -> dict[str, Execution]:
    """Execution id -> the stored execution, for planned executions that come without GPUs while the
    registry has them (a pass saw the job running): its GPUs and hardware profile are kept."""
    out = {}
    for e in plan.executions:
        if not e.gpus:
            stored = registry.get_execution(e.execution_id)
            if stored is not None and stored.gpus:
                out[e.execution_id] = stored
    return out


def _sync(registry: Registry, plan: SlurmPlan, now: datetime) -> SlurmCounts:
    counts = dict.fromkeys((n for n in SlurmCounts.__slots__ if n != "skipped"), 0)
    skipped: list[str] = []
    kept = _stored_gpus(registry, plan)
    fields_ = sorted(MUTABLE_FIELDS)
    for planned in plan.executions:
        known = kept.get(planned.execution_id)
        e = (
            planned
            if known is None
            else replace(planned, gpus=known.gpus, hardware_profile=known.hardware_profile)
        )
        stored = registry.get_execution(e.execution_id)
        if stored is not None and stored.org != e.org:
            skipped.append(f"execution {e.execution_id} belongs to another org")
            continue
        if stored is not None and all(getattr(stored, f) == getattr(e, f) for f in fields_):
            counts["executions_unchanged"] += 1
            continue
        try:
            registry.upsert_execution(e, now=now)
        except Conflict as exc:
            skipped.append(exc.message)
            continue
        counts["executions_created" if stored is None else "executions_updated"] += 1
    for workload, pods in plan.workloads:
        merged = [p if p.pod_id not in kept else replace(p, gpus=kept[p.pod_id].gpus) for p in pods]
        stored_w = registry.get_workload(workload.workload_id)
        if stored_w is not None and stored_w.org != workload.org:
            skipped.append(f"workload {workload.workload_id} belongs to another org")
            continue
        if stored_w is not None and _same_workload(registry, stored_w, workload, merged):
            counts["workloads_unchanged"] += 1
            continue
        try:
            registry.upsert_workload(workload, merged, now=now)
        except Conflict as exc:
            skipped.append(exc.message)
            continue
        counts["workloads_created" if stored_w is None else "workloads_updated"] += 1
    return SlurmCounts(**counts, skipped=tuple(skipped))


def _same_workload(registry: Registry, stored: Workload, planned: Workload, pods: Sequence[Pod]) -> bool:
    if (stored.name, stored.project) != (planned.name, planned.project):
        return False
    for pod in pods:
        have = registry.get_pod(pod.pod_id)
        if have is None or have != pod:
            return False
    return True


async def discover_slurm(
    source: JobSource,
    registry: Registry,
    org: str,
    *,
    since_ms: int,
    now: datetime | None = None,
    cluster: str | None = None,
    include_cpu_jobs: bool = False,
    backend: MetricsBackend | None = None,
    only: Sequence[str] = (),
) -> SlurmDiscoveryReport:
    """Register the GPU jobs that ran since `since_ms` (and every active one) in `org`; idempotent.

    `only`: job ids (12, 10_3, 20+1, or an array's/heterogeneous job's id) to restrict to.
    """
    if not isinstance(org, str) or not _ORG.fullmatch(org):
        raise InvalidRequest(f"org must be {ORG_SLUG_TEXT}, got {org!r}")
    now = now or datetime.now(UTC)
    end_ms = datetime_to_ms(now)
    if since_ms >= end_ms:
        raise InvalidRequest("the discovery window must end after it starts")
    records, bad = await source.jobs(since_ms)
    jobs = [j for j in records if _in_window(j, since_ms)]
    if only:
        jobs = [j for j in jobs if any(j.matches(w) for w in only)]
    known: dict[tuple[int, str], tuple[str, ...]] = {}
    missing = [j for j in jobs if j.wants_gpus and j.nodes and set(j.gpus_by_node) != set(j.nodes)]
    if backend is not None and missing:
        try:
            known = await hpc_job_gpus(backend, missing, since_ms, end_ms)
        except BackendError as exc:
            log.warning("hpc_job look-up failed: %s", exc.message)
    plan = plan_registrations(
        jobs,
        org=org,
        cluster=cluster or DEFAULT_CLUSTER,
        now=now,
        known_gpus=known,
        include_cpu_jobs=include_cpu_jobs,
    )
    counts = await anyio.to_thread.run_sync(partial(_sync, registry, plan, now))
    stored = await anyio.to_thread.run_sync(partial(_still_unknown, registry, plan))
    notes = list(getattr(source, "notes", ()))
    return SlurmDiscoveryReport(
        org=org,
        source=source.name,
        start_ms=since_ms,
        end_ms=end_ms,
        jobs_seen=len(jobs),
        jobs_registered=len(plan.jobs),
        without_gpus=plan.without_gpus,
        counts=counts,
        unknown_gpus=tuple(stored),
        ignored=tuple([*bad, *plan.ignored, *notes]),
        job_ids=tuple(j.display_id for j in plan.jobs),
    )


def _still_unknown(registry: Registry, plan: SlurmPlan) -> list[str]:
    """The planned GPU jobs' executions whose GPUs are unknown even after the sync (none stored either)."""
    out = []
    unknown = set(plan.unknown_ids)
    for e in plan.executions:
        if e.execution_id not in unknown:
            continue
        stored = registry.get_execution(e.execution_id)
        if stored is None or not stored.gpus:
            out.append(f"execution {e.execution_id} on {e.hostname}")
    return out


async def _renewed(current: JobSource | None, fresh: JobSource) -> JobSource:
    """`fresh` when the settings changed (a rotated token), keeping the negotiated API version; else
    `current` (its HTTP connections kept)."""
    if current is None:
        return fresh
    if isinstance(current, SlurmRestSource) and isinstance(fresh, SlurmRestSource):
        if (fresh.url, fresh.token, fresh.user) == (current.url, current.token, current.user):
            return current
        fresh.version = current.version
    await current.aclose()
    return fresh


async def slurm_discovery_task(
    make_source: Callable[[], JobSource],
    registry: Registry,
    org: str,
    *,
    interval_s: float,
    first_window_s: float = 86_400.0,
    overlap_s: float = 600.0,
    cluster: str | None = None,
    backend: MetricsBackend | None = None,
    clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    on_report: Callable[[SlurmDiscoveryReport], None] | None = None,
) -> None:
    """Discover every `interval_s` until cancelled (serve runs it with GPULENS_SLURM_URL set).

    Each pass looks back to `overlap_s` before the last successful pass (the first: `first_window_s`),
    so a job that ended while gpulens was down is registered on the first pass after it is back, as
    long as slurmctld (MinJobAge) or the accounting still holds it. Failures are logged; the loop goes on.
    """
    last_ms: int | None = None
    source: JobSource | None = None
    try:
        while True:
            now = clock()
            now_ms = datetime_to_ms(now)
            back = first_window_s if last_ms is None else (now_ms - last_ms) / 1000 + overlap_s
            try:
                source = await _renewed(source, make_source())  # the token file is read every pass
                report = await discover_slurm(
                    source,
                    registry,
                    org,
                    since_ms=now_ms - round(back * 1000),
                    now=now,
                    cluster=cluster,
                    backend=backend,
                )
            except GpulensError as exc:
                log.warning("slurm discovery failed: %s", exc.message)
            except Exception:
                log.exception("slurm discovery failed")
            else:
                last_ms = now_ms
                log.info("%s", report.summary())
                if on_report is not None:
                    on_report(report)
            await anyio.sleep(interval_s)
    finally:
        if source is not None:
            with anyio.CancelScope(shield=True):
                await source.aclose()


def slurm_rest_source(settings: Settings, url: str | None = None, user: str | None = None) -> SlurmRestSource:
    """slurmrestd as the settings (or the command's flags) name it; the token is read now."""
    where = url or settings.slurm_url
    if not where:
        raise SlurmError("no slurmrestd URL: set GPULENS_SLURM_URL")
    try:
        token = settings.slurm_jwt()
    except OSError as exc:
        raise SlurmError(f"GPULENS_SLURM_TOKEN_FILE: cannot read it: {exc.strerror}") from None
    if not token:
        raise SlurmError("slurmrestd needs a token: set GPULENS_SLURM_TOKEN or GPULENS_SLURM_TOKEN_FILE")
    return SlurmRestSource(where, token, user or settings.slurm_user)
