"""Run:ai metrics query parameters: ASCII digits only, and the one range of timestamps (400, before any
backend call)."""

from __future__ import annotations

import pytest

from tests.api.runai.conftest import WORKLOAD, RunaiApi

START = "2026-01-01T10:00:00Z"
END = "2026-01-01T11:00:00Z"


@pytest.mark.parametrize(
    ("name", "start", "end"),
    [
        ("end", START, "9999-12-31T23:59:59Z"),  # was a 502 with Prometheus' int64 error text
        ("end", START, "2262-01-01T00:00:00Z"),
        ("end", START, "253402300799"),
        ("start", "1900-01-01T00:00:00Z", END),
        ("start", "0001-01-01T00:00:00Z", END),
        ("start", "-1", END),
        ("start", "１７６７２６０４００", END),  # fullwidth digits: float() takes them
        ("start", "1_767_260_400", END),  # underscores: float() takes them too
        ("end", START, "١٧٦٧٢٦٤٠٠٠"),  # Arabic-Indic digits
    ],
)
def test_bad_or_out_of_range_times_are_400_without_a_backend_call(
    runai: RunaiApi, name: str, start: str, end: str
) -> None:
    query = f"metricType=GPU_UTILIZATION&start={start}&end={end}"
    pod = runai.metrics(query)
    workload = runai.client.get(f"/api/v1/workloads/{WORKLOAD}/metrics?{query}", headers=runai.h())
    for r in (pod, workload):
        assert r.status_code == 400, r.text
        body = r.json()
        assert body["code"] == 400 and f"Invalid {name}" in body["message"] + body.get("details", "")
    assert runai.prom.seen == []


def test_the_last_accepted_end_reaches_the_backend(runai: RunaiApi) -> None:
    r = runai.metrics(f"metricType=GPU_UTILIZATION&start={START}&end=2261-12-31T23:59:59.999Z")
    assert r.status_code == 200, r.text
    assert runai.prom.seen
