"""The Lyceum reads both archive suites replay (live vs archived): windows and steps that cross an
execution's start and end, up to the archive's 10-minute margin."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from gpulens.domain.timeparse import format_rfc3339_ms


class Run(Protocol):
    @property
    def execution_id(self) -> str: ...
    @property
    def start_s(self) -> int: ...
    @property
    def end_s(self) -> int: ...


def lyceum_reads(executions: Iterable[Run]) -> list[tuple[str, dict[str, str]]]:
    """(path, params) per read: the whole run at the default and odd steps, windows that start before
    the run, end after it, and a step whose rate window reaches the margin."""
    out: list[tuple[str, dict[str, str]]] = []
    for e in executions:
        path = f"/api/v2/external/execution/{e.execution_id}/metrics"
        start, end = e.start_s * 1000, e.end_s * 1000

        def window(step: str, lo: int, hi: int) -> tuple[str, dict[str, str]]:
            return path, {"step": step, "start": format_rfc3339_ms(lo), "end": format_rfc3339_ms(hi)}

        out += [
            (path, {}),
            (path, {"step": "5s"}),
            window("7s", start + 7_000, start + 2_407_000),
            window("1m", start - 900_000, start + 900_000),
            window("30s", end - 600_000, end + 1_200_000),
            (path, {"step": "2m30s"}),
            (path, {"step": "10m"}),  # the rate window reaches the archive's margin
        ]
    return out
