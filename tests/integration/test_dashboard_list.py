"""The dashboard's list over stored summaries (issue 16, part 5), in headless Chromium.

25 finished 72-hour executions of two H100s each (60 s data; one host's history of 76 hours, every
execution a window of it, 10 minutes apart, read by the embedded evaluator from memory as an archived
execution is), served by a real `gpulens` app
(uvicorn, its background summary pass on). The first visit of `/` finds no stored summary: every row
is pending, and the list's one request queues the finished executions for the background. Once the
background has stored them, a *repeat* visit must show the mean GPU utilization of the newest 20 rows
within 3 s, from one request for all rows (no per-execution summary request), and the execution page
opened right after must list its findings within 5 s (its summary is served as stored).

The setup and each phase are timed and printed; on a 2-core machine the whole test takes well under
a minute.
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from gpulens.api.app import create_app
from gpulens.backends.embedded import EmbeddedBackend
from gpulens.config import Settings
from gpulens.demo.history import generate
from gpulens.demo.scenario import (
    DEFAULT_END_S,
    H100,
    ExecutionSpec,
    Host,
    NodeExporter,
    Phase,
    PhaseKind,
    Scenario,
    make_gpus,
    random_uuid,
)
from gpulens.domain import catalog as c
from gpulens.domain.models import Execution, ExecutionStatus
from gpulens.storage.archive import ArchiveSource
from tests.conftest import sqlite_registry
from tests.integration import test_dashboard as dash
from tests.integration.conftest import serve_app

pytestmark = pytest.mark.integration

INTERVAL_S = 60
EXECUTIONS = 25
NEWEST = 20
RUN_S = 72 * 3600
APART_S = 600
LIST_WITHIN_S = 3.0
FINDINGS_WITHIN_S = 5.0
SUMMARIES = "/api/v2/external/execution-summaries"


@dataclass
class LongSite:
    url: str
    key: str
    ids: list[str]  # newest first, as the list shows them
    setup_s: float


def long_history() -> Scenario:
    """One host, two H100s, 76 h 10 min of training with an input-bound stretch and a throttled one."""
    rng = random.Random(16)  # reproducible test data
    host = Host(
        "long-node-1",
        NodeExporter("long-node-1:9100", cpus=16, mem_total_bytes=1 << 41),
        H100,
        make_gpus(rng, 2),
        dcgm_instance="long-node-1:9400",
    )
    k = PhaseKind
    hours = 3600
    phases = (
        Phase(k.WARMUP, 600),
        Phase(k.STEADY, 30 * hours),
        Phase(k.INPUT_STALL, 8 * hours),
        Phase(k.STEADY, 30 * hours),
        Phase(k.THROTTLE, 2 * hours),
        Phase(k.STEADY, 6 * hours),
    )
    span = sum(p.duration_s for p in phases) + 2 * APART_S
    start = DEFAULT_END_S - span
    whole = ExecutionSpec(random_uuid(rng), "whole", host.hostname, (0, 1), start + APART_S, phases)
    return Scenario("long", 16, start, DEFAULT_END_S, (host,), (whole,), INTERVAL_S)


def in_memory(scenario: Scenario) -> ArchiveSource:
    """The scenario's every series decoded in memory, as an archived execution is served (an
    `ArchiveSource` under the embedded evaluator): no file to write, the same PromQL semantics."""
    dataset = generate(scenario)

    def series() -> Iterator[tuple[dict[str, str], Any, Any]]:
        for s in dataset.series:
            times, values = zip(*dataset.samples(s), strict=True)
            labels = {c.LABEL_METRIC_NAME: s.name, **dict(s.labels)}
            yield labels, np.array(times, dtype=np.int64) * 1000, np.array(values, dtype=np.float64)

    return ArchiveSource(series())


@pytest.fixture(scope="module")
def long_site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LongSite]:
    started = time.perf_counter()
    tmp = Path(tmp_path_factory.mktemp("dashboard-list"))
    scenario = long_history()
    source = in_memory(scenario)
    prices = tmp / "prices.toml"
    prices.write_text('currency = "USD"\n[gpu_hour]\n"gpu.h100" = 2.5\n')
    registry = sqlite_registry(tmp / "registry.db")
    _, key = registry.create_key("acme", name="alice")
    whole = scenario.executions[0]
    ids = []
    for i in range(EXECUTIONS):
        start = datetime.fromtimestamp(whole.start_s + i * APART_S, UTC)
        end = datetime.fromtimestamp(whole.start_s + i * APART_S + RUN_S, UTC)
        execution_id = f"long-{i:02d}"
        registry.upsert_execution(
            Execution(
                execution_id=execution_id,
                org="acme",
                hostname=whole.hostname,
                gpus=("0", "1"),
                status=ExecutionStatus.COMPLETED,
                created_at=start,
                start_time=start,
                end_time=end,
                hardware_profile="gpu.h100",
                file_name=f"train_{i}.py",
            ),
            now=end,
        )
        ids.append(execution_id)
    settings = Settings(
        data_dir=tmp,
        prometheus_url=None,
        database_url=f"sqlite:///{tmp / 'registry.db'}",
        prices=prices,
        scrape_interval=f"{INTERVAL_S}s",
    )
    app = create_app(settings, registry=registry, backend=EmbeddedBackend(source, name="long history"))
    setup_s = time.perf_counter() - started
    try:
        with serve_app(app) as url:
            yield LongSite(url, key, ids[::-1], setup_s)
    finally:
        registry.dispose()


def wait_until_stored(site: LongSite, timeout_s: float = 60.0) -> float:
    """Seconds until the list endpoint calls every execution ready (the background's work)."""
    started = time.perf_counter()
    headers = {"Authorization": f"Bearer {site.key}"}
    with httpx.Client(base_url=site.url, timeout=30) as http:
        while True:
            r = http.get(SUMMARIES, params={"execution_id": site.ids}, headers=headers)
            assert r.status_code == 200, r.text
            statuses = [row["status"] for row in r.json()["summaries"]]
            if statuses == ["ready"] * len(site.ids):
                return time.perf_counter() - started
            assert time.perf_counter() - started < timeout_s, (
                f"not all stored after {timeout_s} s: {statuses}"
            )
            time.sleep(0.25)


UTIL_SHOWN = """n => Array.from(document.querySelectorAll('#history tr[data-execution]')).slice(0, n)
    .filter(tr => (tr.querySelector('[data-field=meanGpuUtil]') || {}).textContent?.includes('%')).length"""


def test_a_repeat_visit_lists_stored_summaries_at_once(browser: Any, long_site: LongSite) -> None:
    site = long_site
    context = browser.new_context(viewport={"width": 1400, "height": 1000}, service_workers="block")
    pg = context.new_page()
    rec = dash.Recorder([], [])
    pg.on("request", lambda r: rec.requests.append(r.url))
    pg.on("console", lambda m: rec.errors.append(m.text) if m.type == "error" else None)
    pg.on("pageerror", lambda exc: rec.errors.append(f"pageerror: {exc}"))
    try:
        # first visit: nothing stored yet, every row pending; the one list request queues them all
        pg.goto(site.url + "/")
        pg.fill("input[name=api_key]", site.key)
        pg.click("form#signin button[type=submit]")
        pg.wait_for_selector("#history tr[data-execution][data-summary]", timeout=30_000)
        first = pg.eval_on_selector_all(
            "#history tr[data-execution]", "trs => trs.map(t => t.dataset.summary)"
        )
        assert len(first) == EXECUTIONS and "pending" in first, first
        filled_s = wait_until_stored(site)

        # the repeat visit, timed from navigation to 20 rows with their mean utilization
        pg.wait_for_timeout(50)  # (Playwright delivers the first visit's request events meanwhile)
        rec.requests.clear()
        t0 = time.perf_counter()
        pg.goto(site.url + "/")
        pg.wait_for_function(UTIL_SHOWN, arg=NEWEST, timeout=30_000)
        list_s = time.perf_counter() - t0
        rows = pg.locator("#history tr[data-execution]")
        assert rows.count() == EXECUTIONS
        assert [rows.nth(i).get_attribute("data-execution") for i in range(NEWEST)] == site.ids[:NEWEST]
        newest = pg.locator(f'#history tr[data-execution="{site.ids[0]}"]')
        assert "USD" in newest.locator(".cost").inner_text()
        badge = newest.locator('.badge[data-kind="input_bound"]')
        assert badge.count() == 1 and "GPU-h" in badge.inner_text(), newest.inner_text()
        asked = [u for u in rec.requests if "/api/" in u]
        assert sum(SUMMARIES in u for u in asked) == 1, asked  # one request for every row ...
        assert not [u for u in asked if "/summary" in u], asked  # ... and no per-execution summary

        # the execution page right after: its findings (the stored summary) within 5 s
        t1 = time.perf_counter()
        pg.click(f'#history tr[data-execution="{site.ids[0]}"] a')
        pg.wait_for_selector("body[data-summary=loaded]", state="attached", timeout=30_000)
        findings_s = time.perf_counter() - t1
        assert pg.locator('#findings [data-kind="input_bound"]').count() >= 1
        print(
            f"\ndashboard list: setup {site.setup_s:.1f} s, background filled {EXECUTIONS} summaries in "
            f"{filled_s:.1f} s, repeat visit {list_s:.2f} s to {NEWEST} rows' utilization, execution "
            f"page findings {findings_s:.2f} s"
        )
        assert list_s < LIST_WITHIN_S, f"the repeat visit took {list_s:.2f} s"
        assert findings_s < FINDINGS_WITHIN_S, f"the execution page's findings took {findings_s:.2f} s"
        assert rec.errors == [] and rec.foreign() == []
    finally:
        context.close()
