"""The `load` section: many clients on one gpulens server over a mix of routes, then the same clients
sending the hand-written PromQL of the metrics routes straight to the backend (the baseline).

Data: the Lyceum bench host (31 days, 8 GPUs) and the Run:ai k8s data (26 h, 3 nodes, 7 pods) in one
Prometheus. Both data sets end at the same instant, so their last blocks overlap; the combined TSDB
(bench-data/load/, hard links to both, built once) is left to Prometheus' own vertical compaction
before it is kept, so no compaction runs while the load is measured.

The mix (weights, out of 15 requests): Lyceum metrics at three windows and steps, the Lyceum summary of an
hour, the execution history and the running workloads, the Run:ai pod metrics of the vLLM pod and its
workload's pod list. Windows sit at random (seeded) positions inside the data. The baseline phase sends,
for each metrics request of the mix, the queries a person would write for it (bench/handwritten.py),
one after another on the client's keep-alive connection, with as many clients for as long: per-request
latency there against gpulens' per-route latency is the ratio printed. The summary and the list routes
have no such baseline (their figures are absolute).
"""

from __future__ import annotations

import itertools
import json
import math
import os
import random
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from bench.cases import api_path, iso
from bench.clients import Baseline
from bench.handwritten import (
    HostData,
    PodData,
    lyceum_forms,
    lyceum_queries,
    pod_forms,
    pod_grid,
    pod_queries,
)
from bench.load import Job, ThroughputResult, route_mix
from bench.measure import Figure, percentile, ratio
from bench.runai import RegisteredPod
from bench.servers import Rss
from bench.storm import StormResult
from gpulens.domain.models import Window

NAME = "Load"
CLIENTS = 64
DURATION_S = 60.0
WARMUP_S = 5.0
JOBS_PER_ROUTE = 128
DAY = 86_400
MANIFEST_VERSION = 1
COMPACTION_TIMEOUT_S = 240.0


@dataclass(frozen=True)
class LyceumWindow:
    name: str
    span_s: int
    step_s: int
    weight: int


LYCEUM_WINDOWS = (
    LyceumWindow("Lyceum metrics 1 h @ 15 s", 3600, 15, 3),
    LyceumWindow("Lyceum metrics 6 h @ 1 min", 6 * 3600, 60, 2),
    LyceumWindow("Lyceum metrics 24 h @ 5 min", DAY, 300, 2),
)
SUMMARY = ("Lyceum summary 1 h", 3600, 1)
HISTORY = ("Lyceum execution history", 1)
WORKLOADS = ("Lyceum running workloads", 1)
POD_METRICS = ("Run:ai pod metrics 15 min, 20 samples", 900, 20, 4)
POD_LIST = ("Run:ai workload pods", 1)
POD_TYPES = (
    "GPU_UTILIZATION_PER_GPU",
    "GPU_MEMORY_USAGE_BYTES",
    "CPU_USAGE_CORES",
    "VLLM_NUM_REQUESTS_RUNNING",
    "VLLM_KV_CACHE_USAGE_PERC",
)


@dataclass(frozen=True)
class RouteJobs:
    name: str
    weight: int
    jobs: list[Job]  # gpulens
    baseline: list[Job] | None  # the same requests' hand-written PromQL to the backend, when there is one


def windows_in(
    rng: random.Random, lo_s: int, hi_s: int, span_s: int, step_s: int, count: int
) -> list[Window]:
    """`count` windows of `span_s` ending at random multiples of `step_s` with lo_s + span <= end <= hi_s."""
    first = -(-(lo_s + span_s) // step_s)
    last = hi_s // step_s
    if last < first:
        raise ValueError(f"no {span_s} s window fits in [{lo_s}, {hi_s}]")
    out = []
    for _ in range(count):
        end = rng.randint(first, last) * step_s
        out.append(Window((end - span_s) * 1000, end * 1000, step_s * 1000))
    return out


def post_jobs(route: str, forms_queries: Sequence[Sequence[bytes]]) -> list[Job]:
    """One job per request: its range queries' form bodies POSTed in order to /api/v1/query_range."""
    headers = dict(Baseline.HEADERS)
    return [
        Job(route, tuple(("POST", "/api/v1/query_range", body) for body in bodies), headers)
        for bodies in forms_queries
    ]


def build_routes(
    *,
    execution_id: str,
    host: HostData,
    lyceum_end_s: int,
    scrape_s: int,
    pod: RegisteredPod,
    pod_data: PodData,
    pod_window: tuple[int, int],
    headers: dict[str, str],
    count: int = JOBS_PER_ROUTE,
    seed: int = 7,
) -> list[RouteJobs]:
    """The mix's routes, each with `count` requests (metrics windows over the Lyceum data's last 7 days
    and the vLLM pod's lifetime `pod_window` (seconds)), and their baselines where one exists."""
    rng = random.Random(seed)
    routes: list[RouteJobs] = []
    lo = lyceum_end_s - 7 * DAY
    for lw in LYCEUM_WINDOWS:
        windows = windows_in(rng, lo, lyceum_end_s, lw.span_s, lw.step_s, count)
        forms = lyceum_forms(host, (), lw.step_s * 1000, scrape_s * 1000)
        routes.append(
            RouteJobs(
                lw.name,
                lw.weight,
                [Job.get(lw.name, api_path(execution_id, w), headers) for w in windows],
                post_jobs(lw.name, [[Baseline.form(q) for q in lyceum_queries(forms, w)] for w in windows]),
            )
        )
    name, span, weight = SUMMARY
    windows = windows_in(rng, lo, lyceum_end_s, span, scrape_s, count)
    summary = [
        f"/api/v2/external/execution/{execution_id}/summary?start={iso(w.start_ms)}&end={iso(w.end_ms)}"
        for w in windows
    ]
    routes.append(RouteJobs(name, weight, [Job.get(name, p, headers) for p in summary], None))
    for (name, weight), path in (
        (HISTORY, "/api/v2/external/billing/history?limit=20&offset=0"),
        (WORKLOADS, "/api/v2/external/workloads/list"),
        (POD_LIST, f"/api/v1/workloads/{pod.workload_id}/pods?offset=0&limit=50"),
    ):
        routes.append(RouteJobs(name, weight, [Job.get(name, path, headers)], None))
    name, span, samples, weight = POD_METRICS
    start_s, end_s = pod_window
    pod_jobs, pod_base = [], []
    for _ in range(count):
        stop = rng.randint(start_s + span, end_s)
        start_ms, end_ms = (stop - span) * 1000, stop * 1000
        pod_jobs.append(Job.get(name, pod.metrics_path(POD_TYPES, start_ms, end_ms, samples), headers))
        grid = pod_grid(start_ms, end_ms, samples)
        forms = [f for f in pod_forms(pod_data, grid, scrape_s * 1000) if f.key in POD_TYPES]
        pod_base.append([Baseline.form(q) for q in pod_queries(forms, grid)])
    routes.append(RouteJobs(name, weight, pod_jobs, post_jobs(name, pod_base)))
    return routes


def mixed(routes: Sequence[RouteJobs], count: int = 1024) -> list[Job]:
    return route_mix([(r.jobs, r.weight) for r in routes], count)


def mixed_baseline(routes: Sequence[RouteJobs], count: int = 1024) -> list[Job]:
    return route_mix([(r.baseline, r.weight) for r in routes if r.baseline], count)


# -- result -------------------------------------------------------------------------------------------


@dataclass
class LoadResult:
    clients: int
    warmup_s: float
    duration_s: float
    weights: dict[str, int]
    api: ThroughputResult | None = None
    baseline: ThroughputResult | None = None
    rss_before: Rss | None = None  # the server's, before the warm-up (VmHWM reset there when allowed)
    rss_after: Rss | None = None
    peak_reset: bool = False  # VmHWM was reset before the load: the peak is the load's own
    rss_samples: list[tuple[float, int]] = field(default_factory=list)  # (s into the window, VmRSS KiB)
    server_counters: dict[str, float] = field(default_factory=dict)  # /metrics deltas over the mix
    checks: list[str] = field(default_factory=list)
    storm: StormResult | None = None  # 16 year-long summaries and another tenant's reads (bench/storm.py)

    def route_ratio(self, route: str) -> float:
        if self.api is None or self.baseline is None or route not in self.baseline.by_route:
            return math.nan
        return ratio(
            percentile(self.api.by_route.get(route, []), 0.5), percentile(self.baseline.by_route[route], 0.5)
        )

    def baselined_ratio(self) -> float:
        """p50 over every request of the routes with a baseline, gpulens / hand-written."""
        if self.api is None or self.baseline is None:
            return math.nan
        api = [s for r, v in self.api.by_route.items() if r in self.baseline.by_route for s in v]
        base = self.baseline.latencies
        return ratio(percentile(api, 0.5), percentile(base, 0.5))

    def rss_at(self, fraction: float) -> int | None:
        """VmRSS (KiB) of the last sample at or before `fraction` of the measured window."""
        at = [kib for t, kib in self.rss_samples if t <= fraction * self.duration_s + 1e-6]
        return at[-1] if at else None

    @property
    def jobs_done(self) -> int:
        """Requests the server answered during the mix, warm-up included (those in flight at the end not)."""
        return 0 if self.api is None else self.api.warmup_requests + self.api.requests + self.api.errors

    @property
    def backend_calls_per_request(self) -> float:
        calls = self.server_counters.get(BACKEND_CALLS)
        return calls / self.jobs_done if calls is not None and self.jobs_done else math.nan

    @property
    def rss_growth_mib(self) -> float:
        if self.rss_before is None or self.rss_after is None:
            return math.nan
        return (self.rss_after.rss_kib - self.rss_before.rss_kib) / 1024

    def figures(self) -> list[Figure]:
        errors = float(self.api.errors) if self.api is not None else math.nan
        p99 = self.api.p99 if self.api is not None else math.nan
        peak = self.rss_after.peak_kib / 1024 if self.rss_after is not None else math.nan
        return [
            Figure(
                f"{NAME}: errors ({self.clients} clients, {self.duration_s:.0f} s mix)", errors, 0.0, "errors"
            ),
            Figure(f"{NAME}: p99 over the mix", p99, None, "s"),
            Figure(
                f"{NAME}: metrics routes p50 vs hand-written PromQL, same concurrency",
                self.baselined_ratio(),
                None,
                note="the baseline sends each request's queries in sequence on one connection",
            ),
            Figure(f"{NAME}: server RSS growth", self.rss_growth_mib, None, "MiB"),
            Figure(
                f"{NAME}: server peak RSS",
                peak,
                None,
                "MiB",
                note="VmHWM" + ("" if self.peak_reset else ", since start"),
            ),
            *(self.storm.figures() if self.storm is not None else []),
        ]

    def as_json(self) -> dict[str, object]:
        def rss(r: Rss | None) -> dict[str, int] | None:
            return None if r is None else {"vm_rss_kib": r.rss_kib, "vm_hwm_kib": r.peak_kib}

        routes: dict[str, object] = {}
        if self.api is not None:
            for route, fig in self.api.route_json().items():
                base = self.baseline.route_json().get(route) if self.baseline is not None else None
                routes[route] = {
                    "weight": self.weights.get(route),
                    "gpulens": fig,
                    "handwritten": base,
                    "p50_ratio": self.route_ratio(route) if base is not None else None,
                }
        return {
            "clients": self.clients,
            "warmup_s": self.warmup_s,
            "duration_s": self.duration_s,
            "gpulens": None if self.api is None else self.api.as_json(),
            "handwritten": None if self.baseline is None else self.baseline.as_json(),
            "routes": routes,
            "baselined_routes_p50_ratio": self.baselined_ratio(),
            "server_rss_before": rss(self.rss_before),
            "server_rss_after": rss(self.rss_after),
            "server_peak_is_the_loads": self.peak_reset,
            "server_rss_samples": [{"t_s": t, "vm_rss_kib": kib} for t, kib in self.rss_samples],
            "server_counters_over_the_mix": self.server_counters,
            "backend_calls_per_request": self.backend_calls_per_request,
            "summary_storm": None if self.storm is None else self.storm.as_json(),
            "problems": self.checks,
        }


BACKEND_CALLS = "backend calls"


def server_counters(text: str) -> dict[str, float]:
    """From gpulens' /metrics text: `backend calls` (every metrics-backend call, any outcome) and
    `cache <name> <hit|miss>` (its look-up caches)."""
    out: dict[str, float] = {BACKEND_CALLS: 0.0}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "gpulens_backend_query_duration_seconds_count":
                out[BACKEND_CALLS] += sample.value
            elif sample.name == "gpulens_cache_lookups_total":
                key = f"cache {sample.labels.get('cache', '')} {sample.labels.get('result', '')}"
                out[key] = out.get(key, 0.0) + sample.value
    return out


def counter_deltas(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {k: v - before.get(k, 0.0) for k, v in after.items()}


# -- data: both data sets in one TSDB -----------------------------------------------------------------


def block_ranges(tsdb: Path) -> list[tuple[int, int]]:
    """(minTime, maxTime) of each block of a TSDB directory (blocks being written or deleted skipped)."""
    out = []
    for meta in sorted(tsdb.glob("*/meta.json")):
        if "." in meta.parent.name:  # <ulid>.tmp-for-creation / .tmp-for-deletion
            continue
        try:
            m = json.loads(meta.read_text())
        except (OSError, ValueError):
            continue
        out.append((int(m["minTime"]), int(m["maxTime"])))
    return out


def overlapping(ranges: Sequence[tuple[int, int]]) -> bool:
    """Whether any two [min, max) block ranges overlap."""
    s = sorted(ranges)
    return any(b[0] < a[1] for a, b in itertools.pairwise(s))


def link_blocks(parts: Sequence[Path], into: Path) -> int:
    """Hard links of every block of `parts` (TSDB directories) under `into`; the block count."""
    into.mkdir(parents=True, exist_ok=True)
    n = 0
    for part in parts:
        for meta in sorted(part.glob("*/meta.json")):
            block = meta.parent
            if "." in block.name:
                continue
            shutil.copytree(block, into / block.name, copy_function=os.link)
            n += 1
    return n


def combined_tsdb(
    root: Path,
    parts: Sequence[tuple[Path, dict[str, object]]],
    block_s: int,
    start: Callable[[Path], Callable[[], None]],
    log: Callable[[str], object],
) -> tuple[Path, bool, float]:
    """`root`/tsdb: the blocks of `parts` ((tsdb, its manifest)) linked together and compacted by a
    Prometheus (`start(tsdb)` starts it and returns its stop) until no two blocks overlap; reused while
    `root`/manifest.json matches. Returns (tsdb, reused, seconds)."""
    wanted = {"version": MANIFEST_VERSION, "block_s": block_s, "parts": [m for _, m in parts]}
    manifest = root / "manifest.json"
    tsdb = root / "tsdb"
    try:
        found = json.loads(manifest.read_text())
    except (OSError, ValueError):
        found = None
    if found == wanted and tsdb.is_dir():
        return tsdb, True, 0.0
    log(
        f"linking the Lyceum and k8s data into {tsdb} and letting Prometheus compact it (once; a few minutes)"
    )
    t0 = time.monotonic()
    manifest.unlink(missing_ok=True)
    shutil.rmtree(tsdb, ignore_errors=True)
    link_blocks([p for p, _ in parts], tsdb)
    if overlapping(block_ranges(tsdb)):
        stop = start(tsdb)
        try:
            deadline = time.monotonic() + COMPACTION_TIMEOUT_S
            while overlapping(block_ranges(tsdb)):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"Prometheus did not compact the overlapping blocks of {tsdb}")
                time.sleep(2.0)
        finally:
            stop()
    manifest.write_text(json.dumps(wanted, indent=1) + "\n")
    return tsdb, False, time.monotonic() - t0
