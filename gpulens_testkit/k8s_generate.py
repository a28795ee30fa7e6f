"""Samples of every series of a `K8sScenario`, precomputed (a few hundred thousand samples).

Series are written as Prometheus stores them after the scrape (target labels attached, empty labels
dropped, `exported_*` renaming where honor_labels=false):

* dcgm-exporter: 17 fields per whole GPU (utilisation, FB used/free, profiling ratios 0..1, DRAM,
  memory-copy %, PCIe / NVLink bytes/s, NVLINK_BANDWIDTH_TOTAL "MB/s"); on a MIG GPU only FB and the
  profiling ratios per GPU instance (`GPU_I_ID`, `GPU_I_PROFILE`), PCIe/NVLink per device and never
  attributed to a pod, no GPU_UTIL / MEM_COPY_UTIL. A GPU held by a pod is one series with the pod's
  labels; before and after it is another (unattributed) series. No staleness markers: after a pod
  ends both stay visible for the 5-minute lookback.
* cAdvisor: per container instance (a restart starts a new series at 0) cpu counter and working set,
  plus the pod cgroup (no `container` label) and the `container="POD"` sandbox.
* kube-state-metrics: kube_pod_info (a second series once the pod IP is known), kube_pod_owner,
  kube_pod_created, kube_pod_start_time, kube_pod_completion_time, kube_pod_status_phase,
  kube_replicaset_owner.
* vLLM V1 (both old and new names, as 0.10/0.11 expose them) and NIM 1.x: gauges, counters and
  histograms built from explicit, seeded request observations (`Dataset.requests`,
  `Dataset.observations`); an app container restart loses /metrics for RESTART_GAP_S and then
  every counter and bucket restarts at 0 (the first sample of every serving stretch is all zero, so
  every reset is visible to `rate`/`increase`).

Observations of the interval (t_{k-1}, t_k] are counted in the sample at t_k.
"""

from __future__ import annotations

import bisect
import enum
import hashlib
import math
import random
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass

from gpulens.demo.history import LABEL_DRIVER_VERSION, LABEL_JOB
from gpulens.domain import catalog as c
from gpulens.domain.workloads import PodPhase
from gpulens_testkit.history import sort_key
from gpulens_testkit.k8s_scenario import (
    RESTART_GAP_S,
    AppKind,
    ContainerSpec,
    GpuSlot,
    K8sNode,
    K8sScenario,
    PodSpec,
)

# Labels only exporters and scrape configs write (no query reads them).
LABEL_EXPORTED_CONTAINER = "exported_container"  # dcgm-exporter `container` renamed (honor_labels=false)
LABEL_MODEL = "model_name"  # vLLM / NIM served model (not dcgm-exporter's `modelName`)
LABEL_ENGINE = "engine"  # vLLM V1 data-parallel engine index
LABEL_GPU_INSTANCE_PROFILE = "GPU_I_PROFILE"  # MIG profile, e.g. 3g.20gb
LABEL_ENDPOINT = "endpoint"
LABEL_SERVICE = "service"
LABEL_CGROUP_ID = "id"
LABEL_IMAGE = "image"
LABEL_CONTAINER_NAME = "name"
LABEL_METRICS_PATH = "metrics_path"
LABEL_HOST_IP = "host_ip"
LABEL_POD_IP = "pod_ip"
LABEL_HOST_NETWORK = "host_network"
# NIM 1.x token counters (no Run:ai metricType reads them)
NIM_PROMPT_TOKENS = "prompt_tokens_total"
NIM_GENERATION_TOKENS = "generation_tokens_total"
DCGM_NAMESPACE = "gpu-operator"
DCGM_CONTAINER = "nvidia-dcgm-exporter"
KSM_INSTANCE = "10.1.0.50:8080"
POD_SANDBOX = c.CADVISOR_SANDBOX_CONTAINER

# vLLM 0.33's default histogram buckets (its `buckets.py`)
VLLM_TTFT_BUCKETS: tuple[float, ...] = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
    1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
VLLM_ITL_BUCKETS: tuple[float, ...] = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip
VLLM_REQUEST_LATENCY_BUCKETS: tuple[float, ...] = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
    120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip
# NIM 1.x does not document its buckets (read `le` from data): here the early vLLM V0 ones, so NIM
# histograms have other `le` values than vLLM's and long requests land in +Inf.
NIM_TTFT_BUCKETS: tuple[float, ...] = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
)  # fmt: skip
NIM_E2E_BUCKETS: tuple[float, ...] = (1.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0)
FINISH_REASONS = ("stop", "length", "abort", "error", "repetition")  # vLLM V1 FINISH_REASON_STRINGS
NIM_REQUEST_MAX = 256.0

_SEGMENT_S = 600  # CPU level and request load change every ten minutes


def le_label(bound: float) -> str:
    """The `le` value prometheus_client writes (Go-style float: 1.0, 0.25, +Inf)."""
    return "+Inf" if math.isinf(bound) else repr(float(bound))


class SeriesSource(enum.StrEnum):
    DCGM = "dcgm"
    CADVISOR = "cadvisor"
    KSM = "ksm"
    APP = "app"  # vLLM / NIM, scraped from the pod


class DcgmField(enum.Enum):
    """A dcgm-exporter field: its series name, and where it exists."""

    GPU_UTIL = c.DCGM_GPU_UTIL
    MEM_COPY_UTIL = c.DCGM_MEM_COPY_UTIL
    FB_USED = c.DCGM_FB_USED
    FB_FREE = c.DCGM_FB_FREE
    GR_ENGINE_ACTIVE = c.DCGM_GR_ENGINE_ACTIVE
    SM_ACTIVE = c.DCGM_SM_ACTIVE
    SM_OCCUPANCY = c.DCGM_SM_OCCUPANCY
    PIPE_TENSOR_ACTIVE = c.DCGM_PIPE_TENSOR_ACTIVE
    PIPE_FP64_ACTIVE = c.DCGM_PIPE_FP64_ACTIVE
    PIPE_FP32_ACTIVE = c.DCGM_PIPE_FP32_ACTIVE
    PIPE_FP16_ACTIVE = c.DCGM_PIPE_FP16_ACTIVE
    DRAM_ACTIVE = c.DCGM_DRAM_ACTIVE
    PCIE_TX = c.DCGM_PCIE_TX_BYTES
    PCIE_RX = c.DCGM_PCIE_RX_BYTES
    NVLINK_TX = c.DCGM_NVLINK_TX_BYTES
    NVLINK_RX = c.DCGM_NVLINK_RX_BYTES
    NVLINK_BANDWIDTH_TOTAL = c.DCGM_NVLINK_BANDWIDTH_TOTAL


# Profiling ratios: fraction of the activity each reports (tensor: training vs inference).
_RATIO_COEF: dict[DcgmField, float] = {
    DcgmField.GR_ENGINE_ACTIVE: 0.97,
    DcgmField.SM_ACTIVE: 0.88,
    DcgmField.SM_OCCUPANCY: 0.41,
    DcgmField.PIPE_TENSOR_ACTIVE: 0.62,
    DcgmField.PIPE_FP64_ACTIVE: 0.002,
    DcgmField.PIPE_FP32_ACTIVE: 0.07,
    DcgmField.PIPE_FP16_ACTIVE: 0.18,
    DcgmField.DRAM_ACTIVE: 0.52,
}
_NVLINK = frozenset({DcgmField.NVLINK_TX, DcgmField.NVLINK_RX, DcgmField.NVLINK_BANDWIDTH_TOTAL})
MIG_INSTANCE_FIELDS = frozenset({DcgmField.FB_USED, DcgmField.FB_FREE, *_RATIO_COEF})
DEVICE_FIELDS = frozenset(
    {
        DcgmField.PCIE_TX,
        DcgmField.PCIE_RX,
        DcgmField.NVLINK_TX,
        DcgmField.NVLINK_RX,
        DcgmField.NVLINK_BANDWIDTH_TOTAL,
    }
)


@dataclass(frozen=True, slots=True)
class HistogramDef:
    name: str  # the family: series are <name>_bucket{le}, <name>_sum, <name>_count
    bounds: tuple[float, ...]  # finite upper bounds; +Inf is added
    observe: str  # the Request attribute observed (itl: several per request)

    @property
    def les(self) -> tuple[str, ...]:
        return (*(le_label(b) for b in self.bounds), "+Inf")


VLLM_HISTOGRAMS: tuple[HistogramDef, ...] = (
    HistogramDef(c.VLLM_TTFT, VLLM_TTFT_BUCKETS, "ttft_s"),
    HistogramDef(c.VLLM_E2E_LATENCY, VLLM_REQUEST_LATENCY_BUCKETS, "e2e_s"),
    HistogramDef(c.VLLM_QUEUE_TIME, VLLM_REQUEST_LATENCY_BUCKETS, "queue_s"),
    HistogramDef(c.VLLM_PREFILL_TIME, VLLM_REQUEST_LATENCY_BUCKETS, "prefill_s"),
    HistogramDef(c.VLLM_DECODE_TIME, VLLM_REQUEST_LATENCY_BUCKETS, "decode_s"),
    HistogramDef(c.VLLM_INTER_TOKEN_LATENCY, VLLM_ITL_BUCKETS, "itl_s"),
    HistogramDef(c.VLLM_TIME_PER_OUTPUT_TOKEN_OLD, VLLM_ITL_BUCKETS, "itl_s"),
)
NIM_HISTOGRAMS: tuple[HistogramDef, ...] = (
    HistogramDef(c.NIM_TTFT, NIM_TTFT_BUCKETS, "ttft_s"),
    HistogramDef(c.NIM_E2E_LATENCY, NIM_E2E_BUCKETS, "e2e_s"),
)
HISTOGRAMS: dict[str, HistogramDef] = {h.name: h for h in (*VLLM_HISTOGRAMS, *NIM_HISTOGRAMS)}


@dataclass(frozen=True, slots=True)
class Request:
    """One finished request of an inference server (all latencies in seconds)."""

    finished_reason: str
    prompt_tokens: int
    generation_tokens: int
    queue_s: float
    prefill_s: float
    decode_s: float
    ttft_s: float
    e2e_s: float
    itl_s: tuple[float, ...]

    def observed(self, attr: str) -> tuple[float, ...]:
        if attr == "itl_s":
            return self.itl_s
        value: float = getattr(self, attr)
        return (value,)


@dataclass(frozen=True, slots=True, eq=False)
class K8sSeries:
    """One stored series: name, labels in exposition order, and what it belongs to (identity-hashed)."""

    sid: int
    name: str
    metric_type: str  # its family's type: gauge, counter or histogram
    labels: tuple[tuple[str, str], ...]
    source: SeriesSource
    family: str
    node: str = ""
    namespace: str = ""  # the workload pod this series describes ("" for none)
    pod: str = ""
    slot: str = ""  # dcgm: GPU slot key ("0", "0/1"), "0" for a MIG device-level series
    field: DcgmField | None = None
    container: str = ""  # cAdvisor: "" = pod cgroup, "POD" = sandbox
    instance: int = 0  # cAdvisor: container instance (1 after a restart)
    engine: str = ""
    le: str = ""

    def label_dict(self) -> dict[str, str]:
        return dict(self.labels)

    def label(self, name: str) -> str:
        """A label's value, "" when absent (PromQL's view)."""
        for k, v in self.labels:
            if k == name:
                return v
        return ""


@dataclass(frozen=True, slots=True)
class K8sFamily:
    name: str
    metric_type: str
    series: tuple[K8sSeries, ...]


def _labels(*pairs: tuple[str, str]) -> tuple[tuple[str, str], ...]:
    """Drop empty values: Prometheus stores an empty label as no label."""
    return tuple((k, v) for k, v in pairs if v != "")


def _poisson(rng: random.Random, lam: float) -> int:
    limit, k, p = math.exp(-lam), 0, rng.random()
    while p > limit:
        k += 1
        p *= rng.random()
    return k


class K8sDataset:
    """Every series of a k8s scenario with its samples at start + k * interval (None: no sample)."""

    def __init__(self, scenario: K8sScenario) -> None:
        self.scenario = scenario
        self.interval_s = scenario.scrape_interval_s
        self.sample_count = scenario.sample_count
        self._series: list[K8sSeries] = []
        self._data: list[list[float | None]] = []
        self._requests: dict[tuple[str, str], list[list[Request]]] = {}
        self._replicasets: set[tuple[str, str]] = set()
        for node in scenario.nodes:
            self._build_dcgm(node)
        for pod in scenario.pods:
            self._build_cadvisor(pod)
        for pod in scenario.pods:
            self._build_ksm(pod)
        for pod in scenario.pods:
            if pod.app is not AppKind.NONE:
                self._build_app(pod)
        families: dict[str, list[K8sSeries]] = {}
        for s in self._series:
            families.setdefault(s.family, []).append(s)
        self.series: tuple[K8sSeries, ...] = tuple(self._series)
        self.families: tuple[K8sFamily, ...] = tuple(
            K8sFamily(name, ss[0].metric_type, tuple(ss)) for name, ss in families.items()
        )
        self._by_name: dict[str, list[K8sSeries]] = {}
        for s in self._series:
            self._by_name.setdefault(s.name, []).append(s)

    # -- public -------------------------------------------------------------------------------------
    def time_of(self, k: int) -> int:
        return self.scenario.start_s + k * self.interval_s

    def k_of(self, t_s: int) -> int:
        """Index of the sample at t (t on the scrape grid)."""
        return (t_s - self.scenario.start_s) // self.interval_s

    def values(self, series: K8sSeries, k0: int = 0, k1: int | None = None) -> list[float | None]:
        """Samples k0 <= k < k1; None where the series has no sample."""
        k1 = self.sample_count if k1 is None else min(k1, self.sample_count)
        return self._data[series.sid][max(0, k0) : k1]

    def raw(self, series: K8sSeries) -> Sequence[float | None]:
        """Every sample index of a series (None: no sample); do not modify."""
        return self._data[series.sid]

    def value_at(self, series: K8sSeries, k: int) -> float | None:
        if not 0 <= k < self.sample_count:
            raise IndexError(k)
        return self._data[series.sid][k]

    def samples(self, series: K8sSeries) -> Iterator[tuple[int, float]]:
        """(timestamp s, value) of every sample of a series, in time order."""
        for k, v in enumerate(self._data[series.sid]):
            if v is not None:
                yield self.time_of(k), v

    def select(
        self,
        name: str,
        match: Mapping[str, str] | None = None,
        exclude: Mapping[str, Collection[str]] | None = None,
    ) -> list[K8sSeries]:
        """Series named `name` whose labels equal `match` and avoid `exclude` (absent label = ""),
        in Prometheus' label-set order."""
        out = []
        for s in self._by_name.get(name, ()):
            if match and any(s.label(k) != v for k, v in match.items()):
                continue
            if exclude and any(s.label(k) in vs for k, vs in exclude.items()):
                continue
            out.append(s)
        out.sort(key=sort_key)
        return out

    def dcgm_series(self, field: DcgmField, pod: PodSpec | None = None) -> list[K8sSeries]:
        """A field's dcgm series attributed to `pod` (None: every series of the field)."""
        out = [
            s
            for s in self._by_name.get(field.value, ())
            if pod is None or (s.pod == pod.name and s.namespace == pod.namespace)
        ]
        out.sort(key=sort_key)
        return out

    def requests(self, pod: PodSpec, engine: str) -> list[list[Request]]:
        """Finished requests of one engine per sample index k (those of (t_{k-1}, t_k])."""
        return self._requests.get((pod.name, engine), [[] for _ in range(self.sample_count)])

    def observations(self, pod: PodSpec, histogram: str) -> list[list[float]]:
        """Observed values of a histogram family per sample index k, all engines (engine order)."""
        h = HISTOGRAMS[histogram]
        per_k: list[list[float]] = [[] for _ in range(self.sample_count)]
        if histogram not in {x.name for x in self._app_histograms(pod)}:
            return per_k
        for engine in pod.engines:
            for k, reqs in enumerate(self.requests(pod, engine)):
                for r in reqs:
                    per_k[k].extend(r.observed(h.observe))
        return per_k

    def app_windows(self, pod: PodSpec) -> tuple[tuple[int, int], ...]:
        """Sample-index ranges [k_first, k_last] in which the pod's app answers /metrics."""
        if pod.app is AppKind.NONE:
            return ()
        end = self.scenario.pod_end_s(pod)
        first = self.k_of(pod.start_s + pod.app_ready_s)
        if pod.restart_s is None:
            return ((first, self.k_of(end)),)
        return ((first, self.k_of(pod.restart_s)), (self.k_of(pod.restart_s + RESTART_GAP_S), self.k_of(end)))

    def app_ready(self, pod: PodSpec, k: int) -> bool:
        return any(lo <= k <= hi for lo, hi in self.app_windows(pod))

    def pod_phase_at(self, pod: PodSpec, t_s: int) -> PodPhase | None:
        """The phase kube-state-metrics reports in the sample at t (None before the pod exists)."""
        if t_s < pod.created_s:
            return None
        if t_s <= pod.start_s:
            return PodPhase.PENDING
        if pod.end_s is None or t_s <= pod.end_s:
            return PodPhase.RUNNING
        return pod.final_phase

    # -- building blocks ----------------------------------------------------------------------------
    def _new(
        self, name: str, metric_type: str, labels: tuple[tuple[str, str], ...], **meta: object
    ) -> list[float | None]:
        family = str(meta.pop("family", name))
        s = K8sSeries(len(self._series), name, metric_type, labels, family=family, **meta)  # type: ignore[arg-type]
        data: list[float | None] = [None] * self.sample_count
        self._series.append(s)
        self._data.append(data)
        return data

    def _rng(self, *parts: object) -> random.Random:
        key = "/".join(str(p) for p in (self.scenario.seed, *parts))
        return random.Random(key)  # noqa: S311 - reproducible test data, not secrets

    def _noise(self, *parts: object) -> list[float]:
        """Uniform noise in [-1, 1] per sample index, a pure function of (seed, parts)."""
        rng = self._rng("noise", *parts)
        return [2 * rng.random() - 1 for _ in range(self.sample_count)]

    def _pod_ks(self, pod: PodSpec) -> range:
        """Sample indices that belong to a running pod: start < t <= end."""
        return range(self.k_of(pod.start_s) + 1, self.k_of(self.scenario.pod_end_s(pod)) + 1)

    # -- dcgm-exporter ------------------------------------------------------------------------------
    def _dcgm_base(self, node: K8sNode, slot: GpuSlot) -> tuple[tuple[str, str], ...]:
        gpu = node.gpus[slot.gpu]
        mig = node.mig_instance(slot)
        return _labels(
            (c.LABEL_GPU, str(gpu.index)),
            (c.LABEL_UUID, gpu.uuid),
            (c.LABEL_PCI_BUS_ID, gpu.pci_bus_id),
            (c.LABEL_DEVICE, f"nvidia{gpu.index}"),
            (c.LABEL_MODEL_NAME, node.gpu_model.name),
            (LABEL_GPU_INSTANCE_PROFILE, "" if mig is None else mig.profile),
            (c.LABEL_GPU_INSTANCE, "" if mig is None else str(mig.gi)),
            (node.host_label, node.hostname),
            (LABEL_DRIVER_VERSION, node.driver_version),
        )

    def _dcgm_labels(self, node: K8sNode, slot: GpuSlot, pod: PodSpec | None) -> tuple[tuple[str, str], ...]:
        target = (
            (LABEL_ENDPOINT, "gpu-metrics"),
            (c.LABEL_INSTANCE, node.dcgm_instance),
            (LABEL_JOB, DCGM_CONTAINER),
            (LABEL_SERVICE, DCGM_CONTAINER),
        )
        exporter_pod = (
            (c.LABEL_CONTAINER, DCGM_CONTAINER),
            (c.LABEL_NAMESPACE, DCGM_NAMESPACE),
            (c.LABEL_POD, node.dcgm_pod),
        )
        base = self._dcgm_base(node, slot)
        if pod is None:
            return (*base, *exporter_pod, *target)
        holder = pod.containers[0].name
        if node.honor_labels:  # the scraped pod labels win over the target's
            mine = ((c.LABEL_CONTAINER, holder), (c.LABEL_NAMESPACE, pod.namespace), (c.LABEL_POD, pod.name))
            return (*base, *mine, *target)
        exported = (
            (LABEL_EXPORTED_CONTAINER, holder),
            (c.LABEL_EXPORTED_NAMESPACE, pod.namespace),
            (c.LABEL_EXPORTED_POD, pod.name),
        )
        return (*base, *exported, *exporter_pod, *target)

    def _slot_state(
        self, node: K8sNode, slot: GpuSlot
    ) -> tuple[list[PodSpec | None], list[float], list[int]]:
        """Owner, activity 0..1 and FB used (MiB) of a slot at every sample."""
        n = self.sample_count
        owners: list[PodSpec | None] = [None] * n
        for holder in self.scenario.pods_on(node.hostname):
            if slot in holder.slots:
                for k in self._pod_ks(holder):
                    owners[k] = holder
        na = self._noise(node.hostname, slot.key, "activity")
        nf = self._noise(node.hostname, slot.key, "fb")
        acts, fbs = [0.0] * n, [0] * n
        for k, pod in enumerate(owners):
            if pod is None:
                continue
            t = self.time_of(k)
            elapsed = t - pod.start_s
            steady, fb = pod.activity, pod.fb_used_mib
            if pod.app is not AppKind.NONE:
                if self.app_ready(pod, k):
                    acts[k], fbs[k] = steady + 0.05 * na[k], fb + round(32 * nf[k])
                elif pod.restart_s is not None and pod.restart_s < t:
                    acts[k], fbs[k] = 0.01, 512  # restarted: reloading the model
                else:
                    acts[k], fbs[k] = 0.02, 1024 + (fb - 1024) * elapsed // max(1, pod.app_ready_s)
                continue
            if elapsed <= 300:  # warm-up
                acts[k] = 0.1 + (steady - 0.1) * elapsed / 300
                fbs[k] = 1024 + (fb - 1024) * elapsed // 300
                continue
            if pod.stall is not None and pod.stall[0] < t <= pod.stall[1]:
                acts[k] = 0.12 + 0.03 * na[k]
            else:
                acts[k] = steady + 0.03 * na[k]
            fbs[k] = fb + round(32 * nf[k])
        return owners, [min(1.0, max(0.0, a)) for a in acts], fbs

    def _build_dcgm(self, node: K8sNode) -> None:
        states = {slot: self._slot_state(node, slot) for slot in node.slots()}
        for field in DcgmField:
            for slot, (owners, acts, fbs) in states.items():
                mig = node.mig_instance(slot)
                if mig is not None and field not in MIG_INSTANCE_FIELDS:
                    continue
                noise = self._noise(node.hostname, slot.key, "NVLINK" if field in _NVLINK else field.name)
                cap = node.fb_capacity_mib(slot)
                by_owner: dict[str, list[float | None]] = {}
                for k, pod in enumerate(owners):
                    key = "" if pod is None else pod.name
                    data = by_owner.get(key)
                    if data is None:
                        data = self._new(
                            field.value,
                            "gauge",
                            self._dcgm_labels(node, slot, pod),
                            source=SeriesSource.DCGM,
                            node=node.hostname,
                            namespace="" if pod is None else pod.namespace,
                            pod=key,
                            slot=slot.key,
                            field=field,
                        )
                        by_owner[key] = data
                    data[k] = self._dcgm_value(field, pod, acts[k], fbs[k], cap, noise[k])
            for gpu in node.gpus:  # MIG GPUs: device-level fields, never attributed to a pod
                if not node.is_mig(gpu.index) or field not in DEVICE_FIELDS:
                    continue
                slot = GpuSlot(gpu.index)
                noise = self._noise(node.hostname, "device", gpu.index, field.name)
                inst = [states[s][1] for s in node.slots() if s.gpu == gpu.index]
                labels = self._dcgm_labels(node, slot, None)
                data = self._new(
                    field.value,
                    "gauge",
                    labels,
                    source=SeriesSource.DCGM,
                    node=node.hostname,
                    slot=slot.key,
                    field=field,
                )
                for k in range(self.sample_count):
                    a = sum(acts[k] for acts in inst) / len(inst)
                    data[k] = self._device_value(field, a, noise[k])

    def _dcgm_value(
        self, field: DcgmField, pod: PodSpec | None, a: float, fb: int, cap: int, n: float
    ) -> float:
        f = DcgmField
        if field is f.FB_USED:
            return fb
        if field is f.FB_FREE:
            return cap - fb
        if pod is None:
            if field in (f.PCIE_RX, f.PCIE_TX):
                return 2048 + round(512 * n)
            return 0 if field in (f.GPU_UTIL, f.MEM_COPY_UTIL, *DEVICE_FIELDS) else 0.0
        if field is f.GPU_UTIL:
            return min(100, max(0, round(100 * a + 2 * n)))
        coef = _RATIO_COEF.get(field)
        if field is f.PIPE_TENSOR_ACTIVE and pod.app is not AppKind.NONE:
            coef = 0.28
        if coef is not None:
            return round(min(1.0, max(0.0, coef * a + 0.004 * n)), 6)
        if field is f.MEM_COPY_UTIL:
            return min(100, max(0, round(52 * a + n)))
        if field is f.PCIE_RX:
            return max(0, round(a * 2.4e9 + 5e7 * n))
        if field is f.PCIE_TX:
            return max(0, round(a * 4.0e8 + 1e7 * n))
        tx = max(0, round(a * pod.nvlink_bytes_per_s * (1 + 0.02 * n)))
        rx = max(0, round(a * pod.nvlink_bytes_per_s * (1 - 0.02 * n)))
        if field is f.NVLINK_TX:
            return tx
        if field is f.NVLINK_RX:
            return rx
        return (tx + rx) // 1_024_000  # NVLINK_BANDWIDTH_TOTAL: KiB/s / 1000, TX+RX

    def _device_value(self, field: DcgmField, a: float, n: float) -> float:
        if field is DcgmField.PCIE_RX:
            return max(0, round(a * 1.2e9 + 2e7 * n))
        if field is DcgmField.PCIE_TX:
            return max(0, round(a * 2.0e8 + 5e6 * n))
        return 0  # a single MIG GPU: no NVLink traffic

    # -- cAdvisor -----------------------------------------------------------------------------------
    def _cadvisor_target(self, node: K8sNode) -> tuple[tuple[str, str], ...]:
        return (
            (LABEL_ENDPOINT, "https-metrics"),
            (c.LABEL_INSTANCE, node.kubelet_instance),
            (LABEL_JOB, "kubelet"),
            (LABEL_METRICS_PATH, "/metrics/cadvisor"),
            (c.KSM_LABEL_NODE, node.hostname),
            (LABEL_SERVICE, "kubelet"),
        )

    def _cpu_levels(self, pod: PodSpec, container: ContainerSpec) -> list[int]:
        """Millicores per ten-minute stretch of the scenario."""
        rng = self._rng("cpu", pod.namespace, pod.name, container.name)
        count = (self.scenario.end_s - self.scenario.start_s) // _SEGMENT_S + 1
        return [round(container.cpu_millicores * (0.85 + 0.3 * rng.random())) for _ in range(count)]

    def _build_cadvisor(self, pod: PodSpec) -> None:
        node = self.scenario.node(pod.node)
        target = self._cadvisor_target(node)
        uid = pod.pod_id.replace("-", "_")
        pod_slice = f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{uid}.slice"
        n = self.sample_count
        ks = self._pod_ks(pod)
        pod_cpu_us = [0] * n  # the pod cgroup: every container's CPU time, dead ones included
        pod_mem = [0] * n
        instances: list[tuple[ContainerSpec, int, range]] = []
        for ci, cont in enumerate(pod.containers):
            if ci == 0 and pod.restart_s is not None:
                k_restart = self.k_of(pod.restart_s)
                instances += [
                    (cont, 0, range(ks.start, k_restart + 1)),
                    (cont, 1, range(k_restart + 1, ks.stop)),
                ]
            else:
                instances.append((cont, 0, ks))
        meta: dict[str, object] = {
            "source": SeriesSource.CADVISOR,
            "node": node.hostname,
            "namespace": pod.namespace,
            "pod": pod.name,
        }
        for cont, idx, kr in instances:
            cid = hashlib.sha256(f"{pod.pod_id}/{cont.name}/{idx}".encode()).hexdigest()
            ident = (
                (LABEL_CGROUP_ID, f"{pod_slice}/cri-containerd-{cid}.scope"),
                (LABEL_IMAGE, cont.image),
                (LABEL_CONTAINER_NAME, cid),
                (c.LABEL_NAMESPACE, pod.namespace),
                (c.LABEL_POD, pod.name),
            )
            head = (c.LABEL_CONTAINER, cont.name)
            cpu_labels = (head, (c.LABEL_CPU, "total"), *ident, *target)
            cpu = self._new(
                c.CADVISOR_CPU_SECONDS, "counter", cpu_labels, container=cont.name, instance=idx, **meta
            )
            mem_labels = (head, *ident, *target)
            mem = self._new(
                c.CADVISOR_MEMORY_WORKING_SET, "gauge", mem_labels, container=cont.name, instance=idx, **meta
            )
            levels = self._cpu_levels(pod, cont)
            noise = self._noise("mem", pod.namespace, pod.name, cont.name, idx)
            is_app = pod.app is not AppKind.NONE and cont is pod.containers[0]
            cum = 0
            for k in kr:
                t = self.time_of(k)
                loading = is_app and not self.app_ready(pod, k)
                mc = 1200 if loading else levels[(t - self.scenario.start_s) // _SEGMENT_S]
                cum += mc * self.interval_s * 1000  # microseconds of CPU time
                cpu[k] = cum / 1_000_000
                used = (cont.memory_bytes // 2 if loading else cont.memory_bytes) + 4096 * round(
                    2048 * noise[k]
                )
                mem[k] = used
                pod_mem[k] += used
                pod_cpu_us[k] += cum
            for k in range(kr.stop, ks.stop):
                pod_cpu_us[k] += cum
        sandbox_id = hashlib.sha256(f"{pod.pod_id}/sandbox".encode()).hexdigest()
        sandbox = (
            (LABEL_CGROUP_ID, f"{pod_slice}/cri-containerd-{sandbox_id}.scope"),
            (LABEL_IMAGE, "registry.k8s.io/pause:3.10"),
            (LABEL_CONTAINER_NAME, sandbox_id),
            (c.LABEL_NAMESPACE, pod.namespace),
            (c.LABEL_POD, pod.name),
        )
        head = (c.LABEL_CONTAINER, POD_SANDBOX)
        cgroup = ((LABEL_CGROUP_ID, pod_slice), (c.LABEL_NAMESPACE, pod.namespace), (c.LABEL_POD, pod.name))
        sb_cpu = self._new(
            c.CADVISOR_CPU_SECONDS,
            "counter",
            (head, (c.LABEL_CPU, "total"), *sandbox, *target),
            container=POD_SANDBOX,
            **meta,
        )
        sb_mem = self._new(
            c.CADVISOR_MEMORY_WORKING_SET, "gauge", (head, *sandbox, *target), container=POD_SANDBOX, **meta
        )
        pg_cpu = self._new(
            c.CADVISOR_CPU_SECONDS, "counter", ((c.LABEL_CPU, "total"), *cgroup, *target), **meta
        )
        pg_mem = self._new(c.CADVISOR_MEMORY_WORKING_SET, "gauge", (*cgroup, *target), **meta)
        sb_us = 0
        for k in ks:
            sb_us += 2 * self.interval_s * 1000  # 2 millicores
            sb_cpu[k] = sb_us / 1_000_000
            sb_mem[k] = 475_136
            pg_cpu[k] = (pod_cpu_us[k] + sb_us + 40_000 * (k - ks.start + 1)) / 1_000_000
            pg_mem[k] = pod_mem[k] + 475_136 + 8 * 1024 * 1024

    # -- kube-state-metrics -------------------------------------------------------------------------
    def _build_ksm(self, pod: PodSpec) -> None:
        sc = self.scenario
        node = sc.node(pod.node)
        target = ((c.LABEL_INSTANCE, KSM_INSTANCE), (LABEL_JOB, "kube-state-metrics"))
        ident = (
            (c.KSM_LABEL_NAMESPACE, pod.namespace),
            (c.KSM_LABEL_POD, pod.name),
            (c.KSM_LABEL_UID, pod.pod_id),
        )
        meta = {
            "source": SeriesSource.KSM,
            "node": node.hostname,
            "namespace": pod.namespace,
            "pod": pod.name,
        }
        k_created, k_start, k_last = self.k_of(pod.created_s), self.k_of(pod.start_s), self.sample_count - 1

        def info(with_ip: bool) -> tuple[tuple[str, str], ...]:
            return _labels(
                *ident,
                (LABEL_HOST_IP, node.ip),
                (LABEL_POD_IP, pod.ip if with_ip else ""),
                (c.KSM_LABEL_NODE, node.hostname),
                (c.KSM_LABEL_CREATED_BY_KIND, pod.owner_kind),
                (c.KSM_LABEL_CREATED_BY_NAME, pod.owner_name),
                (LABEL_HOST_NETWORK, "false"),
                *target,
            )

        pending_info = self._new(c.KSM_POD_INFO, "gauge", info(False), **meta)
        running_info = self._new(c.KSM_POD_INFO, "gauge", info(True), **meta)
        owner = self._new(
            c.KSM_POD_OWNER,
            "gauge",
            (
                *ident,
                (c.KSM_LABEL_OWNER_KIND, pod.owner_kind),
                (c.KSM_LABEL_OWNER_NAME, pod.owner_name),
                (c.KSM_LABEL_OWNER_IS_CONTROLLER, "true"),
                *target,
            ),
            **meta,
        )
        created = self._new(c.KSM_POD_CREATED, "gauge", (*ident, *target), **meta)
        started = self._new(c.KSM_POD_START_TIME, "gauge", (*ident, *target), **meta)
        completed = (
            None
            if pod.end_s is None
            else self._new(c.KSM_POD_COMPLETION_TIME, "gauge", (*ident, *target), **meta)
        )
        phases = {
            ph: self._new(
                c.KSM_POD_STATUS_PHASE, "gauge", (*ident, (c.KSM_LABEL_PHASE, ph.value), *target), **meta
            )
            for ph in PodPhase
        }
        for k in range(k_created, k_last + 1):
            t = self.time_of(k)
            (pending_info if k <= k_start else running_info)[k] = 1
            owner[k] = 1
            created[k] = pod.created_s
            if k > k_start:
                started[k] = pod.start_s
            if completed is not None and pod.end_s is not None and t > pod.end_s:
                completed[k] = pod.end_s
            phase = self.pod_phase_at(pod, t)
            for ph, data in phases.items():
                data[k] = 1 if ph is phase else 0
        if pod.owner_kind == "ReplicaSet" and (pod.namespace, pod.owner_name) not in self._replicasets:
            self._replicasets.add((pod.namespace, pod.owner_name))
            rs = self._new(
                c.KSM_REPLICASET_OWNER,
                "gauge",
                (
                    (c.KSM_LABEL_NAMESPACE, pod.namespace),
                    (c.KSM_LABEL_REPLICASET, pod.owner_name),
                    (c.KSM_LABEL_OWNER_KIND, pod.workload_kind),
                    (c.KSM_LABEL_OWNER_NAME, pod.workload),
                    (c.KSM_LABEL_OWNER_IS_CONTROLLER, "true"),
                    *target,
                ),
                source=SeriesSource.KSM,
                node=node.hostname,
                namespace=pod.namespace,
            )
            for k in range(self.sample_count):
                rs[k] = 1

    # -- vLLM / NIM ---------------------------------------------------------------------------------
    def _app_histograms(self, pod: PodSpec) -> tuple[HistogramDef, ...]:
        return {AppKind.VLLM: VLLM_HISTOGRAMS, AppKind.NIM: NIM_HISTOGRAMS}.get(pod.app, ())

    def _make_request(self, rng: random.Random, pod: PodSpec) -> Request:
        r = rng.random()
        reason = "stop" if r < 0.8 else "length" if r < 0.95 else "abort" if r < 0.99 else "error"
        queue = rng.lognormvariate(math.log(0.05), 1.0)
        prefill = rng.lognormvariate(math.log(0.08), 0.5)
        slow = 8.0 if pod.app is AppKind.NIM else 4.0
        decode = rng.lognormvariate(math.log(slow), 0.7 if pod.app is AppKind.NIM else 0.6)
        first = rng.lognormvariate(math.log(0.012), 0.3)
        gen = max(1, round(decode / 0.025))
        itl = tuple(round(rng.lognormvariate(math.log(0.025), 0.35), 6) for _ in range(min(6, gen)))

        def q(x: float) -> float:
            return max(1e-6, round(x, 6))

        return Request(
            reason,
            rng.randint(32, 2048),
            gen,
            q(queue),
            q(prefill),
            q(decode),
            q(queue + prefill + first),
            q(queue + prefill + decode),
            itl,
        )

    def _build_app(self, pod: PodSpec) -> None:
        load_rng = self._rng("load", pod.namespace, pod.name)
        segments = (self.scenario.end_s - self.scenario.start_s) // _SEGMENT_S + 1
        load = [0.5 + load_rng.random() for _ in range(segments)]
        for engine in pod.engines:
            self._build_engine(pod, engine, load)

    def _app_series(
        self,
        pod: PodSpec,
        engine: str,
        name: str,
        kind: str,
        extra: tuple[tuple[str, str], ...] = (),
        family: str = "",
        le: str = "",
    ) -> list[float | None]:
        target = (
            (c.LABEL_CONTAINER, pod.containers[0].name),
            (LABEL_ENDPOINT, "http"),
            (c.LABEL_INSTANCE, f"{pod.ip}:{pod.app_port}"),
            (LABEL_JOB, f"{pod.namespace}/{pod.workload}"),
            (c.LABEL_NAMESPACE, pod.namespace),
            (c.LABEL_POD, pod.name),
        )
        labels = _labels(
            (LABEL_ENGINE, engine), *extra, (LABEL_MODEL, pod.model_name), (c.LABEL_LE, le), *target
        )
        return self._new(
            name,
            kind,
            labels,
            family=family or name,
            source=SeriesSource.APP,
            node=pod.node,
            namespace=pod.namespace,
            pod=pod.name,
            engine=engine,
            le=le,
        )

    def _build_engine(self, pod: PodSpec, engine: str, load: Sequence[float]) -> None:
        n = self.sample_count
        windows = self.app_windows(pod)
        vllm = pod.app is AppKind.VLLM
        rng = self._rng("requests", pod.namespace, pod.name, engine)
        per_k: list[list[Request]] = [[] for _ in range(n)]
        lams = [0.0] * n
        for lo, hi in windows:
            for k in range(lo + 1, hi + 1):  # the first sample of a serving stretch is all zero
                lams[k] = (
                    pod.requests_per_interval * load[(self.time_of(k) - self.scenario.start_s) // _SEGMENT_S]
                )
                per_k[k] = [self._make_request(rng, pod) for _ in range(_poisson(rng, lams[k]))]
        self._requests[(pod.name, engine)] = per_k

        def new(name: str, kind: str, extra: tuple[tuple[str, str], ...] = ()) -> list[float | None]:
            return self._app_series(pod, engine, name, kind, extra)

        noise = self._noise("app", pod.namespace, pod.name, engine)
        running = new(c.VLLM_NUM_REQUESTS_RUNNING if vllm else c.NIM_NUM_REQUESTS_RUNNING, "gauge")
        waiting = new(c.VLLM_NUM_REQUESTS_WAITING if vllm else c.NIM_NUM_REQUESTS_WAITING, "gauge")
        caches = (
            [new(c.VLLM_KV_CACHE_USAGE, "gauge"), new(c.VLLM_GPU_CACHE_USAGE_OLD, "gauge")]
            if vllm
            else [new(c.NIM_GPU_CACHE_USAGE, "gauge")]
        )
        max_req = None if vllm else new(c.NIM_NUM_REQUEST_MAX, "gauge")
        prompt = new(c.VLLM_PROMPT_TOKENS if vllm else NIM_PROMPT_TOKENS, "counter")
        generated = new(c.VLLM_GENERATION_TOKENS if vllm else NIM_GENERATION_TOKENS, "counter")
        if vllm:
            outcomes = {
                reason: new(c.VLLM_REQUEST_SUCCESS, "counter", ((c.LABEL_FINISHED_REASON, reason),))
                for reason in FINISH_REASONS
            }
        else:
            outcomes = {
                "ok": new(c.NIM_REQUEST_SUCCESS, "counter"),
                "failed": new(c.NIM_REQUEST_FAILURE, "counter"),
            }
        hists = []
        for h in self._app_histograms(pod):
            buckets = [
                self._app_series(pod, engine, f"{h.name}{c.BUCKET_SUFFIX}", "histogram", family=h.name, le=le)
                for le in h.les
            ]
            hsum = self._app_series(pod, engine, f"{h.name}_sum", "histogram", family=h.name)
            hcount = self._app_series(pod, engine, f"{h.name}_count", "histogram", family=h.name)
            hists.append((h, buckets, hsum, hcount))
        for lo, hi in windows:  # every serving stretch starts from zero (a restart resets everything)
            tokens = [0, 0]
            outs = dict.fromkeys(outcomes, 0)
            counts = [[0] * len(h.les) for h, *_ in hists]
            totals = [0.0] * len(hists)
            for k in range(lo, hi + 1):
                reqs = per_k[k]
                busy = 0 if k == lo else max(0, round(lams[k] * 2.5 + 2 * noise[k]))
                running[k] = busy
                waiting[k] = max(0, busy - 8)
                usage = 0.0 if k == lo else round(min(1.0, 0.02 + 0.045 * busy + 0.01 * noise[k]), 4)
                for cache in caches:
                    cache[k] = usage
                if max_req is not None:
                    max_req[k] = NIM_REQUEST_MAX
                for r in reqs:
                    tokens[0] += r.prompt_tokens
                    tokens[1] += r.generation_tokens
                    if vllm:
                        outs[r.finished_reason] += 1
                    else:
                        outs["ok" if r.finished_reason in c.SUCCESS_REASONS else "failed"] += 1
                prompt[k], generated[k] = tokens
                for key, data in outcomes.items():
                    data[k] = outs[key]
                for i, (h, buckets, hsum, hcount) in enumerate(hists):
                    for r in reqs:
                        for v in r.observed(h.observe):
                            counts[i][bisect.bisect_left(h.bounds, v)] += 1
                            totals[i] += v
                    cum = 0
                    for b, data in enumerate(buckets):
                        cum += counts[i][b]
                        data[k] = cum
                    hsum[k] = totals[i]
                    hcount[k] = cum
