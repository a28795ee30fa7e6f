"""The bench's hand-written baseline: grids and chunks as gpulens cuts them, and checks that catch drift."""

from __future__ import annotations

import orjson
import pytest
from bench.archive import STEPS_S, varied_windows
from bench.handwritten import (
    HostData,
    PodData,
    hand_chunks,
    lyceum_forms,
    pod_forms,
    pod_grid,
    pod_queries,
    pod_types,
    verify_lyceum,
)

from gpulens.domain import catalog as c
from gpulens.domain.models import Window
from gpulens.domain.timeparse import format_rfc3339_ms
from gpulens.planning.chunking import chunks
from gpulens.planning.pods import sample_grid

END = 1_767_225_600_000


@pytest.mark.parametrize(
    ("span_ms", "step_ms"), [(3_600_000, 5_000), (86_400_000, 15_000), (30 * 86_400_000, 15_000), (0, 15_000)]
)
def test_chunks_as_gpulens_cuts_them(span_ms: int, step_ms: int) -> None:
    window = Window(END - span_ms, END, step_ms)
    assert hand_chunks(window) == chunks(window, 11_000)


def test_pod_grid_is_number_of_samples() -> None:
    assert pod_grid(END - 86_400_000, END, 1000) == sample_grid(END - 86_400_000, END, 1000)
    assert pod_grid(END - 86_400_000, END, 1000).points == 1001


def test_lyceum_forms_follow_the_data() -> None:
    forms = lyceum_forms(
        HostData("gpu-1", "hostname", c.DCGM_POWER_MGMT_LIMIT, True), ("0", "3"), 5_000, 15_000
    )
    by_key = {f.key: f.expr for f in forms}
    assert list(by_key) == list(c.LYCEUM_KEYS)
    assert by_key["gpuPowerLimitWatt"] == 'sum(DCGM_FI_DEV_POWER_MGMT_LIMIT{hostname="gpu-1",gpu=~"0|3"})'
    assert by_key["gpuPcieThroughputRxBytesPerSec"].startswith("1024 * sum(DCGM_FI_DEV_PCIE_RX_THROUGHPUT{")
    assert by_key["systemCpuUsagePercent"].endswith('instance=~"gpu-1(:[0-9]+)?"}[1m])))')


def test_pod_forms_cover_every_metric_type() -> None:
    grid = pod_grid(END - 86_400_000, END, 1000)
    forms = pod_forms(PodData("ns", "p"), grid, 15_000)
    assert pod_types(forms) == [m.type for m in c.POD_METRICS]
    percentile_types = sum(m.kind is c.Kind.PERCENTILES for m in c.POD_METRICS)
    assert len(pod_queries(forms, grid)) == len(c.POD_METRICS) - 2 + 2 * percentile_types
    assert all("[1m26s400ms]" in f.expr for f in forms if "rate(" in f.expr or "increase(" in f.expr)


def _bodies(window: Window, values: list[float]) -> tuple[bytes, list[bytes]]:
    times = [window.start_ms + k * window.step_ms for k in range(window.points)]
    api = {
        key: [{"timestamp": format_rfc3339_ms(t), "value": v} for t, v in zip(times, values, strict=True)]
        for key in c.LYCEUM_KEYS
    }
    prom = {
        "data": {
            "result": [
                {"metric": {}, "values": [[t / 1000, repr(v)] for t, v in zip(times, values, strict=True)]}
            ]
        }
    }
    return orjson.dumps(api), [orjson.dumps(prom)] * len(c.LYCEUM_KEYS)


def test_verify_lyceum_finds_a_differing_point() -> None:
    window = Window(END - 60_000, END, 15_000)
    forms = lyceum_forms(HostData("h", "Hostname"), (), 15_000, 15_000)
    api, hand = _bodies(window, [1.0, 2.0, 3.0, 4.0, 5.0])
    assert verify_lyceum(api, hand, forms, 1, window) == []
    _, other = _bodies(window, [1.0, 2.0, 3.5, 4.0, 5.0])
    problems = verify_lyceum(api, other, forms, 1, window)
    assert len(problems) == len(c.LYCEUM_KEYS)
    assert "1 of 5 values differ" in problems[0]


def test_varied_windows_stay_inside_and_on_the_grid() -> None:
    execution = Window(END - 86_400_000, END, 15_000)
    windows = varied_windows(execution, 9)
    assert [w.step_ms // 1000 for w in windows] == [*STEPS_S, STEPS_S[0]]
    for w in windows:
        assert execution.start_ms < w.start_ms < w.end_ms <= execution.end_ms
        assert (w.end_ms - w.start_ms) % w.step_ms == 0
    assert len({(w.start_ms, w.end_ms) for w in windows}) == len(windows)
