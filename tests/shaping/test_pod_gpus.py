"""A pod's GPUs from their series as written: `gpu_series` and `pod_aggregate` equal a plain reference
(a dict per time) on any mix of duplicate series, fallback sources, gaps, NaN and infinities, whether
the answers come decoded on a grid, decoded with gaps, or as plain pairs."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from gpulens.domain.catalog import Agg
from gpulens.domain.models import GridPoints, GridSamples, Series, Window
from gpulens.shaping.pod_gpus import _common_grid, _joined_runs, float_text, gpu_series, pod_aggregate
from gpulens.shaping.runai import points

STEP = 15_000
FIRST = 1_767_225_600_000
GRID = Window(FIRST, FIRST + 19 * STEP, STEP)
KEY = ("gpu", "GPU_I_ID")
VALUES = st.sampled_from([0.0, -0.0, 1.0, 2.5, 7.0, 100.0, 1e20, -3.0, math.nan, math.inf, -math.inf])


def text(v: float) -> str:
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return float_text(np.array([v]))[0]


@st.composite
def answers(draw: st.DrawFn, kinds: tuple[str, ...] = ("pairs", "grid", "points")) -> list[Series]:
    """A source's answer: series of GPUs 0-2 (some twice: a restart), at some grid points, in one of
    the sample forms `kinds` (plain pairs, decoded on a grid, decoded with gaps)."""
    out = []
    for n in range(draw(st.integers(0, 5))):
        gpu = draw(st.sampled_from(["0", "1", "2"]))
        at = sorted(draw(st.sets(st.integers(0, GRID.points - 1), min_size=1)))
        values = [draw(VALUES) for _ in at]
        labels = {"gpu": gpu, "pod": f"exporter-{n}"}
        texts = [text(v).encode() for v in values]
        kind = draw(st.sampled_from(kinds))
        contiguous = at == list(range(at[0], at[0] + len(at))) and all(math.isfinite(v) for v in values)
        if kind == "grid" and contiguous:
            samples: object = GridSamples(FIRST + at[0] * STEP, STEP, texts, values)
        elif kind in ("grid", "points"):
            bad = [k for k, v in enumerate(values) if not math.isfinite(v)]
            samples = GridPoints(FIRST + at[0] * STEP, STEP, [a - at[0] for a in at], texts, values, bad)
        else:
            samples = [((FIRST + a * STEP) / 1000, t.decode()) for a, t in zip(at, texts, strict=True)]
        out.append(Series(labels, samples))  # type: ignore[arg-type]
    return out


def reference(per_source: list[list[Series]]) -> dict[str, dict[int, float]]:
    """Per GPU and time: max within a source (NaN only if all NaN), the first source that has one."""
    out: dict[str, dict[int, float]] = {}
    for answer in per_source:
        this: dict[str, dict[int, float]] = {}
        for s in answer:
            for t, v in s.samples:
                ms, value = round(float(t) * 1000), float(v)
                cur = this.setdefault(s.labels["gpu"], {}).get(ms)
                if cur is None or math.isnan(cur) or (not math.isnan(value) and value > cur):
                    this[s.labels["gpu"]][ms] = value
        for gpu, by_time in this.items():
            for ms, value in by_time.items():
                out.setdefault(gpu, {}).setdefault(ms, value)
    return out


def same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == b or math.isclose(a, b, rel_tol=1e-12)


@settings(max_examples=300, deadline=None)
@given(st.lists(answers(), min_size=1, max_size=3), st.sampled_from(list(Agg)))
def test_gpu_series_and_pod_aggregate_equal_the_reference(per_source: list[list[Series]], agg: Agg) -> None:
    want = reference(per_source)
    gpus = gpu_series(per_source, KEY)
    assert sorted(s.labels["gpu"] for s in gpus) == sorted(want)
    for s in gpus:
        got = {round(float(t) * 1000): v for t, v in s.samples}
        expected = want[s.labels["gpu"]]
        assert got.keys() == expected.keys()
        for ms, value in expected.items():
            assert same(float(got[ms]), value), (ms, got[ms], value)
        # what the answer shows: the finite points, as the backend's text
        shown = points(s.samples, GRID)
        assert list(shown.times) == [ms for ms, v in sorted(expected.items()) if math.isfinite(v)]
    pod = pod_aggregate(gpus, agg, GRID)
    expected_pod: dict[int, float] = {}
    for ms in sorted({ms for by_time in want.values() for ms in by_time}):
        values = [by_time[ms] for by_time in want.values() if ms in by_time]
        if agg is Agg.MAX:
            finite = [v for v in values if not math.isnan(v)]
            result = max(finite) if finite else math.nan
        else:
            result = math.fsum(values) if all(math.isfinite(v) for v in values) else sum(values)
            result = result / len(values) if agg is Agg.AVG else result
        if math.isfinite(result):
            expected_pod[ms] = result
    assert list(pod.times) == list(expected_pod)
    for value, want_value in zip(pod.values, expected_pod.values(), strict=True):
        assert math.isclose(float(value), want_value, rel_tol=1e-9, abs_tol=1e-9), (value, want_value)


def as_pairs(per_source: list[list[Series]]) -> list[list[Series]]:
    return [[Series(s.labels, list(s.samples)) for s in answer] for answer in per_source]


def shown(samples: object) -> list[tuple[int, str]]:
    return [(round(float(t) * 1000), str(v)) for t, v in samples]  # type: ignore[attr-defined]


@settings(max_examples=300, deadline=None)
@given(st.lists(answers(("grid", "points")), min_size=1, max_size=3), st.sampled_from(list(Agg)))
def test_decoded_answers_merge_on_their_grid_as_sorted_pairs_do(
    per_source: list[list[Series]], agg: Agg
) -> None:
    """Answers decoded on one grid are merged index by index; the same samples as plain pairs take
    the sorted path. Both give the same samples, texts and aggregate, digit for digit."""
    on_grid, sorted_ = gpu_series(per_source, KEY), gpu_series(as_pairs(per_source), KEY)
    assert [s.labels for s in on_grid] == [s.labels for s in sorted_]
    for a, b in zip(on_grid, sorted_, strict=True):
        assert shown(a.samples) == shown(b.samples)
        assert points(a.samples, GRID) == points(b.samples, GRID)
    pa, pb = pod_aggregate(on_grid, agg, GRID), pod_aggregate(as_pairs([sorted_])[0], agg, GRID)
    assert list(pa.times) == list(pb.times)
    if agg is Agg.MAX:  # the max of 0 and -0 is either, as numpy's vector and scalar loops pick
        assert [float(v) for v in pa.values] == [float(v) for v in pb.values]
    else:  # the same additions in the same order
        assert pa.values == pb.values


def test_answers_off_one_grid_or_sparse_on_a_long_one_take_the_sorted_path() -> None:
    """A series whose times are off the others' grid (half a step later), and two series a long grid
    apart with a few samples each, are not merged by index; what the sorted path gives is still
    the reference's."""
    off = [
        Series({"gpu": "0", "pod": "a"}, GridSamples(FIRST, STEP, [b"1", b"5", b"2"], [1.0, 5.0, 2.0])),
        Series({"gpu": "0", "pod": "b"}, GridSamples(FIRST + STEP // 2, STEP, [b"4", b"3"], [4.0, 3.0])),
    ]
    far = 10_000
    sparse = [
        Series(
            {"gpu": "1", "pod": "a"}, GridPoints(FIRST, STEP, [0, far], [b"7", b"NaN"], [7.0, math.nan], [1])
        ),
        Series({"gpu": "1", "pod": "b"}, GridPoints(FIRST, STEP, [1, far], [b"2", b"9"], [2.0, 9.0], [])),
    ]
    for answer in (off, sparse):
        assert _common_grid([s.samples for s in answer]) is None
        got = gpu_series([answer], KEY)
        assert [shown(s.samples) for s in got] == [
            shown(s.samples) for s in gpu_series(as_pairs([answer]), KEY)
        ]
        want = reference([answer])
        for one in got:
            mine = {ms: float(v) for ms, v in shown(one.samples)}
            assert mine.keys() == want[one.labels["gpu"]].keys()
            assert all(same(mine[ms], v) for ms, v in want[one.labels["gpu"]].items())
    assert shown(gpu_series([sparse], KEY)[0].samples)[-1] == (FIRST + far * STEP, "9")  # not the NaN


def test_one_series_a_gpu_is_passed_on_unchanged() -> None:
    s = Series({"gpu": "0", "Hostname": "n1"}, GridSamples(FIRST, STEP, [b"1", b"2"], [1.0, 2.0]))
    assert gpu_series([[s]], KEY) == [s] and gpu_series([[], [s]], KEY)[0] is s


def test_float_text_writes_what_the_backend_writes() -> None:
    values = np.array([62.0, 0.5, 1e16, 1.5e-7, -0.0, 33.333333333333336, 41943040000.0])
    assert float_text(values) == [
        "62",
        "0.5",
        "10000000000000000",
        "0.00000015",
        "-0",
        "33.333333333333336",
        "41943040000",
    ]


@st.composite
def restarted(draw: st.DrawFn) -> list[list[Series]]:
    """A GPU's gap-free finite series as restarts leave them: runs that together cover a stretch of
    the grid, each overlapping the last by a few points (the lookback), sometimes one inside
    another; in one source or two (the fallback's runs rank after)."""
    sources: list[list[Series]] = [[], []]
    for gpu in ("0", "1"):
        k = draw(st.integers(0, 3))
        for n in range(draw(st.integers(1, 4))):
            length = draw(st.integers(1, 8))
            values = [draw(VALUES.filter(math.isfinite)) for _ in range(length)]
            texts = [text(v).encode() for v in values]
            samples = GridSamples(FIRST + k * STEP, STEP, texts, values)
            sources[draw(st.sampled_from([0, 0, 1]))].append(Series({"gpu": gpu, "pod": f"e-{n}"}, samples))
            k = max(0, min(GRID.points - 8, k + length - draw(st.integers(0, length))))
    return sources


@settings(max_examples=400, deadline=None)
@given(restarted(), st.sampled_from(list(Agg)))
def test_restarted_runs_joined_as_the_sorted_path_merges_them(
    per_source: list[list[Series]], agg: Agg
) -> None:
    """Runs of one GPU joined by slicing (their overlaps compared one by one) give what the sorted
    path gives, texts included (-0 against 0: the earlier series), and the reference's values."""
    joined, sorted_ = gpu_series(per_source, KEY), gpu_series(as_pairs(per_source), KEY)
    assert [s.labels for s in joined] == [s.labels for s in sorted_]
    want = reference(per_source)
    for a, b in zip(joined, sorted_, strict=True):
        assert shown(a.samples) == shown(b.samples)
        got = {ms: float(v) for ms, v in shown(a.samples)}
        assert got == want[a.labels["gpu"]]
    pa, pb = pod_aggregate(joined, agg, GRID), pod_aggregate(as_pairs([sorted_])[0], agg, GRID)
    assert list(pa.times) == list(pb.times)
    assert [float(v) for v in pa.values] == [float(v) for v in pb.values]


def test_runs_with_a_gap_or_a_long_overlap_are_merged_by_numpy() -> None:
    a = GridSamples(FIRST, STEP, [b"1", b"2"], [1.0, 2.0])
    gap = GridSamples(FIRST + 3 * STEP, STEP, [b"5"], [5.0])
    assert _joined_runs([(0, a), (0, gap)]) is None
    long = [
        GridSamples(FIRST, STEP, [b"1"] * 70, [1.0] * 70),
        GridSamples(FIRST, STEP, [b"2"] * 70, [2.0] * 70),
    ]
    assert _joined_runs([(0, s) for s in long]) is None
    assert _joined_runs([(0, a), (0, GridPoints(FIRST, STEP, [0], [b"NaN"], [math.nan], [0]))]) is None
    tie = _joined_runs([(0, a), (0, GridSamples(FIRST + STEP, STEP, [b"2.0", b"3"], [2.0, 3.0]))])
    assert tie is not None and tie.texts == [b"1", b"2", b"3"]  # a tie: the earlier series' text
