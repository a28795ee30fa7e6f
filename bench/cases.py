"""The measured cases: windows at the end of the data, the planner's queries, timing and checks."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

import orjson

from bench.clients import ApiClient, Baseline
from gpulens.api.app import plan_options
from gpulens.config import Settings
from gpulens.domain import catalog as c
from gpulens.domain.models import RangeQuery, Window
from gpulens.domain.timeparse import format_rfc3339_ms
from gpulens.planning.chunking import chunks
from gpulens.planning.hosts import HostPlanOptions, HostTarget, PlannedMetric, plan_host

DAY = 86_400


@dataclass(frozen=True)
class Case:
    name: str
    span_s: int
    step_s: int
    repeats: int
    target_ratio: float | None = None
    measure_rss: bool = False


CASES: tuple[Case, ...] = (
    Case("1 h @ 5 s", 3600, 5, 15),
    Case("24 h @ 15 s", DAY, 15, 9, target_ratio=1.5),
    Case("7 d @ 15 s (chunked)", 7 * DAY, 15, 5),
    Case("30 d @ 15 s (chunked, streamed)", 30 * DAY, 15, 3, target_ratio=1.5, measure_rss=True),
)


def percentile(values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    s = sorted(values)
    if not s:
        return math.nan
    pos = (len(s) - 1) * q
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


class ApiVsBaseline:
    """p50 of each side's timed runs (`api_s`, `base_s`: seconds) and their ratio."""

    api_s: list[float]
    base_s: list[float]

    @property
    def api_p50(self) -> float:
        return percentile(self.api_s, 0.5)

    @property
    def base_p50(self) -> float:
        return percentile(self.base_s, 0.5)

    @property
    def ratio(self) -> float:
        return self.api_p50 / self.base_p50


@dataclass
class CaseResult(ApiVsBaseline):
    case: Case
    window: Window
    chunks: int
    queries: int
    api_s: list[float] = field(default_factory=list)
    base_s: list[float] = field(default_factory=list)
    api_bytes: int = 0
    base_bytes: int = 0
    checks: list[str] = field(default_factory=list)  # problems found; empty = verified
    rss_before_kib: int | None = None
    rss_peak_kib: int | None = None
    rss_after_kib: int | None = None

    @property
    def rss_growth_mib(self) -> float | None:
        if self.rss_before_kib is None or self.rss_peak_kib is None:
            return None
        return (self.rss_peak_kib - self.rss_before_kib) / 1024

    def as_json(self) -> dict[str, object]:
        out: dict[str, object] = {
            "case": self.case.name,
            "start_ms": self.window.start_ms,
            "end_ms": self.window.end_ms,
            "step_ms": self.window.step_ms,
            "points_per_series": self.window.points,
            "chunks_per_metric": self.chunks,
            "queries": self.queries,
            "repeats": len(self.api_s),
            "api_seconds": self.api_s,
            "baseline_seconds": self.base_s,
            "api_p50_s": self.api_p50,
            "api_p95_s": percentile(self.api_s, 0.95),
            "baseline_p50_s": self.base_p50,
            "baseline_p95_s": percentile(self.base_s, 0.95),
            "ratio_p50": self.ratio,
            "target_ratio": self.case.target_ratio,
            "api_bytes": self.api_bytes,
            "baseline_bytes": self.base_bytes,
            "verified": not self.checks,
            "problems": self.checks,
        }
        if self.case.measure_rss:
            out |= {
                "rss_before_kib": self.rss_before_kib,
                "rss_peak_kib": self.rss_peak_kib,
                "rss_after_kib": self.rss_after_kib,
                "rss_growth_mib": self.rss_growth_mib,
            }
        return out


def window_for(case: Case, data_end_s: int) -> Window:
    end_ms = data_end_s * 1000
    return Window(end_ms - case.span_s * 1000, end_ms, case.step_s * 1000)


def iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def api_path(execution_id: str, window: Window) -> str:
    return (
        f"/api/v2/external/execution/{execution_id}/metrics"
        f"?start={iso(window.start_ms)}&end={iso(window.end_ms)}&step={window.step_ms // 1000}s"
    )


def planned(
    settings: Settings,
    hostname: str,
    instances: tuple[str, ...],
    step_ms: int,
    options: HostPlanOptions | None = None,
) -> list[PlannedMetric]:
    """The 12 expressions the service sends for a whole-host execution (MetricsService.execution_metrics)."""
    return plan_host(
        c.LYCEUM_METRICS, HostTarget(hostname, (), instances), step_ms, options or plan_options(settings)
    )


def baseline_queries(plan: Sequence[PlannedMetric], window: Window, max_points: int) -> list[RangeQuery]:
    """Metric-major, chunks in order: the service's own job order."""
    parts = chunks(window, max_points)
    return [RangeQuery(p.expr, w) for p in plan for w in parts]


def verify(
    api_body: bytes, base_bodies: list[bytes], plan: Sequence[PlannedMetric], n_chunks: int, window: Window
) -> list[str]:
    """The API body is JSON with 12 arrays of the expected length whose values equal the baseline's."""
    problems: list[str] = []
    doc = orjson.loads(api_body)
    expected = window.points
    for i, p in enumerate(plan):
        key = p.metric.lyceum
        arr = doc.get(key)
        if not isinstance(arr, list) or not arr:
            problems.append(f"{key}: missing or empty")
            continue
        if len(arr) != expected:
            problems.append(f"{key}: {len(arr)} points, expected {expected}")
        ends = (arr[0]["timestamp"], arr[-1]["timestamp"])
        if ends != (format_rfc3339_ms(window.start_ms), format_rfc3339_ms(window.end_ms)):
            problems.append(f"{key}: runs {ends[0]} .. {ends[1]}, not the requested grid")
        raw: list[float] = []
        for body in base_bodies[i * n_chunks : (i + 1) * n_chunks]:
            result = orjson.loads(body)["data"]["result"]
            if len(result) != 1:
                problems.append(f"{key}: Prometheus returned {len(result)} series for a chunk")
            for series in result[:1]:
                raw.extend(float(v) for _, v in series["values"])
        if len(raw) != len(arr):
            problems.append(f"{key}: API {len(arr)} points, Prometheus {len(raw)}")
        else:
            # Prometheus' avg() over a `max by` result is not bit-for-bit repeatable (series order), so
            # two evaluations of one expression may differ in the last bits.
            bad = sum(
                not math.isclose(a["value"], b, rel_tol=1e-9, abs_tol=1e-9)
                for a, b in zip(arr, raw, strict=True)
            )
            if bad:
                problems.append(f"{key}: {bad} values differ from Prometheus")
    return problems


def run_case(
    case: Case,
    result: CaseResult,
    api: ApiClient,
    baseline: Baseline,
    path: str,
    queries: list[RangeQuery],
    plan: Sequence[PlannedMetric],
    progress: Callable[[str], None],
    rss: Callable[[str], int] | None = None,
    reset_peak: Callable[[], bool] | None = None,
    repeats: int | None = None,
) -> CaseResult:
    n = repeats or case.repeats
    if case.measure_rss and rss is not None and reset_peak is not None:
        result.rss_before_kib = rss("VmRSS")
        if not reset_peak():
            result.checks.append("could not reset VmHWM (clear_refs); peak RSS is the process lifetime's")
    # warm-up (also the verified run; not timed)
    progress(f"{case.name}: warm-up and verification")
    api_body = api.get(path)
    base = baseline.run(queries, keep=True)
    assert base.bodies is not None
    result.api_bytes, result.base_bytes = len(api_body), base.nbytes
    result.checks.extend(verify(api_body, base.bodies, plan, result.chunks, result.window))
    del api_body, base
    for i in range(n):
        progress(f"{case.name}: run {i + 1}/{n}")
        # alternate which side goes first, so neither always follows the other
        if i % 2 == 0:
            result.api_s.append(api.timed(path)[0])
            result.base_s.append(baseline.run(queries).seconds)
        else:
            result.base_s.append(baseline.run(queries).seconds)
            result.api_s.append(api.timed(path)[0])
    if case.measure_rss and rss is not None:
        result.rss_peak_kib = rss("VmHWM")
        result.rss_after_kib = rss("VmRSS")
    return result


# -- FB % query forms ----------------------------------------------------------------------------------


@dataclass
class FormResult:
    name: str
    expr: str
    seconds: list[float] = field(default_factory=list)
    nbytes: int = 0
    max_abs_diff: float | None = None  # vs the planner's form
    points: int = 0

    @property
    def p50(self) -> float:
        return percentile(self.seconds, 0.5)

    def as_json(self) -> dict[str, object]:
        return {
            "form": self.name,
            "expr": self.expr,
            "seconds": self.seconds,
            "p50_s": self.p50,
            "p95_s": percentile(self.seconds, 0.95),
            "bytes": self.nbytes,
            "points": self.points,
            "max_abs_diff_vs_planner": self.max_abs_diff,
        }


def fb_forms(
    settings: Settings, hostname: str, instances: tuple[str, ...], step_ms: int
) -> list[tuple[str, str]]:
    used = f'{c.DCGM_FB_USED}{{Hostname="{hostname}"}}'
    free = f'{c.DCGM_FB_FREE}{{Hostname="{hostname}"}}'
    fb_index = c.LYCEUM_KEYS.index("gpuMemoryUtilizationPercent")
    planner = planned(settings, hostname, instances, step_ms)[fb_index].expr
    one_label = planned(
        settings,
        hostname,
        instances,
        step_ms,
        HostPlanOptions(
            host_labels=("Hostname",),
            node_match=settings.node_match,
            metric_names=dict(settings.metric_names),
            scrape_interval_ms=settings.scrape_interval_ms,
        ),
    )[fb_index].expr
    return [
        ("avg(100*U/(U+F))", f"avg(100 * {used} / ({used} + {free}))"),
        ("planner: per-GPU collapsed (2 host labels)", planner),
        ("planner form, 1 host label", one_label),
        ("100*sum(U)/(sum(U)+sum(F))", f"100 * sum({used}) / (sum({used}) + sum({free}))"),
        ("reference: sum(U) alone", f"sum({used})"),
    ]


def _values(body: bytes) -> list[tuple[float, float]]:
    result = orjson.loads(body)["data"]["result"]
    if len(result) != 1:
        return []
    return [(t, float(v)) for t, v in result[0]["values"]]


def run_fb_forms(
    forms: list[tuple[str, str]],
    window: Window,
    baseline: Baseline,
    repeats: int,
    progress: Callable[[str], None],
) -> list[FormResult]:
    results = [FormResult(name, expr) for name, expr in forms]
    values: dict[str, list[tuple[float, float]]] = {}
    for r in results:  # warm-up, sizes and values
        _, body = baseline.single(RangeQuery(r.expr, window))
        r.nbytes = len(body)
        values[r.name] = _values(body)
        r.points = len(values[r.name])
    reference = next((values[r.name] for r in results if r.name.startswith("planner:")), [])
    for r in results:
        vals = values[r.name]
        if reference and len(vals) == len(reference) and not r.name.startswith("reference"):
            r.max_abs_diff = max(abs(a[1] - b[1]) for a, b in zip(vals, reference, strict=True))
    for i in range(repeats):
        progress(f"FB % forms: round {i + 1}/{repeats}")
        order = results if i % 2 == 0 else list(reversed(results))
        for r in order:
            t0 = time.perf_counter()
            baseline.single(RangeQuery(r.expr, window))
            r.seconds.append(time.perf_counter() - t0)
    return results
