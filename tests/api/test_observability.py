"""gpulens' own telemetry: GET /metrics, request ids, JSON access lines, the collector in /readyz."""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import httpx
import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpulens.api.app import create_app
from gpulens.api.observability import REQUEST_ID, JsonFormatter, PassClock, served_methods
from gpulens.backends.prometheus import PrometheusBackend
from gpulens.config import Settings
from gpulens.storage.registry import Registry
from tests.api.conftest import Client
from tests.api.lyceum.conftest import NOW, PROM, FakeProm, standard_keys


def samples(client: Client, name: str) -> list[tuple[dict[str, str], float]]:
    r = client.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    return [
        (dict(s.labels), s.value)
        for family in text_string_to_metric_families(r.text)
        for s in family.samples
        if s.name == name
    ]


class FakeCollector:
    def __init__(self, interval_s: float) -> None:
        self.sinks: list[Any] = []
        self.interval_s = interval_s
        self.passes = 0


@pytest.fixture
def build(
    make_registry: Callable[[], Registry], tmp_path: Path
) -> Callable[..., tuple[Client, FakeProm, Registry]]:
    def make(collector: FakeCollector | None = None, **settings: Any) -> tuple[Client, FakeProm, Registry]:
        registry = make_registry()
        prom = FakeProm()
        backend = PrometheusBackend(PROM, httpx.Client(transport=httpx.MockTransport(prom.handle)))
        conf = Settings(data_dir=tmp_path, prometheus_url=PROM, **settings)
        app = create_app(conf, registry=registry, backend=backend, clock=lambda: NOW, collector=collector)
        return Client(app), prom, registry

    return make


def register(client: Client, admin: str) -> str:
    body = {
        "org": "acme",
        "hostname": "gpu-node-1",
        "status": "completed",
        "start_time": "2026-01-01T10:00:00Z",
        "end_time": "2026-01-01T11:00:00Z",
    }
    r = client.post("/api/v2/admin/executions", json=body, headers={"Authorization": f"Bearer {admin}"})
    assert r.status_code in (200, 201), r.text
    return str(r.json()["execution_id"])


def test_request_durations_by_route_template_never_a_raw_id(build: Callable[..., Any]) -> None:
    client, _, registry = build()
    admin, acme, _ = standard_keys(registry)
    eid = register(client, admin)
    h = {"Authorization": f"Bearer {acme}"}
    assert client.get(f"/api/v2/external/execution/{eid}/metrics", headers=h).status_code == 200
    assert client.get("/api/v2/external/execution/nope/metrics", headers=h).status_code == 404
    assert client.get(f"/no/such/{eid}").status_code == 404
    counts = {
        (s["route"], s["method"], s["status"]): v
        for s, v in samples(client, "gpulens_http_request_duration_seconds_count")
    }
    template = "/api/v2/external/execution/{execution_id}/metrics"
    assert counts[(template, "GET", "200")] == 1 and counts[(template, "GET", "404")] == 1
    assert counts[("/api/v2/admin/executions", "POST", "201")] == 1
    assert counts[("unmatched", "GET", "404")] == 1
    assert not any(eid in route or "nope" in route for route, _, _ in counts)


def test_backend_calls_timed_and_errors_counted_by_kind(build: Callable[..., Any]) -> None:
    client, prom, registry = build()
    admin, acme, _ = standard_keys(registry)
    eid = register(client, admin)
    h = {"Authorization": f"Bearer {acme}"}
    assert client.get(f"/api/v2/external/execution/{eid}/metrics", headers=h).status_code == 200

    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    prom.fail = refuse
    assert client.get(f"/api/v2/external/execution/{eid}/metrics?step=7s", headers=h).status_code == 503
    counts = {
        (s["backend"], s["outcome"]): v
        for s, v in samples(client, "gpulens_backend_query_duration_seconds_count")
    }
    assert counts[("prometheus", "ok")] >= 12 and counts[("prometheus", "unavailable")] >= 1
    errors = {(s["backend"], s["kind"]): v for s, v in samples(client, "gpulens_backend_errors_total")}
    assert errors[("prometheus", "unavailable")] == counts[("prometheus", "unavailable")]
    assert "prom.test" not in client.get("/metrics").text


def test_readyz_fails_when_the_collector_missed_three_intervals(build: Callable[..., Any]) -> None:
    collector = FakeCollector(interval_s=2)
    client, _, _ = build(collector)
    assert client.get("/readyz").status_code == 503  # no pass yet
    clock = collector.sinks[-1]
    assert isinstance(clock, PassClock)
    clock.write([])
    r = client.get("/readyz")
    assert r.status_code == 200 and r.json()["checks"]["collector"] == "ok"
    assert samples(client, "gpulens_collector_last_pass_timestamp_seconds")[0][1] == pytest.approx(
        time.time(), abs=5
    )
    clock.last = time.time() - 5.0  # 2.5 intervals: still ready
    assert client.get("/readyz").status_code == 200
    clock.last = time.time() - 7.0  # 3.5 intervals
    r = client.get("/readyz")
    assert r.status_code == 503 and "collector: error: no completed pass for 7 s" in r.json()["detail"]
    assert build()[0].get("/readyz").json()["checks"].keys() == {"registry", "backend"}  # no collector
    started = FakeCollector(interval_s=2)
    started.passes = 1  # serve starts the collector (one pass) before it builds the app
    assert build(started)[0].get("/readyz").status_code == 200


def test_request_id_taken_or_made_and_echoed(build: Callable[..., Any]) -> None:
    client, _, _ = build()
    assert (
        client.get("/healthz", headers={"X-Request-ID": "abc-123.x"}).headers["x-request-id"] == "abc-123.x"
    )
    made = client.get("/healthz").headers["x-request-id"]
    assert re.fullmatch(r"[0-9a-f]{32}", made)
    odd = client.get("/healthz", headers={"X-Request-ID": 'a b"c' + "x" * 200}).headers["x-request-id"]
    assert re.fullmatch(r"[0-9a-f]{32}", odd)
    assert client.get("/nope", headers={"X-Request-ID": "r1"}).headers["x-request-id"] == "r1"


def test_json_access_lines_carry_id_route_status_org_never_a_key(
    build: Callable[..., Any], caplog: pytest.LogCaptureFixture
) -> None:
    client, _, registry = build(log_format="json")
    admin, acme, _ = standard_keys(registry)
    eid = register(client, admin)
    caplog.set_level(logging.INFO, logger="gpulens.access")
    caplog.clear()
    r = client.get(
        f"/api/v2/external/execution/{eid}/metrics",
        headers={"Authorization": f"Bearer {acme}", "X-Request-ID": "req-42"},
    )
    assert r.status_code == 200
    (record,) = [rec for rec in caplog.records if rec.name == "gpulens.access"]
    line = orjson.loads(JsonFormatter().format(record))
    assert line["msg"] == "request" and line["level"] == "info"
    assert line["route"] == "/api/v2/external/execution/{execution_id}/metrics"
    assert line["status"] == 200 and line["method"] == "GET" and line["org"] == "acme"
    assert line["duration_ms"] > 0
    text = JsonFormatter().format(record)
    assert acme not in text and acme[:12] not in text and eid not in text


def test_json_lines_name_the_request_they_belong_to() -> None:
    record = logging.LogRecord("gpulens.x", logging.WARNING, __file__, 1, "backend %s failed", ("b",), None)
    token = REQUEST_ID.set("rid-7")
    try:
        line = orjson.loads(JsonFormatter().format(record))
    finally:
        REQUEST_ID.reset(token)
    assert line["request_id"] == "rid-7" and line["msg"] == "backend b failed" and line["level"] == "warning"
    assert "request_id" not in orjson.loads(JsonFormatter().format(record))


def test_cache_archive_and_store_figures(build: Callable[..., Any], tmp_path: Path) -> None:
    client, _, registry = build(database_url=f"sqlite:///{tmp_path / 'gpulens.db'}")
    (tmp_path / "gpulens.db").write_bytes(b"")  # the registry's file (this test's registry is another)
    admin, acme, _ = standard_keys(registry)
    eid = register(client, admin)
    h = {"Authorization": f"Bearer {acme}"}
    for _ in range(2):  # the second read finds the host's layout and node instances cached
        assert client.get(f"/api/v2/external/execution/{eid}/metrics", headers=h).status_code == 200
    lookups = {(s["cache"], s["result"]): v for s, v in samples(client, "gpulens_cache_lookups_total")}
    assert lookups[("host_layouts", "miss")] >= 1 and lookups[("host_layouts", "hit")] >= 1
    assert {"host_layouts", "node_instances", "pod_layouts", "archived_answers"} <= {c for c, _ in lookups}
    entries = {s["cache"]: v for s, v in samples(client, "gpulens_cache_entries")}
    assert entries["host_layouts"] >= 1
    objects = {s["kind"]: v for s, v in samples(client, "gpulens_archive_objects")}
    assert objects == {"execution": 0.0, "pod": 0.0}
    assert samples(client, "gpulens_archive_bytes") == [({}, 0.0)]
    sizes = {s["store"]: v for s, v in samples(client, "gpulens_store_bytes")}
    assert set(sizes) == {"registry"}  # a Prometheus backend: no embedded sample store
    served = {s["source"]: v for s, v in samples(client, "gpulens_summaries_served_total")}
    assert served == {"stored": 0.0, "computed": 0.0}
    assert client.get(f"/api/v2/external/execution/{eid}/summary", headers=h).status_code == 200
    served = {s["source"]: v for s, v in samples(client, "gpulens_summaries_served_total")}
    assert served["stored"] + served["computed"] == 1.0
    for gauge in ("computing", "waiting", "queued"):
        assert samples(client, f"gpulens_summaries_{gauge}") == [({}, 0.0)]


def test_archive_passes_counted(build: Callable[..., Any]) -> None:
    from gpulens.service.archive import PassReport

    client, _, _ = build()
    telemetry = client.app.state.telemetry
    telemetry.archive_pass(PassReport(executions=3, pods=1, failed=[("x", "why")]))
    telemetry.archive_pass(None)
    passes = {s["outcome"]: v for s, v in samples(client, "gpulens_archive_passes_total")}
    assert passes == {"ok": 1.0, "failed": 1.0}
    built = {s["kind"]: v for s, v in samples(client, "gpulens_archive_built_total")}
    assert built == {"execution": 3.0, "pod": 1.0}
    assert samples(client, "gpulens_archive_failures_total") == [({}, 1.0)]
    assert samples(client, "gpulens_archive_last_pass_timestamp_seconds")[0][1] > 1.7e9


# every method llhttp (Node's HTTP parser, and so most proxies' view of HTTP) knows
# fmt: off
LLHTTP_METHODS = (
    "DELETE", "GET", "HEAD", "POST", "PUT", "CONNECT", "OPTIONS", "TRACE", "COPY", "LOCK", "MKCOL", "MOVE",
    "PROPFIND", "PROPPATCH", "SEARCH", "UNLOCK", "BIND", "REBIND", "UNBIND", "ACL", "REPORT", "MKACTIVITY",
    "CHECKOUT", "MERGE", "M-SEARCH", "NOTIFY", "SUBSCRIBE", "UNSUBSCRIBE", "PATCH", "PURGE", "MKCALENDAR",
    "LINK", "UNLINK", "SOURCE", "PRI", "DESCRIBE", "ANNOUNCE", "SETUP", "PLAY", "PAUSE", "TEARDOWN",
    "GET_PARAMETER", "SET_PARAMETER", "REDIRECT", "RECORD", "FLUSH", "QUERY",
)
# fmt: on
# the request-duration series (buckets, sum, count, created) after every method on every route: 3,451
# on 39 paths, 450 KB of /metrics (issue 21: 14,404 series and a 1.85 MB /metrics, the method label
# taking any method the parser knew; this test's requests made 27,149 series and 3.55 MB)
MAX_HTTP_SERIES = 6_000
MAX_METRICS_BYTES = 800_000


def test_every_method_on_every_route_keeps_the_series_bounded(build: Callable[..., Any]) -> None:
    client, _, _ = build()
    app = client.app
    documented = client.get("/openapi.json").json()["paths"]
    pages = ["/", "/ui/executions/{id}", "/ui/static/style.css", "/metrics", "/docs", "/no/such/route"]
    some_id = "0b7ef3b6-7a4e-4a8e-9d6f-2f1f1d2c3b4a"
    paths = sorted({re.sub(r"\{[^}]+\}", some_id, p) for p in [*documented, *pages]})
    assert len(LLHTTP_METHODS) == 47 and len(paths) >= 27

    async def send_all() -> None:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as http:
            for path in paths:
                for method in LLHTTP_METHODS:
                    await http.request(method, path)

    anyio.run(send_all)
    body = client.get("/metrics").text
    series = [
        s
        for f in text_string_to_metric_families(body)
        if f.name.startswith("gpulens_http_")
        for s in f.samples
    ]
    label_sets = samples(client, "gpulens_http_request_duration_seconds_count")
    methods = {s["method"] for s, _ in label_sets}
    assert methods <= served_methods(app) | {"other"}, methods
    assert served_methods(app) <= {"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE"}
    assert "other" in methods and "PROPFIND" not in methods
    assert sum(v for _, v in label_sets) >= len(paths) * len(LLHTTP_METHODS)  # every request counted
    assert len(series) < MAX_HTTP_SERIES, len(series)
    assert len(body.encode()) < MAX_METRICS_BYTES, len(body.encode())
