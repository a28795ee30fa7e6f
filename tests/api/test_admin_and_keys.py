"""Admin execution routes and the Lyceum API key routes."""

from __future__ import annotations

import time
import uuid
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from conftest import Api

ADMIN = "/api/v2/admin/executions"
KEYS = "/api/v2/external/auth/api-keys/"

EXAMPLE = {
    "execution_id": "3f1c2a9e-5b7d-4c11-9a0e-2d6f7b8c9d01",
    "org": "acme",
    "hostname": "gpu-node-1",
    "gpus": ["0", "3"],
    "status": "running",
    "start_time": "2026-11-28T10:00:00Z",
    "end_time": None,
    "hardware_profile": "gpu.h100",
    "execution_type": "gpu.h100",
    "file_name": "train.py",
}


def assert_422(response: Any, field: str | None = None) -> None:
    assert response.status_code == 422, response.text
    detail = response.json()["detail"]
    assert isinstance(detail, list)
    assert detail
    assert {"type", "loc", "msg"} <= set(detail[0])
    if field is not None:
        assert any(field in item["loc"] for item in detail), detail


# ---------------------------------------------------------------- register / update / list


def test_register_then_upsert(api: Api) -> None:
    response = api.client.post(ADMIN, json=EXAMPLE, headers=api.admin)
    assert response.status_code == 201, response.text
    body = response.json()
    assert body["execution_id"] == EXAMPLE["execution_id"]
    assert body["org"] == "acme"
    assert body["gpus"] == ["0", "3"]
    assert body["status"] == "running"
    assert body["start_time"] == "2026-11-28T10:00:00Z"
    assert body["end_time"] is None
    assert body["created_at"].endswith("Z")
    assert body["system_errors"] == []
    assert body["project"] is None

    update = {"execution_id": EXAMPLE["execution_id"], "org": "acme", "status": "completed"}
    response = api.client.post(
        ADMIN, json=update | {"end_time": "2026-11-28T12:30:00+01:00"}, headers=api.admin
    )
    assert response.status_code == 200, response.text
    again = response.json()
    assert again["status"] == "completed"
    assert again["end_time"] == "2026-11-28T11:30:00Z"
    assert again["file_name"] == "train.py"  # untouched
    assert again["created_at"] == body["created_at"]


def test_register_generates_a_uuid_and_defaults_to_pending(api: Api) -> None:
    body = api.register(hostname=None)
    assert uuid.UUID(body["execution_id"]).version == 4
    assert body["status"] == "pending"
    assert body["hostname"] is None
    assert body["gpus"] == []


def test_register_needs_an_admin_key(api: Api) -> None:
    response = api.client.post(ADMIN, json=EXAMPLE, headers=api.acme)
    assert response.status_code == 403
    assert isinstance(response.json()["detail"], str)
    response = api.client.post(ADMIN, json=EXAMPLE)
    assert response.status_code == 401
    assert response.json() == {"detail": "Not authenticated"}
    assert api.client.get(ADMIN, headers=api.acme).status_code == 403
    assert api.client.patch(f"{ADMIN}/x", json={"status": "failed"}, headers=api.acme).status_code == 403


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"gpus": ["0", "gpu0"]}, "gpus"),
        ({"gpus": ['GPU-abc"}']}, "gpus"),
        ({"gpus": ["12345"]}, "gpus"),
        ({"hostname": "-bad"}, "hostname"),
        ({"hostname": "node\n1"}, "hostname"),
        ({"hostname": "a" * 254}, "hostname"),
        ({"org": "Acme"}, "org"),
        ({"org": "-acme"}, "org"),
        ({"org": "a" * 64}, "org"),
        ({"execution_id": "a/b"}, "execution_id"),
        ({"execution_id": 'x"}'}, "execution_id"),
        ({"execution_id": ""}, "execution_id"),
        ({"execution_id": "x" * 129}, "execution_id"),
        ({"execution_id": "abc\n"}, "execution_id"),
        ({"status": "exploded"}, "status"),
        ({"start_time": "yesterday"}, "start_time"),
        ({"return_code": 2**40}, "return_code"),
        ({"surprise": 1}, "surprise"),
        ({"project": "a b"}, "project"),
        ({"user": "a b"}, "user"),
        ({"user": "-alice"}, "user"),
        ({"user": "a" * 129}, "user"),
    ],
)
def test_register_validation(api: Api, change: dict[str, Any], field: str) -> None:
    assert_422(api.client.post(ADMIN, json=EXAMPLE | change, headers=api.admin), field)


def test_who_ran_it_is_kept_changed_and_cleared(api: Api) -> None:
    body = api.register(execution_id="by-alice", user="alice@example.com", project="vision")
    assert (body["user"], body["project"]) == ("alice@example.com", "vision")
    assert api.registry.get_execution("by-alice").user == "alice@example.com"  # type: ignore[union-attr]
    moved = {"execution_id": "by-alice", "org": "acme", "user": "bob"}
    assert api.client.post(ADMIN, json=moved, headers=api.admin).json()["user"] == "bob"
    untouched = {"execution_id": "by-alice", "org": "acme", "status": "completed"}
    assert api.client.post(ADMIN, json=untouched, headers=api.admin).json()["user"] == "bob"
    cleared = {"execution_id": "by-alice", "org": "acme", "user": None}
    assert api.client.post(ADMIN, json=cleared, headers=api.admin).json()["user"] is None


def test_register_accepts_gpu_uuids_and_strict_ids(api: Api) -> None:
    gpus = ["GPU-0b5e1c2a-1111-2222-3333-444455556666", "MIG-7c1e2d3f-aaaa-bbbb-cccc-ddddeeeeffff", "7"]
    body = api.register(execution_id="run:2026.11_28-a", gpus=[*gpus, "7"])
    assert body["execution_id"] == "run:2026.11_28-a"
    assert body["gpus"] == gpus  # repeats dropped


def test_end_before_start_is_422(api: Api) -> None:
    response = api.client.post(ADMIN, json=EXAMPLE | {"end_time": "2026-11-28T09:00:00Z"}, headers=api.admin)
    assert_422(response, "end_time")
    api.register(**EXAMPLE)
    response = api.client.patch(
        f"{ADMIN}/{EXAMPLE['execution_id']}", json={"end_time": "2026-11-28T09:59:59Z"}, headers=api.admin
    )
    assert_422(response, "end_time")


def test_an_id_of_another_org_is_a_conflict(api: Api) -> None:
    api.register(**EXAMPLE)
    response = api.client.post(ADMIN, json=EXAMPLE | {"org": "beta"}, headers=api.admin)
    assert response.status_code == 409
    assert "another org" in response.json()["detail"]


def test_patch(api: Api) -> None:
    api.register(**EXAMPLE)
    url = f"{ADMIN}/{EXAMPLE['execution_id']}"
    response = api.client.patch(
        url,
        json={
            "status": "system_failure",
            "end_time": "2026-11-28T11:00:00.250+00:00",
            "return_code": 137,
            "system_errors": ["Xid 79: GPU has fallen off the bus"],
            "gpus": ["1"],
        },
        headers=api.admin,
    )
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["status"] == "system_failure"
    assert body["end_time"] == "2026-11-28T11:00:00.250Z"
    assert body["return_code"] == 137
    assert body["system_errors"] == ["Xid 79: GPU has fallen off the bus"]
    assert body["gpus"] == ["1"]
    assert body["hostname"] == "gpu-node-1"

    cleared = api.client.patch(url, json={"end_time": None, "status": "running"}, headers=api.admin).json()
    assert cleared["end_time"] is None
    assert cleared["return_code"] == 137

    assert api.client.patch(f"{ADMIN}/nope", json={"status": "failed"}, headers=api.admin).status_code == 404
    assert_422(api.client.patch(url, json={"status": None}, headers=api.admin), "status")
    assert_422(api.client.patch(url, json={"org": "beta"}, headers=api.admin), "org")
    assert_422(api.client.patch(url, json={"gpus": ["x"]}, headers=api.admin), "gpus")


def test_admin_list_and_get(api: Api) -> None:
    for i in range(3):
        api.register(
            execution_id=f"a{i}",
            status="running" if i % 2 else "completed",
            created_at=f"2026-11-0{i + 1}T00:00:00Z",
        )
    api.register(execution_id="b0", org="beta", created_at="2026-11-05T00:00:00Z")

    body = api.client.get(ADMIN, headers=api.admin).json()
    assert [e["execution_id"] for e in body["executions"]] == ["b0", "a2", "a1", "a0"]
    assert body["total"] == 4
    assert (body["limit"], body["offset"]) == (50, 0)

    body = api.client.get(ADMIN, params={"org": "acme", "limit": 1, "offset": 1}, headers=api.admin).json()
    assert [e["execution_id"] for e in body["executions"]] == ["a1"]
    assert body["total"] == 3

    body = api.client.get(
        ADMIN, params=[("status", "completed"), ("status", "pending")], headers=api.admin
    ).json()
    assert {e["execution_id"] for e in body["executions"]} == {"a0", "a2", "b0"}

    for params in (
        {"limit": 0},
        {"limit": 5000},
        {"offset": -1},
        {"limit": "x"},
        {"status": "nope"},
        {"org": "A"},
    ):
        assert_422(api.client.get(ADMIN, params=params, headers=api.admin))

    one = api.client.get(f"{ADMIN}/b0", headers=api.admin)
    assert one.status_code == 200
    assert one.json()["org"] == "beta"
    assert api.client.get(f"{ADMIN}/zzz", headers=api.admin).status_code == 404


# ---------------------------------------------------------------- API keys


def test_list_keys_shows_only_the_callers_org(api: Api) -> None:
    response = api.client.get(KEYS, headers=api.acme)
    assert response.status_code == 200
    items = response.json()
    assert len(items) == 1
    item = items[0]
    assert set(item) == {
        "id",
        "key_name",
        "key_prefix",
        "is_active",
        "last_used_at",
        "expires_at",
        "created_at",
    }
    assert item["key_name"] == "acme"
    assert item["key_prefix"] == api.acme_key[:8]
    assert item["is_active"] is True
    assert item["last_used_at"].endswith("Z")  # this very request used it
    assert item["expires_at"] is None


def test_create_use_toggle_and_revoke_a_key(api: Api) -> None:
    response = api.client.post(
        KEYS, json={"key_name": "laptop", "expires_at": "2099-01-01T00:00:00+02:00"}, headers=api.acme
    )
    assert response.status_code == 200, response.text  # what the official CLI expects
    created = response.json()
    assert set(created) == {"id", "key_name", "api_key", "key_prefix", "expires_at", "created_at"}
    assert created["api_key"].startswith("lk_")
    assert created["key_prefix"] == created["api_key"][:8]
    assert created["expires_at"] == "2098-12-31T22:00:00Z"
    new = api.bearer(created["api_key"])

    stored = api.registry.get_key(created["id"])
    assert stored is not None
    assert stored.org == "acme"
    assert not stored.is_admin
    listed = api.client.get(KEYS, headers=new).json()
    assert {k["key_name"] for k in listed} == {"acme", "laptop"}
    assert all("api_key" not in k for k in listed)

    toggled = api.client.patch(f"{KEYS}{created['id']}/toggle", headers=api.acme)
    assert toggled.status_code == 200
    assert toggled.json()["is_active"] is False
    refused = api.client.get(KEYS, headers=new)
    assert refused.status_code == 401
    assert refused.json() == {"detail": "API key is inactive"}
    assert api.client.patch(f"{KEYS}{created['id']}/toggle", headers=api.acme).json()["is_active"] is True
    assert api.client.get(KEYS, headers=new).status_code == 200

    deleted = api.client.delete(f"{KEYS}{created['id']}", headers=api.acme)
    assert deleted.status_code == 200
    assert deleted.json()["id"] == created["id"]
    assert api.client.get(KEYS, headers=new).json() == {"detail": "API key has been revoked"}
    assert [k["key_name"] for k in api.client.get(KEYS, headers=api.acme).json()] == ["acme"]
    assert api.client.delete(f"{KEYS}{created['id']}", headers=api.acme).status_code == 404


def test_create_key_validation(api: Api) -> None:
    assert_422(api.client.post(KEYS, json={}, headers=api.acme), "key_name")
    assert_422(api.client.post(KEYS, json={"key_name": ""}, headers=api.acme), "key_name")
    assert_422(
        api.client.post(KEYS, json={"key_name": "x", "expires_at": "soon"}, headers=api.acme), "expires_at"
    )
    past = api.client.post(
        KEYS, json={"key_name": "x", "expires_at": "2001-01-01T00:00:00Z"}, headers=api.acme
    )
    assert_422(past, "expires_at")


def test_keys_of_other_orgs_and_admin_keys_are_not_found(api: Api) -> None:
    beta_id = api.client.get(KEYS, headers=api.beta).json()[0]["id"]
    assert api.client.delete(f"{KEYS}{beta_id}", headers=api.acme).json() == {"detail": "API key not found"}
    assert api.client.patch(f"{KEYS}{beta_id}/toggle", headers=api.acme).status_code == 404
    assert api.client.get(KEYS, headers=api.beta).status_code == 200  # untouched

    admin_key, _ = api.registry.create_key("acme", name="acme-admin", is_admin=True)
    assert [k["key_name"] for k in api.client.get(KEYS, headers=api.acme).json()] == ["acme"]
    assert api.client.delete(f"{KEYS}{admin_key.key_id}", headers=api.acme).status_code == 404
    assert api.client.delete(f"{KEYS}{'x' * 65}", headers=api.acme).status_code == 422


def test_project_limited_keys_create_keys_no_broader(api: Api) -> None:
    _, limited = api.registry.create_key("acme", name="vision-only", projects=["vision"])
    listed = api.client.get(KEYS, headers=api.bearer(limited)).json()
    assert [k["key_name"] for k in listed] == ["vision-only"]  # the org-wide key is out of its reach
    created = api.client.post(KEYS, json={"key_name": "child"}, headers=api.bearer(limited)).json()
    child = api.registry.get_key(created["id"])
    assert child is not None
    assert child.projects == frozenset({"vision"})


def test_validate(api: Api) -> None:
    response = api.client.post(f"{KEYS}validate", headers=api.acme)
    assert response.status_code == 200
    body = response.json()
    assert body["valid"] is True
    assert body["org"] == "acme"
    assert body["key_prefix"] == api.acme_key[:8]
    bad = api.client.post(f"{KEYS}validate", headers=api.bearer("lk_" + "0" * 43))
    assert bad.status_code == 401
    assert bad.json() == {"detail": "Invalid API key"}
    assert bad.headers["www-authenticate"] == "Bearer"
    jwt_body = api.client.post(f"{KEYS}validate", headers=api.bearer(api.jwt())).json()
    assert jwt_body == {
        "valid": True,
        "org": "acme",
        "subject": "user-1",
        "is_admin": False,
        "key_prefix": None,
        "expires_at": None,
    }


def test_jwt_callers(api: Api) -> None:
    token = api.jwt(orgs=["acme", "beta"])
    assert api.client.get(KEYS, headers=api.bearer(token, "beta")).json()[0]["key_name"] == "beta"
    forbidden = api.client.get(KEYS, headers=api.bearer(token, "gamma"))
    assert forbidden.status_code == 403
    assert isinstance(forbidden.json()["detail"], str)
    expired = api.client.get(KEYS, headers=api.bearer(api.jwt(exp=int(time.time()) - 3600)))
    assert expired.status_code == 401
    assert expired.json() == {"detail": "Token has expired"}
    garbage = api.client.get(KEYS, headers=api.bearer("garbage"))
    assert garbage.status_code == 401
    assert isinstance(garbage.json()["detail"], str)
    # API keys ignore X-Org-Slug: the key's org wins.
    assert api.client.get(KEYS, headers=api.bearer(api.acme_key, "beta")).json()[0]["key_name"] == "acme"
