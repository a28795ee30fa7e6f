"""Evaluator semantics on hand-made series (Prometheus 2.42 on backfilled data)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import anyio
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpulens.backends.embedded import EmbeddedBackend, format_value
from gpulens.backends.embedded.arith import prom_avg
from gpulens.backends.embedded.backend import format_points, format_time
from gpulens.domain.errors import BackendBadResponse
from gpulens.domain.models import RangeQuery, Window


class FakeSource:
    """A SampleSource over literal series: (labels incl. __name__, [(t_ms, value)])."""

    in_memory = False

    def __init__(self, series: Sequence[tuple[dict[str, str], list[tuple[int, float]]]]) -> None:
        self.series = series

    def select_arrays(
        self, metric: str, matchers: Sequence[tuple[str, str, str]], start_ms: int, end_ms: int
    ) -> list[tuple[dict[str, str], np.ndarray, np.ndarray]]:
        return [
            (labels, np.array([t for t, _ in pts], dtype=np.int64), np.array([v for _, v in pts]))
            for labels, pts in self._select(metric, matchers, start_ms, end_ms)
        ]

    def select_labels(
        self, metric: str, matchers: Sequence[tuple[str, str, str]], start_ms: int, end_ms: int
    ) -> list[dict[str, str]]:
        return [labels for labels, _ in self._select(metric, matchers, start_ms, end_ms)]

    def _select(
        self, metric: str, matchers: Sequence[tuple[str, str, str]], start_ms: int, end_ms: int
    ) -> list[tuple[dict[str, str], list[tuple[int, float]]]]:
        import re

        out = []
        for labels, samples in self.series:
            if metric and labels["__name__"] != metric:
                continue
            ok = True
            for lbl, op, val in matchers:
                have = labels.get(lbl, "")
                hit = {"=": have == val, "!=": have != val}.get(op)
                if hit is None:
                    m = re.fullmatch(val, have) is not None
                    hit = m if op == "=~" else not m
                ok = ok and hit
            pts = [(t, v) for t, v in samples if start_ms <= t <= end_ms]
            if ok and pts:
                out.append((dict(labels), pts))
        return out


def run(source: FakeSource, expr: str, start: int, end: int, step: int) -> list[tuple[dict[str, str], list]]:
    backend = EmbeddedBackend(source)
    got = anyio.run(backend.query_range, RangeQuery(expr, Window(start, end, step)))
    return [(s.labels, [list(p) for p in s.samples]) for s in got]


def gauge(
    name: str, values: dict[int, float], **labels: str
) -> tuple[dict[str, str], list[tuple[int, float]]]:
    return ({"__name__": name, **labels}, sorted(values.items()))


def test_lookback_is_closed_and_five_minutes() -> None:
    src = FakeSource([gauge("m", {0: 1.0, 60_000: 2.0}, a="x")])
    got = run(src, "m", 0, 420_000, 30_000)
    assert got == [
        (
            {"__name__": "m", "a": "x"},
            [[0, "1"], [30, "1"], [60, "2"], [90, "2"], [120, "2"], [150, "2"], [180, "2"], [210, "2"],
             [240, "2"], [270, "2"], [300, "2"], [330, "2"], [360, "2"]],
        )
    ]  # fmt: skip


def test_or_left_wins_per_label_set_and_step() -> None:
    src = FakeSource(
        [gauge("a", {0: 1.0}, g="0"), gauge("b", {0: 5.0, 600_000: 6.0}, g="0"), gauge("b", {0: 7.0}, g="1")]
    )
    got = run(src, "max by (g) (a) or max by (g) (b)", 0, 600_000, 600_000)
    assert got == [({"g": "0"}, [[0, "1"], [600, "6"]]), ({"g": "1"}, [[0, "7"]])]


def test_vector_matching_drops_name_and_needs_all_labels() -> None:
    src = FakeSource(
        [
            gauge("u", {0: 1.0}, g="0"),
            gauge("f", {0: 3.0}, g="0"),
            gauge("u", {0: 2.0}, g="1"),
            gauge("f", {0: 2.0}, g="2"),
        ]
    )
    assert run(src, "u / (u + f)", 0, 0, 1) == [({"g": "0"}, [[0, "0.25"]])]
    assert run(src, "100 * sum(u)", 0, 0, 1) == [({}, [[0, "300"]])]
    assert run(src, "count(u)", 0, 0, 1) == [({}, [[0, "2"]])]
    assert run(src, "min(u) - 1", 0, 0, 1) == [({}, [[0, "0"]])]


def test_scalar_expression_is_one_unlabelled_series() -> None:
    assert run(FakeSource([]), "1 + 2", 0, 2000, 1000) == [({}, [[0, "3"], [1, "3"], [2, "3"]])]


def test_division_by_zero_is_ieee() -> None:
    src = FakeSource([gauge("z", {0: 0.0}), gauge("o", {0: 1.0})])
    assert run(src, "sum(o) / sum(z)", 0, 0, 1) == [({}, [[0, "+Inf"]])]
    assert run(src, "sum(z) / sum(z)", 0, 0, 1) == [({}, [[0, "NaN"]])]


def test_rate_and_increase_by_hand() -> None:
    """Prometheus' extrapolatedRate, worked by hand. At t=80 s the 1 m window [20, 80] holds
    (30, 25) (45, 30) (60, 2) (75, 8): 8 - 25 + 30 (the reset) = 13 over 45 s sampled; the edges are
    10 s and 5 s away, both under 1.1 x the 15 s interval, so 13 x 60/45 / 60 = 0.2888..."""
    pts = {
        t: float(v)
        for t, v in zip(
            range(0, 300_000, 15_000),
            [0, 10, 25, 30, 2, 8, 20, 21, 40, 44, 50, 51, 60, 70, 71, 80, 90, 91, 95, 99],
            strict=True,
        )
    }
    src = FakeSource([gauge("c", pts, cpu="0")])
    got = run(src, "rate(c[1m])", 60_000, 240_000, 20_000)
    assert got == [
        (
            {"cpu": "0"},
            [
                [60, "0.5333333333333333"],  # [0, 60] exactly: 2 - 0 + 30 (the reset) = 32, 32/60
                [80, "0.28888888888888886"],
                [100, "0.4444444444444444"],
                [120, "0.6333333333333333"],
                [140, "0.5333333333333332"],
                [160, "0.6444444444444444"],
                [180, "0.3333333333333333"],
                [200, "0.4444444444444444"],
                [220, "0.4444444444444444"],
                [240, "0.5"],
            ],
        )
    ]
    # [120, 240] holds 40 .. 90 on the grid's edges exactly: 90 - 40 = 50, nothing to extrapolate
    assert run(src, "increase(c[2m])", 240_000, 240_000, 1) == [({"cpu": "0"}, [[240, "50"]])]


def test_histogram_quantile_and_label_replace() -> None:
    buckets = [gauge("h_bucket", {0: v}, le=le) for le, v in (("0.1", 1.0), ("1", 3.0), ("+Inf", 4.0))]
    src = FakeSource(buckets)
    got = run(
        src, 'label_replace(histogram_quantile(0.5, sum by (le) (h_bucket)), "q", "p50", "", "")', 0, 0, 1
    )
    # rank 0.5 x 4 = 2 falls in (0.1, 1] holding counts 1..3: 0.1 + 0.9 x (2 - 1) / (3 - 1) = 0.55
    assert got == [({"q": "p50"}, [[0, "0.55"]])]
    got = run(src, 'label_replace(sum by (le) (h_bucket), "x", "$1-y", "le", "(.*)\\\\.1")', 0, 0, 1)
    assert [lb for lb, _ in got] == [{"le": "+Inf"}, {"le": "0.1", "x": "0-y"}, {"le": "1"}]


def test_errors_become_bad_response() -> None:
    backend = EmbeddedBackend(FakeSource([]))
    with pytest.raises(BackendBadResponse):
        anyio.run(backend.query_range, RangeQuery("sum(", Window(0, 0, 1)))
    with pytest.raises(BackendBadResponse, match="11,000"):
        anyio.run(backend.query_range, RangeQuery("1", Window(0, 11_001_000, 1000)))


def test_instant_query_and_series_labels() -> None:
    src = FakeSource([gauge("m", {0: 1.5}, a="x"), gauge("n", {0: 1.0}, a="y")])
    backend = EmbeddedBackend(src)
    got = anyio.run(backend.query, "sum(m)", 60_000)
    assert [(s.labels, s.samples) for s in got] == [({}, [(60, "1.5")])]
    assert anyio.run(backend.series_labels, '{__name__=~"m|n"}', "a", 0, 10) == ["x", "y"]
    assert anyio.run(backend.series_labels, "m", "a", 10, 20) == []


@pytest.mark.parametrize(
    ("value", "text"),
    [(1.0, "1"), (-0.0, "-0"), (0.1, "0.1"), (1e22, "10000000000000000000000"), (1.5e-7, "0.00000015"),
     (123456789.125, "123456789.125"), (math.nan, "NaN"), (math.inf, "+Inf"), (-math.inf, "-Inf"),
     (2.5e-5, "0.000025")],
)  # fmt: skip
def test_format_value_is_go_f_minus_one(value: float, text: str) -> None:
    assert format_value(value) == text


@given(st.floats(allow_nan=False, allow_infinity=False))
def test_format_value_round_trips(value: float) -> None:
    text = format_value(value)
    assert "e" not in text.lower() and float(text) == value


def test_format_time() -> None:
    assert format_time(1_700_000_000_000) == 1_700_000_000
    assert format_time(1_700_000_000_250) == 1_700_000_000.25


@given(st.lists(st.floats(), min_size=1, max_size=50))
def test_formatting_on_arrays_is_format_value(values: list[float]) -> None:
    """`format_points` (whole numbers through int, repr without exponent, the rest one by one) writes
    each value as `format_value` does, -0 and NaN included, and times as `format_time`."""
    times = [1_700_000_000_000 + 250 * i for i in range(len(values))]
    got = format_points(np.array(times, dtype=np.int64), np.array(values, dtype=np.float64))
    assert got == [(format_time(t), format_value(v)) for t, v in zip(times, values, strict=True)]


def test_formatting_edges() -> None:
    values = [0.0, -0.0, 1e15, 1e15 - 1, 999999999999999.9, 1e-4, 9.99e-5, -2.5, 5e-324, 1.5, 1.5, 3.0]
    got = format_points(np.arange(len(values), dtype=np.int64) * 1000, np.array(values))
    assert [text for _, text in got] == [format_value(v) for v in values]
    assert [t for t, _ in got] == list(range(len(values))) and all(type(t) is int for t, _ in got)


def test_aggregations_fold_whole_grids_like_prometheus() -> None:
    """Folded on arrays: avg is the incremental mean (an infinite mean stays), max/min skip a NaN
    start, count counts, sums group `by` labels; a step no series has is left out."""
    src = FakeSource(
        [
            gauge("m", {0: 1.0, 60_000: math.inf, 120_000: math.nan}, gpu="0", pod="a"),
            gauge("m", {0: 2.0, 60_000: 5.0, 120_000: 4.0}, gpu="1", pod="a"),
            gauge("m", {0: 4.0, 60_000: -math.inf}, gpu="2", pod="b"),
        ]
    )
    lb = 300_000
    t = [0, 60_000, 120_000, 120_000 + lb + 60_000]

    def values(expr: str) -> list[list[list[object]]]:
        return [pts for _, pts in run(src, expr, 0, t[-1], 60_000)]

    avg = values("avg(m)")[0]
    assert avg[0] == [0, format_value(prom_avg([1.0, 2.0, 4.0]))]
    assert avg[1] == [60, "NaN"]  # inf, then 5 (kept: +Inf), then -Inf: NaN
    assert avg[2][1] == "NaN"  # NaN, 4, -Inf (still visible at 120 s)
    assert values("max(m)")[0][2] == [120, "4"] and values("min(m)")[0][2] == [120, "-Inf"]
    assert values("count(m)")[0][0] == [0, "3"]
    by_pod = run(src, "sum by (pod) (m)", 0, 0, 60_000)
    assert by_pod == [({"pod": "a"}, [[0, "3"]]), ({"pod": "b"}, [[0, "4"]])]
    assert [p[0] for p in values("sum(m)")[0]] == list(range(0, 421, 60))  # 480: none left


def test_many_to_many_and_duplicate_label_sets_are_errors() -> None:
    src = FakeSource(
        [
            gauge("a", {0: 1.0}, gpu="0"),
            gauge("b", {0: 2.0}, gpu="0", x="1"),
            gauge("b", {0: 3.0}, gpu="0", x="2"),
            gauge("c", {0: 3.0}, gpu="0", x="1"),
        ]
    )
    with pytest.raises(BackendBadResponse, match="many-to-many"):
        run(src, 'b + {__name__=~"b|c"}', 0, 0, 1)
    with pytest.raises(BackendBadResponse, match="same labelset"):
        run(src, "label_replace(b, 'x', '', 'x', '.*')", 0, 0, 1)
    # one match per step is fine even when two series share the signature at other steps
    ok = FakeSource(
        [
            gauge("a", {0: 1.0, 600_000: 1.0}, gpu="0"),
            gauge("b", {0: 2.0}, gpu="0"),
            gauge("c", {600_000: 5.0}, gpu="0"),
        ]
    )
    assert run(ok, "a * (b or c)", 0, 600_000, 600_000) == [({"gpu": "0"}, [[0, "2"], [600, "5"]])]


def test_remembered_texts_are_bounded_and_stay_right(monkeypatch: pytest.MonkeyPatch) -> None:
    from gpulens.backends.embedded import backend

    monkeypatch.setattr(backend, "TEXTS_MAX", 8)
    times = np.arange(20, dtype=np.int64) * 1000
    for rounds in range(3):
        values = np.arange(20) / 7 + rounds
        got = [text for _, text in format_points(times, values)]
        assert got == [format_value(v) for v in values.tolist()]
        assert len(backend._TEXTS) <= 8 + 20


def test_an_in_memory_source_answers_the_same_without_the_thread_hop() -> None:
    """Over a decoded archive small grids and look-ups run on the event loop; the answers are those of
    the worker-thread path, for small and large grids alike."""
    from gpulens.storage.archive import ArchiveSource

    times = np.arange(0, 3_600_000, 15_000, dtype=np.int64)
    src = ArchiveSource(
        [({"__name__": "m", "gpu": str(g)}, times, np.sin(times / 1e6 + g) * 100) for g in range(3)]
    )
    inline, threaded = EmbeddedBackend(src), EmbeddedBackend(src)
    threaded._in_memory = False
    assert inline._in_memory
    for step in (500, 15_000, 600_000):  # 7,201 points (a thread), then 241 and 7 (inline)
        q = RangeQuery("avg(m) * 2 or m", Window(0, 3_600_000, step))
        assert anyio.run(inline.query_range, q) == anyio.run(threaded.query_range, q)
    assert anyio.run(inline.series, "m", 0, 0) == anyio.run(threaded.series, "m", 0, 0)
    assert anyio.run(inline.query, "m", 60_000) == anyio.run(threaded.query, "m", 60_000)
