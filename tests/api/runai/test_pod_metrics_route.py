"""GET /api/v1/workloads/{workloadId}/pods/{podId}/metrics: contract statements 4.B 1-31."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

import httpx
import pytest

from gpulens.domain import catalog as c
from tests.api.runai.conftest import OTHER_POD, OTHER_WORKLOAD, POD, WORKLOAD, RunaiApi, new_uuid

WINDOW = "start=2026-01-01T10:00:00Z&end=2026-01-01T11:00:00Z"


def ts(text: str) -> float:
    assert text.endswith("Z")
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def test_per_gpu_and_pod_level_shapes(runai: RunaiApi) -> None:
    r = runai.metrics(f"metricType=GPU_UTILIZATION_PER_GPU,GPU_UTILIZATION&{WINDOW}")
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    body = r.json()
    assert "histogram" not in body  # only when a histogram or percentile type was asked
    ms = body["measurements"]
    assert [(m["type"], m.get("labels")) for m in ms] == [
        ("GPU_UTILIZATION_PER_GPU", {"gpu": "4"}),
        ("GPU_UTILIZATION_PER_GPU", {"gpu": "5"}),
        ("GPU_UTILIZATION", None),
    ]
    assert "labels" not in ms[2]
    for m in ms:
        assert len(m["values"]) == 21  # numberOfSamples default 20 -> at most n + 1
        times = [ts(v["timestamp"]) for v in m["values"]]
        assert (
            times == sorted(times)
            and times[0] == ts("2026-01-01T10:00:00Z")
            and times[-1] == ts("2026-01-01T11:00:00Z")
        )
        assert all(isinstance(v["value"], str) and float(v["value"]) >= 0 for v in m["values"])


def test_values_are_plain_decimal_strings(runai: RunaiApi) -> None:
    body = runai.metrics(f"metricType=GPU_MEMORY_USAGE_BYTES&{WINDOW}&numberOfSamples=2").json()
    assert [v["value"] for v in body["measurements"][0]["values"]] == ["1500000000"] * 3


@pytest.mark.parametrize(
    "query",
    [
        "metricType=GPU_UTILIZATION,CPU_USAGE_CORES",
        "metricType=GPU_UTILIZATION%2CCPU_USAGE_CORES",
        "metricType=GPU_UTILIZATION&metricType=CPU_USAGE_CORES",
        "metricType=GPU_UTILIZATION,CPU_USAGE_CORES&metricType=GPU_UTILIZATION",
    ],
)
def test_metric_type_forms_and_order(runai: RunaiApi, query: str) -> None:
    body = runai.metrics(f"{query}&{WINDOW}").json()
    assert [m["type"] for m in body["measurements"]] == ["GPU_UTILIZATION", "CPU_USAGE_CORES"]


@pytest.mark.parametrize(
    ("query", "needle"),
    [
        (WINDOW, "Required parameter is missing"),
        ("metricType=GPU_UTILIZATION&end=2026-01-01T11:00:00Z", "Required parameter is missing"),
        ("metricType=GPU_UTILIZATION&start=2026-01-01T11:00:00Z", "Required parameter is missing"),
        (f"metricType=GPU_UTILIZATION,NOPE&{WINDOW}", "metricType"),
        (f"metricType=gpu_utilization&{WINDOW}", "metricType"),
        ("metricType=GPU_UTILIZATION&start=yesterday&end=2026-01-01T11:00:00Z", "start"),
        ("metricType=GPU_UTILIZATION&start=2026-01-01T11:00:00Z&end=2026-01-01T10:00:00Z", "end"),
        (f"metricType=GPU_UTILIZATION&{WINDOW}&numberOfSamples=1001", "numberOfSamples"),
        (f"metricType=GPU_UTILIZATION&{WINDOW}&numberOfSamples=-1", "numberOfSamples"),
        (f"metricType=GPU_UTILIZATION&{WINDOW}&numberOfSamples=2.5", "numberOfSamples"),
        (f"metricType=GPU_UTILIZATION&{WINDOW}&numberOfSamples=abc", "numberOfSamples"),
        (f"metricType=GPU_UTILIZATION&{WINDOW}&numberOfSamples=%C2%B2", "numberOfSamples"),  # "²"
        (f"metricType=GPU_UTILIZATION&{WINDOW}&numberOfSamples={'9' * 5000}", "numberOfSamples"),
    ],
)
def test_bad_parameters_are_400(runai: RunaiApi, query: str, needle: str) -> None:
    r = runai.metrics(query)
    assert r.status_code == 400, r.text
    body = r.json()
    assert body["code"] == 400 and needle in body["message"] + body.get("details", "")
    assert set(body) <= {"code", "message", "details"}


@pytest.mark.parametrize(
    ("start", "end"),
    [
        ("2026-01-01T10:00:00Z", "2026-01-01T11:00:00Z"),
        ("2026-01-01T10:00:00.211Z", "2026-01-01T11:00:00.211Z"),
        ("2026-01-01T10:00:00.211000%2B00:00", "2026-01-01T12:00:00%2B01:00"),
        ("2026-01-01T10:00:00", "2026-01-01T11:00:00"),
    ],
)
def test_time_formats_clients_send(runai: RunaiApi, start: str, end: str) -> None:
    r = runai.metrics(f"metricType=GPU_UTILIZATION&start={start}&end={end}&numberOfSamples=4")
    assert r.status_code == 200, r.text
    assert len(r.json()["measurements"][0]["values"]) == 5


def test_zero_samples_is_one_point_at_end_and_equal_bounds_allowed(runai: RunaiApi) -> None:
    (m,) = runai.metrics(f"metricType=GPU_UTILIZATION&{WINDOW}&numberOfSamples=0").json()["measurements"]
    assert [v["timestamp"] for v in m["values"]] == ["2026-01-01T11:00:00Z"]
    same = runai.metrics("metricType=GPU_UTILIZATION&start=2026-01-01T10:00:00Z&end=2026-01-01T10:00:00Z")
    assert same.status_code == 200 and len(same.json()["measurements"][0]["values"]) == 1


def test_go_style_client_last_value(runai: RunaiApi) -> None:
    r = runai.metrics(
        "metricType=GPU_UTILIZATION,CPU_USAGE_CORES&start=2026-01-01T10:00:00Z&end=2026-01-01T11:00:00Z&numberOfSamples=1"
    )
    assert [m["type"] for m in r.json()["measurements"]] == ["GPU_UTILIZATION", "CPU_USAGE_CORES"]
    gpu, cpu = r.json()["measurements"]
    t = 1_767_265_200  # the last point: GPUs 4 and 5 read 40 and 50 plus t % 7, the pod their mean
    assert gpu["values"][-1]["value"] == str(45 + t % 7) and cpu["values"][-1]["value"] == "42.5"
    for m in (gpu, cpu):
        assert m["values"][-1]["timestamp"] == "2026-01-01T11:00:00Z"


def test_histograms_and_percentiles(runai: RunaiApi) -> None:
    body = runai.metrics(
        f"metricType=VLLM_TIME_TO_FIRST_TOKEN_SECONDS,VLLM_TIME_TO_FIRST_TOKEN_SECONDS_PERCENTILES,"
        f"VLLM_NUM_REQUESTS_RUNNING&{WINDOW}&numberOfSamples=4"
    ).json()
    assert [m["type"] for m in body["measurements"]] == ["VLLM_NUM_REQUESTS_RUNNING"]
    hist, pct = body["histogram"]
    assert hist["type"] == "VLLM_TIME_TO_FIRST_TOKEN_SECONDS"
    assert len(hist["values"]) == 5
    first = hist["values"][0]["data"]
    assert list(first) == ["0.01", "0.1", "1.0", "+Inf"]
    # per-interval (15 min = 900 s) increases of counters growing 1, 3, 6, 10 per second
    assert first == {"0.01": "900", "0.1": "2700", "1.0": "5400", "+Inf": "9000"}
    assert pct["type"] == "VLLM_TIME_TO_FIRST_TOKEN_SECONDS_PERCENTILES"
    assert all(set(v["data"]) == {"p50", "p90", "p99"} for v in pct["values"])
    assert pct["values"][1]["data"] == {"p50": "0.05", "p90": "0.25", "p99": "0.9"}
    assert len(pct["values"]) == 2  # a NaN p99 (10:00, 10:30, 11:00) drops that timestamp


def test_histogram_key_present_but_empty_without_app_series(runai: RunaiApi) -> None:
    runai.prom.histogram_names = []
    body = runai.metrics(
        f"metricType=NIM_TIME_TO_FIRST_TOKEN_SECONDS_PERCENTILES,NIM_NUM_REQUESTS_RUNNING&{WINDOW}"
    ).json()
    assert body["histogram"] == [{"type": "NIM_TIME_TO_FIRST_TOKEN_SECONDS_PERCENTILES", "values": []}]


def test_counts_per_interval(runai: RunaiApi) -> None:
    (m,) = runai.metrics(f"metricType=VLLM_REQUEST_SUCCESS&{WINDOW}&numberOfSamples=4").json()["measurements"]
    assert [v["value"] for v in m["values"]] == ["90"] * 5


def test_per_gpu_types_without_data_still_list_the_pods_gpus(runai: RunaiApi) -> None:
    ms = runai.metrics(f"metricType=GPU_SWAP_MEMORY_BYTES_PER_GPU&{WINDOW}").json()["measurements"]
    assert ms == [
        {"type": "GPU_SWAP_MEMORY_BYTES_PER_GPU", "labels": {"gpu": "4"}, "values": []},
        {"type": "GPU_SWAP_MEMORY_BYTES_PER_GPU", "labels": {"gpu": "5"}, "values": []},
    ]


def test_unexpected_failure_is_500_without_a_trace(runai: RunaiApi, monkeypatch: pytest.MonkeyPatch) -> None:
    async def boom(*args: object, **kwargs: object) -> None:
        raise RuntimeError("secret internals")

    monkeypatch.setattr(runai.client.app.state.ctx.pod_metrics, "answer", boom)

    async def call() -> httpx.Response:
        transport = httpx.ASGITransport(app=runai.client.app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            return await client.get(
                f"/api/v1/workloads/{WORKLOAD}/pods/{POD}/metrics?metricType=GPU_UTILIZATION&{WINDOW}",
                headers=runai.h(),
            )

    import anyio

    r = anyio.run(call)
    assert r.status_code == 500 and r.json() == {"code": 500, "message": "Something went wrong."}
    assert "secret" not in r.text


def test_partial_success_is_207(runai: RunaiApi) -> None:
    def fail_cpu(form: dict[str, str]) -> httpx.Response | None:
        if "container_cpu" in form.get("query", ""):
            return httpx.Response(
                422, json={"status": "error", "errorType": "execution", "error": "too many samples"}
            )
        return None

    runai.prom.fail = fail_cpu
    r = runai.metrics(f"metricType=CPU_USAGE_CORES,GPU_UTILIZATION&{WINDOW}")
    assert r.status_code == 207
    assert [m["type"] for m in r.json()["measurements"]] == ["GPU_UTILIZATION"]
    only = runai.metrics(f"metricType=CPU_USAGE_CORES&{WINDOW}")
    assert only.status_code == 502 and only.json()["code"] == 502


def test_backend_down_is_503(runai: RunaiApi) -> None:
    def down(form: dict[str, str]) -> httpx.Response | None:
        raise httpx.ConnectError("refused")

    runai.prom.fail = down
    r = runai.metrics(f"metricType=GPU_UTILIZATION,CPU_USAGE_CORES&{WINDOW}")
    assert r.status_code == 503
    assert r.json()["code"] == 503 and r.json()["message"] == "Please try again in few minutes."


def test_advanced_flag(make_runai: Callable[..., RunaiApi]) -> None:
    api = make_runai(advanced_gpu_metrics=False)
    mixed = api.metrics(f"metricType=GPU_SM_ACTIVITY_PER_GPU,GPU_UTILIZATION&{WINDOW}")
    assert mixed.status_code == 207 and [m["type"] for m in mixed.json()["measurements"]] == [
        "GPU_UTILIZATION"
    ]
    only = api.metrics(f"metricType=GPU_SM_ACTIVITY_PER_GPU,GPU_TENSOR_ACTIVITY_PER_GPU&{WINDOW}")
    assert only.status_code == 400 and only.json()["message"].startswith("Advanced GPU metrics are disabled")
    on = make_runai().metrics(f"metricType=GPU_SM_ACTIVITY_PER_GPU&{WINDOW}")
    assert on.status_code == 200 and len(on.json()["measurements"]) == 2


def test_csv(runai: RunaiApi) -> None:
    r = runai.metrics(
        f"metricType=GPU_UTILIZATION_PER_GPU,CPU_USAGE_CORES,VLLM_TIME_TO_FIRST_TOKEN_SECONDS&{WINDOW}&numberOfSamples=1",
        headers={"Accept": "text/csv"},
    )
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/csv")
    lines = r.text.strip().splitlines()
    assert lines[0] == "type,gpu,timestamp,value"
    assert lines[1].startswith("GPU_UTILIZATION_PER_GPU,4,2026-01-01T10:00:00Z,")
    assert lines[-1] == "CPU_USAGE_CORES,,2026-01-01T11:00:00Z,42.5"
    assert len(lines) == 1 + 2 * 2 + 2  # no histogram rows


def test_auth_and_routing(runai: RunaiApi) -> None:
    q = f"metricType=GPU_UTILIZATION&{WINDOW}"
    none = runai.client.get(f"/api/v1/workloads/{WORKLOAD}/pods/{POD}/metrics?{q}")
    assert none.status_code == 401 and none.json()["code"] == 401
    bad = runai.metrics(q, key="lk_nonsense")
    assert bad.status_code == 401
    for workload, pod in [
        (new_uuid(), POD),
        (WORKLOAD, new_uuid()),
        (WORKLOAD, OTHER_POD),
        (OTHER_WORKLOAD, POD),
    ]:
        r = runai.metrics(q, workload=workload, pod=pod)
        assert r.status_code == 404 and r.json() == {"code": 404, "message": "Resource id not found."}, r.text
    other_org = runai.metrics(q, key=runai.beta_key)
    assert other_org.status_code == 404
    forbidden = runai.metrics(q, key=runai.limited_key)
    assert (
        forbidden.status_code == 403
        and forbidden.json()["message"] == "You do not have sufficient permissions."
    )
    for workload, pod in [("nope", POD), (WORKLOAD, "x'\"}"), (WORKLOAD, "1234")]:
        r = runai.metrics(q, workload=workload, pod=pod)
        assert r.status_code == 400 and r.json()["code"] == 400, r.text
    assert not [f for f in runai.prom.seen if "query" in f and "step" in f and "x'" in f["query"]]


def test_every_type_at_once(runai: RunaiApi) -> None:
    r = runai.metrics(
        "metricType=" + ",".join(m.type for m in c.POD_METRICS) + f"&{WINDOW}&numberOfSamples=3"
    )
    assert r.status_code == 200, r.text
    body = r.json()
    types = {m["type"] for m in body["measurements"]} | {h["type"] for h in body["histogram"]}
    assert types == {m.type for m in c.POD_METRICS}


def test_openapi(runai: RunaiApi) -> None:
    op = runai.client.get("/openapi.json").json()["paths"][
        "/api/v1/workloads/{workloadId}/pods/{podId}/metrics"
    ]["get"]
    assert op["operationId"] == "get_workload_pod_metrics" and op["tags"] == ["Pods"]
    params = {p["name"]: p for p in op["parameters"]}
    assert params["metricType"]["explode"] is False and params["metricType"]["required"] is True
    assert set(op["responses"]) == {"200", "207", "400", "401", "403", "404", "500", "502", "503", "504"}
    assert "text/csv" in op["responses"]["200"]["content"]


def test_workload_metrics_over_all_pods(runai: RunaiApi) -> None:
    r = runai.client.get(
        f"/api/v1/workloads/{WORKLOAD}/metrics?metricType=GPU_UTILIZATION,POD_COUNT,CPU_REQUEST_CORES,"
        f"GPU_MEMORY_REQUEST_BYTES,NIM_TIME_TO_FIRST_TOKEN_SECONDS_PERCENTILES&{WINDOW}&numberOfSamples=2",
        headers=runai.h(),
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert [m["type"] for m in body["measurements"]] == [
        "GPU_UTILIZATION",
        "POD_COUNT",
        "CPU_REQUEST_CORES",
        "GPU_MEMORY_REQUEST_BYTES",
    ]
    assert body["measurements"][3]["values"] == []
    exprs = [f["query"] for f in runai.prom.seen if "step" in f]
    assert any(e.startswith("count(kube_pod_info{") for e in exprs)
    assert any('resource="cpu"' in e and "kube_pod_container_resource_requests" in e for e in exprs)
    pod_only = runai.client.get(
        f"/api/v1/workloads/{WORKLOAD}/metrics?metricType=GPU_UTILIZATION_PER_GPU&{WINDOW}", headers=runai.h()
    )
    assert pod_only.status_code == 400  # a pod-only type
    assert (
        runai.client.get(
            f"/api/v1/workloads/{OTHER_WORKLOAD}/metrics?metricType=POD_COUNT&{WINDOW}",
            headers=runai.h(runai.beta_key),
        ).status_code
        == 404
    )


def test_a_read_resolves_its_pod_once(runai: RunaiApi, monkeypatch: pytest.MonkeyPatch) -> None:
    """The fixed cost of a read: one registry read for the pod and its workload (was four: the archive
    check and the service each looked up the workload, then the pod); a workload read lists its pods
    once. Authorization still runs on each: another org's caller gets a 404."""
    calls: list[str] = []

    def counted(name: str) -> Callable[..., object]:
        real = getattr(runai.registry, name)

        def call(*args: object, **kwargs: object) -> object:
            calls.append(name)
            return real(*args, **kwargs)

        return call

    for name in ("get_pod_with_workload", "get_workload", "get_pod", "list_pods_overlapping"):
        monkeypatch.setattr(runai.registry, name, counted(name))
    assert runai.metrics(f"metricType=GPU_UTILIZATION&{WINDOW}").status_code == 200
    assert calls == ["get_pod_with_workload"]
    calls.clear()
    path = f"/api/v1/workloads/{WORKLOAD}/metrics?metricType=GPU_UTILIZATION&{WINDOW}"
    assert runai.client.get(path, headers=runai.h()).status_code == 200
    assert calls == ["get_workload", "list_pods_overlapping"]
    assert runai.metrics(f"metricType=GPU_UTILIZATION&{WINDOW}", key=runai.beta_key).status_code == 404
