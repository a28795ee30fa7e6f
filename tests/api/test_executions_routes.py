"""Lyceum execution routes (`/execution/{id}`, `/workloads/list`, `/billing/history`); the installed
`lyceum` CLI against them is tests/integration/test_lyceum_cli.py."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from conftest import Api

DETAIL_FIELDS = {
    "execution_id",
    "status",
    "hostname",
    "gpus",
    "file_name",
    "hardware_profile",
    "execution_type",
    "return_code",
    "created_at",
    "start_time",
    "end_time",
    "job_start",
    "job_end",
    "system_errors",
    "billed",
    "status_details",
}


def seed(api: Api) -> None:
    """acme: r0 running, p1 pending, c2 completed, s3 starting, v4 running in project vision; beta: b0."""
    rows: list[dict[str, Any]] = [
        {"execution_id": "r0", "status": "running"},
        {"execution_id": "p1", "status": "pending", "hostname": None},
        {"execution_id": "c2", "status": "completed", "end_time": "2026-11-28T11:00:00Z", "return_code": 0},
        {"execution_id": "s3", "status": "starting"},
        {"execution_id": "v4", "status": "running", "project": "vision"},
    ]
    for i, row in enumerate(rows):
        api.register(start_time="2026-11-28T10:00:00Z", created_at=f"2026-11-28T0{i}:00:00Z", **row)
    api.register(execution_id="b0", org="beta", status="running", created_at="2026-11-28T09:00:00Z")


def test_execution_detail(api: Api) -> None:
    api.register(
        execution_id="e-1",
        gpus=["0", "3"],
        status="failed",
        start_time="2026-11-28T10:00:00+01:00",
        end_time="2026-11-28T10:30:00.5Z",
        hardware_profile="gpu.h100",
        execution_type="gpu.h100",
        file_name="train.py",
        return_code=1,
        system_errors=["CUDA error: out of memory"],
    )
    response = api.client.get("/api/v2/external/execution/e-1", headers=api.acme)
    assert response.status_code == 200
    body = response.json()
    assert set(body) == DETAIL_FIELDS
    assert body["execution_id"] == "e-1"
    assert body["status"] == "failed"
    assert body["hostname"] == "gpu-node-1"
    assert body["gpus"] == ["0", "3"]
    assert body["start_time"] == body["job_start"] == "2026-11-28T09:00:00Z"
    assert body["end_time"] == body["job_end"] == "2026-11-28T10:30:00.500Z"
    assert body["return_code"] == 1
    assert body["system_errors"] == ["CUDA error: out of memory"]
    assert body["billed"] is None
    assert body["status_details"] == "CUDA error: out of memory"
    assert body["created_at"].endswith("Z")


def test_other_orgs_and_unknown_ids_look_the_same(api: Api) -> None:
    seed(api)
    for path in ("b0", "nope", "bad%20id", "x" * 200):
        response = api.client.get(f"/api/v2/external/execution/{path}", headers=api.acme)
        assert response.status_code == 404, path
        assert response.json() == {"detail": "Execution not found"}
    assert api.client.get("/api/v2/external/execution/b0", headers=api.beta).status_code == 200
    # The platform's admin key sees every org's executions.
    assert api.client.get("/api/v2/external/execution/b0", headers=api.admin).json()["execution_id"] == "b0"


def test_project_limited_keys(api: Api) -> None:
    seed(api)
    _, vision = api.registry.create_key("acme", name="v", projects=["vision"])
    _, nlp = api.registry.create_key("acme", name="n", projects=["nlp"])
    assert api.client.get("/api/v2/external/execution/v4", headers=api.bearer(vision)).status_code == 200
    refused = api.client.get("/api/v2/external/execution/v4", headers=api.bearer(nlp))
    assert refused.status_code == 403
    assert isinstance(refused.json()["detail"], str)
    # Executions without a project are visible to every key of the org.
    assert api.client.get("/api/v2/external/execution/r0", headers=api.bearer(nlp)).status_code == 200
    listed = api.client.get("/api/v2/external/workloads/list", headers=api.bearer(nlp)).json()
    assert "v4" not in [e["execution_id"] for e in listed]


def test_unauthenticated(api: Api) -> None:
    for path in (
        "/api/v2/external/execution/x",
        "/api/v2/external/workloads/list",
        "/api/v2/external/billing/history",
    ):
        response = api.client.get(path)
        assert response.status_code == 401
        assert response.json() == {"detail": "Not authenticated"}
        bad = api.client.get(path, headers=api.bearer("lk_" + "z" * 43))
        assert bad.status_code == 401
        assert bad.json() == {"detail": "Invalid API key"}


def test_workloads_list(api: Api) -> None:
    seed(api)
    response = api.client.get("/api/v2/external/workloads/list", headers=api.acme)
    assert response.status_code == 200
    body = response.json()
    assert isinstance(body, list)
    assert [e["execution_id"] for e in body] == ["v4", "s3", "p1", "r0"]  # active only, newest first
    assert set(body[0]) == DETAIL_FIELDS
    assert [
        e["execution_id"] for e in api.client.get("/api/v2/external/workloads/list", headers=api.beta).json()
    ] == ["b0"]


def test_billing_history(api: Api) -> None:
    seed(api)
    response = api.client.get("/api/v2/external/billing/history", headers=api.acme)
    assert response.status_code == 200
    body = response.json()
    assert set(body) == {
        "executions",
        "total_executions",
        "total_credits_spent",
        "limit",
        "offset",
        "counts_by_status",
    }
    assert [e["execution_id"] for e in body["executions"]] == ["v4", "s3", "c2", "p1", "r0"]
    assert body["total_executions"] == 5
    assert body["total_credits_spent"] == 0
    assert (body["limit"], body["offset"]) == (50, 0)
    assert body["counts_by_status"]["running"] == 2
    assert body["counts_by_status"]["completed"] == 1
    assert body["counts_by_status"]["aborted"] == 0
    assert set(body["executions"][0]) == DETAIL_FIELDS

    page = api.client.get("/api/v2/external/billing/history?limit=2&offset=1", headers=api.acme).json()
    assert [e["execution_id"] for e in page["executions"]] == ["s3", "c2"]
    assert page["total_executions"] == 5
    assert (page["limit"], page["offset"]) == (2, 1)


@pytest.mark.parametrize(
    "query", ["limit=0", "limit=-1", "limit=abc", "limit=100000", "offset=-1", "offset=x"]
)
def test_billing_history_bad_paging_is_422(api: Api, query: str) -> None:
    response = api.client.get(f"/api/v2/external/billing/history?{query}", headers=api.acme)
    assert response.status_code == 422
    detail = response.json()["detail"]
    assert detail[0]["loc"][0] == "query"
    assert detail[0]["loc"][1] == query.split("=", maxsplit=1)[0]


def test_billing_history_filters_by_the_usage_keys_and_window(api: Api) -> None:
    """The usage page links a row to its executions with these filters (docs/usage.md)."""
    rows: list[dict[str, Any]] = [
        # id, user, project, host, profile, start, end
        {"execution_id": "a", "user": "alice", "project": "nlp", "hardware_profile": "gpu.h100"},
        {"execution_id": "b", "user": "alice", "project": "vision", "hostname": "gpu-node-2"},
        {"execution_id": "c", "user": "bob", "project": "nlp", "end_time": "2026-11-28T12:00:00Z"},
        {
            "execution_id": "d",
            "project": "nlp",
            "start_time": "2026-11-29T10:00:00Z",
            "end_time": "2026-11-29T12:00:00Z",
        },
    ]
    for i, row in enumerate(rows):
        row.setdefault("start_time", "2026-11-28T10:00:00Z")
        row.setdefault("end_time", "2026-11-28T20:00:00Z")
        api.register(status="completed", created_at=f"2026-11-28T0{i}:00:00Z", **row)
    api.register(execution_id="p", status="pending", user="alice", created_at="2026-11-28T08:00:00Z")
    api.register(
        execution_id="x", org="beta", status="completed", user="alice", start_time="2026-11-28T10:00:00Z"
    )

    def ids(**params: str) -> list[str]:
        r = api.client.get("/api/v2/external/billing/history", params=params, headers=api.acme)
        assert r.status_code == 200, r.text
        body = r.json()
        listed = [e["execution_id"] for e in body["executions"]]
        assert body["total_executions"] == len(listed) == sum(body["counts_by_status"].values())
        return listed

    assert ids() == ["p", "d", "c", "b", "a"]
    assert ids(user="alice") == ["p", "b", "a"]  # never another org's
    assert ids(user="alice", project="nlp") == ["a"]
    assert ids(user="") == ["d"]  # empty: those without a user
    assert ids(project="nlp", user="bob") == ["c"]
    assert ids(hostname="gpu-node-2") == ["b"]
    assert ids(hardware_profile="gpu.h100") == ["a"]
    assert ids(hardware_profile="") == ["p", "d", "c", "b"]
    # the window: ran in [start, end) (a pending execution without a start never did)
    assert ids(start="2026-11-28T13:00:00Z", end="2026-11-29T00:00:00Z") == ["b", "a"]
    assert ids(start="2026-11-28T11:00:00Z", end="2026-11-28T12:00:00Z") == ["c", "b", "a"]
    assert ids(start="2026-11-29T00:00:00Z") == ["d"]
    assert ids(end="2026-11-28T10:00:00Z") == []
    assert ids(user="nobody") == []
    # a project-limited key sees only its projects' executions, whatever it asks
    _, vision = api.registry.create_key("acme", name="v", projects=["vision"])
    r = api.client.get(
        "/api/v2/external/billing/history", params={"project": "nlp"}, headers=api.bearer(vision)
    )
    assert r.json()["executions"] == []
    for bad in ({"user": "-x"}, {"hostname": "a b"}, {"start": "yesterday"}, {"hardware_profile": "p" * 256}):
        r = api.client.get("/api/v2/external/billing/history", params=bad, headers=api.acme)
        assert r.status_code == 422, bad
