"""Findings: what went wrong (or was wasted) in an execution, from its 12 Lyceum series. Pure, no I/O.

The series come at the scrape interval (`(ms, value)` points on the grid `start + k * interval`).
Each kind finds *episodes* (`findings_core`): enter and exit thresholds (`catalog.INSIGHT_THRESHOLDS`),
holes up to the smoothing gap bridged, a minimum duration in time and in samples. An episode is
classified as a whole (idle or idle_held by its mean memory, power or thermal throttling by what
dominates it) and gives one finding; an episode concerning several GPUs at once is one finding
listing them.

Kinds: `no_data` (the utilization or CPU series missing), `idle` (utilization ~0, memory free),
`idle_held` (utilization ~0, memory allocated), `input_bound` (utilization low with memory held
while the host CPU or PCIe receive is busy), `power_throttle` / `thermal_throttle` (SM clock below
its robust peak while at the power limit, or hot under it), `memory_pressure` (FB near full),
`oom_suspected` (FB near full, then released at once with utilization to 0, or the run failing right
after; the finding starts where FB began its climb), `gpu_imbalance` (a working GPU far from the
others), and `low_utilization` (the whole run, when the utilization outside the stretches above is
still low). A host-level idle, idle_held or input_bound finding explains the GPU-moments inside it:
no per-GPU finding is made there.

Each finding gets an impact (`gpu_hours`): the GPU-time it concerns that a finding earlier in
`IMPACT_ORDER` does not already claim, so impacts add up to at most the execution's GPU-hours.
Findings come ordered by severity, then impact, largest first.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import replace

import numpy as np

from gpulens.domain import catalog as c
from gpulens.domain.catalog import InsightThresholds
from gpulens.domain.timeparse import human_duration
from gpulens.shaping.findings_core import (
    MS_PER_HOUR,
    BoolArray,
    Finding,
    FloatArray,
    Grid,
    Ledger,
    Point,
    PointsLike,
    RunInfo,
    Samples,
    as_arrays,
    cover,
    episodes,
    hysteresis,
    overlaps,
    rolling_share,
    runs,
    smooth,
)

__all__ = [
    "Finding",
    "Grid",
    "Point",
    "PointsLike",
    "RunInfo",
    "Samples",
    "as_arrays",
    "findings",
    "priced",
    "runs",
    "smooth",
]

UTIL = "gpuUtilizationPercent"
FB = "gpuMemoryUtilizationPercent"
TEMP = "gpuTemperatureCelsius"
POWER = "gpuPowerWatt"
LIMIT = "gpuPowerLimitWatt"
SM_CLOCK = "gpuClockSmMhz"
PCIE_RX = "gpuPcieThroughputRxBytesPerSec"
CPU = "systemCpuUsagePercent"
DETECTOR_KEYS = (UTIL, FB, TEMP, POWER, LIMIT, SM_CLOCK, PCIE_RX, CPU)  # every series `findings` reads
assert set(DETECTOR_KEYS) <= set(c.LYCEUM_KEYS)

FAILED_STATUSES = ("failed", "system_failure")
# who claims a GPU-second first when findings overlap (impact): the specific before the general
IMPACT_ORDER = (
    "oom_suspected",
    "idle",
    "idle_held",
    "input_bound",
    "power_throttle",
    "thermal_throttle",
    "gpu_imbalance",
    "memory_pressure",
    "no_data",
    "low_utilization",
)
assert set(IMPACT_ORDER) == set(c.INSIGHT_SEVERITY)
_RANK = {kind: i for i, kind in enumerate(IMPACT_ORDER)}


def _r(v: float | None, digits: int = 1) -> float:
    return round(v, digits) if v is not None else 0.0


def _gpu_words(gpus: Sequence[str]) -> tuple[str, str]:
    return ("GPU " if len(gpus) == 1 else "GPUs ") + ", ".join(gpus), "was" if len(gpus) == 1 else "were"


def _lt(a: FloatArray, x: float | FloatArray) -> BoolArray:
    with np.errstate(invalid="ignore"):
        out: BoolArray = a < x
    return out


def _ge(a: FloatArray, x: float | FloatArray) -> BoolArray:
    with np.errstate(invalid="ignore"):
        out: BoolArray = a >= x
    return out


class _Detector:
    def __init__(self, grid: Grid, th: InsightThresholds) -> None:
        self.g = grid
        self.th = th
        self.found: list[Finding] = []
        self.explained: list[tuple[int, int]] = []  # host-level idle, idle_held and input_bound spans

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
                g.times(i0),
                g.times(i1),
                g.run.gpus if gpus is None else gpus,
                message,
                evidence,
                0 if gpus is None else len(gpus),
            )
        )

    def episodes(
        self, on: BoolArray, key: str, min_ms: int | None = None, grid: Grid | None = None
    ) -> list[tuple[int, int]]:
        grid = grid or self.g
        return episodes(grid, on, key, self.th, min_ms)

    def present(self, key: str, grid: Grid | None = None) -> BoolArray:
        out: BoolArray = ~np.isnan((grid or self.g).arrays[key])
        return out

    # -- kinds ----------------------------------------------------------------------------------------
    def no_data(self, gpu_run: bool) -> None:
        g = self.g
        keys = ([UTIL] if gpu_run else []) + ([CPU] if g.has(CPU) or not gpu_run else [])
        missing = np.zeros(g.n, dtype=bool)
        for key in keys:  # as arrays: a month at 15 s is 172,800 grid points
            missing |= np.isnan(g.arrays[key])
        for i0, i1 in runs(missing):
            # what the missing points surely span (a lone missing point on a coarse grid says only that
            # one scrape was missed): at least two of them, the minimum duration apart
            if (i1 - i0) * g.interval < self.th.min_duration_ms or i1 == i0:
                continue
            absent = [key for key in keys if np.isnan(g.arrays[key][i0 : i1 + 1]).any()]
            dur = human_duration(g.duration(i0, i1))
            self.add(
                "no_data",
                i0,
                i1,
                f"No samples of {', '.join(absent)} for {dur}: the exporter or its scrape stopped "
                "(or the host was down); the statistics leave this time out.",
                {"series": absent, "missingSamples": int(missing[i0 : i1 + 1].sum())},
            )

    def input_bound(self) -> list[tuple[int, int]]:
        """Stretches of low utilization where the host is busy feeding the GPUs: inside each stretch of
        low utilization (hysteresis), the parts where the local busy share holds (hysteresis on a
        centred window, so a CPU that flickers around its threshold does not split it), widened to the
        stretch's edges when they lie within that window (the CPU's rate lags utilization)."""
        g, th = self.g, self.th
        a = g.arrays
        util, present = a[UTIL], self.present(UTIL)
        low = hysteresis(
            _lt(util, th.input_bound_util_percent),
            _lt(util, th.input_bound_exit_util_percent),
            present,
            g.hole_points(th),
        )
        busy = _ge(a[CPU], th.cpu_busy_percent)
        known = ~np.isnan(a[CPU])
        if g.run.gpu_count > 0:
            rx = a[PCIE_RX] / g.run.gpu_count
            busy |= _ge(rx, th.pcie_rx_busy_bytes_per_gpu)
            known |= ~np.isnan(rx)
        # the busy share of a centred window of 4 minimum durations (16 samples at least), over the low
        # points only (what the CPU did before the stretch says nothing of it): steady enough that a CPU
        # hovering around its threshold keeps one episode
        width = max(16, 4 * th.min_duration_ms // g.interval)
        share = rolling_share(busy, known & low, width)
        fed = hysteresis(
            _ge(share, th.input_bound_busy_fraction),
            _ge(share, th.input_bound_exit_busy_fraction),
            ~np.isnan(share),
            g.hole_points(th),
        )
        found: list[tuple[int, int]] = []
        for lo, hi in runs(low):
            for s0, s1 in runs(fed[lo : hi + 1]):
                i0 = lo if s0 <= width else lo + s0
                i1 = hi if hi - (lo + s1) <= width else lo + s1
                found.append((i0, i1))
        out = []
        for i0, i1 in episodes(g, cover(g.n, found) & low, UTIL, th):
            held = g.mean(FB, i0, i1)
            k = known[i0 : i1 + 1]
            part = float(busy[i0 : i1 + 1][k].mean()) if k.any() else 0.0
            if held is None or held < th.memory_held_percent or part < th.input_bound_busy_fraction:
                continue
            out.append((i0, i1))
            u, cv, r = g.mean(UTIL, i0, i1), g.mean(CPU, i0, i1), g.mean(PCIE_RX, i0, i1)
            self.add(
                "input_bound",
                i0,
                i1,
                f"GPU utilization averaged {_r(u):.0f} % for {human_duration(g.duration(i0, i1))} while "
                f"the host CPU was {_r(cv):.0f} % busy: the input pipeline is the bottleneck; try more "
                "DataLoader workers, faster storage or preprocessing on the GPU.",
                {
                    "meanUtilizationPercent": _r(u),
                    "meanCpuPercent": _r(cv),
                    "busyShare": _r(part, 3),
                    "meanPcieRxBytesPerSec": _r(r, 0),
                    "meanMemoryPercent": _r(held),
                },
            )
        return out

    def idle(self, inputs: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
        """Stretches of utilization ~0 outside the input-bound ones, each `idle` or `idle_held` by its
        mean memory."""
        g, th = self.g, self.th
        util, present = g.arrays[UTIL], self.present(UTIL)
        low = hysteresis(
            _lt(util, th.idle_util_percent), _lt(util, th.idle_exit_util_percent), present, g.hole_points(th)
        )
        low &= ~cover(g.n, inputs, g.gap_points(th))
        out = []
        for i0, i1 in self.episodes(low, UTIL):
            out.append((i0, i1))
            # classified by the points where it held (a bridged blip of work does not tip it)
            u, m = g.mean(UTIL, i0, i1, low), g.mean(FB, i0, i1, low)
            dur = human_duration(g.duration(i0, i1))
            if m is not None and m >= th.memory_held_percent:
                self.add(
                    "idle_held",
                    i0,
                    i1,
                    f"GPU utilization was {_r(u):.0f} % for {dur} while {_r(m):.0f} % of GPU memory stayed "
                    "allocated: the job held the GPUs without using them; free them between stages or end "
                    "the job when its GPU work is done.",
                    {"meanUtilizationPercent": _r(u), "meanMemoryPercent": _r(m)},
                )
            else:
                self.add(
                    "idle",
                    i0,
                    i1,
                    f"The GPUs were idle for {dur} (utilization {_r(u):.0f} %, memory {_r(m):.0f} % used): "
                    "release them while the job does not need them, or check that its GPU work started.",
                    {"meanUtilizationPercent": _r(u), "meanMemoryPercent": _r(m)},
                )
        return out

    def throttles(self) -> None:
        """Stretches where the SM clock is down from the run's robust peak (a quantile of its working
        points, so one boost spike does not set it) while the GPUs work, each classified as a whole:
        power-throttled when most of it is near the power limit, thermally throttled when most of it is
        hot under the limit, and no finding when neither explains the drop."""
        g, th = self.g, self.th
        a = g.arrays
        working = _ge(a[UTIL], th.idle_util_percent)
        clock = a[SM_CLOCK]
        base = clock[working & ~np.isnan(clock)]
        if len(base) < th.min_samples:
            return
        peak = float(np.quantile(base, th.clock_peak_quantile))
        if peak <= 0:
            return
        down = hysteresis(
            working & _lt(clock, th.clock_down_fraction * peak),
            ~_lt(a[UTIL], th.idle_util_percent) & _lt(clock, th.clock_down_exit_fraction * peak),
            self.present(SM_CLOCK),
            g.hole_points(th),
        )
        with np.errstate(invalid="ignore"):
            near_limit = (a[LIMIT] > 0) & (a[POWER] >= th.power_limit_exit_fraction * a[LIMIT])
        hot = _ge(a[TEMP], th.hot_exit_celsius) & ~near_limit
        for i0, i1 in self.episodes(down, SM_CLOCK):
            n = i1 - i0 + 1
            power_share = float(near_limit[i0 : i1 + 1].sum()) / n
            hot_share = float(hot[i0 : i1 + 1].sum()) / n
            s, t = g.mean(SM_CLOCK, i0, i1), g.max(TEMP, i0, i1)
            dur = human_duration(g.duration(i0, i1))
            share = 100 * _r(s) / peak
            drop = f"the SM clock fell to {_r(s):.0f} MHz ({share:.0f} % of its {peak:.0f} MHz peak)"
            if power_share >= max(hot_share, th.throttle_dominance):
                p, lim = g.mean(POWER, i0, i1), g.mean(LIMIT, i0, i1)
                self.add(
                    "power_throttle",
                    i0,
                    i1,
                    f"Power was at its limit ({_r(p):.0f} of {_r(lim):.0f} W) for {dur} and {drop}: the "
                    "GPUs are power-capped; check the power limit (nvidia-smi -q -d POWER) and the node's "
                    "cooling.",
                    {
                        "meanPowerWatt": _r(p),
                        "meanPowerLimitWatt": _r(lim),
                        "meanSmClockMhz": _r(s),
                        "peakSmClockMhz": _r(peak),
                        "maxTemperatureCelsius": _r(t),
                        "atLimitShare": _r(power_share, 3),
                    },
                )
            elif hot_share >= th.throttle_dominance:
                self.add(
                    "thermal_throttle",
                    i0,
                    i1,
                    f"The hottest GPU reached {_r(t):.0f} °C for {dur} and {drop} below the power limit: the "
                    "GPUs are thermally throttled; check the node's cooling and airflow.",
                    {
                        "maxTemperatureCelsius": _r(t),
                        "meanSmClockMhz": _r(s),
                        "peakSmClockMhz": _r(peak),
                        "hotShare": _r(hot_share, 3),
                    },
                )

    def memory(self) -> None:
        g, th = self.g, self.th
        fb = g.arrays[FB]
        run = g.run
        full = hysteresis(
            _ge(fb, th.memory_full_percent),
            _ge(fb, th.memory_full_exit_percent),
            self.present(FB),
            g.hole_points(th),
        )
        oom: list[tuple[int, int]] = []
        for i0, i1 in self.episodes(full, FB, min_ms=0):
            last = float(fb[i1])
            nxt = np.flatnonzero(~np.isnan(fb[i1 + 1 : i1 + 1 + g.hole_points(th)]))
            after = float(fb[i1 + 1 + nxt[0]]) if len(nxt) else None
            released = False
            if after is not None and last - after >= th.oom_drop_percent:
                span = max(th.min_samples, th.min_duration_ms // g.interval)
                j = i1 + 1 + int(nxt[0])
                u_after = g.mean(UTIL, j, min(g.n - 1, j + span))
                released = u_after is not None and u_after < th.idle_util_percent
            failed = (
                run.status in FAILED_STATUSES
                and run.ended_ms is not None
                and run.ended_ms - g.times(i1) <= th.oom_end_ms
            )
            if not (released or failed):
                continue
            start = self._climb_start(i0)
            if g.duration(start, i1) < th.min_duration_ms:
                continue
            oom.append((start, i1))
            base, peak = float(fb[start]), g.max(FB, i0, i1)
            how = "the run failed" if failed else "it was released at once and utilization fell to 0"
            self.add(
                "oom_suspected",
                start,
                i1,
                f"GPU memory climbed from {_r(base):.0f} % to {_r(peak):.0f} % over "
                f"{human_duration(g.duration(start, i1))} and then {how}: likely out of memory; reduce "
                "the batch size, use activation checkpointing or mixed precision, or look for a leak.",
                {
                    "startMemoryPercent": _r(base),
                    "peakMemoryPercent": _r(peak),
                    "afterMemoryPercent": _r(after) if after is not None and not failed else _r(last),
                    "runFailed": "true" if failed else "false",
                },
            )
        for i0, i1 in self.episodes(full, FB):
            if overlaps((i0, i1), oom):
                continue
            m = g.mean(FB, i0, i1)
            self.add(
                "memory_pressure",
                i0,
                i1,
                f"GPU memory was {_r(m):.0f} % full for {human_duration(g.duration(i0, i1))}: close to "
                "out of memory; reduce the batch size or use activation checkpointing (frameworks that "
                "reserve all memory up front, like JAX or TensorFlow, look like this too).",
                {"meanMemoryPercent": _r(m), "peakMemoryPercent": _r(g.max(FB, i0, i1))},
            )

    def _climb_start(self, i0: int) -> int:
        """Where FB began the climb that ends near full at i0. Walking back from i0, a sample lower by
        more than the climb step than the lowest seen so far is still on the climb; the walk stops at a
        sample well above that lowest one (an earlier stage held more), or when no lower sample came for
        `patience` samples: at least 4 minimum durations, and half the climb walked so far (a slow leak
        climbs less per sample than the noise). Over the stretch walked, the climb starts at the break
        of the best fit of a level followed by a line (so noise neither ends the walk early nor moves the
        start)."""
        g, th = self.g, self.th
        fb = g.arrays[FB]
        best, best_v = i0, float(fb[i0])
        least = 4 * max(th.min_samples, th.min_duration_ms // g.interval)
        j = i0
        while j > 0:
            j -= 1
            if best - j > max(least, (i0 - best) // 2):
                break
            v = float(fb[j])
            if math.isnan(v):
                continue
            if v > best_v + 2 * th.oom_climb_noise_percent:  # an earlier stage held more: not this climb
                break
            if v < best_v - th.oom_climb_step_percent:
                best, best_v = j, v
        if best == i0:
            return i0
        return j + level_then_line(fb[j : i0 + 1])

    def imbalance(self, grids: Mapping[str, Grid]) -> None:
        """A working GPU far from the median of the execution's working GPUs (a straggler, or one doing
        extra work), where at least three work: the median names the odd one out. GPUs that sit unused
        are the `idle` findings' and left out; so are the host's explained stretches."""
        th = self.th
        utils = {gpu: grid.arrays[UTIL] for gpu, grid in grids.items()}
        stacked = np.vstack(list(utils.values()))  # GPU x point
        working = _ge(stacked, th.idle_util_percent)  # NaN: not working
        median = column_median(np.where(working, stacked, np.nan))  # NaN where no GPU works: left out
        enough = working.sum(axis=0) >= 3
        known = ~np.isnan(stacked).any(axis=0)  # every GPU's value present
        outside = ~cover(self.g.n, self.explained, self.g.gap_points(th))
        hits: list[tuple[int, int, str]] = []
        for row, (gpu, u) in enumerate(utils.items()):
            grid = grids[gpu]
            gate = working[row] & enough
            far = hysteresis(
                gate & _ge(np.abs(u - median), th.imbalance_util_points),
                ~_lt(u, th.idle_util_percent)
                & ~(known & ~enough)
                & ~_lt(np.abs(u - median), th.imbalance_exit_util_points),
                self.present(UTIL, grid),
                grid.hole_points(th),
            )
            hits += [(i0, i1, gpu) for i0, i1 in self.episodes(far & outside, UTIL, grid=grid)]
        for i0, i1, gpus in _clusters(hits):
            mine = float(np.nanmean([np.nanmean(utils[gp][i0 : i1 + 1]) for gp in gpus]))
            typical = float(np.nanmean(median[i0 : i1 + 1]))
            which, _ = _gpu_words(gpus)
            self.add(
                "gpu_imbalance",
                i0,
                i1,
                f"{which} ran at {_r(mine):.0f} % utilization while the execution's GPUs typically "
                f"ran at {_r(typical):.0f} % for {human_duration(self.g.duration(i0, i1))}: the work is "
                "split unevenly (a straggler rank, uneven shards, or one GPU doing extra work such as "
                "evaluation or logging); check the data sharding and what each rank does.",
                {"meanUtilizationPercent": _r(mine), "medianUtilizationPercent": _r(typical)},
                gpus,
            )

    def unused_gpus(self, grids: Mapping[str, Grid]) -> dict[str, BoolArray]:
        """Idle (or idle-held) stretches of single GPUs while another GPU of the execution really works
        (at the working threshold, well above idle), outside the host's explained stretches; returns
        the points each GPU sat unused at."""
        g, th = self.g, self.th
        utils = {gpu: grid.arrays[UTIL] for gpu, grid in grids.items()}
        outside = ~cover(g.n, self.explained, g.gap_points(th))
        hits: dict[str, list[tuple[int, int, str]]] = {"idle": [], "idle_held": []}
        unused: dict[str, BoolArray] = {}
        others = busiest_others(np.vstack(list(utils.values())))
        for row, (gpu, grid) in enumerate(grids.items()):
            busiest = others[row]
            u = utils[gpu]
            on = hysteresis(
                _lt(u, th.idle_util_percent) & _ge(busiest, th.working_util_percent),
                _lt(u, th.idle_exit_util_percent) & ~_lt(busiest, th.working_exit_util_percent),
                self.present(UTIL, grid),
                grid.hole_points(th),
            )
            for i0, i1 in self.episodes(on & outside, UTIL, grid=grid):
                m = grid.mean(FB, i0, i1, on)
                kind = "idle_held" if m is not None and m >= th.memory_held_percent else "idle"
                hits[kind].append((i0, i1, gpu))
                unused.setdefault(gpu, np.zeros(g.n, dtype=bool))[i0 : i1 + 1] = True
        for kind, found in hits.items():
            for i0, i1, gpus in _clusters(found):
                u_mean = float(np.nanmean([np.nanmean(utils[gp][i0 : i1 + 1]) for gp in gpus]))
                fbs = [grids[gp].mean(FB, i0, i1) for gp in gpus]
                m = (
                    float(np.mean([x for x in fbs if x is not None]))
                    if any(x is not None for x in fbs)
                    else None
                )
                which, verb = _gpu_words(gpus)
                memory = f"{_r(m):.0f} % of memory allocated" if kind == "idle_held" else "memory free"
                self.add(
                    kind,
                    i0,
                    i1,
                    f"{which} {verb} at {_r(u_mean):.0f} % utilization ({memory}) for "
                    f"{human_duration(g.duration(i0, i1))} while the execution's other GPUs worked: ask "
                    "for fewer GPUs, or check that the job spreads its work over all of them (one process "
                    "per GPU).",
                    {
                        "meanUtilizationPercent": _r(u_mean),
                        "meanMemoryPercent": _r(m),
                        "idleGpus": list(gpus),
                    },
                    gpus,
                )
        return unused

    def low_utilization(self, per_gpu: Mapping[str, Grid], unused: Mapping[str, BoolArray]) -> None:
        """Over the whole run, from the points no finding explains (and, with per-GPU series, from the
        GPUs that were not sitting unused at each point)."""
        g, th = self.g, self.th
        util = g.arrays[UTIL]
        free = ~np.isnan(util) & ~cover(g.n, self.explained)  # points with a value no finding explains
        counted = int(free.sum())
        if not unused:
            rest = util[free]
        else:
            parts = []
            for gpu, grid in per_gpu.items():
                mine = free & ~np.isnan(grid.arrays[UTIL])
                if gpu in unused:
                    mine &= ~unused[gpu]
                parts.append(grid.arrays[UTIL][mine])
            rest = np.concatenate(parts) if parts else np.empty(0)
        present = np.flatnonzero(~np.isnan(util))
        if not len(rest) or not len(present) or counted * g.interval < th.min_duration_ms:
            return
        mean_rest = math.fsum(rest.tolist()) / len(rest)
        if mean_rest >= th.low_util_percent:
            return
        i0, i1 = int(present[0]), int(present[-1])
        mean_all = g.mean(UTIL, i0, i1)
        self.add(
            "low_utilization",
            i0,
            i1,
            f"GPU utilization averaged {_r(mean_all):.0f} % over {human_duration(g.duration(i0, i1))} "
            f"({_r(mean_rest):.0f} % outside idle or input-bound stretches and unused GPUs): the GPUs "
            "mostly waited; try a larger batch size or fewer GPUs, and profile a step to see where the "
            "time goes.",
            {"meanUtilizationPercent": _r(mean_all), "meanUtilizationUnexplainedPercent": _r(mean_rest)},
        )


def busiest_others(stacked: FloatArray) -> FloatArray:
    """Row r, point i: the largest value at point i of the rows other than r (NaN where none has one),
    from one pass for the busiest row and the runner-up instead of a stack of the others per row."""
    rows, n = stacked.shape
    if rows < 2:
        return np.full((rows, n), np.nan)
    filled = np.where(np.isnan(stacked), -np.inf, stacked)
    cols = np.arange(n)
    top = np.argmax(filled, axis=0)
    first = filled[top, cols]
    rest = filled.copy()
    rest[top, cols] = -np.inf
    second = rest.max(axis=0)
    out: FloatArray = np.where(np.arange(rows)[:, None] == top, second, first)
    return np.where(np.isneginf(out), np.nan, out)


def column_median(values: FloatArray) -> FloatArray:
    """The median of each column over its values that are not NaN (NaN where none is): np.nanmedian's
    answer, from one sort (NaN sorts last) instead of a masked array."""
    ordered = np.sort(values, axis=0)
    count = (~np.isnan(ordered)).sum(axis=0)
    lo = np.clip((count - 1) // 2, 0, None)
    hi = np.clip(count // 2, 0, None)
    cols = np.arange(values.shape[1])
    median: FloatArray = np.where(
        count > 0, (ordered[lo, cols] + ordered[np.minimum(hi, len(ordered) - 1), cols]) / 2, np.nan
    )
    return median


def level_then_line(y: FloatArray) -> int:
    """The index where a series that holds a level and then climbs starts climbing: the break c that
    minimises the squared error of a constant over y[:c] plus a straight line over y[c:] (each from
    running sums, NaN left out). 0 when there is no level before the line."""
    x = np.arange(len(y), dtype=np.float64)
    ok = ~np.isnan(y)
    w = ok.astype(np.float64)
    yv = np.where(ok, y, 0.0)

    def sums(a: FloatArray) -> FloatArray:
        out: FloatArray = np.concatenate(([0.0], np.cumsum(a)))
        return out

    n, sx, sy = sums(w), sums(w * x), sums(yv)
    sxx, sxy, syy = sums(w * x * x), sums(w * x * yv), sums(yv * yv)
    c = np.arange(1, len(y) - 1)  # the level is y[:c], the line y[c:], each at least one sample
    with np.errstate(invalid="ignore", divide="ignore"):
        n1, y1, yy1 = n[c], sy[c], syy[c]
        level = np.where(n1 > 0, yy1 - y1 * y1 / np.maximum(n1, 1), 0.0)
        n2 = n[-1] - n[c]
        x2, y2 = sx[-1] - sx[c], sy[-1] - sy[c]
        xx2, xy2, yy2 = sxx[-1] - sxx[c], sxy[-1] - sxy[c], syy[-1] - syy[c]
        vx = xx2 - x2 * x2 / np.maximum(n2, 1)
        cov = xy2 - x2 * y2 / np.maximum(n2, 1)
        vy = yy2 - y2 * y2 / np.maximum(n2, 1)
        line = np.where(vx > 0, vy - cov * cov / np.where(vx > 0, vx, 1), np.maximum(vy, 0))
        err = level + line
    if not len(err) or np.isnan(err).all():
        return 0
    return int(c[int(np.nanargmin(err))])


def _clusters(hits: Sequence[tuple[int, int, str]]) -> list[tuple[int, int, tuple[str, ...]]]:
    """Per-GPU stretches of one kind grouped into episodes: a stretch joins a group when it overlaps
    the group's span by at least half of the shorter of the two (the GPUs idled together); each group
    is its span and its GPUs. Stretches come by start, so a group that ends before one starts is
    closed for good (only the open ones are looked at: a month has hundreds of stretches)."""
    groups: list[tuple[int, int, set[str]]] = []
    open_groups: list[int] = []  # indices of the groups that may still grow
    for a, b, gpu in sorted(hits):
        open_groups = [k for k in open_groups if groups[k][1] >= a]
        for k in open_groups:
            x, y, gpus = groups[k]
            common = min(b, y) - max(a, x) + 1
            if common > 0 and common * 2 >= min(b - a + 1, y - x + 1):
                groups[k] = (min(a, x), max(b, y), gpus | {gpu})
                break
        else:
            open_groups.append(len(groups))
            groups.append((a, b, {gpu}))
    return [(a, b, tuple(sorted(gpus, key=lambda x: (len(x), x)))) for a, b, gpus in groups]


def findings(
    series: Mapping[str, PointsLike],
    run: RunInfo,
    thresholds: InsightThresholds = c.INSIGHT_THRESHOLDS,
    per_gpu: Mapping[str, Mapping[str, PointsLike]] | None = None,
    per_gpu_interval_ms: int | None = None,
    kinds: Collection[str] | None = None,
    between: Callable[[], None] | None = None,
) -> list[Finding]:
    """Every finding of one execution's series, with its impact, ordered by severity then impact.

    `per_gpu` (GPU id -> its utilization and FB % series) adds `idle`/`idle_held` findings for the
    GPUs that sit unused while others of the execution work (their `gpus` name them), and
    `gpu_imbalance`; on long windows they come on a coarser grid, `per_gpu_interval_ms` (edges then
    within one of its steps).

    `kinds` (live alerts: the kinds their rules watch): only the findings of the kinds up to the last
    of them in IMPACT_ORDER, each as the full run gives it (impact included: a finding's GPU-hours
    depend only on the kinds before it), and the detectors of the later kinds are not run.

    `between` is called between the detectors (a summary's computation stops or pauses there).
    """

    def step() -> None:
        if between is not None:
            between()

    grid = Grid(series, run)
    if grid.n == 0:
        return []
    upto = len(IMPACT_ORDER) - 1 if kinds is None else max((_RANK[k] for k in kinds), default=-1)

    def wanted(kind: str) -> bool:
        return _RANK[kind] <= upto

    det = _Detector(grid, thresholds)
    gpu_run = grid.has(UTIL) or run.gpu_count > 0 or bool(run.gpus)
    if wanted("no_data"):
        det.no_data(gpu_run)
    if grid.has(UTIL):
        held = per_gpu_interval_ms if per_gpu_interval_ms and per_gpu_interval_ms > run.interval_ms else None
        grids = None if per_gpu is None else {gpu: Grid(s, run, held) for gpu, s in per_gpu.items()}
        step()
        inputs = det.input_bound()  # both explain stretches the later detectors leave out
        step()
        det.explained = [*inputs, *det.idle(inputs)]
        step()
        if wanted("power_throttle"):
            det.throttles()
            step()
        det.memory()  # oom_suspected claims its GPU-time first
        step()
        unused: dict[str, BoolArray] = {}
        if grids is not None and len(grids) > 1 and wanted("idle"):
            unused = det.unused_gpus(grids)
            step()
        if grids is not None and len(grids) > 2 and wanted("gpu_imbalance"):
            det.imbalance(grids)
            step()
        if wanted("low_utilization"):
            det.low_utilization(grids or {}, unused)
            step()
    names = run.gpus or tuple(per_gpu or ())
    return [f for f in ranked(det.found, run, names) if wanted(f.kind)]


def ranked(found: Sequence[Finding], run: RunInfo, names: Sequence[str]) -> list[Finding]:
    """The findings with their impact (GPU-hours charged once, in IMPACT_ORDER), ordered by severity,
    then impact (largest first), then start."""
    ledger = Ledger(run, names)
    order = {k: i for i, k in enumerate(IMPACT_ORDER)}
    out = []
    for f in sorted(found, key=lambda f: (order[f.kind], f.start_ms)):
        out.append(replace(f, gpu_hours=ledger.claim(f) / MS_PER_HOUR))
    return sorted(out, key=lambda f: (c.SEVERITY_RANK[f.severity], -f.gpu_hours, f.start_ms, f.kind))


def priced(found: Sequence[Finding], price: float | None) -> list[Finding]:
    """The findings with the cost of their impact at a GPU-hour price (None: unpriced)."""
    return [replace(f, cost=None if price is None else f.gpu_hours * price) for f in found]
