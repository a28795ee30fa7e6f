"""GET /api/v2/external/execution/{id}/metrics: contract statements 4.A 1-30 over a scripted backend."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

import httpx
import pytest

from gpulens.domain import catalog as c
from tests.api.lyceum.conftest import MetricsApi


def ts(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def test_defaults_whole_execution_at_15s(mapi: MetricsApi) -> None:
    eid = mapi.register()
    r = mapi.metrics(eid)
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    body = r.json()
    assert list(body) == ["executionId", "hostname", "timeRange", *c.LYCEUM_KEYS]
    assert body["executionId"] == eid and body["hostname"] == "gpu-node-1"
    assert body["timeRange"] == {"start": "2026-01-01T10:00:00Z", "end": "2026-01-01T11:00:00Z"}
    for key in c.LYCEUM_KEYS:
        points = body[key]
        assert len(points) == 241  # 1 h at 15 s, both ends included
        assert all(set(p) == {"timestamp", "value"} for p in points)
        times = [ts(p["timestamp"]) for p in points]
        assert times == sorted(set(times))
        assert all((t - times[0]) % 15 == 0 for t in times)
        assert all(isinstance(p["value"], int | float) for p in points)
    # 12 queries, all in hand before the first byte: one body with its length, not chunked
    assert r.headers["content-length"] == str(len(r.content)) and "transfer-encoding" not in r.headers
    # the defaults are the whole execution at 15 s: the same as asking for them explicitly
    explicit = mapi.metrics(eid, start="2026-01-01T10:00:00Z", end="2026-01-01T11:00:00Z", step="15s")
    assert explicit.json() == body


def test_running_execution_ends_now(mapi: MetricsApi) -> None:
    eid = mapi.register(status="running", end_time=None)
    assert mapi.metrics(eid).json()["timeRange"]["end"] == "2026-01-01T12:00:00Z"


def test_clamped_to_execution_and_offsets(mapi: MetricsApi) -> None:
    eid = mapi.register()
    r = mapi.metrics(eid, start="2025-12-31T00:00:00+02:00", end="2026-01-01T12:30:00+01:00", step="1m")
    assert r.json()["timeRange"] == {"start": "2026-01-01T10:00:00Z", "end": "2026-01-01T11:00:00Z"}
    inner = mapi.metrics(
        eid, start="2026-01-01T11:15:00+01:00", end="2026-01-01T10:20:00.5Z", step="30s"
    ).json()
    assert inner["timeRange"] == {"start": "2026-01-01T10:15:00Z", "end": "2026-01-01T10:20:00.500Z"}
    assert inner["gpuPowerWatt"][0]["timestamp"] == "2026-01-01T10:15:00Z"
    assert len(inner["gpuPowerWatt"]) == 11


def test_grid_is_anchored_at_start_not_epoch(mapi: MetricsApi) -> None:
    eid = mapi.register(start_time="2026-01-01T10:00:07Z")
    r = mapi.metrics(eid, step="1m").json()
    assert r["gpuUtilizationPercent"][1]["timestamp"] == "2026-01-01T10:01:07Z"
    starts = {f["start"] for f in mapi.prom.range_queries}
    assert starts == {str(int(ts("2026-01-01T10:00:07Z")))}


@pytest.mark.parametrize(
    ("param", "raw"),
    [
        ("start", "yesterday"),
        ("end", "2026-13-01T00:00:00Z"),
        ("step", "0"),
        ("step", "-5s"),
        ("step", "abc"),
        ("step", ""),
        ("start", ""),
    ],
)
def test_unparseable_parameters_are_422(mapi: MetricsApi, param: str, raw: str) -> None:
    eid = mapi.register()
    r = mapi.metrics(eid, **{param: raw})
    assert r.status_code == 422
    (err,) = r.json()["detail"]
    assert err["loc"] == ["query", param] and err["input"] == raw and err["type"] == "value_error"
    assert isinstance(err["msg"], str) and err["msg"]


def test_end_before_start_is_400(mapi: MetricsApi) -> None:
    eid = mapi.register()
    r = mapi.metrics(eid, start="2026-01-01T10:30:00Z", end="2026-01-01T10:10:00Z")
    assert r.status_code == 400
    assert r.json() == {"detail": "end timestamp must not be before start time"}


def test_too_many_points_names_a_step(make_api: Callable[..., MetricsApi]) -> None:
    api = make_api(max_points_per_series=1000, max_points_per_query=500)
    eid = api.register(end_time="2026-01-02T10:00:00Z")
    r = api.metrics(eid, step="15s")
    assert r.status_code == 400 and "step=1m27s" in r.json()["detail"]
    assert api.metrics(eid, step="87s").status_code == 200
    assert api.prom.range_queries  # 87 s fits


def test_long_windows_are_chunked_without_gaps_or_duplicates(make_api: Callable[..., MetricsApi]) -> None:
    api = make_api(max_points_per_query=50)
    eid = api.register()
    r = api.metrics(eid, step="10s")
    assert "content-length" not in r.headers  # 96 queries: streamed as they come
    body = r.json()
    times = [ts(p["timestamp"]) for p in body["gpuClockSmMhz"]]
    assert len(times) == 361 and times == [times[0] + 10 * k for k in range(361)]
    per_metric = len(api.prom.range_queries) // 12
    assert per_metric == 8  # 361 points in chunks of 51
    forms = api.prom.range_queries[:per_metric]
    assert all((float(f["end"]) - float(f["start"])) / float(f["step"]) <= 50 for f in forms)


def test_the_host_cpu_query_is_sent_first(make_api: Callable[..., MetricsApi]) -> None:
    """A read's costliest query (host CPU: a rate over every CPU's counters) goes to the backend
    first, not last as the catalog orders the body (where it was the read's tail); the body keeps
    the catalog's order."""
    api = make_api(concurrency=1)  # one query at a time: the order they queue in is the order sent
    eid = api.register()
    r = api.metrics(eid)
    assert r.status_code == 200
    queries = [f["query"] for f in api.prom.range_queries][-12:]  # after the layout's FB probes
    assert c.NODE_CPU_SECONDS in queries[0] and not any(c.NODE_CPU_SECONDS in q for q in queries[1:])
    assert list(r.json())[-1] == "systemCpuUsagePercent"


def test_non_finite_values_are_dropped(mapi: MetricsApi) -> None:
    mapi.prom.value = lambda t: "NaN" if int(t) % 30 == 0 else ("+Inf" if int(t) % 45 == 0 else "1.5")
    eid = mapi.register()
    points = mapi.metrics(eid, step="15s").json()["gpuUtilizationPercent"]
    assert points and all(p["value"] == 1.5 for p in points)
    expected = [t for t in range(int(ts("2026-01-01T10:00:00Z")), int(ts("2026-01-01T11:00:00Z")) + 1, 15)]
    assert len(points) == len([t for t in expected if t % 30 and t % 45])


def test_empty_series_give_empty_arrays(mapi: MetricsApi) -> None:
    def empty(request: httpx.Request) -> httpx.Response | None:
        if request.url.path == "/api/v1/query_range":
            return httpx.Response(
                200, json={"status": "success", "data": {"resultType": "matrix", "result": []}}
            )
        return None

    mapi.prom.fail = empty
    body = mapi.metrics(mapi.register()).json()
    assert all(body[k] == [] for k in c.LYCEUM_KEYS)


def test_pending_execution_is_404(mapi: MetricsApi) -> None:
    eid = mapi.register(status="pending", start_time=None, end_time=None)
    r = mapi.metrics(eid)
    assert r.status_code == 404 and r.json() == {"detail": "No metrics available for this execution yet"}


def test_auth_and_tenancy(mapi: MetricsApi) -> None:
    eid = mapi.register()
    path = f"/api/v2/external/execution/{eid}/metrics"
    assert mapi.client.get(path).status_code == 401
    assert mapi.client.get(path).json() == {"detail": "Not authenticated"}
    assert mapi.client.get(path, headers={"Authorization": "Bearer lk_nope"}).status_code == 401
    assert mapi.client.get(path, headers={"Authorization": "Bearer not.a.jwt"}).status_code == 401
    other = mapi.metrics(eid, key=mapi.beta_key)
    unknown = mapi.metrics("0b4a2c1e-0000-4000-8000-000000000000")
    assert other.status_code == unknown.status_code == 404
    assert other.json() == unknown.json() == {"detail": "Execution not found"}
    assert not mapi.prom.seen  # nothing reached the backend
    assert mapi.client.post(path, headers=mapi.h()).status_code == 405


@pytest.mark.parametrize(
    "bad_id",
    [
        'x"}',
        "a{b}",
        "line\nbreak",
        "x" * 10_000,
        "héllo",
        "🚀",
        "../../etc/passwd",
        "%00",
        " ",
        "a b",
        'x"} or vector(1) or up{a="',
    ],
)
def test_hostile_ids_are_404_never_500(mapi: MetricsApi, bad_id: str) -> None:
    r = mapi.metrics(bad_id)
    assert r.status_code in (404, 422), r.text
    assert "detail" in r.json()
    assert not mapi.prom.range_queries


def test_unknown_query_params_are_ignored(mapi: MetricsApi) -> None:
    eid = mapi.register()
    r = mapi.client.get(
        f"/api/v2/external/execution/{eid}/metrics?step=30m&foo=bar&start[]=1", headers=mapi.h()
    )
    assert r.status_code == 200 and len(r.json()["gpuPowerWatt"]) == 3


def test_hostname_reaches_promql_only_escaped(mapi: MetricsApi) -> None:
    eid = mapi.register(hostname="node-1.example")
    assert mapi.metrics(eid).status_code == 200
    exprs = [f["query"] for f in mapi.prom.range_queries]
    dcgm = [e for e in exprs if "DCGM" in e]
    assert dcgm and all('Hostname="node-1.example"' in e for e in dcgm)
    node = [e for e in exprs if "node_" in e]
    assert node and all(
        'instance=~"node\\\\-1\\\\.example(:[0-9]+)?|10\\\\.1\\\\.1\\\\.1:9100"' in e for e in node
    )


def test_only_the_executions_gpus(mapi: MetricsApi) -> None:
    eid = mapi.register(gpus=["0", "3", "GPU-aaaa-bbbb"])
    mapi.metrics(eid)
    dcgm = [f["query"] for f in mapi.prom.range_queries if "DCGM" in f["query"]]
    # the FB-total check (counts and spread of used + free) may ask the whole host: equal totals on
    # the host answer for every subset of its GPUs (service/layouts.py); it returns no series' values
    check = [e for e in dcgm if e.startswith("count(") or ") - min(" in e]
    values = [e for e in dcgm if e not in check]
    assert values and all('gpu=~"0|3"' in e and 'UUID=~"GPU\\\\-aaaa\\\\-bbbb"' in e for e in values)
    assert len(check) <= 8


def _refuse(request: httpx.Request) -> httpx.Response:
    raise httpx.ConnectError("connection refused", request=request)


def _slow(request: httpx.Request) -> httpx.Response:
    raise httpx.ReadTimeout("timed out", request=request)


@pytest.mark.parametrize(
    ("fail", "status", "needle"),
    [
        (_refuse, 503, "the metrics backend is unreachable"),
        (_slow, 504, "did not answer in time"),
        (
            lambda r: httpx.Response(
                422,
                json={
                    "status": "error",
                    "errorType": "execution",
                    "error": "query processing would load too many samples",
                },
            ),
            502,
            "too many samples",
        ),
        (lambda r: httpx.Response(200, content=b"<html>proxy</html>"), 502, "not JSON"),
    ],
)
def test_backend_failures(
    mapi: MetricsApi, fail: Callable[[httpx.Request], httpx.Response], status: int, needle: str
) -> None:
    eid = mapi.register()
    mapi.prom.fail = fail
    r = mapi.metrics(eid)
    assert r.status_code == status
    assert needle in r.json()["detail"]


def test_openapi_names(mapi: MetricsApi) -> None:
    doc = mapi.client.get("/openapi.json").json()
    op = doc["paths"]["/api/v2/external/execution/{execution_id}/metrics"]["get"]
    assert op["operationId"] == "get_execution_metrics_api_v2_external_execution__execution_id__metrics_get"
    assert op["tags"] == ["Observability – GPU Metrics"]
    assert op["responses"]["200"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/ExecutionMetricsResponse"
    }
    assert op["responses"]["422"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/HTTPValidationError"
    }
    schemas = doc["components"]["schemas"]
    assert set(schemas["ExecutionMetricsResponse"]["required"]) == {
        "executionId",
        "hostname",
        "timeRange",
        *c.LYCEUM_KEYS,
    }
    assert schemas["MetricDataPoint"]["required"] == ["timestamp", "value"]
    assert schemas["TimeRange"]["required"] == ["start", "end"]
    params = {p["name"]: p for p in op["parameters"]}
    assert params["step"]["schema"]["default"] == "15s"
    assert params["start"]["schema"]["anyOf"] == [{"type": "string"}, {"type": "null"}]
