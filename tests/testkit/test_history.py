"""gpulens_testkit.history: the demo's dataset plus families, single samples and lookups, all agreeing
with the demo's own values."""

from __future__ import annotations

import pytest

from gpulens.demo import history as demo_history
from gpulens.demo.history import Field
from gpulens.demo.scenario import PhaseKind, default_scenario
from gpulens.domain import catalog as c
from gpulens_testkit.history import Dataset, generate, sort_key

SC = default_scenario()
DS = generate(SC)


def k_of(t_s: int) -> int:
    return (t_s - SC.start_s) // SC.scrape_interval_s


def test_same_series_and_values_as_the_demo() -> None:
    demo = demo_history.generate(SC)
    assert isinstance(DS, Dataset) and isinstance(DS, demo_history.Dataset)
    assert DS.series == demo.series
    assert all(DS.values(s) == demo.values(s) for s in DS.series[::5])


def test_families_group_series_by_name_in_first_seen_order() -> None:
    names = list(dict.fromkeys(s.name for s in DS.series))
    assert [f.name for f in DS.families] == names
    assert [s for f in DS.families for s in f.series] == sorted(DS.series, key=lambda s: names.index(s.name))
    for f in DS.families:
        assert {s.name for s in f.series} == {f.name} and {s.metric_type for s in f.series} == {f.metric_type}
    cpu = next(f for f in DS.families if f.name == c.NODE_CPU_SECONDS)
    assert cpu.metric_type == "counter"


def test_value_at_agrees_with_values_and_is_bounded() -> None:
    for s in DS.series[::7]:
        assert DS.values(s, 100, 260) == [DS.value_at(s, k) for k in range(100, 260)]
    s = DS.series[0]
    with pytest.raises(IndexError):
        DS.value_at(s, SC.sample_count)
    with pytest.raises(IndexError):
        DS.value_at(s, -1)


def test_lookups_by_host_and_field() -> None:
    util = DS.series_of("gpu-node-1", Field.GPU_UTIL)
    assert [s.gpu for s in util] == list(range(8)) and all(s.field is Field.GPU_UTIL for s in util)
    assert DS.gpu_series("gpu-node-1", Field.GPU_UTIL, (3, 5)) == (util[3], util[5])
    cpus = DS.series_of("gpu-node-2", Field.CPU_SECONDS)
    assert [(s.cpu, s.mode) for s in cpus[:4]] == [(0, m) for m in demo_history.CPU_MODES]
    assert DS.series_of("cpu-node-1", Field.GPU_UTIL) == ()


def test_phase_and_cpu_load_behind_a_sample() -> None:
    throttle = next(s for s in SC.execution("throttled").spans() if s.phase.kind is PhaseKind.THROTTLE)
    k = k_of(throttle.end_s)
    got = DS.gpu_phase_at("gpu-node-1", 4, k)
    assert got is not None and got[0].name == "throttled" and got[1] == throttle
    assert DS.gpu_phase_at("gpu-node-1", 1, k) is None
    stall = next(s for s in SC.execution("input-bound").spans() if s.phase.kind is PhaseKind.INPUT_STALL)
    k = k_of(stall.start_s) + 20
    assert DS.cpu_percent_at("gpu-node-2", k) == 90  # host base 5 + input stall 85
    [idle] = [s for s in DS.series_of("gpu-node-2", Field.CPU_SECONDS) if s.cpu == 0 and s.mode == "idle"]
    idle_ticks = round((DS.value_at(idle, k) - DS.value_at(idle, k - 1)) * demo_history.TICKS_PER_SECOND)
    assert idle_ticks == SC.scrape_interval_s * (100 - DS.cpu_percent_at("gpu-node-2", k))


def test_sort_key_is_prometheus_label_set_order() -> None:
    ordered = sorted(DS.series_of("gpu-node-1", Field.GPU_UTIL), key=sort_key)
    uuids = sorted(s.labels[1][1] for s in ordered)
    assert [dict(s.labels)["UUID"] for s in ordered] == uuids  # the first label that differs here
    assert sort_key(ordered[0])[0] == ("DCGM_FI_DRIVER_VERSION", "580.105.08")
