"""CPU % from node_cpu_seconds_total when the counters start inside the rate window.

Found on a real GPU box: `gpulens run -- sleep 15` on an idle 16-CPU host reported 99.8 % falling to
74 %, because `1 - avg(rate(idle[60s]))` divides a 15 s increase by the whole minute. Idle over all
modes cancels how much of the window the series cover.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gpulens.agent.samples import Sample
from gpulens.backends.embedded import EmbeddedBackend
from gpulens.config import Settings
from gpulens.domain import catalog as c
from gpulens.planning.hosts import HostPlanOptions, HostTarget, plan_host
from gpulens.storage.samples import SampleStore

T0 = 1_767_225_600_000
CPUS = 4
MODES = {"idle": 75, "user": 20, "system": 4, "iowait": 1}  # hundredths of a second per second


def _cpu_plan(step_ms: int, scrape_ms: int) -> str:
    plan = plan_host(
        c.LYCEUM_METRICS,
        HostTarget("h", (), ("h:9100",)),
        step_ms,
        HostPlanOptions(scrape_interval_ms=scrape_ms),
    )
    return next(p.expr for p in plan if p.metric.lyceum == "systemCpuUsagePercent")


@pytest.mark.parametrize("scrape_ms", [1_000, 15_000])
def test_counters_that_start_inside_the_window_read_their_true_busy_share(
    tmp_path: Path, scrape_ms: int
) -> None:
    store = SampleStore.from_path(tmp_path / "s.db")
    boot = {mode: 1_000_000.0 * (i + 1) for i, mode in enumerate(MODES)}  # seconds since boot, per CPU
    samples = []
    for k in range(20):  # 20 scrapes, starting at T0: the first minute of a collector
        t = T0 + k * scrape_ms
        for cpu in range(CPUS):
            for mode, share in MODES.items():
                value = boot[mode] + cpu + share / 100 * k * scrape_ms / 1000
                labels = (("cpu", str(cpu)), ("mode", mode), ("instance", "h:9100"))
                samples.append(Sample(c.NODE_CPU_SECONDS, labels, value, t))
    store.write(samples)
    try:
        backend = EmbeddedBackend(store)
        step = scrape_ms
        expr = _cpu_plan(step, scrape_ms)
        [series] = backend.range_sync(expr, T0 + scrape_ms, T0 + 19 * scrape_ms, step)
        values = [float(v) for _, v in series.samples]
        assert len(values) == 19
        busy = 100.0 - MODES["idle"] * 100 / sum(MODES.values())  # from the 2nd scrape on
        assert values == pytest.approx([busy] * 19, rel=1e-9)
    finally:
        store.close()


def test_the_embedded_default_sizes_rate_windows_from_the_collect_interval(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("GPULENS_SCRAPE_INTERVAL", raising=False)
    assert Settings(collect_interval=5).scrape_interval_ms == 5_000
    assert Settings(collect_interval=1, prometheus_url="http://p:9090").scrape_interval_ms == 15_000
    assert Settings(collect_interval=1, scrape_interval="30s").scrape_interval_ms == 30_000
    monkeypatch.setenv("GPULENS_SCRAPE_INTERVAL", "10s")
    assert Settings(collect_interval=1).scrape_interval_ms == 10_000
