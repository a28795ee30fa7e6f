"""Statistics, energy and cost of one execution from its series at the scrape interval. Pure, no I/O.

* stats: per series mean, min, max, p50, p95 (linear interpolation between the closest ranks, as
  numpy's default), the number of samples and their coverage (samples / grid points of the window);
* energy: the trapezoid integral of the summed GPU power over consecutive samples at most two
  intervals apart (a longer gap adds nothing: it is a `no_data` finding), in kWh; CO2e from a carbon
  intensity in g/kWh;
* cost: GPU-hours (GPU count x the window's length) x the price of a GPU-hour; idle, idle-held,
  input-bound and throttled are the GPU time inside those findings (each finding covers its points,
  one interval each, clipped to the window, times the GPUs it is about); useful GPU-hours integrate
  utilization / 100 x GPUs.
"""

from __future__ import annotations

import math
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from gpulens.shaping.insights import Finding, PointsLike, as_arrays

MS_PER_HOUR = 3_600_000
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
    t, v = as_arrays(points)
    if len(t) < 2:
        return 0.0
    dt = np.diff(t)
    ok = (dt > 0) & (dt <= 2 * interval_ms) & np.isfinite(v[:-1]) & np.isfinite(v[1:])
    return math.fsum(((v[:-1] + v[1:]) / 2 * dt / 1000)[ok].tolist())


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


COST_KINDS: Mapping[str, tuple[str, ...]] = {
    "idle": ("idle",),
    "idle_held": ("idle_held",),
    "input_bound": ("input_bound",),
    "throttled": ("power_throttle", "thermal_throttle"),
}


def _covered_ms(
    found: Sequence[Finding], kinds: Sequence[str], start_ms: int, end_ms: int, interval_ms: int
) -> int:
    """ms of the window inside findings of `kinds` (their union; each covers (start - interval, end])."""
    spans = sorted(
        (max(start_ms, f.start_ms - interval_ms), min(end_ms, f.end_ms)) for f in found if f.kind in kinds
    )
    total, reach = 0, start_ms
    for a, b in spans:
        lo = max(a, reach)
        if b > lo:
            total += b - lo
            reach = b
    return total


def cost(
    *,
    start_ms: int,
    end_ms: int,
    interval_ms: int,
    gpu_count: int,
    price: float,
    currency: str,
    found: Sequence[Finding],
    utilization: PointsLike,
) -> Cost:
    hours = gpu_count * (end_ms - start_ms) / MS_PER_HOUR
    total = hours * price

    def of(kind: str) -> float:
        kinds = COST_KINDS[kind]
        whole = [f for f in found if f.gpu_count == 0]  # about all the execution's GPUs
        gpu_ms = gpu_count * _covered_ms(whole, kinds, start_ms, end_ms, interval_ms)
        for f in found:  # about some of its GPUs (never overlapping a finding about all of them)
            if f.gpu_count and f.kind in kinds:
                gpu_ms += f.gpu_count * _covered_ms([f], kinds, start_ms, end_ms, interval_ms)
        return gpu_ms / MS_PER_HOUR * price

    idle, held = of("idle"), of("idle_held")
    useful = integral(utilization, interval_ms) / 100 * gpu_count / 3600
    return Cost(
        currency,
        price,
        hours,
        total,
        max(0.0, total - idle - held),
        idle,
        held,
        of("input_bound"),
        of("throttled"),
        useful,
        total / useful if useful > 0 else None,
    )
