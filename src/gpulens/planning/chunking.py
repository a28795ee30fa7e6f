"""Split a grid into backend-sized chunks that tile it exactly, and size steps that fit."""

from __future__ import annotations

import math
from collections.abc import Iterator

from gpulens.domain.errors import InvalidRequest
from gpulens.domain.models import Window
from gpulens.domain.timeparse import format_duration_ms


def check_size(window: Window, max_points_per_series: int) -> None:
    """Refuse grids over the configured maximum, naming the smallest whole-second step that fits."""
    if window.points <= max_points_per_series:
        return
    # smallest whole-second step s with span // s + 1 <= max, i.e. s * max > span
    step_s = (window.end_ms - window.start_ms) // (max_points_per_series * 1000) + 1
    raise InvalidRequest(
        f"the window holds {window.points} points per series at step {format_duration_ms(window.step_ms)}, "
        f"more than the maximum of {max_points_per_series}; use step={format_duration_ms(step_s * 1000)} "
        "or larger, or a shorter window"
    )


def interval_step(span_ms: int, interval_ms: int, max_points: int) -> int:
    """The scrape interval, or the smallest multiple of it that keeps a grid over `span_ms` within
    `max_points` points (summaries and exports read at the native resolution when they can)."""
    if span_ms <= 0:
        return interval_ms
    return interval_ms * max(1, math.ceil(span_ms / max(1, max_points - 1) / interval_ms))


def chunks(window: Window, max_points_per_query: int) -> list[Window]:
    """Windows on the same grid, each with (end-start)/step <= max_points_per_query.

    Chunk i holds grid points k in [i*(m+1), i*(m+1)+m] with m = max_points_per_query, so borders
    neither repeat nor skip a point.
    """
    per_chunk = max_points_per_query + 1
    out: list[Window] = []
    k = 0
    total = window.points
    while k < total:
        last = min(k + per_chunk, total) - 1
        out.append(
            Window(
                window.start_ms + k * window.step_ms, window.start_ms + last * window.step_ms, window.step_ms
            )
        )
        k = last + 1
    return out


def time_chunks(window: Window, chunk_ms: int) -> Iterator[Window]:
    """The window's grid split into consecutive pieces of at most chunk_ms (each point in one piece),
    made one at a time as they are asked for: a window of centuries costs nothing before its first piece
    (an export streams its first hour while the rest are still to come)."""
    step = window.step_ms
    per = max(1, chunk_ms // step)
    start = window.start_ms
    while start <= window.end_ms:
        end = min(window.end_ms, start + (per - 1) * step)
        yield Window(start, end, step)
        start = end + step


def time_chunk_count(window: Window, chunk_ms: int) -> int:
    """How many pieces `time_chunks` makes, without making them."""
    per = max(1, chunk_ms // window.step_ms)
    return -(-window.points // per)
