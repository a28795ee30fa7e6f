"""The measurement values' JSON: a grid's times formatted at once (tables of text looked up by numpy,
kept for later answers) equal, byte for byte, what formatting each point gives."""

from __future__ import annotations

import numpy as np
import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from gpulens.api.runai.metrics import _Times, _values_json
from gpulens.domain.timeparse import MAX_TIMESTAMP_MS, format_rfc3339_ms
from gpulens.shaping.gridtime import grid_texts, times_texts
from gpulens.shaping.runai import Points

LAST = 253_402_300_799_999  # 9999-12-31T23:59:59.999Z


def _reference(times: list[int], values: list[str]) -> bytes:
    items = [{"value": v, "timestamp": format_rfc3339_ms(t)} for t, v in zip(times, values, strict=True)]
    return orjson.dumps(items)


@settings(max_examples=400, deadline=None)
@given(
    st.one_of(st.integers(0, MAX_TIMESTAMP_MS), st.integers(LAST - 10**12, LAST - 10**10)),
    st.one_of(st.integers(1, 100_000), st.sampled_from([1_000, 15_000, 86_400, 3_600_000, 86_400_000])),
    st.integers(0, 100),
)
def test_a_grid_is_formatted_as_each_point(first_ms: int, step_ms: int, n: int) -> None:
    times = range(first_ms, first_ms + n * step_ms, step_ms)
    assert grid_texts(first_ms, step_ms, n) == [format_rfc3339_ms(t) for t in times]
    values = [str(k * 0.5) for k in range(n)]
    want = _reference(list(times), values)
    assert orjson.dumps(_values_json(Points(times, values), _Times())) == want
    assert orjson.dumps(_values_json(Points(list(times), values), _Times())) == want  # one by one
    assert orjson.dumps(_values_json(Points(times, values), _Times())) == want  # kept from the first


def test_the_edges_of_the_tables() -> None:
    edges = [0, 999, 1_000, 951_782_400_000, 4_107_542_399_999, LAST - 1_000, LAST]  # 2000-02-29, 2100
    for first in edges:
        assert grid_texts(first, 1, 1) == [format_rfc3339_ms(first)]
    assert grid_texts(0, 1, 0) == []


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, LAST), min_size=0, max_size=60))
def test_times_with_gaps_are_formatted_as_each_point(times: list[int]) -> None:
    """A grid with gaps (a series with missed points) is formatted at once, as each point alone."""
    assert times_texts(np.array(times, dtype=np.int64)) == [format_rfc3339_ms(t) for t in times]
    values = [str(k) for k in range(len(times))]
    assert orjson.dumps(_values_json(Points(times, values), _Times())) == _reference(times, values)
