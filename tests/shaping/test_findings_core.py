"""The detectors' building blocks (shaping/findings_core.py) against their general forms: a series that
is exactly the grid is placed as the general path places it, and masks with nothing in them (the
fast paths of `runs`, `smoothed_mask`, `hysteresis` and `episodes`) give what the full computation
gives, as do masks with something in them. The references below are the code before the fast paths
(commit bd51662's parent), kept here verbatim."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpulens.domain.catalog import INSIGHT_THRESHOLDS
from gpulens.shaping.findings_core import (
    BoolArray,
    FloatArray,
    Grid,
    PointsLike,
    RunInfo,
    Samples,
    _column,
    _is_grid,
    as_arrays,
    episodes,
    hysteresis,
    runs,
    smooth,
    smoothed_mask,
)

# -- the general forms (before the fast paths) --------------------------------------------------------


def ref_column(points: PointsLike, run: RunInfo, n: int, span: int) -> tuple[FloatArray, BoolArray]:
    landed = np.zeros(n, dtype=bool)
    if not len(points) or n == 0:
        return np.full(n, np.nan), landed
    t, v = as_arrays(points)
    k = np.rint((t - run.start_ms) / run.interval_ms).astype(np.int64)
    ok = (k >= 0) & (k < n) & np.isfinite(v)
    k, v = k[ok], v[ok]
    landed[k] = True
    col = np.full(n, np.nan)
    for d in range(span):
        i = k - d
        inside = i >= 0
        col[i[inside]] = v[inside]
    return col, landed


def ref_run_bounds(mask: Any) -> tuple[np.ndarray[Any, Any], ...]:
    on = np.asarray(mask, dtype=np.int8)
    edges = np.diff(np.concatenate(([0], on, [0])))
    return np.flatnonzero(edges == 1), np.flatnonzero(edges == -1) - 1


def ref_smoothed_mask(mask: Any, max_gap: int) -> BoolArray:
    out = np.array(mask, dtype=bool)
    starts, ends = ref_run_bounds(~out)
    inner = (starts > 0) & (ends < len(out) - 1) & (ends - starts + 1 <= max_gap)
    for a, b in zip(starts[inner].tolist(), ends[inner].tolist(), strict=True):
        out[a : b + 1] = True
    return out


def ref_runs(mask: Any) -> list[tuple[int, int]]:
    starts, ends = ref_run_bounds(mask)
    return list(zip(starts.tolist(), ends.tolist(), strict=True))


def ref_hysteresis(enter: BoolArray, stay: BoolArray, present: BoolArray, max_hole: int) -> BoolArray:
    n = len(present)
    idx = np.arange(n)
    begin = enter & stay & present
    leave = present & ~stay
    starts, ends = ref_run_bounds(~present)
    long_holes = starts[(ends - starts + 1) > max_hole]
    if len(long_holes):
        leave = leave.copy()
        leave[long_holes] = True
    last_in = np.maximum.accumulate(np.where(begin, idx, -1))
    last_out = np.maximum.accumulate(np.where(leave, idx, -1))
    on: BoolArray = last_in > last_out
    return on


def ref_episodes(
    grid: Grid, on: BoolArray, key: str, th: Any, min_ms: int | None = None
) -> list[tuple[int, int]]:
    least = th.min_duration_ms if min_ms is None else min_ms
    valued = ~np.isnan(grid.arrays[key])
    landed = grid.landed[key]
    out = []
    for a, b in ref_runs(ref_smoothed_mask(on, grid.gap_points(th))):
        if int((landed[a : b + 1] & on[a : b + 1]).sum()) < th.min_samples:
            continue
        inside = np.flatnonzero(valued[a : b + 1] & on[a : b + 1])
        first, last = a + int(inside[0]), a + int(inside[-1])
        if grid.duration(first, last) >= least:
            out.append((first, last))
    return out


def same_column(got: tuple[FloatArray, BoolArray], want: tuple[FloatArray, BoolArray]) -> None:
    np.testing.assert_array_equal(got[0], want[0])  # NaN where NaN
    np.testing.assert_array_equal(got[1], want[1])
    assert got[0].dtype == np.float64 and got[1].dtype == np.bool_


# -- _column: a series exactly on the grid -------------------------------------------------------------

_values = st.floats(allow_nan=True, allow_infinity=True, width=64)


@st.composite
def on_grid(draw: st.DrawFn) -> tuple[RunInfo, int, list[float]]:
    interval = draw(st.sampled_from([1_000, 7_000, 15_000, 60_000]))
    n = draw(st.integers(1, 120))
    start = draw(st.integers(1_600_000_000_000, 1_800_000_000_000))
    tail = draw(st.integers(0, interval - 1))  # the window's end need not be on the grid
    run = RunInfo(start, start + (n - 1) * interval + tail, interval)
    values = draw(st.lists(_values, min_size=n, max_size=n))
    return run, n, values


@settings(max_examples=300, deadline=None)
@given(
    case=on_grid(), as_samples=st.booleans(), jitter_at=st.integers(0, 10_000), sign=st.sampled_from([-1, 1])
)
def test_a_series_exactly_on_the_grid_is_placed_as_the_general_path_places_it(
    case: tuple[RunInfo, int, list[float]], as_samples: bool, jitter_at: int, sign: int
) -> None:
    run, n, values = case
    assert Grid({}, run).n == n
    times = [run.start_ms + k * run.interval_ms for k in range(n)]
    pts: PointsLike = (
        Samples(np.array(times, dtype=np.float64), np.array(values, dtype=np.float64))
        if as_samples
        else list(zip(times, values, strict=True))
    )
    t, _ = as_arrays(pts)
    assert _is_grid(t, run, n)  # the fast path is the one taken
    fast = _column(pts, run, n, 1)
    same_column(fast, ref_column(pts, run, n, 1))
    # one point 1 ms off the grid takes the general path and lands where it did
    moved = list(times)
    moved[jitter_at % n] += sign
    jittered = list(zip(moved, values, strict=True))
    assert not _is_grid(as_arrays(jittered)[0], run, n)
    same_column(_column(jittered, run, n, 1), fast)
    # a decoded range answer that says it is on a grid of this step (later: Samples.step_ms)
    if as_samples and "step_ms" in Samples.__dataclass_fields__:
        stepped = Samples(*as_arrays(pts), step_ms=run.interval_ms)
        same_column(_column(stepped, run, n, 1), fast)
    # and through a Grid, as the detectors read it
    grid = Grid({"gpuUtilizationPercent": pts}, run)
    np.testing.assert_array_equal(grid.arrays["gpuUtilizationPercent"], fast[0])
    np.testing.assert_array_equal(grid.landed["gpuUtilizationPercent"], fast[1])


@settings(max_examples=300, deadline=None)
@given(
    case=on_grid(),
    picks=st.lists(st.tuples(st.integers(-3, 130), st.integers(-600, 600)), max_size=150),
    span=st.integers(1, 4),
)
def test_any_series_is_placed_as_the_general_path_places_it(
    case: tuple[RunInfo, int, list[float]], picks: list[tuple[int, int]], span: int
) -> None:
    """Gaps, points off the grid or outside it, out of order, twice at one point: as before."""
    run, n, values = case
    pts = [
        (run.start_ms + k * run.interval_ms + off, values[(k + i) % len(values)])
        for i, (k, off) in enumerate(picks)
    ]
    same_column(_column(pts, run, n, span), ref_column(pts, run, n, span))


@pytest.mark.parametrize("span", [1, 2, 4])
def test_a_grid_series_with_a_coarser_span_and_edge_cases(span: int) -> None:
    run = RunInfo(1_700_000_000_000, 1_700_000_000_000 + 9 * 15_000, 15_000)
    times = [run.start_ms + k * 15_000 for k in range(10)]
    pts = list(zip(times, [float(k) for k in range(10)], strict=True))
    same_column(_column(pts, run, 10, span), ref_column(pts, run, 10, span))
    same_column(_column([], run, 10, span), ref_column([], run, 10, span))
    same_column(_column(pts, run, 0, span), ref_column(pts, run, 0, span))
    same_column(_column(pts[:9], run, 10, span), ref_column(pts[:9], run, 10, span))  # one short
    same_column(_column(pts[::-1], run, 10, span), ref_column(pts[::-1], run, 10, span))  # reversed


# -- masks with nothing in them, and with something --------------------------------------------------

_masks = st.lists(st.booleans(), max_size=300)


def _arrays(*masks: list[bool]) -> list[BoolArray]:
    n = min(len(m) for m in masks)
    return [np.array(m[:n], dtype=bool) for m in masks]


@pytest.mark.parametrize("n", [0, 1, 2, 17, 1_000])
def test_all_false_masks_give_what_the_full_computation_gives(n: int) -> None:
    none = np.zeros(n, dtype=bool)
    some = np.arange(n) % 3 == 0
    assert runs(none) == ref_runs(none) == []
    assert runs([False] * n) == []
    for gap in (0, 1, 5):
        got = smoothed_mask(none, gap)
        np.testing.assert_array_equal(got, ref_smoothed_mask(none, gap))
        assert got.dtype == np.bool_ and got.shape == (n,) and got is not none  # a copy, as before
        got[:] = True  # writable, and not the caller's mask
        assert not none.any()
        assert smooth([False] * n, gap) == [False] * n
    for present in (none, ~none, some):
        for stay in (none, ~none, some):
            got = hysteresis(none, stay, present, 3)
            np.testing.assert_array_equal(got, ref_hysteresis(none, stay, present, 3))
            assert got.shape == (n,) and got.dtype == np.bool_
            got[:] = True  # writable (a fresh array each time)
            np.testing.assert_array_equal(hysteresis(none, stay, present, 3), np.zeros(n, dtype=bool))
    if n:
        run = RunInfo(0, (n - 1) * 15_000, 15_000)
        grid = Grid({"gpuUtilizationPercent": [(k * 15_000, 1.0) for k in range(n)]}, run)
        assert episodes(grid, none, "gpuUtilizationPercent", INSIGHT_THRESHOLDS) == []
        assert ref_episodes(grid, none, "gpuUtilizationPercent", INSIGHT_THRESHOLDS) == []


@settings(max_examples=300, deadline=None)
@given(mask=_masks, gap=st.integers(0, 12), blank=st.booleans())
def test_runs_and_smoothing_are_as_before(mask: list[bool], gap: int, blank: bool) -> None:
    if blank:
        mask = [False] * len(mask)
    arr = np.array(mask, dtype=bool)
    assert runs(arr) == ref_runs(arr)
    assert runs(mask) == ref_runs(mask)
    assert runs(arr[::2]) == ref_runs(arr[::2])  # a strided view
    np.testing.assert_array_equal(smoothed_mask(arr, gap), ref_smoothed_mask(arr, gap))
    np.testing.assert_array_equal(smoothed_mask(mask, gap), ref_smoothed_mask(mask, gap))


@settings(max_examples=300, deadline=None)
@given(
    enter=_masks,
    stay=_masks,
    present=_masks,
    hole=st.integers(0, 10),
    blank=st.sampled_from(["", "enter", "stay", "present"]),
)
def test_hysteresis_is_as_before(
    enter: list[bool], stay: list[bool], present: list[bool], hole: int, blank: str
) -> None:
    e, s, p = _arrays(enter, stay, present)
    if blank:
        {"enter": e, "stay": s, "present": p}[blank][:] = False
    np.testing.assert_array_equal(hysteresis(e, s, p, hole), ref_hysteresis(e, s, p, hole))


@settings(max_examples=200, deadline=None)
@given(
    on=_masks,
    values=st.lists(st.one_of(st.none(), st.floats(0, 100)), max_size=300),
    blank=st.booleans(),
    min_minutes=st.sampled_from([None, 0, 1, 2, 10]),
    interval=st.sampled_from([15_000, 60_000]),
)
def test_episodes_are_as_before(
    on: list[bool], values: list[float | None], blank: bool, min_minutes: int | None, interval: int
) -> None:
    n = min(len(on), len(values))
    if n == 0:
        return
    mask = np.array(on[:n], dtype=bool)
    if blank:
        mask[:] = False
    run = RunInfo(0, (n - 1) * interval, interval)
    series = [(k * interval, v) for k, v in enumerate(values[:n]) if v is not None]
    grid = Grid({"gpuUtilizationPercent": series}, run)
    for th in (INSIGHT_THRESHOLDS, replace(INSIGHT_THRESHOLDS, min_duration_ms=60_000, min_samples=1)):
        min_ms = None if min_minutes is None else min_minutes * 60_000
        got = episodes(grid, mask, "gpuUtilizationPercent", th, min_ms)
        assert got == ref_episodes(grid, mask, "gpuUtilizationPercent", th, min_ms)
        if blank:
            assert got == []
