"""The export's chunking and encoders: every grid point in one chunk, memory flat over long windows,
Parquet streamed a row group at a time."""

from __future__ import annotations

import io
import tracemalloc
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any, cast

import anyio
import pyarrow.parquet as pq  # type: ignore[import-untyped]

from gpulens.domain.models import Execution, ExecutionStatus, RangeQuery, Series, Window
from gpulens.planning.chunking import time_chunks
from gpulens.planning.hosts import HostPlanOptions, HostTarget, plan_host
from gpulens.service.export import (
    CHUNK_MS,
    GPU_METRICS,
    HOST_METRICS,
    Export,
    ExportService,
    Gpu,
    Row,
    encode,
    whole_window,
)

DAY_MS = 86_400_000
STEP_MS = 60_000
T0 = 1_767_225_600_000  # 2026-01-01


def test_chunks_cover_every_grid_point_once() -> None:
    for start, end, step, chunk in (
        (0, 10_000, 1_000, 3_000),
        (5, 5, 15, 60),
        (0, 3_600_000, 15_000, CHUNK_MS),
    ):
        window = Window(start, end, step)
        grid = list(range(start, end + 1, step))
        got = [t for w in time_chunks(window, chunk) for t in range(w.start_ms, w.end_ms + 1, step)]
        assert got == grid
        assert all(w.end_ms - w.start_ms < chunk or chunk < step for w in time_chunks(window, chunk))


class GridBackend:
    """Answers every range query with one sample per grid point (the value: the time in minutes)."""

    name = "grid"

    async def query_range(self, query: RangeQuery) -> list[Series]:
        w = query.window
        samples = [[t / 1000, str((t // 60_000) % 1000)] for t in range(w.start_ms, w.end_ms + 1, w.step_ms)]
        return [Series({}, samples)]


def opened(days: float, gpus: int = 1) -> Export:
    """An export of `days` of data at one sample a minute, over the grid backend."""
    window = Window(T0, T0 + int(days * DAY_MS), STEP_MS)
    execution = Execution(
        execution_id="00000000-0000-4000-8000-000000000001",
        org="acme",
        hostname="node-1",
        gpus=tuple(str(g) for g in range(gpus)),
        status=ExecutionStatus.COMPLETED,
        created_at=datetime.fromtimestamp(T0 / 1000, UTC),
    )
    options = HostPlanOptions(scrape_interval_ms=STEP_MS)
    listed = [Gpu(str(g), f"GPU-{g}", str(g)) for g in range(gpus)]
    plans: list[Any] = [
        (g, whole_window(window, plan_host(GPU_METRICS, HostTarget("node-1", (g.index,)), STEP_MS, options)))
        for g in listed
    ]
    plans.append(
        (None, whole_window(window, plan_host(HOST_METRICS, HostTarget("node-1"), STEP_MS, options)))
    )
    service = ExportService(cast(Any, None), in_flight=4)
    return Export(execution, window, listed, CHUNK_MS, plans, service, GridBackend())


def drain(fmt: str, export: Export) -> tuple[int, int, int]:
    """(total bytes, pieces, largest piece), the pieces dropped as they come."""

    async def run() -> tuple[int, int, int]:
        total = pieces = largest = 0
        async for piece in encode(fmt, export.hostname, export.batches()):
            total += len(piece)
            pieces += 1
            largest = max(largest, len(piece))
        return total, pieces, largest

    return anyio.run(run)


def peak_bytes(fmt: str, days: float) -> tuple[int, int]:
    export = opened(days)
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        before = tracemalloc.get_traced_memory()[0]
        total, _, _ = drain(fmt, export)
        peak = tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()
    return peak, total


def test_memory_stays_flat_over_a_long_window() -> None:
    """Two days take no more memory than half a day: an hour of rows at a time, none kept."""
    for fmt in ("csv", "json"):
        peak1, total1 = peak_bytes(fmt, 0.5)
        peak4, total4 = peak_bytes(fmt, 2)
        assert total4 > 3.9 * total1
        assert peak4 < 1.25 * peak1 + 64_000, (fmt, peak1, peak4)
        assert peak4 < total4 / 3, (fmt, peak4, total4)


def test_parquet_is_streamed_one_row_group_per_hour() -> None:
    export = opened(2, gpus=2)
    total, pieces, largest = drain("parquet", export)
    hours = export.chunk_count
    assert hours == 49
    assert pieces >= hours  # a piece per row group, then the footer
    assert largest < total / 3  # the footer (the row groups' metadata) is the largest

    async def whole() -> bytes:
        return b"".join([p async for p in encode("parquet", export.hostname, export.batches())])

    table = pq.read_table(io.BytesIO(anyio.run(whole)))
    per_time = 2 * len(GPU_METRICS) + len(HOST_METRICS)
    assert table.num_rows == (2 * 1440 + 1) * per_time
    assert pq.ParquetFile(io.BytesIO(anyio.run(whole))).num_row_groups == hours


def test_rows_are_sorted_by_time_gpu_metric() -> None:
    async def first_batch() -> list[Row]:
        batches: AsyncIterator[list[Row]] = opened(0.01, gpus=2).batches()
        async for rows in batches:
            return rows
        return []

    rows = anyio.run(first_batch)
    keys = [m.lyceum for m in GPU_METRICS]
    first = [(r.gpu, r.metric) for r in rows if r.timestamp_ms == T0]
    assert first == [("0", k) for k in keys] + [("1", k) for k in keys] + [
        ("", m.lyceum) for m in HOST_METRICS
    ]
    assert [r.timestamp_ms for r in rows] == sorted(r.timestamp_ms for r in rows)
