"""The bench on damaged data: the zones where the hand-written forms are known wrong, the checks that
skip exactly those points, and the windows anchored on the data."""

from __future__ import annotations

import io
from dataclasses import replace

import orjson
from bench.cases import CASES, CaseResult, window_for
from bench.damaged import DAMAGE, NO_DAMAGE, restart_window, tolerance
from bench.handwritten import (
    HostData,
    PodData,
    Tolerance,
    check_lyceum,
    lyceum_forms,
    pod_forms,
    pod_grid,
    verify_pod,
)
from bench.run import Selection, _parser
from rich.console import Console

from bench import report
from gpulens.domain import catalog as c
from gpulens.domain.models import Window
from gpulens.domain.timeparse import format_rfc3339_ms
from gpulens_testkit.damage import DamageSpec, NanBurst, Restart, history_plan
from gpulens_testkit.scenarios import bench_scenario

SC = bench_scenario(days=2)
PLAN = history_plan(SC, DamageSpec())
HOST = SC.hosts[0].hostname
FORMS = lyceum_forms(HostData(HOST, "Hostname"), (), 15_000, 15_000)


def _ms(k: int) -> int:
    return PLAN.time_s(k) * 1000


def test_zones_follow_the_damage() -> None:
    restart = Restart(HOST, 3000, 3002)
    burst = NanBurst(HOST, "3", c.DCGM_POWER_USAGE, 5000, 5003)
    plan = replace(PLAN, restarts=(restart,), bursts=(burst,), missed={HOST: (5003, 7000)})
    zones = tolerance(plan, HOST, FORMS, 60_000)
    last_old = _ms(restart.k_stop - 1)
    for f in FORMS:
        dcgm = "DCGM_" in f.expr
        assert zones.covers(f.key, _ms(restart.k_stop)) is dcgm
        assert zones.covers(f.key, last_old + c.LOOKBACK_MS) is dcgm
        assert not zones.covers(f.key, last_old) and not zones.covers(f.key, last_old + c.LOOKBACK_MS + 1)
        # the NaN burst: power only, to the next sample the exporter gives (5003 is a missed scrape)
        if dcgm:
            power = f.key == "gpuPowerWatt"
            assert zones.covers(f.key, _ms(5000)) is power and zones.covers(f.key, _ms(5004) - 1) is power
            assert not zones.covers(f.key, _ms(5004)) and not zones.covers(f.key, _ms(5000) - 1)
    cpu = "systemCpuUsagePercent"
    assert zones.covers(cpu, _ms(0)) and zones.covers(cpu, _ms(0) + 60_000)
    assert not zones.covers(cpu, _ms(0) + 60_001)
    assert zones.covers(cpu, _ms(7000)) and zones.covers(cpu, _ms(7000) + 60_000)
    assert not zones.covers(cpu, _ms(7000) - 1) and not zones.covers(cpu, _ms(7000) + 60_001)
    assert not zones.covers("systemRamUsedBytes", _ms(7000))  # a gauge reads the sample before
    assert not tolerance(plan, HOST, FORMS, 60_000, gpus=["0"]).covers("gpuPowerWatt", _ms(5000))


def test_clean_data_is_known_wrong_only_where_its_counters_begin() -> None:
    clean = history_plan(SC, NO_DAMAGE)
    assert not clean.restarts and not clean.bursts and not clean.missed[HOST]
    zones = tolerance(clean, HOST, FORMS, 60_000)
    assert [f.key for f in FORMS if zones.spans(f.key)] == ["systemCpuUsagePercent"]
    assert zones.spans("systemCpuUsagePercent") == [(_ms(0), _ms(0) + 60_000)]


def test_check_skips_only_the_tolerated_points() -> None:
    window = Window(_ms(0), _ms(8), 15_000)
    times = [window.start_ms + k * window.step_ms for k in range(window.points)]
    api_values, hand_values = [1.0] * 9, [1.0] * 9
    hand_values[3] = 2.0  # the naive form double-counts here
    api = {
        f.key: [
            {"timestamp": format_rfc3339_ms(t), "value": v} for t, v in zip(times, api_values, strict=True)
        ]
        for f in FORMS
    }
    del api["systemCpuUsagePercent"][0]  # the API has no CPU point where the counters begin
    hand = {
        "data": {
            "result": [
                {
                    "metric": {},
                    "values": [[t / 1000, repr(v)] for t, v in zip(times, hand_values, strict=True)],
                }
            ]
        }
    }
    bodies = [orjson.dumps(hand)] * len(FORMS)
    zones = Tolerance(
        {f.key: [(times[3], times[3])] for f in FORMS} | {"systemCpuUsagePercent": [(times[0], times[3])]}
    )
    check = check_lyceum(orjson.dumps(api), bodies, FORMS, 1, window, zones)
    assert check.problems == [] and check.tolerated == len(FORMS) + 3
    assert check.compared == 9 * len(FORMS) - check.tolerated
    untolerated = check_lyceum(orjson.dumps(api), bodies, FORMS, 1, window)
    assert len(untolerated.problems) == len(FORMS) + 3  # each value; CPU: its length, ends and missing point
    # a point neither answer has: a problem on clean data (strict), counted on damaged data
    del api["systemRamTotalBytes"][5]
    hand_ram = {
        "data": {"result": [{"metric": {}, "values": [[t / 1000, "1.0"] for t in times[:5] + times[6:]]}]}
    }
    ram = FORMS.index(next(f for f in FORMS if f.key == "systemRamTotalBytes"))
    bodies[ram] = orjson.dumps(hand_ram)
    loose = check_lyceum(orjson.dumps(api), bodies, FORMS, 1, window, zones, strict=False)
    assert loose.problems == [] and loose.absent == 1
    strict = check_lyceum(orjson.dumps(api), bodies, FORMS, 1, window, zones)
    assert strict.problems == ["systemRamTotalBytes: 1 grid points in neither answer"]


def test_pod_per_gpu_series_of_two_exporter_pods_merge_outside_the_zone() -> None:
    grid = pod_grid(_ms(0), _ms(40), 10)
    forms = pod_forms(PodData("team-b", "llm-serve-0"), grid, 15_000)
    forms = [f for f in forms if f.key == "GPU_UTILIZATION_PER_GPU"]
    times = [grid.start_ms + k * grid.step_ms for k in range(grid.points)]
    old = {
        "metric": {"gpu": "4", "pod": "nvidia-dcgm-exporter-aaaaa"},
        "values": [[t / 1000, "5"] for t in times[:7]],
    }
    new = {
        "metric": {"gpu": "4", "pod": "nvidia-dcgm-exporter-bbbbb"},
        "values": [[t / 1000, "7"] for t in times[5:]],
    }
    hand = [orjson.dumps({"data": {"result": [old, new]}})]
    values = [{"timestamp": format_rfc3339_ms(t), "value": 5 if i < 5 else 7} for i, t in enumerate(times)]
    body = orjson.dumps(
        {"measurements": [{"type": "GPU_UTILIZATION_PER_GPU", "labels": {"gpu": "4"}, "values": values}]}
    )
    zones = Tolerance({"GPU_UTILIZATION_PER_GPU": [(times[5], times[6])]})
    assert verify_pod(body, forms, hand, grid, zones) == ([], 1)
    problems, _ = verify_pod(body, forms, hand, grid)
    assert problems and "two hand-written series for GPU 4 at 2 points" in problems[0]


def test_windows_anchored_on_the_data() -> None:
    by_name = {case.name: case for case in CASES}
    start = window_for(by_name["24 h @ 15 s from the data's start"], SC.start_s, SC.end_s)
    assert start.start_ms == SC.start_s * 1000 and start.end_ms - start.start_ms == 86_400_000
    around = restart_window(PLAN, HOST, 86_400, 15, SC.end_s)
    restart = window_for(by_name["24 h @ 15 s over a restart"], SC.start_s, SC.end_s, around)
    inside = [r for r in PLAN.restarts_of(HOST) if restart.start_ms < _ms(r.k_stop) < restart.end_ms]
    assert inside and (restart.start_ms // 1000 - SC.start_s) % 15 == 0 and restart.end_ms <= SC.end_s * 1000
    end = window_for(by_name["72 h @ 15 s (chunked)"], SC.start_s, SC.end_s)
    assert end.end_ms == SC.end_s * 1000


def test_data_flag_and_the_cases_of_each_data_set() -> None:
    args = _parser().parse_args(["--section", "lyceum", "--data", "damaged", "--only", "30 d"])
    s = Selection.from_args(args)
    assert s.data == ("damaged",) and not s.lyceum and not s.forms and not s.summary and s.anything
    assert s.cases_on(s.lyceum_cases, "damaged") and not s.cases_on(s.lyceum_cases, "clean")
    assert Selection.from_args(_parser().parse_args([])).data == ("clean", "damaged")
    assert DAMAGE.restarts_per_day == 1 and DAMAGE.missed_fraction == 0.005
    names = [k.name for k in CASES]
    assert names[:1] == ["1 h @ 5 s"] and "1 h @ 15 s" in names and "72 h @ 15 s (chunked)" in names
    assert dict(next(k for k in CASES if k.name == "1 h @ 15 s").targets) == {"Prometheus": 1.3}


def test_clean_and_damaged_ratios_print_side_by_side_with_their_targets() -> None:
    case = next(k for k in CASES if k.name == "1 h @ 15 s")
    window = window_for(case, SC.start_s, SC.end_s)
    clean = CaseResult(case, "Prometheus", window, 1, 12, api_s=[1.0], base_s=[0.5])
    damaged = CaseResult(case, "Prometheus", window, 1, 12, api_s=[1.2], base_s=[1.0], data="damaged")
    assert damaged.name == "Lyceum Prometheus 1 h @ 15 s, damaged data" and damaged.target_ratio == 1.3
    assert damaged.figures(150.0)[0].name.endswith("damaged data: wall p50 vs hand-written")
    out = io.StringIO()
    report.print_clean_vs_damaged(Console(file=out, width=200), [clean, damaged], [])
    row = next(line for line in out.getvalue().splitlines() if "1 h @ 15 s" in line)
    assert "2.00 (<= 1.3 MISS)" in row and "1.20 (<= 1.3 PASS)" in row
    assert row.index("2.00") < row.index("1.20")  # clean, then damaged
