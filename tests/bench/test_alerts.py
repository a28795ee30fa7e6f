"""The alerts section's pure parts: its executions and rules, the tail a pass reads, the figures, and
that `--section alerts` (and the default run) select it."""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime

from bench.alerts import (
    EXECUTIONS,
    TARGET_CPU_S,
    AlertsResult,
    PassSample,
    bench_executions,
    bench_rules,
    tail_window,
)
from bench.run import Selection, _parser

from gpulens.domain.models import ExecutionStatus
from gpulens.domain.timeparse import datetime_to_ms

END_S = 1_800_000_000
HOUR_MS = 3_600_000


def test_executions_spread_over_hosts_gpus_and_the_last_day() -> None:
    found = bench_executions([("node-1", 8)], END_S)
    assert len(found) == EXECUTIONS == 200
    assert len({e.execution_id for e in found}) == 200
    assert {e.status for e in found} == {ExecutionStatus.RUNNING}
    assert [e.gpus for e in found[:4]] == [("0",), ("1",), ("0", "1"), ("2",)]  # each its own GPUs
    assert len({e.gpus for e in found}) == 200
    ages = [END_S * 1000 - datetime_to_ms(e.start_time) for e in found if e.start_time is not None]
    assert max(ages) == 24 * HOUR_MS and min(ages) == HOUR_MS
    two = bench_executions([("a", 4), ("b", 2)], END_S, count=4)
    assert [(e.hostname, e.gpus) for e in two] == [("a", ("0",)), ("b", ("0",)), ("a", ("1",)), ("b", ("1",))]


def test_rules_and_the_tail_a_pass_reads() -> None:
    now = datetime.fromtimestamp(END_S, UTC)
    rules = bench_rules("chn_x", now)
    assert [r.kind for r in rules] == ["idle_held", "idle", "input_bound", "power_throttle"]
    assert all(r.channels == ("chn_x",) for r in rules)
    assert rules[1].action is not None and rules[1].action.after_ms == 2 * HOUR_MS
    end_ms = END_S * 1000
    executions = bench_executions([("node-1", 8)], END_S)
    old, young = executions[0], executions[-1]
    # the longest `for` (input_bound and power_throttle: 1 h; a stop's `after` is not read) and 10
    # minutes of smoothing
    assert tail_window(old, rules, end_ms, 600_000) == (end_ms - HOUR_MS - 10 * 60_000, end_ms)
    assert tail_window(young, rules, end_ms, 600_000) == (end_ms - HOUR_MS, end_ms)  # from its start


def test_figures_and_json() -> None:
    empty = AlertsResult(measured=False, why="no Prometheus")
    assert [f.verdict for f in empty.figures()] == ["n/a", "n/a"]
    assert empty.lines() == ["Alerts: not measured (no Prometheus)"]
    json.dumps(empty.as_json())
    r = AlertsResult(
        warmup=PassSample(2.0, 3.0, 1.0, 200, 150, 0),
        passes=[PassSample(cpu, cpu * 2, 0.5, 200, 0, 0) for cpu in (0.4, 0.6, 0.5)],
        baseline=[PassSample(2.0, 4.0, 1.5, 200, 0, 0)],
    )
    cpu, vs = r.figures()
    assert cpu.value == 0.5 and cpu.target == TARGET_CPU_S and cpu.verdict == "PASS" and cpu.unit == "s"
    assert vs.value is not None and math.isclose(vs.value, 0.25) and vs.verdict == "-"
    assert r.as_json()["cpu_per_pass_p50_s"] == 0.5
    assert len(r.lines()) == 3


def test_section_selection() -> None:
    def select(*argv: str) -> Selection:
        return Selection.from_args(_parser().parse_args(list(argv)))

    assert select().alerts
    alone = select("--section", "alerts")
    assert alone.alerts and alone.anything and not alone.lyceum and not alone.load and not alone.dashboard
    assert not select("--section", "lyceum").alerts
    assert not select("--section", "alerts", "--only", "Summary").alerts
