"""THE metric table: every exported series name, wire name, unit, form and cross-GPU aggregation.

Nothing else in gpulens spells a DCGM or node-exporter series name or a dialect's metric key.
The planners turn a `MetricDef` into PromQL (planning/hosts.py, `plan_host`; a `PodMetricDef`:
planning/pods.py, `plan_pod_metric`), escaping through planning/promql.py; the dialects pick the defs
they expose by their wire names.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Agg(enum.StrEnum):
    """How the per-GPU series of one host become one series."""

    AVG = "avg"
    MAX = "max"
    SUM = "sum"


class Form(enum.StrEnum):
    """The shape of the query; planning/hosts.py (`plan_host`) has one branch per form."""

    GPU_GAUGE = "gpu_gauge"  # agg(collapse(M)) * scale
    GPU_FB_PERCENT = "gpu_fb_percent"  # 100 * agg(used / (used + free)), per GPU first
    NODE_GAUGE = "node_gauge"  # max(M) * scale
    NODE_DIFF = "node_diff"  # max(A) - max(B)
    NODE_CPU_BUSY_PERCENT = "node_cpu_busy_percent"  # 100 * (1 - sum(rate(idle[w])) / sum(rate(all[w])))

    @property
    def reads_ranges(self) -> bool:
        """Whether its query reads every sample of a range per point (`rate`): a read's costliest
        query (a day of host CPU took 40-90 ms of a damaged read's backend time, a GPU gauge 5-30
        ms), sent first."""
        return self is Form.NODE_CPU_BUSY_PERCENT


class Exporter(enum.StrEnum):
    DCGM = "dcgm"
    NODE = "node"


@dataclass(frozen=True, slots=True)
class Source:
    """One way to compute a metric: the series the form reads and the factor to the wire unit."""

    series: tuple[str, ...]
    scale: float = 1.0


@dataclass(frozen=True, slots=True)
class MetricDef:
    key: str  # our internal name
    lyceum: str  # Lyceum wire key ("" when the dialect does not expose it)
    unit: str
    form: Form
    exporter: Exporter
    sources: tuple[Source, ...]  # fallback chain, tried per timestamp in order (PromQL `or`)
    agg: Agg = Agg.AVG
    description: str = ""


# -- exporter series names (the defaults; settings may rename them) --------------------------------
DCGM_GPU_UTIL = "DCGM_FI_DEV_GPU_UTIL"
DCGM_GR_ENGINE_ACTIVE = "DCGM_FI_PROF_GR_ENGINE_ACTIVE"
DCGM_FB_USED = "DCGM_FI_DEV_FB_USED"
DCGM_FB_FREE = "DCGM_FI_DEV_FB_FREE"
DCGM_GPU_TEMP = "DCGM_FI_DEV_GPU_TEMP"
DCGM_POWER_USAGE = "DCGM_FI_DEV_POWER_USAGE"
DCGM_ENFORCED_POWER_LIMIT = "DCGM_FI_DEV_ENFORCED_POWER_LIMIT"
DCGM_POWER_MGMT_LIMIT = "DCGM_FI_DEV_POWER_MGMT_LIMIT"
DCGM_SM_CLOCK = "DCGM_FI_DEV_SM_CLOCK"
DCGM_MEM_CLOCK = "DCGM_FI_DEV_MEM_CLOCK"
DCGM_PCIE_RX_BYTES = "DCGM_FI_PROF_PCIE_RX_BYTES"
DCGM_PCIE_TX_BYTES = "DCGM_FI_PROF_PCIE_TX_BYTES"
DCGM_PCIE_RX_THROUGHPUT = "DCGM_FI_DEV_PCIE_RX_THROUGHPUT"
DCGM_PCIE_TX_THROUGHPUT = "DCGM_FI_DEV_PCIE_TX_THROUGHPUT"
NODE_MEM_TOTAL = "node_memory_MemTotal_bytes"
NODE_MEM_AVAILABLE = "node_memory_MemAvailable_bytes"
NODE_CPU_SECONDS = "node_cpu_seconds_total"
NODE_UNAME_INFO = "node_uname_info"

LABEL_METRIC_NAME = "__name__"  # Prometheus' label for the metric name
# Prometheus' default lookback delta: an instant selector takes a series' last sample at most this old
# (so a series stays visible this long after its last sample)
LOOKBACK_MS = 300_000
# dcgm-exporter labels
LABEL_GPU = "gpu"
LABEL_UUID = "UUID"
LABEL_GPU_INSTANCE = "GPU_I_ID"
DCGM_HOST_LABELS = ("Hostname", "hostname")  # <= 4.5.3-4.8.2 / after PR #655
# node-exporter labels
LABEL_INSTANCE = "instance"
LABEL_NODENAME = "nodename"
LABEL_CPU_MODE = "mode"
CPU_IDLE_MODE = "idle"

# kube-state-metrics (pod discovery, service/discovery.py): series and their labels
KSM_POD_INFO = "kube_pod_info"
KSM_POD_OWNER = "kube_pod_owner"
KSM_POD_CREATED = "kube_pod_created"  # unix seconds
KSM_POD_START_TIME = "kube_pod_start_time"  # unix seconds
KSM_POD_COMPLETION_TIME = "kube_pod_completion_time"  # unix seconds; only once the pod completed
KSM_POD_STATUS_PHASE = "kube_pod_status_phase"  # 0/1 per phase
KSM_REPLICASET_OWNER = "kube_replicaset_owner"  # a Deployment's ReplicaSets
KSM_LABEL_NAMESPACE = "namespace"
KSM_LABEL_POD = "pod"
KSM_LABEL_UID = "uid"
KSM_LABEL_NODE = "node"
KSM_LABEL_CREATED_BY_KIND = "created_by_kind"
KSM_LABEL_CREATED_BY_NAME = "created_by_name"
KSM_LABEL_OWNER_KIND = "owner_kind"
KSM_LABEL_OWNER_NAME = "owner_name"
KSM_LABEL_OWNER_IS_CONTROLLER = "owner_is_controller"
KSM_LABEL_PHASE = "phase"
KSM_LABEL_REPLICASET = "replicaset"
KSM_NO_OWNER = "<none>"  # owner_kind/owner_name of a pod without an owner

KIB = 1024.0

# how a MetricDef's unit reads to people (the API description, `gpulens metrics`)
UNIT_LABELS = {
    "percent": "percent (0-100)",
    "celsius": "°C",
    "watt": "W",
    "megahertz": "MHz",
    "bytes_per_second": "bytes/sec",
    "bytes": "bytes",
}

LYCEUM_METRICS: tuple[MetricDef, ...] = (
    MetricDef(
        "gpu_utilization_percent",
        "gpuUtilizationPercent",
        "percent",
        Form.GPU_GAUGE,
        Exporter.DCGM,
        (Source((DCGM_GPU_UTIL,)), Source((DCGM_GR_ENGINE_ACTIVE,), 100.0)),
        Agg.AVG,
        "GPU utilization 0-100, mean over the execution's GPUs (MIG: graphics-engine activity x 100)",
    ),
    MetricDef(
        "gpu_memory_utilization_percent",
        "gpuMemoryUtilizationPercent",
        "percent",
        Form.GPU_FB_PERCENT,
        Exporter.DCGM,
        (Source((DCGM_FB_USED, DCGM_FB_FREE)),),
        Agg.AVG,
        "Frame-buffer occupancy used/(used+free) x 100, per GPU, then the mean",
    ),
    MetricDef(
        "gpu_temperature_celsius",
        "gpuTemperatureCelsius",
        "celsius",
        Form.GPU_GAUGE,
        Exporter.DCGM,
        (Source((DCGM_GPU_TEMP,)),),
        Agg.MAX,
        "Temperature of the hottest GPU",
    ),
    MetricDef(
        "gpu_power_watt",
        "gpuPowerWatt",
        "watt",
        Form.GPU_GAUGE,
        Exporter.DCGM,
        (Source((DCGM_POWER_USAGE,)),),
        Agg.SUM,
        "Power draw, summed over the GPUs",
    ),
    MetricDef(
        "gpu_power_limit_watt",
        "gpuPowerLimitWatt",
        "watt",
        Form.GPU_GAUGE,
        Exporter.DCGM,
        (Source((DCGM_ENFORCED_POWER_LIMIT,)), Source((DCGM_POWER_MGMT_LIMIT,))),
        Agg.SUM,
        "Power limit (enforced, else management), summed over the GPUs",
    ),
    MetricDef(
        "gpu_clock_sm_mhz",
        "gpuClockSmMhz",
        "megahertz",
        Form.GPU_GAUGE,
        Exporter.DCGM,
        (Source((DCGM_SM_CLOCK,)),),
        Agg.AVG,
        "SM clock, mean over the GPUs",
    ),
    MetricDef(
        "gpu_clock_mem_mhz",
        "gpuClockMemMhz",
        "megahertz",
        Form.GPU_GAUGE,
        Exporter.DCGM,
        (Source((DCGM_MEM_CLOCK,)),),
        Agg.AVG,
        "Memory clock, mean over the GPUs",
    ),
    MetricDef(
        "gpu_pcie_rx_bytes_per_second",
        "gpuPcieThroughputRxBytesPerSec",
        "bytes_per_second",
        Form.GPU_GAUGE,
        Exporter.DCGM,
        (Source((DCGM_PCIE_RX_BYTES,)), Source((DCGM_PCIE_RX_THROUGHPUT,), KIB)),
        Agg.SUM,
        "PCIe receive rate (profiling bytes/s, else device KB/s x 1024), summed over the GPUs",
    ),
    MetricDef(
        "gpu_pcie_tx_bytes_per_second",
        "gpuPcieThroughputTxBytesPerSec",
        "bytes_per_second",
        Form.GPU_GAUGE,
        Exporter.DCGM,
        (Source((DCGM_PCIE_TX_BYTES,)), Source((DCGM_PCIE_TX_THROUGHPUT,), KIB)),
        Agg.SUM,
        "PCIe transmit rate (profiling bytes/s, else device KB/s x 1024), summed over the GPUs",
    ),
    MetricDef(
        "system_ram_total_bytes",
        "systemRamTotalBytes",
        "bytes",
        Form.NODE_GAUGE,
        Exporter.NODE,
        (Source((NODE_MEM_TOTAL,)),),
        Agg.MAX,
        "Host RAM",
    ),
    MetricDef(
        "system_ram_used_bytes",
        "systemRamUsedBytes",
        "bytes",
        Form.NODE_DIFF,
        Exporter.NODE,
        (Source((NODE_MEM_TOTAL, NODE_MEM_AVAILABLE)),),
        Agg.MAX,
        "Host RAM in use: MemTotal - MemAvailable",
    ),
    MetricDef(
        "system_cpu_usage_percent",
        "systemCpuUsagePercent",
        "percent",
        Form.NODE_CPU_BUSY_PERCENT,
        Exporter.NODE,
        (Source((NODE_CPU_SECONDS,)),),
        Agg.AVG,
        "Host CPU busy 0-100 (everything but idle; iowait counts as busy), mean over CPUs",
    ),
)

LYCEUM_KEYS: tuple[str, ...] = tuple(m.lyceum for m in LYCEUM_METRICS)


# -- Run:ai pod metrics: exporter series (dcgm-exporter, cAdvisor, vLLM, NIM) ----------------------
DCGM_MEM_COPY_UTIL = "DCGM_FI_DEV_MEM_COPY_UTIL"
DCGM_SM_ACTIVE = "DCGM_FI_PROF_SM_ACTIVE"
DCGM_SM_OCCUPANCY = "DCGM_FI_PROF_SM_OCCUPANCY"
DCGM_PIPE_TENSOR_ACTIVE = "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"
DCGM_PIPE_FP64_ACTIVE = "DCGM_FI_PROF_PIPE_FP64_ACTIVE"
DCGM_PIPE_FP32_ACTIVE = "DCGM_FI_PROF_PIPE_FP32_ACTIVE"
DCGM_PIPE_FP16_ACTIVE = "DCGM_FI_PROF_PIPE_FP16_ACTIVE"
DCGM_DRAM_ACTIVE = "DCGM_FI_PROF_DRAM_ACTIVE"
DCGM_NVLINK_TX_BYTES = "DCGM_FI_PROF_NVLINK_TX_BYTES"
DCGM_NVLINK_RX_BYTES = "DCGM_FI_PROF_NVLINK_RX_BYTES"
DCGM_NVLINK_BANDWIDTH_TOTAL = "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL"  # "MB/s" = KiB/s / 1000, TX+RX
CADVISOR_CPU_SECONDS = "container_cpu_usage_seconds_total"
CADVISOR_SANDBOX_CONTAINER = "POD"  # cAdvisor's pause-container series (not a workload's container)
# Prometheus naming: classic histogram buckets, and the suffixes that mark a counter
BUCKET_SUFFIX = "_bucket"
COUNTER_SUFFIXES = ("_total", BUCKET_SUFFIX, "_count", "_sum")
# a label gpulens' own PromQL adds (p50/p90/p99 in one query); no exporter writes it
LABEL_QUANTILE = "gpulens_quantile"
# the Run:ai wire's per-GPU measurement labels
RUNAI_LABEL_GPU = "gpu"
RUNAI_LABEL_GPU_INSTANCE = "gpuInstance"
CADVISOR_MEMORY_WORKING_SET = "container_memory_working_set_bytes"
VLLM_NUM_REQUESTS_RUNNING = "vllm:num_requests_running"
VLLM_NUM_REQUESTS_WAITING = "vllm:num_requests_waiting"
VLLM_REQUEST_SUCCESS = "vllm:request_success_total"
VLLM_KV_CACHE_USAGE = "vllm:kv_cache_usage_perc"
VLLM_GPU_CACHE_USAGE_OLD = "vllm:gpu_cache_usage_perc"
VLLM_PROMPT_TOKENS = "vllm:prompt_tokens_total"
VLLM_GENERATION_TOKENS = "vllm:generation_tokens_total"
VLLM_TTFT = "vllm:time_to_first_token_seconds"
VLLM_E2E_LATENCY = "vllm:e2e_request_latency_seconds"
VLLM_QUEUE_TIME = "vllm:request_queue_time_seconds"
VLLM_PREFILL_TIME = "vllm:request_prefill_time_seconds"
VLLM_DECODE_TIME = "vllm:request_decode_time_seconds"
VLLM_INTER_TOKEN_LATENCY = "vllm:inter_token_latency_seconds"  # noqa: S105 - a metric name
VLLM_TIME_PER_OUTPUT_TOKEN_OLD = "vllm:time_per_output_token_seconds"  # noqa: S105 - a metric name
NIM_NUM_REQUESTS_RUNNING = "num_requests_running"
NIM_NUM_REQUESTS_WAITING = "num_requests_waiting"
NIM_NUM_REQUEST_MAX = "num_request_max"
NIM_REQUEST_SUCCESS = "request_success_total"
NIM_REQUEST_FAILURE = "request_failure_total"
NIM_GPU_CACHE_USAGE = "gpu_cache_usage_perc"
NIM_TTFT = "time_to_first_token_seconds"
NIM_E2E_LATENCY = "e2e_request_latency_seconds"
# labels
LABEL_POD = "pod"
LABEL_NAMESPACE = "namespace"
LABEL_CONTAINER = "container"
LABEL_EXPORTED_POD = "exported_pod"
LABEL_EXPORTED_NAMESPACE = "exported_namespace"
LABEL_FINISHED_REASON = "finished_reason"
LABEL_LE = "le"
SUCCESS_REASONS = ("stop", "length")  # Run:ai's NIM doc: finished with "stop" or "length"
MIB = 1_048_576.0
NVLINK_MBPS_TO_BYTES = 1_024_000.0  # DCGM field 449: KiB/s / 1000 -> bytes/s


# -- Run:ai pod metricTypes (docs/compatibility.md, "Run:ai") --------------------------------------
class Kind(enum.StrEnum):
    MEASUREMENT = "measurement"  # -> `measurements`
    HISTOGRAM = "histogram"  # -> `histogram`, bucket counts per interval
    PERCENTILES = "percentiles"  # -> `histogram`, {p50, p90, p99}


class PodForm(enum.StrEnum):
    DCGM_PER_GPU = "dcgm_per_gpu"  # max by (gpu, GPU_I_ID) (M{pod}) * scale, one measurement per GPU
    DCGM_POD = "dcgm_pod"  # agg(max by (gpu, GPU_I_ID) (M{pod})) * scale
    CONTAINER_RATE = "container_rate"  # sum(rate(M{ns,pod,container!="",container!="POD"}[w]))
    CONTAINER_SUM = "container_sum"  # sum(M{ns,pod,container!="",container!="POD"})
    APP_GAUGE = "app_gauge"  # agg(M{ns,pod,filters})
    APP_RATE = "app_rate"  # sum(rate(M{...}[w]))
    APP_INCREASE = "app_increase"  # sum(increase(M{...}[step])): count per sample interval
    APP_HISTOGRAM = "app_histogram"  # per-interval bucket counts of M_bucket
    APP_PERCENTILES = "app_percentiles"  # histogram_quantile(q, sum by (le) (rate(M_bucket[w])))
    APP_COUNT = "app_count"  # count(M{ns,pod,extra}): e.g. pods of a workload
    NO_SOURCE = "no_source"  # no public exporter series: always empty


@dataclass(frozen=True, slots=True)
class PodMetricDef:
    type: str  # the Run:ai metricType
    kind: Kind
    form: PodForm
    sources: tuple[Source, ...] = ()  # gauges: fallback chain (`or`); histograms: picked by discovery
    agg: Agg = Agg.SUM
    advanced: bool = False  # "Advanced GPU Metrics" (GPU profiling) flag
    success_filter: bool | None = None  # finished_reason in SUCCESS_REASONS (True) / not in (False)
    unit: str = ""
    extra: tuple[tuple[str, str], ...] = ()  # fixed label matchers, e.g. (("resource", "cpu"),)

    @property
    def per_gpu(self) -> bool:
        """`*_PER_GPU` types answer one measurement per GPU (Run:ai's naming is the contract)."""
        return self.type.endswith("_PER_GPU")


PERCENTILES: tuple[tuple[str, float], ...] = (("p50", 0.5), ("p90", 0.9), ("p99", 0.99))


def _prof(type_: str, series: str) -> PodMetricDef:
    return PodMetricDef(
        type_,
        Kind.MEASUREMENT,
        PodForm.DCGM_PER_GPU,
        (Source((series,), 100.0),),
        advanced=True,
        unit="percent",
    )


def _pct(type_: str, *names: str) -> PodMetricDef:
    return PodMetricDef(
        type_, Kind.PERCENTILES, PodForm.APP_PERCENTILES, tuple(Source((n,)) for n in names), unit="seconds"
    )


def _hist(type_: str, *names: str) -> PodMetricDef:
    return PodMetricDef(
        type_, Kind.HISTOGRAM, PodForm.APP_HISTOGRAM, tuple(Source((n,)) for n in names), unit="seconds"
    )


M, PG, PD = Kind.MEASUREMENT, PodForm.DCGM_PER_GPU, PodForm.DCGM_POD
POD_METRICS: tuple[PodMetricDef, ...] = (
    PodMetricDef("GPU_UTILIZATION_PER_GPU", M, PG, (Source((DCGM_GPU_UTIL,)),), unit="percent"),
    PodMetricDef("GPU_UTILIZATION", M, PD, (Source((DCGM_GPU_UTIL,)),), Agg.AVG, unit="percent"),
    PodMetricDef("GPU_MEMORY_USAGE_BYTES_PER_GPU", M, PG, (Source((DCGM_FB_USED,), MIB),), unit="bytes"),
    PodMetricDef("GPU_MEMORY_USAGE_BYTES", M, PD, (Source((DCGM_FB_USED,), MIB),), Agg.SUM, unit="bytes"),
    PodMetricDef(
        "CPU_USAGE_CORES", M, PodForm.CONTAINER_RATE, (Source((CADVISOR_CPU_SECONDS,)),), unit="cores"
    ),
    PodMetricDef(
        "CPU_MEMORY_USAGE_BYTES",
        M,
        PodForm.CONTAINER_SUM,
        (Source((CADVISOR_MEMORY_WORKING_SET,)),),
        unit="bytes",
    ),
    _prof("GPU_GRAPHICS_ENGINE_ACTIVITY_PER_GPU", DCGM_GR_ENGINE_ACTIVE),
    _prof("GPU_SM_ACTIVITY_PER_GPU", DCGM_SM_ACTIVE),
    _prof("GPU_SM_OCCUPANCY_PER_GPU", DCGM_SM_OCCUPANCY),
    _prof("GPU_TENSOR_ACTIVITY_PER_GPU", DCGM_PIPE_TENSOR_ACTIVE),
    _prof("GPU_FP64_ENGINE_ACTIVITY_PER_GPU", DCGM_PIPE_FP64_ACTIVE),
    _prof("GPU_FP32_ENGINE_ACTIVITY_PER_GPU", DCGM_PIPE_FP32_ACTIVE),
    _prof("GPU_FP16_ENGINE_ACTIVITY_PER_GPU", DCGM_PIPE_FP16_ACTIVE),
    PodMetricDef(
        "GPU_MEMORY_BANDWIDTH_UTILIZATION_PER_GPU",
        M,
        PG,
        (Source((DCGM_DRAM_ACTIVE,), 100.0), Source((DCGM_MEM_COPY_UTIL,))),
        advanced=True,
        unit="percent",
    ),
    PodMetricDef(
        "GPU_NVLINK_TRANSMITTED_BANDWIDTH_PER_GPU",
        M,
        PG,
        (Source((DCGM_NVLINK_TX_BYTES,)),),
        advanced=True,
        unit="bytes_per_second",
    ),
    PodMetricDef(
        "GPU_NVLINK_RECEIVED_BANDWIDTH_PER_GPU",
        M,
        PG,
        (Source((DCGM_NVLINK_RX_BYTES,)),),
        advanced=True,
        unit="bytes_per_second",
    ),
    PodMetricDef(
        "GPU_PCIE_TRANSMITTED_BANDWIDTH_PER_GPU",
        M,
        PG,
        (Source((DCGM_PCIE_TX_BYTES,)),),
        advanced=True,
        unit="bytes_per_second",
    ),
    PodMetricDef(
        "GPU_PCIE_RECEIVED_BANDWIDTH_PER_GPU",
        M,
        PG,
        (Source((DCGM_PCIE_RX_BYTES,)),),
        advanced=True,
        unit="bytes_per_second",
    ),
    PodMetricDef("GPU_SWAP_MEMORY_BYTES_PER_GPU", M, PodForm.NO_SOURCE, advanced=True, unit="bytes"),
    PodMetricDef(
        "NIM_NUM_REQUESTS_RUNNING",
        M,
        PodForm.APP_GAUGE,
        (Source((NIM_NUM_REQUESTS_RUNNING,)), Source((VLLM_NUM_REQUESTS_RUNNING,))),
        unit="requests",
    ),
    PodMetricDef(
        "NIM_NUM_REQUESTS_WAITING",
        M,
        PodForm.APP_GAUGE,
        (Source((NIM_NUM_REQUESTS_WAITING,)), Source((VLLM_NUM_REQUESTS_WAITING,))),
        unit="requests",
    ),
    PodMetricDef(
        "NIM_NUM_REQUEST_MAX",
        M,
        PodForm.APP_GAUGE,
        (Source((NIM_NUM_REQUEST_MAX,)),),
        Agg.MAX,
        unit="requests",
    ),
    PodMetricDef(
        "NIM_REQUEST_SUCCESS_TOTAL",
        M,
        PodForm.APP_INCREASE,
        (Source((NIM_REQUEST_SUCCESS,)), Source((VLLM_REQUEST_SUCCESS,))),
        success_filter=True,
        unit="requests",
    ),
    PodMetricDef(
        "NIM_REQUEST_FAILURE_TOTAL",
        M,
        PodForm.APP_INCREASE,
        (Source((NIM_REQUEST_FAILURE,)), Source((VLLM_REQUEST_SUCCESS,))),
        success_filter=False,
        unit="requests",
    ),
    PodMetricDef(
        "NIM_GPU_CACHE_USAGE_PERC",
        M,
        PodForm.APP_GAUGE,
        (Source((NIM_GPU_CACHE_USAGE,)), Source((VLLM_KV_CACHE_USAGE,)), Source((VLLM_GPU_CACHE_USAGE_OLD,))),
        Agg.AVG,
        unit="ratio",
    ),
    _hist("NIM_TIME_TO_FIRST_TOKEN_SECONDS", NIM_TTFT, VLLM_TTFT),
    _hist("NIM_E2E_REQUEST_LATENCY_SECONDS", NIM_E2E_LATENCY, VLLM_E2E_LATENCY),
    _pct("NIM_TIME_TO_FIRST_TOKEN_SECONDS_PERCENTILES", NIM_TTFT, VLLM_TTFT),
    _pct("NIM_E2E_REQUEST_LATENCY_SECONDS_PERCENTILES", NIM_E2E_LATENCY, VLLM_E2E_LATENCY),
    PodMetricDef(
        "VLLM_NUM_REQUESTS_RUNNING",
        M,
        PodForm.APP_GAUGE,
        (Source((VLLM_NUM_REQUESTS_RUNNING,)),),
        unit="requests",
    ),
    PodMetricDef(
        "VLLM_NUM_REQUESTS_WAITING",
        M,
        PodForm.APP_GAUGE,
        (Source((VLLM_NUM_REQUESTS_WAITING,)),),
        unit="requests",
    ),
    PodMetricDef(
        "VLLM_REQUEST_SUCCESS",
        M,
        PodForm.APP_INCREASE,
        (Source((VLLM_REQUEST_SUCCESS,)),),
        success_filter=True,
        unit="requests",
    ),
    PodMetricDef(
        "VLLM_REQUEST_SUCCESS_RATE",
        M,
        PodForm.APP_RATE,
        (Source((VLLM_REQUEST_SUCCESS,)),),
        success_filter=True,
        unit="requests_per_second",
    ),
    PodMetricDef(
        "VLLM_KV_CACHE_USAGE_PERC",
        M,
        PodForm.APP_GAUGE,
        (Source((VLLM_KV_CACHE_USAGE,)), Source((VLLM_GPU_CACHE_USAGE_OLD,))),
        Agg.AVG,
        unit="ratio",
    ),
    PodMetricDef(
        "VLLM_PROMPT_TOKENS_PER_SECOND",
        M,
        PodForm.APP_RATE,
        (Source((VLLM_PROMPT_TOKENS,)),),
        unit="tokens_per_second",
    ),
    PodMetricDef(
        "VLLM_GENERATION_TOKENS_PER_SECOND",
        M,
        PodForm.APP_RATE,
        (Source((VLLM_GENERATION_TOKENS,)),),
        unit="tokens_per_second",
    ),
    _hist("VLLM_TIME_TO_FIRST_TOKEN_SECONDS", VLLM_TTFT),
    _hist("VLLM_E2E_REQUEST_LATENCY_SECONDS", VLLM_E2E_LATENCY),
    _pct("VLLM_TIME_TO_FIRST_TOKEN_SECONDS_PERCENTILES", VLLM_TTFT),
    _pct("VLLM_E2E_REQUEST_LATENCY_SECONDS_PERCENTILES", VLLM_E2E_LATENCY),
    _pct("VLLM_REQUEST_QUEUE_TIME_SECONDS_PERCENTILES", VLLM_QUEUE_TIME),
    _pct("VLLM_REQUEST_PREFILL_TIME_SECONDS_PERCENTILES", VLLM_PREFILL_TIME),
    _pct("VLLM_REQUEST_DECODE_TIME_SECONDS_PERCENTILES", VLLM_DECODE_TIME),
    _pct(
        "VLLM_INTER_TOKEN_LATENCY_SECONDS_PERCENTILES",
        VLLM_INTER_TOKEN_LATENCY,
        VLLM_TIME_PER_OUTPUT_TOKEN_OLD,
    ),
    PodMetricDef(
        "NVLINK_BANDWIDTH_TOTAL",
        M,
        PD,
        (Source((DCGM_NVLINK_BANDWIDTH_TOTAL,), NVLINK_MBPS_TO_BYTES),),
        Agg.SUM,
        unit="bytes_per_second",
    ),
    PodMetricDef(
        "NVLINK_BANDWIDTH_TOTAL_PER_GPU",
        M,
        PG,
        (Source((DCGM_NVLINK_BANDWIDTH_TOTAL,), NVLINK_MBPS_TO_BYTES),),
        unit="bytes_per_second",
    ),
)
POD_METRICS_BY_TYPE: dict[str, PodMetricDef] = {m.type: m for m in POD_METRICS}
del M, PG, PD


# -- Run:ai workload metricTypes (docs/compatibility.md, "Workload metrics"): over all pods ---------
KSM_CONTAINER_REQUESTS = "kube_pod_container_resource_requests"
KSM_CONTAINER_LIMITS = "kube_pod_container_resource_limits"
KSM_LABEL_RESOURCE = "resource"


def _ksm_resource(type_: str, series: str, resource: str, unit: str) -> PodMetricDef:
    return PodMetricDef(
        type_,
        Kind.MEASUREMENT,
        PodForm.APP_GAUGE,
        (Source((series,)),),
        Agg.SUM,
        unit=unit,
        extra=((KSM_LABEL_RESOURCE, resource),),
    )


WORKLOAD_METRICS: tuple[PodMetricDef, ...] = (
    POD_METRICS_BY_TYPE["GPU_UTILIZATION"],
    POD_METRICS_BY_TYPE["GPU_MEMORY_USAGE_BYTES"],
    PodMetricDef("GPU_MEMORY_REQUEST_BYTES", Kind.MEASUREMENT, PodForm.NO_SOURCE, unit="bytes"),
    POD_METRICS_BY_TYPE["CPU_USAGE_CORES"],
    _ksm_resource("CPU_REQUEST_CORES", KSM_CONTAINER_REQUESTS, "cpu", "cores"),
    _ksm_resource("CPU_LIMIT_CORES", KSM_CONTAINER_LIMITS, "cpu", "cores"),
    POD_METRICS_BY_TYPE["CPU_MEMORY_USAGE_BYTES"],
    _ksm_resource("CPU_MEMORY_REQUEST_BYTES", KSM_CONTAINER_REQUESTS, "memory", "bytes"),
    _ksm_resource("CPU_MEMORY_LIMIT_BYTES", KSM_CONTAINER_LIMITS, "memory", "bytes"),
    PodMetricDef("POD_COUNT", Kind.MEASUREMENT, PodForm.APP_COUNT, (Source((KSM_POD_INFO,)),), unit="pods"),
    PodMetricDef(
        "RUNNING_POD_COUNT",
        Kind.MEASUREMENT,
        PodForm.APP_GAUGE,
        (Source((KSM_POD_STATUS_PHASE,)),),
        Agg.SUM,
        unit="pods",
        extra=((KSM_LABEL_PHASE, "Running"),),
    ),
    _ksm_resource("GPU_ALLOCATION", KSM_CONTAINER_REQUESTS, "nvidia_com_gpu", "gpus"),
    *(m for m in POD_METRICS if m.type.startswith("NIM_")),
    POD_METRICS_BY_TYPE["NVLINK_BANDWIDTH_TOTAL"],
)
WORKLOAD_METRICS_BY_TYPE: dict[str, PodMetricDef] = {m.type: m for m in WORKLOAD_METRICS}


# -- local agent (gpulens.agent): further series it exposes, dcgm-exporter/node-exporter compatible ------
# Names and units as dcgm-exporter's CSVs; none of these feeds a Lyceum or Run:ai metric.
DCGM_FB_TOTAL = "DCGM_FI_DEV_FB_TOTAL"  # MiB gauge (field 250)
DCGM_FB_RESERVED = "DCGM_FI_DEV_FB_RESERVED"  # MiB gauge (253): used + free + reserved = total
DCGM_TOTAL_ENERGY_CONSUMPTION = "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"  # mJ counter since driver load (156)
DCGM_CLOCK_THROTTLE_REASONS = "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"  # bitmask gauge (NVML clock-event reasons)
DCGM_XID_ERRORS = "DCGM_FI_DEV_XID_ERRORS"  # gauge: the last XID seen (0: none since start)
DCGM_ECC_SBE_VOL_TOTAL = "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL"  # counter: corrected (single-bit), volatile
DCGM_ECC_DBE_VOL_TOTAL = "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"  # counter: uncorrected (double-bit), volatile
# Per-process GPU memory has no dcgm-exporter series: ours, in base units, labelled like DCGM + `pid`.
GPULENS_PROCESS_GPU_MEMORY = "gpulens_gpu_process_memory_used_bytes"
PID_OTHER = "other"  # the `pid` of the series summing the processes past GPULENS_MAX_PROCESS_SERIES
MAX_PROCESS_SERIES = 1024  # GPULENS_MAX_PROCESS_SERIES' default: per-process series one agent run creates
GPULENS_PROCESS_SERIES_DROPPED = "gpulens_gpu_process_series_dropped_total"  # counter: those processes
# dcgm-exporter labels the agent writes besides LABEL_GPU / LABEL_UUID / DCGM_HOST_LABELS[0]
LABEL_DEVICE = "device"  # nvidia<index>
LABEL_MODEL_NAME = "modelName"
LABEL_PCI_BUS_ID = "pci_bus_id"
LABEL_PID = "pid"
# node-exporter: node_cpu_seconds_total{cpu, mode}
LABEL_CPU = "cpu"
MILLI = 0.001  # NVML mW -> W


# -- insights (shaping/insights.py): when a stretch of an execution becomes a finding -----------------
# Percentages are 0-100 on the Lyceum series (utilization and FB % are the mean over the execution's
# GPUs, temperature the hottest GPU, power and its limit the sum); durations in ms.
@dataclass(frozen=True, slots=True)
class InsightThresholds:
    """Each condition has an enter and an exit threshold (hysteresis): a series hovering around the
    enter threshold stays in one episode until it crosses the exit threshold."""

    idle_util_percent: float = 5.0  # utilization below this: the GPUs compute nothing (enter)
    idle_exit_util_percent: float = 10.0  # ... until utilization reaches this (exit)
    memory_held_percent: float = 5.0  # a stretch whose mean FB is at or above this holds its memory
    input_bound_util_percent: float = 40.0  # utilization below this with memory held: underused (enter)
    input_bound_exit_util_percent: float = 50.0  # ... until utilization reaches this (exit)
    cpu_busy_percent: float = 80.0  # host CPU at or above this: busy (feeding the GPUs)
    pcie_rx_busy_bytes_per_gpu: float = 8e9  # PCIe receive at or above this per GPU: busy
    input_bound_busy_fraction: float = 0.5  # an underused stretch is input-bound when this share is busy
    input_bound_exit_busy_fraction: float = 0.25  # ... and stays so while the local busy share is above this
    working_util_percent: float = (
        40.0  # another GPU "works" (for a single GPU's idle finding) at or above this
    )
    working_exit_util_percent: float = 30.0  # ... and stops working below this
    low_util_percent: float = 40.0  # run mean utilization (outside explained stretches) below this
    power_limit_fraction: float = 0.95  # power at or above this share of the limit: at the limit ...
    power_limit_exit_fraction: float = 0.9  # ... or near it (what a stretch's share counts)
    clock_down_fraction: float = 0.9  # SM clock below this share of the run's peak (p99): clock down (enter)
    clock_down_exit_fraction: float = 0.95  # ... until the SM clock is back at this share of the peak (exit)
    clock_peak_quantile: float = 0.99  # the run's peak SM clock: this quantile of its working points
    throttle_dominance: float = 0.5  # a clock-down stretch is power (thermal) throttled when this share
    # of its points is near the power limit (hot under it), whichever is larger; else it is no finding
    hot_celsius: float = 85.0  # hottest GPU at or above this: hot ...
    hot_exit_celsius: float = 80.0  # ... or near it (what a stretch's share counts)
    memory_full_percent: float = 95.0  # FB at or above this: near full (enter)
    memory_full_exit_percent: float = 90.0  # ... until FB falls below this (exit)
    oom_drop_percent: float = 30.0  # FB falling by this many points in one sample: released
    oom_climb_step_percent: float = 0.2  # walking back from near full, FB this much lower: still climbing
    oom_climb_noise_percent: float = 1.0  # FB within this of the climb's lowest sample: its level before
    oom_end_ms: int = 60_000  # a failed run ending this soon after FB was near full: OOM
    smoothing_ms: int = 30_000  # a condition missing this long (or less) does not split a stretch
    min_duration_ms: int = 120_000  # shorter stretches are no finding ...
    min_samples: int = 3  # ... nor are stretches with fewer samples of the series tested
    long_idle_ms: int = 3_600_000  # idle (held) this long: critical
    imbalance_util_points: float = 30.0  # a working GPU this far from the working GPUs' median (enter)
    imbalance_exit_util_points: float = 20.0  # ... until it is back within this (exit)


INSIGHT_THRESHOLDS = InsightThresholds()
SEVERITIES = ("critical", "warning", "info")  # worst first: findings are ordered so
SEVERITY_RANK = {s: rank for rank, s in enumerate(SEVERITIES)}  # 0: the worst
# the severity of each kind of finding (idle and idle_held become critical after long_idle_ms)
INSIGHT_SEVERITY: dict[str, str] = {
    "idle": "warning",
    "idle_held": "warning",
    "input_bound": "warning",
    "low_utilization": "warning",
    "power_throttle": "warning",
    "thermal_throttle": "warning",
    "memory_pressure": "info",
    "gpu_imbalance": "warning",
    "oom_suspected": "critical",
    "no_data": "info",
}
