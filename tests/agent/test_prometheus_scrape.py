"""A real Prometheus scrapes the agent (2 fake GPUs); the Lyceum planner's 12 expressions answer over it."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpulens.agent.collector import Collector
from gpulens.agent.exposition import ExpositionSink
from gpulens.agent.readers.fake import FakeGpuReader
from gpulens.agent.readers.system import SystemReader
from gpulens.agent.server import MetricsServer
from gpulens.domain import catalog as c
from gpulens.planning.hosts import HostPlanOptions, HostTarget, plan_host
from gpulens.planning.promql import eq, selector
from gpulens_testkit.promload import ServerHandle
from tests.agent.conftest import instant_query, start_scraping_prometheus

pytestmark = pytest.mark.integration

HOST = "agent-it-node"


@pytest.fixture
def agent() -> Iterator[MetricsServer]:
    sink = ExpositionSink()
    collector = Collector([FakeGpuReader(HOST, 2), SystemReader(HOST)], [sink], interval_s=1.0)
    stop = threading.Event()
    thread = collector.start(stop)
    server = MetricsServer(sink, "127.0.0.1", 0).start()
    try:
        yield server
    finally:
        stop.set()
        thread.join(10)
        server.stop()
        collector.close()


@pytest.fixture
def prometheus(agent: MetricsServer, tmp_path: Path) -> Iterator[ServerHandle]:
    handle = start_scraping_prometheus(tmp_path, f"127.0.0.1:{agent.port}")
    try:
        yield handle
    finally:
        handle.stop()


def wait_for(what: str, check: object, handle: ServerHandle, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():  # type: ignore[operator]
            return
        time.sleep(0.25)
    pytest.fail(f"timed out waiting for {what}: {handle.log_tail()}")


def test_prometheus_scrapes_the_agent_and_the_lyceum_plan_answers(prometheus: ServerHandle) -> None:
    url = prometheus.url
    util = selector(c.DCGM_GPU_UTIL, [eq("Hostname", HOST)])
    wait_for("two GPU series", lambda: len(instant_query(url, util)) == 2, prometheus)
    assert instant_query(url, c.NODE_MEM_TOTAL), "node_memory_MemTotal_bytes missing"
    assert {r["metric"]["job"] for r in instant_query(url, util)} == {"gpulens-agent"}

    # what the service does: find the node-exporter instance through node_uname_info{nodename=host}
    uname = instant_query(url, selector(c.NODE_UNAME_INFO, [eq(c.LABEL_NODENAME, HOST)]))
    instances = tuple(sorted({r["metric"][c.LABEL_INSTANCE] for r in uname}))
    assert len(instances) == 1
    plan = plan_host(
        c.LYCEUM_METRICS,
        HostTarget(HOST, node_instances=instances),
        15_000,
        HostPlanOptions(scrape_interval_ms=1_000),
    )
    assert len(plan) == 12

    answers: dict[str, float] = {}

    def all_answer() -> bool:
        for p in plan:
            result = instant_query(url, p.expr)
            if len(result) == 1:
                answers[p.metric.lyceum] = float(result[0]["value"][1])
        return len(answers) == len(plan)  # CPU % needs a second scrape for rate()

    wait_for("every Lyceum metric", all_answer, prometheus)
    assert all(math.isfinite(v) for v in answers.values()), answers
    assert 0 <= answers["gpuUtilizationPercent"] <= 100
    assert 0 < answers["gpuMemoryUtilizationPercent"] < 100
    assert answers["gpuPowerLimitWatt"] == 1400  # 2 x 700 W, summed
    assert answers["systemRamTotalBytes"] >= answers["systemRamUsedBytes"] > 0
    assert 0 <= answers["systemCpuUsagePercent"] <= 100
