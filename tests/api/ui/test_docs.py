"""`/docs` without a browser (issue 21: no third-party code beside the key): a fixed page under the
dashboard's Content-Security-Policy, Swagger UI from the package (pinned, checksums in the vendor
README), no inline script; `/redoc` leads there; JSON answers send `X-Content-Type-Options: nosniff`.
tests/integration/test_api_docs.py opens the page in Chromium."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpulens.api.app import create_app
from gpulens.api.ui import routes
from gpulens.backends.embedded import EmbeddedBackend
from gpulens.config import Settings
from gpulens.storage.registry import Registry
from gpulens.storage.samples import SampleStore
from tests.api.conftest import Client

VENDOR = Path(routes.__file__).parent / "static" / "vendor"


@pytest.fixture
def client(registry: Registry, tmp_path: Path) -> Iterator[Client]:
    store = SampleStore.from_path(tmp_path / "samples.db")
    settings = Settings(data_dir=tmp_path, prometheus_url=None, database_url="sqlite://")
    try:
        yield Client(create_app(settings, registry=registry, backend=EmbeddedBackend(store)))
    finally:
        store.close()


def test_docs_is_a_fixed_page_under_the_dashboards_csp(client: Client) -> None:
    r = client.get("/docs")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    for name, value in routes.SECURITY_HEADERS.items():
        assert r.headers[name] == value, name
    assert "<script>" not in r.text and "<style" not in r.text and " style=" not in r.text
    refs = re.findall(r'(?:src|href)="([^"]+)"', r.text)
    assert "/ui/static/vendor/swagger-ui/swagger-ui-bundle.js" in refs and "/ui/static/docs.js" in refs
    for ref in refs:
        if ref.startswith("data:"):
            continue
        assert ref.startswith("/ui/static/"), ref  # this origin, no CDN
        asset = client.get(ref)
        assert asset.status_code == 200, ref
        assert asset.headers["content-security-policy"] == routes.CSP
        assert asset.headers["x-content-type-options"] == "nosniff"


def test_redoc_leads_to_docs_and_fastapis_cdn_pages_are_gone(client: Client) -> None:
    r = client.get("/redoc")
    assert r.status_code == 307 and r.headers["location"] == "/docs"
    assert r.headers["content-security-policy"] == routes.CSP
    assert client.get("/docs/oauth2-redirect").status_code == 404
    for path in ("/docs", "/redoc"):
        assert "cdn.jsdelivr.net" not in client.get(path, follow_redirects=True).text
    assert "/docs" not in client.get("/openapi.json").json()["paths"]


def test_the_vendored_files_are_the_pinned_ones() -> None:
    """The vendor README's checksums are those of the files served (a changed file is noticed)."""
    readme = (VENDOR / "README.md").read_text()
    table = dict(re.findall(r"^\| (\S+) \| ([0-9a-f]{64}) \|$", readme, re.MULTILINE))
    assert set(table) >= {"swagger-ui/swagger-ui-bundle.js", "swagger-ui/swagger-ui.css", "uPlot.iife.min.js"}
    for name, digest in table.items():
        assert hashlib.sha256((VENDOR / name).read_bytes()).hexdigest() == digest, name
    for name in ("LICENSE", "NOTICE", "swagger-ui-bundle.js.LICENSE.txt"):
        assert (VENDOR / "swagger-ui" / name).is_file()


@pytest.mark.parametrize(
    ("path", "status"),
    [
        ("/healthz", 200),
        ("/openapi.json", 200),
        ("/api/v2/external/execution-summaries", 401),
        ("/api/v2/external/execution/x/metrics?start=nonsense", 401),
        ("/api/v1/workloads/not-a-uuid/pods/x/metrics", 401),
        ("/no/such/route", 404),
    ],
)
def test_json_answers_are_never_sniffed(client: Client, path: str, status: int) -> None:
    r = client.get(path)
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/json")
    assert r.headers["x-content-type-options"] == "nosniff"
