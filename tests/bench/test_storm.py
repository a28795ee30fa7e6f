"""The load section's summary storm (bench/storm.py): its executions, the other tenant's path, and its
figures (the busy/idle ratio against 2x, the server's peak RSS against the documented bound)."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime, timedelta

from bench.servers import Rss
from bench.storm import OTHER_ORG, SPAN_DAYS, StormResult, executions, small_read_path

from gpulens.domain.models import ExecutionStatus
from gpulens.service.summary import memory_bound

END = datetime(2026, 1, 1, tzinfo=UTC)
NOW = datetime(2026, 12, 2, 8, 0, tzinfo=UTC)


def test_a_year_long_running_execution_and_another_tenants_half_hour() -> None:
    year, other = executions("bench", "bench-node-1", END, NOW)
    assert year.org == "bench" and year.status is ExecutionStatus.RUNNING and year.end_time is None
    assert year.start_time == NOW - timedelta(days=SPAN_DAYS)
    assert other.org == OTHER_ORG and other.hostname == year.hostname
    assert other.start_time == END - timedelta(minutes=30) and other.end_time == END
    path = small_read_path(END)
    assert "start=2025-12-31T23:30:00Z&end=2026-01-01T00:00:00Z&step=15s" in path


def test_figures() -> None:
    r = StormResult(gpus=8, concurrency=2)
    r.idle_s = [0.010, 0.012, 0.011]
    r.busy_s = [0.020, 0.024, 0.022]
    r.summary_s = [5.0, 10.0]
    r.statuses = Counter({200: 2, 503: 14})
    r.rss_before = Rss(100 * 1024, 120 * 1024)
    r.rss_after = Rss(150 * 1024, 190 * 1024)
    r.abandoned_cpu = 0.05
    assert r.ratio == 2.0
    assert r.bound_mib == 100 + 2 * 2 * memory_bound(8) / (1 << 20)
    ratio, rss, cpu = r.figures()
    assert cpu.value == 0.05 and cpu.verdict == "PASS"
    assert ratio.value == 2.0 and ratio.target == 2.0 and ratio.verdict == "PASS"
    assert rss.value == 190 and rss.target == r.bound_mib and rss.verdict == "PASS"
    text = "\n".join(r.lines())
    assert "2 x 200, 14 x 503" in text and "2.00x" in text
    assert r.as_json()["ratio_p50"] == 2.0
