"""Decoded samples on a grid: the runs of a stitched plan joined as one series, still decoded."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from gpulens.domain.models import GridPoints, GridSamples, finite_inside

T0 = 1_767_225_600_000
STEP = 15_000


def dense(first_k: int, texts: list[str]) -> GridSamples:
    return GridSamples(T0 + first_k * STEP, STEP, [t.encode() for t in texts], [float(t) for t in texts])


def sparse(first_k: int, offsets: list[int], texts: list[str]) -> GridPoints:
    bad = [k for k, t in enumerate(texts) if t in ("NaN", "+Inf", "-Inf")]
    numbers = [float(t.replace("Inf", "inf")) for t in texts]
    return GridPoints(T0 + first_k * STEP, STEP, offsets, [t.encode() for t in texts], numbers, bad)


def test_contiguous_finite_runs_join_as_grid_samples() -> None:
    joined = GridPoints.joined([dense(0, ["1", "2"]), dense(2, ["3"]), dense(3, [])])
    assert isinstance(joined, GridSamples)
    assert list(joined) == [*dense(0, ["1", "2"]), *dense(2, ["3"])]


def test_a_gap_or_a_nan_joins_as_grid_points() -> None:
    parts = [dense(0, ["1", "2"]), sparse(5, [0, 2], ["NaN", "4"]), dense(9, ["5"])]
    joined = GridPoints.joined(parts)
    assert isinstance(joined, GridPoints)
    assert list(joined) == [sample for part in parts for sample in part]
    assert joined.offsets == [0, 1, 5, 7, 9] and joined.bad == [2]
    assert math.isnan(joined.numbers[2])


def test_parts_not_on_one_grid_in_order_are_not_joined() -> None:
    assert GridPoints.joined([dense(2, ["1"]), dense(0, ["2"])]) is None  # out of order
    assert GridPoints.joined([dense(0, ["1", "2"]), dense(1, ["3"])]) is None  # overlapping
    off_grid = GridSamples(T0 + 1, STEP, [b"1"], [1.0])
    assert GridPoints.joined([dense(0, ["1"]), off_grid]) is None
    other_step = GridSamples(T0 + STEP, 1_000, [b"1"], [1.0])
    assert GridPoints.joined([dense(0, ["1"]), other_step]) is None
    assert GridPoints.joined([dense(0, ["1"]), [(T0 / 1000 + 15, "2")]]) is None  # not decoded
    assert GridPoints.joined([]) == []


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 3), st.booleans()), max_size=60),
    st.sampled_from(["1", "NaN", "-Inf", "2.5"]),
    st.integers(-3, 70),
    st.integers(-3, 70),
)
def test_finite_inside_keeps_the_finite_samples_in_bounds(
    steps: list[tuple[int, bool]], special: str, lo_k: int, hi_k: int
) -> None:
    offsets, texts, at = [], [], -1
    for gap, odd in steps:
        at += gap + 1
        offsets.append(at)
        texts.append((special if odd else "1").encode())
    bad = [k for k, t in enumerate(texts) if t in (b"NaN", b"-Inf")]
    lo, hi = T0 + lo_k * STEP, T0 + hi_k * STEP
    got = finite_inside(T0, STEP, offsets, texts, bad, lo, hi)
    pairs = enumerate(zip(offsets, texts, strict=True))
    expected = [(o, t) for k, (o, t) in pairs if lo_k <= o <= hi_k and k not in bad]
    assert list(zip(*got, strict=True)) == expected
