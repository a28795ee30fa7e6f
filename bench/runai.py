"""The Run:ai section: a pod's 46 metricTypes against the same PromQL sent straight to Prometheus.

The baseline is built with the server's own planner calls (`sample_grid`, `interval_ms`,
`plan_pod_metric`) and the histogram series name the server's discovery finds, by the same
`/api/v1/series` look-ups (one per histogram metricType). The server caches those names for 60 s,
so after the untimed warm-up its timed requests make none: the timed baseline holds the range
queries only, the look-ups are timed on their own, and a timed API request never runs on an
expired cache (`_NameCache`).
"""

from __future__ import annotations

import math
import random
import time
import urllib.parse
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio
import orjson

from bench.cases import ApiVsBaseline, iso, percentile
from bench.clients import ApiClient, Baseline, seconds_text
from gpulens.backends.prometheus import PrometheusBackend, make_client
from gpulens.config import Settings
from gpulens.domain import catalog as c
from gpulens.domain.catalog import Kind, PodForm, PodMetricDef
from gpulens.domain.models import RangeQuery, Window
from gpulens.domain.timeparse import parse_timestamp_ms
from gpulens.planning.pods import (
    PodPlanOptions,
    PodQuery,
    PodTarget,
    app_alternatives,
    histogram_sources,
    interval_ms,
    plan_pod_metric,
    sample_grid,
)
from gpulens.planning.promql import one_of, rename, series_match
from gpulens.service.discovery import DiscoveryReport, discover_kubernetes
from gpulens.service.pod_metrics import LOOKBACK_MS
from gpulens.storage.registry import Registry
from gpulens.synth.k8s_scenario import AppKind, K8sScenario, PodSpec

DAY = 86_400
LLM_POD = "llm-serve-0"
NAME_CACHE_S = 60.0  # PodMetricsService._histogram_name keeps a discovered name this long
HISTOGRAM_FORMS = (PodForm.APP_HISTOGRAM, PodForm.APP_PERCENTILES)


@dataclass(frozen=True)
class RunaiCase:
    name: str
    span_s: int
    samples: int
    repeats: int
    target_ratio: float | None = 1.5


RUNAI_CASE = RunaiCase("Run:ai 24 h, 46 types, 1000 samples", DAY, 1000, 9)


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


# -- the baseline's plan ----------------------------------------------------------------------------


@dataclass(frozen=True)
class PodPlan:
    grid: Window
    metrics: tuple[PodMetricDef, ...]
    lookups: list[tuple[str, bytes]]  # the histogram-name `/api/v1/series` POSTs, one per histogram type
    names: dict[str, str | None]  # metricType -> the bucket series found
    queries: list[tuple[PodMetricDef, PodQuery]]  # in metricType order, as the server plans them

    @property
    def range_queries(self) -> list[RangeQuery]:
        return [RangeQuery(q.expr, q.window) for _, q in self.queries]


def _lookup_form(match: str, grid: Window) -> bytes:
    """What PrometheusBackend.series_labels POSTs."""
    return urllib.parse.urlencode(
        {
            "match[]": match,
            "start": seconds_text(grid.start_ms - LOOKBACK_MS),
            "end": seconds_text(grid.end_ms),
        }
    ).encode()


def plan_pod(
    settings: Settings,
    baseline: Baseline,
    target: PodTarget,
    metrics: Sequence[PodMetricDef],
    start_ms: int,
    end_ms: int,
    samples: int,
) -> PodPlan:
    """PodMetricsService._answer/_one/_histogram_name, step by step, with the look-ups run once here."""
    options = PodPlanOptions(
        metric_names=dict(settings.metric_names), scrape_interval_ms=settings.scrape_interval_ms
    )
    grid = sample_grid(start_ms, end_ms, samples)
    interval = interval_ms(grid, start_ms, options.scrape_interval_ms)
    lookups: list[tuple[str, bytes]] = []
    owners: list[tuple[str, list[str], int, int]] = []  # type, candidates, first lookup, lookup count
    for m in metrics:
        if m.form not in HISTOGRAM_FORMS:
            continue
        candidates = [rename(n, options.metric_names) for n in histogram_sources(m)]
        alternatives = app_alternatives(target, one_of("__name__", candidates))
        owners.append((m.type, candidates, len(lookups), len(alternatives)))
        lookups.extend(("/api/v1/series", _lookup_form(series_match(a), grid)) for a in alternatives)
    bodies = baseline.run_posts(lookups, keep=True).bodies or []
    names: dict[str, str | None] = {}
    for type_, candidates, first, count in owners:
        found = {
            s["__name__"]
            for body in bodies[first : first + count]
            for s in orjson.loads(body)["data"]
            if "__name__" in s
        }
        names[type_] = next((n for n in candidates if n in found), None)
    queries = [
        (m, q)
        for m in metrics
        for q in plan_pod_metric(m, target, grid, interval, options, names.get(m.type))
    ]
    return PodPlan(grid, tuple(metrics), lookups, names, queries)


# -- verification -----------------------------------------------------------------------------------


def _samples(values: Sequence[Sequence[Any]], g0: int, g1: int) -> dict[int, str]:
    """A range-query series' finite samples inside the grid, by ms (what shaping's `points` keeps)."""
    out = {}
    for t, v in values:
        ms = round(float(t) * 1000)
        if g0 <= ms <= g1 and math.isfinite(float(v)):
            out[ms] = v
    return out


def _gpu_key(labels: dict[str, str] | None) -> str:
    if not labels:
        return ""
    gpu = labels.get(c.LABEL_GPU) or labels.get("gpu", "")
    gi = labels.get(c.LABEL_GPU_INSTANCE) or labels.get("gpuInstance", "")
    return f"{gpu}/{gi}" if gi else gpu


def verify_pod_body(body: bytes, plan: PodPlan, base_bodies: Sequence[bytes]) -> tuple[list[str], int, int]:
    """The API body parses and answers each metricType as Prometheus' own answer to its PromQL says
    it must: per-GPU types one measurement per GPU series, others one; values at the same grid
    times and equal (counts rounded); histogram types present, with values when buckets came back.
    Returns (problems, measurements, histograms)."""
    problems: list[str] = []
    doc = orjson.loads(body)
    measurements = doc.get("measurements")
    histogram = doc.get("histogram")
    if not isinstance(measurements, list) or not isinstance(histogram, list):
        return ["body lacks measurements or histogram"], 0, 0
    got: dict[str, list[dict[str, Any]]] = {}
    for item in measurements:
        got.setdefault(str(item["type"]), []).append(item)
    hists = {str(h["type"]): h for h in histogram}
    asked = {m.type for m in plan.metrics}
    extra = sorted((set(got) | set(hists)) - asked)
    if extra:
        problems.append(f"types not asked for: {', '.join(extra)}")
    answers: dict[str, list[tuple[PodQuery, list[dict[str, Any]]]]] = {}
    for (m, q), raw in zip(plan.queries, base_bodies, strict=True):
        answers.setdefault(m.type, []).append((q, orjson.loads(raw)["data"]["result"]))
    g0, g1 = plan.grid.start_ms, plan.grid.end_ms
    for m in plan.metrics:
        mine = answers.get(m.type, [])
        if m.kind is not Kind.MEASUREMENT:
            h = hists.get(m.type)
            if h is None:
                problems.append(f"{m.type}: missing from histogram")
                continue
            values = h["values"]
            assert isinstance(values, list)
            # buckets: a point wherever some `le` has a sample; percentiles: where all three do
            per_query = [{ms for x in series for ms in _samples(x["values"], g0, g1)} for _, series in mine]
            if m.kind is Kind.HISTOGRAM:
                times = set().union(*per_query)
            else:
                times = set.intersection(*per_query) if per_query else set()
            if len(values) != len(times):
                problems.append(f"{m.type}: {len(values)} points, Prometheus {len(times)}")
            continue
        items = got.get(m.type, [])
        expected: dict[str, dict[int, str]] = {}
        if m.form is PodForm.APP_INCREASE:  # the first source with series wins, counts rounded
            series = next((s for _, s in mine if s), [])
            expected[""] = {
                ms: str(max(0, round(float(v))))
                for ms, v in _samples(series[0]["values"] if series else [], g0, g1).items()
            }
        else:
            for s in mine[0][1] if mine else []:  # pod-level: merged as shaping's `single` does
                pts = expected.setdefault(_gpu_key(s["metric"]) if m.per_gpu else "", {})
                for ms, v in _samples(s["values"], g0, g1).items():
                    pts.setdefault(ms, v)
        if not any(expected.values()):  # no source, no series, or no values: nothing to answer
            if any(item.get("values") for item in items):
                problems.append(f"{m.type}: {len(items)} measurements with values, Prometheus has none")
            continue
        answered = {_gpu_key(item.get("labels")) if m.per_gpu else "": item for item in items}
        if len(answered) != len(items) or set(answered) != set(expected):
            problems.append(
                f"{m.type}: measurements {sorted(answered)}, Prometheus series {sorted(expected)}"
            )
            continue
        for key, item in answered.items():
            values = item["values"]
            assert isinstance(values, list)
            want = expected[key]
            if len(values) != len(want):
                problems.append(f"{m.type}[{key}]: {len(values)} points, Prometheus {len(want)}")
                continue
            bad = 0
            for v in values:
                ms = round(parse_timestamp_ms(v["timestamp"]))
                ref = want.get(ms)
                if ref is None or not math.isclose(float(v["value"]), float(ref), rel_tol=1e-9, abs_tol=1e-9):
                    bad += 1
            if bad:
                problems.append(f"{m.type}[{key}]: {bad} values differ from Prometheus")
    return problems, len(measurements), len(histogram)


# -- case A: one request for every metricType -------------------------------------------------------


@dataclass
class RunaiCaseResult(ApiVsBaseline):
    case: RunaiCase
    pod: str
    plan: PodPlan
    api_s: list[float] = field(default_factory=list)
    base_s: list[float] = field(default_factory=list)
    lookup_s: list[float] = field(default_factory=list)
    api_first_s: float = math.nan  # the warm-up request: histogram names not cached yet
    api_bytes: int = 0
    base_bytes: int = 0
    lookup_bytes: int = 0
    measurements: int = 0
    histograms: int = 0
    cache_refreshes: int = 0  # untimed requests that renewed the server's name cache
    checks: list[str] = field(default_factory=list)

    @property
    def ratio_with_lookups(self) -> float:
        """Were the look-ups made on every request (they are not: cached 60 s)."""
        return self.api_p50 / (self.base_p50 + percentile(self.lookup_s, 0.5))

    def as_json(self) -> dict[str, object]:
        g = self.plan.grid
        return {
            "case": self.case.name,
            "pod": self.pod,
            "metric_types": len(self.plan.metrics),
            "number_of_samples": self.case.samples,
            "start_ms": g.start_ms,
            "end_ms": g.end_ms,
            "step_ms": g.step_ms,
            "points": g.points,
            "range_queries": len(self.plan.queries),
            "series_lookups": len(self.plan.lookups),
            "histogram_names": self.plan.names,
            "repeats": len(self.api_s),
            "api_seconds": self.api_s,
            "baseline_seconds": self.base_s,
            "lookup_seconds": self.lookup_s,
            "api_first_request_s": self.api_first_s,
            "api_p50_s": self.api_p50,
            "api_p95_s": percentile(self.api_s, 0.95),
            "baseline_p50_s": self.base_p50,
            "baseline_p95_s": percentile(self.base_s, 0.95),
            "lookups_p50_s": percentile(self.lookup_s, 0.5),
            "ratio_p50": self.ratio,
            "ratio_p50_if_lookups_counted": self.ratio_with_lookups,
            "target_ratio": self.case.target_ratio,
            "api_bytes": self.api_bytes,
            "baseline_bytes": self.base_bytes,
            "lookup_bytes": self.lookup_bytes,
            "measurements": self.measurements,
            "histograms": self.histograms,
            "name_cache_refreshes": self.cache_refreshes,
            "verified": not self.checks,
            "problems": self.checks,
            "expressions": [q.expr for _, q in self.plan.queries],
        }


class _NameCache:
    """Keeps the server's histogram-name cache warm for timed requests (renewed outside timing)."""

    def __init__(self, api: ApiClient, path: str, result: RunaiCaseResult) -> None:
        self.api, self.path, self.result = api, path, result
        self.set_at = time.monotonic()

    def mark(self) -> None:
        self.set_at = time.monotonic()  # just before a request that (re)filled the cache

    def ensure(self, progress: Callable[[str], None]) -> None:
        if time.monotonic() - self.set_at < NAME_CACHE_S - 15:
            return
        progress("waiting for the server's histogram-name cache to expire, then renewing it")
        while (left := self.set_at + NAME_CACHE_S + 1 - time.monotonic()) > 0:
            time.sleep(min(left, 0.5))
        self.mark()
        self.api.get(self.path)
        self.result.cache_refreshes += 1


def run_runai_case(
    result: RunaiCaseResult,
    api: ApiClient,
    baseline: Baseline,
    path: str,
    progress: Callable[[str], None],
    repeats: int,
) -> RunaiCaseResult:
    name = result.case.name
    queries = result.plan.range_queries
    progress(f"{name}: warm-up and verification")
    cache = _NameCache(api, path, result)
    t0 = time.perf_counter()
    api_body = api.get(path)
    result.api_first_s = time.perf_counter() - t0
    base = baseline.run(queries, keep=True)
    assert base.bodies is not None
    lookups = baseline.run_posts(result.plan.lookups)
    result.api_bytes, result.base_bytes, result.lookup_bytes = len(api_body), base.nbytes, lookups.nbytes
    problems, result.measurements, result.histograms = verify_pod_body(api_body, result.plan, base.bodies)
    result.checks.extend(problems)
    missing = [t for t, n in result.plan.names.items() if n is None]
    if missing:
        result.checks.append(f"no histogram series found for {', '.join(missing)}")
    del api_body, base
    for i in range(repeats):
        progress(f"{name}: run {i + 1}/{repeats}")
        cache.ensure(progress)
        if i % 2 == 0:  # alternate which side goes first
            result.api_s.append(api.timed(path)[0])
            result.base_s.append(baseline.run(queries).seconds)
        else:
            result.base_s.append(baseline.run(queries).seconds)
            result.api_s.append(api.timed(path)[0])
        result.lookup_s.append(baseline.run_posts(result.plan.lookups).seconds)
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
