"""`/docs` in headless Chromium (Debian's `chromium`, driven by Playwright): Swagger UI, vendored, under
the dashboard's Content-Security-Policy, lists every operation of /openapi.json, runs one ("Try it
out" on /healthz), logs no console error and no CSP violation, and asks nothing of any host but this
one (issue 21: FastAPI's pages loaded unpinned scripts from a CDN on the origin holding the key).

Under CI=true a missing chromium or playwright fails instead of skipping (tests/integration/conftest.py).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

from gpulens.api.app import create_app
from gpulens.api.ui import routes
from gpulens.backends.embedded import EmbeddedBackend
from gpulens.config import Settings
from gpulens.storage.samples import SampleStore
from tests.conftest import sqlite_registry
from tests.integration.conftest import serve_app

pytestmark = pytest.mark.integration

CSP_WATCH = """
window.__csp = [];
document.addEventListener('securitypolicyviolation',
    e => window.__csp.push(e.violatedDirective + ' ' + e.blockedURI));
"""


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    tmp = Path(tmp_path_factory.mktemp("api-docs"))
    registry = sqlite_registry(tmp / "registry.db")
    store = SampleStore.from_path(tmp / "samples.db")
    settings = Settings(data_dir=tmp, prometheus_url=None, database_url=registry.url)
    try:
        with serve_app(create_app(settings, registry=registry, backend=EmbeddedBackend(store))) as url:
            yield url
    finally:
        store.close()
        registry.dispose()


def test_docs_render_with_no_console_error_and_no_outside_request(browser: Any, site: str) -> None:
    operations = sum(len(item) for item in httpx.get(site + "/openapi.json").json()["paths"].values())
    context = browser.new_context(viewport={"width": 1400, "height": 1000}, service_workers="block")
    requests: list[str] = []
    errors: list[str] = []
    try:
        pg = context.new_page()
        pg.add_init_script(CSP_WATCH)
        pg.on("request", lambda r: requests.append(r.url))
        pg.on("console", lambda m: errors.append(m.text) if m.type in ("error", "warning") else None)
        pg.on("pageerror", lambda exc: errors.append(f"pageerror: {exc}"))
        response = pg.goto(site + "/docs")
        assert response is not None and response.status == 200
        assert response.headers["content-security-policy"] == routes.CSP
        pg.wait_for_function(f"document.querySelectorAll('.opblock').length >= {operations}", timeout=30_000)
        assert pg.locator(".opblock").count() == operations
        assert "gpulens" in pg.locator(".info .title").inner_text()

        # run one operation from the page: the request goes to this origin, the answer is shown
        health = pg.locator(".opblock", has=pg.locator(".opblock-summary-path", has_text="/healthz")).first
        health.locator(".opblock-summary").click()
        health.locator("button.try-out__btn").click()
        health.locator("button.execute").click()
        status = health.locator(".live-responses-table tbody .response-col_status").first
        status.wait_for(timeout=15_000)
        assert status.inner_text().strip().startswith("200")

        where = os.environ.get("GPULENS_TEST_ARTIFACTS")
        if where:
            (Path(where) / "dashboard").mkdir(parents=True, exist_ok=True)
            pg.screenshot(path=str(Path(where) / "dashboard" / "api-docs.png"), full_page=False)
        violations = pg.evaluate("window.__csp")
    finally:
        context.close()
    assert violations == [], violations
    assert errors == [], errors
    foreign = [u for u in requests if urlsplit(u).scheme not in ("data", "blob", "about")]
    foreign = [u for u in foreign if urlsplit(u).hostname != "127.0.0.1"]
    assert foreign == [], foreign
    assert any(u.endswith("/openapi.json") for u in requests)
    assert any(u.endswith("/healthz") for u in requests)
