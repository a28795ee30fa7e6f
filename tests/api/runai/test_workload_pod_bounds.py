"""A workload-metrics read asks only for the pods that can have samples in its time range, and at
most GPULENS_MAX_PODS_PER_QUERY of them (400 beyond), never every pod a Deployment ever had."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import pytest

from gpulens.config import Settings
from tests.api.runai.conftest import WORKLOAD, RunaiApi

WINDOW = "start=2026-01-01T10:00:00Z&end=2026-01-01T11:00:00Z&numberOfSamples=12"
TYPES = "metricType=GPU_UTILIZATION&metricType=CPU_USAGE_CORES"


def pod(name: str, start: str | None, end: str | None) -> dict[str, Any]:
    return {
        "pod_id": str(uuid.uuid4()),
        "name": name,
        "namespace": "team-a",
        "node": "gpu-node-1",
        "gpus": ["4"],
        "start_time": start,
        "end_time": end,
    }


def add_pods(api: RunaiApi, pods: list[dict[str, Any]]) -> None:
    body = {"workload_id": WORKLOAD, "name": "llm-serve", "org": "acme", "project": "team-a", "pods": pods}
    r = api.client.post(
        "/api/v2/admin/workloads", json=body, headers={"Authorization": f"Bearer {api.admin_key}"}
    )
    assert r.status_code in (200, 201), r.text
    api.prom.seen.clear()


def asked(api: RunaiApi) -> str:
    """Every query and series match sent, with the regex escapes of pod names undone."""
    text = "\n".join(f.get("query", "") + f.get("match[]", "") for f in api.prom.seen)
    return text.replace("\\\\-", "-").replace("\\-", "-")


def test_only_pods_alive_in_the_range_are_asked(runai: RunaiApi) -> None:
    # a Deployment's history: 1,000 pods that ended weeks before, and a few around the range
    history = [pod(f"llm-serve-old-{i}", "2025-12-01T00:00:00Z", "2025-12-02T00:00:00Z") for i in range(1000)]
    edges = [
        pod("ended-in-lookback", "2026-01-01T08:00:00Z", "2026-01-01T09:56:00Z"),  # 4 min before start
        pod("ended-an-hour-before", "2026-01-01T08:00:00Z", "2026-01-01T09:00:00Z"),
        pod("starts-after", "2026-01-01T11:30:00Z", None),
        pod("inside", "2026-01-01T10:10:00Z", "2026-01-01T10:20:00Z"),
        pod("no-times", None, None),
    ]
    add_pods(runai, history + edges)
    r = runai.client.get(f"/api/v1/workloads/{WORKLOAD}/metrics?{TYPES}&{WINDOW}", headers=runai.h())
    assert r.status_code == 200, r.text
    text = asked(runai)
    assert text, "no backend query was made"
    for name in ("llm-serve-0", "ended-in-lookback", "inside", "no-times"):  # llm-serve-0: running
        assert name in text, name
    for name in ("llm-serve-old-", "ended-an-hour-before", "starts-after"):
        assert name not in text, name


def test_more_pods_than_the_bound_is_a_clear_400(make_runai: Callable[..., RunaiApi]) -> None:
    api = make_runai(max_pods_per_query=3)
    add_pods(api, [pod(f"worker-{i}", "2026-01-01T09:30:00Z", None) for i in range(4)])  # + llm-serve-0
    r = api.client.get(f"/api/v1/workloads/{WORKLOAD}/metrics?{TYPES}&{WINDOW}", headers=api.h())
    assert r.status_code == 400, r.text
    body = r.json()
    assert body["code"] == 400
    assert "5 pods in this time range" in body["message"] and "at most 3" in body["message"]
    assert api.prom.seen == []  # refused before any backend call
    # a range before the workers started covers one pod: answered
    early = "start=2026-01-01T09:00:00Z&end=2026-01-01T09:20:00Z&numberOfSamples=4"
    r = api.client.get(f"/api/v1/workloads/{WORKLOAD}/metrics?{TYPES}&{early}", headers=api.h())
    assert r.status_code == 200, r.text
    assert "worker-" not in asked(api)


def test_one_pod_reads_are_not_bounded(make_runai: Callable[..., RunaiApi]) -> None:
    api = make_runai(max_pods_per_query=1)
    add_pods(api, [pod(f"worker-{i}", "2026-01-01T09:30:00Z", None) for i in range(3)])
    r = api.metrics(f"{TYPES}&{WINDOW}")
    assert r.status_code == 200, r.text


def test_setting_bounds(tmp_path: Any) -> None:
    assert Settings(data_dir=tmp_path).max_pods_per_query == 500
    with pytest.raises(ValueError, match="max_pods_per_query"):
        Settings(data_dir=tmp_path, max_pods_per_query=0)
