"""Findings: what went wrong (or was wasted) in an execution, from its 12 Lyceum series. Pure, no I/O.

The series come at the scrape interval (`(ms, value)` points on the grid `start + k * interval`).
Each condition is a per-point test (thresholds: `catalog.INSIGHT_THRESHOLDS`); a gap in a condition
of at most `smoothing_ms` between two stretches where it holds is bridged, and a stretch shorter
than `min_duration_ms` is dropped, so one long stall is one finding whose `start` and `end` are the
first and last points where the condition holds (within one interval of where it starts and stops).

Kinds: `no_data` (the utilization or CPU series missing), `idle` (utilization ~0, memory free),
`idle_held` (utilization ~0, memory allocated), `input_bound` (utilization low with memory held
while the host CPU or PCIe receive is busy for most of the stretch), `power_throttle` (power at the
limit, SM clock below its peak), `thermal_throttle` (hot, SM clock below its peak, power below the
limit), `memory_pressure` (FB near full), `oom_suspected` (FB near full, then released at once with
utilization to 0, or the run failing right after; the finding starts where FB began its climb) and
`low_utilization` (the whole run, when the utilization outside the stretches above is still low).
"""

from __future__ import annotations

import functools
import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from operator import itemgetter
from typing import Any

import numpy as np

from gpulens.domain import catalog as c
from gpulens.domain.catalog import InsightThresholds

Point = tuple[int, float]  # (unix ms, value)
FloatArray = np.ndarray[Any, np.dtype[np.float64]]
BoolArray = np.ndarray[Any, np.dtype[np.bool_]]


@dataclass(frozen=True, slots=True)
class Samples:
    """A series as two arrays, unix ms and values (what the summary reads: millions of points a month)."""

    t: FloatArray
    v: FloatArray

    def __len__(self) -> int:
        return len(self.t)

    @staticmethod
    def join(parts: Sequence[Samples]) -> Samples:
        if len(parts) == 1:
            return parts[0]
        return Samples(
            np.concatenate([p.t for p in parts]) if parts else np.empty(0),
            np.concatenate([p.v for p in parts]) if parts else np.empty(0),
        )


PointsLike = Sequence[Point] | Samples  # a series: (ms, value) pairs or the same as arrays

UTIL = "gpuUtilizationPercent"
FB = "gpuMemoryUtilizationPercent"
TEMP = "gpuTemperatureCelsius"
POWER = "gpuPowerWatt"
LIMIT = "gpuPowerLimitWatt"
SM_CLOCK = "gpuClockSmMhz"
PCIE_RX = "gpuPcieThroughputRxBytesPerSec"
CPU = "systemCpuUsagePercent"
assert {UTIL, FB, TEMP, POWER, LIMIT, SM_CLOCK, PCIE_RX, CPU} <= set(c.LYCEUM_KEYS)

FAILED_STATUSES = ("failed", "system_failure")


@dataclass(frozen=True, slots=True)
class RunInfo:
    """The execution around the series: its window, scrape interval, status and GPUs."""

    start_ms: int
    end_ms: int
    interval_ms: int
    status: str = "completed"
    ended_ms: int | None = None  # the execution's end, when it has ended
    gpus: tuple[str, ...] = ()  # as registered (empty: every GPU of the host)
    gpu_count: int = 0  # how many GPUs the series cover (0: unknown)


@dataclass(frozen=True, slots=True)
class Finding:
    kind: str
    severity: str
    start_ms: int
    end_ms: int
    gpus: tuple[str, ...]
    message: str
    evidence: dict[str, float | int | str | list[str]] = field(default_factory=dict)
    gpu_count: int = 0  # how many of the execution's GPUs it concerns (0: all of them)


class Grid:
    """The series on the grid `start + k * interval`; None where a series has no point."""

    def __init__(self, series: Mapping[str, PointsLike], run: RunInfo, held_ms: int | None = None) -> None:
        """`held_ms`: the series are on a coarser grid (a multiple of the interval); each point stands
        for the grid points of the `held_ms` before it, as a range query's point does."""
        self.run = run
        self.interval = run.interval_ms
        self.n = max(0, (run.end_ms - run.start_ms) // run.interval_ms + 1)
        self.values: dict[str, list[float | None]] = {}  # as lists, made when first asked for
        span = max(1, (held_ms or run.interval_ms) // run.interval_ms)
        self.arrays: dict[str, FloatArray] = {}  # the columns, NaN where no point (for vector tests)
        for key in c.LYCEUM_KEYS:
            self.arrays[key] = _column(series.get(key, ()), run, self.n, span)

    @functools.cached_property
    def times(self) -> list[int]:
        return [self.run.start_ms + k * self.interval for k in range(self.n)]

    def __getitem__(self, key: str) -> list[float | None]:
        col = self.values.get(key)
        if col is None:
            out = self.arrays[key].astype(object)
            out[np.isnan(self.arrays[key])] = None  # no point
            col = self.values[key] = out.tolist()
        return col

    def has(self, key: str) -> bool:
        return bool((~np.isnan(self.arrays[key])).any())

    def duration(self, i0: int, i1: int) -> int:
        """ms covered by the points i0..i1 (each stands for the interval before it, inside the window)."""
        return (i1 - i0 + (1 if i0 > 0 else 0)) * self.interval


def as_arrays(points: PointsLike) -> tuple[FloatArray, FloatArray]:
    """(times, values) of the points as two float arrays (unzipped in C: numpy's own conversion of a
    list of pairs is several times slower)."""
    if isinstance(points, Samples):
        return points.t, points.v
    n = len(points)
    return (
        np.fromiter(map(itemgetter(0), points), dtype=np.float64, count=n),
        np.fromiter(map(itemgetter(1), points), dtype=np.float64, count=n),
    )


def _column(points: PointsLike, run: RunInfo, n: int, span: int) -> FloatArray:
    """The points placed on the run's grid (the nearest grid point; a later point wins), each also
    filling the `span - 1` grid points before it; NaN where no point lands (as arrays: a month at 15 s
    is 172,800 grid points a series)."""
    if not points or n == 0:
        return np.full(n, np.nan)
    t, v = as_arrays(points)
    k = np.rint((t - run.start_ms) / run.interval_ms).astype(np.int64)
    ok = (k >= 0) & (k < n) & np.isfinite(v)
    k, v = k[ok], v[ok]
    col = np.full(n, np.nan)
    for d in range(span):  # grid point i takes the latest point within span of it: largest d last
        i = k - d
        inside = i >= 0
        col[i[inside]] = v[inside]
    return col


def _run_bounds(
    mask: Sequence[bool] | np.ndarray[Any, Any],
) -> tuple[np.ndarray[Any, np.dtype[np.intp]], ...]:
    """First and last indices of the runs of True (arrays)."""
    on = np.asarray(mask, dtype=np.int8)
    edges = np.diff(np.concatenate(([0], on, [0])))
    return np.flatnonzero(edges == 1), np.flatnonzero(edges == -1) - 1


def smooth(mask: Sequence[bool] | BoolArray, max_gap: int) -> list[bool]:
    """`mask` with every run of at most `max_gap` False points between two True points set True."""
    smoothed: list[bool] = _smoothed(mask, max_gap).tolist()
    return smoothed


def _smoothed(mask: Sequence[bool] | BoolArray, max_gap: int) -> BoolArray:
    out = np.array(mask, dtype=bool)  # a copy
    starts, ends = _run_bounds(~out)
    inner = (starts > 0) & (ends < len(out) - 1) & (ends - starts + 1 <= max_gap)
    for a, b in zip(starts[inner].tolist(), ends[inner].tolist(), strict=True):
        out[a : b + 1] = True
    return out


def runs(mask: Sequence[bool] | BoolArray) -> list[tuple[int, int]]:
    """(first, last) index of every run of True."""
    starts, ends = _run_bounds(mask)
    return list(zip(starts.tolist(), ends.tolist(), strict=True))


def stretches(
    grid: Grid, mask: Sequence[bool] | BoolArray, th: InsightThresholds, min_ms: int | None = None
) -> list[tuple[int, int]]:
    """Smoothed runs of `mask` lasting at least `min_ms` (default: the minimum duration)."""
    gap = th.smoothing_ms // grid.interval
    least = th.min_duration_ms if min_ms is None else min_ms
    return [(a, b) for a, b in runs(_smoothed(mask, gap)) if grid.duration(a, b) >= least]


def mean_of(values: Sequence[float | None], i0: int, i1: int) -> float | None:
    present = [v for v in values[i0 : i1 + 1] if v is not None]
    return math.fsum(present) / len(present) if present else None


def max_of(values: Sequence[float | None], i0: int, i1: int) -> float | None:
    present = [v for v in values[i0 : i1 + 1] if v is not None]
    return max(present) if present else None


def min_of(values: Sequence[float | None], i0: int, i1: int) -> float | None:
    present = [v for v in values[i0 : i1 + 1] if v is not None]
    return min(present) if present else None


def format_duration(ms: int) -> str:
    """`45 s`, `12 min`, `2 h 5 min`."""
    seconds = round(ms / 1000)
    if seconds < 120:
        return f"{seconds} s"
    minutes = round(seconds / 60)
    if minutes < 60:
        return f"{minutes} min"
    hours, rest = divmod(minutes, 60)
    return f"{hours} h {rest} min" if rest else f"{hours} h"


def _r(v: float | None, digits: int = 1) -> float:
    return round(v, digits) if v is not None else 0.0


def _overlaps(a: tuple[int, int], others: Sequence[tuple[int, int]]) -> bool:
    return any(a[0] <= b[1] and b[0] <= a[1] for b in others)


def _unused_mask(
    util: FloatArray, fb: FloatArray, others: Sequence[FloatArray], held: bool, th: InsightThresholds
) -> BoolArray:
    """Points where this GPU computes nothing (with its memory held or not) while another GPU works
    (arrays with NaN for no point: a comparison with NaN is false, as with None before)."""
    on = (util < th.idle_util_percent) & ((fb >= th.memory_held_percent) == held)
    working = np.zeros(len(util), dtype=bool)
    for o in others:
        working |= o >= th.idle_util_percent
    unused: BoolArray = on & working
    return unused


class _Detector:
    def __init__(self, grid: Grid, th: InsightThresholds) -> None:
        self.g = grid
        self.th = th
        self.found: list[Finding] = []

    def add(
        self,
        kind: str,
        i0: int,
        i1: int,
        message: str,
        evidence: dict[str, float | int | str | list[str]],
        gpus: tuple[str, ...] | None = None,
    ) -> None:
        g = self.g
        duration = g.duration(i0, i1)
        severity = c.INSIGHT_SEVERITY[kind]
        if kind in ("idle", "idle_held") and duration >= self.th.long_idle_ms:
            severity = "critical"
        evidence = {"durationSeconds": duration // 1000, **evidence}
        self.found.append(
            Finding(
                kind,
                severity,
                g.times[i0],
                g.times[i1],
                g.run.gpus if gpus is None else gpus,
                message,
                evidence,
                0 if gpus is None else len(gpus),
            )
        )

    # -- kinds ----------------------------------------------------------------------------------------
    def no_data(self, gpu_run: bool) -> None:
        g = self.g
        keys = ([UTIL] if gpu_run else []) + ([CPU] if g.has(CPU) or not gpu_run else [])
        missing = np.zeros(g.n, dtype=bool)
        for key in keys:  # as arrays: a month at 15 s is 172,800 grid points
            missing |= np.isnan(g.arrays[key])
        for i0, i1 in stretches(g, missing, self.th):
            absent = [key for key in keys if any(v is None for v in g[key][i0 : i1 + 1])]
            dur = format_duration(g.duration(i0, i1))
            self.add(
                "no_data",
                i0,
                i1,
                f"No samples of {', '.join(absent)} for {dur}: the exporter or its scrape stopped "
                "(or the host was down); the statistics leave this time out.",
                {"series": absent, "missingSamples": int(missing[i0 : i1 + 1].sum())},
            )

    def gpu_kinds(self, grids: Mapping[str, Grid] | None = None) -> None:
        g, th = self.g, self.th
        util, fb, cpu, rx = g[UTIL], g[FB], g[CPU], g[PCIE_RX]
        per_gpu = g.run.gpu_count

        # the point-wise tests as arrays (NaN, no point, compares False: a missing point is neither
        # low, held nor busy)
        a = g.arrays
        with np.errstate(invalid="ignore"):
            low_idle = a[UTIL] < th.idle_util_percent
            low_input = a[UTIL] < th.input_bound_util_percent
            held = a[FB] >= th.memory_held_percent
            busy = a[CPU] >= th.cpu_busy_percent
            if per_gpu > 0:
                busy |= a[PCIE_RX] / per_gpu >= th.pcie_rx_busy_bytes_per_gpu

        idle = stretches(g, low_idle & ~held, th)
        for i0, i1 in idle:
            u, m = mean_of(util, i0, i1), mean_of(fb, i0, i1)
            self.add(
                "idle",
                i0,
                i1,
                f"The GPUs were idle for {format_duration(g.duration(i0, i1))} (utilization {_r(u):.0f} %, "
                f"memory {_r(m):.0f} % used): release them while the job does not need them, or check "
                "that its GPU work started.",
                {"meanUtilizationPercent": _r(u), "meanMemoryPercent": _r(m)},
            )

        inputs: list[tuple[int, int]] = []
        for i0, i1 in stretches(g, low_input & held, th):
            share = int(busy[i0 : i1 + 1].sum()) / (i1 - i0 + 1)
            if share < th.input_bound_busy_fraction:
                continue
            inputs.append((i0, i1))
            u, cv = mean_of(util, i0, i1), mean_of(cpu, i0, i1)
            r = mean_of(rx, i0, i1)
            self.add(
                "input_bound",
                i0,
                i1,
                f"GPU utilization averaged {_r(u):.0f} % for {format_duration(g.duration(i0, i1))} while "
                f"the host CPU was {_r(cv):.0f} % busy: the input pipeline is the bottleneck; try more "
                "DataLoader workers, faster storage or preprocessing on the GPU.",
                {
                    "meanUtilizationPercent": _r(u),
                    "meanCpuPercent": _r(cv),
                    "busyShare": _r(share, 3),
                    "meanPcieRxBytesPerSec": _r(r, 0),
                },
            )

        held_idle = stretches(g, low_idle & held, th)
        held_idle = [s for s in held_idle if not _overlaps(s, inputs)]
        for i0, i1 in held_idle:
            u, m = mean_of(util, i0, i1), mean_of(fb, i0, i1)
            self.add(
                "idle_held",
                i0,
                i1,
                f"GPU utilization was {_r(u):.0f} % for {format_duration(g.duration(i0, i1))} while "
                f"{_r(m):.0f} % of GPU memory stayed allocated: the job held the GPUs without using them; "
                "free them between stages or end the job when its GPU work is done.",
                {"meanUtilizationPercent": _r(u), "meanMemoryPercent": _r(m)},
            )

        self.throttles()
        self.memory()
        unused = self.unused_gpus(grids) if grids is not None and len(grids) > 1 else {}
        if grids is not None and len(grids) > 2:
            self.imbalance(grids)
        self.low_utilization(idle + inputs + held_idle, grids or {}, unused)

    def throttles(self) -> None:
        g, th = self.g, self.th
        if not g.has(SM_CLOCK):
            return
        peak = float(np.nanmax(g.arrays[SM_CLOCK]))  # over the whole run: no list of it needed
        if peak <= 0:
            return
        power, limit, clock, temp = g[POWER], g[LIMIT], g[SM_CLOCK], g[TEMP]

        a = g.arrays  # the point-wise tests as arrays (NaN, no point, compares False)
        with np.errstate(invalid="ignore"):
            working = a[UTIL] >= th.idle_util_percent
            down = a[SM_CLOCK] < th.clock_down_fraction * peak
            at_limit = (a[LIMIT] > 0) & (a[POWER] >= th.power_limit_fraction * a[LIMIT])
            hot = a[TEMP] >= th.hot_celsius

        for i0, i1 in stretches(g, working & down & at_limit, th):
            p, lim, s = mean_of(power, i0, i1), mean_of(limit, i0, i1), mean_of(clock, i0, i1)
            t = max_of(temp, i0, i1)
            self.add(
                "power_throttle",
                i0,
                i1,
                f"Power was at its limit ({_r(p):.0f} of {_r(lim):.0f} W) for "
                f"{format_duration(g.duration(i0, i1))} and the SM clock fell to {_r(s):.0f} MHz "
                f"({100 * _r(s) / peak:.0f} % of its {peak:.0f} MHz peak): the GPUs are power-capped; "
                "check the power limit (nvidia-smi -q -d POWER) and the node's cooling.",
                {
                    "meanPowerWatt": _r(p),
                    "meanPowerLimitWatt": _r(lim),
                    "meanSmClockMhz": _r(s),
                    "peakSmClockMhz": _r(peak),
                    "maxTemperatureCelsius": _r(t),
                },
            )
        for i0, i1 in stretches(g, working & down & hot & ~at_limit, th):
            s, t = mean_of(clock, i0, i1), max_of(temp, i0, i1)
            self.add(
                "thermal_throttle",
                i0,
                i1,
                f"The hottest GPU reached {_r(t):.0f} °C for {format_duration(g.duration(i0, i1))} and the "
                f"SM clock fell to {_r(s):.0f} MHz ({100 * _r(s) / peak:.0f} % of its {peak:.0f} MHz peak) "
                "below the power limit: the GPUs are thermally throttled; check the node's cooling "
                "and airflow.",
                {"maxTemperatureCelsius": _r(t), "meanSmClockMhz": _r(s), "peakSmClockMhz": _r(peak)},
            )

    def memory(self) -> None:
        g, th = self.g, self.th
        fb, util = g[FB], g[UTIL]
        run = g.run

        with np.errstate(invalid="ignore"):
            full = g.arrays[FB] >= th.memory_full_percent  # NaN, no point: not full

        oom: list[tuple[int, int]] = []
        for i0, i1 in stretches(g, full, th, min_ms=0):
            peak = max_of(fb, i0, i1)
            after = fb[i1 + 1] if i1 + 1 < g.n else None
            last = fb[i1]
            assert last is not None
            released = False
            if after is not None and last - after >= th.oom_drop_percent:
                span = max(1, th.min_duration_ms // g.interval)
                u_after = mean_of(util, i1 + 1, min(g.n - 1, i1 + span))
                released = u_after is not None and u_after < th.idle_util_percent
            failed = (
                run.status in FAILED_STATUSES
                and run.ended_ms is not None
                and run.ended_ms - g.times[i1] <= th.oom_end_ms
            )
            if not (released or failed):
                continue
            start = i0  # back to where FB began its climb
            while start > 0:
                prev, cur = fb[start - 1], fb[start]
                if prev is None or cur is None or cur - prev <= th.oom_climb_step_percent:
                    break
                start -= 1
            oom.append((start, i1))
            base = fb[start]
            how = "the run failed" if failed else "it was released at once and utilization fell to 0"
            self.add(
                "oom_suspected",
                start,
                i1,
                f"GPU memory climbed from {_r(base):.0f} % to {_r(peak):.0f} % over "
                f"{format_duration(g.duration(start, i1))} and then {how}: likely out of memory; reduce "
                "the batch size, use activation checkpointing or mixed precision, or look for a leak.",
                {
                    "startMemoryPercent": _r(base),
                    "peakMemoryPercent": _r(peak),
                    "afterMemoryPercent": _r(after) if after is not None and not failed else _r(last),
                    "runFailed": "true" if failed else "false",
                },
            )
        for i0, i1 in stretches(g, full, th):
            if _overlaps((i0, i1), oom):
                continue
            m = mean_of(fb, i0, i1)
            self.add(
                "memory_pressure",
                i0,
                i1,
                f"GPU memory was {_r(m):.0f} % full for {format_duration(g.duration(i0, i1))}: close to "
                "out of memory; reduce the batch size or use activation checkpointing (frameworks that "
                "reserve all memory up front, like JAX or TensorFlow, look like this too).",
                {"meanMemoryPercent": _r(m), "peakMemoryPercent": _r(max_of(fb, i0, i1))},
            )

    def imbalance(self, grids: Mapping[str, Grid]) -> None:
        """A working GPU far from the median of the execution's working GPUs (a straggler, or one doing
        extra work), where at least three work: the median names the odd one out. GPUs that sit unused
        are the `idle` findings' and left out."""
        g, th = self.g, self.th
        utils = {gpu: grid.arrays[UTIL] for gpu, grid in grids.items()}
        working = np.vstack([u >= th.idle_util_percent for u in utils.values()])  # NaN: not working
        values = np.where(working, np.vstack(list(utils.values())), np.nan)
        with warnings.catch_warnings():  # points where no GPU works: NaN, left out below
            warnings.simplefilter("ignore", RuntimeWarning)
            median = np.nanmedian(values, axis=0)
        enough = working.sum(axis=0) >= 3
        for row, (gpu, u) in enumerate(utils.items()):
            far = working[row] & enough & (np.abs(u - median) >= th.imbalance_util_points)
            for i0, i1 in stretches(g, far, th):
                mine = float(np.nanmean(u[i0 : i1 + 1]))
                typical = float(np.nanmean(median[i0 : i1 + 1]))
                self.add(
                    "gpu_imbalance",
                    i0,
                    i1,
                    f"GPU {gpu} ran at {_r(mine):.0f} % utilization while the execution's GPUs typically "
                    f"ran at {_r(typical):.0f} % for {format_duration(g.duration(i0, i1))}: the work is "
                    "split unevenly (a straggler rank, uneven shards, or one GPU doing extra work such as "
                    "evaluation or logging); check the data sharding and what each rank does.",
                    {"meanUtilizationPercent": _r(mine), "medianUtilizationPercent": _r(typical)},
                    (gpu,),
                )

    def unused_gpus(self, grids: Mapping[str, Grid]) -> dict[str, set[int]]:
        """Idle (or idle-held) stretches of single GPUs while another GPU of the execution works; returns
        the points each GPU sat unused at."""
        g, th = self.g, self.th
        utils = {gpu: grid.arrays[UTIL] for gpu, grid in grids.items()}
        hits: dict[str, list[tuple[int, int, str]]] = {"idle": [], "idle_held": []}
        for gpu, grid in grids.items():
            others = [u for o, u in utils.items() if o != gpu]
            for kind, held in (("idle", False), ("idle_held", True)):
                mask = _unused_mask(grid.arrays[UTIL], grid.arrays[FB], others, held, th)
                hits[kind].extend((i0, i1, gpu) for i0, i1 in stretches(g, mask, th))
        unused: dict[str, set[int]] = {}
        for i0, i1, gpu in hits["idle"] + hits["idle_held"]:
            unused.setdefault(gpu, set()).update(range(i0, i1 + 1))
        near = th.smoothing_ms // g.interval + 1
        for kind, found in hits.items():
            clusters: list[list[tuple[int, int, str]]] = []
            for hit in sorted(found):
                for cluster in clusters:
                    if abs(cluster[0][0] - hit[0]) <= near and abs(cluster[0][1] - hit[1]) <= near:
                        cluster.append(hit)
                        break
                else:
                    clusters.append([hit])
            for cluster in clusters:
                i0, i1 = min(h[0] for h in cluster), max(h[1] for h in cluster)
                gpus = tuple(sorted({h[2] for h in cluster}, key=lambda x: (len(x), x)))
                u = mean_of([mean_of(grids[gp][UTIL], i0, i1) for gp in gpus], 0, len(gpus) - 1)
                m = mean_of([mean_of(grids[gp][FB], i0, i1) for gp in gpus], 0, len(gpus) - 1)
                which = ("GPU " if len(gpus) == 1 else "GPUs ") + ", ".join(gpus)
                verb = "was" if len(gpus) == 1 else "were"
                memory = f"{_r(m):.0f} % of memory allocated" if kind == "idle_held" else "memory free"
                self.add(
                    kind,
                    i0,
                    i1,
                    f"{which} {verb} at {_r(u):.0f} % utilization ({memory}) for "
                    f"{format_duration(g.duration(i0, i1))} while the execution's other GPUs worked: ask "
                    "for fewer GPUs, or check that the job spreads its work over all of them (one process "
                    "per GPU).",
                    {"meanUtilizationPercent": _r(u), "meanMemoryPercent": _r(m), "idleGpus": list(gpus)},
                    gpus,
                )
        return unused

    def low_utilization(
        self,
        explained: Sequence[tuple[int, int]],
        per_gpu: Mapping[str, Grid],
        unused: Mapping[str, set[int]],
    ) -> None:
        """Over the whole run, from the points no finding explains (and, with per-GPU series, from the
        GPUs that were not sitting unused at each point)."""
        g, th = self.g, self.th
        util = g[UTIL]
        free = ~np.isnan(g.arrays[UTIL])  # points with a value that no finding explains
        for i0, i1 in explained:
            free[i0 : i1 + 1] = False
        counted = int(free.sum())
        rest: list[float] = []
        if not unused:
            rest = g.arrays[UTIL][free].tolist()
        else:
            for gpu, grid in per_gpu.items():
                mine = free & ~np.isnan(grid.arrays[UTIL])
                if unused.get(gpu):
                    mine[sorted(unused[gpu])] = False
                rest += grid.arrays[UTIL][mine].tolist()
        present = np.flatnonzero(~np.isnan(g.arrays[UTIL])).tolist()
        if not rest or not present or counted * g.interval < th.min_duration_ms:
            return
        mean_rest = math.fsum(rest) / len(rest)
        if mean_rest >= th.low_util_percent:
            return
        i0, i1 = present[0], present[-1]
        mean_all = mean_of(util, i0, i1)
        self.add(
            "low_utilization",
            i0,
            i1,
            f"GPU utilization averaged {_r(mean_all):.0f} % over {format_duration(g.duration(i0, i1))} "
            f"({_r(mean_rest):.0f} % outside idle or input-bound stretches and unused GPUs): the GPUs "
            "mostly waited; try a larger batch size or fewer GPUs, and profile a step to see where the "
            "time goes.",
            {"meanUtilizationPercent": _r(mean_all), "meanUtilizationUnexplainedPercent": _r(mean_rest)},
        )


def findings(
    series: Mapping[str, PointsLike],
    run: RunInfo,
    thresholds: InsightThresholds = c.INSIGHT_THRESHOLDS,
    per_gpu: Mapping[str, Mapping[str, PointsLike]] | None = None,
    per_gpu_interval_ms: int | None = None,
) -> list[Finding]:
    """Every finding of one execution's series, ordered by start (then kind).

    `per_gpu` (GPU id -> its utilization and FB % series) adds `idle`/`idle_held` findings for the
    GPUs that sit unused while others of the execution work (their `gpus` name them); on long windows
    they come on a coarser grid, `per_gpu_interval_ms` (edges then within one of its steps).
    """
    grid = Grid(series, run)
    if grid.n == 0:
        return []
    det = _Detector(grid, thresholds)
    gpu_run = grid.has(UTIL) or run.gpu_count > 0 or bool(run.gpus)
    det.no_data(gpu_run)
    if grid.has(UTIL):
        held = per_gpu_interval_ms if per_gpu_interval_ms and per_gpu_interval_ms > run.interval_ms else None
        grids = None if per_gpu is None else {gpu: Grid(s, run, held) for gpu, s in per_gpu.items()}
        det.gpu_kinds(grids)
    return sorted(det.found, key=lambda f: (f.start_ms, f.kind))
