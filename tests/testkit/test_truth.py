"""Ground truth: the designed phases show up in the twelve Lyceum metrics, with PromQL's arithmetic."""

from __future__ import annotations

import pytest

from gpulens.demo.history import Field
from gpulens.demo.scenario import PhaseKind, default_scenario
from gpulens.domain import catalog as c
from gpulens.domain.models import Window
from gpulens_testkit.history import generate
from gpulens_testkit.truth import (
    GroundTruth,
    Stats,
    execution_truth,
    extrapolated_rate,
    prom_avg,
    prom_max,
    prom_sum,
    rate_window_ms,
)

SC = default_scenario()
DS = generate(SC)
GT = GroundTruth(DS)
UTIL, FB, TEMP, POWER, LIMIT, SM, MEM, RX, TX, RAM, RAM_USED, CPU = c.LYCEUM_KEYS


def phase_window(name: str, kind: PhaseKind, step_ms: int = 15_000, margin_s: int = 0) -> Window:
    span = next(s for s in SC.execution(name).spans() if s.phase.kind is kind)
    return Window((span.start_s + margin_s) * 1000, span.end_s * 1000, step_ms)


def test_truth_is_keyed_by_lyceum_names_on_the_execution_grid() -> None:
    t = GT.execution("healthy")
    assert tuple(t.metrics) == c.LYCEUM_KEYS
    e = SC.execution("healthy")
    assert t.window == Window(e.start_s * 1000, e.end_s * 1000, 15_000)
    assert t[UTIL].timestamps_ms[0] == e.start_s * 1000 and t[UTIL].timestamps_ms[-1] == e.end_s * 1000
    assert all(len(m.values) == t.window.points for m in t.metrics.values())
    assert GT.execution(e.execution_id).metrics == t.metrics
    assert execution_truth(DS, "healthy").metrics == t.metrics


def test_oom_reaches_full_memory_at_the_end() -> None:
    t = GT.execution("oom")
    fb = t[FB]
    assert fb.values[-1] == 100.0
    climb = [v for tm, v in fb.points() if tm > SC.execution("oom").spans()[-1].start_s * 1000]
    assert climb == sorted(climb) and climb[0] < 70
    assert t.summary()[FB].max == 100.0
    assert SC.execution("oom").status.value == "failed"


def test_throttle_power_at_the_limit_clock_down_hot() -> None:
    w = phase_window("throttled", PhaseKind.THROTTLE, margin_s=60)
    m = GT.host("gpu-node-1", (4, 5, 6, 7), w)
    assert {v for _, v in m[LIMIT].points()} == {4 * 700.0}
    assert all(2796 <= v <= 2800 for _, v in m[POWER].points())
    assert all(v < 1500 for _, v in m[SM].points())
    assert all(86 <= v <= 88 for _, v in m[TEMP].points())
    steady = GT.host("gpu-node-1", (4, 5, 6, 7), phase_window("throttled", PhaseKind.STEADY, margin_s=60))
    assert all(v == 1980 for _, v in steady[SM].points())
    assert all(v < 2800 - 200 for _, v in steady[POWER].points())


def test_input_stall_low_util_busy_cpu() -> None:
    w = phase_window("input-bound", PhaseKind.INPUT_STALL, margin_s=60)
    m = GT.host("gpu-node-2", None, w)
    assert all(5 <= v <= 15 for _, v in m[UTIL].points())
    cpu = m[CPU].stable_points()
    assert cpu and all(v == pytest.approx(90.0, abs=1e-9) for _, v in cpu)


def test_healthy_steady_training() -> None:
    m = GT.host("gpu-node-1", (0, 3), phase_window("healthy", PhaseKind.STEADY, margin_s=60))
    assert all(90 <= v <= 98 for _, v in m[UTIL].points())
    assert all(v < 2 * 700 for _, v in m[POWER].points())
    assert all(v == pytest.approx(70, abs=0.1) for _, v in m[FB].points())
    assert {v for _, v in m[RAM].points()} == {float(SC.hosts[0].node.mem_total_bytes)}


def test_unowned_gpus_would_be_noticed() -> None:
    w = phase_window("healthy", PhaseKind.STEADY, margin_s=60)
    mine = GT.host("gpu-node-1", (0, 3), w)
    leaked = GT.host("gpu-node-1", (0, 1, 2, 3), w)
    for key in (UTIL, FB, POWER, LIMIT, SM, MEM, RX, TX):
        assert mine[key].values != leaked[key].values, key


def test_fallback_series_power_mgmt_limit_and_pcie_kilobytes() -> None:
    w = phase_window("oom", PhaseKind.STEADY)
    m = GT.host("gpu-node-2", None, w)
    assert {v for _, v in m[LIMIT].points()} == {2 * 400.0}
    rx = DS.gpu_series("gpu-node-2", Field.PCIE_RX)
    for t, v in m[RX].points()[:20]:
        k = (t // 1000 - SC.start_s) // SC.scrape_interval_s
        assert v == 1024 * sum(DS.value_at(s, k) for s in rx)


def test_cpu_only_execution_has_no_gpu_points() -> None:
    t = GT.execution("cpu-only")
    for key in (UTIL, FB, TEMP, POWER, LIMIT, SM, MEM, RX, TX):
        assert t[key].points() == [] and all(t[key].stable)
    steady = GT.host("cpu-node-1", None, phase_window("cpu-only", PhaseKind.STEADY, margin_s=120))
    assert all(v == pytest.approx(75.0, abs=1e-9) for _, v in steady[CPU].stable_points())
    assert t[RAM_USED].points()


def test_lookback_and_data_edges() -> None:
    w = Window((SC.end_s - 60) * 1000, (SC.end_s + 600) * 1000, 15_000)
    util = GT.host("gpu-node-1", None, w)[UTIL].as_dict()
    assert (SC.end_s + 300) * 1000 in util  # 2.x lookback is closed: [t - 5m, t]
    assert (SC.end_s + 315) * 1000 not in util
    before = GT.host("gpu-node-1", None, Window((SC.start_s - 120) * 1000, SC.start_s * 1000, 15_000))
    assert before[UTIL].points() == [(SC.start_s * 1000, 0.0)]
    assert before[CPU].points() == []  # rate needs two samples


def test_cpu_window_and_rate() -> None:
    assert rate_window_ms(15_000, 15_000) == 60_000 and rate_window_ms(300_000, 15_000) == 300_000
    # constant slope, aligned: exactly the slope
    pts = [(t * 1000, 100.0 + 1.5 * t / 15) for t in range(0, 61, 15)]
    assert extrapolated_rate(pts, 0, 60_000, 60_000) == pytest.approx(0.1)
    # a counter reset adds the value before it
    assert extrapolated_rate([(0, 10.0), (15_000, 0.0), (30_000, 5.0)], 0, 30_000, 30_000) == pytest.approx(
        5 / 30
    )
    assert extrapolated_rate([(0, 1.0)], 0, 60_000, 60_000) is None
    # data starting inside the window is extrapolated by half an interval only
    late = extrapolated_rate([(30_000, 1000.0), (45_000, 1001.5), (60_000, 1003.0)], 0, 60_000, 60_000)
    assert late == pytest.approx(3.0 * (30 + 7.5) / 30 / 60)


def test_promql_aggregations() -> None:
    assert prom_avg([1.0, 2.0, 4.0]) == pytest.approx(7 / 3)
    assert prom_sum([0.25, 0.5]) == 0.75 and prom_max([3.0, 9.0, 1.0]) == 9.0


def test_stable_marks_points_every_backend_agrees_on() -> None:
    t = GT.execution("input-bound")
    cpu = t[CPU]
    boundary = next(s for s in t.execution.spans() if s.phase.kind is PhaseKind.INPUT_STALL).start_s * 1000
    unstable = [tm for tm, ok in zip(cpu.timestamps_ms, cpu.stable, strict=True) if not ok]
    assert any(boundary <= tm <= boundary + 90_000 for tm in unstable)
    assert all(t[UTIL].stable)


def test_summary_and_json() -> None:
    s = GT.summary("throttled")
    assert isinstance(s[UTIL], Stats) and s[UTIL].count == GT.execution("throttled").window.points
    util_mean, temp_max = s[UTIL].mean, s[TEMP].max
    assert util_mean is not None and 85 < util_mean < 97
    assert temp_max is not None and temp_max >= 87
    assert GT.summary("cpu-only")[UTIL] == Stats(0, None, None, None, None, None)
    doc = GT.to_json(grid=False)
    assert [e["name"] for e in doc["executions"]] == [e.name for e in SC.executions]
    assert "grid" not in doc["executions"][0]
    assert doc["executions"][2]["summary"][FB]["max"] == 100.0
    with_grid = GT.to_json(step_ms=60_000)["executions"][0]["grid"]
    assert with_grid["step_ms"] == 60_000 and set(with_grid["metrics"]) == set(c.LYCEUM_KEYS)
