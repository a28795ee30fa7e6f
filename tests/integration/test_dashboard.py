"""The web dashboard in headless Chromium (Debian's `chromium`, driven by Playwright for Python).

An app over the generated `default` scenario (the embedded store, the scenario's executions
registered for org `acme`, a Run:ai workload with one pod on a GPU host) is served on 127.0.0.1. The
browser signs in, lists the executions, opens the input-bound one, and must draw every chart, list
the findings, zoom at a finer step, open the workload page, log no console error and send no
request anywhere but 127.0.0.1. Screenshots go to a test-artifacts folder: `GPULENS_TEST_ARTIFACTS`
when set, else pytest's temporary directory (the paths are printed).

Playwright's own browser download is never used: the browser is /usr/bin/chromium
(`make servers` installs it). Under CI=true a missing chromium or playwright fails instead of skipping.
"""

from __future__ import annotations

import os
import re
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest

from gpulens.api.app import create_app
from gpulens.backends.embedded import EmbeddedBackend
from gpulens.config import Settings
from gpulens.domain import catalog as c
from gpulens.domain.timeparse import format_rfc3339, format_rfc3339_ms
from gpulens.storage.samples import SampleStore
from gpulens_testkit.history import Dataset
from gpulens_testkit.k8s_generate import K8sDataset
from gpulens_testkit.k8s_truth import K8sTruth
from gpulens_testkit.truth import GroundTruth
from tests.conftest import sqlite_registry
from tests.integration.conftest import serve_app
from tests.integration.lyceum_app import execution_body

pytestmark = pytest.mark.integration

LYCEUM_SERIES = 12


@dataclass
class Site:
    url: str
    key: str
    dataset: Dataset
    hostile_id: str  # an execution whose file name and error are HTML


HOSTILE = '<img src=x onerror="window.__xss=1"><script>window.__xss=2</script>'


@dataclass
class K8sSite:
    url: str
    key: str
    workload_id: str
    pod_name: str
    gpus: int


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    where = os.environ.get("GPULENS_TEST_ARTIFACTS")
    path = Path(where) / "dashboard" if where else Path(tmp_path_factory.mktemp("dashboard-artifacts"))
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture(scope="module")
def site(
    synth_default: tuple[Dataset, GroundTruth],
    embedded_store: SampleStore,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Site]:
    dataset = synth_default[0]
    tmp = Path(tmp_path_factory.mktemp("dashboard"))
    prices = tmp / "prices.toml"
    prices.write_text('currency = "USD"\n[gpu_hour]\n"gpu.h100" = 2.5\n')
    registry = sqlite_registry(tmp / "registry.db")
    _, admin = registry.create_key("platform", name="scheduler", is_admin=True)
    _, key = registry.create_key("acme", name="alice")
    settings = Settings(
        data_dir=tmp,
        prometheus_url=None,
        database_url=f"sqlite:///{tmp / 'registry.db'}",
        prices=prices,
        scrape_interval=f"{dataset.scenario.scrape_interval_s}s",  # the data's, not the collector's 5 s
    )
    app = create_app(settings, registry=registry, backend=EmbeddedBackend(embedded_store))
    try:
        with serve_app(app) as url, httpx.Client(base_url=url, timeout=30) as http:
            auth = {"Authorization": f"Bearer {admin}"}
            for e in dataset.scenario.executions:
                r = http.post("/api/v2/admin/executions", json=execution_body(e), headers=auth)
                assert r.status_code in (200, 201), r.text
            hostile = {
                "org": "acme",
                "hostname": "cpu-node-1",
                "status": "failed",
                "start_time": format_rfc3339(dataset.scenario.executions[0].start),
                "end_time": format_rfc3339(dataset.scenario.executions[0].end),
                "file_name": HOSTILE,
                "return_code": 1,
                "system_errors": [HOSTILE],
            }
            r = http.post("/api/v2/admin/executions", json=hostile, headers=auth)
            assert r.status_code in (200, 201), r.text
            yield Site(url, key, dataset, r.json()["execution_id"])
    finally:
        registry.dispose()


@pytest.fixture(scope="module")
def k8s_site(
    synth_k8s: tuple[K8sDataset, K8sTruth],
    embedded_k8s_store: SampleStore,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[K8sSite]:
    """The `k8s` scenario's finished training pod, registered as a Run:ai workload of org `acme`."""
    pod = next(p for p in synth_k8s[0].scenario.pods if p.end_s is not None and p.slots)
    tmp = Path(tmp_path_factory.mktemp("dashboard-k8s"))
    registry = sqlite_registry(tmp / "registry.db")
    _, admin = registry.create_key("platform", name="scheduler", is_admin=True)
    _, key = registry.create_key("acme", name="alice")
    settings = Settings(
        data_dir=tmp,
        prometheus_url=None,
        database_url=f"sqlite:///{tmp / 'registry.db'}",
        scrape_interval=f"{synth_k8s[0].scenario.scrape_interval_s}s",
    )
    app = create_app(settings, registry=registry, backend=EmbeddedBackend(embedded_k8s_store))
    workload_id = str(uuid.uuid4())
    body = {
        "workload_id": workload_id,
        "name": pod.workload,
        "org": "acme",
        "pods": [
            {
                "name": pod.name,
                "namespace": pod.namespace,
                "node": pod.node,
                "start_time": format_rfc3339_ms(pod.start_s * 1000),
                "end_time": format_rfc3339_ms(pod.end_s * 1000),
            }
        ],
    }
    try:
        with serve_app(app) as url, httpx.Client(base_url=url, timeout=30) as http:
            r = http.post("/api/v2/admin/workloads", json=body, headers={"Authorization": f"Bearer {admin}"})
            assert r.status_code in (200, 201), r.text
            yield K8sSite(url, key, workload_id, pod.name, len(pod.slots))
    finally:
        registry.dispose()


@dataclass
class Recorder:
    requests: list[str]
    errors: list[str]

    def foreign(self) -> list[str]:
        out = []
        for u in self.requests:
            parts = urlsplit(u)
            if parts.scheme in ("data", "blob", "about"):
                continue
            if parts.hostname != "127.0.0.1":
                out.append(u)
        return out


@pytest.fixture
def page(browser: Any) -> Iterator[tuple[Any, Recorder]]:
    context = browser.new_context(viewport={"width": 1400, "height": 1000}, service_workers="block")
    pg = context.new_page()
    rec = Recorder([], [])
    pg.on("request", lambda r: rec.requests.append(r.url))
    pg.on("console", lambda m: rec.errors.append(m.text) if m.type == "error" else None)
    pg.on("pageerror", lambda exc: rec.errors.append(f"pageerror: {exc}"))
    try:
        yield pg, rec
    finally:
        context.close()


def sign_in(pg: Any, site: Site) -> None:
    pg.goto(site.url + "/")
    pg.fill("input[name=api_key]", site.key)
    pg.click("form#signin button[type=submit]")


LINE_PIXELS = """cs => cs.map(c => {
    const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
    let n = 0;
    for (let i = 0; i < d.length; i += 4) {
        const hi = Math.max(d[i], d[i + 1], d[i + 2]), lo = Math.min(d[i], d[i + 1], d[i + 2]);
        if (d[i + 3] > 200 && hi - lo > 100) n++;
    }
    return n; })"""


def line_pixels(pg: Any, selector: str) -> list[int]:
    """Per canvas, its opaque saturated pixels: series lines (grid and text are grey, shading translucent)."""
    result: list[int] = pg.eval_on_selector_all(selector, LINE_PIXELS)
    return result


def wait_for_attr(pg: Any, selector: str, timeout_ms: int = 60_000) -> None:
    pg.wait_for_selector(selector, state="attached", timeout=timeout_ms)


def wait_for_path(pg: Any, path: str) -> None:
    """Wait until the page is at `path`, whatever its query string: a page may rewrite its
    query (history.replaceState) before the wait starts, and a glob on the whole URL then
    never matches."""
    pg.wait_for_url(lambda url: urlsplit(url).path == path)


def test_sign_in_lists_executions(page: tuple[Any, Recorder], site: Site, artifacts: Path) -> None:
    pg, rec = page
    sign_in(pg, site)
    wait_for_attr(pg, "body[data-summaries=loaded]")
    rows = pg.locator("#history tr[data-execution]")
    assert rows.count() == len(site.dataset.scenario.executions) + 1
    ib = site.dataset.scenario.execution("input-bound").execution_id
    row = pg.locator(f'#history tr[data-execution="{ib}"]')
    assert row.locator('.badge[data-kind="input_bound"]').count() == 1
    assert "%" in row.locator(".util").inner_text()
    assert "USD" in row.locator(".cost").inner_text()
    # the key lives in sessionStorage; no cookie is ever set
    assert pg.evaluate("sessionStorage.getItem('gpulens.apiKey')") == site.key
    assert pg.context.cookies() == []
    shot = artifacts / "index.png"
    pg.screenshot(path=str(shot), full_page=True)
    print(f"screenshot: {shot}")
    assert rec.errors == []
    assert rec.foreign() == []


def test_execution_page_draws_every_series(page: tuple[Any, Recorder], site: Site, artifacts: Path) -> None:
    pg, rec = page
    sign_in(pg, site)
    ib = site.dataset.scenario.execution("input-bound").execution_id
    pg.click(f'#history tr[data-execution="{ib}"] a')
    pg.wait_for_url(f"**/ui/executions/{ib}")
    wait_for_attr(pg, "body[data-charts=drawn]")
    wait_for_attr(pg, "body[data-summary=loaded]")
    charts = pg.locator("[data-metric]", has=pg.locator("canvas"))
    assert charts.count() == LYCEUM_SERIES
    metrics = pg.eval_on_selector_all("#charts [data-metric]", "els => els.map(e => e.dataset.metric)")
    assert len(set(metrics)) == LYCEUM_SERIES and "gpuUtilizationPercent" in metrics
    # a line was drawn in every chart
    painted = line_pixels(pg, "#charts [data-metric] canvas")
    assert len(painted) == LYCEUM_SERIES and all(n > 50 for n in painted), painted
    findings = pg.locator('#findings li[data-kind="input_bound"]')
    assert findings.count() >= 1
    # the story's finding and nothing else (a gap or a wrong interval would add no_data)
    kinds = pg.eval_on_selector_all("#findings li[data-kind]", "els => els.map(e => e.dataset.kind)")
    assert set(kinds) == {"input_bound"}, kinds
    assert findings.first.locator(".message").inner_text().strip()
    assert "USD" in pg.locator("#cost").inner_text()
    assert pg.locator("#stats tr[data-metric]").count() == LYCEUM_SERIES
    assert pg.locator("#per-gpu tr[data-gpu]").count() >= 1
    util = pg.locator('#per-gpu tr[data-gpu] td[data-stat="gpuUtilizationPercent"]').first.inner_text()
    assert util.endswith("%") and util != "– %", util  # the GPU's own figures (summary.perGpu)
    shot = artifacts / "execution.png"
    pg.screenshot(path=str(shot), full_page=True)
    print(f"screenshot: {shot}")

    # drag across the first chart: the charts are refetched for that window, at a finer step where the
    # whole run was drawn coarser than the scrape interval (these runs are short: 15 s, the floor, already)
    step = int(pg.get_attribute("#charts", "data-step"))
    fetched = len([u for u in rec.requests if "/metrics?" in u])
    box = pg.locator("#charts [data-metric] .u-over").first.bounding_box()
    y = box["y"] + box["height"] / 2
    pg.mouse.move(box["x"] + box["width"] * 0.40, y)
    pg.mouse.down()
    pg.mouse.move(box["x"] + box["width"] * 0.45, y, steps=5)
    pg.mouse.up()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and len([u for u in rec.requests if "/metrics?" in u]) == fetched:
        pg.wait_for_timeout(100)
    wait_for_attr(pg, "#charts[aria-busy=false]")
    zoomed = parse_qs(urlsplit([u for u in rec.requests if "/metrics?" in u][-1]).query)
    span_s = (
        datetime.fromisoformat(zoomed["end"][0]) - datetime.fromisoformat(zoomed["start"][0])
    ).total_seconds()
    run = site.dataset.scenario.execution("input-bound")
    assert 0 < span_s <= 0.1 * (run.end_s - run.start_s), zoomed
    assert 15 <= int(pg.get_attribute("#charts", "data-step")) <= step
    assert pg.locator("#reset").is_enabled()
    shot = artifacts / "execution-zoomed.png"
    pg.screenshot(path=str(shot), full_page=True)
    print(f"screenshot: {shot}")
    assert rec.errors == []
    assert rec.foreign() == []
    assert any("/metrics?" in u and "step=" in u for u in rec.requests)


def test_workload_page_draws_pod_metrics(
    page: tuple[Any, Recorder], k8s_site: K8sSite, artifacts: Path
) -> None:
    pg, rec = page
    site = k8s_site
    pg.goto(f"{site.url}/ui/workloads/{site.workload_id}")  # not signed in: to the form, then back
    pg.fill("input[name=api_key]", site.key)
    pg.click("form#signin button[type=submit]")
    pg.wait_for_url(f"**/ui/workloads/{site.workload_id}")
    wait_for_attr(pg, "body[data-charts=drawn]")
    assert site.pod_name in pg.locator("#pods").inner_text()
    charts = pg.locator("#pod-charts [data-metric]", has=pg.locator("canvas"))
    assert charts.count() == 4
    # one line per GPU in the per-GPU charts, and every chart has points
    gpu = pg.locator('#pod-charts [data-metric="GPU_UTILIZATION_PER_GPU"] .u-legend .u-series')
    assert gpu.count() == 1 + site.gpus  # the time column, then one per GPU
    assert pg.locator("#pod-charts .plot p.muted").count() == 0  # no "No data."
    painted = line_pixels(pg, "#pod-charts [data-metric] canvas")
    assert len(painted) == 4 and all(n > 50 for n in painted), painted
    shot = artifacts / "workload.png"
    pg.screenshot(path=str(shot), full_page=True)
    print(f"screenshot: {shot}")
    assert rec.errors == []
    assert rec.foreign() == []


def test_pages_without_a_key_go_to_sign_in(page: tuple[Any, Recorder], site: Site) -> None:
    pg, rec = page
    ib = site.dataset.scenario.execution("input-bound").execution_id
    pg.goto(f"{site.url}/ui/executions/{ib}")
    pg.wait_for_selector("input[name=api_key]", state="visible")
    pg.fill("input[name=api_key]", site.key)
    pg.click("form#signin button[type=submit]")
    pg.wait_for_url(f"**/ui/executions/{ib}")
    wait_for_attr(pg, "body[data-charts=drawn]")
    assert rec.foreign() == []


def test_a_wrong_key_is_refused(page: tuple[Any, Recorder], site: Site) -> None:
    pg, _ = page
    pg.goto(site.url + "/")
    pg.fill("input[name=api_key]", "lk_not_a_key")
    pg.click("form#signin button[type=submit]")
    pg.wait_for_selector("#signin-error .error")
    assert pg.evaluate("sessionStorage.getItem('gpulens.apiKey')") is None


def test_data_is_shown_as_text_never_as_html(page: tuple[Any, Recorder], site: Site) -> None:
    pg, rec = page
    sign_in(pg, site)
    wait_for_attr(pg, "body[data-summaries=loaded]")
    pg.goto(f"{site.url}/ui/executions/{site.hostile_id}")
    wait_for_attr(pg, "body[data-summary]")
    meta = pg.locator("#meta").inner_text()
    assert meta.count(HOSTILE) == 2  # the file name and the status details, verbatim
    assert pg.locator("#meta img, #meta script").count() == 0
    assert pg.evaluate("window.__xss") is None
    assert rec.errors == []
    assert rec.foreign() == []


# -- the execution page: headline, findings by kind, superseded fetches aborted ----------------------

# a long noisy execution's findings, written over the input-bound run's own summary: 40 episodes
# over five kinds, ordered as the API orders them (severity, then GPU-hours)
NOISY_KINDS = {"input_bound": 24, "idle_held": 8, "power_throttle": 5, "no_data": 2, "oom_suspected": 1}


def noisy_summary(body: dict[str, Any]) -> dict[str, Any]:
    from gpulens.domain.timeparse import parse_timestamp_ms

    start = parse_timestamp_ms(body["timeRange"]["start"])
    span = parse_timestamp_ms(body["timeRange"]["end"]) - start
    price = body["cost"]["gpuHourPrice"] if body["cost"] else None
    total = sum(NOISY_KINDS.values())
    findings = []
    for i, (kind, n) in enumerate(NOISY_KINDS.items()):
        for k in range(n):
            at = start + span * (len(findings) + 0.1) // total
            minutes = 1 + (k * 7 + i * 3) % 9 / 4  # under span / total: no two overlap
            gpus: list[str] = [] if k % 2 else ["1"]
            hours = minutes / 60 * (1 if gpus else body["gpuCount"])
            findings.append(
                {
                    "kind": kind,
                    "severity": c.INSIGHT_SEVERITY[kind],
                    "start": format_rfc3339_ms(int(at)),
                    "end": format_rfc3339_ms(int(at + minutes * 60_000)),
                    "gpus": gpus,
                    "message": f"Episode {k} of {kind}: something was wasted here; try something else.",
                    "evidence": {},
                    "impact": {"gpuHours": hours, "cost": None if price is None else hours * price},
                }
            )
    findings.sort(key=lambda f: (c.SEVERITY_RANK[f["severity"]], -f["impact"]["gpuHours"]))
    return {**body, "findings": findings}


def open_execution(pg: Any, site: Site, execution_id: str) -> None:
    pg.goto(f"{site.url}/ui/executions/{execution_id}")
    wait_for_attr(pg, "body[data-charts=drawn]")
    wait_for_attr(pg, "body[data-summary=loaded]")


def test_execution_page_opens_with_the_headline(page: tuple[Any, Recorder], site: Site) -> None:
    """The input-bound run: its one finding is the headline, with its duration, GPUs and impact."""
    pg, rec = page
    sign_in(pg, site)
    wait_for_attr(pg, "body[data-summaries=loaded]")
    ib = site.dataset.scenario.execution("input-bound").execution_id
    body = httpx.get(
        f"{site.url}/api/v2/external/execution/{ib}/summary", headers={"Authorization": f"Bearer {site.key}"}
    ).json()
    open_execution(pg, site, ib)
    items = pg.locator("#headline li[data-kind]")
    assert items.count() == 1
    (f,) = body["findings"]
    text = items.first.locator(".what").inner_text()
    assert re.fullmatch(
        rf"\d+ (h|min)( \d+ min)? input bound on both GPUs: "
        rf"{f['impact']['gpuHours']:.2f} GPU-hours, {f['impact']['cost']:.2f} USD",
        text,
    ), text
    # the headline comes before the charts, the charts before the findings
    order = pg.eval_on_selector_all(
        "#headline, #charts, #findings", "els => els.map(e => e.getBoundingClientRect().top)"
    )
    assert order == sorted(order)
    # the receipt in GPU time and money
    receipt = pg.locator("#cost").inner_text()
    assert "GPU time" in receipt and "input-bound" in receipt and "USD" in receipt
    assert rec.errors == []


def test_findings_are_grouped_by_kind_under_a_headline_by_impact(
    page: tuple[Any, Recorder], site: Site, artifacts: Path
) -> None:
    pg, rec = page
    sign_in(pg, site)
    wait_for_attr(pg, "body[data-summaries=loaded]")
    ib = site.dataset.scenario.execution("input-bound").execution_id
    served: list[dict[str, Any]] = []

    def noisy(route: Any) -> None:
        body = noisy_summary(route.fetch().json())
        served.append(body)
        route.fulfill(json=body)

    pg.route(f"**/api/v2/external/execution/{ib}/summary", noisy)
    open_execution(pg, site, ib)
    (body,) = served
    findings = body["findings"]
    # the headline: the three biggest findings by GPU-hours, biggest first
    items = pg.locator("#headline li[data-kind]")
    assert items.count() == 3
    hours = [
        float(x)
        for x in pg.eval_on_selector_all("#headline li[data-kind]", "els => els.map(e => e.dataset.gpuHours)")
    ]
    biggest = sorted((f["impact"]["gpuHours"] for f in findings), reverse=True)[:3]
    assert hours == pytest.approx(biggest)
    for i in range(3):
        assert re.search(r"GPU-hours, [\d.]+ USD$", items.nth(i).locator(".what").inner_text())
    # one group per kind, in the order the API first lists each kind, with its count and GPU-hours
    kinds = list(dict.fromkeys(f["kind"] for f in findings))
    assert (
        pg.eval_on_selector_all("#findings [data-kind-group]", "els => els.map(e => e.dataset.kindGroup)")
        == kinds
    )
    for kind, n in NOISY_KINDS.items():
        group = pg.locator(f'#findings [data-kind-group="{kind}"]')
        head = group.locator("h3").inner_text()
        assert f"{n} finding" in head and "GPU-hours" in head, head
        mine = [f for f in findings if f["kind"] == kind]
        # its findings in the API's order, each with its Zoom to
        starts = group.locator("li[data-kind]")
        assert starts.count() == n
        assert group.locator("li[data-kind] button.zoom").count() == n
        visible = group.locator("li[data-kind]:visible")
        if n > 4:
            assert visible.count() == 3
            toggle = group.locator("button.more")
            assert toggle.inner_text() == f"Show all {n}"
            toggle.click()
            assert visible.count() == n
            toggle.click()
            assert visible.count() == 3
        else:
            assert visible.count() == n and group.locator("button.more").count() == 0
        assert mine[0]["message"] in group.locator("li[data-kind]").first.inner_text()
    # the page stays short: 40 findings, and the findings section is a few groups tall
    height = pg.evaluate("document.querySelector('#findings').getBoundingClientRect().height")
    assert height < 1500, height
    shot = artifacts / "execution-noisy.png"
    pg.screenshot(path=str(shot), full_page=True)
    print(f"screenshot: {shot}")
    assert rec.errors == []


def test_a_superseded_zoom_is_aborted(page: tuple[Any, Recorder], site: Site) -> None:
    """Zoom to a finding, then reset before its answer: the first request is aborted, and the charts
    show the full run (the latest window), never the zoom."""
    pg, rec = page
    sign_in(pg, site)
    wait_for_attr(pg, "body[data-summaries=loaded]")
    ib = site.dataset.scenario.execution("input-bound").execution_id
    open_execution(pg, site, ib)
    full_window = pg.get_attribute("#charts", "data-window")
    held: list[Any] = []
    failed: list[tuple[str, str | None]] = []
    pg.on("requestfailed", lambda r: failed.append((r.url, r.failure)))
    pg.route("**/metrics?*", lambda route: held.append(route))  # held, unanswered, until let go

    def wait_until(what: Any) -> None:
        deadline = time.monotonic() + 30
        while not what() and time.monotonic() < deadline:
            pg.wait_for_timeout(50)
        assert what()

    pg.locator("#findings li[data-kind] button.zoom").first.click()
    wait_until(lambda: len(held) == 1)
    zoom_url = held[0].request.url
    pg.locator("#reset").click()
    wait_until(lambda: len(held) == 2)
    # the zoom's request was cancelled by the page as soon as the reset asked for another window
    wait_until(lambda: any(url == zoom_url for url, _ in failed))
    assert dict(failed)[zoom_url] == "net::ERR_ABORTED"
    held[1].continue_()
    wait_for_attr(pg, "#charts[aria-busy=false]")
    assert pg.get_attribute("#charts", "data-window") == full_window
    assert pg.locator("#chart-error").inner_text() == ""  # an aborted fetch is no error
    assert rec.errors == []
