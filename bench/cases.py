"""The Lyceum cases: windows at the end of the data, gpulens against the hand-written baseline.

Each case times gpulens' execution metrics endpoint and the hand-written queries (bench/handwritten.py)
on the same backend in interleaved rounds, checks that both answers agree on every point, and reads the
backend's CPU per request of each side. Some cases also replay gpulens' own plan straight to the backend:
that secondary figure is the service's overhead, not a comparison with what a person would send.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

import anyio
import orjson

from bench.clients import ApiClient, Baseline
from bench.damaged import CLEAN
from bench.handwritten import HandForm, Tolerance, check_lyceum, hand_chunks, lyceum_queries
from bench.measure import Figure, Side, cpu_batch_size, interleaved, measure_cpu, percentile, ratio
from gpulens.api.app import plan_options
from gpulens.backends.prometheus import PrometheusBackend, make_client
from gpulens.config import Settings
from gpulens.domain import catalog as c
from gpulens.domain.models import RangeQuery, Window
from gpulens.planning.hosts import HostPlanOptions, HostTarget, PlannedMetric, plan_host
from gpulens.planning.layout import HostLayout
from gpulens.service.layouts import HostLayouts

DAY = 86_400
# issue 8's acceptance: gpulens' cold reads against the hand-written queries (medians), per backend
WALL_TARGET = {"Prometheus": 1.2, "VictoriaMetrics": 2.0}
CPU_TARGET: dict[str, float | None] = {"Prometheus": 1.2, "VictoriaMetrics": None}

__all__ = ["percentile"]  # re-exported for the other bench modules


@dataclass(frozen=True)
class Case:
    name: str
    span_s: int
    step_s: int
    repeats: int  # interleaved rounds (medians of at least 7 with the default --repeat-scale)
    measure_rss: bool = False
    overhead: bool = False  # also replay gpulens' own plan (the secondary "service overhead" figure)
    # where the window lies: "end" ends with the data, "start" starts with it (the host's series begin
    # with the window), "restart" is centred on a dcgm-exporter restart of the damaged data (the same
    # times on the clean data)
    anchor: str = "end"
    targets: tuple[tuple[str, float], ...] = ()  # per backend, instead of WALL_TARGET's


# the reads of 15-25 ms get more rounds: eleven moved their ratio by 0.2 between two runs of one build
# (1.16 and 1.35), where an interleaved A/B of 61 rounds read 1.06-1.10; 41 cost ~2 s a case
CASES: tuple[Case, ...] = (
    Case("1 h @ 5 s", 3600, 5, 41, overhead=True),
    Case("1 h @ 15 s", 3600, 15, 41, targets=(("Prometheus", 1.3),)),
    Case("24 h @ 15 s", DAY, 15, 9, overhead=True),
    Case("24 h @ 15 s from the data's start", DAY, 15, 9, anchor="start"),
    Case("24 h @ 15 s over a restart", DAY, 15, 9, anchor="restart"),
    Case("72 h @ 15 s (chunked)", 3 * DAY, 15, 7),
    Case("7 d @ 15 s (chunked)", 7 * DAY, 15, 7),
    Case("30 d @ 15 s (chunked, streamed)", 30 * DAY, 15, 7, measure_rss=True),
)


class ApiVsBaseline:
    """p50 of each side's timed runs (`api_s`; `base_s`: the hand-written baseline; seconds), their ratio."""

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
        return ratio(self.api_p50, self.base_p50)


@dataclass
class CpuFigures:
    """Backend CPU seconds per request of each side (and the gpulens server's own, from /proc)."""

    requests: int = 0  # per side
    api: float = math.nan
    base: float = math.nan
    server: float = math.nan  # gpulens serve, per API request
    source: str = "/metrics process_cpu_seconds_total"
    api_metrics: float = math.nan  # both readings, whichever `source` is
    base_metrics: float = math.nan
    api_proc: float = math.nan
    base_proc: float = math.nan

    @classmethod
    def of(cls, n: int, api: Side, base: Side, server: float, use_proc: bool) -> CpuFigures:
        return cls(
            n,
            api.cpu_per_request,
            base.cpu_per_request,
            server,
            "/proc/<pid>/stat" if use_proc else "/metrics process_cpu_seconds_total",
            api.cpu_metrics_per_request,
            base.cpu_metrics_per_request,
            api.cpu_proc_per_request,
            base.cpu_proc_per_request,
        )

    @property
    def ratio(self) -> float:
        return ratio(self.api, self.base)

    def as_json(self) -> dict[str, object]:
        return {
            "requests_per_side": self.requests,
            "backend_cpu_s_per_request_api": self.api,
            "backend_cpu_s_per_request_handwritten": self.base,
            "ratio": self.ratio,
            "source": self.source,
            "from_metrics": {"api": self.api_metrics, "handwritten": self.base_metrics},
            "from_proc": {"api": self.api_proc, "handwritten": self.base_proc},
            "gpulens_cpu_s_per_request": self.server,
        }


@dataclass
class CaseResult(ApiVsBaseline):
    case: Case
    backend: str  # "Prometheus" or "VictoriaMetrics"
    window: Window
    chunks: int
    queries: int  # hand-written queries per request (series x chunks)
    api_s: list[float] = field(default_factory=list)
    base_s: list[float] = field(default_factory=list)
    replay_s: list[float] = field(default_factory=list)  # gpulens' own plan sent straight to the backend
    api_bytes: int = 0
    base_bytes: int = 0
    cpu: CpuFigures = field(default_factory=CpuFigures)
    checks: list[str] = field(default_factory=list)  # problems found; empty = verified
    rss_before_kib: int | None = None
    rss_peak_kib: int | None = None
    rss_after_kib: int | None = None
    data: str = CLEAN  # "clean" or "damaged" (bench/damaged.py)
    compared: int = 0  # points the answer check compared
    tolerated: int = 0  # points it skipped: the hand-written form is known wrong there (damaged data)
    absent: int = 0  # points neither answer has (damaged data)

    @property
    def name(self) -> str:
        return f"Lyceum {self.backend} {self.case.name}" + (
            "" if self.data == CLEAN else f", {self.data} data"
        )

    @property
    def target_ratio(self) -> float | None:
        return dict(self.case.targets).get(self.backend, WALL_TARGET.get(self.backend))

    @property
    def target_cpu(self) -> float | None:
        return CPU_TARGET.get(self.backend)

    @property
    def replay_p50(self) -> float:
        return percentile(self.replay_s, 0.5)

    @property
    def overhead_ratio(self) -> float:
        """API over gpulens' own plan replayed: the service's overhead (secondary, no target)."""
        return ratio(self.api_p50, self.replay_p50)

    @property
    def rss_growth_mib(self) -> float | None:
        if self.rss_before_kib is None or self.rss_peak_kib is None:
            return None
        return (self.rss_peak_kib - self.rss_before_kib) / 1024

    def figures(self, rss_target_mib: float) -> list[Figure]:
        out = [
            Figure(f"{self.name}: wall p50 vs hand-written", self.ratio, self.target_ratio),
            Figure(f"{self.name}: backend CPU/request vs hand-written", self.cpu.ratio, self.target_cpu),
        ]
        if self.rss_before_kib is not None:  # measured on this backend
            out.append(Figure(f"{self.name}: server RSS growth", self.rss_growth_mib, rss_target_mib, "MiB"))
        return out

    def as_json(self) -> dict[str, object]:
        out: dict[str, object] = {
            "case": self.case.name,
            "backend": self.backend,
            "data": self.data,
            "start_ms": self.window.start_ms,
            "end_ms": self.window.end_ms,
            "step_ms": self.window.step_ms,
            "points_per_series": self.window.points,
            "chunks_per_series": self.chunks,
            "handwritten_queries": self.queries,
            "repeats": len(self.api_s),
            "api_seconds": self.api_s,
            "handwritten_seconds": self.base_s,
            "api_p50_s": self.api_p50,
            "api_p95_s": percentile(self.api_s, 0.95),
            "handwritten_p50_s": self.base_p50,
            "handwritten_p95_s": percentile(self.base_s, 0.95),
            "ratio_p50": self.ratio,
            "target_ratio": self.target_ratio,
            "cpu": self.cpu.as_json(),
            "target_cpu_ratio": self.target_cpu,
            "service_overhead": None
            if not self.replay_s
            else {
                "what": "gpulens' own plan sent straight to the backend (not the baseline)",
                "replay_seconds": self.replay_s,
                "replay_p50_s": self.replay_p50,
                "api_over_replay_p50": self.overhead_ratio,
            },
            "api_bytes": self.api_bytes,
            "handwritten_bytes": self.base_bytes,
            "verified": not self.checks,
            "problems": self.checks,
            "points_compared": self.compared,
            "points_tolerated": self.tolerated,
            "points_in_neither": self.absent,
        }
        if self.rss_before_kib is not None:
            out |= {
                "rss_before_kib": self.rss_before_kib,
                "rss_peak_kib": self.rss_peak_kib,
                "rss_after_kib": self.rss_after_kib,
                "rss_growth_mib": self.rss_growth_mib,
            }
        return out


def window_for(
    case: Case, data_start_s: int, data_end_s: int, restart: tuple[int, int] | None = None
) -> Window:
    """The case's window on data from `data_start_s` to `data_end_s` (s); `restart`: the [start, end]
    (s) of the window around a restart, for anchor "restart"."""
    if case.anchor == "start":
        start_s = data_start_s
    elif case.anchor == "restart":
        if restart is None:
            raise ValueError(f"{case.name}: no restart window given")
        start_s = restart[0]
    else:
        start_s = data_end_s - case.span_s
    return Window(start_s * 1000, (start_s + case.span_s) * 1000, case.step_s * 1000)


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
    """The 12 expressions the service sends for a whole-host execution (replay, FB forms, embedded)."""
    return plan_host(
        c.LYCEUM_METRICS, HostTarget(hostname, (), instances), step_ms, options or plan_options(settings)
    )


def served_plan(
    settings: Settings, backend_url: str, hostname: str, instances: tuple[str, ...], window: Window
) -> list[PlannedMetric]:
    """The plan MetricsService sends for the bench execution over `window`: the host's layout found by
    the service's own look-ups (HostLayouts), then plan_host on it."""
    options = plan_options(settings)
    target = HostTarget(hostname, (), instances)

    async def find() -> HostLayout:
        backend = PrometheusBackend(backend_url, make_client(60.0, False, 4))
        try:
            layouts = HostLayouts(options)
            return await layouts.layout(backend, c.LYCEUM_METRICS, target, window, window.step_ms)
        finally:
            await backend.aclose()

    return plan_host(c.LYCEUM_METRICS, target, window.step_ms, options, anyio.run(find))


def replay_queries(plan: Sequence[PlannedMetric], window: Window) -> list[RangeQuery]:
    """gpulens' own plan, metric-major, chunks in order (the service's job order; no query for a
    metric without series)."""
    parts = hand_chunks(window)
    return [RangeQuery(p.expr, w) for p in plan if p.expr is not None for w in parts]


def run_case(
    result: CaseResult,
    api: ApiClient,
    baseline: Baseline,
    backend_url: str,
    backend_pid: int,
    path: str,
    forms: Sequence[HandForm],
    progress: Callable[[str], None],
    *,
    repeats: int,
    replay: list[RangeQuery] | None = None,
    server_cpu: Callable[[], float] | None = None,
    rss: Callable[[str], int] | None = None,
    reset_peak: Callable[[], bool] | None = None,
    tolerance: Tolerance | None = None,
    strict: bool = True,
) -> CaseResult:
    """Warm-up and check (skipping `tolerance`'s points; `strict`: bench/handwritten.py), `repeats`
    interleaved rounds, then a CPU batch per side."""
    label = result.name.removeprefix("Lyceum ")
    queries = lyceum_queries(forms, result.window)
    if result.case.measure_rss and rss is not None and reset_peak is not None:
        result.rss_before_kib = rss("VmRSS")
        if not reset_peak():
            result.checks.append("could not reset VmHWM (clear_refs); peak RSS is the process lifetime's")
    progress(f"{label}: warm-up and check against the hand-written queries")
    api_body = api.get(path)
    base = baseline.run(queries, keep=True)
    assert base.bodies is not None
    result.api_bytes, result.base_bytes = len(api_body), base.nbytes
    check = check_lyceum(api_body, base.bodies, forms, result.chunks, result.window, tolerance, strict)
    result.checks.extend(check.problems)
    result.compared, result.tolerated, result.absent = check.compared, check.tolerated, check.absent
    del api_body, base
    if replay is not None:
        baseline.run(replay)  # its warm-up
    api_side = Side("gpulens", lambda: api.timed(path)[0])
    hand_side = Side("hand-written", lambda: baseline.run(queries).seconds)
    sides = [api_side, hand_side]
    if replay is not None:
        sides.append(Side("own plan replayed", lambda: baseline.run(replay).seconds))
    interleaved(sides, repeats, progress, label)
    result.api_s, result.base_s = api_side.seconds, hand_side.seconds
    result.replay_s = sides[2].seconds if replay is not None else []
    if result.case.measure_rss and rss is not None:
        result.rss_peak_kib = rss("VmHWM")
        result.rss_after_kib = rss("VmRSS")
    n = cpu_batch_size(max(result.api_p50, result.base_p50))
    extra = {"server": server_cpu} if server_cpu is not None else None
    use_proc = result.backend != "Prometheus"
    clocks = measure_cpu(
        [api_side, hand_side], backend_url, backend_pid, n, progress, label, use_proc=use_proc, extra=extra
    )
    server = clocks[api_side.name].get("server", math.nan)
    result.cpu = CpuFigures.of(n, api_side, hand_side, server, use_proc)
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


def _expr(p: PlannedMetric) -> str:
    if p.expr is None:
        raise RuntimeError(f"the planner asks nothing for {p.metric.key}")
    return p.expr


def fb_forms(
    settings: Settings, hostname: str, instances: tuple[str, ...], step_ms: int
) -> list[tuple[str, str]]:
    used = f'{c.DCGM_FB_USED}{{Hostname="{hostname}"}}'
    free = f'{c.DCGM_FB_FREE}{{Hostname="{hostname}"}}'
    fb_index = c.LYCEUM_KEYS.index("gpuMemoryUtilizationPercent")
    planner = _expr(planned(settings, hostname, instances, step_ms)[fb_index])
    one_label = _expr(
        planned(
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
        )[fb_index]
    )
    return [
        ("avg(100*U/(U+F))", f"avg(100 * {used} / ({used} + {free}))"),
        ("planner: guarded per-GPU form (2 host labels)", planner),
        ("guarded form, 1 host label", one_label),
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
