"""Run:ai-style workloads and their pods, as the registry knows them."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import datetime

from gpulens.domain import limits

UUID_RE = r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
K8S_NAMESPACE_RE = rf"[a-z0-9]([-a-z0-9]{{0,{limits.NAMESPACE_MAX - 2}}}[a-z0-9])?"  # RFC 1123 label
K8S_POD_NAME_RE = rf"[a-z0-9]([-a-z0-9.]{{0,{limits.POD_NAME_MAX - 2}}}[a-z0-9])?"  # RFC 1123 subdomain


class PodPhase(enum.StrEnum):
    PENDING = "Pending"
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    UNKNOWN = "Unknown"


@dataclass(frozen=True, slots=True)
class Workload:
    workload_id: str  # UUID (lower-case text)
    name: str
    org: str
    project: str | None
    created_at: datetime


@dataclass(frozen=True, slots=True)
class Pod:
    pod_id: str  # UUID: the Kubernetes pod UID when discovered
    workload_id: str
    name: str  # Kubernetes pod name
    namespace: str
    node: str | None  # the host: dcgm-exporter's Hostname/hostname, node-exporter's nodename
    gpus: tuple[str, ...]  # GPU indices and/or GPU/MIG UUIDs; empty = none known (GPU series by pod label)
    phase: PodPhase
    start_time: datetime | None = None
    end_time: datetime | None = None
