"""The Run:ai section: a pod's 46 metricTypes against hand-written PromQL for that pod.

The baseline is bench/handwritten.py's `pod_forms`: one query per metricType (three for percentiles),
the simplest a person would write for the vLLM pod on the bench data, sent at once from the thread
pool. A secondary figure replays gpulens' own plan (its planner calls on the pod layout its series
look-ups find) straight to Prometheus: that is the service's overhead, not the baseline. The server
caches the layout for 60 s; its timed requests make those look-ups again once the cache has expired,
as they would in use.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import anyio
import orjson

from bench.cases import ApiVsBaseline, CpuFigures, iso
from bench.clients import ApiClient, Baseline
from bench.damaged import CLEAN
from bench.handwritten import HandForm, Tolerance, pod_queries, pod_types, verify_pod
from bench.measure import Figure, Side, cpu_batch_size, interleaved, measure_cpu, percentile, ratio
from gpulens.backends.prometheus import PrometheusBackend, make_client
from gpulens.config import Settings
from gpulens.domain.catalog import POD_METRICS, PodForm, PodMetricDef
from gpulens.domain.models import RangeQuery, Window
from gpulens.planning.pods import (
    PodPlanOptions,
    PodQuery,
    PodTarget,
    derive_pod_layout,
    histogram_sources,
    interval_ms,
    layout_matches,
    plan_pod_metric,
    sample_grid,
)
from gpulens.planning.promql import rename
from gpulens.service.discovery import DiscoveryReport, discover_kubernetes
from gpulens.service.pod_metrics import LOOKBACK_MS
from gpulens.storage.registry import Registry
from gpulens_testkit.k8s_scenario import AppKind, K8sScenario, PodSpec

DAY = 86_400
LLM_POD = "llm-serve-0"
HISTOGRAM_FORMS = (PodForm.APP_HISTOGRAM, PodForm.APP_PERCENTILES)


@dataclass(frozen=True)
class RunaiCase:
    name: str
    span_s: int
    samples: int
    repeats: int
    target_ratio: float | None = 1.3  # issue 8: against the hand-written queries
    types: tuple[str, ...] = ()  # the metricTypes asked (empty: every one)

    def metrics(self) -> list[PodMetricDef]:
        return [m for m in POD_METRICS if not self.types or m.type in self.types]


# what a pod's overview charts: GPU and CPU utilisation and memory, the GPUs' also one by one
OVERVIEW_TYPES = (
    "GPU_UTILIZATION",
    "GPU_UTILIZATION_PER_GPU",
    "GPU_MEMORY_USAGE_BYTES",
    "GPU_MEMORY_USAGE_BYTES_PER_GPU",
    "CPU_USAGE_CORES",
    "CPU_MEMORY_USAGE_BYTES",
)
RUNAI_CASE = RunaiCase("Run:ai 24 h, 46 types, 1000 samples", DAY, 1000, 9)
# a read of ~18 ms: as many rounds as the short Lyceum cases (bench/cases.py)
RUNAI_OVERVIEW_CASE = RunaiCase("Run:ai 24 h, 6 types, 1000 samples", DAY, 1000, 41, types=OVERVIEW_TYPES)
RUNAI_CASES = (RUNAI_CASE, RUNAI_OVERVIEW_CASE)


@dataclass(frozen=True)
class ThroughputCase:
    name: str
    clients: int = 32
    warmup_s: float = 3.0
    duration_s: float = 20.0
    window_s: int = 900
    samples: int = 20  # Run:ai numberOfSamples
    step_s: int = 15  # Lyceum step


RUNAI_THROUGHPUT = ThroughputCase("Run:ai throughput")
LYCEUM_THROUGHPUT = ThroughputCase("Lyceum throughput")


# -- registry ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RegisteredPod:
    spec: PodSpec
    workload_id: str

    def metrics_path(self, types: Sequence[str], start_ms: int, end_ms: int, samples: int) -> str:
        return (
            f"/api/v1/workloads/{self.workload_id}/pods/{self.spec.pod_id}/metrics"
            f"?metricType={','.join(types)}&start={iso(start_ms)}&end={iso(end_ms)}&numberOfSamples={samples}"
        )


def register(
    prom_url: str, database_url: str, org: str, scenario: K8sScenario
) -> tuple[str, dict[str, RegisteredPod], DiscoveryReport]:
    """Discover the scenario's pods from kube-state-metrics into a fresh registry; an org API key."""
    registry = Registry.from_url(database_url)
    try:
        registry.migrate()
        _, key = registry.create_key(org, name="bench")

        async def discover() -> DiscoveryReport:
            backend = PrometheusBackend(prom_url, make_client(60.0, False, 4))
            try:
                return await discover_kubernetes(
                    backend, registry, org, start_ms=scenario.start_s * 1000, end_ms=scenario.end_s * 1000
                )
            finally:
                await backend.aclose()

        report = anyio.run(discover)
        pods: dict[str, RegisteredPod] = {}
        for spec in scenario.pods:
            pod = registry.get_pod(spec.pod_id)
            if pod is None:
                raise RuntimeError(
                    f"discovery did not register {spec.namespace}/{spec.name}: {report.summary()}"
                )
            pods[spec.name] = RegisteredPod(spec, pod.workload_id)
    finally:
        registry.dispose()
    return key, pods, report


# -- gpulens' own plan (the service-overhead figure) -----------------------------------------------


@dataclass(frozen=True)
class PodPlan:
    grid: Window
    metrics: tuple[PodMetricDef, ...]
    names: dict[str, str | None]  # histogram metricType -> the bucket series the layout has
    queries: list[tuple[PodMetricDef, PodQuery]]  # in metricType order, as the server plans them

    @property
    def range_queries(self) -> list[RangeQuery]:
        """The queries the server sends: each once (a metricType and its _PER_GPU twin share one)."""
        return list({q.expr: RangeQuery(q.expr, q.window) for _, q in self.queries}.values())


def plan_pod(
    settings: Settings,
    backend_url: str,
    target: PodTarget,
    metrics: Sequence[PodMetricDef],
    start_ms: int,
    end_ms: int,
    samples: int,
) -> PodPlan:
    """PodMetricsService._answer/_layout/_one step by step: the pod's layout from the same series
    look-ups (made once, here), then each metricType's plan on it."""
    options = PodPlanOptions(
        metric_names=dict(settings.metric_names), scrape_interval_ms=settings.scrape_interval_ms
    )
    names = options.metric_names
    grid = sample_grid(start_ms, end_ms, samples)
    interval = interval_ms(grid, start_ms, options.scrape_interval_ms)
    lookups = layout_matches(target, metrics, options)

    async def look() -> list[list[dict[str, str]]]:
        backend = PrometheusBackend(backend_url, make_client(60.0, False, 4))
        try:
            return [await backend.series(m, grid.start_ms - LOOKBACK_MS, grid.end_ms) for _, m in lookups]
        finally:
            await backend.aclose()

    found = anyio.run(look)
    layout = derive_pod_layout(metrics, [(sp, f) for (sp, _), f in zip(lookups, found, strict=True)], options)
    hist: dict[str, str | None] = {}
    for m in metrics:
        if m.form in HISTOGRAM_FORMS:
            candidates = [rename(n, names) for n in histogram_sources(m)]
            hist[m.type] = next((n for n in candidates if n in layout.present), None)
    queries = [
        (m, q)
        for m in metrics
        for q in plan_pod_metric(m, target, grid, interval, options, hist.get(m.type), layout)
    ]
    return PodPlan(grid, tuple(metrics), hist, queries)


# -- case A: one request for every metricType -------------------------------------------------------


@dataclass
class RunaiCaseResult(ApiVsBaseline):
    case: RunaiCase
    pod: str
    grid: Window
    forms: list[HandForm]  # the hand-written baseline
    plan: PodPlan | None = None  # gpulens' own plan, replayed for the service-overhead figure
    api_s: list[float] = field(default_factory=list)
    base_s: list[float] = field(default_factory=list)
    replay_s: list[float] = field(default_factory=list)
    api_first_s: float = math.nan  # the warm-up request: the pod's layout not cached yet
    api_bytes: int = 0
    base_bytes: int = 0
    measurements: int = 0
    histograms: int = 0
    types_with_values: int = 0  # metricTypes whose values were compared (the rest empty on both sides)
    cpu: CpuFigures = field(default_factory=CpuFigures)
    checks: list[str] = field(default_factory=list)
    data: str = CLEAN  # "clean" or "damaged" (bench/damaged.py)

    @property
    def name(self) -> str:
        return self.case.name + ("" if self.data == CLEAN else f", {self.data} data")

    @property
    def queries(self) -> int:
        return sum(f.role != "none" for f in self.forms)

    @property
    def overhead_ratio(self) -> float:
        return ratio(self.api_p50, percentile(self.replay_s, 0.5))

    def figures(self) -> list[Figure]:
        return [
            Figure(f"{self.name}: wall p50 vs hand-written", self.ratio, self.case.target_ratio),
            Figure(f"{self.name}: Prometheus CPU/request vs hand-written", self.cpu.ratio, None),
        ]

    def as_json(self) -> dict[str, object]:
        g = self.grid
        return {
            "case": self.case.name,
            "data": self.data,
            "pod": self.pod,
            "metric_types": len(pod_types(self.forms)),
            "number_of_samples": self.case.samples,
            "start_ms": g.start_ms,
            "end_ms": g.end_ms,
            "step_ms": g.step_ms,
            "points": g.points,
            "handwritten_queries": self.queries,
            "repeats": len(self.api_s),
            "api_seconds": self.api_s,
            "handwritten_seconds": self.base_s,
            "api_first_request_s": self.api_first_s,
            "api_p50_s": self.api_p50,
            "api_p95_s": percentile(self.api_s, 0.95),
            "handwritten_p50_s": self.base_p50,
            "handwritten_p95_s": percentile(self.base_s, 0.95),
            "ratio_p50": self.ratio,
            "target_ratio": self.case.target_ratio,
            "cpu": self.cpu.as_json(),
            "service_overhead": None
            if self.plan is None
            else {
                "what": "gpulens' own plan sent straight to Prometheus (not the baseline)",
                "range_queries": len(self.plan.range_queries),
                "histogram_names": self.plan.names,
                "replay_seconds": self.replay_s,
                "replay_p50_s": percentile(self.replay_s, 0.5),
                "api_over_replay_p50": self.overhead_ratio,
            },
            "api_bytes": self.api_bytes,
            "handwritten_bytes": self.base_bytes,
            "measurements": self.measurements,
            "histograms": self.histograms,
            "metric_types_with_values_compared": self.types_with_values,
            "verified": not self.checks,
            "problems": self.checks,
            "handwritten_expressions": {
                f.key + ("" if f.role in ("value", "per_gpu", "count", "buckets") else f" {f.role}"): f.expr
                for f in self.forms
            },
        }


def run_runai_case(
    result: RunaiCaseResult,
    api: ApiClient,
    baseline: Baseline,
    backend_url: str,
    backend_pid: int,
    path: str,
    progress: Callable[[str], None],
    repeats: int,
    server_cpu: Callable[[], float] | None = None,
    tolerance: Tolerance | None = None,
) -> RunaiCaseResult:
    name = result.name
    queries = pod_queries(result.forms, result.grid)
    progress(f"{name}: warm-up and check against the hand-written queries")
    t0 = time.perf_counter()
    api_body = api.get(path)
    result.api_first_s = time.perf_counter() - t0
    base = baseline.run(queries, keep=True)
    assert base.bodies is not None
    result.api_bytes, result.base_bytes = len(api_body), base.nbytes
    doc = orjson.loads(api_body)
    result.measurements = len(doc.get("measurements") or [])
    result.histograms = len(doc.get("histogram") or [])
    problems, result.types_with_values = verify_pod(
        api_body, result.forms, base.bodies, result.grid, tolerance
    )
    result.checks.extend(problems)
    del api_body, base, doc
    api_side = Side("gpulens", lambda: api.timed(path)[0])
    hand_side = Side("hand-written", lambda: baseline.run(queries).seconds)
    sides = [api_side, hand_side]
    if result.plan is not None:
        replay = result.plan.range_queries
        baseline.run(replay)  # its warm-up
        sides.append(Side("own plan replayed", lambda: baseline.run(replay).seconds))
    interleaved(sides, repeats, progress, name)
    result.api_s, result.base_s = api_side.seconds, hand_side.seconds
    result.replay_s = sides[2].seconds if len(sides) > 2 else []
    n = cpu_batch_size(max(result.api_p50, result.base_p50))
    extra = {"server": server_cpu} if server_cpu is not None else None
    clocks = measure_cpu([api_side, hand_side], backend_url, backend_pid, n, progress, name, extra=extra)
    server = clocks[api_side.name].get("server", math.nan)
    result.cpu = CpuFigures.of(n, api_side, hand_side, server, use_proc=False)
    return result


# -- case B: throughput paths -----------------------------------------------------------------------

COMMON_TYPES = ("GPU_UTILIZATION_PER_GPU", "GPU_MEMORY_USAGE_BYTES", "CPU_USAGE_CORES")
APP_TYPES = {
    AppKind.VLLM: ("VLLM_NUM_REQUESTS_RUNNING", "VLLM_KV_CACHE_USAGE_PERC"),
    AppKind.NIM: ("NIM_NUM_REQUESTS_RUNNING",),
    AppKind.NONE: ("CPU_MEMORY_USAGE_BYTES",),
}


def throughput_paths(
    case: ThroughputCase,
    scenario: K8sScenario,
    pods: dict[str, RegisteredPod],
    count: int = 512,
    seed: int = 7,
) -> list[str]:
    """Short windows of every pod, at random positions of the last day inside the pod's lifetime; a
    dashboard's mix of 4-5 metricTypes (GPU utilisation per GPU, GPU memory, CPU, and the app's)."""
    rng = random.Random(seed)
    day_start = scenario.end_s - DAY
    order = sorted(pods.values(), key=lambda p: p.spec.name)
    out = []
    for i in range(count):
        pod = order[i % len(order)]
        lo = max(day_start, pod.spec.start_s) + case.window_s
        hi = scenario.pod_end_s(pod.spec)
        end_s = rng.randint(lo, hi)
        types = (*COMMON_TYPES, *APP_TYPES[pod.spec.app])
        out.append(pod.metrics_path(types, (end_s - case.window_s) * 1000, end_s * 1000, case.samples))
    return out


def lyceum_throughput_paths(
    case: ThroughputCase, execution_id: str, end_s: int, days: int = 7, count: int = 512, seed: int = 7
) -> list[str]:
    """Short windows of the Lyceum execution at random positions of its last `days` days."""
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        stop = rng.randint(end_s - days * DAY + case.window_s, end_s)
        out.append(
            f"/api/v2/external/execution/{execution_id}/metrics"
            f"?start={iso((stop - case.window_s) * 1000)}&end={iso(stop * 1000)}&step={case.step_s}s"
        )
    return out
