"""Run:ai shaping: decimal text, per-GPU order, counts per interval as whole numbers."""

from __future__ import annotations

import orjson
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from gpulens.backends import promjson
from gpulens.domain.models import GridSamples, Series, Window
from gpulens.shaping.runai import Point, Points, bucket_counts, counts, decimal_text, per_gpu, points


@pytest.mark.parametrize(
    ("raw", "text"),
    [
        ("85", "85"),
        ("97.5", "97.5"),
        ("1.5e+09", "1500000000"),
        ("2.5E-05", "0.000025"),
        ("NaN", None),
        ("+Inf", None),
        ("-Inf", None),
        ("-3", "-3"),
        ("1e+21", "1000000000000000000000"),
    ],
)
def test_decimal_text(raw: str, text: str | None) -> None:
    out = decimal_text(raw)
    assert out == text
    if out is not None:
        assert "e" not in out.lower() and float(out) == float(raw)


def test_per_gpu_sorted_numerically_with_mig_instances() -> None:
    g = Window(0, 0, 1)
    s = [
        Series({"gpu": "10"}, [[0, "1"]]),
        Series({"gpu": "2"}, [[0, "2"]]),
        Series({"gpu": "0", "GPU_I_ID": "2"}, [[0, "3"]]),
        Series({"gpu": "0", "GPU_I_ID": "1"}, [[0, "4"]]),
    ]
    assert [labels for labels, _ in per_gpu(s, g)] == [
        {"gpu": "0", "gpuInstance": "1"},
        {"gpu": "0", "gpuInstance": "2"},
        {"gpu": "2"},
        {"gpu": "10"},
    ]


def test_counts_are_rounded_whole_numbers() -> None:
    g = Window(0, 20_000, 10_000)
    got = counts([Series({}, [[0, "10.4"], [10, "10.6"], [20, "-0.2"]])], g)
    assert [(p.ms, p.value) for p in got] == [(0, "10"), (10_000, "11"), (20_000, "0")]
    assert counts([], g) == []


def test_counts_of_a_split_answer_are_merged() -> None:
    """Every series counts (was: only the first); a timestamp two series share keeps the first's value."""
    g = Window(0, 20_000, 10_000)
    got = counts([Series({"a": "1"}, [[0, "1"], [10, "2"]]), Series({"a": "2"}, [[10, "7"], [20, "3"]])], g)
    assert [(p.ms, p.value) for p in got] == [(0, "1"), (10_000, "2"), (20_000, "3")]


def test_bucket_counts_cumulative_over_le_with_inf_last() -> None:
    g = Window(0, 10_000, 10_000)

    def b(le: str, vals: list[float]) -> Series:
        return Series({"le": le}, [[t * 10, str(v)] for t, v in enumerate(vals)])

    series = [b("+Inf", [20.2, 1]), b("0.1", [3.1, 0]), b("1.0", [11.8, 1.2]), b("0.5", [2.9, 0])]
    got = bucket_counts(series, g)
    assert [p.ms for p in got] == [0, 10_000]
    assert list(got[0].counts.items()) == [("0.1", "3"), ("0.5", "3"), ("1.0", "12"), ("+Inf", "20")]
    assert list(got[1].counts.items()) == [("0.1", "0"), ("0.5", "0"), ("1.0", "1"), ("+Inf", "1")]


def _grid(first_ms: int, step_ms: int, texts: list[str]) -> GridSamples:
    return GridSamples(first_ms, step_ms, [t.encode() for t in texts], [float(t) for t in texts])


@pytest.mark.parametrize(
    ("first_ms", "step_ms", "window"),
    [
        (0, 1_000, Window(0, 9_000, 1_000)),  # the whole grid
        (0, 1_000, Window(2_500, 6_000, 500)),  # clipped at both ends, off the samples' step
        (5_000, 1_000, Window(0, 3_000, 1_000)),  # before the samples: nothing
        (-3_000, 2_000, Window(0, 100_000, 1_000)),  # starting before the window
    ],
)
def test_grid_samples_shape_as_their_listed_samples(first_ms: int, step_ms: int, window: Window) -> None:
    texts = ["1", "2.5", "1e+21", "3E-7", "0", "-4", "7", "8.25", "9", "10"]
    grid = _grid(first_ms, step_ms, texts)
    listed = [[(first_ms + k * step_ms) / 1000, t] for k, t in enumerate(texts)]
    assert per_gpu([Series({"gpu": "0"}, grid)], window) == per_gpu([Series({"gpu": "0"}, listed)], window)
    assert counts([Series({}, grid)], window) == counts([Series({}, listed)], window)


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(1, 3), st.sampled_from(["1", "2.5", "1e+21", "NaN", "+Inf", "-Inf", "0"])),
        min_size=1,
        max_size=40,
    ),
    st.integers(-5, 5),
    st.integers(-5, 5),
)
def test_grid_points_shape_as_their_listed_samples(
    steps: list[tuple[int, str]], lo_off: int, hi_off: int
) -> None:
    """A grid with gaps and NaN (VictoriaMetrics' missed scrapes, a NaN burst), decoded as the backend
    hands it on, clipped anywhere: the same points as the listed samples."""
    at, texts = [], []
    ms = 1_767_225_600_000
    for gap, text in steps:
        ms += gap * 15_000
        at.append(ms)
        texts.append(text)
    listed = [[t / 1000, v] for t, v in zip(at, texts, strict=True)]
    decoded = promjson.grid_samples(orjson.dumps(listed), 15_000)
    assert decoded is not None
    assume(at[0] + lo_off * 15_000 <= at[-1] + hi_off * 15_000)
    window = Window(at[0] + lo_off * 15_000, at[-1] + hi_off * 15_000, 15_000)
    assert per_gpu([Series({"gpu": "0"}, decoded)], window) == per_gpu([Series({"gpu": "0"}, listed)], window)


def test_grid_bucket_counts_equal_the_listed_ones() -> None:
    window = Window(0, 5_000, 1_000)
    rows = {"0.5": ["1", "2", "0", "3"], "1": ["2", "2", "1", "5"], "+Inf": ["4", "3", "1", "5"]}
    for first_ms in (0, 1_000, 3_000, -1_000):
        grid = [Series({"le": le}, _grid(first_ms, 1_000, v)) for le, v in rows.items()]
        listed = [
            Series({"le": le}, [[(first_ms + k * 1_000) / 1000, x] for k, x in enumerate(v)])
            for le, v in rows.items()
        ]
        assert bucket_counts(grid, window) == bucket_counts(listed, window)
    other_step = [Series({"le": le}, _grid(0, 500, v)) for le, v in rows.items()]  # the general path
    listed = [Series({"le": le}, [[k * 0.5, x] for k, x in enumerate(v)]) for le, v in rows.items()]
    assert bucket_counts(other_step, window) == bucket_counts(listed, window)


def _reference_buckets(
    rows: dict[str, list[float | None]], start: int, step: int
) -> list[tuple[int, dict[str, str]]]:
    """The per-cell rule, written out: cumulative over le (sorted, +Inf last), rounded half to even,
    never below 0 nor below a smaller bucket; a point where no bucket has a value is left out."""
    order = sorted(rows, key=lambda le: float("inf") if le == "+Inf" else float(le))
    n = len(next(iter(rows.values())))
    out = []
    for k in range(n):
        if all(rows[le][k] is None for le in order):
            continue
        running, result = 0, {}
        for le in order:
            x = rows[le][k]
            if x is not None:
                running = max(running, round(x))
            result[le] = str(running)
        out.append((start + k * step, result))
    return out


@settings(max_examples=200, deadline=None)
@given(
    st.integers(1, 6).flatmap(
        lambda n: st.dictionaries(
            st.sampled_from(["0.1", "0.5", "1", "2.5", "10", "+Inf"]),
            st.lists(
                st.one_of(st.none(), st.floats(-5, 1e6), st.sampled_from([0.5, 1.5, 2.5, -0.5])),
                min_size=n,
                max_size=n,
            ),
            min_size=1,
        )
    )
)
def test_bucket_counts_follow_the_per_cell_rule(rows: dict[str, list[float | None]]) -> None:
    n = len(next(iter(rows.values())))
    window = Window(0, (n - 1) * 1_000, 1_000)
    series = [
        Series({"le": le}, [[k, repr(x)] for k, x in enumerate(values) if x is not None])
        for le, values in rows.items()
    ]
    got = [(b.ms, b.counts) for b in bucket_counts(series, window)]
    assert got == _reference_buckets(rows, 0, 1_000)


def test_points_are_two_columns_read_as_points() -> None:
    """No object per point until one is read: a grid's times stay a range; equal to the same points
    however their times are held, and to a list of Points."""
    on_grid = points(_grid(0, 1_000, ["1", "2.5", "1e+21"]), Window(0, 9_000, 1_000))
    assert isinstance(on_grid.times, range) and on_grid.values == ["1", "2.5", "1000000000000000000000"]
    listed = points([[0, "1"], [1, "2.5"], [2, "1e+21"]], Window(0, 9_000, 1_000))
    assert on_grid == listed == [Point(0, "1"), Point(1_000, "2.5"), Point(2_000, "1000000000000000000000")]
    assert len(on_grid) == 3 and on_grid[1] == Point(1_000, "2.5") and on_grid[1:] == listed[1:]
    assert on_grid != Points([0, 1_000, 2_000], ["1", "2.5", "1"]) and not Points()
    with pytest.raises(ValueError, match="one value a time"):
        Points([0], [])
