"""Request bodies at the edges: timestamps outside the one accepted range, bytes orjson cannot
write back in an error body, and API keys minted by keys that expire."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import pytest

from gpulens.api.app import create_app
from gpulens.backends.prometheus import PrometheusBackend
from gpulens.config import Settings
from gpulens.domain.timeparse import format_rfc3339
from gpulens.storage.registry import Registry
from tests.api.conftest import JWT_SECRET, Client, user_jwt

if TYPE_CHECKING:
    from conftest import Api

EXECUTIONS = "/api/v2/admin/executions"
WORKLOADS = "/api/v2/admin/workloads"
KEYS = "/api/v2/external/auth/api-keys/"
JSON = {"content-type": "application/json"}


def assert_422(response: httpx.Response, field: str) -> dict[str, Any]:
    assert response.status_code == 422, response.text
    (item,) = [i for i in response.json()["detail"] if str(i["loc"][-1]).endswith(field)]
    return dict(item)


# ---------------------------------------------------------------- one range for every body timestamp


OUT_OF_RANGE = [
    "0001-01-01T00:00:00+01:00",  # moving it to UTC overflowed datetime: a 500
    "9999-12-31T23:59:59-01:00",  # likewise
    "0001-01-01T00:00:00Z",  # was stored, and shown as "1-01-01T00:00:00Z"
    "1900-01-01T00:00:00Z",
    "1969-12-31T23:59:59.999Z",
    "2262-01-01T00:00:00Z",  # past int64 nanoseconds (Prometheus) soon after
    "9999-12-31T23:59:59Z",
]


@pytest.mark.parametrize("raw", OUT_OF_RANGE)
@pytest.mark.parametrize("field", ["start_time", "end_time", "created_at"])
def test_register_refuses_times_outside_the_range(api: Api, field: str, raw: str) -> None:
    body = {"org": "acme", "hostname": "gpu-node-1", field: raw}
    item = assert_422(api.client.post(EXECUTIONS, json=body, headers=api.admin), field)
    assert "1970-01-01T00:00:00Z" in item["msg"] and "2261-12-31T23:59:59.999Z" in item["msg"]


@pytest.mark.parametrize("raw", OUT_OF_RANGE[:4])
def test_update_refuses_times_outside_the_range(api: Api, raw: str) -> None:
    eid = api.register()["execution_id"]
    assert_422(
        api.client.patch(f"{EXECUTIONS}/{eid}", json={"start_time": raw}, headers=api.admin), "start_time"
    )


@pytest.mark.parametrize("raw", ["9999-12-31T23:59:59-01:00", "2262-01-01T00:00:00Z"])
def test_key_expiry_outside_the_range_is_422(api: Api, raw: str) -> None:
    response = api.client.post(KEYS, json={"key_name": "k", "expires_at": raw}, headers=api.acme)
    assert_422(response, "expires_at")


@pytest.mark.parametrize(
    ("raw", "shown"),
    [
        ("1970-01-01T00:00:00Z", "1970-01-01T00:00:00Z"),
        ("1970-01-01T01:00:00+01:00", "1970-01-01T00:00:00Z"),
        ("2261-12-31T23:59:59.999Z", "2261-12-31T23:59:59.999Z"),
    ],
)
def test_the_ends_of_the_range_are_accepted(api: Api, raw: str, shown: str) -> None:
    assert api.register(start_time=raw)["start_time"] == shown


# ---------------------------------------------------------------- error bodies survive any input


@pytest.mark.parametrize(
    ("path", "body", "admin"),
    [
        (KEYS, rb'{"key_name": "\ud800"}', False),  # a lone surrogate: orjson refuses to write it
        (KEYS, rb'{"key_name": "ok\udfff\ud800x"}', False),
        (EXECUTIONS, rb'{"org": "acme", "\ud800": 1}', True),  # in a name: the error's loc
        (EXECUTIONS, rb'{"org": "acme", "return_code": 123456789012345678901234567890}', True),  # > 64 bits
    ],
)
def test_validation_errors_never_crash_on_what_they_echo(
    api: Api, path: str, body: bytes, admin: bool
) -> None:
    headers = {**JSON, **(api.admin if admin else api.acme)}
    response = api.client.post(path, content=body, headers=headers)
    assert response.status_code == 422, response.text
    detail = response.json()["detail"]
    assert detail and all({"type", "loc", "msg"} <= set(item) for item in detail)


def test_a_surrogate_is_echoed_escaped(api: Api) -> None:
    response = api.client.post(KEYS, content=rb'{"key_name": "\ud800"}', headers={**JSON, **api.acme})
    (item,) = response.json()["detail"]
    assert item["loc"] == ["body", "key_name"]
    assert item["input"] == "\\ud800"


# ---------------------------------------------------------------- the whole app, on a clock of its own

# Issued tokens' exp is checked against the real time: the app's clock starts there.
T0 = datetime.now(UTC).replace(microsecond=0)


@dataclass
class Clocked:
    client: Client
    registry: Registry
    now: list[datetime]

    def advance(self, delta: timedelta) -> None:
        self.now[0] += delta


@pytest.fixture
def clocked(tmp_path: Path, registry: Registry) -> Clocked:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise AssertionError(f"these routes never query the backend: {request.url}")

    prom = "http://prometheus.invalid:9090"
    backend = PrometheusBackend(prom, httpx.Client(transport=httpx.MockTransport(refuse)))
    settings = Settings(data_dir=tmp_path, prometheus_url=prom, jwt_secret=JWT_SECRET)
    now = [T0]
    app = create_app(settings, registry=registry, backend=backend, clock=lambda: now[0])
    return Clocked(Client(app), registry, now)


@pytest.mark.parametrize("raw", OUT_OF_RANGE)
def test_workload_registration_refuses_times_outside_the_range(clocked: Clocked, raw: str) -> None:
    _, admin = clocked.registry.create_key("platform", name="svc", is_admin=True)
    for field in ("start_time", "end_time"):
        pod = {"name": "p-0", "namespace": "team-a", field: raw}
        body = {"name": "w", "org": "acme", "pods": [pod]}
        response = clocked.client.post(WORKLOADS, json=body, headers={"Authorization": f"Bearer {admin}"})
        assert_422(response, field)
    created = {"name": "w", "org": "acme", "created_at": raw}
    response = clocked.client.post(WORKLOADS, json=created, headers={"Authorization": f"Bearer {admin}"})
    assert_422(response, "created_at")


# ---------------------------------------------------------------- a minted key never outlives its parent


def mint(api: Clocked, parent: str, **body: Any) -> httpx.Response:
    return api.client.post(
        KEYS, json={"key_name": "child", **body}, headers={"Authorization": f"Bearer {parent}"}
    )


@pytest.mark.parametrize(
    ("asked", "given"),
    [
        (None, timedelta(hours=1)),  # no expiry asked: the parent's
        (timedelta(days=300), timedelta(hours=1)),  # later than the parent: clamped
        (timedelta(minutes=30), timedelta(minutes=30)),  # earlier: kept
    ],
)
def test_a_minted_key_expires_no_later_than_its_parent(
    clocked: Clocked, asked: timedelta | None, given: timedelta
) -> None:
    _, parent = clocked.registry.create_key("acme", name="parent", expires_at=T0 + timedelta(hours=1), now=T0)
    response = mint(clocked, parent, **({} if asked is None else {"expires_at": (T0 + asked).isoformat()}))
    assert response.status_code == 200, response.text
    created = response.json()
    assert created["expires_at"] == format_rfc3339(T0 + given)
    child = created["api_key"]
    headers = {"Authorization": f"Bearer {child}"}
    assert clocked.client.get(KEYS, headers=headers).status_code == 200

    clocked.advance(timedelta(hours=1, seconds=1))
    assert clocked.client.get(KEYS, headers={"Authorization": f"Bearer {parent}"}).status_code == 401
    refused = clocked.client.get(KEYS, headers=headers)
    assert refused.status_code == 401
    assert refused.json() == {"detail": "API key has expired"}


def test_keys_minted_through_an_issued_token_are_clamped_too(clocked: Clocked) -> None:
    parent_key, parent = clocked.registry.create_key(
        "acme", name="parent", expires_at=T0 + timedelta(hours=1), now=T0
    )
    grant = {"grantType": "client_credentials", "clientID": parent_key.prefix, "clientSecret": parent}
    token = clocked.client.post("/api/v1/token", json=grant).json()["accessToken"]
    grandchild = mint(clocked, token)
    assert grandchild.status_code == 200, grandchild.text
    assert grandchild.json()["expires_at"] == format_rfc3339(T0 + timedelta(hours=1))


def test_keys_of_unexpiring_keys_and_of_jwt_users_keep_what_they_ask(clocked: Clocked) -> None:
    _, forever = clocked.registry.create_key("acme", name="forever", now=T0)
    assert mint(clocked, forever).json()["expires_at"] is None
    later = mint(clocked, forever, expires_at="2100-01-01T00:00:00Z")
    assert later.json()["expires_at"] == "2100-01-01T00:00:00Z"
    # a JWT is a sign-in session, not a key: a user's key does not end with the session
    assert mint(clocked, user_jwt()).json()["expires_at"] is None
