"""The dashboard's pages and assets, without a browser: headers, no outside reference, no innerHTML.

The app is built over a backend that is never asked (the pages hold no data).
"""

from __future__ import annotations

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

PAGES = [
    "/",
    "/ui/executions/0b7ef3b6-7a4e-4a8e-9d6f-2f1f1d2c3b4a",
    "/ui/workloads/some-workload",
    "/ui/alerts",
    "/ui/usage",
]
UI = Path(routes.__file__).parent
OWN_SCRIPTS = sorted((UI / "static").glob("*.js"))


@pytest.fixture
def client(registry: Registry, tmp_path: Path) -> Iterator[Client]:
    store = SampleStore.from_path(tmp_path / "samples.db")
    settings = Settings(data_dir=tmp_path, prometheus_url=None, database_url="sqlite://")
    try:
        yield Client(create_app(settings, registry=registry, backend=EmbeddedBackend(store)))
    finally:
        store.close()


@pytest.mark.parametrize("path", PAGES)
def test_pages_are_html_with_a_strict_csp(client: Client, path: str) -> None:
    r = client.get(path)
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/html")
    csp = r.headers["content-security-policy"]
    assert "default-src 'self'" in csp
    assert "script-src 'self'" in csp and "unsafe-inline" not in csp and "unsafe-eval" not in csp
    assert r.headers["x-content-type-options"] == "nosniff"
    assert "set-cookie" not in r.headers
    assert "<script>" not in r.text  # no inline script: every script is a file of this origin


def test_the_id_in_the_path_is_not_echoed(client: Client) -> None:
    r = client.get("/ui/executions/%3Cimg%20src%3Dx%20onerror%3Dalert(1)%3E")
    assert r.status_code == 200
    assert "alert(1)" not in r.text


def test_assets_are_served_with_their_types(client: Client) -> None:
    for path, kind in [
        ("/ui/static/common.js", "javascript"),
        ("/ui/static/execution.js", "javascript"),
        ("/ui/static/alerts.js", "javascript"),
        ("/ui/static/usage.js", "javascript"),
        ("/ui/static/style.css", "text/css"),
        ("/ui/static/vendor/uPlot.iife.min.js", "javascript"),
        ("/ui/static/vendor/uPlot.min.css", "text/css"),
    ]:
        r = client.get(path)
        assert r.status_code == 200, path
        assert kind in r.headers["content-type"], (path, r.headers["content-type"])
        assert r.headers["x-content-type-options"] == "nosniff"
    assert client.get("/ui/static/nope.js").status_code == 404
    assert client.get("/ui/static/../routes.py").status_code == 404


def test_pages_are_not_in_the_api_description(client: Client) -> None:
    paths = client.get("/openapi.json").json()["paths"]
    assert not [p for p in paths if p == "/" or p.startswith("/ui")]


def test_every_referenced_asset_exists(client: Client) -> None:
    for page in sorted((UI / "pages").glob("*.html")):
        refs = re.findall(r'(?:src|href)="([^"]+)"', page.read_text())
        assert refs, page
        for ref in refs:
            if ref.startswith("data:"):
                continue
            assert ref.startswith("/ui/static/"), (page.name, ref)  # same origin, no CDN
            assert client.get(ref).status_code == 200, ref
    for script in OWN_SCRIPTS:
        for ref in re.findall(r'from "\./([^"]+)"', script.read_text()):
            assert (UI / "static" / ref).is_file(), (script.name, ref)


def test_no_outside_url_and_no_inner_html() -> None:
    """Our own files name no other host and never parse data as HTML."""
    files = [*OWN_SCRIPTS, UI / "static" / "style.css", *(UI / "pages").glob("*.html")]
    for f in files:
        text = f.read_text()
        assert not re.search(r"https?://", text), f.name
        assert "@import" not in text and "url(" not in text, f.name
        for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval("):
            assert sink not in text, (f.name, sink)
    vendor = (UI / "static" / "vendor" / "uPlot.iife.min.js").read_text()
    # the library's only URL is its own banner comment; it loads nothing
    assert re.findall(r"https?://[^\s)]+", vendor) == ["https://github.com/leeoniya/uPlot"]
    assert "fetch(" not in vendor and "XMLHttpRequest" not in vendor
    for name in ("uPlot.iife.min.js", "uPlot.min.css", "LICENSE", "README.md"):
        assert (UI / "static" / "vendor" / name).is_file()
