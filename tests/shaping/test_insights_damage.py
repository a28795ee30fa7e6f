"""Findings on damaged data: series that flicker around every threshold, missed scrapes, coarse steps,
alike GPUs, and the long noisy execution of the test kit (one finding per episode, with impacts, in
order). The receipt charges each GPU-second once."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpulens.domain import catalog as c
from gpulens.domain.timeparse import human_duration
from gpulens.shaping import insights as ins
from gpulens.shaping.insights import Finding, RunInfo, Samples, findings
from gpulens.shaping.usage import gpu_time
from gpulens_testkit.noisy_run import NoisyRun, noisy_execution
from tests.shaping.test_insights import CONDITIONS, INTERVAL, T0, Row, run_of, series_of, steady

TH = c.INSIGHT_THRESHOLDS

# Values that hover around each kind's enter threshold but stay inside its exit band.
FLICKER: dict[str, Callable[[random.Random], Row]] = {
    "idle": lambda r: {ins.UTIL: r.uniform(0, 9.5), ins.FB: r.uniform(0, 3), ins.CPU: r.uniform(2, 10)},
    "idle_held": lambda r: {
        ins.UTIL: r.uniform(0, 9.5),
        ins.FB: r.uniform(55, 80),
        ins.CPU: r.uniform(3, 20),
    },
    "input_bound": lambda r: {
        ins.UTIL: r.uniform(3, 48),
        ins.CPU: r.uniform(75, 95),  # busy (>= 80) three times in four
        ins.PCIE_RX: r.uniform(1e8, 1e9),
    },
    "power_throttle": lambda r: {
        ins.POWER: 700 * r.uniform(0.91, 1.0),
        ins.SM_CLOCK: 1980 * r.uniform(0.86, 0.945),
        ins.TEMP: r.uniform(78, 88),
    },
    "thermal_throttle": lambda r: {
        ins.TEMP: r.uniform(79, 92),
        ins.SM_CLOCK: 1980 * r.uniform(0.86, 0.945),
        ins.POWER: r.uniform(400, 560),
    },
    "memory_pressure": lambda r: {ins.FB: r.uniform(91, 99.5)},
}


@settings(max_examples=120, deadline=None)
@given(
    kind=st.sampled_from(sorted(FLICKER)),
    seed=st.integers(0, 2**32),
    before=st.integers(10, 80),
    length=st.integers(40, 300),
    after=st.integers(10, 80),
    missed=st.floats(0, 0.05),
)
def test_a_series_flickering_around_a_threshold_is_one_finding(
    kind: str, seed: int, before: int, length: int, after: int, missed: float
) -> None:
    """Inside the episode the values hover around the enter threshold without leaving the exit band,
    with random missed scrapes everywhere: one finding of the kind, over the episode, and nothing else.
    The episode's first sample crosses the enter threshold clearly (CONDITIONS), so its edges are
    known: the finding starts there and ends at its last sample (a finding starts where the enter
    threshold first holds: left to the flicker, that is a random number of samples later)."""
    rng = random.Random(seed)
    rows = [steady(rng) for _ in range(before + length + after)]
    for i in range(before, before + length):
        rows[i].update(FLICKER[kind](rng))
    rows[before].update(CONDITIONS[kind](rng))
    for i in range(1, len(rows) - 1):
        if rng.random() < missed and i not in (before, before + length - 1):
            rows[i] = {}
    found = findings(series_of(rows), run_of(len(rows)))
    assert [f.kind for f in found] == [kind], [(f.kind, f.start_ms, f.end_ms) for f in found]
    start, end = T0 + before * INTERVAL, T0 + (before + length - 1) * INTERVAL
    assert abs(found[0].start_ms - start) <= INTERVAL, (found[0].start_ms - start) // INTERVAL
    assert abs(found[0].end_ms - end) <= INTERVAL, (found[0].end_ms - end) // INTERVAL


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32), gpus=st.integers(2, 8), story=st.sampled_from(["stall", "idle", "flat"]))
def test_alike_gpus_give_no_per_gpu_or_imbalance_finding(seed: int, gpus: int, story: str) -> None:
    """GPUs with the same story and their own noise (stalls at 0-6 %, idle flicker, steady work) never
    give a finding naming some of them."""
    rng = random.Random(seed)
    n = 240
    per_gpu: dict[str, list[Row]] = {str(g): [steady(rng) for _ in range(n)] for g in range(gpus)}
    for rows in per_gpu.values():
        for i in range(60, 180):
            if story == "stall":
                rows[i].update({ins.UTIL: rng.uniform(0, 6), ins.CPU: rng.uniform(74, 96)})
            elif story == "idle":
                rows[i].update({ins.UTIL: rng.uniform(0, 9), ins.FB: rng.uniform(0, 2)})
    mean = [
        {ins.UTIL: sum(per_gpu[str(g)][i][ins.UTIL] for g in range(gpus)) / gpus}
        | {ins.FB: sum(per_gpu[str(g)][i][ins.FB] for g in range(gpus)) / gpus}
        | {k: v for k, v in per_gpu["0"][i].items() if k not in (ins.UTIL, ins.FB)}
        for i in range(n)
    ]
    names = tuple(per_gpu)
    run = RunInfo(T0, T0 + (n - 1) * INTERVAL, INTERVAL, gpus=names, gpu_count=gpus)
    by_gpu = {
        g: {k: v for k, v in series_of(r).items() if k in (ins.UTIL, ins.FB)} for g, r in per_gpu.items()
    }
    found = findings(series_of(mean), run, per_gpu=by_gpu)
    assert all(f.gpu_count == 0 and f.kind != "gpu_imbalance" for f in found), [
        (f.kind, f.gpus) for f in found
    ]
    assert len(found) == (0 if story == "flat" else 1)


# -- the long noisy execution ---------------------------------------------------------------------


def kinds_and_edges(found: list[Finding]) -> list[tuple[str, int, int]]:
    return sorted((f.kind, f.start_ms, f.end_ms) for f in found)


def climb_slack(kind: str, start_ms: int, end_ms: int) -> int:
    """The OOM's start is the break of a level-then-line fit on a slow, noisy climb: within 4 % of it
    (about 5 min of a 2 h leak at 15 s, where noise of +-0.8 points hides a climb of 0.06 a sample)."""
    return (end_ms - start_ms) * 4 // 100 if kind == "oom_suspected" else 0


def check_story(noisy: NoisyRun, found: list[Finding], tolerance_ms: int) -> None:
    """One finding per episode of the ground truth, each over its episode, nothing else."""
    assert len(found) == len(noisy.episodes), [(f.kind, f.gpus, f.message) for f in found]
    for episode in noisy.episodes:
        mine = [f for f in found if f.kind == episode.kind]
        assert len(mine) == 1, (episode, [(f.kind, f.start_ms, f.end_ms) for f in found])
        f = mine[0]
        assert f.gpu_count == 0
        slack = tolerance_ms + climb_slack(f.kind, episode.start_ms, episode.end_ms)
        assert abs(f.start_ms - episode.start_ms) <= slack, (episode.kind, f.start_ms - episode.start_ms)
        assert abs(f.end_ms - episode.end_ms) <= tolerance_ms, (episode.kind, f.end_ms - episode.end_ms)


def test_the_long_noisy_execution_gives_one_finding_per_episode_with_impacts_in_order() -> None:
    noisy = noisy_execution(seed=1)
    run = noisy.run
    found = findings(noisy.series, run, per_gpu=noisy.per_gpu)
    check_story(noisy, found, tolerance_ms=INTERVAL)
    assert [f.kind for f in found] == ["idle", "oom_suspected", "input_bound", "power_throttle", "no_data"]
    keys = [(c.SEVERITY_RANK[f.severity], -f.gpu_hours) for f in found]
    assert keys == sorted(keys)
    total_h = run.gpu_count * (run.end_ms - run.start_ms) / 3_600_000
    assert sum(f.gpu_hours for f in found) <= total_h + 1e-9
    for f in found:  # none overlaps another: each is its duration x the 4 GPUs
        assert f.gpu_hours == pytest.approx(4 * (f.end_ms - f.start_ms + INTERVAL) / 3_600_000)
    stall = next(f for f in found if f.kind == "input_bound")
    assert human_duration(stall.end_ms - stall.start_ms + INTERVAL) == "7 h 12 min"
    assert stall.gpu_hours == pytest.approx(28.8)
    priced = ins.priced(found, 2.5)
    assert next(f for f in priced if f.kind == "input_bound").cost == pytest.approx(72.0)


@settings(max_examples=12, deadline=None)
@given(seed=st.integers(0, 2**32), gpus=st.integers(2, 8), hours=st.sampled_from([24.0, 48.0, 72.0]))
def test_noisy_executions_of_any_seed_and_size_give_their_story(seed: int, gpus: int, hours: float) -> None:
    noisy = noisy_execution(seed=seed, gpus=gpus, hours=hours)
    found = findings(noisy.series, noisy.run, per_gpu=noisy.per_gpu)
    check_story(noisy, found, tolerance_ms=INTERVAL)


def thinned(noisy: NoisyRun, rate: float, seed: int) -> NoisyRun:
    """The same execution with a share of its scrapes missed (independently per series)."""
    rng = np.random.default_rng(seed)

    def cut(s: Samples) -> Samples:
        keep = rng.uniform(0, 1, len(s)) >= rate
        return Samples(s.t[keep], s.v[keep])

    return replace(
        noisy,
        series={k: cut(s) for k, s in noisy.series.items()},
        per_gpu={g: {k: cut(s) for k, s in ss.items()} for g, ss in noisy.per_gpu.items()},
    )


def coarse(noisy: NoisyRun, k: int) -> tuple[dict[str, Samples], RunInfo, dict[str, dict[str, Samples]]]:
    """What a range query at step k x the interval gives (a 30-day window's summary): every k-th
    sample on the coarse grid, each standing for the k scrapes before it."""
    step = k * noisy.run.interval_ms

    def every(s: Samples) -> Samples:
        on = ((s.t - noisy.run.start_ms) % step) == 0
        return Samples(s.t[on], s.v[on])

    run = replace(
        noisy.run,
        interval_ms=step,
        end_ms=noisy.run.start_ms + (noisy.run.end_ms - noisy.run.start_ms) // step * step,
    )
    return (
        {key: every(s) for key, s in noisy.series.items()},
        run,
        {g: {key: every(s) for key, s in ss.items()} for g, ss in noisy.per_gpu.items()},
    )


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 2**32), rate=st.floats(0.005, 0.03))
def test_missed_scrapes_change_no_count_and_move_edges_by_the_steps_missed(seed: int, rate: float) -> None:
    noisy = noisy_execution(seed=seed % 1000, hours=24.0)
    clean = findings(noisy.series, noisy.run, per_gpu=noisy.per_gpu)
    damaged = thinned(noisy, rate, seed)
    got = findings(damaged.series, damaged.run, per_gpu=damaged.per_gpu)
    a, b = kinds_and_edges(clean), kinds_and_edges(got)
    assert [k for k, _, _ in a] == [k for k, _, _ in b]
    for (kind, s0, e0), (_, s1, e1) in zip(a, b, strict=True):
        assert abs(s0 - s1) <= missed_at(noisy, damaged, s0) + climb_slack(kind, s0, e0), kind
        assert abs(e0 - e1) <= missed_at(noisy, damaged, e0), kind


def missed_at(noisy: NoisyRun, damaged: NoisyRun, t_ms: int) -> int:
    """How far missed scrapes can move an edge at t_ms: a step, or as many steps as there are scrape
    times in a row, from t_ms on or just before it, at which some series missed its sample (a detector
    reading several series sees a change once each has a sample after it)."""

    def every(run: NoisyRun) -> list[Samples]:
        return [*run.series.values(), *(s for ss in run.per_gpu.values() for s in ss.values())]

    missed: set[int] = set()
    for whole, thin in zip(every(noisy), every(damaged), strict=True):
        near = whole.t[(whole.t >= t_ms - 8 * INTERVAL) & (whole.t <= t_ms + 8 * INTERVAL)]
        missed.update(int(t) for t in np.setdiff1d(near, thin.t))
    run = max(
        next(k for k in range(17) if start + k * INTERVAL not in missed)
        for start in (t_ms - 2 * INTERVAL, t_ms - INTERVAL, t_ms)
    )
    return INTERVAL * max(1, run)


@pytest.mark.parametrize("k", [2, 4, 8, 16])
def test_coarse_steps_change_no_count_and_edges_by_at_most_a_step(k: int) -> None:
    """At 16 x 15 s (what a 30-day summary reads) the story is the same, its edges within a step."""
    noisy = noisy_execution(seed=3)
    fine = kinds_and_edges(findings(noisy.series, noisy.run, per_gpu=noisy.per_gpu))
    series, run, per_gpu = coarse(noisy, k)
    got = kinds_and_edges(findings(series, run, per_gpu=per_gpu))
    assert [kind for kind, _, _ in got] == [kind for kind, _, _ in fine], got
    step = k * INTERVAL
    for (kind, s0, e0), (_, s1, e1) in zip(fine, got, strict=True):
        slack = step + climb_slack(kind, s0, e0)
        assert abs(s0 - s1) <= slack and abs(e0 - e1) <= step, (kind, s1 - s0, e1 - e0)


# -- the receipt -------------------------------------------------------------------------------------

KINDS = sorted(c.INSIGHT_SEVERITY)


@st.composite
def finding_sets(draw: st.DrawFn) -> tuple[int, list[Finding]]:
    gpus = draw(st.integers(1, 8))
    n = 240
    out = []
    for _ in range(draw(st.integers(0, 12))):
        a = draw(st.integers(-5, n))
        b = draw(st.integers(a, n + 5))
        some = draw(st.lists(st.sampled_from([str(g) for g in range(gpus)]), unique=True, max_size=gpus))
        kind = draw(st.sampled_from(KINDS))
        out.append(
            Finding(kind, "warning", T0 + a * INTERVAL, T0 + b * INTERVAL, tuple(some), "", {}, len(some))
        )
    return gpus, out


@settings(max_examples=300, deadline=None)
@given(case=finding_sets())
def test_the_receipt_charges_each_gpu_second_once(case: tuple[int, list[Finding]]) -> None:
    gpus, found = case
    names = tuple(str(g) for g in range(gpus))
    end = T0 + 240 * INTERVAL
    t = gpu_time(start_ms=T0, end_ms=end, interval_ms=INTERVAL, gpu_count=gpus, found=found, gpus=names)
    eps = 1e-9
    assert t.total == pytest.approx(gpus * 240 * INTERVAL / 3_600_000)
    assert t.active + t.idle + t.idle_held == pytest.approx(t.total)
    assert t.input_bound + t.throttled <= t.active + eps
    assert min(t.active, t.idle, t.idle_held, t.input_bound, t.throttled) >= 0
    run = RunInfo(T0, end, INTERVAL, gpus=names, gpu_count=gpus)
    ranked = ins.ranked(found, run, names)
    assert sum(f.gpu_hours for f in ranked) <= t.total + eps
    for f in ranked:  # never more than its duration x its GPUs
        share = gpus if f.gpu_count == 0 else f.gpu_count
        assert f.gpu_hours <= share * (f.end_ms - f.start_ms + INTERVAL) / 3_600_000 + eps


def test_every_threshold_is_documented() -> None:
    """docs/compatibility.md lists each detector's thresholds by their names in the catalog."""
    from pathlib import Path

    text = (Path(__file__).parents[2] / "docs" / "compatibility.md").read_text()
    missing = [name for name in c.InsightThresholds.__dataclass_fields__ if f"`{name}`" not in text]
    assert not missing, missing


@st.composite
def gpu_columns(draw: st.DrawFn, top: float) -> np.ndarray[Any, np.dtype[np.float64]]:
    """GPUs x points of whole numbers in 0..top (few values: ties), some NaN (none, some or all)."""
    rows, cols = draw(st.integers(1, 9)), draw(st.integers(1, 40))
    rng = np.random.default_rng(draw(st.integers(0, 2**32)))
    values = np.round(rng.uniform(0, top, (rows, cols)))
    values[rng.uniform(0, 1, (rows, cols)) < draw(st.floats(0, 1))] = np.nan
    return values


@settings(max_examples=100, deadline=None)
@given(values=gpu_columns(100))
def test_column_median_is_nanmedian(values: np.ndarray[Any, np.dtype[np.float64]]) -> None:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        want = np.nanmedian(values, axis=0)
    np.testing.assert_allclose(ins.column_median(values), want, equal_nan=True)


@settings(max_examples=200, deadline=None)
@given(spans=st.lists(st.tuples(st.integers(0, 200), st.integers(1, 60)), max_size=40))
def test_a_ledger_row_counts_each_instant_once(spans: list[tuple[int, int]]) -> None:
    """The ledger's spans (a bisection per claim) against a set of the instants claimed."""
    from gpulens.shaping.findings_core import _Spans

    row, seen = _Spans(), set[int]()
    for a, length in spans:
        new = set(range(a, a + length)) - seen
        assert row.add(a, a + length) == len(new)
        seen |= new
        assert all(x < y for x, y in zip(row.starts, row.ends, strict=True))
        assert all(y <= x for y, x in zip(row.ends, row.starts[1:], strict=False))  # disjoint, in order
    assert sum(y - x for x, y in zip(row.starts, row.ends, strict=True)) == len(seen)


@settings(max_examples=100, deadline=None)
@given(stacked=gpu_columns(10))
def test_busiest_others_is_the_max_over_the_other_rows(
    stacked: np.ndarray[Any, np.dtype[np.float64]],
) -> None:
    """Ties, NaN and lone rows included: what a stack of the other rows and np.nanmax give."""
    import warnings

    rows, cols = stacked.shape
    got = ins.busiest_others(stacked)
    for r in range(rows):
        others = np.delete(stacked, r, axis=0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            want = np.nanmax(others, axis=0) if len(others) else np.full(cols, np.nan)
        np.testing.assert_array_equal(got[r], want)
