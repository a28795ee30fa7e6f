"""The `k8s` scenario: pods on Kubernetes GPU nodes, as Run:ai's pod metrics see them.

A frozen description only (no samples): nodes with their dcgm-exporter flavour (honor_labels, host
label, MIG instances), and pods that own GPUs (or MIG GPU instances) for a while, with their
containers, their owner and, for inference pods, the vLLM / NIM server they run.

Time convention (as in scenario.py): a sample at t belongs to a pod when start_s < t <= end_s; every
time is a whole number of scrape intervals from the scenario start. Pod and workload ids are
deterministic UUIDs derived from namespace and name (the pod id is kube-state-metrics' `uid`).
"""

from __future__ import annotations

import enum
import hashlib
import random
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime

from gpulens.demo.scenario import (
    A100,
    DEFAULT_END_S,
    DEFAULT_SCRAPE_INTERVAL_S,
    H100,
    Gpu,
    GpuModel,
    Timeline,
    make_gpus,
)
from gpulens.domain import catalog as c
from gpulens.domain.workloads import PodPhase

GIB = 1024**3
K8S_SCENARIO_NAME = "k8s"
K8S_DEFAULT_SEED = 21
K8S_SPAN_S = 2 * 3600
POD_CREATE_LEAD_S = 60  # kube_pod_created precedes the start: the pod is Pending for a minute
RESTART_GAP_S = 105  # a restarted app container serves /metrics again this long after the restart


def stable_uuid(*parts: str) -> str:
    """A UUID (version-4 layout) that is a pure function of `parts`: same ids on every run and seed."""
    digest = hashlib.sha256("/".join(("gpulens-synth", *parts)).encode()).digest()
    return str(uuid.UUID(bytes=digest[:16], version=4))


class AppKind(enum.StrEnum):
    """What serves metrics inside the pod (besides cAdvisor / dcgm-exporter / kube-state-metrics)."""

    NONE = "none"
    VLLM = "vllm"  # vLLM V1: `vllm:*` series with model_name + engine
    NIM = "nim"  # NIM 1.x: un-prefixed series with model_name only


@dataclass(frozen=True, slots=True)
class GpuSlot:
    """A whole GPU (gi None) or one MIG GPU instance of GPU `gpu`."""

    gpu: int
    gi: int | None = None

    @property
    def key(self) -> str:
        """Truth key of the slot: "<gpu>" for a whole GPU, "<gpu>/<GPU_I_ID>" for a MIG instance."""
        return str(self.gpu) if self.gi is None else f"{self.gpu}/{self.gi}"


@dataclass(frozen=True, slots=True)
class MigInstance:
    gpu: int
    gi: int
    profile: str
    fb_capacity_mib: int  # FB_USED + FB_FREE of the instance


@dataclass(frozen=True, slots=True)
class K8sNode:
    """A Kubernetes node with GPUs and how Prometheus scrapes its dcgm-exporter."""

    hostname: str
    ip: str
    gpu_model: GpuModel
    gpus: tuple[Gpu, ...]
    honor_labels: bool  # False: pod labels arrive as exported_pod/... (GPU Operator default)
    host_label: str  # "Hostname" (<= 4.5.3-4.8.2) or "hostname"
    dcgm_pod: str  # the exporter's own pod (namespace gpu-operator)
    dcgm_ip: str
    mig: tuple[MigInstance, ...] = ()
    driver_version: str = "580.105.08"

    @property
    def dcgm_instance(self) -> str:
        return f"{self.dcgm_ip}:9400"

    @property
    def kubelet_instance(self) -> str:
        return f"{self.ip}:10250"

    def is_mig(self, gpu: int) -> bool:
        return any(m.gpu == gpu for m in self.mig)

    def slots(self) -> tuple[GpuSlot, ...]:
        """Whole GPUs, and the GPU instances of MIG GPUs, in GPU then instance order."""
        out: list[GpuSlot] = []
        for g in self.gpus:
            if self.is_mig(g.index):
                out.extend(GpuSlot(g.index, m.gi) for m in self.mig if m.gpu == g.index)
            else:
                out.append(GpuSlot(g.index))
        return tuple(out)

    def mig_instance(self, slot: GpuSlot) -> MigInstance | None:
        for m in self.mig:
            if (m.gpu, m.gi) == (slot.gpu, slot.gi):
                return m
        return None

    def fb_capacity_mib(self, slot: GpuSlot) -> int:
        mig = self.mig_instance(slot)
        return self.gpu_model.fb_capacity_mib if mig is None else mig.fb_capacity_mib


@dataclass(frozen=True, slots=True)
class ContainerSpec:
    name: str
    image: str
    cpu_millicores: int  # typical usage; the generator varies it per 10-minute stretch
    memory_bytes: int  # typical working set


@dataclass(frozen=True, slots=True)
class PodSpec:
    """One pod: where it runs, which GPU slots it holds, for how long, and what runs in it."""

    name: str
    namespace: str
    workload: str  # the Run:ai workload name (the top owner)
    node: str
    slots: tuple[GpuSlot, ...]
    start_s: int
    end_s: int | None  # None: still running at the scenario end
    final_phase: PodPhase  # the phase once ended (Running while end_s is None)
    owner_kind: str  # kube_pod_owner / created_by_kind
    owner_name: str
    containers: tuple[ContainerSpec, ...]
    ip: str
    activity: float  # steady GPU activity 0..1 (drives utilisation and the profiling ratios)
    fb_used_mib: int  # steady frame-buffer use per slot
    nvlink_bytes_per_s: float = 0.0  # per direction at activity 1
    workload_kind: str = ""  # top owner kind (Deployment for a ReplicaSet-owned pod)
    app: AppKind = AppKind.NONE
    model_name: str = ""
    engines: tuple[str, ...] = ()  # vLLM data-parallel engines; NIM: ("",) (no engine label)
    app_port: int = 8000
    app_ready_s: int = 0  # model loading: /metrics answers this long after the start
    requests_per_interval: float = 0.0  # mean finished requests per scrape interval and engine
    restart_s: int | None = None  # the first container restarts here (new container, counters at 0)
    stall: tuple[int, int] | None = None  # (from_s, to_s]: input-bound, GPU nearly idle

    @property
    def pod_id(self) -> str:
        """The pod UID (kube-state-metrics `uid`, Run:ai podId)."""
        return stable_uuid("pod", self.namespace, self.name)

    @property
    def workload_id(self) -> str:
        return stable_uuid("workload", self.namespace, self.workload)

    @property
    def created_s(self) -> int:
        return self.start_s - POD_CREATE_LEAD_S

    @property
    def start(self) -> datetime:
        return datetime.fromtimestamp(self.start_s, UTC)

    @property
    def end(self) -> datetime | None:
        return None if self.end_s is None else datetime.fromtimestamp(self.end_s, UTC)

    @property
    def slot_keys(self) -> tuple[str, ...]:
        return tuple(s.key for s in self.slots)

    def app_container(self) -> ContainerSpec | None:
        return self.containers[0] if self.app is not AppKind.NONE else None


@dataclass(frozen=True, slots=True)
class K8sScenario(Timeline):
    """Nodes and pods over [start_s, end_s], sampled every scrape interval."""

    name: str
    seed: int
    start_s: int
    end_s: int
    nodes: tuple[K8sNode, ...]
    pods: tuple[PodSpec, ...]
    scrape_interval_s: int = DEFAULT_SCRAPE_INTERVAL_S

    def __post_init__(self) -> None:
        iv = self.scrape_interval_s
        if iv <= 0 or self.end_s < self.start_s or (self.end_s - self.start_s) % iv:
            raise ValueError("bad scenario time range or scrape interval")
        if len({n.hostname for n in self.nodes}) != len(self.nodes):
            raise ValueError("duplicate node names")
        keys = [(p.namespace, p.name) for p in self.pods]
        if len(set(keys)) != len(keys):
            raise ValueError("duplicate pods")
        held: dict[tuple[str, str], list[PodSpec]] = {}
        for p in self.pods:
            node = self.node(p.node)
            times = [p.start_s, p.created_s, self.pod_end_s(p), p.start_s + p.app_ready_s]
            if p.restart_s is not None:
                times += [p.restart_s, p.restart_s + RESTART_GAP_S]
            if p.stall is not None:
                times += list(p.stall)
            if any((t - self.start_s) % iv for t in times):
                raise ValueError(f"{p.name}: times must be whole scrape intervals")
            if p.created_s < self.start_s or self.pod_end_s(p) > self.end_s or self.pod_end_s(p) <= p.start_s:
                raise ValueError(f"{p.name}: must lie inside the scenario")
            if not p.containers or (p.app is not AppKind.NONE and not p.engines):
                raise ValueError(f"{p.name}: needs containers (and engines for an app)")
            valid = set(node.slots())
            for slot in p.slots:
                if slot not in valid:
                    raise ValueError(f"{p.name}: {node.hostname} has no GPU slot {slot.key}")
                for other in held.setdefault((node.hostname, slot.key), []):
                    if p.start_s < self.pod_end_s(other) and other.start_s < self.pod_end_s(p):
                        raise ValueError(f"{p.name} and {other.name} overlap on {slot.key}")
                held[(node.hostname, slot.key)].append(p)

    def node(self, hostname: str) -> K8sNode:
        for n in self.nodes:
            if n.hostname == hostname:
                return n
        raise KeyError(hostname)

    def pod(self, key: str) -> PodSpec:
        """By pod name, pod id (uid) or "namespace/name"."""
        for p in self.pods:
            if key in (p.name, p.pod_id, f"{p.namespace}/{p.name}"):
                return p
        raise KeyError(key)

    def pod_end_s(self, pod: PodSpec) -> int:
        """The pod's last sample time: its end, or the scenario end while it runs."""
        return self.end_s if pod.end_s is None else pod.end_s

    def pods_on(self, hostname: str) -> tuple[PodSpec, ...]:
        return tuple(p for p in self.pods if p.node == hostname)


# -- the built-in scenario --------------------------------------------------------------------------


def k8s_scenario(
    seed: int = K8S_DEFAULT_SEED,
    interval_s: int = DEFAULT_SCRAPE_INTERVAL_S,
    hours: float = K8S_SPAN_S / 3600,
) -> K8sScenario:
    """Two hours ending 2026-01-01T00:00Z: three GPU nodes, seven pods (see the module docstring).

    `hours` stretches the scenario (the benchmark's 26 h): every time below, given in minutes of the
    two-hour default, scales by hours / 2 (rounded to the scrape grid); the default is unchanged.

    * gpu-node-1 (8 x H100, honor_labels=false -> exported_pod/..., `Hostname`): train-0 (team-a,
      GPUs 0,1, two containers, ends Succeeded), train-1-6c8f9d7b5-q4x2z (team-a, GPUs 2,3, a
      Deployment's pod), llm-serve-0 (team-b, GPUs 4,5, vLLM with engines 0 and 1, container restart
      at +60 min), nim-llama-0 (team-b, GPU 6, NIM 1.x); GPU 7 is never owned.
    * gpu-node-2 (2 x A100, honor_labels=true -> plain pod/namespace, `hostname`): train-b-0 (team-c,
      both GPUs, ends Failed).
    * mig-node-1 (1 x A100 as two 3g.20gb instances, GPU_I_ID 1 and 2): mig-a-0 (team-a, GI 1),
      mig-b-0 (team-c, GI 2, ends Succeeded).
    """
    span_s = round(hours * 3600)  # K8sScenario checks that it is whole scrape intervals
    if span_s <= 0:
        raise ValueError("hours must be positive")
    scale = span_s / K8S_SPAN_S
    rng = random.Random(seed)  # noqa: S311 - reproducible test data, not secrets
    start = DEFAULT_END_S - span_s

    def at(minutes: float) -> int:
        return start + round(minutes * scale * 60 / interval_s) * interval_s

    node1 = K8sNode(
        "gpu-node-1",
        "10.0.1.11",
        H100,
        make_gpus(rng, 8),
        honor_labels=False,
        host_label=c.DCGM_HOST_LABELS[0],
        dcgm_pod="nvidia-dcgm-exporter-x7k2p",
        dcgm_ip="10.1.1.21",
    )
    node2 = K8sNode(
        "gpu-node-2",
        "10.0.1.12",
        A100,
        make_gpus(rng, 2),
        honor_labels=True,
        host_label=c.DCGM_HOST_LABELS[1],
        dcgm_pod="nvidia-dcgm-exporter-q9w4m",
        dcgm_ip="10.1.2.21",
        driver_version="550.127.05",
    )
    mig = K8sNode(
        "mig-node-1",
        "10.0.1.13",
        A100,
        make_gpus(rng, 1),
        honor_labels=False,
        host_label=c.DCGM_HOST_LABELS[0],
        dcgm_pod="nvidia-dcgm-exporter-h3v8n",
        dcgm_ip="10.1.3.21",
        mig=(MigInstance(0, 1, "3g.20gb", 19_968), MigInstance(0, 2, "3g.20gb", 19_968)),
    )
    h100_cap = H100.fb_capacity_mib
    pods = (
        PodSpec(
            "train-0",
            "team-a",
            "train",
            node1.hostname,
            (GpuSlot(0), GpuSlot(1)),
            at(10),
            at(100),
            PodPhase.SUCCEEDED,
            "StatefulSet",
            "train",
            (
                ContainerSpec("trainer", "nvcr.io/nvidia/pytorch:25.01-py3", 6000, 48 * GIB),
                ContainerSpec("data-loader", "registry.local/team-a/loader:1.4", 2500, 12 * GIB),
            ),
            "10.1.1.31",
            activity=0.92,
            fb_used_mib=h100_cap * 70 // 100,
            nvlink_bytes_per_s=45e9,
            workload_kind="StatefulSet",
            stall=(at(60), at(70)),
        ),
        PodSpec(
            "train-1-6c8f9d7b5-q4x2z",
            "team-a",
            "train-1",
            node1.hostname,
            (GpuSlot(2), GpuSlot(3)),
            at(20),
            None,
            PodPhase.RUNNING,
            "ReplicaSet",
            "train-1-6c8f9d7b5",
            (ContainerSpec("trainer", "nvcr.io/nvidia/pytorch:25.01-py3", 4000, 32 * GIB),),
            "10.1.1.32",
            activity=0.7,
            fb_used_mib=h100_cap * 55 // 100,
            nvlink_bytes_per_s=30e9,
            workload_kind="Deployment",
        ),
        PodSpec(
            "llm-serve-0",
            "team-b",
            "llm-serve",
            node1.hostname,
            (GpuSlot(4), GpuSlot(5)),
            at(5),
            None,
            PodPhase.RUNNING,
            "StatefulSet",
            "llm-serve",
            (ContainerSpec("vllm", "vllm/vllm-openai:v0.11.0", 3000, 24 * GIB),),
            "10.1.1.33",
            activity=0.45,
            fb_used_mib=h100_cap * 90 // 100,
            nvlink_bytes_per_s=2e8,
            workload_kind="StatefulSet",
            app=AppKind.VLLM,
            model_name="meta-llama/Llama-3.1-8B-Instruct",
            engines=("0", "1"),
            app_ready_s=120,
            requests_per_interval=3.0,
            restart_s=at(60),
        ),
        PodSpec(
            "nim-llama-0",
            "team-b",
            "nim-llama",
            node1.hostname,
            (GpuSlot(6),),
            at(15),
            None,
            PodPhase.RUNNING,
            "StatefulSet",
            "nim-llama",
            (ContainerSpec("nim", "nvcr.io/nim/meta/llama-3.1-8b-instruct:1.3.3", 2000, 16 * GIB),),
            "10.1.1.34",
            activity=0.3,
            fb_used_mib=h100_cap * 90 // 100,
            workload_kind="StatefulSet",
            app=AppKind.NIM,
            model_name="meta/llama-3.1-8b-instruct",
            engines=("",),
            app_ready_s=180,
            requests_per_interval=2.0,
        ),
        PodSpec(
            "train-b-0",
            "team-c",
            "train-b",
            node2.hostname,
            (GpuSlot(0), GpuSlot(1)),
            at(30),
            at(105),
            PodPhase.FAILED,
            "StatefulSet",
            "train-b",
            (ContainerSpec("trainer", "nvcr.io/nvidia/pytorch:24.10-py3", 3000, 24 * GIB),),
            "10.1.2.31",
            activity=0.85,
            fb_used_mib=A100.fb_capacity_mib * 80 // 100,
            nvlink_bytes_per_s=20e9,
            workload_kind="StatefulSet",
        ),
        PodSpec(
            "mig-a-0",
            "team-a",
            "mig-a",
            mig.hostname,
            (GpuSlot(0, 1),),
            at(5),
            None,
            PodPhase.RUNNING,
            "StatefulSet",
            "mig-a",
            (ContainerSpec("worker", "registry.local/team-a/worker:2.0", 1500, 8 * GIB),),
            "10.1.3.31",
            activity=0.8,
            fb_used_mib=19_968 * 60 // 100,
            workload_kind="StatefulSet",
        ),
        PodSpec(
            "mig-b-0",
            "team-c",
            "mig-b",
            mig.hostname,
            (GpuSlot(0, 2),),
            at(20),
            at(90),
            PodPhase.SUCCEEDED,
            "StatefulSet",
            "mig-b",
            (ContainerSpec("worker", "registry.local/team-c/worker:2.0", 1000, 6 * GIB),),
            "10.1.3.32",
            activity=0.6,
            fb_used_mib=19_968 * 45 // 100,
            workload_kind="StatefulSet",
        ),
    )
    return K8sScenario(K8S_SCENARIO_NAME, seed, start, DEFAULT_END_S, (node1, node2, mig), pods, interval_s)
