"""Live alerts' batched tail read (service/live_tails.py) against the plain one, on a real Prometheus,
a real VictoriaMetrics and the embedded store: for many running executions per host (GPU subsets,
the same subset twice, a GPU given by UUID, a GPU given both ways, every GPU, a host with no GPU at
all, an execution starting inside its tail) over tails of one end and different starts,
`LiveTails.findings` gives each execution exactly what `SummaryService.live_findings` gives it alone
(findings and window), under the default thresholds and a shorter minimum duration. A clean host is
read in a few tagged queries; an execution whose tail holds an exporter restart is read alone; a
failing backend query is the affected executions' Exception, never a raised error.

The data set is test_plan_layouts' (hosts "clean", "quirky", "mig", "restarted"), plus "work" (four
GPUs going through phases the detectors find: one GPU idle while the others work, all idle with
memory held, low utilization, memory near full and a thermal throttle, a hole in one GPU's series),
"work-restart" (the same, its exporter restarting 13 minutes before the end) and "cpuonly" (node
exporter only).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio
import pytest

from gpulens.backends.base import MetricsBackend
from gpulens.domain import catalog as c
from gpulens.domain.catalog import INSIGHT_THRESHOLDS, InsightThresholds
from gpulens.domain.errors import BackendUnavailable
from gpulens.domain.models import Execution, ExecutionStatus, Principal, RangeQuery, Series
from gpulens.planning.hosts import HostPlanOptions
from gpulens.planning.promql import quote, regex_escape
from gpulens.service.executions import ExecutionService
from gpulens.service.live_tails import LiveTails, TailRequest
from gpulens.service.metrics import MetricsLimits, MetricsService
from gpulens.service.summary import DETECTOR_METRICS, LiveFindings, SummaryService
from gpulens.storage.registry import Registry
from tests.conftest import sqlite_registry
from tests.integration.test_plan_layouts import (
    EVERY,
    SPAN,
    T0,
    Row,
    _cpu_rows,
    _mem_rows,
    dataset,
    three_backends,
)

pytestmark = pytest.mark.integration

END_S = T0 + SPAN
END_MS = END_S * 1000
NOW = datetime.fromtimestamp(END_S, UTC)
MIN_MS = 60_000
ORG = "acme"
ADMIN = Principal(org=ORG, subject="test", is_admin=True)
OPTIONS = HostPlanOptions(scrape_interval_ms=EVERY * 1000)
SHORT = replace(INSIGHT_THRESHOLDS, min_duration_ms=60_000)
RESTART_S = 6_400  # "work-restart": its exporter's pod changes here (seconds after T0)
TOTAL_MIB = 81_559


# -- the data ----------------------------------------------------------------------------------------


def _phase_rows(host: str, rng: random.Random, restart_s: int | None = None) -> list[Row]:
    """Four GPUs through phases (seconds after T0): busy; GPU 3 idle while the others work
    (5,000-5,600); all idle with memory held (5,700-6,300); low utilization (6,300-6,600); GPU 0's
    memory near full (6,600-); hot with the SM clock down (6,900-7,050); GPU 1 missing 6,700-6,880;
    GPU 2 missing a scrape now and then. With `restart_s`, the exporter's pod label changes there."""
    rows: list[Row] = []
    for gpu in range(4):
        for pod, lo, hi in (
            (("dcgm-a", 0, restart_s), ("dcgm-b", restart_s + EVERY, SPAN))
            if restart_s
            else (("dcgm-a", 0, SPAN),)
        ):
            labels = {"Hostname": host, "gpu": str(gpu), "UUID": f"GPU-{host}-{gpu}", "pod": pod}
            util, used, temp, clock, power, rx = [], [], [], [], [], []
            times = []
            for s in range(lo, hi, EVERY):
                if (gpu == 1 and 6_700 <= s < 6_880) or (gpu == 2 and (s // EVERY) % 29 == 3):
                    continue
                times.append(T0 + s)
                # whole numbers: VictoriaMetrics sums a group in no fixed order (`avg` of fractions
                # can differ in the last bit from one read to the next); sums of these are exact
                if (5_000 <= s < 5_600 and gpu == 3) or 5_700 <= s < 6_300:
                    u = rng.randrange(0, 3)
                elif 6_300 <= s < 6_600:
                    u = rng.randrange(20, 31)
                else:
                    u = rng.randrange(85, 100)
                full = gpu == 0 and s >= 6_600
                hot = 6_900 <= s < 7_050
                util.append(float(u))
                used.append(float(rng.randrange(78_000, 79_500) if full else rng.randrange(40_000, 50_000)))
                temp.append(float(rng.randrange(87, 91) if hot else rng.randrange(55, 70)))
                clock.append(float(rng.randrange(1_300, 1_400) if hot else rng.randrange(1_950, 1_981)))
                power.append(float(rng.randrange(450, 600)) + 0.25)
                rx.append(float(rng.randrange(10**8, 10**9)))

            def series(name: str, values: list[float], labels: dict[str, str] = labels) -> Row:
                return (name, dict(labels), list(zip(times, values, strict=True)))

            rows += [
                series(c.DCGM_GPU_UTIL, util),
                series(c.DCGM_FB_USED, used),
                series(c.DCGM_FB_FREE, [TOTAL_MIB - u for u in used]),
                series(c.DCGM_GPU_TEMP, temp),
                series(c.DCGM_SM_CLOCK, clock),
                series(c.DCGM_POWER_USAGE, power),
                series(c.DCGM_ENFORCED_POWER_LIMIT, [700.0] * len(times)),
                series(c.DCGM_PCIE_RX_BYTES, rx),
            ]
    rows += _cpu_rows(f"{host}:9100", 2, 0, 2e6)
    rows += _mem_rows(f"{host}:9100", 0)
    return rows


def live_dataset() -> list[Row]:
    rng = random.Random(11)
    rows = dataset()
    rows += _phase_rows("work", rng)
    rows += _phase_rows("work-restart", rng, RESTART_S)
    rows += _cpu_rows("cpuonly:9100", 2, 0, 1e6)  # two CPUs: a sum of two is the same in any order
    rows += _mem_rows("cpuonly:9100", 0)
    return rows


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, MetricsBackend]]:
    with three_backends(live_dataset(), Path(tmp_path_factory.mktemp("live-tails"))) as backends:
        yield backends


# -- the executions ----------------------------------------------------------------------------------

SUBSETS: dict[str, tuple[str, ...]] = {
    "all": (),
    "01a": ("0", "1"),
    "01b": ("0", "1"),  # the same subset twice
    "uuid2": ("GPU-{host}-2",),
    "3-uuid1": ("3", "GPU-{host}-1"),
    "3": ("3",),
    "twice0": ("0", "GPU-{host}-0"),  # one GPU given by index and by UUID
}
HOST_SUBSETS = {
    "clean": ["all", "01a", "01b", "uuid2", "3-uuid1", "twice0"],
    "work": ["all", "01a", "uuid2", "3", "twice0"],
    "work-restart": ["all", "01a"],
}
LATE_S = 12 * 60 - 7  # "<host>-late" starts this long before the end: inside every tail but one


def _executions() -> list[Execution]:
    out = []

    def add(eid: str, host: str | None, gpus: tuple[str, ...], start: datetime | None) -> None:
        out.append(Execution(eid, ORG, host, gpus, ExecutionStatus.RUNNING, NOW, start_time=start))

    begun = datetime.fromtimestamp(T0 + 30, UTC)
    late = datetime.fromtimestamp(END_S - LATE_S, UTC)
    for host, names in HOST_SUBSETS.items():
        for name in names:
            add(f"{host}-{name}", host, tuple(g.format(host=host) for g in SUBSETS[name]), begun)
        add(f"{host}-late", host, ("1", "2"), late)
    add("restarted-all", "restarted", (), begun)
    add("restarted-0-uuid2", "restarted", ("0", "GPU-restarted-2"), begun)
    add("quirky-all", "quirky", (), begun)
    add("quirky-1", "quirky", ("1",), begun)
    add("mig-all", "mig", (), begun)
    add("mig-0", "mig", ("0",), begun)
    add("cpuonly", "cpuonly", (), begun)  # a host with no GPU at all
    add("pending", "clean", (), None)  # not started: no metrics yet
    return out


EXECUTIONS = _executions()
BY_ID = {e.execution_id: e for e in EXECUTIONS}
# the tails' starts before the end (ms): one end, different starts, one off the scrape grid
TAILS = [40 * MIN_MS, 17 * MIN_MS - 3_000]
# under the shorter minimum duration: the hosts whose phases the detectors find
SHORT_TAILS = [17 * MIN_MS - 3_000]
SHORT_HOSTS = ("work", "work-restart", "restarted")


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    reg = sqlite_registry(Path(tmp_path_factory.mktemp("live-tails-registry")) / "registry.db")
    reg.ensure_org(ORG)
    for e in EXECUTIONS:
        reg.upsert_execution(e)
    try:
        yield reg
    finally:
        reg.dispose()


def summaries(backend: MetricsBackend, registry: Registry) -> SummaryService:
    """A SummaryService over `backend` as build_context wires it (a clock at the data's end)."""

    def clock() -> datetime:
        return NOW

    executions = ExecutionService(registry, clock=clock)
    return SummaryService(MetricsService(executions, backend, OPTIONS, MetricsLimits(), clock))


# -- comparing -----------------------------------------------------------------------------------------

Result = LiveFindings | Exception


def shown(result: Result) -> tuple[object, ...]:
    if isinstance(result, Exception):
        return (type(result).__name__, str(result))
    return (
        result.execution.execution_id,
        result.window,
        [
            (f.kind, f.severity, f.start_ms, f.end_ms, f.gpus, f.message, str(f.evidence), f.gpu_count)
            for f in result.findings
        ],
    )


async def alone(service: SummaryService, requests: Sequence[TailRequest]) -> list[Result]:
    """Each request through `live_findings`, by itself (concurrently: they share nothing but caches)."""

    async def one(r: TailRequest) -> Result:
        try:
            return await service.live_findings(
                ADMIN, r.execution.execution_id, r.start_ms, r.end_ms, r.thresholds
            )
        except Exception as exc:
            return exc

    out: list[Result] = [RuntimeError("unset")] * len(requests)

    async def put(i: int, r: TailRequest) -> None:
        out[i] = await one(r)

    async with anyio.create_task_group() as tg:
        for i, r in enumerate(requests):
            tg.start_soon(put, i, r)
    return out


def requests_for(
    ids: Sequence[str], tail_ms: int, th: InsightThresholds = INSIGHT_THRESHOLDS
) -> list[TailRequest]:
    return [TailRequest(BY_ID[i], END_MS - tail_ms, END_MS, th) for i in ids]


BACKENDS = ["prometheus", "victoria-metrics", "embedded"]


@pytest.mark.parametrize("which", BACKENDS)
def test_batched_tails_find_what_each_execution_finds_alone(
    servers: dict[str, MetricsBackend], registry: Registry, which: str
) -> None:
    backend = servers[which]
    ids = [e.execution_id for e in EXECUTIONS]
    short_ids = [e.execution_id for e in EXECUTIONS if e.hostname in SHORT_HOSTS]
    calls = [
        ("default", [r for tail in TAILS for r in requests_for(ids, tail)]),
        ("short", [r for tail in SHORT_TAILS for r in requests_for(short_ids, tail, SHORT)]),
    ]

    async def run() -> list[tuple[str, int, str, set[tuple[str, tuple[str, ...]]]]]:
        tails = LiveTails(summaries(backend, registry))
        reference = summaries(backend, registry)
        compared = []
        for th_name, requests in calls:
            # every tail of every execution in one call (several grids per host), and each one alone
            got = await tails.findings(requests)
            want = await alone(reference, requests)
            assert len(got) == len(requests)
            for r, g, w in zip(requests, got, want, strict=True):
                where = (which, th_name, r.execution.execution_id, (END_MS - r.start_ms) / 1000)
                assert shown(g) == shown(w), where
                if not isinstance(w, Exception):
                    kinds = {(f.kind, f.gpus) for f in w.findings}
                    compared.append((r.execution.execution_id, r.start_ms, th_name, kinds))
            pending = sum(r.execution.start_time is None for r in requests)  # not read: NotFound
            assert tails.last.batched + tails.last.alone == len(requests) - pending
            assert tails.last.alone > 0 and tails.last.batched > tails.last.alone, tails.last
        return compared

    compared = anyio.run(run)
    assert len(compared) == len(TAILS) * (len(ids) - 1) + len(SHORT_TAILS) * len(short_ids)
    # not only empty lists compared: the phases are found, on every host that has them, and the
    # per-GPU findings too (GPU 3 of "work" idle while the others work; the random "clean" GPUs)
    found: dict[str, set[tuple[str, tuple[str, ...]]]] = {}
    for eid, _, _, kinds in compared:
        found.setdefault(eid, set()).update(kinds)
    for eid in ("work-all", "work-01a", "work-uuid2", "work-3", "work-twice0", "work-restart-all"):
        assert {k for k, _ in found[eid]} >= {"idle_held", "thermal_throttle"}, (eid, found[eid])
    assert ("idle_held", ("3",)) in found["work-all"]
    assert ("memory_pressure", ("0", "GPU-work-0")) in found["work-twice0"]
    assert any(k == "gpu_imbalance" and g for k, g in found["clean-all"])
    assert found["work-late"] and found["quirky-all"]
    assert sum(len(kinds) for *_, kinds in compared) > 50


def _kinds(result: Result) -> set[str]:
    assert isinstance(result, LiveFindings), result
    return {f.kind for f in result.findings}


@pytest.mark.parametrize("which", BACKENDS)
def test_a_clean_host_is_read_in_few_queries_and_a_restart_alone(
    servers: dict[str, MetricsBackend], registry: Registry, which: str
) -> None:
    backend = servers[which]

    async def run() -> None:
        tails = LiveTails(summaries(backend, registry))
        reference = summaries(backend, registry)
        for host in ("clean", "work"):
            ids = [e.execution_id for e in EXECUTIONS if e.hostname == host and e.start_time]
            requests = requests_for(ids, 40 * MIN_MS)
            got = await tails.findings(requests)
            assert tails.last.alone == 0 and tails.last.batched == len(ids), (host, tails.last)
            per_execution = len(ids) * len(DETECTOR_METRICS)
            assert tails.last.queries > 0 and tails.last.queries * 8 <= per_execution, (host, tails.last)
            # (each compared with its read alone in the first test, on the same tail)
            assert all(isinstance(g, LiveFindings) for g in got), got
        assert "idle_held" in _kinds(got[0])
        # a restart inside the tail: read alone, and still the same. After it: batched, except on
        # VictoriaMetrics, whose series look-ups answer per day (the old series are seen all day)
        per_day = which == "victoria-metrics"
        ids = [e.execution_id for e in EXECUTIONS if e.hostname == "work-restart"]
        for tail, restarted in ((20 * MIN_MS, True), (8 * MIN_MS, per_day)):
            requests = requests_for(ids, tail)
            got = await tails.findings(requests)
            # the late execution too when restarted: the old series are in its first lookback
            want = (len(ids), 0) if restarted else (0, len(ids))
            assert (tails.last.alone, tails.last.batched) == want, (tail, tails.last)
            assert [shown(g) for g in got] == [shown(w) for w in await alone(reference, requests)]
        # the exporter of "restarted" restarts 70 and 30 minutes before the end (down 4 minutes)
        for tail, restarted in ((40 * MIN_MS, True), (8 * MIN_MS, per_day)):
            requests = requests_for(["restarted-all", "restarted-0-uuid2"], tail)
            got = await tails.findings(requests)
            assert (tails.last.alone, tails.last.batched) == ((2, 0) if restarted else (0, 2)), tails.last
            assert [shown(g) for g in got] == [shown(w) for w in await alone(reference, requests)]

    anyio.run(run)


@dataclass
class Failing:
    """`inner`, but a range query whose expression holds one of `markers` fails as unreachable."""

    inner: MetricsBackend
    markers: tuple[str, ...]
    failed: int = 0

    @property
    def name(self) -> str:
        return self.inner.name

    async def query_range(self, query: RangeQuery) -> list[Series]:
        if any(m in query.expr for m in self.markers):
            self.failed += 1
            raise BackendUnavailable(self.inner.name, "the metrics backend is unavailable")
        return await self.inner.query_range(query)

    def __getattr__(self, name: str) -> Callable[..., Any]:
        attr: Callable[..., Any] = getattr(self.inner, name)
        return attr


@pytest.mark.parametrize("which", BACKENDS)
def test_a_failing_query_is_the_affected_executions_error_only(
    servers: dict[str, MetricsBackend], registry: Registry, which: str
) -> None:
    """Every query naming host "restarted" (read alone in its 40-minute tail) and every query naming
    GPU 2 of "work" by UUID fails: the executions of "restarted", and "work-uuid2" with those whose
    branches shared its queries, get the error; every other gets what it gets from a healthy backend."""
    uuid = quote(regex_escape("GPU-work-2"))
    failing = Failing(servers[which], ('"restarted"', uuid))
    ids = [e.execution_id for e in EXECUTIONS]

    async def run() -> tuple[list[Result], list[Result], list[TailRequest]]:
        requests = requests_for(ids, 40 * MIN_MS)
        healthy = await LiveTails(summaries(servers[which], registry)).findings(requests)
        got = await LiveTails(summaries(failing, registry)).findings(requests)  # type: ignore[arg-type]
        return got, healthy, requests

    got, healthy, requests = anyio.run(run)
    assert failing.failed > 0
    failed = {
        r.execution.execution_id
        for r, g in zip(requests, got, strict=True)
        if isinstance(g, BackendUnavailable)
    }
    assert {"restarted-all", "restarted-0-uuid2", "work-uuid2"} <= failed
    assert all(BY_ID[eid].hostname in ("restarted", "work") for eid in failed), failed
    # the healthy ones: on other hosts, and on "work" where no failing query held their branches
    assert any(BY_ID[i].hostname == "work" and i not in failed for i in ids), failed
    for r, g, h in zip(requests, got, healthy, strict=True):
        if isinstance(g, BackendUnavailable):
            continue
        assert shown(g) == shown(h), (which, r.execution.execution_id)
