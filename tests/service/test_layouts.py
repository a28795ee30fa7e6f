"""HostLayouts.leaves: irregular stretches found level by level, with look-ups that stay few.

The backend is a fake that knows when each series has samples; its series look-ups answer per range,
as Prometheus' do at the ends of a series' life.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest

from gpulens.agent.samples import Sample
from gpulens.backends.embedded.backend import EmbeddedBackend
from gpulens.domain import catalog as c
from gpulens.domain.models import RangeQuery, Series, Window
from gpulens.planning.hosts import (
    HostPlanOptions,
    HostTarget,
    fb_check_exprs,
    node_instance_matcher,
    rate_window_ms,
    split_gpus,
)
from gpulens.planning.layout import HostLayout, derive, fb_check_window, fb_totals_equal, probe
from gpulens.planning.segments import FINEST_MS, Piece
from gpulens.service.layouts import (
    LAYOUT_TTL_S,
    MAX_PIECES,
    SETTLED_AFTER_MS,
    SETTLED_TTL_S,
    HostLayouts,
    per_piece,
)
from gpulens.shaping.merge import single
from gpulens.storage.samples import SampleStore

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


# -- the look-ups shared by a host's targets, derived layouts, the FB check of a subset --------------
# An embedded store with a counting wrapper: the look-ups and queries are real (the FB check's
# answers too), and every one the layouts make is counted.

HOUR_MS = 3_600_000
FB_METRICS = list(c.LYCEUM_METRICS)  # the FB % among them: the check is made where it is worth it
NO_FB_METRICS = [m for m in c.LYCEUM_METRICS if m.key != "gpu_memory_utilization_percent"]


@dataclass
class Counting:
    """A backend counting the series look-ups and range queries it is asked."""

    inner: Any
    name: str = "counting"
    looked: list[tuple[str, int, int]] = field(default_factory=list)
    asked: list[str] = field(default_factory=list)

    async def series(self, match: str, start_ms: int, end_ms: int) -> list[dict[str, str]]:
        self.looked.append((match, start_ms, end_ms))
        found: list[dict[str, str]] = await self.inner.series(match, start_ms, end_ms)
        return found

    async def query_range(self, query: RangeQuery) -> list[Series]:
        self.asked.append(query.expr)
        found: list[Series] = await self.inner.query_range(query)
        return found


def _fleet(path: Path) -> SampleStore:
    """Hosts "eq" (four GPUs of one size), "mixed" (GPU 1 half the size of the others) and "late"
    (GPUs 0 and 1 all along, GPU 2 from the second half hour), an hour at 15 s; node-exporter on each."""
    store = SampleStore.from_path(path)
    sizes = {"eq": {g: 81_559 for g in "0123"}, "mixed": {"0": 81_559, "1": 40_537, "2": 81_559, "3": 81_559}}
    sizes["late"] = {g: 81_559 for g in "012"}
    samples = []
    for k in range(-20, 240):
        t = T0 + k * 15_000
        for host, gpus in sizes.items():
            for g, total in gpus.items():
                if host == "late" and g == "2" and k < 120:
                    continue
                labels = (("gpu", g), ("UUID", f"GPU-{host}-{g}"), ("Hostname", host))
                used = float((k * 37 + int(g) * 101) % 1000)
                samples += [
                    Sample(c.DCGM_GPU_UTIL, labels, float((k + int(g)) % 100), t),
                    Sample(c.DCGM_FB_USED, labels, used, t),
                    Sample(c.DCGM_FB_FREE, labels, total - used, t),
                ]
            for mode in ("idle", "user"):
                node = (("instance", f"{host}:9100"), ("cpu", "0"), ("mode", mode))
                samples.append(Sample(c.NODE_CPU_SECONDS, node, 1e5 + k * 7.5, t))
    store.write(samples)
    store.flush()
    return store


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Counting]:
    store = _fleet(tmp_path / "samples.db")
    try:
        yield Counting(EmbeddedBackend(store))
    finally:
        store.close()


async def direct(backend: Any, metrics: list[Any], target: HostTarget, window: Window) -> HostLayout:
    """`derive` on the probe's look-ups, made here (no cache)."""
    rate = rate_window_ms(window.step_ms, OPTIONS.scrape_interval_ms)
    matcher = node_instance_matcher(target, OPTIONS.node_match)
    p = probe(metrics, OPTIONS.host_labels, target.hostname, matcher, window, rate, 15_000, {})
    found = [await backend.series(m, lo, hi) for m, lo, hi in [*p.dcgm, p.node, p.cpu_before, p.cpu_after]]
    n = len(p.dcgm)
    indices, uuids = split_gpus(target.gpus)
    return derive(OPTIONS.host_labels, found[:n], found[n], found[n + 1], found[n + 2], indices, uuids, {})


async def fb_checked(backend: Any, target: HostTarget, window: Window, layout: HostLayout) -> bool:
    """The FB-total check of `target` itself (the form before the host's answered for its subsets)."""
    grid = fb_check_window(window, OPTIONS.scrape_interval_ms)
    answers = [
        await backend.query_range(RangeQuery(e, grid)) for e in fb_check_exprs(target, OPTIONS, layout)
    ]
    return fb_totals_equal(*[[(float(t), float(v)) for t, v in single(a)] for a in answers])


async def test_targets_of_one_host_over_one_window_share_one_set_of_look_ups(fleet: Counting) -> None:
    layouts = HostLayouts(OPTIONS)
    w = Window(T0 + 600_000, T0 + HOUR_MS - 15_000, 15_000)
    targets = [
        HostTarget("eq", g) for g in [("0", "1"), ("2",), (), ("GPU-eq-3",), ("0", "1"), ("1", "GPU-eq-0")]
    ]
    await layouts.layout(fleet, FB_METRICS, targets[0], w, 15_000)  # type: ignore[arg-type]
    one_set = len(fleet.looked)
    assert one_set == len(OPTIONS.host_labels) + 3  # each spelling's DCGM series, node, CPU before/after
    for target in targets[1:]:
        await layouts.layout(fleet, FB_METRICS, target, w, 15_000)  # type: ignore[arg-type]
        await layouts.layout(fleet, NO_FB_METRICS, target, w, 15_000)  # type: ignore[arg-type]
    # one set more for the other list of metrics (what is looked up differs), none per target
    assert len(fleet.looked) == 2 * one_set
    assert len(layouts.looked_cache) == 2
    # another window, another host: their own look-ups
    await layouts.layout(fleet, FB_METRICS, targets[1], Window(w.start_ms, w.end_ms - 15_000, 15_000), 15_000)  # type: ignore[arg-type]
    await layouts.layout(fleet, FB_METRICS, HostTarget("mixed", ("0",)), w, 15_000)  # type: ignore[arg-type]
    assert len(fleet.looked) == 4 * one_set


@pytest.mark.parametrize("metrics", [FB_METRICS, NO_FB_METRICS], ids=["fb", "no-fb"])
async def test_derived_layouts_equal_derive_made_directly(fleet: Counting, metrics: list[Any]) -> None:
    """Remembered by what the look-ups hold: windows whose series are the same share a derivation, and
    a window whose series differ (GPU 2 of "late" appears in the second half hour) gets its own."""
    layouts = HostLayouts(OPTIONS)
    windows = [
        Window(T0 + 60_000, T0 + 1_500_000, 15_000),  # "late": no GPU 2 yet
        Window(T0 + 120_000, T0 + 1_200_000, 15_000),  # the same series as the first
        Window(T0 + 2_100_000, T0 + HOUR_MS - 15_000, 15_000),  # GPU 2 there all along
        Window(T0 + 60_000, T0 + HOUR_MS - 15_000, 30_000),  # all of it, GPU 2 from half-way
    ]
    gpus = [(), ("0",), ("2",), ("0", "2"), ("GPU-late-2",), ("1", "GPU-late-2"), ("7",)]
    seen = {}
    for _ in range(2):  # the second round from the memo
        for host in ("eq", "mixed", "late"):
            for w in windows:
                for g in gpus:
                    target = HostTarget(host, g)
                    got = await layouts.layout(fleet, metrics, target, w, w.step_ms)  # type: ignore[arg-type]
                    want = await direct(fleet.inner, metrics, target, w)
                    assert replace(got, fb_equal_totals=False) == want, (host, w, g)
                    seen[(host, w, g)] = got
    late_2 = [seen[("late", w, ("2",))] for w in windows]
    assert c.DCGM_GPU_UTIL not in late_2[0].present and late_2[0] == late_2[1]
    assert c.DCGM_GPU_UTIL in late_2[2].present and c.DCGM_GPU_UTIL in late_2[3].present


async def test_fb_check_of_a_subset_is_the_hosts_when_its_gpus_are_all_equal(fleet: Counting) -> None:
    layouts = HostLayouts(OPTIONS)
    w = Window(T0 + 600_000, T0 + HOUR_MS - 15_000, 15_000)
    subsets = [("0", "1"), ("2", "3"), ("GPU-eq-1", "3"), ("0",), ("0", "1", "2", "3")]
    for k, gpus in enumerate(subsets):
        layout = await layouts.layout(fleet, FB_METRICS, HostTarget("eq", gpus), w, 15_000)  # type: ignore[arg-type]
        assert layout.fb_equal_totals
        # the host's own check, once (4 queries); none for any subset
        assert len(fleet.asked) == 4, (k, fleet.asked)
        assert all('gpu=~"' not in q and "UUID=~" not in q for q in fleet.asked)
    whole = await layouts.layout(fleet, FB_METRICS, HostTarget("eq"), w, 15_000)  # type: ignore[arg-type]
    assert whole.fb_equal_totals and len(fleet.asked) == 4
    for gpus in subsets:  # what each subset's own check says
        target = HostTarget("eq", gpus)
        assert await fb_checked(fleet.inner, target, w, await direct(fleet.inner, FB_METRICS, target, w))


async def test_fb_check_of_a_subset_is_its_own_when_the_hosts_gpus_differ(fleet: Counting) -> None:
    layouts = HostLayouts(OPTIONS)
    w = Window(T0 + 600_000, T0 + HOUR_MS - 15_000, 15_000)
    cases = [(("0", "1"), False), (("0", "2"), True), (("GPU-mixed-1",), True), (("GPU-mixed-1", "3"), False)]
    for gpus, equal in cases:
        before = len(fleet.asked)
        target = HostTarget("mixed", gpus)
        layout = await layouts.layout(fleet, FB_METRICS, target, w, 15_000)  # type: ignore[arg-type]
        assert layout.fb_equal_totals is equal, gpus
        # the host's check the first time (4), then the subset's own (4)
        assert len(fleet.asked) - before == (8 if before == 0 else 4), (gpus, fleet.asked[before:])
        assert equal == await fb_checked(
            fleet.inner, target, w, await direct(fleet.inner, FB_METRICS, target, w)
        )
    asked = len(fleet.asked)
    whole = await layouts.layout(fleet, FB_METRICS, HostTarget("mixed"), w, 15_000)  # type: ignore[arg-type]
    assert not whole.fb_equal_totals and len(fleet.asked) == asked  # the host's check, remembered


def restarted_once() -> FakeBackend:
    """Two GPUs whose exporter restarts 5 h into the day under a new pod label (a 15 s gap)."""
    spans = cpu()
    restart = T0 + 5 * 3_600_000 + 7_000
    for n in range(2):
        spans += [
            (gpu(n, "dcgm-0"), T0 - DAY_MS, restart),
            (gpu(n, "dcgm-1"), restart + 15_000, T0 + 2 * DAY_MS),
        ]
    return FakeBackend(spans)


def counting_loads(layouts: HostLayouts) -> list[object]:
    """The keys of the piece look-ups `layouts` loads (or joins) from now on."""
    loads: list[object] = []
    original = layouts.piece_cache.get_or_load

    async def counted(*args: Any, **kwargs: Any) -> Any:
        loads.append(args[0])
        return await original(*args, **kwargs)

    layouts.piece_cache.get_or_load = counted  # type: ignore[method-assign]
    return loads


async def test_a_warm_read_awaits_no_piece_and_finds_the_same_leaves() -> None:
    """A second read within the TTL takes every piece's layout as it is cached, without a look-up and
    without a task per piece; its leaves are the first read's."""
    backend = restarted_once()
    layouts = HostLayouts(OPTIONS)
    window = Window(T0, T0 + DAY_MS, 15_000)
    first = await layouts.leaves(backend, METRICS, HostTarget("h"), window, 15_000)  # type: ignore[arg-type]
    assert len(first) > 4
    looked, hits = len(backend.lookups), layouts.piece_cache.hits
    loads = counting_loads(layouts)
    second = await layouts.leaves(backend, METRICS, HostTarget("h"), window, 15_000)  # type: ignore[arg-type]
    assert second == first
    assert len(backend.lookups) == looked and loads == []
    assert layouts.piece_cache.hits > hits


async def test_a_partly_cached_read_loads_only_the_pieces_gone_and_finds_the_same_leaves() -> None:
    """Pieces expire one by one: a read then loads those gone (again, from the backend), takes the
    others as cached, and cuts the window exactly as a cold read does."""
    backend = restarted_once()
    window = Window(T0, T0 + DAY_MS, 15_000)
    cold = HostLayouts(OPTIONS)
    keys = counting_loads(cold)
    first = await cold.leaves(backend, METRICS, HostTarget("h"), window, 15_000)  # type: ignore[arg-type]
    gone = keys[::2]  # every other piece of every level, the restart's included
    assert len(gone) > 2
    for key in gone:
        cold.piece_cache.discard(key)
    looked = len(backend.lookups)
    keys.clear()
    second = await cold.leaves(backend, METRICS, HostTarget("h"), window, 15_000)  # type: ignore[arg-type]
    assert second == first
    assert sorted(map(repr, keys)) == sorted(map(repr, gone))  # loaded: those gone, only they
    assert len(backend.lookups) > looked


@pytest.mark.parametrize("settled", [True, False])
async def test_a_settled_windows_look_ups_are_kept_longer_than_a_recent_ones(settled: bool) -> None:
    """A window that ended 10 minutes before now keeps its look-ups 15 minutes (its series cannot
    change); one reaching now keeps them a minute. Past either, the read looks up again."""
    backend = restarted_once()
    window = Window(T0, T0 + DAY_MS, 15_000)
    now_ms = window.end_ms + (SETTLED_AFTER_MS + 1 if settled else 0)
    ticks = [0.0]
    layouts = HostLayouts(OPTIONS, clock_ms=lambda: now_ms, timer=lambda: ticks[0])
    first = await layouts.leaves(backend, METRICS, HostTarget("h"), window, 15_000)  # type: ignore[arg-type]
    looked = len(backend.lookups)
    ticks[0] = LAYOUT_TTL_S + 1
    again = await layouts.leaves(backend, METRICS, HostTarget("h"), window, 15_000)  # type: ignore[arg-type]
    assert again == first
    assert (len(backend.lookups) == looked) == settled  # a minute on: kept only when settled
    looked = len(backend.lookups)
    ticks[0] = SETTLED_TTL_S + 1
    later = await layouts.leaves(backend, METRICS, HostTarget("h"), window, 15_000)  # type: ignore[arg-type]
    assert later == first and len(backend.lookups) > looked  # a quarter of an hour on: looked up again


def test_per_piece_plans_each_layout_once_and_shares_one_plan_object() -> None:
    made: list[object] = []

    def plan(layout: frozenset[str]) -> list[str]:
        made.append(layout)
        return sorted(layout)

    a, b = frozenset({"x"}), frozenset({"y"})
    copy = frozenset({"x"})  # equal to a, another object
    pieces = [Piece(k, k + 1, 1) for k in range(5)]
    out = per_piece(list(zip(pieces, [a, b, copy, a, b], strict=True)), plan)
    assert made == [a, b]
    assert out[0][1] is out[2][1] is out[3][1] and out[1][1] is out[4][1]
