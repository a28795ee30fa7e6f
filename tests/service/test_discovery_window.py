"""The discovery loop's windows are bounded (GPULENS_DISCOVERY_MAX_WINDOW): after an outage it
catches up in windows of at most that length instead of one query over the whole gap."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from pathlib import Path

import anyio
import pytest

from gpulens.config import Settings
from gpulens.domain.errors import BackendUnavailable
from gpulens.domain.models import RangeQuery, Series
from gpulens.domain.timeparse import parse_duration_ms
from gpulens.service.discovery import DiscoveryReport, discovery_task, next_window
from gpulens.storage.registry import Registry

HOUR_MS = 3_600_000
DAY_MS = 24 * HOUR_MS
NOW = 1_767_225_600_000
_RANGE = re.compile(r"\[([0-9a-z]+)(?::[0-9a-z]+)?\]")


class DownThenUp:
    """A backend that refuses every instant query while `down`, else answers no series; it records
    (evaluation time, longest range selector) of every query it answered."""

    name = "test backend"

    def __init__(self) -> None:
        self.down = True
        self.answered: list[tuple[int, int]] = []

    async def query(self, expr: str, time_ms: int) -> list[Series]:
        if self.down:
            raise BackendUnavailable(self.name, "the metrics backend is unreachable (ConnectError)")
        spans = [parse_duration_ms(m) for m in _RANGE.findall(expr)]
        self.answered.append((time_ms, max(spans)))
        return []

    async def query_range(self, query: RangeQuery) -> list[Series]:
        raise AssertionError("discovery asks instant queries only")

    async def series_labels(self, match: str, label: str, start_ms: int, end_ms: int) -> list[str]:
        raise AssertionError("not used")

    async def series(self, match: str, start_ms: int, end_ms: int) -> list[dict[str, str]]:
        raise AssertionError("not used")

    async def query_raw(self, match: str, start_ms: int, end_ms: int) -> list[Series]:
        raise AssertionError("not used")

    async def ready(self) -> None:
        return None

    async def aclose(self) -> None:
        return None


def test_first_window_is_capped() -> None:
    assert next_window(None, NOW, first_window_s=86_400, max_window_s=7_200) == (NOW - 2 * HOUR_MS, NOW)
    assert next_window(None, NOW, first_window_s=3_600, max_window_s=7_200) == (NOW - HOUR_MS, NOW)


def test_later_windows_overlap_and_are_capped() -> None:
    # on time: from the last end minus the overlap to now
    assert next_window(NOW - 60_000, NOW, max_window_s=86_400, overlap_s=600) == (NOW - 660_000, NOW)
    # a 10-day gap: one day from the last end minus the overlap, not 10 days
    last = NOW - 10 * DAY_MS
    start, end = next_window(last, NOW, max_window_s=86_400, overlap_s=600)
    assert (start, end) == (last - 600_000, last - 600_000 + DAY_MS)
    # each window ends after the previous one even when the overlap is longer than a window
    start, end = next_window(last, NOW, max_window_s=1, overlap_s=600)
    assert start == last - 600_000 and end == last + 1000


def test_discovery_catches_up_in_bounded_windows_after_an_outage(tmp_path: Path) -> None:
    """Down for 3 days (ticks a day apart), then up: the windows that follow are at most 6 h each,
    overlap by 10 min, cover the gap in order, and the last reaches the present."""
    registry = Registry.from_url(f"sqlite:///{tmp_path / 'r.db'}")
    registry.migrate()
    backend = DownThenUp()
    ticks = iter([NOW - 3 * DAY_MS, NOW - 2 * DAY_MS, NOW - DAY_MS])
    now_ms = NOW - 3 * DAY_MS
    reports: list[DiscoveryReport] = []

    def clock() -> datetime:
        return datetime.fromtimestamp(now_ms / 1000, UTC)

    async def go() -> None:
        nonlocal now_ms
        async with anyio.create_task_group() as tg:

            def on_report(report: DiscoveryReport) -> None:
                reports.append(report)
                if report.end_ms == NOW:
                    tg.cancel_scope.cancel()

            async def loop() -> None:
                await discovery_task(
                    backend, registry, "acme", interval_s=0.01, max_window_s=6 * 3600, overlap_s=600,
                    clock=clock, on_report=on_report,
                )  # fmt: skip

            tg.start_soon(loop)
            # the first run (a 6 h window, not the default day) succeeds, then three days of failures
            backend.down = False
            with anyio.fail_after(10):
                while not reports:
                    await anyio.sleep(0.005)
            backend.down = True
            for t in ticks:
                now_ms = t
                await anyio.sleep(0.05)
            now_ms = NOW
            backend.down = False
            with anyio.fail_after(20):
                await anyio.sleep_forever()

    anyio.run(go)
    registry.dispose()
    first, *rest = reports
    assert (first.start_ms, first.end_ms) == (NOW - 3 * DAY_MS - 6 * HOUR_MS, NOW - 3 * DAY_MS)
    assert len(rest) >= 12  # 3 days in windows of at most 6 h (less the overlaps)
    previous_end = first.end_ms
    for r in rest:
        assert r.end_ms - r.start_ms <= 6 * HOUR_MS
        assert r.start_ms == previous_end - 600_000  # overlaps the last window, leaves no gap
        previous_end = r.end_ms
    assert previous_end == NOW
    # what the backend was asked: never a range longer than 6 h
    assert backend.answered and max(span for _, span in backend.answered) <= 6 * HOUR_MS


def test_max_window_setting(tmp_path: Path) -> None:
    assert Settings(data_dir=tmp_path).discovery_max_window == 86_400
    assert Settings(data_dir=tmp_path, discovery_max_window=7200).discovery_max_window == 7200
    with pytest.raises(ValueError, match="discovery_max_window"):
        Settings(data_dir=tmp_path, discovery_max_window=60)
