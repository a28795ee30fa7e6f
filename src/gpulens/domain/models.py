"""Frozen value types passed between the stages (times are integer milliseconds since the epoch)."""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime

from gpulens.domain import limits

# Ids from requests later go into PromQL and URLs, so they are strict. Bodies without anchors: use
# re.fullmatch in Python (`$` would accept a trailing newline) and wrap in ^...$ for pydantic.
# The lengths are domain/limits.py's.
EXECUTION_ID_RE = rf"[A-Za-z0-9._:-]{{1,{limits.EXECUTION_ID_MAX}}}"
ORG_SLUG_RE = rf"[a-z0-9][a-z0-9-]{{0,{limits.ORG_SLUG_MAX - 1}}}"
HOSTNAME_RE = rf"[A-Za-z0-9][A-Za-z0-9._-]{{0,{limits.HOSTNAME_MAX - 1}}}"
GPU_INDEX_RE = rf"[0-9]{{1,{limits.GPU_INDEX_DIGITS}}}"
GPU_UUID_RE = rf"(?:GPU|MIG)-[0-9a-zA-Z-]{{1,{limits.GPU_UUID_MAX}}}"
GPU_ID_RE = f"{GPU_INDEX_RE}|{GPU_UUID_RE}"  # an index or a GPU/MIG UUID
PROJECT_RE = rf"[A-Za-z0-9][A-Za-z0-9._-]{{0,{limits.PROJECT_MAX - 1}}}"

# What each pattern accepts, in words, for error messages (API, services and CLI alike).
ORG_SLUG_TEXT = f"an org slug (1-{limits.ORG_SLUG_MAX} characters of [a-z0-9-], not starting with -)"
PROJECT_TEXT = f"a project name (1-{limits.PROJECT_MAX} characters of [A-Za-z0-9._-])"
HOSTNAME_TEXT = f"a host name (1-{limits.HOSTNAME_MAX} characters of [A-Za-z0-9._-])"
EXECUTION_ID_TEXT = f"1-{limits.EXECUTION_ID_MAX} characters of [A-Za-z0-9._:-]"
GPU_ID_TEXT = f"GPU indices (0-{10**limits.GPU_INDEX_DIGITS - 1}) or GPU/MIG UUIDs"


class ExecutionStatus(enum.StrEnum):
    PENDING = "pending"
    STARTING = "starting"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    SYSTEM_FAILURE = "system_failure"
    CANCELLED = "cancelled"
    ABORTED = "aborted"

    @property
    def is_active(self) -> bool:
        return self in (ExecutionStatus.PENDING, ExecutionStatus.STARTING, ExecutionStatus.RUNNING)


@dataclass(frozen=True, slots=True)
class Execution:
    """One run on one host, as the registry knows it."""

    execution_id: str
    org: str
    hostname: str | None
    gpus: tuple[str, ...]  # GPU indices ("0") and/or UUIDs ("GPU-..."); empty = every GPU of the host
    status: ExecutionStatus
    created_at: datetime
    start_time: datetime | None = None
    end_time: datetime | None = None
    hardware_profile: str | None = None
    execution_type: str | None = None
    file_name: str | None = None
    return_code: int | None = None
    system_errors: tuple[str, ...] = ()
    project: str | None = None


@dataclass(frozen=True, slots=True)
class Principal:
    """Who is calling: resolved from an API key or a JWT."""

    org: str
    subject: str  # key prefix, or the JWT's `sub`
    is_admin: bool = False
    projects: frozenset[str] | None = None  # None: every project of the org
    key_id: str | None = None
    # When the caller's API key expires (None: never, or not a key); keys it creates end by then too.
    key_expires_at: datetime | None = None

    def may_see_project(self, project: str | None) -> bool:
        return self.projects is None or project is None or project in self.projects


@dataclass(frozen=True, slots=True)
class Window:
    """An evaluation grid: start + k*step for k = 0.. while <= end (all in ms)."""

    start_ms: int
    end_ms: int
    step_ms: int

    @property
    def points(self) -> int:
        return (self.end_ms - self.start_ms) // self.step_ms + 1


@dataclass(frozen=True, slots=True)
class RangeQuery:
    """One PromQL range query over one chunk of a grid."""

    expr: str
    window: Window


# One sample as the Prometheus API encodes it: (unix seconds, "decimal string"). Values stay strings
# from the backend to the wire: no float round-trip, and the dialects that want strings get them free.
# The embedded backend makes these tuples; the Prometheus backend passes on the pairs of its decoded
# JSON as they are (2-item lists, shape checked by `valid_samples`: no copy per point), so read a
# sample by unpacking or index, never by its type.
Sample = tuple[float, str]


@dataclass(frozen=True, slots=True)
class Series:
    """One result series: its labels and its samples in ascending time."""

    labels: dict[str, str] = field(default_factory=dict)
    samples: Sequence[Sample] = field(default_factory=list)
