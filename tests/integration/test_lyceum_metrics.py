"""The Lyceum metrics endpoint against a real Prometheus (and VictoriaMetrics) holding generated data.

Every value is compared with the generator's ground truth, computed independently from the samples.
FB % and CPU % are compared at 1e-9 relative: Prometheus 2.x sums the per-GPU ratios and the per-CPU
rates in an order that can differ from label order (a last-bit difference); everything else exactly.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpulens.domain import catalog as c
from gpulens.domain.models import Window
from gpulens.domain.timeparse import format_rfc3339_ms, parse_timestamp_ms
from gpulens_testkit.promload import LoadedDataset
from tests.integration.lyceum_app import LiveApi, build

pytestmark = pytest.mark.integration
APPROX = {"gpuMemoryUtilizationPercent", "systemCpuUsagePercent"}


@pytest.fixture(scope="module")
def live(prom_dataset: LoadedDataset, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveApi]:
    api = build(prom_dataset, Path(tmp_path_factory.mktemp("live")))
    yield api
    api.registry.dispose()


@pytest.fixture(scope="module")
def live_chunked(prom_dataset: LoadedDataset, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveApi]:
    api = build(prom_dataset, Path(tmp_path_factory.mktemp("chunked")), max_points_per_query=97)
    yield api
    api.registry.dispose()


def assert_matches(
    body: dict[str, Any], expected: dict[str, list[tuple[int, float]]], *, only: set[int] | None = None
) -> None:
    for key in c.LYCEUM_KEYS:
        got = [(parse_timestamp_ms(p["timestamp"]), float(p["value"])) for p in body[key]]
        want = expected[key]
        if only is not None:  # compare where the truth is stable for every backend
            got = [g for g in got if g[0] in only]
            want = [w for w in want if w[0] in only]
        assert [t for t, _ in got] == [t for t, _ in want], key
        for (t, g), (_, w) in zip(got, want, strict=True):
            if key in APPROX:
                assert math.isclose(g, w, rel_tol=1e-9, abs_tol=1e-9), (key, t, g, w)
            else:
                assert g == w, (key, format_rfc3339_ms(t), g, w)


def truth_points(data: LoadedDataset, name: str, window: Window) -> dict[str, list[tuple[int, float]]]:
    t = data.truth.execution(name, window)
    return {k: t[k].points() for k in c.LYCEUM_KEYS}


@pytest.mark.parametrize("name", ["healthy", "throttled", "oom", "input-bound", "cpu-only"])
def test_default_call_is_the_whole_execution_at_15s(live: LiveApi, name: str) -> None:
    e = live.data.scenario.execution(name)
    body = live.metrics(e.execution_id)
    window = live.data.truth.execution_window(name, 15_000)
    assert body["timeRange"] == {
        "start": format_rfc3339_ms(window.start_ms),
        "end": format_rfc3339_ms(window.end_ms),
    }
    assert body["hostname"] == e.hostname
    assert_matches(body, truth_points(live.data, name, window))
    if name == "cpu-only":
        assert all(body[k] == [] for k in c.LYCEUM_KEYS if k.startswith("gpu"))
        assert body["systemCpuUsagePercent"]
    else:
        assert all(body[k] for k in c.LYCEUM_KEYS)


@pytest.mark.parametrize(
    ("name", "offset_s", "length_s", "step"),
    [
        ("healthy", 0, 3600, "5s"),
        ("throttled", 600, 1800, "1m"),
        ("oom", 7, 2400, "7s"),
        ("input-bound", 120, 900, "30s"),
        ("healthy", 300, 5400, "2m30s"),
    ],
)
def test_windows_and_steps(live: LiveApi, name: str, offset_s: int, length_s: int, step: str) -> None:
    e = live.data.scenario.execution(name)
    start = e.start_s * 1000 + offset_s * 1000
    end = min(start + length_s * 1000, e.end_s * 1000)
    step_ms = {"5s": 5000, "1m": 60000, "7s": 7000, "30s": 30000, "2m30s": 150000}[step]
    body = live.metrics(e.execution_id, start=format_rfc3339_ms(start), end=format_rfc3339_ms(end), step=step)
    assert_matches(body, truth_points(live.data, name, Window(start, end, step_ms)))


def test_oom_run_climbs_to_full_memory(live: LiveApi) -> None:
    e = live.data.scenario.execution("oom")
    fb = [p["value"] for p in live.metrics(e.execution_id, step="1m")["gpuMemoryUtilizationPercent"]]
    assert max(fb) == pytest.approx(100.0) and fb[-1] == pytest.approx(100.0)


def test_throttled_run_sits_at_its_power_limit(live: LiveApi) -> None:
    e = live.data.scenario.execution("throttled")
    body = live.metrics(e.execution_id, step="1m")
    power = dict((p["timestamp"], p["value"]) for p in body["gpuPowerWatt"])
    limit = dict((p["timestamp"], p["value"]) for p in body["gpuPowerLimitWatt"])
    assert any(power[t] >= 0.98 * limit[t] for t in power if t in limit)


def test_chunk_borders_neither_repeat_nor_drop(live: LiveApi, live_chunked: LiveApi) -> None:
    for name in ("healthy", "input-bound"):
        eid = live.data.scenario.execution(name).execution_id
        whole, chunked = live.metrics(eid, step="5s"), live_chunked.metrics(eid, step="5s")
        for key in c.LYCEUM_KEYS:
            if key in APPROX:
                assert [p["timestamp"] for p in whole[key]] == [p["timestamp"] for p in chunked[key]]
            else:
                assert whole[key] == chunked[key], key


def test_victoria_metrics_gives_the_same_answers(vm_dataset: LoadedDataset, tmp_path: Path) -> None:
    api = build(vm_dataset, tmp_path)
    try:
        for name in ("healthy", "oom", "cpu-only"):
            window = api.data.truth.execution_window(name, 15_000)
            truth = api.data.truth.execution(name, window)
            stable = {
                t
                for k in c.LYCEUM_KEYS
                for t, ok in zip(truth[k].timestamps_ms, truth[k].stable, strict=True)
                if ok
            }
            body = api.metrics(api.data.scenario.execution(name).execution_id)
            for key in c.LYCEUM_KEYS:
                st = {t for t, ok in zip(truth[key].timestamps_ms, truth[key].stable, strict=True) if ok}
                got = {parse_timestamp_ms(p["timestamp"]): p["value"] for p in body[key]}
                for t, v in truth[key].stable_points():
                    if t in st and t in got:
                        assert math.isclose(got[t], v, rel_tol=1e-9), (name, key, t)
                # the grid is the same as Prometheus' (anchored at start, nocache=1)
                assert all((t - window.start_ms) % window.step_ms == 0 for t in got)
                assert len([t for t in got if t in st]) >= 0.9 * len(
                    [t for t, _ in truth[key].stable_points()]
                )
            assert stable
    finally:
        api.registry.dispose()
