"""Both dialects answer the same over the embedded store as over a real Prometheus (issue 4, item 3).

One registry, two apps: one reads the real Prometheus holding a generated scenario, the other an
embedded `SampleStore` holding the same samples (sealed into chunks). Every response must be the same
JSON, status code included, with numbers (and Run:ai's decimal strings) equal to 1e-9:
* Lyceum: every execution of the default scenario, the default call and windows/steps that cross the
  data's end (5 m of lookback, then nothing) and chunk borders (the embedded app chunks at 97 points a
  query, the Prometheus one does not);
* Run:ai: every metricType of every pod and of every workload of the k8s scenario (pods start, stop
  and restart: gaps longer than the lookback), at numberOfSamples 0, 7 and 120.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import pytest

from gpulens.api.app import create_app
from gpulens.backends.embedded import EmbeddedBackend
from gpulens.backends.prometheus import PrometheusBackend, make_client
from gpulens.config import Settings
from gpulens.domain import catalog as c
from gpulens.domain.timeparse import format_rfc3339_ms
from gpulens.service.discovery import discover_kubernetes
from gpulens.storage.registry import Registry
from gpulens.storage.samples import SampleStore
from gpulens_testkit.promload import LoadedDataset, LoadedK8sDataset
from tests.api.conftest import Client
from tests.conftest import sqlite_registry
from tests.integration.lyceum_app import build

pytestmark = pytest.mark.integration

REL = 1e-9


def _number(x: Any) -> float | None:
    if isinstance(x, bool):
        return None
    if isinstance(x, int | float):
        return float(x)
    if isinstance(x, str):
        try:
            return float(x)
        except ValueError:
            return None
    return None


def assert_same_json(want: Any, got: Any, path: str = "$") -> int:
    """Equal structure and text; numbers equal to 1e-9. Returns how many numbers were compared."""
    if isinstance(want, dict):
        assert isinstance(got, dict) and want.keys() == got.keys(), (path, sorted(want), sorted(got or {}))
        return sum(assert_same_json(want[k], got[k], f"{path}.{k}") for k in want)
    if isinstance(want, list):
        assert isinstance(got, list) and len(want) == len(got), (path, len(want), len(got or []))
        return sum(
            assert_same_json(a, b, f"{path}[{i}]") for i, (a, b) in enumerate(zip(want, got, strict=True))
        )
    x, y = _number(want), _number(got)
    if x is None or y is None or isinstance(want, str) != isinstance(got, str):
        assert want == got, (path, want, got)
        return 0
    if math.isnan(x) or math.isnan(y):
        assert math.isnan(x) and math.isnan(y), (path, want, got)
    else:
        assert x == y or math.isclose(x, y, rel_tol=REL, abs_tol=1e-12), (path, want, got)
    return 1


@dataclass
class Pair:
    prom: Client
    emb: Client
    key: str
    seconds: list[float] = field(default_factory=lambda: [0.0, 0.0])  # Prometheus app, embedded app
    slowest: float = 0.0

    def both(self, path: str, **params: str) -> tuple[int, int]:
        """GET on both apps; asserts the same answer. Returns (status, numbers compared)."""
        headers = {"Authorization": f"Bearer {self.key}"}
        t0 = time.perf_counter()
        a = self.prom.get(path, params=params, headers=headers)
        t1 = time.perf_counter()
        b = self.emb.get(path, params=params, headers=headers)
        t2 = time.perf_counter()
        self.seconds[0] += t1 - t0
        self.seconds[1] += t2 - t1
        self.slowest = max(self.slowest, t1 - t0, t2 - t1)
        assert a.status_code == b.status_code, (path, params)  # a failed metricType is logged
        return a.status_code, assert_same_json(a.json(), b.json())


# -- Lyceum -----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def lyceum(
    prom_dataset: LoadedDataset, embedded_store: SampleStore, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Pair, LoadedDataset]]:
    api = build(prom_dataset, Path(tmp_path_factory.mktemp("lyceum-diff")))
    chunked = Settings(**{**api.settings.model_dump(), "max_points_per_query": 97})
    emb = Client(create_app(chunked, registry=api.registry, backend=EmbeddedBackend(embedded_store)))
    yield Pair(api.client, emb, api.key), prom_dataset
    api.registry.dispose()


def test_lyceum_responses_are_identical(lyceum: tuple[Pair, LoadedDataset]) -> None:
    pair, data = lyceum
    sc = data.scenario
    calls = numbers = 0
    for e in sc.executions:
        path = f"/api/v2/external/execution/{e.execution_id}/metrics"
        start, end = e.start_s * 1000, e.end_s * 1000
        windows: list[dict[str, str]] = [
            {},  # the whole execution at 15 s
            {"step": "5s"},
            {
                "step": "7s",
                "start": format_rfc3339_ms(start + 7_000),
                "end": format_rfc3339_ms(start + 2_407_000),
            },
            {
                "step": "1m",
                "start": format_rfc3339_ms(start - 900_000),
                "end": format_rfc3339_ms(start + 900_000),
            },
            # past the end of the data: 5 m of lookback, then empty
            {
                "step": "30s",
                "start": format_rfc3339_ms(end - 600_000),
                "end": format_rfc3339_ms(end + 1_200_000),
            },
            {"step": "2m30s", "start": format_rfc3339_ms(start), "end": format_rfc3339_ms(end)},
        ]
        for params in windows:
            status, n = pair.both(path, **params)
            assert status == 200, (e.name, params)
            calls += 1
            numbers += n
    assert calls == 6 * len(sc.executions)
    print(f"lyceum: {calls} calls, {numbers} numbers")
    assert numbers > 50_000


def test_lyceum_errors_are_identical(lyceum: tuple[Pair, LoadedDataset]) -> None:
    pair, data = lyceum
    e = data.scenario.executions[0]
    path = f"/api/v2/external/execution/{e.execution_id}/metrics"
    assert pair.both(path, step="0s")[0] == 422
    assert pair.both(path, start="not a time")[0] == 422
    assert pair.both(path, start="2020-01-01T00:00:00Z", end="2020-01-01T01:00:00Z")[0] == 200  # outside
    assert pair.both("/api/v2/external/execution/nope/metrics")[0] == 404


# -- Run:ai -----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def runai(
    prom_k8s_dataset: LoadedK8sDataset,
    embedded_k8s_store: SampleStore,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[Pair, Registry, LoadedK8sDataset]]:
    tmp = Path(tmp_path_factory.mktemp("runai-diff"))
    registry = sqlite_registry(tmp / "r.db")
    _, key = registry.create_key("acme", name="alice")
    sc = prom_k8s_dataset.scenario
    prom = PrometheusBackend(prom_k8s_dataset.url, make_client(30, False, 4))
    emb = EmbeddedBackend(embedded_k8s_store)
    # pods are registered from the kube-state-metrics series in Prometheus (discovery is a fleet
    # feature: its queries use functions the embedded evaluator does not implement)
    report = anyio.run(
        partial(
            discover_kubernetes, prom, registry, "acme", start_ms=sc.start_s * 1000, end_ms=sc.end_s * 1000
        )
    )
    assert report is not None and report.pods_seen > 0
    settings = Settings(
        data_dir=tmp, prometheus_url=prom_k8s_dataset.url, database_url=f"sqlite:///{tmp / 'r.db'}"
    )
    pair = Pair(
        Client(create_app(settings, registry=registry, backend=prom)),
        Client(create_app(settings, registry=registry, backend=emb)),
        key,
    )
    yield pair, registry, prom_k8s_dataset
    registry.dispose()


def test_runai_pod_and_workload_responses_are_identical(
    runai: tuple[Pair, Registry, LoadedK8sDataset],
) -> None:
    pair, registry, data = runai
    sc = data.scenario
    start, end = sc.start_s * 1000, sc.end_s * 1000
    calls = numbers = 0
    statuses: set[int] = set()
    workloads: set[str] = set()
    for pod in sc.pods:
        reg = registry.get_pod(pod.pod_id)
        assert reg is not None, pod.pod_id
        workloads.add(reg.workload_id)
        life = data.truth.pod_window(pod.name)
        for n in (0, 7, 120):
            for lo, hi in ((life.start_ms, life.end_ms), (start + 90_000, end + 600_000)):
                status, got = pair.both(
                    f"/api/v1/workloads/{reg.workload_id}/pods/{pod.pod_id}/metrics",
                    metricType=",".join(m.type for m in c.POD_METRICS),
                    start=format_rfc3339_ms(lo),
                    end=format_rfc3339_ms(hi),
                    numberOfSamples=str(n),
                )
                statuses.add(status)
                calls += 1
                numbers += got
    for workload in sorted(workloads):
        for n in (0, 7, 120):
            status, got = pair.both(
                f"/api/v1/workloads/{workload}/metrics",
                metricType=",".join(m.type for m in c.WORKLOAD_METRICS),
                start=format_rfc3339_ms(start + 90_000),
                end=format_rfc3339_ms(end + 600_000),
                numberOfSamples=str(n),
            )
            statuses.add(status)
            calls += 1
            numbers += got
        assert pair.both(f"/api/v1/workloads/{workload}/pods")[0] == 200
    assert statuses <= {200, 207} and 200 in statuses
    assert calls == 6 * len(sc.pods) + 3 * len(workloads)
    print(f"run:ai: {calls} calls, {numbers} numbers, statuses {sorted(statuses)}, seconds {pair.seconds}")
    print(f"slowest request {pair.slowest:.2f} s")
    assert numbers > 10_000
