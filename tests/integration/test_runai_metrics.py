"""Run:ai pod metrics against a real Prometheus holding generated k8s/vLLM/NIM/MIG data.

Pods are registered by discovery from the kube-state-metrics series in the same Prometheus; every
metricType of every pod is compared with the generator's truth at its stable points.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import pytest

from gpulens.api.app import create_app
from gpulens.backends.prometheus import PrometheusBackend, make_client
from gpulens.config import Settings
from gpulens.domain import catalog as c
from gpulens.domain.timeparse import format_rfc3339_ms, parse_timestamp_ms
from gpulens.service.discovery import discover_kubernetes
from gpulens.storage.registry import Registry
from gpulens_testkit.k8s_truth import RunaiWindow
from gpulens_testkit.promload import LoadedK8sDataset
from tests.api.conftest import Client
from tests.conftest import sqlite_registry
from tests.integration.conftest import serve_app

pytestmark = pytest.mark.integration


@dataclass
class Live:
    client: Client
    registry: Registry
    key: str
    admin: str
    data: LoadedK8sDataset

    def workload_of(self, pod_id: str) -> str:
        pod = self.registry.get_pod(pod_id)
        assert pod is not None, pod_id
        return pod.workload_id

    def get(self, path: str, **params: Any) -> Any:
        r = self.client.get(path, params=params, headers={"Authorization": f"Bearer {self.key}"})
        assert r.status_code == 200, r.text
        return r.json()


@pytest.fixture(scope="module")
def live(prom_k8s_dataset: LoadedK8sDataset, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    tmp = Path(tmp_path_factory.mktemp("runai"))
    registry = sqlite_registry(tmp / "r.db")
    _, admin = registry.create_key("platform", name="svc", is_admin=True)
    _, key = registry.create_key("acme", name="alice")
    scenario = prom_k8s_dataset.scenario
    backend = PrometheusBackend(prom_k8s_dataset.url, make_client(10, False, 4))
    report = anyio.run(
        partial(
            discover_kubernetes,
            backend,
            registry,
            "acme",
            start_ms=scenario.start_s * 1000,
            end_ms=scenario.end_s * 1000,
        )
    )
    assert report is not None
    settings = Settings(
        data_dir=tmp, prometheus_url=prom_k8s_dataset.url, database_url=f"sqlite:///{tmp / 'r.db'}"
    )
    yield Live(Client(create_app(settings, registry=registry)), registry, key, admin, prom_k8s_dataset)
    registry.dispose()


def slot(labels: dict[str, str] | None) -> str | None:
    if labels is None:
        return None
    return f"{labels['gpu']}/{labels['gpuInstance']}" if "gpuInstance" in labels else labels["gpu"]


def close(a: float, b: float) -> bool:
    return a == b or math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)


def query(w: RunaiWindow, types: list[str]) -> dict[str, str]:
    return {
        "metricType": ",".join(types),
        "start": format_rfc3339_ms(w.start_ms),
        "end": format_rfc3339_ms(w.end_ms),
        "numberOfSamples": str(w.n),
    }


@pytest.mark.parametrize("n", [20, 7, 1, 0])
def test_every_type_of_every_pod_matches_truth(live: Live, n: int) -> None:
    truth = live.data.truth
    checked = 0
    for pod in live.data.scenario.pods:
        window = truth.pod_window(pod.name, n)
        body = live.get(
            f"/api/v1/workloads/{live.workload_of(pod.pod_id)}/pods/{pod.pod_id}/metrics",
            **query(window, [m.type for m in c.POD_METRICS]),
        )
        expected = truth.pod(pod.name, window)
        got: dict[tuple[str, str | None], dict[int, str]] = {}
        for m in body["measurements"]:
            got[(m["type"], slot(m.get("labels")))] = {
                parse_timestamp_ms(v["timestamp"]): v["value"] for v in m["values"]
            }
        for type_, slots in expected.measurements.items():
            for key, mt in slots.items():
                values = got.get((type_, key), {})
                for t, v, ok in zip(mt.timestamps_ms, mt.values, mt.stable, strict=True):
                    if not ok:
                        continue
                    if v is None:
                        assert t not in values, (pod.name, type_, key, t)
                    else:
                        assert t in values and close(float(values[t]), v), (
                            pod.name,
                            type_,
                            key,
                            t,
                            values.get(t),
                            v,
                        )
                        checked += 1
        hist = {
            h["type"]: {parse_timestamp_ms(v["timestamp"]): v["data"] for v in h["values"]}
            for h in body["histogram"]
        }
        for type_, ht in expected.histograms.items():
            for t, counts, ok in zip(ht.timestamps_ms, ht.counts, ht.stable, strict=True):
                if ok and counts is not None:
                    assert hist[type_][t] == {le: str(n_) for le, n_ in zip(ht.les, counts, strict=True)}, (
                        pod.name,
                        type_,
                        t,
                    )
                    checked += 1
        for type_, pt in expected.percentiles.items():
            for name, mt in pt.quantiles.items():
                for t, v, ok in zip(mt.timestamps_ms, mt.values, mt.stable, strict=True):
                    if ok and v is not None and t in hist[type_]:
                        assert close(float(hist[type_][t][name]), v), (pod.name, type_, name, t)
                        checked += 1
    assert checked > {20: 500, 7: 200, 1: 60, 0: 30}[n]


def test_percentiles_agree_with_raw_observations(live: Live) -> None:
    """API p50/p90 lie in the bucket holding the nearest-rank percentile of the raw observations."""
    truth, pod = live.data.truth, live.data.scenario.pod("llm-serve-0")
    w = truth.pod_window(pod.name, 4)
    body = live.get(
        f"/api/v1/workloads/{live.workload_of(pod.pod_id)}/pods/{pod.pod_id}/metrics",
        **query(w, ["VLLM_E2E_REQUEST_LATENCY_SECONDS_PERCENTILES", "VLLM_E2E_REQUEST_LATENCY_SECONDS"]),
    )
    pct, buckets = body["histogram"][0], body["histogram"][1]
    les = [float(le) for le in buckets["values"][-1]["data"] if le != "+Inf"]
    window_s = truth.percentiles(pod.name, "VLLM_E2E_REQUEST_LATENCY_SECONDS_PERCENTILES", w).window_ms
    compared = 0
    for v in pct["values"]:
        t = parse_timestamp_ms(v["timestamp"])
        obs = sorted(truth.observations(pod.name, c.VLLM_E2E_LATENCY, t - window_s, t))
        if len(obs) < 20:
            continue
        for name, q in (("p50", 0.5), ("p90", 0.9)):
            rank = obs[max(0, math.ceil(q * len(obs)) - 1)]
            upper = next((b for b in les if b >= rank), math.inf)
            lower = max((b for b in les if b < rank), default=0.0)
            assert lower <= float(v["data"][name]) <= upper, (name, rank, v["data"][name])
            compared += 1
    assert compared >= 4


def test_gpu_utilization_agrees_with_the_lyceum_endpoint(live: Live) -> None:
    pod = live.data.scenario.pod("train-0")
    start, end = pod.start_s * 1000, live.data.scenario.pod_end_s(pod) * 1000
    n = (end - start) // 15_000
    r = live.client.post(
        "/api/v2/admin/executions",
        json={
            "org": "acme",
            "hostname": pod.node,
            "gpus": [s.key for s in pod.slots],
            "status": "completed",
            "start_time": format_rfc3339_ms(start),
            "end_time": format_rfc3339_ms(end),
        },
        headers={"Authorization": f"Bearer {live.admin}"},
    )
    assert r.status_code == 201, r.text
    lyceum = live.get(f"/api/v2/external/execution/{r.json()['execution_id']}/metrics", step="15s")
    runai = live.get(
        f"/api/v1/workloads/{live.workload_of(pod.pod_id)}/pods/{pod.pod_id}/metrics",
        metricType="GPU_UTILIZATION",
        start=format_rfc3339_ms(start),
        end=format_rfc3339_ms(end),
        numberOfSamples=str(n),
    )
    ly = {parse_timestamp_ms(p["timestamp"]): p["value"] for p in lyceum["gpuUtilizationPercent"]}
    ra = {parse_timestamp_ms(v["timestamp"]): float(v["value"]) for v in runai["measurements"][0]["values"]}
    inner = [t for t in ra if start + 300_000 < t <= end]  # away from the 5-minute lookback at the start
    assert len(inner) > 200
    assert all(close(ra[t], ly[t]) for t in inner)


def test_runapy_client_end_to_end(live: Live) -> None:
    """The generated Run:ai Python client: token via /api/v1/token (AppId/AppSecret), metrics, models."""
    import runai  # a dev dependency: the generated Run:ai client (runapy)
    from runai.models import MetricsCompositeResponse

    with serve_app(live.client.app) as url:
        config = runai.configuration.Configuration(
            client_id=live.key[:8],
            client_secret=live.key,
            runai_base_url=url,
            auto_refresh_token=False,
            retry_enabled=False,
        )
        with runai.api_client.ApiClient(config) as client:
            pods_api = runai.api.pods_api.PodsApi(client)
            pod = live.data.scenario.pod("llm-serve-0")
            w = live.data.truth.pod_window(pod.name, 10)
            old_enum = [m for m in runai.models.PodMetricType]
            response = pods_api.get_workload_pod_metrics(
                workload_id=live.workload_of(pod.pod_id),
                pod_id=pod.pod_id,
                metric_type=old_enum,
                start=datetime.fromtimestamp(w.start_ms / 1000, tz=UTC),
                end=datetime.fromtimestamp(w.end_ms / 1000, tz=UTC),
                number_of_samples=10,
            )
            data = response.data if hasattr(response, "data") else response
            parsed = MetricsCompositeResponse.from_dict(data)
            assert parsed is not None and parsed.measurements
            assert {m.type for m in parsed.measurements} >= {"GPU_UTILIZATION_PER_GPU", "CPU_USAGE_CORES"}
            assert parsed.histogram and all(h.values is not None for h in parsed.histogram)


def test_pod_summary_stats_are_the_metrics_routes_and_tenancy_holds(live: Live) -> None:
    """The pod summary's stats over an hour of a finished GPU pod equal those of the pod metrics
    route's values on the same grid; another org, an unknown pod and a window outside the pod are the
    dialect's errors."""
    pod = next(p for p in live.data.scenario.pods if p.end_s is not None and p.slots)
    path = f"/api/v1/workloads/{live.workload_of(pod.pod_id)}/pods/{pod.pod_id}"
    start_ms = pod.start_s * 1000
    end_ms = min(pod.end_s * 1000, start_ms + 3_600_000)
    window = {"start": format_rfc3339_ms(start_ms), "end": format_rfc3339_ms(end_ms)}
    body = live.get(f"{path}/summary", **window)
    assert (body["podId"], body["podName"], body["namespace"]) == (pod.pod_id, pod.name, pod.namespace)
    step_ms = round(body["stepSeconds"] * 1000)
    n = (
        parse_timestamp_ms(body["timeRange"]["end"]) - parse_timestamp_ms(body["timeRange"]["start"])
    ) // step_ms + 1
    assert step_ms == 15_000 and n - 1 <= 1000
    metrics = live.get(
        f"{path}/metrics",
        metricType="GPU_UTILIZATION,CPU_MEMORY_USAGE_BYTES",
        start=body["timeRange"]["start"],
        end=body["timeRange"]["end"],
        numberOfSamples=str(n - 1),  # n points
    )
    for m in metrics["measurements"]:
        values = sorted(float(v["value"]) for v in m["values"])
        got = body["stats"][m["type"]]
        assert got["samples"] == len(values) > 0, m["type"]
        assert got["mean"] == pytest.approx(math.fsum(values) / len(values), rel=1e-9)
        assert (got["min"], got["max"]) == (values[0], values[-1])
    assert body["perGpu"] and set(body["perGpu"]) <= {str(s.gpu) for s in pod.slots}
    assert all(f["kind"] in ("idle", "low_utilization", "no_data") for f in body["findings"])

    _, other = live.registry.create_key("beta", name="bob")
    for url, params, status in (
        (f"{path}/summary", {}, 200),
        (f"/api/v1/workloads/{live.workload_of(pod.pod_id)}/pods/{uuid.uuid4()}/summary", {}, 404),
        (f"{path}/summary", {"start": "2001-01-01T00:00:00Z", "end": "2001-01-02T00:00:00Z"}, 400),
        (f"{path}/summary", {"start": "yesterday"}, 400),
    ):
        r = live.client.get(url, params=params, headers={"Authorization": f"Bearer {live.key}"})
        assert r.status_code == status, (url, params, r.text)
        if status != 200:
            assert {"code", "message"} <= set(r.json()) <= {"code", "message", "details"}, r.text
    r = live.client.get(f"{path}/summary", headers={"Authorization": f"Bearer {other}"})
    assert r.status_code == 404 and r.json()["code"] == 404
