"""The `archive` section: reads of a finished execution that `gpulens archive` has archived.

Skipped, with a line saying so, while `gpulens archive --help` fails (the command does not exist yet).
Otherwise a completed 24 h, 8-GPU execution at the end of the Lyceum bench data is registered and
archived (`gpulens archive <id>`, timed, before the server starts), and then:

(a) the same request, 24 h @ 15 s, repeated, against the hand-written queries for that window;
(b) a different step and window every round (steps 15 s .. 5 min, start and end shifted by minutes),
    each against the hand-written queries of the same window and step (median of the per-round ratios);
(c) the archiving time and bytes per archived sample (`gpulens archive --stats --json`).

Every answer is checked against the hand-written one.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from bench.cases import ApiVsBaseline, api_path
from bench.clients import ApiClient, Baseline
from bench.handwritten import HostData, hand_chunks, lyceum_forms, lyceum_queries, verify_lyceum
from bench.measure import Figure, Side, interleaved, percentile
from bench.servers import gpulens_binary
from gpulens.domain.models import Window

ARCHIVED_ID = "bench-archived-1"
GPUS = tuple(str(i) for i in range(8))
DAY_MS = 86_400_000
STEPS_S = (15, 20, 30, 45, 60, 90, 120, 300)
REPEATS = 7
TARGET_SAME = 0.3
TARGET_VARIED = 1.0
TARGET_ARCHIVE_S = 2.0
TARGET_BYTES_PER_SAMPLE = 2.0


def available(timeout_s: float = 60.0) -> tuple[bool, str]:
    """Whether this gpulens has an `archive` command (`gpulens archive --help` exits 0)."""
    try:
        done = subprocess.run(
            [gpulens_binary(), "archive", "--help"], capture_output=True, timeout=timeout_s, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, f"`gpulens archive --help` failed: {exc}"
    if done.returncode != 0:
        return False, f"`gpulens archive --help` exits {done.returncode}: no archive command in this gpulens"
    return True, ""


@dataclass
class SameRequest(ApiVsBaseline):
    window: Window
    api_s: list[float] = field(default_factory=list)
    base_s: list[float] = field(default_factory=list)


@dataclass
class VariedRound:
    window: Window
    api_s: float
    base_s: float

    @property
    def ratio(self) -> float:
        return self.api_s / self.base_s if self.base_s else math.nan


@dataclass
class ArchiveResult:
    available: bool
    reason: str = ""  # why not measured
    execution: Window | None = None
    archive_s: float = math.nan  # wall time of `gpulens archive <id>` (process start included)
    archive_output: str = ""
    stats: dict[str, object] | None = None
    same: SameRequest | None = None
    varied: list[VariedRound] = field(default_factory=list)
    checks: list[str] = field(default_factory=list)

    @property
    def bytes_per_sample(self) -> float:
        if not self.stats:
            return math.nan
        samples, size = self.stats.get("samples"), self.stats.get("bytes")
        if not isinstance(samples, (int, float)) or not isinstance(size, (int, float)) or not samples:
            return math.nan
        return float(size) / float(samples)

    @property
    def varied_ratio(self) -> float:
        """Median of the per-round ratios (each round its own window and step)."""
        return percentile([r.ratio for r in self.varied], 0.5)

    def figures(self) -> list[Figure]:
        note = "" if self.available else "not available"
        same = self.same.ratio if self.same is not None and self.same.api_s else None
        return [
            Figure("Archive: same 24 h @ 15 s request vs hand-written", same, TARGET_SAME, note=note),
            Figure(
                "Archive: other step/window each round vs hand-written",
                self.varied_ratio if self.varied else None,
                TARGET_VARIED,
                note=note,
            ),
            Figure("Archive: archiving a 24 h 8-GPU execution", self.archive_s, TARGET_ARCHIVE_S, "s", note),
            Figure(
                "Archive: bytes per archived sample",
                self.bytes_per_sample,
                TARGET_BYTES_PER_SAMPLE,
                "B",
                note,
            ),
        ]

    def as_json(self) -> dict[str, object]:
        if not self.available:
            return {"available": False, "reason": self.reason}
        return {
            "available": True,
            "reason": self.reason,
            "execution_window_ms": None
            if self.execution is None
            else [self.execution.start_ms, self.execution.end_ms],
            "archive_seconds": self.archive_s,
            "archive_output": self.archive_output[-2000:],
            "stats": self.stats,
            "bytes_per_sample": self.bytes_per_sample,
            "same_request": None
            if self.same is None
            else {
                "api_seconds": self.same.api_s,
                "handwritten_seconds": self.same.base_s,
                "api_p50_s": self.same.api_p50,
                "handwritten_p50_s": self.same.base_p50,
                "ratio_p50": self.same.ratio,
                "target_ratio": TARGET_SAME,
            },
            "varied": [
                {
                    "start_ms": r.window.start_ms,
                    "end_ms": r.window.end_ms,
                    "step_ms": r.window.step_ms,
                    "api_s": r.api_s,
                    "handwritten_s": r.base_s,
                    "ratio": r.ratio,
                }
                for r in self.varied
            ],
            "varied_ratio_median": self.varied_ratio if self.varied else None,
            "target_varied_ratio": TARGET_VARIED,
            "verified": not self.checks,
            "problems": self.checks,
        }


def execution_window(data_end_s: int) -> Window:
    end_ms = data_end_s * 1000
    return Window(end_ms - DAY_MS, end_ms, 15_000)


def archive_execution(
    result: ArchiveResult, prometheus_url: str, database_url: str, data_dir: Path, timeout_s: float = 600.0
) -> None:
    """`gpulens archive <id>` (timed) and `gpulens archive --stats --json`, with the bench's settings."""
    env = {
        **os.environ,
        "GPULENS_DATABASE_URL": database_url,
        "GPULENS_PROMETHEUS_URL": prometheus_url,
        "GPULENS_DATA_DIR": str(data_dir),
    }
    binary = gpulens_binary()
    t0 = time.perf_counter()
    done = subprocess.run(
        [binary, "archive", ARCHIVED_ID],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout_s,
        check=False,
    )
    seconds = time.perf_counter() - t0
    result.archive_output = (done.stdout + done.stderr).strip()
    if done.returncode != 0:
        result.checks.append(
            f"gpulens archive {ARCHIVED_ID} exited {done.returncode}: {result.archive_output[-300:]}"
        )
        return
    result.archive_s = seconds
    stats = subprocess.run(
        [binary, "archive", "--stats", "--json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout_s,
        check=False,
    )
    try:
        parsed = json.loads(stats.stdout)
    except ValueError:
        parsed = None
    if stats.returncode != 0 or not isinstance(parsed, dict):
        said = (stats.stdout + stats.stderr)[-300:]
        result.checks.append(f"gpulens archive --stats --json exited {stats.returncode}: {said}")
        return
    result.stats = parsed
    for key in ("samples", "bytes"):
        if key not in parsed:
            result.checks.append(f"gpulens archive --stats --json has no {key!r}")


def varied_windows(execution: Window, rounds: int) -> list[Window]:
    """Round i: step STEPS_S[i % n], start 7*(i+1) minutes after the execution's, end 5*i minutes before."""
    out = []
    for i in range(rounds):
        step_ms = STEPS_S[i % len(STEPS_S)] * 1000
        start = execution.start_ms + (i + 1) * 7 * 60_000
        end = execution.end_ms - i * 5 * 60_000
        end -= (end - start) % step_ms  # the API's grid ends on a grid point
        out.append(Window(start, end, step_ms))
    return out


def run_archive(
    result: ArchiveResult,
    api: ApiClient,
    baseline: Baseline,
    host: HostData,
    scrape_interval_ms: int,
    progress: Callable[[str], None],
    repeats: int = REPEATS,
) -> ArchiveResult:
    """(a) and (b) on a server whose registry holds the archived execution."""
    assert result.execution is not None
    window = result.execution
    forms = lyceum_forms(host, GPUS, window.step_ms, scrape_interval_ms)
    path = api_path(ARCHIVED_ID, window)
    queries = lyceum_queries(forms, window)
    progress("Archive: warm-up and check against the hand-written queries")
    base = baseline.run(queries, keep=True)
    assert base.bodies is not None
    result.checks.extend(
        f"same request: {p}"
        for p in verify_lyceum(api.get(path), base.bodies, forms, len(hand_chunks(window)), window)
    )
    same = SameRequest(window)
    api_side = Side("gpulens (archived)", lambda: api.timed(path)[0])
    hand_side = Side("hand-written", lambda: baseline.run(queries).seconds)
    interleaved([api_side, hand_side], repeats, progress, "Archive, same request")
    same.api_s, same.base_s = api_side.seconds, hand_side.seconds
    result.same = same

    for i, w in enumerate(varied_windows(window, repeats)):
        progress(f"Archive, other step/window: round {i + 1}/{repeats}")
        w_forms = lyceum_forms(host, GPUS, w.step_ms, scrape_interval_ms)
        w_queries = lyceum_queries(w_forms, w)
        w_path = api_path(ARCHIVED_ID, w)
        if i % 2 == 0:  # alternate which side goes first
            api_s, api_body = _timed_get(api, w_path)
            hand = baseline.run(w_queries, keep=True)
        else:
            hand = baseline.run(w_queries, keep=True)
            api_s, api_body = _timed_get(api, w_path)
        result.varied.append(VariedRound(w, api_s, hand.seconds))
        result.checks.extend(
            f"round {i + 1} ({w.step_ms // 1000} s step): {p}"
            for p in verify_lyceum(api_body, hand.bodies or [], w_forms, len(hand_chunks(w)), w)
        )
    return result


def _timed_get(api: ApiClient, path: str) -> tuple[float, bytes]:
    t0 = time.perf_counter()
    body = api.get(path)
    return time.perf_counter() - t0, body
