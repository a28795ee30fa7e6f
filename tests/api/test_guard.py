"""The request guard (api/guard.py): GPULENS_MAX_BODY_BYTES, and admin routes authenticated before
their bodies are read. Requests go to the ASGI app directly, so each test sees whether (and how much
of) the body was read."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import httpx
import orjson
import pytest
from fastapi import FastAPI
from fastapi.routing import APIRoute, iter_route_contexts

from gpulens.api.app import create_app
from gpulens.api.deps import get_admin
from gpulens.api.guard import ADMIN_PREFIX
from gpulens.backends.prometheus import PrometheusBackend
from gpulens.config import Settings
from gpulens.storage.registry import Registry
from tests.api.conftest import JWT_SECRET, user_jwt

CAP = 4096
PROM = "http://prometheus.invalid:9090"
TOKEN = "/api/v1/token"
KEYS = "/api/v2/external/auth/api-keys/"
EXECUTIONS = "/api/v2/admin/executions"


@dataclass
class Sent:
    """One request's outcome, and how many body chunks the app asked for."""

    status: int
    headers: dict[str, str]
    body: Any
    reads: int = 0
    chunks: list[bytes] = field(default_factory=list)


def call(
    app: FastAPI,
    method: str,
    path: str,
    chunks: list[bytes],
    headers: dict[str, str] | None = None,
    *,
    declared: int | None = None,
    root: str = "",
) -> Sent:
    """Send `chunks` as the body (Content-Length `declared`, or none: chunked) and collect the answer."""
    raw = {"content-type": "application/json", **(headers or {})}
    if declared is not None:
        raw["content-length"] = str(declared)
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": root + path,
        "raw_path": (root + path).encode(),
        "root_path": root,
        "query_string": b"",
        "headers": [(k.lower().encode(), v.encode()) for k, v in raw.items()],
        "client": ("127.0.0.1", 5000),
        "server": ("testserver", 80),
    }
    sent = Sent(0, {}, None)
    pending = list(chunks)
    out: list[bytes] = []

    async def receive() -> dict[str, Any]:
        if not pending:
            await anyio.sleep_forever()  # a client waiting for its answer
        sent.reads += 1
        return {"type": "http.request", "body": pending.pop(0), "more_body": bool(pending)}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            sent.status = message["status"]
            sent.headers = {k.decode().lower(): v.decode() for k, v in message["headers"]}
        elif message["type"] == "http.response.body":
            out.append(message.get("body", b""))

    async def run() -> None:
        with anyio.fail_after(10):
            await app(scope, receive, send)

    anyio.run(run)
    sent.body = orjson.loads(b"".join(out)) if out else None
    return sent


def pieces(total: int, size: int = 1024) -> list[bytes]:
    """`total` bytes of a JSON object, in `size`-byte chunks."""
    data = b'{"grantType": "' + b"x" * (total - 17) + b'"}'
    assert len(data) == total
    return [data[i : i + size] for i in range(0, total, size)]


@dataclass
class Guarded:
    app: FastAPI
    admin: dict[str, str]
    acme: dict[str, str]


@pytest.fixture
def guarded(tmp_path: Path, registry: Registry) -> Iterator[Guarded]:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise AssertionError(f"the guard's tests never reach the backend: {request.url}")

    backend = PrometheusBackend(PROM, httpx.Client(transport=httpx.MockTransport(refuse)))
    settings = Settings(data_dir=tmp_path, prometheus_url=PROM, jwt_secret=JWT_SECRET, max_body_bytes=CAP)
    _, admin = registry.create_key("platform", name="svc", is_admin=True)
    _, acme = registry.create_key("acme", name="acme")
    yield Guarded(
        create_app(settings, registry=registry, backend=backend),
        {"authorization": f"Bearer {admin}"},
        {"authorization": f"Bearer {acme}"},
    )


def test_the_setting_defaults_to_one_mib(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    assert Settings(data_dir=tmp_path).max_body_bytes == 1 << 20
    monkeypatch.setenv("GPULENS_MAX_BODY_BYTES", "2048")
    assert Settings(data_dir=tmp_path).max_body_bytes == 2048


# ---------------------------------------------------------------- size


def test_a_declared_oversize_body_is_413_unread_in_the_runai_shape(guarded: Guarded) -> None:
    sent = call(guarded.app, "POST", TOKEN, pieces(60 * 1024), declared=60 * 1024)
    assert sent.status == 413
    assert sent.reads == 0  # answered from the header alone
    assert sent.body == {
        "code": 413,
        "message": "Request body is too large.",
        "details": f"The request body is larger than {CAP} bytes (GPULENS_MAX_BODY_BYTES)",
    }


def test_a_declared_oversize_body_is_413_unread_in_the_lyceum_shape(guarded: Guarded) -> None:
    sent = call(guarded.app, "POST", KEYS, pieces(CAP + 1), guarded.acme, declared=CAP + 1)
    assert (sent.status, sent.reads) == (413, 0)
    assert sent.body == {"detail": f"The request body is larger than {CAP} bytes (GPULENS_MAX_BODY_BYTES)"}


def test_a_chunked_body_is_cut_off_once_it_passes_the_cap(guarded: Guarded) -> None:
    chunks = pieces(20 * 1024)
    sent = call(guarded.app, "POST", TOKEN, chunks)  # no Content-Length
    assert sent.status == 413 and sent.body["code"] == 413
    assert sent.reads == CAP // 1024 + 1  # not one chunk past the first over the cap


def test_a_body_longer_than_its_content_length_is_cut_off_too(guarded: Guarded) -> None:
    sent = call(guarded.app, "POST", TOKEN, pieces(20 * 1024), declared=100)
    assert sent.status == 413
    assert sent.reads == CAP // 1024 + 1


def test_bodies_within_the_cap_reach_the_route(guarded: Guarded) -> None:
    body = orjson.dumps({"grantType": "client_credentials", "clientID": "x", "clientSecret": "nope"})
    chunked = call(guarded.app, "POST", TOKEN, [body[:10], body[10:]])
    assert chunked.status == 401 and chunked.body["code"] == 401  # parsed, then refused
    declared = call(guarded.app, "POST", TOKEN, [body], declared=len(body))
    assert declared.status == 401
    exact = pieces(CAP)
    assert call(guarded.app, "POST", TOKEN, exact, declared=CAP).status == 400  # unknown grant: parsed


def test_requests_without_a_body_are_unaffected(guarded: Guarded) -> None:
    sent = call(guarded.app, "GET", "/healthz", [b""])
    assert sent.status == 200


# ---------------------------------------------------------------- admin: auth before the body


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", EXECUTIONS),
        ("PATCH", f"{EXECUTIONS}/some-id"),
        ("POST", "/api/v2/admin/workloads"),
        ("PATCH", "/api/v2/admin/workloads/3f2b8c1e-5a4d-4e6f-9b7a-1c2d3e4f5a6b/pods/p"),
    ],
)
def test_admin_routes_answer_401_and_403_without_reading_the_body(
    guarded: Guarded, method: str, path: str
) -> None:
    body = [b'{"org": "acme", "hostname": "gpu-node-1"}']
    nobody = call(guarded.app, method, path, body, declared=len(body[0]))
    assert (nobody.status, nobody.reads) == (401, 0)
    assert nobody.body == {"detail": "Not authenticated"}
    assert nobody.headers["www-authenticate"] == "Bearer"
    wrong = call(guarded.app, method, path, body, {"authorization": "Bearer lk_notakeyatall"})
    assert (wrong.status, wrong.reads) == (401, 0)
    tenant = call(guarded.app, method, path, body, guarded.acme)
    assert (tenant.status, tenant.reads) == (403, 0)
    assert tenant.body == {"detail": "This endpoint needs an admin key"}
    user = call(guarded.app, method, path, body, {"authorization": f"Bearer {user_jwt()}"})
    assert (user.status, user.reads) == (403, 0)


def test_admin_routes_behind_a_root_path_are_guarded_too(guarded: Guarded) -> None:
    body = [b'{"org": "acme", "hostname": "gpu-node-1"}']
    sent = call(guarded.app, "POST", EXECUTIONS, body, root="/gpulens")
    assert (sent.status, sent.reads) == (401, 0)
    sent = call(guarded.app, "POST", EXECUTIONS, body, guarded.admin, root="/gpulens")
    assert (sent.status, sent.reads) == (201, 1)


def test_an_admin_body_is_read_once_authenticated(guarded: Guarded) -> None:
    body = orjson.dumps({"org": "acme", "hostname": "gpu-node-1", "status": "running"})
    sent = call(guarded.app, "POST", EXECUTIONS, [body[:7], body[7:]], guarded.admin)
    assert sent.status == 201, sent.body
    assert sent.reads == 2 and sent.body["org"] == "acme"
    admin_jwt = {"authorization": f"Bearer {user_jwt(admin=True)}", "x-org-slug": "platform"}
    assert call(guarded.app, "GET", EXECUTIONS, [b""], admin_jwt).status == 200


def test_every_route_under_the_admin_prefix_needs_an_admin(guarded: Guarded) -> None:
    """The guard refuses non-admins on the whole prefix: no route there may be meant for others."""

    def dependencies(route: APIRoute) -> set[Any]:
        found, todo = set(), list(route.dependant.dependencies)
        while todo:
            dep = todo.pop()
            found.add(dep.call)
            todo.extend(dep.dependencies)
        return found

    routes = [c.route for c in iter_route_contexts(guarded.app.routes) if c.path.startswith(ADMIN_PREFIX)]
    assert len(routes) >= 8
    for route in routes:
        assert isinstance(route, APIRoute)
        assert get_admin in dependencies(route), route.path
