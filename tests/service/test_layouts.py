"""HostLayouts.leaves: irregular stretches found level by level, with look-ups that stay few.

The backend is a fake that knows when each series has samples; its series look-ups answer per range,
as Prometheus' do at the ends of a series' life.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from gpulens.domain import catalog as c
from gpulens.domain.models import Window
from gpulens.planning.hosts import HostPlanOptions, HostTarget
from gpulens.planning.segments import FINEST_MS
from gpulens.service.layouts import MAX_PIECES, HostLayouts

DAY_MS = 86_400_000
T0 = 1_767_225_600_000
METRICS = [m for m in c.LYCEUM_METRICS if m.key in ("gpu_utilization_percent", "system_cpu_usage_percent")]


@dataclass
class FakeBackend:
    """Series with the span of their samples; `series` answers which have samples in [lo, hi]."""

    spans: list[tuple[dict[str, str], int, int]]
    name: str = "fake"
    lookups: list[tuple[str, int, int]] = field(default_factory=list)

    async def series(self, match: str, start_ms: int, end_ms: int) -> list[dict[str, str]]:
        self.lookups.append((match, start_ms, end_ms))

        def wanted(labels: dict[str, str]) -> bool:
            name = labels["__name__"]
            if 'mode="idle"' in match:
                return name == c.NODE_CPU_SECONDS and labels.get("mode") == "idle"
            host = labels.get("Hostname")
            return name in match and (host is None or f'Hostname="{host}"' in match)

        return [dict(s) for s, lo, hi in self.spans if lo <= end_ms and hi >= start_ms and wanted(s)]


def gpu(n: int, pod: str) -> dict[str, str]:
    return {"__name__": c.DCGM_GPU_UTIL, "Hostname": "h", "gpu": str(n), "UUID": f"GPU-{n}", "pod": pod}


def cpu() -> list[tuple[dict[str, str], int, int]]:
    return [
        (
            {"__name__": c.NODE_CPU_SECONDS, "instance": "h:9100", "cpu": "0", "mode": mode},
            T0 - DAY_MS,
            T0 + 40 * DAY_MS,
        )
        for mode in ("idle", "user")
    ]


OPTIONS = HostPlanOptions(scrape_interval_ms=15_000)


async def leaves_of(backend: FakeBackend, window: Window) -> list[tuple[int, int, bool]]:
    layouts = HostLayouts(OPTIONS)
    leaves = await layouts.leaves(backend, METRICS, HostTarget("h"), window, window.step_ms)  # type: ignore[arg-type]
    return [(p.lo_ms, p.hi_ms, bool(layout.duplicated)) for p, layout in leaves]


async def test_daily_restarts_over_thirty_days_are_guarded_only_around_themselves() -> None:
    """An exporter restart a day (new pod label, old and new series side by side for 15 s plus the
    lookback): the duplicated stretches add up to at most a few finest pieces per restart."""
    spans = cpu()
    restarts = [T0 + d * DAY_MS + 3 * 3_600_000 + 7_000 for d in range(30)]
    edges = [T0 - DAY_MS, *restarts, T0 + 40 * DAY_MS]
    for i, (lo, hi) in enumerate(itertools.pairwise(edges)):
        for n in range(4):
            spans.append((gpu(n, f"dcgm-{i}"), lo + (15_000 if i else 0), hi))
    backend = FakeBackend(spans)
    window = Window(T0, T0 + 30 * DAY_MS, 15_000)
    leaves = await leaves_of(backend, window)
    guarded = sum(hi - lo for lo, hi, dup in leaves if dup)
    assert guarded <= 30 * 3 * FINEST_MS
    for t in restarts:  # every restart's overlap is guarded
        assert any(lo <= t + 60_000 < hi and dup for lo, hi, dup in leaves)
    assert len(backend.lookups) < 600


async def test_a_gpu_seen_twice_all_along_is_not_refined() -> None:
    """Two label sets of one GPU for the whole window: the first level finds the same everywhere and
    stops there (a few look-ups, one guarded stretch)."""
    spans = [*cpu(), (gpu(0, "a"), T0 - DAY_MS, T0 + 2 * DAY_MS), (gpu(0, "b"), T0 - DAY_MS, T0 + 2 * DAY_MS)]
    backend = FakeBackend(spans)
    leaves = await leaves_of(backend, Window(T0, T0 + DAY_MS, 15_000))
    assert all(dup for _, _, dup in leaves)
    assert len(backend.lookups) <= 4 + 17  # the whole window's look-ups, then one level


async def test_a_clean_window_is_one_piece_after_the_whole_windows_look_ups() -> None:
    backend = FakeBackend(cpu() + [(gpu(n, "a"), T0 - DAY_MS, T0 + 2 * DAY_MS) for n in range(2)])
    leaves = await leaves_of(backend, Window(T0, T0 + DAY_MS, 15_000))
    assert leaves == [(T0, T0 + DAY_MS + 1, False)]
    assert len(backend.lookups) == len(OPTIONS.host_labels) + 3


async def test_look_ups_stay_within_the_budget_when_everything_is_irregular() -> None:
    """Both host-label spellings all along (irregular everywhere) and a restart a day (the series differ
    from piece to piece): refinement stops at the budget, and every duplicated stretch stays guarded."""
    spans = cpu()
    for d in range(31):
        for n in range(4):
            for label in ("Hostname", "hostname"):
                labels = {**gpu(n, f"dcgm-{d}"), label: "h"}
                if label == "hostname":
                    del labels["Hostname"]
                spans.append((labels, T0 + (d - 1) * DAY_MS, T0 + d * DAY_MS + 60_000))
    backend = FakeBackend(spans)
    window = Window(T0, T0 + 30 * DAY_MS, 15_000)
    leaves = await leaves_of(backend, window)
    pieces_looked = (len(backend.lookups) - 4 - 1) // 2  # two spellings: two look-ups a piece
    assert pieces_looked <= MAX_PIECES
    for d in range(1, 30):
        t = T0 + d * DAY_MS + 30_000
        assert any(lo <= t < hi and dup for lo, hi, dup in leaves)
