"""A small app with the registry, key and execution routes on a temporary SQLite registry.

It is assembled here (not with create_app) so these tests need no metrics backend. Requests go
through httpx's ASGI transport: starlette's TestClient warns (deprecated) when httpx2 is absent.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import httpx
import jwt
import pytest
from fastapi import FastAPI

from gpulens.api import admin
from gpulens.api.deps import AppContext
from gpulens.api.errors import install
from gpulens.api.lyceum import executions as lyceum_executions
from gpulens.api.lyceum import keys as lyceum_keys
from gpulens.config import Settings
from gpulens.service.alerts.rules import AlertService
from gpulens.service.auth import Authenticator
from gpulens.service.executions import ExecutionService
from gpulens.service.usage import UsageService
from gpulens.service.workloads import WorkloadService
from gpulens.storage.alerts import AlertStore
from gpulens.storage.registry import Registry
from gpulens.storage.usage import UsageStore

JWT_SECRET = "j" * 48


class Client:
    """A synchronous client for an ASGI app (one event loop per request: simple, and fast enough)."""

    def __init__(self, app: FastAPI) -> None:
        self.app = app

    def request(self, method: str, url: str, **kwargs: Any) -> httpx.Response:
        async def send() -> httpx.Response:
            transport = httpx.ASGITransport(app=self.app)
            async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as client:
                return await client.request(method, url, **kwargs)

        return anyio.run(send)

    def get(self, url: str, **kwargs: Any) -> httpx.Response:
        return self.request("GET", url, **kwargs)

    def post(self, url: str, **kwargs: Any) -> httpx.Response:
        return self.request("POST", url, **kwargs)

    def patch(self, url: str, **kwargs: Any) -> httpx.Response:
        return self.request("PATCH", url, **kwargs)

    def delete(self, url: str, **kwargs: Any) -> httpx.Response:
        return self.request("DELETE", url, **kwargs)


@dataclass
class Api:
    client: Client
    registry: Registry
    admin_key: str  # the platform's service key (org "platform")
    acme_key: str
    beta_key: str

    @staticmethod
    def bearer(token: str, org: str | None = None) -> dict[str, str]:
        headers = {"Authorization": f"Bearer {token}"}
        if org is not None:
            headers["X-Org-Slug"] = org
        return headers

    @property
    def admin(self) -> dict[str, str]:
        return self.bearer(self.admin_key)

    @property
    def acme(self) -> dict[str, str]:
        return self.bearer(self.acme_key)

    @property
    def beta(self) -> dict[str, str]:
        return self.bearer(self.beta_key)

    @staticmethod
    def jwt(**claims: Any) -> str:
        """A user's HS256 token (orgs ["acme"] unless given) for the app's secret."""
        return user_jwt(**claims)

    def register(self, **body: Any) -> dict[str, Any]:
        body.setdefault("org", "acme")
        body.setdefault("hostname", "gpu-node-1")
        response = self.client.post("/api/v2/admin/executions", json=body, headers=self.admin)
        assert response.status_code in (200, 201), response.text
        result: dict[str, Any] = response.json()
        return result


def user_jwt(**claims: Any) -> str:
    payload: dict[str, Any] = {"sub": "user-1", "orgs": ["acme"], "exp": int(time.time()) + 600}
    payload.update(claims)
    return jwt.encode(payload, JWT_SECRET, algorithm="HS256")


def build_app(registry: Registry, settings: Settings) -> FastAPI:
    app = FastAPI()
    install(app)
    app.include_router(lyceum_executions.router)
    app.include_router(lyceum_keys.router)
    app.include_router(admin.router)
    app.state.ctx = AppContext(
        settings=settings,
        registry=registry,
        authenticator=Authenticator(registry, settings),
        executions=ExecutionService(registry),
        metrics=None,  # type: ignore[arg-type]
        workloads=WorkloadService(registry),
        pod_metrics=None,  # type: ignore[arg-type]
        summaries=None,  # type: ignore[arg-type]
        alerts=AlertService(AlertStore(registry)),
        usage=UsageService(UsageStore(registry)),
    )
    return app


@pytest.fixture
def api(tmp_path: Path, registry: Registry) -> Api:
    settings = Settings(data_dir=tmp_path, jwt_secret=JWT_SECRET)
    _, admin_key = registry.create_key("platform", name="svc", is_admin=True)
    _, acme_key = registry.create_key("acme", name="acme")
    _, beta_key = registry.create_key("beta", name="beta")
    return Api(Client(build_app(registry, settings)), registry, admin_key, acme_key, beta_key)
