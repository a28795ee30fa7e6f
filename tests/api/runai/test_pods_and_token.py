"""Run:ai sibling routes (`GET /api/v1/workloads/{id}/pods`, `POST /api/v1/token`), admin workload routes."""

from __future__ import annotations

import os
import stat
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio
import httpx
import jwt
import pytest

from gpulens.api.app import create_app
from gpulens.backends.prometheus import PrometheusBackend
from gpulens.config import Settings
from gpulens.domain.errors import Unauthenticated
from gpulens.service.auth import ISSUED_KID, SECRET_FILE, TokenIssuer, load_or_create_secret
from gpulens.storage.registry import Registry
from tests.api.conftest import JWT_SECRET, Client, user_jwt

W = "3f2b8c1e-5a4d-4e6f-9b7a-1c2d3e4f5a6b"
W_OTHER = "9a8b7c6d-5e4f-4a3b-8c2d-1e0f9a8b7c6d"
P0, P1, P2 = "7e1d2c3b-4a59-4687-8b9c-0d1e2f3a4b5c", str(uuid.uuid4()), str(uuid.uuid4())
PROM = "http://prometheus.invalid:9090"


def unused_backend() -> PrometheusBackend:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise AssertionError(f"these routes never query the backend: {request.url}")

    return PrometheusBackend(PROM, httpx.Client(transport=httpx.MockTransport(refuse)))


@dataclass
class Api:
    client: Client
    registry: Registry
    data_dir: Path
    admin_key: str
    acme_key: str
    beta_key: str
    limited_key: str

    @staticmethod
    def h(token: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {token}"}

    def pods(self, workload: str = W, token: str | None = None, query: str = "") -> httpx.Response:
        return self.client.get(
            f"/api/v1/workloads/{workload}/pods{query}", headers=self.h(token or self.acme_key)
        )

    def token(self, **body: Any) -> httpx.Response:
        return self.client.post("/api/v1/token", json=body)

    def register(self, body: dict[str, Any]) -> httpx.Response:
        return self.client.post("/api/v2/admin/workloads", json=body, headers=self.h(self.admin_key))


def workload_body(workload_id: str = W, **kw: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "workload_id": workload_id,
        "name": "llm-serve",
        "org": "acme",
        "project": "team-a",
        "pods": [
            {"pod_id": P0, "name": "llm-serve-0", "namespace": "team-a", "node": "gpu-node-1",
             "gpus": ["0", "1"], "start_time": "2026-01-01T09:00:00Z", "end_time": None, "phase": "Running"},
            {"pod_id": P1, "name": "llm-serve-1", "namespace": "team-a", "node": "gpu-node-2",
             "gpus": [], "start_time": "2026-01-01T10:00:00+01:00", "end_time": "2026-01-01T11:30:00Z"},
            {"pod_id": P2, "name": "llm-serve-2", "namespace": "team-a"},
        ],
    }  # fmt: skip
    body.update(kw)
    return body


@pytest.fixture
def make_api(tmp_path: Path, make_registry: Callable[[], Registry]) -> Callable[..., Api]:
    def build(data_dir: Path | None = None, registry: Registry | None = None, **settings: Any) -> Api:
        if registry is None:
            registry = make_registry()
        conf = Settings(data_dir=data_dir or tmp_path, prometheus_url=PROM, **settings)
        client = Client(create_app(conf, registry=registry, backend=unused_backend()))
        keys = [
            registry.create_key(org, name=name, is_admin=org == "platform", projects=projects)[1]
            for org, name, projects in (
                ("platform", "svc", None),
                ("acme", "acme-ci", None),
                ("beta", "beta", None),
                ("acme", "limited", ["team-z"]),
            )
        ]
        return Api(client, registry, conf.data_dir, *keys)

    return build


@pytest.fixture
def api(make_api: Callable[..., Api]) -> Api:
    built = make_api(jwt_secret=JWT_SECRET)
    assert built.register(workload_body()).status_code == 201
    other = workload_body(W_OTHER, name="other", project="team-b", pods=[])
    assert built.register(other).status_code == 201
    return built


# ------------------------------------------------------------------ admin routes


def test_admin_registration_creates_then_updates(api: Api) -> None:
    r = api.register(workload_body(name="renamed"))
    assert r.status_code == 200
    body = r.json()
    assert body["name"] == "renamed" and body["workload_id"] == W and len(body["pods"]) == 3
    first = body["pods"][0]
    assert first == {
        "pod_id": P0, "workload_id": W, "name": "llm-serve-0", "namespace": "team-a", "node": "gpu-node-1",
        "gpus": ["0", "1"], "phase": "Running", "start_time": "2026-01-01T09:00:00Z", "end_time": None,
    }  # fmt: skip
    assert body["pods"][1]["start_time"] == "2026-01-01T09:00:00Z"  # stored in UTC
    assert body["pods"][1]["phase"] == "Succeeded" and body["pods"][2]["phase"] == "Pending"

    listing = api.client.get("/api/v2/admin/workloads?org=acme", headers=api.h(api.admin_key)).json()
    assert listing["total"] == 2 and {w["workload_id"] for w in listing["workloads"]} == {W, W_OTHER}
    pods = api.client.get(f"/api/v2/admin/workloads/{W}/pods?limit=2", headers=api.h(api.admin_key)).json()
    assert pods["total"] == 3 and [p["pod_id"] for p in pods["pods"]] == [P0, P1]


@pytest.mark.parametrize(
    "change",
    [
        {"org": "Not-A-Slug"},
        {"workload_id": "not-a-uuid"},
        {"name": ""},
        {"project": "a b"},
        {"pods": [{"name": "x", "namespace": "Team_A"}]},
        {"pods": [{"name": "Bad_Name", "namespace": "ns"}]},
        {"pods": [{"name": "x", "namespace": "ns", "node": "bad node"}]},
        {"pods": [{"name": "x", "namespace": "ns", "gpus": ["zero"]}]},
        {"pods": [{"name": "x", "namespace": "ns", "phase": "Sleeping"}]},
        {"pods": [{"name": "x", "namespace": "ns", "extra": 1}]},
        {
            "pods": [
                {
                    "name": "x",
                    "namespace": "ns",
                    "start_time": "2026-01-02T00:00:00Z",
                    "end_time": "2026-01-01",
                }
            ]
        },
    ],
)
def test_admin_registration_validates(api: Api, change: dict[str, Any]) -> None:
    body = workload_body(str(uuid.uuid4()))
    body.update(change)
    r = api.register(body)
    assert r.status_code == 422, r.text
    assert isinstance(r.json()["detail"], list)


def test_admin_routes_need_an_admin(api: Api) -> None:
    r = api.client.post("/api/v2/admin/workloads", json=workload_body(), headers=api.h(api.acme_key))
    assert r.status_code == 403 and "detail" in r.json()
    assert api.client.post("/api/v2/admin/workloads", json=workload_body()).status_code == 401
    r = api.register(workload_body(org="beta"))  # an existing id of another org
    assert r.status_code == 409


def test_admin_patch_pod(api: Api) -> None:
    url = f"/api/v2/admin/workloads/{W}/pods/{P0}"
    r = api.client.patch(url, json={"end_time": "2026-01-01T12:00:00Z", "phase": "Failed", "gpus": ["3"]},
                         headers=api.h(api.admin_key))  # fmt: skip
    assert r.status_code == 200, r.text
    assert (r.json()["end_time"], r.json()["phase"], r.json()["gpus"]) == (
        "2026-01-01T12:00:00Z",
        "Failed",
        ["3"],
    )
    assert r.json()["node"] == "gpu-node-1"  # untouched
    bad = api.client.patch(url, json={"phase": "Nope"}, headers=api.h(api.admin_key))
    assert bad.status_code == 422
    before = api.client.patch(url, json={"end_time": "2025-01-01T00:00:00Z"}, headers=api.h(api.admin_key))
    assert before.status_code == 422 and before.json()["detail"][0]["loc"] == ["body", "end_time"]
    other = f"/api/v2/admin/workloads/{W_OTHER}/pods/{P0}"
    assert api.client.patch(other, json={"node": "n"}, headers=api.h(api.admin_key)).status_code == 404
    notuuid = f"/api/v2/admin/workloads/{W}/pods/nope"
    assert api.client.patch(notuuid, json={"node": "n"}, headers=api.h(api.admin_key)).status_code == 400
    assert api.client.patch(url, json={"node": "n"}, headers=api.h(api.acme_key)).status_code == 403


# ------------------------------------------------------------------ GET /api/v1/workloads/{id}/pods


def test_list_pods(api: Api) -> None:
    r = api.pods()
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    body = r.json()
    assert set(body) == {"pods"}  # one page: no `next`
    p0, p1, p2 = body["pods"]
    assert p0 == {
        "id": P0, "name": "llm-serve-0", "workloadId": W, "workloadName": "llm-serve",
        "projectName": "team-a", "namespace": "team-a", "nodeName": "gpu-node-1", "k8sPhase": "Running",
        "createdAt": "2026-01-01T09:00:00Z", "startedAt": "2026-01-01T09:00:00Z", "gpus": ["0", "1"],
        "clusterId": p0["clusterId"], "tenantId": 0, "priorityClassName": "", "containers": [],
        "updatedAt": "2026-01-01T09:00:00Z", "k8sPhaseUpdatedAt": "2026-01-01T09:00:00Z",
    }  # fmt: skip
    assert uuid.UUID(p0["clusterId"])
    assert p1["completedAt"] == "2026-01-01T11:30:00Z" and p1["k8sPhase"] == "Succeeded"
    assert p1["updatedAt"] == "2026-01-01T11:30:00Z" and p1["gpus"] == []
    assert p2["k8sPhase"] == "Pending" and "startedAt" not in p2 and "nodeName" not in p2
    assert api.pods(W.upper()).json() == body


def test_list_pods_pages(api: Api) -> None:
    first = api.pods(query="?limit=2").json()
    assert [p["id"] for p in first["pods"]] == [P0, P1] and first["next"] == 2
    last = api.pods(query="?offset=2&limit=2").json()
    assert [p["id"] for p in last["pods"]] == [P2] and "next" not in last
    assert api.pods(query="?offset=10").json() == {"pods": []}
    assert api.pods(W_OTHER).json() == {"pods": []}  # a workload without pods (team-b: acme sees all)


@pytest.mark.parametrize("query", ["?limit=0", "?limit=501", "?offset=-1", "?limit=abc"])
def test_bad_paging_is_400(api: Api, query: str) -> None:
    r = api.pods(query=query)
    assert r.status_code == 400
    assert r.json()["code"] == 400 and isinstance(r.json()["message"], str)


def test_access_rules(api: Api) -> None:
    r = api.client.get(f"/api/v1/workloads/{W}/pods")
    assert r.status_code == 401 and r.json()["code"] == 401 and r.json()["message"]
    r = api.pods(token="lk_not-a-real-key-at-all")
    assert r.status_code == 401 and r.json()["code"] == 401
    r = api.pods(token=api.beta_key)  # another org: as if it did not exist
    assert r.status_code == 404 and r.json() == {"code": 404, "message": "Resource id not found."}
    assert api.pods(str(uuid.uuid4())).status_code == 404
    r = api.pods(token=api.limited_key)
    assert r.status_code == 403 and r.json()["message"] == "You do not have sufficient permissions."
    r = api.pods("not-a-uuid")
    assert r.status_code == 400 and r.json() == {"code": 400, "message": "workloadId must be a UUID"}
    assert api.pods(token=api.admin_key).status_code == 200
    assert api.pods(token=user_jwt(orgs=["acme"])).status_code == 200
    assert api.pods(token=user_jwt(orgs=["beta"])).status_code == 404


# ------------------------------------------------------------------ POST /api/v1/token


def prefix(key: str) -> str:
    return key[:8]


def test_client_credentials_grant(api: Api) -> None:
    r = api.token(grantType="client_credentials", clientID=prefix(api.acme_key), clientSecret=api.acme_key)
    assert r.status_code == 200, r.text
    body = r.json()
    assert set(body) == {"accessToken", "refreshToken", "expiresIn"} and body["expiresIn"] == 3600
    header = jwt.get_unverified_header(body["accessToken"])
    assert header["alg"] == "HS256" and header["kid"] == ISSUED_KID
    claims = jwt.decode(body["accessToken"], options={"verify_signature": False})
    assert claims["iss"] == "gpulens" and claims["sub"] == prefix(api.acme_key) and claims["orgs"] == ["acme"]
    assert claims["exp"] - claims["iat"] == 3600 and "projects" not in claims and "admin" not in claims
    # signed with the configured secret
    jwt.decode(body["accessToken"], JWT_SECRET, algorithms=["HS256"], issuer="gpulens")
    # the issued token authenticates on the Run:ai and Lyceum routes
    assert api.pods(token=body["accessToken"]).status_code == 200
    lyceum = api.client.get("/api/v2/external/workloads/list", headers=api.h(body["accessToken"]))
    assert lyceum.status_code == 200


def test_app_token_grant_with_runapy_spellings(api: Api) -> None:
    r = api.token(grantType="app_token", AppId="acme-ci", AppSecret=api.acme_key)  # the key's name as id
    assert r.status_code == 200, r.text
    assert api.pods(token=r.json()["accessToken"]).status_code == 200
    r = api.token(grantType="app_token", appID=prefix(api.acme_key), appSecret=api.acme_key)
    assert r.status_code == 200
    r = api.client.post("/api/v1/token", json={"grant_type": "client_credentials", "client_id": "acme-ci",
                                               "client_secret": api.acme_key})  # fmt: skip
    assert r.status_code == 200


def test_limited_and_admin_keys_carry_their_rights(api: Api) -> None:
    limited = api.token(
        grantType="client_credentials", clientID="limited", clientSecret=api.limited_key
    ).json()
    claims = jwt.decode(limited["accessToken"], options={"verify_signature": False})
    assert claims["projects"] == ["team-z"]
    assert api.pods(token=limited["accessToken"]).status_code == 403
    admin = api.token(grantType="client_credentials", clientID="svc", clientSecret=api.admin_key).json()
    assert jwt.decode(admin["accessToken"], options={"verify_signature": False})["admin"] is True
    assert api.pods(token=admin["accessToken"]).status_code == 200


@pytest.mark.parametrize(
    "body",
    [
        {"grantType": "client_credentials", "clientID": "acme-ci", "clientSecret": "lk_wrong-secret-0000000"},
        {"grantType": "client_credentials", "clientID": "someone-else", "clientSecret": "<acme>"},
        {"grantType": "client_credentials", "clientID": "acme-ci", "clientSecret": "not-a-key"},
        {"grantType": "client_credentials", "clientID": "beta", "clientSecret": "<acme>"},
        {"grantType": "refresh_token", "refreshToken": "not.a.token"},
    ],
)
def test_bad_credentials_are_401(api: Api, body: dict[str, str]) -> None:
    body = {k: api.acme_key if v == "<acme>" else v for k, v in body.items()}
    r = api.token(**body)
    assert r.status_code == 401
    assert r.json()["code"] == 401 and isinstance(r.json()["message"], str)


@pytest.mark.parametrize(
    "body",
    [
        {"grantType": "client_credentials", "clientID": "acme-ci"},
        {"grantType": "refresh_token"},
        {"clientID": "acme-ci", "clientSecret": "lk_x"},
        {"grantType": "password", "username": "u", "password": "p"},
    ],
)
def test_incomplete_or_unsupported_requests_are_400(api: Api, body: dict[str, str]) -> None:
    r = api.token(**body)
    assert r.status_code == 400 and r.json()["code"] == 400


def test_non_json_body_is_400(api: Api) -> None:
    r = api.client.post("/api/v1/token", content=b"grantType=client_credentials")
    assert r.status_code == 400 and r.json()["code"] == 400


def test_refresh_grant(api: Api) -> None:
    first = api.token(grantType="client_credentials", clientID="acme-ci", clientSecret=api.acme_key).json()
    r = api.token(grantType="refresh_token", refreshToken=first["refreshToken"])
    assert r.status_code == 200
    assert api.pods(token=r.json()["accessToken"]).status_code == 200
    # neither kind stands in for the other
    assert api.token(grantType="refresh_token", refreshToken=first["accessToken"]).status_code == 401
    assert api.pods(token=first["refreshToken"]).status_code == 401


def test_issued_tokens_die_with_their_key(api: Api) -> None:
    issued = api.token(grantType="client_credentials", clientID="acme-ci", clientSecret=api.acme_key).json()
    key = next(k for k in api.registry.list_keys("acme") if k.name == "acme-ci")
    api.registry.revoke_key(key.key_id)
    r = api.pods(token=issued["accessToken"])
    assert r.status_code == 401 and r.json()["details"] == "API key has been revoked"
    assert api.token(grantType="refresh_token", refreshToken=issued["refreshToken"]).status_code == 401
    again = api.token(grantType="client_credentials", clientID="acme-ci", clientSecret=api.acme_key)
    assert again.status_code == 401


def test_without_a_configured_secret_one_is_made_and_kept(
    make_api: Callable[..., Api], tmp_path: Path
) -> None:
    data = tmp_path / "data"
    api = make_api(data_dir=data)
    assert not (data / SECRET_FILE).exists()  # nothing written until a token is issued
    r = api.token(grantType="client_credentials", clientID="acme-ci", clientSecret=api.acme_key)
    assert r.status_code == 200
    secret = data / SECRET_FILE
    assert stat.S_IMODE(os.stat(secret).st_mode) == 0o600
    assert api.register(workload_body()).status_code == 201
    access = r.json()["accessToken"]
    assert api.pods(token=access).status_code == 200
    # another process on the same data_dir and registry accepts it too
    same = make_api(data_dir=data, registry=api.registry)
    assert same.pods(token=access).status_code == 200
    # a user JWT is still refused: JWT authentication is not configured
    assert api.pods(token=user_jwt()).status_code == 401


def test_a_forged_kid_does_not_pass(api: Api) -> None:
    forged = jwt.encode({"sub": "x", "iss": "gpulens", "typ": "access", "key_id": "k", "exp": 2**40,
                         "iat": 0, "orgs": ["acme"]}, "x" * 40, algorithm="HS256",
                        headers={"kid": ISSUED_KID})  # fmt: skip
    assert api.pods(token=forged).status_code == 401


def test_issuer_refuses_expired_tokens(tmp_path: Path, registry: Registry) -> None:
    key, _ = registry.create_key("acme", name="k")
    past = TokenIssuer(registry, Settings(data_dir=tmp_path), clock=lambda: datetime(2020, 1, 1, tzinfo=UTC))
    token = past.issue(key).access_token
    with pytest.raises(Unauthenticated, match="expired"):
        TokenIssuer(registry, Settings(data_dir=tmp_path)).verify(token)


def test_secret_file_is_created_once(tmp_path: Path) -> None:
    path = tmp_path / "nested" / SECRET_FILE
    results: list[bytes] = []

    async def race() -> None:
        async with anyio.create_task_group() as tg:
            for _ in range(8):
                tg.start_soon(
                    lambda: anyio.to_thread.run_sync(lambda: results.append(load_or_create_secret(path)))
                )

    anyio.run(race)
    assert len(set(results)) == 1 and len(results[0]) == 64
    assert sorted(p.name for p in path.parent.iterdir()) == [SECRET_FILE]  # no temporary files left


def test_openapi_describes_the_routes(api: Api) -> None:
    doc = api.client.app.openapi()
    pods = doc["paths"]["/api/v1/workloads/{workloadId}/pods"]["get"]
    assert pods["operationId"] == "get_workload_pods" and pods["tags"] == ["Pods"]
    assert {p["name"] for p in pods["parameters"]} == {"workloadId", "offset", "limit"}
    assert {"400", "401", "403", "404", "500", "503"} <= set(pods["responses"])
    token = doc["paths"]["/api/v1/token"]["post"]
    assert token["operationId"] == "grant_token" and token["tags"] == ["Tokens"]
