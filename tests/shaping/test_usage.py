"""Statistics, energy and cost of an execution's series."""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from gpulens.config import Settings
from gpulens.shaping.insights import Finding
from gpulens.shaping.usage import (
    Cost,
    cost,
    energy,
    gpu_ms,
    gpu_time,
    hourly,
    integral,
    parse_prices,
    quantile,
    series_stats,
)

IV = 15_000
T0 = 1_767_225_600_000


def test_stats_and_coverage() -> None:
    pts = [(T0 + k * IV, float(k)) for k in range(10) if k != 4]  # one point missing of 10
    s = series_stats(pts, T0, T0 + 9 * IV, IV)
    assert (s.samples, s.min, s.max) == (9, 0.0, 9.0)
    assert s.coverage == pytest.approx(0.9)
    assert s.mean == pytest.approx(sum(k for k in range(10) if k != 4) / 9)
    assert s.p50 == 5.0
    assert s.p95 == pytest.approx(8.6)
    empty = series_stats([], T0, T0 + 9 * IV, IV)
    assert (empty.mean, empty.samples, empty.coverage) == (None, 0, 0.0)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.floats(-1e6, 1e6), min_size=1, max_size=50), st.floats(0, 1))
def test_quantile_within_bounds(values: list[float], q: float) -> None:
    ordered = sorted(values)
    assert ordered[0] <= quantile(ordered, q) <= ordered[-1]


def test_energy_is_the_trapezoid_integral() -> None:
    power = [(T0 + k * IV, 1000.0) for k in range(241)]  # 1 kW for an hour
    e = energy(power, IV, carbon_g_per_kwh=400.0)
    assert e is not None
    assert e.kwh == pytest.approx(1.0)
    assert e.co2e_kg == pytest.approx(0.4)
    assert energy([], IV) is None
    ramp = [(T0, 0.0), (T0 + IV, 100.0)]
    assert integral(ramp, IV) == pytest.approx(750.0)  # W s
    gap = [(T0, 100.0), (T0 + 3 * IV, 100.0)]  # longer than two intervals: not bridged
    assert integral(gap, IV) == 0.0


def finding(kind: str, start: int, end: int) -> Finding:
    return Finding(kind, "warning", T0 + start * IV, T0 + end * IV, ("0",), "", {})


def priced_receipt(found: list[Finding], util: list[tuple[int, float]]) -> Cost:
    """An hour of 4 GPUs at 2.5 USD a GPU-hour."""
    time = gpu_time(start_ms=T0, end_ms=T0 + 240 * IV, interval_ms=IV, gpu_count=4, found=found)
    return cost(time, price=2.5, currency="USD", utilization=util, interval_ms=IV, gpu_count=4)


def test_cost_adds_up() -> None:
    util = [(T0 + k * IV, 50.0) for k in range(241)]  # an hour at 50 %
    found = [finding("idle_held", 10, 49), finding("idle", 60, 79), finding("power_throttle", 100, 119)]
    c = priced_receipt(found, util)
    assert c.gpu_hours == pytest.approx(4.0)
    assert c.total == pytest.approx(10.0)
    assert c.idle_held == pytest.approx(4 * 40 * IV / 3_600_000 * 2.5)
    assert c.idle == pytest.approx(4 * 20 * IV / 3_600_000 * 2.5)
    assert c.throttled == pytest.approx(4 * 20 * IV / 3_600_000 * 2.5)
    assert c.input_bound == 0.0
    assert math.isclose(c.active, c.total - c.idle - c.idle_held)
    assert c.useful_gpu_hours == pytest.approx(2.0)
    assert c.per_useful_gpu_hour == pytest.approx(5.0)


def test_prices_toml() -> None:
    p = parse_prices('currency = "EUR"\n[gpu_hour]\n"gpu.h100" = 2.5\n"gpu.a100" = 1\n')
    assert p.currency == "EUR"
    assert p.gpu_hour == {"gpu.h100": 2.5, "gpu.a100": 1.0}
    with pytest.raises(ValueError, match="gpu_hour"):
        parse_prices('[gpu_hour]\n"gpu.h100" = "cheap"\n')


def test_cost_of_some_gpus() -> None:
    util = [(T0 + k * IV, 50.0) for k in range(241)]
    some = Finding("idle", "warning", T0 + 10 * IV, T0 + 49 * IV, ("2", "3"), "", {}, 2)
    c = priced_receipt([some, finding("idle_held", 100, 119)], util)
    assert c.idle == pytest.approx(2 * 40 * IV / 3_600_000 * 2.5)
    assert c.idle_held == pytest.approx(4 * 20 * IV / 3_600_000 * 2.5)
    assert c.active == pytest.approx(c.total - c.idle - c.idle_held)


def test_settings_check_the_prices_file(tmp_path: Path) -> None:
    good = tmp_path / "prices.toml"
    good.write_text('[gpu_hour]\n"gpu.h100" = 2.5\n')
    assert Settings(prices=good, carbon_intensity=350).prices == good
    bad = tmp_path / "bad.toml"
    bad.write_text("[gpu_hour\n")
    for path in (bad, tmp_path / "missing.toml"):
        with pytest.raises(ValidationError, match="prices"):
            Settings(prices=path)
    with pytest.raises(ValidationError, match="carbon_intensity"):
        Settings(carbon_intensity=-1)


# -- hourly slices: the receipt cut at UTC hours adds up to the receipt -----------------------------

H = 3_600_000
KINDS = ("idle", "idle_held", "input_bound", "power_throttle", "thermal_throttle", "oom_suspected", "no_data")


@st.composite
def receipts(draw: st.DrawFn) -> dict[str, object]:
    interval = draw(st.sampled_from([1_000, 15_000, 60_000]))
    start = 1_767_225_600_000 + draw(st.integers(0, 2 * H)) // interval * interval
    end = start + draw(st.integers(1, 30 * H // interval)) * interval
    names = tuple(str(g) for g in range(draw(st.integers(1, 4))))
    gpu_count = len(names) + draw(st.integers(0, 1))  # a GPU the names do not list: an unnamed row
    found = []
    for _ in range(draw(st.integers(0, 8))):
        a = start + draw(st.integers(0, (end - start) // interval)) * interval
        b = min(end, a + draw(st.integers(0, 6 * H // interval)) * interval)
        gpus = draw(st.one_of(st.just(()), st.lists(st.sampled_from(names), min_size=1, unique=True)))
        kind = draw(st.sampled_from(KINDS))
        found.append(Finding(kind, "warning", a, b, tuple(gpus), kind, {}, len(gpus)))
    times = list(range(start, end + 1, interval))
    gaps = draw(st.sets(st.integers(0, len(times) - 1), max_size=len(times) // 3))
    kept = [t for i, t in enumerate(times) if i not in gaps]
    util = [(t, draw(st.floats(0, 100))) for t in kept[: draw(st.integers(0, len(kept)))]]
    power = [(t, 300.0 + (t // interval) % 7) for t in kept]
    return {
        "start_ms": start,
        "end_ms": end,
        "interval_ms": interval,
        "gpu_count": gpu_count,
        "found": found,
        "gpus": names,
        "utilization": util,
        "power": power,
    }


@given(receipts())
@settings(max_examples=150, deadline=None)
def test_hourly_slices_add_up_to_the_receipt(receipt: dict[str, object]) -> None:
    slices = hourly(**receipt)  # type: ignore[arg-type]
    start, end, interval = receipt["start_ms"], receipt["end_ms"], receipt["interval_ms"]
    assert isinstance(start, int) and isinstance(end, int) and isinstance(interval, int)
    assert slices[0].start_ms == start and slices[-1].end_ms == end
    assert all(s.hour_ms % H == 0 and s.hour_ms <= s.start_ms < s.end_ms <= s.hour_ms + H for s in slices)
    assert all(a.end_ms == b.start_ms for a, b in itertools.pairwise(slices))  # they tile it
    total, lines = gpu_ms(
        start,
        end,
        interval,
        receipt["gpu_count"],
        receipt["found"],
        receipt["gpus"],  # type: ignore[arg-type]
    )
    assert sum(s.gpu_ms for s in slices) == total  # whole milliseconds: exactly
    assert sum(s.idle_ms for s in slices) == lines["idle"]
    assert sum(s.idle_held_ms for s in slices) == lines["idle_held"]
    assert sum(s.input_bound_ms for s in slices) == lines["input_bound"]
    assert sum(s.throttled_ms for s in slices) == lines["throttled"]
    time = gpu_time(
        start_ms=start,
        end_ms=end,
        interval_ms=interval,
        gpu_count=receipt["gpu_count"],  # type: ignore[arg-type]
        found=receipt["found"],  # type: ignore[arg-type]
        gpus=receipt["gpus"],  # type: ignore[arg-type]
    )
    assert time.idle == lines["idle"] / H and time.total == total / H
    useful = integral(receipt["utilization"], interval) / 100 * receipt["gpu_count"]  # type: ignore[arg-type, operator]
    assert math.isclose(math.fsum(s.useful_gpu_s for s in slices), useful, rel_tol=1e-12, abs_tol=1e-9)
    joules = integral(receipt["power"], interval)  # type: ignore[arg-type]
    assert math.isclose(math.fsum(s.energy_j for s in slices), joules, rel_tol=1e-12, abs_tol=1e-9)


def test_an_hour_boundary_sample_closes_the_hour_before() -> None:
    h = 1_767_225_600_000  # an hour's start
    slices = hourly(
        start_ms=h - 30_000,
        end_ms=h + 30_000,
        interval_ms=15_000,
        gpu_count=1,
        found=[],
        power=[(h - 15_000, 100.0), (h, 100.0), (h + 15_000, 100.0)],
    )
    assert [(s.hour_ms, s.energy_j) for s in slices] == [(h - H, 1500.0), (h, 1500.0)]
    assert [s.gpu_ms for s in slices] == [30_000, 30_000]
