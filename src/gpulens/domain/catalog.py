"""THE metric table: every exported series name, wire name, unit, form and cross-GPU aggregation.

Nothing else in gpulens spells a DCGM or node-exporter series name or a dialect's metric key.
The planner turns a `MetricDef` into PromQL (planning/promql.py); the dialects pick the defs
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
    """The shape of the query; planning/promql.py has one builder per form."""

    GPU_GAUGE = "gpu_gauge"  # agg(collapse(M)) * scale
    GPU_FB_PERCENT = "gpu_fb_percent"  # 100 * agg(used / (used + free)), per GPU first
    NODE_GAUGE = "node_gauge"  # max(M) * scale
    NODE_DIFF = "node_diff"  # max(A) - max(B)
    NODE_CPU_BUSY_PERCENT = "node_cpu_busy_percent"  # 100 * (1 - avg(rate(idle[w])))


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

KIB = 1024.0

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


# -- Run:ai pod metrics: exporter series (catalog §2.1-§2.5) ---------------------------------------
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
VLLM_INTER_TOKEN_LATENCY = "vllm:inter_token_latency_seconds"
VLLM_TIME_PER_OUTPUT_TOKEN_OLD = "vllm:time_per_output_token_seconds"
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
