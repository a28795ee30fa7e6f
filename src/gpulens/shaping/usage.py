"""Statistics, energy and cost of one execution from its series at the scrape interval. Pure, no I/O.

* stats: per series mean, min, max, p50, p95 (linear interpolation between the closest ranks, as
  numpy's default), the number of samples and their coverage (samples / grid points of the window);
* energy: the trapezoid integral of the summed GPU power over consecutive samples at most two
  intervals apart (a longer gap adds nothing: it is a `no_data` finding), in kWh; CO2e from a carbon
  intensity in g/kWh;
* GPU time and cost: GPU-hours (GPU count x the window's length), and the GPU time inside idle,
  idle-held, input-bound and throttling findings (each finding covers its points, one interval each,
  clipped to the window, for the GPUs it is about), each GPU-second charged to at most one of them
  in that order; cost is that time x the price of a GPU-hour; useful GPU-hours integrate
  utilization / 100 x GPUs.
"""

from __future__ import annotations

import math
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from gpulens.domain.usage import UsageSlice
from gpulens.shaping.findings_core import (
    MS_PER_HOUR,
    Finding,
    FloatArray,
    Ledger,
    PointsLike,
    RunInfo,
    as_arrays,
)

JOULES_PER_KWH = 3_600_000.0


@dataclass(frozen=True, slots=True)
class SeriesStats:
    mean: float | None
    min: float | None
    max: float | None
    p50: float | None
    p95: float | None
    samples: int
    coverage: float


def quantile(ordered: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks of a sorted, non-empty sequence."""
    pos = q * (len(ordered) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def grid_points(start_ms: int, end_ms: int, interval_ms: int) -> int:
    return max(0, (end_ms - start_ms) // interval_ms + 1)


def series_stats(points: PointsLike, start_ms: int, end_ms: int, interval_ms: int) -> SeriesStats:
    t, v = as_arrays(points)
    values = v[(t >= start_ms) & (t <= end_ms) & np.isfinite(v)]
    expected = grid_points(start_ms, end_ms, interval_ms)
    coverage = min(1.0, len(values) / expected) if expected else 0.0
    if not len(values):
        return SeriesStats(None, None, None, None, None, 0, coverage)
    ordered = np.sort(values).tolist()
    return SeriesStats(
        math.fsum(ordered) / len(ordered),
        ordered[0],
        ordered[-1],
        quantile(ordered, 0.5),
        quantile(ordered, 0.95),
        len(ordered),
        coverage,
    )


def integral(points: PointsLike, interval_ms: int) -> float:
    """Trapezoid integral (value x seconds) over consecutive samples at most two intervals apart."""
    return math.fsum(_trapezoids(points, interval_ms)[1].tolist())


def _trapezoids(points: PointsLike, interval_ms: int) -> tuple[FloatArray, FloatArray]:
    """(each trapezoid's later sample time, its area in value x seconds), over consecutive samples at
    most two intervals apart with finite values."""
    t, v = as_arrays(points)
    if len(t) < 2:
        return np.empty(0), np.empty(0)
    dt = np.diff(t)
    ok = (dt > 0) & (dt <= 2 * interval_ms) & np.isfinite(v[:-1]) & np.isfinite(v[1:])
    return t[1:][ok], ((v[:-1] + v[1:]) / 2 * dt / 1000)[ok]


@dataclass(frozen=True, slots=True)
class Energy:
    kwh: float
    co2e_kg: float | None
    carbon_intensity_g_per_kwh: float | None
    source: str = "power_integral"
    method: str = "trapezoid"


def energy(
    power: PointsLike,
    interval_ms: int,
    carbon_g_per_kwh: float | None = None,
    counter_mj: float | None = None,
) -> Energy | None:
    """Energy of the GPUs: the increase of DCGM's energy counter when it is exported (`counter_mj`),
    else the integral of the summed power series; None with neither."""
    if counter_mj is not None and math.isfinite(counter_mj) and counter_mj >= 0:
        kwh, source, method = counter_mj / 1000 / JOULES_PER_KWH, "dcgm_energy_counter", "increase"
    elif power:
        kwh, source, method = integral(power, interval_ms) / JOULES_PER_KWH, "power_integral", "trapezoid"
    else:
        return None
    co2 = None if carbon_g_per_kwh is None else kwh * carbon_g_per_kwh / 1000
    return Energy(kwh, co2, carbon_g_per_kwh, source, method)


@dataclass(frozen=True, slots=True)
class Prices:
    currency: str
    gpu_hour: dict[str, float]  # hardware profile -> price of one GPU-hour


def parse_prices(text: str) -> Prices:
    """`currency = "USD"` and a `[gpu_hour]` table of hardware profile -> price (TOML)."""
    doc = tomllib.loads(text)
    currency = doc.get("currency", "USD")
    table = doc.get("gpu_hour", {})
    if not isinstance(currency, str) or not isinstance(table, dict):
        raise ValueError("prices: `currency` must be a string and `gpu_hour` a table")
    prices: dict[str, float] = {}
    for profile, price in table.items():
        if isinstance(price, bool) or not isinstance(price, int | float) or price < 0:
            raise ValueError(f"prices: gpu_hour.{profile} must be a number >= 0")
        prices[profile] = float(price)
    return Prices(currency, prices)


@dataclass(frozen=True, slots=True)
class Cost:
    currency: str
    gpu_hour_price: float
    gpu_hours: float
    total: float
    active: float
    idle: float
    idle_held: float
    input_bound: float
    throttled: float
    useful_gpu_hours: float
    per_useful_gpu_hour: float | None


# The receipt's lines, in the order they claim a GPU-second: each is charged to at most one of them.
RECEIPT_KINDS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("idle", ("idle",)),
    ("idle_held", ("idle_held",)),
    ("input_bound", ("input_bound",)),
    ("throttled", ("power_throttle", "thermal_throttle")),
)


@dataclass(frozen=True, slots=True)
class GpuTime:
    """The execution's GPU-hours and where they went: every GPU-second is charged to at most one of
    idle, idle_held, input_bound, throttled (that priority), so active + idle + idle_held = total and
    input_bound + throttled <= active."""

    total: float
    active: float
    idle: float
    idle_held: float
    input_bound: float
    throttled: float


def gpu_time(
    *,
    start_ms: int,
    end_ms: int,
    interval_ms: int,
    gpu_count: int,
    found: Sequence[Finding],
    gpus: Sequence[str] = (),
) -> GpuTime:
    """GPU-hours by receipt line from the findings (host-level ones concern every GPU, the others
    their `gpus`); `gpus` names the execution's GPUs as the per-GPU findings do."""
    total, lines = gpu_ms(start_ms, end_ms, interval_ms, gpu_count, found, gpus)
    hours = {line: ms / MS_PER_HOUR for line, ms in lines.items()}
    total_h = total / MS_PER_HOUR
    return GpuTime(
        total_h,
        max(0.0, total_h - hours["idle"] - hours["idle_held"]),
        hours["idle"],
        hours["idle_held"],
        hours["input_bound"],
        hours["throttled"],
    )


def gpu_ms(
    start_ms: int,
    end_ms: int,
    interval_ms: int,
    gpu_count: int,
    found: Sequence[Finding],
    gpus: Sequence[str] = (),
) -> tuple[int, dict[str, int]]:
    """(GPU-ms of the window, GPU-ms by receipt line), in whole milliseconds: the ledger's claims are
    pointwise in time, so the GPU-ms of adjacent windows add up to those of their union exactly."""
    ledger = Ledger(RunInfo(start_ms, end_ms, interval_ms, gpus=tuple(gpus), gpu_count=gpu_count), gpus)
    by_start = sorted(found, key=lambda f: f.start_ms)
    lines = {line: sum(ledger.claim(f) for f in by_start if f.kind in kinds) for line, kinds in RECEIPT_KINDS}
    return ledger.total_ms, lines


def hourly(
    *,
    start_ms: int,
    end_ms: int,
    interval_ms: int,
    gpu_count: int,
    found: Sequence[Finding],
    gpus: Sequence[str] = (),
    utilization: PointsLike = (),
    power: PointsLike = (),
) -> list[UsageSlice]:
    """The receipt of the window [start_ms, end_ms] cut at UTC hours: each hour's GPU time by the same
    ledger (`gpu_ms` over the hour, so the hours' GPU-ms add up to the window's exactly), and each
    trapezoid of the utilization and power integrals in the hour its later sample falls in (so they
    add up to `integral` over the window, up to float rounding)."""
    if end_ms <= start_ms:
        return []
    util_parts = _segments_by_hour(utilization, interval_ms)
    power_parts = _segments_by_hour(power, interval_ms)
    out = []
    hour = start_ms - start_ms % MS_PER_HOUR
    while hour < end_ms:
        lo, hi = max(start_ms, hour), min(end_ms, hour + MS_PER_HOUR)
        # the findings whose span (each point stands for the interval before it) meets the hour
        near = [f for f in found if f.start_ms - interval_ms < hi and f.end_ms > lo]
        total, lines = gpu_ms(lo, hi, interval_ms, gpu_count, near, gpus)
        out.append(
            UsageSlice(
                hour,
                lo,
                hi,
                total,
                lines["idle"],
                lines["idle_held"],
                lines["input_bound"],
                lines["throttled"],
                util_parts.get(hour, 0.0) / 100 * gpu_count,
                power_parts.get(hour, 0.0),
            )
        )
        hour += MS_PER_HOUR
    return out


def _segments_by_hour(points: PointsLike, interval_ms: int) -> dict[int, float]:
    """`integral`'s trapezoids (value x seconds) summed by the UTC hour of each one's later sample."""
    ends, areas = _trapezoids(points, interval_ms)
    # a sample exactly on an hour's start closes the segment before it: it belongs to the hour before
    hours = ((ends - 1) // MS_PER_HOUR * MS_PER_HOUR).astype(np.int64)
    out: dict[int, list[float]] = {}
    for hour, area in zip(hours.tolist(), areas.tolist(), strict=True):
        out.setdefault(hour, []).append(area)
    return {hour: math.fsum(parts) for hour, parts in out.items()}


def cost(
    time: GpuTime, *, price: float, currency: str, utilization: PointsLike, interval_ms: int, gpu_count: int
) -> Cost:
    """The receipt in money: the GPU time at a GPU-hour price, and what a useful GPU-hour cost
    (useful GPU-hours integrate utilization / 100 x GPUs)."""
    total = time.total * price
    idle, held = time.idle * price, time.idle_held * price
    useful = integral(utilization, interval_ms) / 100 * gpu_count / 3600
    return Cost(
        currency,
        price,
        time.total,
        total,
        max(0.0, total - idle - held),
        idle,
        held,
        time.input_bound * price,
        time.throttled * price,
        useful,
        total / useful if useful > 0 else None,
    )
