"""The honest baseline: the PromQL a person would write by hand for one host or pod, and its checks.

Written here on purpose, not taken from gpulens.planning: the bench compares gpulens' answer with the
simplest queries that give the same numbers on the bench data. Only series and label names come from
the catalog. Each series is one query (per chunk), all sent at once from the bench's thread pool.

Lyceum, one host (H: the host label the data uses, GPUS: the execution's GPU indices, if it lists any):

    gpuUtilizationPercent           avg(DCGM_FI_DEV_GPU_UTIL{H})
    gpuMemoryUtilizationPercent     100 * sum(FB_USED{H}) / (sum(FB_USED{H}) + sum(FB_FREE{H}))
    gpuTemperatureCelsius           max(DCGM_FI_DEV_GPU_TEMP{H})
    gpuPowerWatt, ...LimitWatt      sum(...)
    clocks                          avg(...)
    PCIe rx/tx                      sum(DCGM_FI_PROF_PCIE_*_BYTES{H})  (1024 * sum(DEV KB/s) on such data)
    systemRamTotalBytes             node_memory_MemTotal_bytes{INST}
    systemRamUsedBytes              MemTotal{INST} - MemAvailable{INST}
    systemCpuUsagePercent           100 * (1 - avg(rate(node_cpu_seconds_total{mode="idle",INST}[W])))

They agree with gpulens' answers on the bench data (one host label, no duplicate series, every GPU with
the same frame buffer, CPU counters covering the window): FB % as a sum ratio equals the per-GPU mean
only when totals are equal, and the idle-rate mean equals idle/all only when every CPU's modes add up
to one second a second.

On the damaged data (gpulens_testkit/damage.py: dcgm-exporter restarts under new `pod`/`instance`
labels, missed scrapes, NaN bursts, series that begin with the data) these forms stay what a person
writes, and they are wrong in known places. The answer checks take a `Tolerance`: per key, the times
at which the naive form is known wrong, skipped; every other grid point is compared as on clean data.
The zones (bench/damaged.py builds them from the damage plan):

* after a dcgm-exporter restart, from the old pod's first missing sample to its last sample plus the
  5-minute lookback: with no staleness marker the old series stays visible next to the new one, so
  `sum` counts each GPU twice and `avg`/`max` mix the stale value in (every dcgm key; a per-GPU
  Run:ai form returns two series for each GPU there, merged outside the zone);
* a NaN burst of one dcgm series, from its first NaN to the series' next real sample (NaN is the
  latest sample until then; on a missed scrape or a restart the zone lasts longer): `avg`/`sum` give
  NaN, which the API leaves out (only the keys that read that series, only the execution's or pod's
  GPUs);
* CPU %, within the rate window after the counters' start and after each missed scrape of the host:
  `rate` extrapolates a window whose first sample is late to less than the counter grew, and
  `avg(rate(idle))` is then not the idle share (gpulens' idle-over-all-modes form, which it uses
  when the counters do not cover every window, is exact there).

Outside the zones the API and the hand-written answer must have the same points with equal values;
on damaged data a grid point neither has (VictoriaMetrics' staleness around a gap) is counted, not a
problem. On clean data (`strict`) both must answer every grid point outside the zones; its only zone
is the CPU rate window at the data's start, where the clean data's counters begin too.
"""

from __future__ import annotations

import bisect
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from gpulens.domain import catalog as c
from gpulens.domain.models import RangeQuery, Window
from gpulens.domain.timeparse import format_duration_ms, format_rfc3339_ms, parse_timestamp_ms

MAX_POINTS_PER_QUERY = 11_000  # Prometheus' limit of points per series and query
REL_TOL = ABS_TOL = 1e-9
_HOST = re.compile(r"[A-Za-z0-9._-]+")


@dataclass(frozen=True)
class HandForm:
    """One hand-written expression: `key` is the Lyceum wire key or the Run:ai metricType."""

    key: str
    expr: str
    role: str = "value"  # Run:ai: value, per_gpu, count, buckets, p50/p90/p99; "none": no query


def duration(ms: int) -> str:
    """A Prometheus duration, as a person would type it (`1m`, `1m26s400ms`)."""
    return format_duration_ms(ms)


def rate_window_ms(step_ms: int, scrape_interval_ms: int) -> int:
    """W = max(step, 4 x scrape interval): at least a few samples in every rate window."""
    return max(step_ms, 4 * scrape_interval_ms)


def hand_chunks(window: Window, max_points: int = MAX_POINTS_PER_QUERY) -> list[Window]:
    """Chunk i covers grid points k in [i*(m+1), i*(m+1)+m], m = max_points (as gpulens splits)."""
    per = max_points + 1
    total = (window.end_ms - window.start_ms) // window.step_ms + 1
    out = []
    for first in range(0, total, per):
        last = min(first + per, total) - 1
        s = window.step_ms
        out.append(Window(window.start_ms + first * s, window.start_ms + last * s, s))
    return out


# -- Lyceum -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class HostData:
    """What a person knows about the host's series: the dcgm host label it carries, which power-limit
    and PCIe series its exporter writes."""

    hostname: str
    host_label: str  # "Hostname" or "hostname", whichever the data has
    power_limit_series: str = c.DCGM_ENFORCED_POWER_LIMIT
    pcie_kbps: bool = False


def lyceum_forms(
    host: HostData, gpus: Sequence[str], step_ms: int, scrape_interval_ms: int
) -> list[HandForm]:
    """The 12 Lyceum series of `host` (only `gpus` when given), in the wire's key order."""
    if not _HOST.fullmatch(host.hostname):
        raise ValueError(f"hostname {host.hostname!r}: write its regex by hand")
    gpu = f',{c.LABEL_GPU}=~"{"|".join(gpus)}"' if gpus else ""
    d = f'{{{host.host_label}="{host.hostname}"{gpu}}}'
    escaped = host.hostname.replace(".", "\\\\.")
    inst = f'{c.LABEL_INSTANCE}=~"{escaped}(:[0-9]+)?"'
    w = duration(rate_window_ms(step_ms, scrape_interval_ms))
    used, free = f"{c.DCGM_FB_USED}{d}", f"{c.DCGM_FB_FREE}{d}"
    idle = f'{c.LABEL_CPU_MODE}="{c.CPU_IDLE_MODE}"'

    def pcie(profiling: str, kbps: str) -> str:
        return f"1024 * sum({kbps}{d})" if host.pcie_kbps else f"sum({profiling}{d})"

    forms = {
        "gpuUtilizationPercent": f"avg({c.DCGM_GPU_UTIL}{d})",
        "gpuMemoryUtilizationPercent": f"100 * sum({used}) / (sum({used}) + sum({free}))",
        "gpuTemperatureCelsius": f"max({c.DCGM_GPU_TEMP}{d})",
        "gpuPowerWatt": f"sum({c.DCGM_POWER_USAGE}{d})",
        "gpuPowerLimitWatt": f"sum({host.power_limit_series}{d})",
        "gpuClockSmMhz": f"avg({c.DCGM_SM_CLOCK}{d})",
        "gpuClockMemMhz": f"avg({c.DCGM_MEM_CLOCK}{d})",
        "gpuPcieThroughputRxBytesPerSec": pcie(c.DCGM_PCIE_RX_BYTES, c.DCGM_PCIE_RX_THROUGHPUT),
        "gpuPcieThroughputTxBytesPerSec": pcie(c.DCGM_PCIE_TX_BYTES, c.DCGM_PCIE_TX_THROUGHPUT),
        "systemRamTotalBytes": f"{c.NODE_MEM_TOTAL}{{{inst}}}",
        "systemRamUsedBytes": f"{c.NODE_MEM_TOTAL}{{{inst}}} - {c.NODE_MEM_AVAILABLE}{{{inst}}}",
        "systemCpuUsagePercent": f"100 * (1 - avg(rate({c.NODE_CPU_SECONDS}{{{idle},{inst}}}[{w}])))",
    }
    assert list(forms) == list(c.LYCEUM_KEYS), "the wire's keys changed: update the hand-written forms"
    return [HandForm(key, expr) for key, expr in forms.items()]


def lyceum_queries(forms: Sequence[HandForm], window: Window) -> list[RangeQuery]:
    """Series-major, chunks in order."""
    parts = hand_chunks(window)
    return [RangeQuery(f.expr, w) for f in forms for w in parts]


class Tolerance:
    """Where the hand-written answer is known wrong (damaged data): per key (the Lyceum wire key or
    the Run:ai metricType), closed intervals of ms timestamps whose points the checks skip."""

    def __init__(self, zones: Mapping[str, Sequence[tuple[int, int]]] | None = None) -> None:
        self._zones: dict[str, tuple[list[int], list[int]]] = {}
        for key, spans in (zones or {}).items():
            merged: list[list[int]] = []
            for lo, hi in sorted(spans):
                if merged and lo <= merged[-1][1] + 1:
                    merged[-1][1] = max(merged[-1][1], hi)
                else:
                    merged.append([lo, hi])
            self._zones[key] = ([m[0] for m in merged], [m[1] for m in merged])

    def covers(self, key: str, ms: int) -> bool:
        found = self._zones.get(key)
        if found is None:
            return False
        los, his = found
        i = bisect.bisect_right(los, ms) - 1
        return i >= 0 and ms <= his[i]

    def spans(self, key: str) -> list[tuple[int, int]]:
        los, his = self._zones.get(key, ([], []))
        return list(zip(los, his, strict=True))


@dataclass
class PointCheck:
    """What an answer check found: its problems, and how many points it compared, skipped in a
    tolerated zone, and found on neither side (damaged data only)."""

    problems: list[str] = field(default_factory=list)
    compared: int = 0
    tolerated: int = 0
    absent: int = 0

    def add(self, other: PointCheck) -> None:
        self.problems.extend(other.problems)
        self.compared += other.compared
        self.tolerated += other.tolerated
        self.absent += other.absent


def _finite_samples(result: list[dict[str, Any]]) -> list[tuple[int, float]]:
    out = []
    for series in result:
        for t, v in series["values"]:
            x = float(v)
            if math.isfinite(x):
                out.append((round(float(t) * 1000), x))
    return out


def verify_lyceum(
    api_body: bytes,
    hand_bodies: Sequence[bytes],
    forms: Sequence[HandForm],
    n_chunks: int,
    window: Window,
    tolerance: Tolerance | None = None,
    strict: bool = True,
) -> list[str]:
    """`check_lyceum`'s problems."""
    return check_lyceum(api_body, hand_bodies, forms, n_chunks, window, tolerance, strict).problems


def check_lyceum(
    api_body: bytes,
    hand_bodies: Sequence[bytes],
    forms: Sequence[HandForm],
    n_chunks: int,
    window: Window,
    tolerance: Tolerance | None = None,
    strict: bool = True,
) -> PointCheck:
    """Every grid point of every series: the API's on the requested grid, equal to the hand-written
    answer; with a `tolerance`, except where the hand-written form is known wrong (module docstring).
    `strict`: a grid point outside the zones that neither answer has is a problem too."""
    out = PointCheck()
    doc = orjson.loads(api_body)
    grid_ends = (format_rfc3339_ms(window.start_ms), format_rfc3339_ms(window.end_ms))
    for i, form in enumerate(forms):
        arr = doc.get(form.key)
        if not isinstance(arr, list):
            out.problems.append(f"{form.key}: missing from the API answer")
            continue
        if tolerance is None:
            if len(arr) != window.points:
                out.problems.append(f"{form.key}: API {len(arr)} points, the grid has {window.points}")
            if arr and (arr[0]["timestamp"], arr[-1]["timestamp"]) != grid_ends:
                out.problems.append(f"{form.key}: API runs {arr[0]['timestamp']} .. {arr[-1]['timestamp']}")
        hand: list[tuple[int, float]] = []
        for body in hand_bodies[i * n_chunks : (i + 1) * n_chunks]:
            result = orjson.loads(body)["data"]["result"]
            if len(result) > 1:
                out.problems.append(f"{form.key}: the hand-written query returned {len(result)} series")
            hand.extend(_finite_samples(result))
        api = [(parse_timestamp_ms(p["timestamp"]), float(p["value"])) for p in arr]
        out.add(_compare(form.key, api, hand, window, tolerance, strict))
    return out


def _compare(
    key: str,
    api: Sequence[tuple[int, float]],
    hand: Sequence[tuple[int, float]],
    window: Window,
    tolerance: Tolerance | None = None,
    strict: bool = True,
) -> PointCheck:
    out = PointCheck()
    have, want = dict(api), dict(hand)
    if len(have) < len(api):
        out.problems.append(f"{key}: the API answers {len(api) - len(have)} timestamps twice")
    grid = range(window.start_ms, window.end_ms + 1, window.step_ms)
    off = [ms for ms in have if ms not in grid]
    if off:
        out.problems.append(f"{key}: {len(off)} API points off the requested grid")
    only_api = only_hand = 0
    bad: list[float] = []
    for ms in grid:
        if tolerance is not None and tolerance.covers(key, ms):
            out.tolerated += 1
            continue
        a, b = have.get(ms), want.get(ms)
        if a is None and b is None:
            out.absent += 1
        elif b is None:
            only_api += 1
        elif a is None:
            only_hand += 1
        else:
            out.compared += 1
            if not math.isclose(a, b, rel_tol=REL_TOL, abs_tol=ABS_TOL):
                bad.append(abs(a - b))
    if only_api:
        out.problems.append(f"{key}: {only_api} points only in the API answer")
    if only_hand:
        out.problems.append(f"{key}: {only_hand} points only in the hand-written answer")
    if out.absent and strict:
        out.problems.append(f"{key}: {out.absent} grid points in neither answer")
    if bad:
        out.problems.append(
            f"{key}: {len(bad)} of {out.compared} values differ from the hand-written answer "
            f"(max |diff| {max(bad):.3g})"
        )
    return out


# -- Run:ai ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PodData:
    """A vLLM pod as a person sees it in the data: its namespace and name, and the label names
    dcgm-exporter's series carry them under (exported_* when scraped with honor_labels false)."""

    namespace: str
    pod: str
    dcgm_namespace_label: str = c.LABEL_EXPORTED_NAMESPACE
    dcgm_pod_label: str = c.LABEL_EXPORTED_POD


def pod_grid(start_ms: int, end_ms: int, samples: int) -> Window:
    """numberOfSamples n: points at start + k*(end-start)/n, k = 0..n."""
    if samples < 1 or end_ms <= start_ms:
        raise ValueError("the bench asks n >= 1 samples over a non-empty window")
    step = (end_ms - start_ms) // samples
    return Window(start_ms, start_ms + samples * step, step)


def pod_forms(pod: PodData, grid: Window, scrape_interval_ms: int) -> list[HandForm]:
    """One query per metricType of a vLLM pod (three for percentiles), as a person would write it.

    NIM_* types read the vLLM series the pod exports (a person knows what serves the pod); types whose
    series the pod does not have (GPU swap: no exporter writes it; NIM_NUM_REQUEST_MAX: vLLM has no such
    gauge) get no query.
    """
    dcgm = f'{{{pod.dcgm_namespace_label}="{pod.namespace}",{pod.dcgm_pod_label}="{pod.pod}"}}'
    app_m = f'{c.LABEL_NAMESPACE}="{pod.namespace}",{c.LABEL_POD}="{pod.pod}"'
    app = f"{{{app_m}}}"
    containers = f'{{{app_m},{c.LABEL_CONTAINER}!="",{c.LABEL_CONTAINER}!="{c.CADVISOR_SANDBOX_CONTAINER}"}}'
    reasons = "|".join(c.SUCCESS_REASONS)
    ok = f'{{{app_m},{c.LABEL_FINISHED_REASON}=~"{reasons}"}}'
    failed = f'{{{app_m},{c.LABEL_FINISHED_REASON}!~"{reasons}"}}'
    w = duration(rate_window_ms(grid.step_ms, scrape_interval_ms))
    interval = duration(grid.step_ms)

    out: list[HandForm] = []

    def add(type_: str, expr: str, role: str = "value") -> None:
        out.append(HandForm(type_, expr, role))

    def per_gpu(type_: str, series: str, scale: str = "") -> None:
        add(type_, f"{scale}{series}{dcgm}", "per_gpu")

    def buckets(type_: str, series: str) -> None:
        add(type_, f"sum by (le) (increase({series}{c.BUCKET_SUFFIX}{app}[{interval}]))", "buckets")

    def percentiles(type_: str, series: str) -> None:
        for name, q in c.PERCENTILES:
            add(
                type_,
                f"histogram_quantile({q}, sum by (le) (rate({series}{c.BUCKET_SUFFIX}{app}[{w}])))",
                name,
            )

    mib, pct, nvlink = f"{int(c.MIB)} * ", "100 * ", f"{int(c.NVLINK_MBPS_TO_BYTES)} * "
    per_gpu("GPU_UTILIZATION_PER_GPU", c.DCGM_GPU_UTIL)
    add("GPU_UTILIZATION", f"avg({c.DCGM_GPU_UTIL}{dcgm})")
    per_gpu("GPU_MEMORY_USAGE_BYTES_PER_GPU", c.DCGM_FB_USED, mib)
    add("GPU_MEMORY_USAGE_BYTES", f"{mib}sum({c.DCGM_FB_USED}{dcgm})")
    add("CPU_USAGE_CORES", f"sum(rate({c.CADVISOR_CPU_SECONDS}{containers}[{w}]))")
    add("CPU_MEMORY_USAGE_BYTES", f"sum({c.CADVISOR_MEMORY_WORKING_SET}{containers})")
    per_gpu("GPU_GRAPHICS_ENGINE_ACTIVITY_PER_GPU", c.DCGM_GR_ENGINE_ACTIVE, pct)
    per_gpu("GPU_SM_ACTIVITY_PER_GPU", c.DCGM_SM_ACTIVE, pct)
    per_gpu("GPU_SM_OCCUPANCY_PER_GPU", c.DCGM_SM_OCCUPANCY, pct)
    per_gpu("GPU_TENSOR_ACTIVITY_PER_GPU", c.DCGM_PIPE_TENSOR_ACTIVE, pct)
    per_gpu("GPU_FP64_ENGINE_ACTIVITY_PER_GPU", c.DCGM_PIPE_FP64_ACTIVE, pct)
    per_gpu("GPU_FP32_ENGINE_ACTIVITY_PER_GPU", c.DCGM_PIPE_FP32_ACTIVE, pct)
    per_gpu("GPU_FP16_ENGINE_ACTIVITY_PER_GPU", c.DCGM_PIPE_FP16_ACTIVE, pct)
    per_gpu("GPU_MEMORY_BANDWIDTH_UTILIZATION_PER_GPU", c.DCGM_DRAM_ACTIVE, pct)
    per_gpu("GPU_NVLINK_TRANSMITTED_BANDWIDTH_PER_GPU", c.DCGM_NVLINK_TX_BYTES)
    per_gpu("GPU_NVLINK_RECEIVED_BANDWIDTH_PER_GPU", c.DCGM_NVLINK_RX_BYTES)
    per_gpu("GPU_PCIE_TRANSMITTED_BANDWIDTH_PER_GPU", c.DCGM_PCIE_TX_BYTES)
    per_gpu("GPU_PCIE_RECEIVED_BANDWIDTH_PER_GPU", c.DCGM_PCIE_RX_BYTES)
    add("GPU_SWAP_MEMORY_BYTES_PER_GPU", "", "none")
    add("NIM_NUM_REQUESTS_RUNNING", f"sum({c.VLLM_NUM_REQUESTS_RUNNING}{app})")
    add("NIM_NUM_REQUESTS_WAITING", f"sum({c.VLLM_NUM_REQUESTS_WAITING}{app})")
    add("NIM_NUM_REQUEST_MAX", "", "none")
    add("NIM_REQUEST_SUCCESS_TOTAL", f"sum(increase({c.VLLM_REQUEST_SUCCESS}{ok}[{interval}]))", "count")
    add("NIM_REQUEST_FAILURE_TOTAL", f"sum(increase({c.VLLM_REQUEST_SUCCESS}{failed}[{interval}]))", "count")
    add("NIM_GPU_CACHE_USAGE_PERC", f"avg({c.VLLM_KV_CACHE_USAGE}{app})")
    buckets("NIM_TIME_TO_FIRST_TOKEN_SECONDS", c.VLLM_TTFT)
    buckets("NIM_E2E_REQUEST_LATENCY_SECONDS", c.VLLM_E2E_LATENCY)
    percentiles("NIM_TIME_TO_FIRST_TOKEN_SECONDS_PERCENTILES", c.VLLM_TTFT)
    percentiles("NIM_E2E_REQUEST_LATENCY_SECONDS_PERCENTILES", c.VLLM_E2E_LATENCY)
    add("VLLM_NUM_REQUESTS_RUNNING", f"sum({c.VLLM_NUM_REQUESTS_RUNNING}{app})")
    add("VLLM_NUM_REQUESTS_WAITING", f"sum({c.VLLM_NUM_REQUESTS_WAITING}{app})")
    add("VLLM_REQUEST_SUCCESS", f"sum(increase({c.VLLM_REQUEST_SUCCESS}{ok}[{interval}]))", "count")
    add("VLLM_REQUEST_SUCCESS_RATE", f"sum(rate({c.VLLM_REQUEST_SUCCESS}{ok}[{w}]))")
    add("VLLM_KV_CACHE_USAGE_PERC", f"avg({c.VLLM_KV_CACHE_USAGE}{app})")
    add("VLLM_PROMPT_TOKENS_PER_SECOND", f"sum(rate({c.VLLM_PROMPT_TOKENS}{app}[{w}]))")
    add("VLLM_GENERATION_TOKENS_PER_SECOND", f"sum(rate({c.VLLM_GENERATION_TOKENS}{app}[{w}]))")
    buckets("VLLM_TIME_TO_FIRST_TOKEN_SECONDS", c.VLLM_TTFT)
    buckets("VLLM_E2E_REQUEST_LATENCY_SECONDS", c.VLLM_E2E_LATENCY)
    percentiles("VLLM_TIME_TO_FIRST_TOKEN_SECONDS_PERCENTILES", c.VLLM_TTFT)
    percentiles("VLLM_E2E_REQUEST_LATENCY_SECONDS_PERCENTILES", c.VLLM_E2E_LATENCY)
    percentiles("VLLM_REQUEST_QUEUE_TIME_SECONDS_PERCENTILES", c.VLLM_QUEUE_TIME)
    percentiles("VLLM_REQUEST_PREFILL_TIME_SECONDS_PERCENTILES", c.VLLM_PREFILL_TIME)
    percentiles("VLLM_REQUEST_DECODE_TIME_SECONDS_PERCENTILES", c.VLLM_DECODE_TIME)
    percentiles("VLLM_INTER_TOKEN_LATENCY_SECONDS_PERCENTILES", c.VLLM_INTER_TOKEN_LATENCY)
    add("NVLINK_BANDWIDTH_TOTAL", f"{nvlink}sum({c.DCGM_NVLINK_BANDWIDTH_TOTAL}{dcgm})")
    per_gpu("NVLINK_BANDWIDTH_TOTAL_PER_GPU", c.DCGM_NVLINK_BANDWIDTH_TOTAL, nvlink)
    assert pod_types(out) == [m.type for m in c.POD_METRICS], "the catalog's metricTypes changed"
    return out


def pod_types(forms: Sequence[HandForm]) -> list[str]:
    """The metricTypes the forms cover, in order, once each."""
    return list(dict.fromkeys(f.key for f in forms))


def pod_queries(forms: Sequence[HandForm], grid: Window) -> list[RangeQuery]:
    return [RangeQuery(f.expr, grid) for f in forms if f.role != "none"]


def _in_grid(result: list[dict[str, Any]], grid: Window) -> list[tuple[dict[str, str], dict[int, float]]]:
    """Each series' labels and its finite samples inside the grid's bounds."""
    out = []
    for series in result:
        pts = {}
        for t, v in series["values"]:
            ms, x = round(float(t) * 1000), float(v)
            if grid.start_ms <= ms <= grid.end_ms and math.isfinite(x):
                pts[ms] = x
        out.append((series["metric"], pts))
    return out


def _gpu_of(labels: dict[str, str] | None, gpu: str, instance: str) -> str:
    if not labels:
        return ""
    g, gi = labels.get(gpu, ""), labels.get(instance, "")
    return f"{g}/{gi}" if gi else g


def _le_key(le: str) -> float:
    return math.inf if le in ("+Inf", "Inf", "inf") else float(le)


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=REL_TOL, abs_tol=ABS_TOL)


def verify_pod(
    body: bytes,
    forms: Sequence[HandForm],
    hand_bodies: Sequence[bytes],
    grid: Window,
    tolerance: Tolerance | None = None,
) -> tuple[list[str], int]:
    """gpulens' answer against the hand-written one, metricType by metricType: the same points, equal
    values (counts: the hand-written increase rounded; bucket counts: rounded and cumulative over `le`,
    as Run:ai's wire defines them; percentiles: where all three are finite); points in a `tolerance`
    zone of their metricType skipped (module docstring). Returns the problems and how many metricTypes
    had values to compare (the others must be empty on both sides)."""
    problems: list[str] = []
    with_values = 0
    doc = orjson.loads(body)
    measurements = doc.get("measurements") or []
    histograms = {str(h["type"]): h["values"] for h in doc.get("histogram") or []}
    got: dict[str, list[dict[str, Any]]] = {}
    for item in measurements:
        got.setdefault(str(item["type"]), []).append(item)
    answers: dict[str, list[tuple[HandForm, list[tuple[dict[str, str], dict[int, float]]]]]] = {}
    bodies = iter(hand_bodies)
    for form in forms:
        result = [] if form.role == "none" else orjson.loads(next(bodies))["data"]["result"]
        answers.setdefault(form.key, []).append((form, _in_grid(result, grid)))
    for type_, parts in answers.items():
        role = parts[0][0].role

        def known_wrong(ms: int, type_: str = type_) -> bool:
            return tolerance is not None and tolerance.covers(type_, ms)

        if role in ("buckets", "p50"):
            problems.extend(_check_histogram(type_, role, parts, histograms.get(type_)))
            with_values += any(pts for _, series in parts for _, pts in series)
            continue
        items = got.get(type_, [])
        if role == "none":
            if any(item.get("values") for item in items):
                problems.append(f"{type_}: gpulens answers values, the pod has no such series")
            continue
        series = parts[0][1]
        want: dict[str, dict[int, float]] = {}
        if role == "per_gpu":
            for labels, pts in series:
                key = _gpu_of(labels, c.LABEL_GPU, c.LABEL_GPU_INSTANCE)
                if key in want:  # an exporter restart: the GPU's old and new series, merged
                    both = [ms for ms in pts if ms in want[key] and not known_wrong(ms)]
                    if both:
                        problems.append(
                            f"{type_}: two hand-written series for GPU {key} at {len(both)} points"
                        )
                    want[key] = {**want[key], **pts}
                else:
                    want[key] = pts
        else:
            if len(series) > 1:
                problems.append(f"{type_}: the hand-written query returned {len(series)} series")
            want[""] = series[0][1] if series else {}
            if role == "count":
                want[""] = {ms: float(max(0, round(x))) for ms, x in want[""].items()}
        have = {
            _gpu_of(item.get("labels"), c.RUNAI_LABEL_GPU, c.RUNAI_LABEL_GPU_INSTANCE): {
                parse_timestamp_ms(v["timestamp"]): float(v["value"]) for v in item["values"]
            }
            for item in items
        }
        if tolerance is not None:
            have = {k: {ms: x for ms, x in v.items() if not known_wrong(ms)} for k, v in have.items()}
            want = {k: {ms: x for ms, x in v.items() if not known_wrong(ms)} for k, v in want.items()}
        have = {k: v for k, v in have.items() if v or k in want}  # a registered GPU without data
        want = {k: v for k, v in want.items() if v or k in have}
        if set(have) != set(want):
            problems.append(f"{type_}: gpulens measurements {sorted(have)}, hand-written {sorted(want)}")
            continue
        with_values += any(want.values())
        for key, pts in want.items():
            problems.extend(_point_diff(f"{type_}[{key}]" if key else type_, have[key], pts))
    return problems, with_values


def _point_diff(name: str, have: dict[int, float], want: dict[int, float]) -> list[str]:
    if set(have) != set(want):
        return [f"{name}: gpulens {len(have)} points, hand-written {len(want)} (times differ)"]
    bad = [ms for ms, x in want.items() if not _close(have[ms], x)]
    if not bad:
        return []
    worst = max(abs(have[ms] - want[ms]) for ms in bad)
    return [f"{name}: {len(bad)} of {len(want)} values differ from the hand-written (max |diff| {worst:.3g})"]


def _check_histogram(
    type_: str,
    role: str,
    parts: list[tuple[HandForm, list[tuple[dict[str, str], dict[int, float]]]]],
    values: list[dict[str, Any]] | None,
) -> list[str]:
    if values is None:
        return [f"{type_}: missing from gpulens' histogram"]
    have = {parse_timestamp_ms(v["timestamp"]): {k: float(x) for k, x in v["data"].items()} for v in values}
    want: dict[int, dict[str, float]] = {}
    if role == "buckets":
        series = parts[0][1]
        les = sorted(
            ((labels.get(c.LABEL_LE, ""), pts) for labels, pts in series), key=lambda x: _le_key(x[0])
        )
        for ms in sorted({ms for _, pts in les for ms in pts}):
            running, row = 0, {}
            for le, pts in les:
                if ms in pts:
                    running = max(running, round(pts[ms]))
                row["+Inf" if _le_key(le) == math.inf else le] = float(running)
            want[ms] = row
    else:
        per_q = {form.role: (series[0][1] if series else {}) for form, series in parts}
        times = set.intersection(*(set(pts) for pts in per_q.values()))
        want = {ms: {name: pts[ms] for name, pts in per_q.items()} for ms in sorted(times)}
    if set(have) != set(want):
        return [f"{type_}: gpulens {len(have)} points, hand-written {len(want)} (times differ)"]
    bad = sum(
        have[ms].keys() != row.keys() or not all(_close(have[ms][k], x) for k, x in row.items())
        for ms, row in want.items()
    )
    return [f"{type_}: {bad} of {len(want)} points differ from the hand-written answer"] if bad else []
