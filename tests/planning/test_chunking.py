"""Chunks tile the grid exactly; oversized grids name a step that fits; an export's time chunks are made
one at a time (a window of centuries costs nothing before its first chunk)."""

from __future__ import annotations

import itertools
import time
import tracemalloc

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpulens.domain.errors import InvalidRequest
from gpulens.domain.models import Window
from gpulens.planning.chunking import check_size, chunks, time_chunk_count, time_chunks


def grid(w: Window) -> list[int]:
    return list(range(w.start_ms, w.end_ms + 1, w.step_ms))


@given(
    start=st.integers(min_value=0, max_value=2_000_000_000_000),
    span=st.integers(min_value=0, max_value=40 * 86_400_000),
    step=st.integers(min_value=1000, max_value=3_600_000),
    limit=st.integers(min_value=10, max_value=11_000),
)
def test_chunks_tile_the_grid(start: int, span: int, step: int, limit: int) -> None:
    w = Window(start, start + span, step)
    if w.points > 200_000:
        return
    parts = chunks(w, limit)
    joined = [t for p in parts for t in grid(p)]
    assert joined == grid(w)
    assert all((p.end_ms - p.start_ms) // p.step_ms <= limit for p in parts)
    assert all(p.step_ms == step for p in parts)


def test_prometheus_limit_border() -> None:
    # 11,001 points pass Prometheus' (end-start)/step <= 11000 check: one chunk
    w = Window(0, 11_000 * 15_000, 15_000)
    assert chunks(w, 11_000) == [w]
    w2 = Window(0, 11_001 * 15_000, 15_000)
    parts = chunks(w2, 11_000)
    assert len(parts) == 2 and parts[1].start_ms == parts[1].end_ms == 11_001 * 15_000


def test_check_size_names_smallest_fitting_step() -> None:
    w = Window(0, 30 * 86_400_000, 5_000)  # 518,401 points
    with pytest.raises(InvalidRequest) as exc:
        check_size(w, 200_000)
    assert "step=13s" in exc.value.message
    check_size(Window(0, 30 * 86_400_000, 13_000), 200_000)
    with pytest.raises(InvalidRequest):
        check_size(Window(0, 30 * 86_400_000, 12_000), 200_000)
    # 10 s at most 2 points: 6 s is the smallest whole-second step that fits (10 // 6 + 1 == 2)
    with pytest.raises(InvalidRequest) as small:
        check_size(Window(0, 10_000, 1_000), 2)
    assert "step=6s" in small.value.message
    check_size(Window(0, 10_000, 6_000), 2)
    with pytest.raises(InvalidRequest):
        check_size(Window(0, 10_000, 5_000), 2)


def test_interval_step_is_the_interval_or_its_smallest_multiple_within_the_points() -> None:
    from gpulens.planning.chunking import interval_step

    assert interval_step(3_600_000, 15_000, 11_000) == 15_000  # 241 points: native
    assert interval_step(0, 15_000, 11_000) == 15_000
    day30 = 30 * 86_400_000
    step = interval_step(day30, 15_000, 11_000)
    assert step % 15_000 == 0 and day30 // step + 1 <= 11_000
    assert day30 // (step - 15_000) + 1 > 11_000  # the smallest such multiple


@given(
    start=st.integers(min_value=0, max_value=2_000_000_000_000),
    span=st.integers(min_value=0, max_value=86_400_000),
    step=st.integers(min_value=15_000, max_value=3_600_000),
    chunk=st.integers(min_value=1, max_value=7_200_000),
)
def test_time_chunks_tile_the_grid_and_are_counted(start: int, span: int, step: int, chunk: int) -> None:
    w = Window(start, start + span, step)
    parts = list(time_chunks(w, chunk))
    assert [t for p in parts for t in grid(p)] == grid(w)
    assert time_chunk_count(w, chunk) == len(parts)


def test_time_chunks_of_centuries_start_at_once() -> None:
    """An execution registered 1970-2261 at 15 s: 2.55 million hours. Listing them took 2.7-10 s and
    333 MiB before the export's first byte; made lazily, the first ones come at once, in a few bytes."""
    w = Window(0, 9_183_110_400_000, 15_000)  # 1970-01-01 .. 2261-01-01
    tracemalloc.start()
    try:
        started = time.perf_counter()
        first = list(itertools.islice(time_chunks(w, 3_600_000), 3))
        count = time_chunk_count(w, 3_600_000)
        elapsed = time.perf_counter() - started
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert elapsed < 0.05 and peak < 100_000, (elapsed, peak)  # was 333 MiB
    assert first == [Window(k * 3_600_000, k * 3_600_000 + 3_585_000, 15_000) for k in range(3)]
    assert count == 2_550_864 + 1  # every hour, and the window's last point alone
