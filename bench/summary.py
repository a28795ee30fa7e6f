"""The summary's cost: the Lyceum summary route over 30 days against the metrics read of the same window.

The summary reads the 12 series at the scrape interval (and GPU utilization and FB % per GPU), then
computes stats, energy and findings; the baseline is the metrics route for the same window at the same
step (the summary's `stepSeconds`), on the same server, timed in interleaved rounds (issue 9: at most
2x). Runs in the lyceum section, on its running execution over the bench data.
"""

from __future__ import annotations

import math
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

    def figures(self) -> list[Figure]:
        return [Figure(f"{NAME}: summary vs metrics read of the same window", self.ratio, TARGET)]

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
