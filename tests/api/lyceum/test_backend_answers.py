"""What a backend answers reaches a client only checked and bounded: forged or malformed sample
values, oversized and trickling answers are errors (502, 504), and no error names the backend's address."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import orjson
import pytest

from gpulens.api.app import create_app
from gpulens.config import Settings
from gpulens.storage.registry import Registry
from tests.api.conftest import Client
from tests.api.lyceum.conftest import NOW, MetricsApi, standard_keys
from tests.backends.test_prometheus_limits import trickle_server

# every test here runs on the compiled grid path and on the Python one (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("grid_path")


@pytest.mark.parametrize(
    "value",
    ['1},{"timestamp":"FORGED","value":666', "abc", "1e999", "", "97.5 ", "1,2"],
    ids=repr,
)
def test_a_forged_or_malformed_value_is_a_502_never_a_point(mapi: MetricsApi, value: str) -> None:
    eid = mapi.register()
    mapi.prom.value = lambda t: value if int(t) % 600 == 0 else "42.5"
    r = mapi.metrics(eid)
    assert r.status_code == 502, r.text[:300]
    assert "FORGED" not in r.text and "666" not in r.text
    assert (
        r.json()["detail"]
        == "the metrics backend answered a range query with malformed labels or sample values"
    )


def test_a_number_where_prometheus_writes_text_is_a_502(mapi: MetricsApi) -> None:
    eid = mapi.register()
    mapi.prom.value = lambda t: 42.5  # type: ignore[assignment,return-value]
    assert mapi.metrics(eid).status_code == 502


def test_specials_and_decimals_still_read(mapi: MetricsApi) -> None:
    eid = mapi.register()
    cycle = ["NaN", "+Inf", "-Inf", "1e+06", "-0.25", "97"]
    mapi.prom.value = lambda t: cycle[int(t) // 60 % len(cycle)]
    r = mapi.metrics(eid, step="60")
    assert r.status_code == 200
    values = {p["value"] for p in r.json()["gpuUtilizationPercent"]}
    assert values == {1e6, -0.25, 97}  # NaN and infinities dropped, as before


def test_backend_failures_never_show_its_address(make_api: Callable[..., MetricsApi]) -> None:
    api = make_api()
    eid = api.register()

    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("[Errno -2] cannot resolve prom.test:9090", request=request)

    def echo(request: httpx.Request) -> httpx.Response:  # a proxy quoting its upstream
        body = {"status": "error", "errorType": "internal", "error": "dial http://prom.test:9090: refused"}
        return httpx.Response(422, content=orjson.dumps(body))

    for fail, status in ((refuse, 503), (echo, 502)):
        api.prom.fail = fail
        for r in (api.metrics(eid), api.client.get("/readyz")):
            assert r.status_code in (status, 503), r.text
            assert "prom.test" not in r.text and "9090" not in r.text, r.text
            assert "the metrics backend" in r.text


@pytest.fixture
def app_on(make_registry: Callable[[], Registry], tmp_path: Path) -> Callable[..., Client]:
    def build(url: str, **settings: object) -> Client:
        conf = Settings(data_dir=tmp_path, prometheus_url=url, **settings)  # type: ignore[arg-type]
        return Client(create_app(conf, registry=make_registry()))

    return build


@pytest.fixture
def huge_answer() -> Iterator[str]:
    values = [[i, "1.5"] for i in range(10_000)]
    body = orjson.dumps(
        {"status": "success", "data": {"resultType": "scalar", "result": [0, "1"]}, "x": values}
    )
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
    chunked = b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
    yield from trickle_server(head + chunked, b"", 0)


def test_max_backend_answer_bytes_is_a_setting(app_on: Callable[..., Client], huge_answer: str) -> None:
    assert app_on(huge_answer).get("/readyz").status_code == 200  # ~150 KB: under the default cap
    r = app_on(huge_answer, max_backend_answer_bytes=4096).get("/readyz")
    assert r.status_code == 503
    assert "answered more than 4096 bytes" in r.json()["detail"] and "127.0.0.1" not in r.text


@pytest.fixture
def trickling() -> Iterator[str]:
    body = orjson.dumps({"status": "success", "data": {"resultType": "scalar", "result": [0, "1"]}})
    head = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body)
    yield from trickle_server(head, body, 0.2)


def test_backend_timeout_is_a_deadline_for_the_whole_request(
    app_on: Callable[..., Client], trickling: str
) -> None:
    started = time.monotonic()
    r = app_on(trickling, backend_timeout=1).get("/readyz")
    assert r.status_code == 503 and "did not answer in time" in r.json()["detail"]
    assert time.monotonic() - started < 2.5  # the trickle alone would take ~14 s


def test_a_trickling_backend_is_a_504_at_the_timeout_on_a_metrics_read(
    make_registry: Callable[[], Registry], tmp_path: Path, trickling: str
) -> None:
    registry = make_registry()
    admin, acme, _ = standard_keys(registry)
    conf = Settings(data_dir=tmp_path, prometheus_url=trickling, backend_timeout=1)
    client = Client(create_app(conf, registry=registry, clock=lambda: NOW))
    body = {"org": "acme", "hostname": "gpu-node-1", "status": "completed"}
    body |= {"start_time": "2026-01-01T10:00:00Z", "end_time": "2026-01-01T11:00:00Z"}
    r = client.post("/api/v2/admin/executions", json=body, headers={"Authorization": f"Bearer {admin}"})
    eid = r.json()["execution_id"]
    started = time.monotonic()
    r = client.get(f"/api/v2/external/execution/{eid}/metrics", headers={"Authorization": f"Bearer {acme}"})
    assert r.status_code == 504 and r.json()["detail"].startswith(
        "the metrics backend did not answer in time"
    )
    assert time.monotonic() - started < 2.5  # each request's trickle would take ~14 s
