"""Pod layouts: looked up over the window widened to whole quanta, shared by nearby windows (a client
polling "the last 24 h"), and for a window reaching past its look-up trusted one scrape interval."""

from __future__ import annotations

from datetime import UTC, datetime

from hypothesis import given
from hypothesis import strategies as st

from gpulens.domain import catalog as c
from gpulens.domain.models import RangeQuery, Series, Window
from gpulens.domain.timeparse import ms_to_datetime
from gpulens.domain.workloads import Pod, PodPhase, Workload
from gpulens.planning.pods import PodPlanOptions, sample_grid
from gpulens.service.pod_metrics import (
    LAYOUT_QUANTUM_MS,
    LOOKBACK_MS,
    PodMetricsService,
    layout_range,
)
from gpulens.service.workloads import WorkloadService
from gpulens.storage.registry import Registry

T0 = 1_767_225_660_000  # 2026-01-01T00:01:00Z
DAY = 86_400_000
SIX = [
    c.POD_METRICS_BY_TYPE[t]
    for t in (
        "GPU_UTILIZATION_PER_GPU",
        "GPU_UTILIZATION",
        "GPU_MEMORY_USAGE_BYTES_PER_GPU",
        "GPU_MEMORY_USAGE_BYTES",
        "CPU_USAGE_CORES",
        "CPU_MEMORY_USAGE_BYTES",
    )
]
WORKLOAD = Workload(
    "0b7f6a3e-1c2d-4e5f-8a9b-0c1d2e3f4a5b", "llm", "acme", None, datetime(2025, 1, 1, tzinfo=UTC)
)
POD = Pod(
    "1c8a7b4f-2d3e-4f60-9bac-1d2e3f4a5b6c",
    WORKLOAD.workload_id,
    "llm-serve-0",
    "team-b",
    "gpu-node-1",
    ("4", "5"),
    PodPhase.RUNNING,
    datetime(2025, 1, 1, tzinfo=UTC),
)


class Backend:
    """Series look-ups recorded; every pod series exists, once per GPU; range queries answer nothing."""

    name = "fake"

    def __init__(self) -> None:
        self.lookups: list[tuple[str, int, int]] = []

    async def series(self, match: str, start_ms: int, end_ms: int) -> list[dict[str, str]]:
        self.lookups.append((match, start_ms, end_ms))
        if "exported_pod" not in match:
            return [{"__name__": c.CADVISOR_CPU_SECONDS}, {"__name__": c.CADVISOR_MEMORY_WORKING_SET}]
        return [{"__name__": n, "gpu": g} for n in (c.DCGM_GPU_UTIL, c.DCGM_FB_USED) for g in POD.gpus]

    async def query_range(self, query: RangeQuery) -> list[Series]:
        return []


class Clock:
    def __init__(self, ms: int) -> None:
        self.ms = ms

    def __call__(self) -> datetime:
        return ms_to_datetime(self.ms)


def service(backend: Backend, clock: Clock) -> PodMetricsService:
    workloads = WorkloadService(Registry.from_url("sqlite://"))
    return PodMetricsService(workloads, backend, PodPlanOptions(), clock=clock)  # type: ignore[arg-type]


async def test_a_moving_window_of_past_data_is_looked_up_once() -> None:
    backend = Backend()
    pods = service(backend, Clock(T0 + DAY))  # long after every window
    for k in range(24):  # "the last 24 h" every 10 s for four minutes
        end = T0 + k * 10_000
        answer = await pods.answer(WORKLOAD, (POD,), SIX, end - DAY, end, 1000)
        assert all(r.ok for r in answer.results)
    assert len(backend.lookups) == 2  # one look-up per pod-label spelling, all 24 reads
    for k in range(24):
        end = T0 + k * 10_000
        assert all(lo <= end - DAY - LOOKBACK_MS and end <= hi for _, lo, hi in backend.lookups)
    assert (pods.caches()["pod_layouts"].hits, pods.caches()["pod_layouts"].misses) == (23, 1)


async def test_a_live_window_reuses_a_look_up_for_one_scrape_interval() -> None:
    backend = Backend()
    clock = Clock(T0)
    pods = service(backend, clock)
    for k, looked in enumerate([2, 2, 4, 4, 6]):  # every 10 s, the window ending now; scrapes of 15 s
        clock.ms = end = T0 + k * 10_000
        await pods.answer(WORKLOAD, (POD,), SIX, end - DAY, end, 1000)
        assert len(backend.lookups) == looked, k


async def test_the_six_type_read_sends_four_plain_queries_whatever_the_gpus_series() -> None:
    """The four GPU types of the six-type read share two queries (a type and its _PER_GPU twin read
    the same series), with no `max by` whether each GPU has one series or two (an exporter restart):
    the GPU's series are made one in shaping."""

    class Sent(Backend):
        def __init__(self, twice: str | None = None) -> None:
            super().__init__()
            self.exprs: list[str] = []
            self.twice = twice

        async def series(self, match: str, start_ms: int, end_ms: int) -> list[dict[str, str]]:
            found = await super().series(match, start_ms, end_ms)
            return found + [s for s in found if s["__name__"] == self.twice][:1]

        async def query_range(self, query: RangeQuery) -> list[Series]:
            self.exprs.append(query.expr)
            return []

    for twice in (None, c.DCGM_FB_USED):
        sent = Sent(twice)
        await service(sent, Clock(T0 + DAY)).answer(WORKLOAD, (POD,), SIX, T0 - DAY, T0, 1000)
        assert len(sent.exprs) == len(set(sent.exprs)) == 4, sent.exprs
        assert not any(" by " in e for e in sent.exprs)
        assert len(sent.lookups) == 2  # the layout's look-ups only: no look-ups per piece


@given(
    st.integers(0, 10 * 365 * DAY),
    st.integers(0, 30 * DAY),
    st.integers(0, 1000),
)
def test_the_layout_range_covers_the_read_on_whole_quanta(start: int, span: int, samples: int) -> None:
    grid = sample_grid(start, start + span, samples)
    lo, hi = layout_range(grid)
    assert lo <= grid.start_ms - LOOKBACK_MS and grid.end_ms <= hi
    assert lo % LAYOUT_QUANTUM_MS == 0 and hi % LAYOUT_QUANTUM_MS == 0
    assert hi - lo < grid.end_ms - grid.start_ms + LOOKBACK_MS + 2 * LAYOUT_QUANTUM_MS


def test_nearby_windows_share_a_range() -> None:
    first = layout_range(Window(T0 - DAY, T0, 86_400))
    assert all(layout_range(Window(T0 - DAY + s, T0 + s, 86_400)) == first for s in range(0, 240_000, 10_000))
