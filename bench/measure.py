"""Both sides timed in interleaved rounds, backend CPU per request, figures checked against targets."""

from __future__ import annotations

import math
import os
import re
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

CPU_BATCH_S = 2.0  # wall seconds a CPU batch aims at: process_cpu_seconds_total ticks every 10 ms
CPU_MIN_N = 5
CPU_MAX_N = 40
_CPU_LINE = re.compile(rb"^process_cpu_seconds_total(?:\{[^}]*\})? ([0-9.eE+-]+)", re.MULTILINE)


def percentile(values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    s = sorted(values)
    if not s:
        return math.nan
    pos = (len(s) - 1) * q
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def ratio(a: float, b: float) -> float:
    return a / b if b and math.isfinite(a) and math.isfinite(b) else math.nan


@dataclass
class Side:
    """One way to get the same answer: `call()` makes one request (all of its queries) and returns seconds."""

    name: str
    call: Callable[[], float]
    seconds: list[float] = field(default_factory=list)
    cpu_per_request: float = math.nan  # the backend's CPU seconds per request (the figure used)
    cpu_metrics_per_request: float = math.nan  # from its /metrics process_cpu_seconds_total
    cpu_proc_per_request: float = math.nan  # from /proc/<pid>/stat
    cpu_requests: int = 0

    @property
    def p50(self) -> float:
        return percentile(self.seconds, 0.5)


def interleaved(sides: Sequence[Side], rounds: int, progress: Callable[[str], None], label: str) -> None:
    """`rounds` rounds, every side once per round; odd rounds in reverse order, so none always goes first."""
    for i in range(rounds):
        progress(f"{label}: round {i + 1}/{rounds}")
        for side in sides if i % 2 == 0 else list(reversed(sides)):
            side.seconds.append(side.call())


def backend_cpu_seconds(base_url: str) -> float:
    """`process_cpu_seconds_total` from the backend's own /metrics (Prometheus and VictoriaMetrics)."""
    with urllib.request.urlopen(base_url.rstrip("/") + "/metrics", timeout=30) as resp:
        found = _CPU_LINE.search(resp.read())
    if found is None:
        raise RuntimeError(f"{base_url}/metrics has no process_cpu_seconds_total")
    return float(found.group(1))


def cpu_batch_size(p50_s: float) -> int:
    """Requests per CPU batch: at least CPU_MIN_N, and about CPU_BATCH_S of wall time."""
    if not math.isfinite(p50_s) or p50_s <= 0:
        return CPU_MIN_N
    return max(CPU_MIN_N, min(CPU_MAX_N, math.ceil(CPU_BATCH_S / p50_s)))


def proc_cpu_seconds(pid: int) -> float:
    """utime + stime of a process (its threads included) from /proc/<pid>/stat."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure_cpu(
    sides: Sequence[Side],
    base_url: str,
    pid: int,
    n: int,
    progress: Callable[[str], None],
    label: str,
    *,
    use_proc: bool = False,
    extra: dict[str, Callable[[], float]] | None = None,
) -> dict[str, dict[str, float]]:
    """A batch of `n` requests per side (one side at a time), the backend's CPU read before and after
    from its /metrics and from /proc/<pid>/stat: each side's `cpu_per_request` is the /metrics figure,
    or /proc's with `use_proc` (VictoriaMetrics 1.79's /metrics value lags by about a second: a batch
    of 40 one-hour reads that /proc counts 0.37 s for read 0 s there). `extra`: more CPU clocks read
    around each batch (e.g. the gpulens server's), returned per side and clock as seconds per request."""
    out: dict[str, dict[str, float]] = {}
    for side in sides:
        progress(f"{label}: backend CPU, {n} requests of {side.name}")
        clocks = {name: read() for name, read in (extra or {}).items()}
        before, before_proc = backend_cpu_seconds(base_url), proc_cpu_seconds(pid)
        for _ in range(n):
            side.call()
        after, after_proc = backend_cpu_seconds(base_url), proc_cpu_seconds(pid)
        side.cpu_metrics_per_request = (after - before) / n
        side.cpu_proc_per_request = (after_proc - before_proc) / n
        side.cpu_per_request = side.cpu_proc_per_request if use_proc else side.cpu_metrics_per_request
        side.cpu_requests = n
        out[side.name] = {name: (read() - clocks[name]) / n for name, read in (extra or {}).items()}
    return out


@dataclass(frozen=True)
class Figure:
    """One measured figure and its target (`value <= target` passes, `>=` when `higher`); None/NaN: n/a."""

    name: str
    value: float | None
    target: float | None
    unit: str = "x"
    note: str = ""
    higher: bool = False  # higher is better (a rate)

    @property
    def measured(self) -> bool:
        return self.value is not None and math.isfinite(self.value)

    @property
    def verdict(self) -> str:
        if not self.measured:
            return "n/a"
        if self.target is None:
            return "-"
        assert self.value is not None
        ok = self.value >= self.target if self.higher else self.value <= self.target
        return "PASS" if ok else "MISS"

    def _number(self, value: float) -> str:
        if abs(value) >= 1000 or (self.unit not in ("x", "s") and value.is_integer()):
            return f"{value:,.0f}"
        return f"{value:.2f}"

    def _with_unit(self, value: float) -> str:
        return self._number(value) + ("x" if self.unit == "x" else f" {self.unit}".rstrip())

    def text(self) -> str:
        if not self.measured:
            return "n/a"
        assert self.value is not None
        return self._with_unit(self.value)

    def target_text(self) -> str:
        if self.target is None:
            return "-"
        return (">= " if self.higher else "<= ") + self._with_unit(self.target)

    def as_json(self) -> dict[str, object]:
        return {
            "name": self.name,
            "value": self.value if self.measured else None,
            "unit": self.unit,
            "target": self.target,
            "target_is_minimum": self.higher,
            "verdict": self.verdict,
            "note": self.note,
        }


def timed(call: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    call()
    return time.perf_counter() - t0
