"""The fleet usage page (`/ui/usage`, docs/usage.md) in headless Chromium.

One host with two H100s runs 10 hours of generated work at 60 s (steady training, an input-bound
stretch, an idle stretch with memory held, a throttled one; read by the embedded evaluator from memory
as an archived execution is). Org `acme` registers five finished executions as windows of it, for three
users and two projects (and one without a project); org `beta` one more, which must never count. Each
execution's summary is computed and stored (with its hourly usage slices) by asking for it, as the
API's tests do. The page, served by a real app, must draw one row per group with a bar whose segments
are the API's categories to scale, a totals row equal to the API's sums, sort by a column both ways,
group by two keys, move its window by a preset, and link a group to its executions, worst first;
it logs no console error and asks nothing of another host.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest

from gpulens.api.app import create_app
from gpulens.backends.embedded import EmbeddedBackend
from gpulens.config import Settings
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
from gpulens.domain.models import Execution, ExecutionStatus
from gpulens.domain.timeparse import format_rfc3339
from tests.conftest import sqlite_registry
from tests.integration import test_dashboard as dash
from tests.integration.conftest import serve_app
from tests.integration.test_dashboard_list import in_memory

pytestmark = pytest.mark.integration

INTERVAL_S = 60
HOUR = 3600
USAGE = "/api/v2/external/usage"
BAR_W = 1000  # usage.js: the widest row's bar fills the viewBox


@dataclass
class UsageSite:
    url: str
    key: str  # acme's
    start: datetime  # a window holding every execution
    end: datetime
    owners: dict[str, tuple[str, str | None]]  # acme's execution id -> (user, project)


def ten_hours() -> tuple[Scenario, ExecutionSpec]:
    rng = random.Random(19)  # reproducible test data
    host = Host(
        "usage-node-1",
        NodeExporter("usage-node-1:9100", cpus=16, mem_total_bytes=1 << 41),
        H100,
        make_gpus(rng, 2),
        dcgm_instance="usage-node-1:9400",
    )
    k = PhaseKind
    phases = (
        Phase(k.WARMUP, 600),
        Phase(k.STEADY, 3 * HOUR - 600),
        Phase(k.INPUT_STALL, 2 * HOUR),
        Phase(k.IDLE, 2 * HOUR),
        Phase(k.THROTTLE, 1 * HOUR),
        Phase(k.STEADY, 2 * HOUR),
    )
    start = DEFAULT_END_S - 6 * HOUR  # 18:00 UTC: the work crosses midnight
    whole = ExecutionSpec(random_uuid(rng), "whole", host.hostname, (0, 1), start, phases)
    scenario = Scenario("usage", 19, start - HOUR, whole.end_s + HOUR, (host,), (whole,), INTERVAL_S)
    return scenario, whole


# acme's executions as (id, user, project, first hour, last hour) of the 10 hours; beta's one more
WINDOWS = [
    ("use-alice-nlp", "alice", "nlp", 0, 5),  # steady, then input-bound
    ("use-alice-vision", "alice", "vision", 5, 7),  # idle, memory held
    ("use-bob-nlp", "bob", "nlp", 7, 10),  # throttled, then steady
    ("use-bob-vision", "bob", "vision", 2, 8),  # across midnight
    ("use-carol", "carol", None, 1, 3),
]


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[UsageSite]:
    tmp = Path(tmp_path_factory.mktemp("dashboard-usage"))
    scenario, whole = ten_hours()
    prices = tmp / "prices.toml"
    prices.write_text('currency = "USD"\n[gpu_hour]\n"gpu.h100" = 2.5\n')
    registry = sqlite_registry(tmp / "registry.db")
    _, key = registry.create_key("acme", name="alice")
    _, beta_key = registry.create_key("beta", name="dave")
    owners: dict[str, tuple[str, str | None]] = {}
    rows = [(e, "acme", u, p, a, b) for e, u, p, a, b in WINDOWS] + [
        ("use-beta", "beta", "dave", "nlp", 0, 10)
    ]
    for execution_id, org, user, project, first, last in rows:
        start = datetime.fromtimestamp(whole.start_s + first * HOUR, UTC)
        end = datetime.fromtimestamp(whole.start_s + last * HOUR, UTC)
        registry.upsert_execution(
            Execution(
                execution_id=execution_id,
                org=org,
                hostname=whole.hostname,
                gpus=("0", "1"),
                status=ExecutionStatus.COMPLETED,
                created_at=start,
                start_time=start,
                end_time=end,
                hardware_profile="gpu.h100",
                project=project,
                user=user,
            ),
            now=end,
        )
        if org == "acme":
            owners[execution_id] = (user, project)
    settings = Settings(
        data_dir=tmp,
        prometheus_url=None,
        database_url=f"sqlite:///{tmp / 'registry.db'}",
        prices=prices,
        scrape_interval=f"{INTERVAL_S}s",
    )
    backend = EmbeddedBackend(in_memory(scenario), name="usage history")
    app = create_app(settings, registry=registry, backend=backend)
    try:
        with serve_app(app) as url, httpx.Client(base_url=url, timeout=60) as http:
            # each summary computed and stored (with its hourly slices) by asking for it
            for execution_id, org, *_ in rows:
                auth = {"Authorization": f"Bearer {key if org == 'acme' else beta_key}"}
                r = http.get(f"/api/v2/external/execution/{execution_id}/summary", headers=auth)
                assert r.status_code == 200, r.text
            yield UsageSite(
                url,
                key,
                datetime.fromtimestamp(whole.start_s - HOUR, UTC),
                datetime.fromtimestamp(whole.end_s + HOUR, UTC),
                owners,
            )
    finally:
        registry.dispose()


def api_rows(site: UsageSite, group_by: str) -> list[dict[str, Any]]:
    params = {"group_by": group_by, "start": format_rfc3339(site.start), "end": format_rfc3339(site.end)}
    r = httpx.get(site.url + USAGE, params=params, headers={"Authorization": f"Bearer {site.key}"})
    assert r.status_code == 200, r.text
    rows: list[dict[str, Any]] = r.json()["rows"]
    return rows


def to_input(t: datetime) -> str:
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M")


def shown(pg: Any, group_by: tuple[str, str], site: UsageSite) -> None:
    """Choose the grouping and the site's window in the form, submit, wait for the table."""
    pg.select_option("#group-by", group_by[0])
    pg.select_option("#then-by", group_by[1])
    pg.fill("#start", to_input(site.start))
    pg.fill("#end", to_input(site.end))
    pg.evaluate("document.body.dataset.usage = ''")
    pg.click("#usage-form button[type=submit]")
    dash.wait_for_attr(pg, "body[data-usage=loaded]")


def texts(pg: Any, selector: str) -> list[str]:
    found: list[str] = pg.eval_on_selector_all(selector, "els => els.map(e => e.textContent.trim())")
    return found


def number(text: str) -> float:
    return float(text.replace(",", "").split()[0])


def test_the_usage_page_draws_rows_bars_and_totals(
    page: tuple[Any, dash.Recorder], site: UsageSite, artifacts: Path
) -> None:
    pg, rec = page
    pg.goto(site.url + "/")
    pg.fill("input[name=api_key]", site.key)
    pg.click("form#signin button[type=submit]")
    dash.wait_for_attr(pg, "body[data-summaries=loaded]")
    pg.click("header nav a:text('Usage')")  # every page's navigation leads here
    dash.wait_for_path(pg, "/ui/usage")
    dash.wait_for_attr(pg, "body[data-usage=loaded]")
    assert pg.locator("header nav a[aria-current=page]").inner_text() == "Usage"
    # the default window is the week before now: the generated year-old work is not in it
    assert "No usage in this window" in pg.locator("#usage").inner_text()

    shown(pg, ("user", ""), site)
    expected = api_rows(site, "user")
    by_user = {r["group"]["user"]: r for r in expected}
    assert set(by_user) == {"alice", "bob", "carol"}  # beta's dave never counts
    rows = pg.locator("table.usage tbody tr")
    assert rows.count() == 3
    # in the API's order (GPU-hours, largest first), each row's figures as the API answered them
    assert texts(pg, 'table.usage tbody [data-field="key:user"]') == [r["group"]["user"] for r in expected]
    for r in expected:
        tr = pg.locator(f'table.usage tbody tr[data-group="{r["group"]["user"]}"]')
        assert number(tr.locator('[data-field="gpuHours"]').inner_text()) == pytest.approx(
            r["gpuHours"], abs=0.01
        )
        assert tr.locator('[data-field="cost"]').inner_text().endswith("USD")
        assert number(tr.locator('[data-field="cost"]').inner_text()) == pytest.approx(r["cost"], abs=0.01)
    # the bars: the categories to scale (the widest row fills the bar; each segment its GPU-hours)
    widest = max(r["gpuHours"] for r in expected)
    for r in expected:
        rects = pg.eval_on_selector_all(
            f'table.usage tbody tr[data-group="{r["group"]["user"]}"] svg.usage-bar rect',
            "rs => rs.map(x => [x.dataset.category, +x.getAttribute('width'), +x.dataset.hours])",
        )
        segs = {c: (w, h) for c, w, h in rects}
        waste = r["idleGpuHours"] + r["idleHeldGpuHours"] + r["inputBoundGpuHours"] + r["throttledGpuHours"]
        stacked = sum(w for c, (w, _) in segs.items() if c != "useful")
        assert stacked == pytest.approx(BAR_W * r["gpuHours"] / widest, rel=1e-6)
        assert segs["busy"][1] == pytest.approx(r["gpuHours"] - waste, abs=1e-6)
        assert segs["useful"][1] == pytest.approx(r["usefulGpuHours"], abs=1e-6)
        for category, field in [
            ("idle", "idleGpuHours"),
            ("idle_held", "idleHeldGpuHours"),
            ("input_bound", "inputBoundGpuHours"),
            ("throttled", "throttledGpuHours"),
        ]:
            if r[field] > 0:
                assert segs[category][1] == pytest.approx(r[field], abs=1e-6)
            else:
                assert category not in segs
    # the generated stretches show: alice input-bound and idle with memory held, bob throttled
    assert by_user["alice"]["inputBoundGpuHours"] > 0.5 and by_user["alice"]["idleHeldGpuHours"] > 0.5
    assert by_user["bob"]["throttledGpuHours"] > 0.5
    assert pg.locator('tr[data-group="alice"] rect[data-category="idle_held"]').count() == 1
    assert pg.locator('tr[data-group="bob"] rect[data-category="throttled"]').count() == 1
    # the totals row: the API's sums
    total = pg.locator("table.usage tfoot tr")
    assert total.locator('[data-field="executions"]').inner_text() == "5"
    for field in ("gpuHours", "usefulGpuHours", "idleHeldGpuHours", "energyKwh", "cost"):
        want = sum(r[field] for r in expected)
        assert number(total.locator(f'[data-field="{field}"]').inner_text()) == pytest.approx(want, abs=0.01)
    assert total.locator("svg.usage-bar rect").count() >= 4
    shot = artifacts / "usage.png"
    pg.screenshot(path=str(shot), full_page=True)
    print(f"screenshot: {shot}")

    # sorting: by GPU-hours both ways, by the user's name, by the share of waste
    hours = sorted(expected, key=lambda r: r["gpuHours"])
    pg.click('table.usage th[data-col="gpuHours"] button')
    assert pg.get_attribute('table.usage th[data-col="gpuHours"]', "aria-sort") == "descending"
    assert texts(pg, 'tbody [data-field="key:user"]') == [r["group"]["user"] for r in hours[::-1]]
    pg.click('table.usage th[data-col="gpuHours"] button')
    assert pg.get_attribute('table.usage th[data-col="gpuHours"]', "aria-sort") == "ascending"
    assert texts(pg, 'tbody [data-field="key:user"]') == [r["group"]["user"] for r in hours]
    pg.click('table.usage th[data-col="key:user"] button')
    assert texts(pg, 'tbody [data-field="key:user"]') == ["alice", "bob", "carol"]
    pg.click('table.usage th[data-col="bar"] button')
    share = sorted(expected, key=lambda r: -(r["gpuHours"] - by_busy(r)) / r["gpuHours"])
    assert texts(pg, 'tbody [data-field="key:user"]') == [r["group"]["user"] for r in share]
    assert texts(pg, "tfoot [data-field=executions]") == ["5"]  # the totals stay below

    # two keys: one row per (project, user); an execution without a project is its own group
    shown(pg, ("project", "user"), site)
    pairs = api_rows(site, "project,user")
    assert pg.locator("table.usage tbody tr").count() == len(pairs) == 5
    assert pg.locator('tr[data-group="(no project) / carol"]').count() == 1
    assert "group_by=project%2Cuser" in pg.url  # the address keeps the table shown

    # by day: an execution on two days is in both, so the executions are not summed
    shown(pg, ("day", ""), site)
    days = api_rows(site, "day")
    assert pg.locator("table.usage tbody tr").count() == len(days) == 2
    assert texts(pg, 'tbody [data-field="key:day"]') == ["2025-12-31", "2026-01-01"]
    assert pg.locator("tfoot [data-field=executions]").inner_text() == "–"
    assert number(pg.locator("tfoot [data-field=gpuHours]").inner_text()) == pytest.approx(
        sum(r["gpuHours"] for r in expected), abs=0.01
    )

    # a preset moves the window to the last 30 days before now (nothing there)
    pg.evaluate("document.body.dataset.usage = ''")
    pg.click("button[data-preset='30d']")
    dash.wait_for_attr(pg, "body[data-usage=loaded]")
    start = datetime.fromisoformat(pg.input_value("#start") + "+00:00")
    end = datetime.fromisoformat(pg.input_value("#end") + "+00:00")
    assert end - start == timedelta(days=30)
    assert abs(end - datetime.now(UTC)) < timedelta(minutes=5)
    assert "No usage in this window" in pg.locator("#usage").inner_text()
    assert rec.errors == []
    assert rec.foreign() == []


def by_busy(r: dict[str, Any]) -> float:
    waste: float = (
        r["idleGpuHours"] + r["idleHeldGpuHours"] + r["inputBoundGpuHours"] + r["throttledGpuHours"]
    )
    return r["gpuHours"] - waste


def test_a_group_links_to_its_executions_worst_first(
    page: tuple[Any, dash.Recorder], site: UsageSite, artifacts: Path
) -> None:
    pg, rec = page
    pg.goto(site.url + "/")  # the sign-in form: the origin, nothing asked of the API yet
    pg.evaluate("k => sessionStorage.setItem('gpulens.apiKey', k)", site.key)
    query = f"group_by=user&start={format_rfc3339(site.start)}&end={format_rfc3339(site.end)}"
    pg.goto(f"{site.url}/ui/usage?{query}")
    dash.wait_for_attr(pg, "body[data-usage=loaded]")
    assert pg.input_value("#group-by") == "user"
    link = pg.locator('tr[data-group="alice"] a.executions-link')
    assert link.inner_text().startswith("2")
    href = link.get_attribute("href")
    q = parse_qs(urlsplit(href).query)
    assert q["user"] == ["alice"] and q["order"] == ["worst"] and "start" in q and "end" in q
    link.click()
    pg.wait_for_url("**/?*user=alice*")
    dash.wait_for_attr(pg, "body[data-summaries=loaded]")
    assert pg.locator("#running").is_hidden()
    assert "Executions of user alice" in pg.locator("#filter").inner_text()
    listed = pg.eval_on_selector_all(
        "#history tr[data-execution]", "trs => trs.map(t => [t.dataset.execution, +t.dataset.waste])"
    )
    assert sorted(e for e, _ in listed) == sorted(e for e, (u, _) in site.owners.items() if u == "alice")
    wastes = [w for _, w in listed]
    assert wastes == sorted(wastes, reverse=True) and wastes[0] > 0
    shot = artifacts / "usage-executions.png"
    pg.screenshot(path=str(shot), full_page=True)
    print(f"screenshot: {shot}")
    # a group without a project links to the executions without one
    pg.goto(
        f"{site.url}/ui/usage?group_by=project&start={format_rfc3339(site.start)}&end={format_rfc3339(site.end)}"
    )
    dash.wait_for_attr(pg, "body[data-usage=loaded]")
    pg.click('tr[data-group="(no project)"] a.executions-link')
    dash.wait_for_attr(pg, "body[data-summaries=loaded]")
    assert texts(pg, "#history tr[data-execution] td:first-child") == ["use-carol"]
    # by day: the link's window is that day's part of the page's window
    pg.goto(
        f"{site.url}/ui/usage?group_by=day&start={format_rfc3339(site.start)}&end={format_rfc3339(site.end)}"
    )
    dash.wait_for_attr(pg, "body[data-usage=loaded]")
    hrefs = pg.eval_on_selector_all("a.executions-link", "as => as.map(a => a.getAttribute('href'))")
    for h in hrefs:
        window = parse_qs(urlsplit(h).query)
        start = datetime.fromisoformat(window["start"][0].replace("Z", "+00:00"))
        end = datetime.fromisoformat(window["end"][0].replace("Z", "+00:00"))
        assert site.start <= start < end <= site.end and end - start <= timedelta(days=1)
    assert len(hrefs) == len(api_rows(site, "day")) == 2
    assert rec.errors == []
    assert rec.foreign() == []


# the fixtures of the dashboard's tests: a fresh browser context per test, the artifacts folder
page = dash.page
artifacts = dash.artifacts
