"""Slurm jobs as executions and workloads (pure): job records as slurmrestd, `squeue --json` and
`sacct --json` write them, read into `SlurmJob`, then planned into registrations.

One job (an array task or a heterogeneous component is a job of its own in Slurm, with its own id)
becomes, per node it ran on, one Lyceum execution (execution_id = uuid5(SLURM_NAMESPACE,
"<cluster>/<job id>/<node>")) holding that node's GPU indices; and one Run:ai-style workload per job
(a heterogeneous job's components together), with one pod per node and component whose pod_id is
the node's execution id.

The GPU indices come from `gres_detail` (one entry per node, in the node list's order: e.g.
`gpu:a100:2(IDX:0-1)` or `gpu:2(IDX:0,2-3)`). slurmctld reports them only while the job holds its
allocation: an ended job's record has none, so `known_gpus` (e.g. from dcgm-exporter's `hpc_job`
label, or what an earlier discovery stored) fills them in, and a job whose indices nobody knows is
registered without them and named in `SlurmPlan.unknown_gpus`.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from gpulens.domain import limits
from gpulens.domain.models import HOSTNAME_RE, PROJECT_RE, USER_RE, Execution, ExecutionStatus
from gpulens.domain.workloads import Pod, PodPhase, Workload

# Fixed forever: execution, pod and workload ids derived from it are what clients store.
SLURM_NAMESPACE = uuid.UUID("5d1f0f8e-3b7a-4c55-9a7e-51a7c0b5e201")
SLURM_POD_NAMESPACE_PREFIX = "slurm"

_HOSTNAME = re.compile(HOSTNAME_RE)
_PROJECT = re.compile(PROJECT_RE)
_USER = re.compile(USER_RE)
_K8S_LABEL_BAD = re.compile(r"[^a-z0-9-]+")
_K8S_NAME_BAD = re.compile(r"[^a-z0-9.-]+")
# one gres_detail entry: name[:type][:count](IDX:list) or name[:type]:count(IDX:N/A)
_GRES = re.compile(
    r"(?P<name>[A-Za-z0-9_]+)(?::(?P<type>[A-Za-z0-9_.-]+?))?(?::(?P<count>\d+))?(?:\((?P<rest>[^)]*)\))?"
)
_IDX = re.compile(r"IDX:(?P<list>[^)\s]*)")
_GPU_IN_TRES = re.compile(r"(?:^|[,;])(?:gres[/:])?gpu(?::(?P<type>[A-Za-z0-9_.-]+))?[:=](?P<count>\d+)")
MAX_INDEX = 10**limits.GPU_INDEX_DIGITS - 1
MAX_HOSTLIST = 100_000  # names one node list may expand to (a bigger one is refused, not expanded)


class SlurmFormatError(ValueError):
    """A job record or field gpulens cannot read."""


# -- states -----------------------------------------------------------------------------------------

_STATUS = {
    "PENDING": ExecutionStatus.PENDING,
    "REQUEUED": ExecutionStatus.PENDING,
    "REQUEUE_FED": ExecutionStatus.PENDING,
    "REQUEUE_HOLD": ExecutionStatus.PENDING,
    "RESV_DEL_HOLD": ExecutionStatus.PENDING,
    "CONFIGURING": ExecutionStatus.STARTING,
    "POWER_UP_NODE": ExecutionStatus.STARTING,
    "RUNNING": ExecutionStatus.RUNNING,
    "COMPLETING": ExecutionStatus.RUNNING,
    "SUSPENDED": ExecutionStatus.RUNNING,
    "STAGE_OUT": ExecutionStatus.RUNNING,
    "SIGNALING": ExecutionStatus.RUNNING,
    "RESIZING": ExecutionStatus.RUNNING,
    "COMPLETED": ExecutionStatus.COMPLETED,
    "FAILED": ExecutionStatus.FAILED,
    "TIMEOUT": ExecutionStatus.FAILED,
    "OUT_OF_MEMORY": ExecutionStatus.FAILED,
    "DEADLINE": ExecutionStatus.FAILED,
    "CANCELLED": ExecutionStatus.CANCELLED,
    "REVOKED": ExecutionStatus.CANCELLED,
    "SPECIAL_EXIT": ExecutionStatus.FAILED,
    "PREEMPTED": ExecutionStatus.ABORTED,
    "NODE_FAIL": ExecutionStatus.SYSTEM_FAILURE,
    "BOOT_FAIL": ExecutionStatus.SYSTEM_FAILURE,
    "LAUNCH_FAILED": ExecutionStatus.SYSTEM_FAILURE,
}
# Slurm states that say why a job did not complete, kept as a system error of its executions
_SYSTEM_ERROR_STATES = frozenset(
    {"TIMEOUT", "OUT_OF_MEMORY", "DEADLINE", "PREEMPTED", "NODE_FAIL", "BOOT_FAIL", "LAUNCH_FAILED"}
)
_PHASE = {
    ExecutionStatus.PENDING: PodPhase.PENDING,
    ExecutionStatus.STARTING: PodPhase.PENDING,
    ExecutionStatus.RUNNING: PodPhase.RUNNING,
    ExecutionStatus.COMPLETED: PodPhase.SUCCEEDED,
}


def job_status(state: str) -> ExecutionStatus:
    """A Slurm job state (the base state; flags such as COMPLETING on a running job ignored)."""
    return _STATUS.get(state.upper(), ExecutionStatus.FAILED if state else ExecutionStatus.PENDING)


# -- small parsers ----------------------------------------------------------------------------------


def parse_index_list(text: str) -> tuple[str, ...]:
    """`0-1`, `0,2-3` -> ("0", "1"), ("0", "2", "3"); refuses anything else."""
    out: list[int] = []
    for part in text.split(","):
        lo, sep, hi = part.partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()):
            raise SlurmFormatError(f"not a GPU index list: {text!r}")
        a, b = int(lo), int(hi) if sep else int(lo)
        if b < a or b > MAX_INDEX:
            raise SlurmFormatError(f"not a GPU index range: {part!r}")
        out.extend(range(a, b + 1))
    return tuple(str(k) for k in sorted(set(out)))


@dataclass(frozen=True, slots=True)
class GresGpus:
    """The GPUs of one gres_detail entry: their type (None when untyped) and indices (None: N/A)."""

    gpu_type: str | None
    count: int | None
    indices: tuple[str, ...] | None


def parse_gres_detail(entry: str) -> GresGpus | None:
    """One node's gres_detail: `gpu:a100:2(IDX:0-1)`, `gpu:2(IDX:0,2-3)`, or several GRES separated
    by commas outside parentheses (`gpu:a100:1(IDX:0),shard:0`); None when it holds no GPU."""
    found: GresGpus | None = None
    for item in _split_outside_parens(entry):
        m = _GRES.fullmatch(item.strip())
        if m is None:
            if item.strip():
                raise SlurmFormatError(f"not a GRES: {item!r}")
            continue
        if m["name"] != "gpu":
            continue
        gpu_type, count = m["type"], m["count"]
        if count is None and gpu_type is not None and gpu_type.isdigit():
            gpu_type, count = None, gpu_type
        indices: tuple[str, ...] | None = None
        rest = m["rest"] or ""
        idx = _IDX.search(rest)
        if idx is not None and idx["list"] not in ("", "N/A"):
            indices = parse_index_list(idx["list"])
        gpus = GresGpus(gpu_type, None if count is None else int(count), indices)
        if found is None:
            found = gpus
        else:  # two typed GPU entries on one node: both sets of indices
            merged = None
            if found.indices is not None or gpus.indices is not None:
                merged = tuple(sorted(set(found.indices or ()) | set(gpus.indices or ()), key=int))
            found = GresGpus(found.gpu_type or gpus.gpu_type, (found.count or 0) + (gpus.count or 0), merged)
    return found


def _split_outside_parens(text: str) -> list[str]:
    parts, depth, start = [], 0, 0
    for k, ch in enumerate(text):
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth = max(0, depth - 1)
        elif ch == "," and depth == 0:
            parts.append(text[start:k])
            start = k + 1
    parts.append(text[start:])
    return parts


def expand_hostlist(text: str) -> tuple[str, ...]:
    """A Slurm host list (`gpu[01-03,7],cpu1`, `r[1-2]n[1-2]`) as names, in order."""
    names: list[str] = []
    for item in _split_outside_brackets(text.strip()):
        if not item:
            continue
        expanded = [""]
        for literal, ranges in re.findall(r"([^\[]*)(?:\[([^\]]*)\])?", item):
            if not literal and not ranges:
                continue
            options = [literal]
            if ranges:
                options = [literal + n for n in _expand_ranges(ranges)]
            expanded = [a + b for a in expanded for b in options]
            if len(expanded) + len(names) > MAX_HOSTLIST:
                raise SlurmFormatError(f"host list {text[:80]!r} expands to more than {MAX_HOSTLIST} names")
        names.extend(expanded)
    return tuple(names)


def _split_outside_brackets(text: str) -> list[str]:
    parts, depth, start = [], 0, 0
    for k, ch in enumerate(text):
        if ch == "[":
            if depth:
                raise SlurmFormatError(f"nested brackets in host list {text[:80]!r}")
            depth = 1
        elif ch == "]":
            if not depth:
                raise SlurmFormatError(f"unbalanced host list {text[:80]!r}")
            depth = 0
        elif ch == "," and not depth:
            parts.append(text[start:k])
            start = k + 1
    if depth:
        raise SlurmFormatError(f"unbalanced host list {text[:80]!r}")
    parts.append(text[start:])
    return parts


def _expand_ranges(ranges: str) -> list[str]:
    out: list[str] = []
    for part in ranges.split(","):
        lo, sep, hi = part.partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()):
            raise SlurmFormatError(f"not a host range: {part!r}")
        if not sep:
            out.append(lo)
            continue
        a, b = int(lo), int(hi)
        if b < a or b - a >= MAX_HOSTLIST:
            raise SlurmFormatError(f"not a host range: {part!r}")
        width = len(lo) if lo.startswith("0") and len(lo) > 1 else 0
        out.extend(str(k).zfill(width) for k in range(a, b + 1))
    return out


def _number(value: Any) -> int | None:
    """An integer field of any API version: 5, {"set": true, "infinite": false, "number": 5}."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, Mapping):
        if value.get("set") is False or value.get("infinite") is True:
            return None
        return _number(value.get("number"))
    return None


def _object(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _state(job: Mapping[str, Any]) -> str:
    """job_state as text (v0.0.38: "RUNNING"; v0.0.40+: ["RUNNING", "COMPLETING"]; sacct: state.current)."""
    state = job.get("job_state")
    if state is None and isinstance(job.get("state"), Mapping):
        state = job["state"].get("current")
    if isinstance(state, list):
        state = next((s for s in state if isinstance(s, str) and s in _STATUS), state[0] if state else "")
    if not isinstance(state, str):
        return ""
    return state.split()[0].upper() if state.strip() else ""


def _exit(job: Mapping[str, Any]) -> tuple[int | None, int | None]:
    """(return code, signal) of the job: v0.0.38 and squeue in 22.05 give the wait status (768 = code
    3); later versions {"status", "return_code", "signal"}."""
    raw = job.get("exit_code")
    if isinstance(raw, Mapping):
        code = _number(raw.get("return_code"))
        sig = raw.get("signal")
        signal = _number(sig.get("id")) if isinstance(sig, Mapping) else _number(sig)
        return code, signal or None
    status = _number(raw)
    if status is None:
        return None, None
    if status & 0x7F:
        return None, status & 0x7F
    return (status >> 8) & 0xFF, None


def _ms(value: Any) -> int | None:
    seconds = _number(value)
    return seconds * 1000 if seconds is not None and seconds > 0 else None


# -- jobs -------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SlurmJob:
    """One job record, as much as gpulens reads of it."""

    job_id: int
    name: str
    state: str
    user: str | None
    account: str | None
    partition: str | None
    nodes: tuple[str, ...]
    gpus_by_node: Mapping[str, tuple[str, ...]]  # from gres_detail; empty once the job has ended
    gpu_type: str | None
    wants_gpus: bool  # it asked for (or holds) GPUs
    return_code: int | None = None
    signal: int | None = None
    submit_ms: int | None = None
    start_ms: int | None = None
    end_ms: int | None = None
    array_job_id: int | None = None
    array_task_id: int | None = None
    het_job_id: int | None = None
    het_job_offset: int | None = None
    cluster: str | None = None

    @property
    def status(self) -> ExecutionStatus:
        return job_status(self.state)

    @property
    def display_id(self) -> str:
        """As Slurm prints it: 12, 10_3 (array task), 20+1 (heterogeneous component)."""
        if self.array_job_id is not None and self.array_task_id is not None:
            return f"{self.array_job_id}_{self.array_task_id}"
        if self.het_job_id is not None and self.het_job_offset is not None:
            return f"{self.het_job_id}+{self.het_job_offset}"
        return str(self.job_id)

    @property
    def group_id(self) -> int:
        """The job its workload is named after: a heterogeneous job's leader, else itself."""
        return self.het_job_id if self.het_job_id is not None else self.job_id

    def matches(self, wanted: str) -> bool:
        """Whether `wanted` (12, 10, 10_3, 20, 20+1) names this job or the array/het job it belongs to."""
        wanted = wanted.strip()
        return wanted in {
            str(self.job_id),
            self.display_id,
            *(str(x) for x in (self.array_job_id, self.het_job_id) if x is not None),
        }


def _gres_entries(job: Mapping[str, Any]) -> list[str]:
    detail = job.get("gres_detail")
    if isinstance(detail, str):
        return [detail] if detail else []
    if isinstance(detail, list):
        return [d for d in detail if isinstance(d, str)]
    return []


def _requested_gpu_type(job: Mapping[str, Any]) -> tuple[bool, str | None]:
    """Whether the job asked for GPUs (tres_per_* / TRES strings / sacct tres), and their type."""
    texts = [
        job.get(k)
        for k in (
            "tres_per_node",
            "tres_per_job",
            "tres_per_task",
            "tres_per_socket",
            "tres_alloc_str",
            "tres_req_str",
        )
    ]
    for text in texts:
        if isinstance(text, str):
            m = _GPU_IN_TRES.search(text)
            if m is not None and int(m["count"]) > 0:
                return True, m["type"]
    tres = job.get("tres")
    if isinstance(tres, Mapping):
        gpu_type: str | None = None
        wants = False
        for raw in [*(tres.get("allocated") or []), *(tres.get("requested") or [])]:
            item = _object(raw)
            name = str(item.get("name", ""))
            if (
                item.get("type") == "gres"
                and name.startswith("gpu")
                and (_number(item.get("count")) or 0) > 0
            ):
                wants = True
                if ":" in name:
                    gpu_type = name.split(":", 1)[1]
        if wants:
            return True, gpu_type
    return False, None


def _positive(value: Any) -> int | None:
    n = _number(value)
    return n if n is not None and n >= 0 else None


def _node_names(job: Mapping[str, Any]) -> tuple[str, ...]:
    resources = job.get("job_resources")
    if isinstance(resources, Mapping):  # v0.0.40+: nodes.allocation[].name; v0.0.38: allocated_nodes[]
        nodes = resources.get("nodes")
        alloc = nodes.get("allocation") if isinstance(nodes, Mapping) else resources.get("allocated_nodes")
        if isinstance(alloc, list):
            names = [a.get("name") or a.get("nodename") for a in alloc if isinstance(a, Mapping)]
            if names and all(isinstance(n, str) and n for n in names):
                return tuple(str(n) for n in names)
    text = job.get("nodes")
    if isinstance(text, str) and text and text not in ("None assigned", "(null)"):
        return expand_hostlist(text)
    return ()


def parse_job(job: Mapping[str, Any]) -> SlurmJob:
    """One job record of slurmrestd (v0.0.38 and newer), `squeue --json` or `sacct --json`."""
    if not isinstance(job, Mapping):
        raise SlurmFormatError("a job record is not an object")
    job_id = _positive(job.get("job_id"))
    if job_id is None or job_id == 0:
        raise SlurmFormatError(f"job record without a job_id: {str(job.get('job_id'))[:40]!r}")
    array, het, times = (_object(job.get(k)) for k in ("array", "het", "time"))
    array_job_id = _positive(job.get("array_job_id", array.get("job_id")))
    array_task_id = _positive(job.get("array_task_id", array.get("task_id")))
    het_job_id = _positive(job.get("het_job_id", het.get("job_id")))
    het_job_offset = _positive(job.get("het_job_offset", het.get("job_offset")))
    nodes = _node_names(job)
    entries = _gres_entries(job)
    gpus_by_node: dict[str, tuple[str, ...]] = {}
    gpu_type: str | None = None
    for node, entry in zip(nodes, entries, strict=False):
        parsed = parse_gres_detail(entry)
        if parsed is None:
            continue
        gpu_type = gpu_type or parsed.gpu_type
        if parsed.indices is not None:
            gpus_by_node[node] = parsed.indices
    wants, requested_type = _requested_gpu_type(job)
    state = _state(job)
    code, signal = _exit(job)
    active = job_status(state).is_active
    user = _text(job.get("user_name")) or _text(job.get("user"))
    return SlurmJob(
        job_id=job_id,
        name=_text(job.get("name")) or "",
        state=state,
        user=user,
        account=_text(job.get("account")),
        partition=_text(job.get("partition")),
        nodes=nodes,
        gpus_by_node=gpus_by_node,
        gpu_type=gpu_type or requested_type,
        wants_gpus=wants or bool(gpus_by_node),
        return_code=None if active else code,
        signal=None if active else signal,
        submit_ms=_ms(job.get("submit_time", times.get("submission"))),
        start_ms=_ms(job.get("start_time", times.get("start"))),
        # a running job's end_time in v0.0.38 is its start plus the time limit: not an end
        end_ms=None if active else _ms(job.get("end_time", times.get("end"))),
        array_job_id=array_job_id if array_job_id and array_task_id is not None else None,
        array_task_id=array_task_id if array_job_id and array_task_id is not None else None,
        het_job_id=het_job_id or None,
        het_job_offset=het_job_offset if het_job_id else None,
        cluster=_text(job.get("cluster")),
    )


def parse_jobs(payload: Any) -> tuple[list[SlurmJob], list[str]]:
    """The jobs of a `{"jobs": [...]}` answer, and one line per record that could not be read."""
    if not isinstance(payload, Mapping) or not isinstance(payload.get("jobs"), list):
        raise SlurmFormatError("the answer holds no `jobs` list")
    jobs: list[SlurmJob] = []
    bad: list[str] = []
    for record in payload["jobs"]:
        try:
            jobs.append(parse_job(record))
        except SlurmFormatError as exc:
            bad.append(str(exc))
    return jobs, bad


def merge_jobs(*sources: Iterable[SlurmJob]) -> list[SlurmJob]:
    """One record per job id: the later source's, with GPU indices and type kept from any that had them."""
    merged: dict[int, SlurmJob] = {}
    for source in sources:
        for job in source:
            old = merged.get(job.job_id)
            merged[job.job_id] = (
                job
                if old is None
                else replace(
                    job,
                    gpus_by_node=job.gpus_by_node or old.gpus_by_node,
                    gpu_type=job.gpu_type or old.gpu_type,
                    nodes=job.nodes or old.nodes,
                    wants_gpus=job.wants_gpus or old.wants_gpus,
                )
            )
    return sorted(merged.values(), key=lambda j: j.job_id)


# -- planning -------------------------------------------------------------------------------------


def execution_uuid(cluster: str, job_id: int, node: str) -> str:
    """The execution (and pod) id of one node of one job; deploy/slurm's scripts compute the same."""
    return str(uuid.uuid5(SLURM_NAMESPACE, f"{cluster}/{job_id}/{node}"))


def workload_uuid(cluster: str, job_id: int) -> str:
    return str(uuid.uuid5(SLURM_NAMESPACE, f"{cluster}/{job_id}"))


def pod_namespace(cluster: str) -> str:
    """The namespace the pods of a cluster's jobs live in: `slurm-<cluster>` as a Kubernetes label."""
    label = _K8S_LABEL_BAD.sub("-", f"{SLURM_POD_NAMESPACE_PREFIX}-{cluster.lower()}").strip("-")
    return label[: limits.NAMESPACE_MAX].rstrip("-") or SLURM_POD_NAMESPACE_PREFIX


def is_slurm_namespace(namespace: str) -> bool:
    """Whether pods of this namespace are Slurm job nodes (`pod_namespace`)."""
    return namespace == SLURM_POD_NAMESPACE_PREFIX or namespace.startswith(SLURM_POD_NAMESPACE_PREFIX + "-")


def _pod_name(job: SlurmJob, node: str) -> str:
    text = _K8S_NAME_BAD.sub("-", f"job-{job.display_id.replace('_', '-').replace('+', '-')}-{node.lower()}")
    return text.strip("-.")[: limits.POD_NAME_MAX].rstrip("-.")


@dataclass(slots=True)
class SlurmPlan:
    """What one discovery registers, and what it left out and why."""

    executions: list[Execution] = field(default_factory=list)
    workloads: list[tuple[Workload, list[Pod]]] = field(default_factory=list)
    jobs: list[SlurmJob] = field(default_factory=list)  # the jobs planned
    without_gpus: int = 0  # jobs left out: no GPUs (include_cpu_jobs False)
    unknown_gpus: list[str] = field(default_factory=list)  # "job 12 on n1": indices not known
    unknown_ids: list[str] = field(default_factory=list)  # their execution ids
    ignored: list[str] = field(default_factory=list)  # records or fields that could not be used


def _dt(ms: int | None) -> datetime | None:
    return None if ms is None else datetime.fromtimestamp(ms / 1000, UTC)


def plan_registrations(
    jobs: Sequence[SlurmJob],
    *,
    org: str,
    cluster: str,
    now: datetime,
    known_gpus: Mapping[tuple[int, str], tuple[str, ...]] | None = None,
    include_cpu_jobs: bool = False,
) -> SlurmPlan:
    """Executions (one per node of each job) and workloads (one per job, a pod per node) for `jobs`.

    `cluster` names the cluster of records that do not say (slurmrestd and squeue do).
    `known_gpus`: (job id, node) -> GPU indices known from elsewhere (hpc_job series, an earlier
    discovery) for jobs whose record has none (ended jobs). Pending jobs, which hold no node yet,
    are left for a later pass.
    """
    known = known_gpus or {}
    plan = SlurmPlan()
    groups: dict[tuple[str, int], list[tuple[SlurmJob, list[Pod]]]] = {}
    for job in jobs:
        if not job.wants_gpus and not include_cpu_jobs:
            plan.without_gpus += 1
            continue
        if not job.nodes:
            continue  # pending: no node yet
        user = job.user if job.user and _USER.fullmatch(job.user) else None
        project = job.account if job.account and _PROJECT.fullmatch(job.account) else None
        if job.user and user is None:
            plan.ignored.append(f"job {job.display_id}: user {job.user[:60]!r} is not {USER_RE}")
        if job.account and project is None:
            plan.ignored.append(f"job {job.display_id}: account {job.account[:60]!r} is not a project name")
        profile_src = job.gpu_type or job.partition
        profile = profile_src[: limits.PROFILE_MAX] if profile_src else None
        status = job.status
        errors = (f"slurm job state {job.state}",) if job.state in _SYSTEM_ERROR_STATES else ()
        if job.signal:
            errors = (*errors, f"killed by signal {job.signal}")
        code = (
            job.return_code if status is not ExecutionStatus.COMPLETED or job.return_code is not None else 0
        )
        pods: list[Pod] = []
        for node in job.nodes:
            if not _HOSTNAME.fullmatch(node):
                plan.ignored.append(f"job {job.display_id}: node {node[:60]!r} is not a host name")
                continue
            gpus = job.gpus_by_node.get(node) or known.get((job.job_id, node)) or ()
            ident = execution_uuid(job.cluster or cluster, job.job_id, node)
            if not gpus and job.wants_gpus:
                plan.unknown_gpus.append(f"job {job.display_id} on {node}")
                plan.unknown_ids.append(ident)
            plan.executions.append(
                Execution(
                    execution_id=ident,
                    org=org,
                    hostname=node,
                    gpus=gpus,
                    status=status,
                    created_at=_dt(job.submit_ms) or _dt(job.start_ms) or now,
                    start_time=_dt(job.start_ms),
                    end_time=_dt(job.end_ms),
                    hardware_profile=profile,
                    execution_type="slurm",
                    file_name=job.name[: limits.FILE_NAME_MAX] or None,
                    return_code=code,
                    system_errors=errors,
                    project=project,
                    user=user,
                )
            )
            pods.append(
                Pod(
                    pod_id=ident,
                    workload_id=workload_uuid(job.cluster or cluster, job.group_id),
                    name=_pod_name(job, node),
                    namespace=pod_namespace(job.cluster or cluster),
                    node=node,
                    gpus=gpus,
                    phase=_PHASE.get(status, PodPhase.FAILED),
                    start_time=_dt(job.start_ms),
                    end_time=_dt(job.end_ms),
                )
            )
        plan.jobs.append(job)
        groups.setdefault((job.cluster or cluster, job.group_id), []).append((job, pods))
    for (_, group_id), members in groups.items():
        first = members[0][0]
        name = (
            f"slurm-{first.array_job_id}_{first.array_task_id}" if first.array_job_id else f"slurm-{group_id}"
        )
        if first.name:
            name = f"{name} {first.name}"
        project = next((j.account for j, _ in members if j.account and _PROJECT.fullmatch(j.account)), None)
        times = [t for j, _ in members for t in (j.submit_ms, j.start_ms) if t is not None]
        created = _dt(min(times)) if times else now
        workload = Workload(
            workload_uuid(first.cluster or cluster, group_id),
            _control_free(name)[: limits.WORKLOAD_NAME_MAX],
            org,
            project,
            created or now,
        )
        plan.workloads.append((workload, [p for _, pods in members for p in pods]))
    return plan


def _control_free(text: str) -> str:
    return "".join(ch if ch.isprintable() else " " for ch in text)
