"""The summary's cost: the Lyceum summary route over 30 days against the metrics read of the same window.

The summary reads the 12 series at the scrape interval (and GPU utilization and FB % per GPU), then
computes stats, energy and findings; the baseline is the metrics route for the same window at the same
step (the summary's `stepSeconds`), on the same server, timed in interleaved rounds (issue 9: at most
2x). Runs in the lyceum section, on its running execution over the bench data.

Then a stored summary (issue 16, part 5): a finished execution over the same 30 days is registered,
its whole-life summary asked once (computed and stored), and the stored answer (`.../summary` without
bounds) is timed against the computation of the same summary (the same request with the execution's
own bounds, which is never served from the store), in interleaved rounds: at most 5 % of it.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import orjson

from bench.cases import ApiVsBaseline, api_path, iso
from bench.clients import ApiClient
from bench.measure import Figure, Side, interleaved, percentile
from gpulens.domain.models import Window
from gpulens.domain.timeparse import parse_timestamp_ms

NAME = "Summary 30 d"
SPAN_S = 30 * 86_400
REPEATS = 5
TARGET = 2.0
STORED_TARGET = 0.05  # a stored summary served in at most 5 % of the time it took to compute
FINISHED_ID = "bench-exec-30d"
SUMMARIES = "/api/v2/external/execution-summaries"
_ARCHIVES_BUILT = re.compile(rb'^gpulens_archive_built_total\{kind="execution"\} ([0-9.eE+-]+)', re.MULTILINE)


@dataclass
class StoredSummaryResult(ApiVsBaseline):
    """api_s: the stored summary's seconds; base_s: computing the same summary (explicit bounds)."""

    api_s: list[float] = field(default_factory=list)
    base_s: list[float] = field(default_factory=list)
    first_s: float = math.nan  # the first request: computed and stored
    bytes: int = 0
    checks: list[str] = field(default_factory=list)

    def as_json(self) -> dict[str, object]:
        return {
            "execution": FINISHED_ID,
            "stored_seconds": self.api_s,
            "computed_seconds": self.base_s,
            "first_request_s": self.first_s,
            "stored_p50_s": self.api_p50,
            "computed_p50_s": self.base_p50,
            "ratio_p50": self.ratio,
            "target_ratio": STORED_TARGET,
            "bytes": self.bytes,
            "problems": self.checks,
        }


@dataclass
class SummaryCostResult(ApiVsBaseline):
    """api_s: the summary's seconds; base_s: the metrics read's (same window and step)."""

    window: Window | None = None  # the summary's own (timeRange, stepSeconds)
    api_s: list[float] = field(default_factory=list)
    base_s: list[float] = field(default_factory=list)
    first_s: float = math.nan  # the first summary request (layouts not cached)
    api_bytes: int = 0
    base_bytes: int = 0
    findings: int = 0
    checks: list[str] = field(default_factory=list)
    stored: StoredSummaryResult | None = None  # the same 30 days, finished: served as stored

    def figures(self) -> list[Figure]:
        out = [Figure(f"{NAME}: summary vs metrics read of the same window", self.ratio, TARGET)]
        if self.stored is not None:
            out.append(
                Figure(
                    f"{NAME}: a stored summary is served in under 5 % of the time it took to compute",
                    self.stored.ratio,
                    STORED_TARGET,
                )
            )
        return out

    def as_json(self) -> dict[str, object]:
        w = self.window
        return {
            "case": NAME,
            "window": None
            if w is None
            else {"start_ms": w.start_ms, "end_ms": w.end_ms, "step_ms": w.step_ms},
            "points_per_series": None if w is None else w.points,
            "summary_seconds": self.api_s,
            "metrics_seconds": self.base_s,
            "summary_first_request_s": self.first_s,
            "summary_p50_s": self.api_p50,
            "metrics_p50_s": self.base_p50,
            "summary_p95_s": percentile(self.api_s, 0.95),
            "metrics_p95_s": percentile(self.base_s, 0.95),
            "ratio_p50": self.ratio,
            "target_ratio": TARGET,
            "summary_bytes": self.api_bytes,
            "metrics_bytes": self.base_bytes,
            "findings": self.findings,
            "problems": self.checks,
            "stored": None if self.stored is None else self.stored.as_json(),
        }


def summary_path(execution_id: str, start_ms: int, end_ms: int) -> str:
    return f"/api/v2/external/execution/{execution_id}/summary?start={iso(start_ms)}&end={iso(end_ms)}"


def parse_window(doc: dict[str, object]) -> Window:
    """The window a summary answered for: its timeRange (RFC 3339) and stepSeconds."""
    rng = doc["timeRange"]
    assert isinstance(rng, dict)
    step = doc["stepSeconds"]
    assert isinstance(step, int | float)
    return Window(
        parse_timestamp_ms(str(rng["start"])), parse_timestamp_ms(str(rng["end"])), round(step * 1000)
    )


def run_summary_cost(
    api: ApiClient, execution_id: str, end_s: int, progress: Callable[[str], None], rounds: int
) -> SummaryCostResult:
    """The summary of the last 30 days before `end_s` against the metrics read of its window and step."""
    result = SummaryCostResult()
    end_ms = end_s * 1000
    start_ms = end_ms - SPAN_S * 1000
    path = summary_path(execution_id, start_ms, end_ms)
    progress(f"{NAME}: first summary request")
    t0 = time.perf_counter()
    body = api.get(path)
    result.first_s = time.perf_counter() - t0
    doc = orjson.loads(body)
    window = result.window = parse_window(doc)
    result.findings = len(doc.get("findings") or [])
    util = (doc.get("stats") or {}).get("gpuUtilizationPercent") or {}
    if not util.get("samples"):
        result.checks.append(f"the summary has no GPU utilization samples: {util}")
    metrics = api_path(execution_id, Window(start_ms, end_ms, window.step_ms))
    progress(f"{NAME}: first metrics read at the summary's step ({window.step_ms // 1000} s)")
    result.api_bytes, result.base_bytes = len(body), len(api.get(metrics))
    del body, doc
    summary_side = Side("summary", lambda: api.timed(path)[0])
    metrics_side = Side("metrics", lambda: api.timed(metrics)[0])
    interleaved([summary_side, metrics_side], rounds, progress, NAME)
    result.api_s, result.base_s = summary_side.seconds, metrics_side.seconds
    return result


def _archives_built(api: ApiClient) -> float:
    found = _ARCHIVES_BUILT.search(api.get("/metrics"))
    return float(found.group(1)) if found else 0.0


def run_stored_summary(
    api: ApiClient,
    register_finished: Callable[[str, int, int], None],
    end_s: int,
    progress: Callable[[str], None],
    rounds: int,
) -> StoredSummaryResult:
    """A finished execution over the 30 days before `end_s` (registered by `register_finished(id,
    start_ms, end_ms)`): its stored summary against computing the same summary again."""
    result = StoredSummaryResult()
    end_ms = end_s * 1000
    start_ms = end_ms - SPAN_S * 1000
    register_finished(FINISHED_ID, start_ms, end_ms)
    archives = _archives_built(api)
    stored_path = f"/api/v2/external/execution/{FINISHED_ID}/summary"
    computed_path = summary_path(FINISHED_ID, start_ms, end_ms)  # explicit bounds: never the store
    progress(f"{NAME}: the finished execution's summary, computed and stored")
    t0 = time.perf_counter()
    stored = api.get(stored_path)
    result.first_s = time.perf_counter() - t0
    result.bytes = len(stored)
    rows = orjson.loads(api.get(f"{SUMMARIES}?execution_id={FINISHED_ID}"))["summaries"]
    if [r["status"] for r in rows] != ["ready"]:
        result.checks.append(f"the finished execution's summary was not stored: {rows}")
    if orjson.loads(api.get(computed_path)) != orjson.loads(stored):
        result.checks.append("the stored summary differs from the same summary computed again")
    stored_side = Side("stored", lambda: api.timed(stored_path)[0])
    computed_side = Side("computed", lambda: api.timed(computed_path)[0])
    interleaved([stored_side, computed_side], rounds, progress, f"{NAME} stored")
    result.api_s, result.base_s = stored_side.seconds, computed_side.seconds
    if _archives_built(api) != archives:  # the archive pass ran meanwhile: the computations read it
        result.checks.append("an archive was built during the rounds; the computed times mix two sources")
    return result
