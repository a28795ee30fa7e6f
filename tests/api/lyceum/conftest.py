"""The whole app (create_app) over a temp registry and a scripted Prometheus (httpx.MockTransport)."""

from __future__ import annotations

import re
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from gpulens.api.app import create_app
from gpulens.backends.prometheus import PrometheusBackend
from gpulens.config import Settings
from gpulens.storage.registry import Registry
from tests.api.conftest import Client

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
PROM = "http://prom.test:9090"


def grid_values(form: dict[str, str], value: Callable[[float], str]) -> list[list[Any]]:
    start, end, step = float(form["start"]), float(form["end"]), float(form["step"])
    out, k = [], 0
    while start + k * step <= end + 1e-9:
        t = round(start + k * step, 3)
        out.append([int(t) if t == int(t) else t, value(t)])
        k += 1
    return out


_MATCHER = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)(=~|=)"((?:[^"\\]|\\.)*)"')


def scripted_series(match: str) -> list[dict[str, str]]:
    """A series look-up's answer: node_uname_info names gpu-node-1; otherwise one series on GPU 0 (or
    the first asked) per name asked for, with the asked-for labels, as an idle CPU where it is one."""
    matchers = {label: value.replace("\\\\", "\\") for label, _, value in _MATCHER.findall(match)}
    names = re.sub(r"\\(.)", r"\1", matchers.pop("__name__", "")).split("|")
    if match.startswith("node_uname_info"):
        return [{"__name__": "node_uname_info", "instance": "10.1.1.1:9100", "nodename": "gpu-node-1"}]
    base = {k: re.sub(r"\\(.)", r"\1", v).split("|")[0].split("(")[0] for k, v in matchers.items()}
    base.setdefault("gpu", "0")
    base.setdefault("mode", "idle")
    return [{"__name__": name, **base} for name in names if name]


@dataclass
class FakeProm:
    """Answers every range query with one series on the requested grid; records the forms."""

    seen: list[dict[str, str]] = field(default_factory=list)
    value: Callable[[float], str] = lambda t: str(int(t) % 97)
    fail: Callable[[httpx.Request], httpx.Response | None] = lambda r: None

    def handle(self, request: httpx.Request) -> httpx.Response:
        override = self.fail(request)
        if override is not None:
            return override
        form = {k: v[0] for k, v in urllib.parse.parse_qs(request.content.decode()).items()}
        self.seen.append(form)
        if request.url.path == "/api/v1/series":
            data: Any = scripted_series(form["match[]"])
        elif request.url.path == "/api/v1/query":
            data = {"resultType": "scalar", "result": [0, "1"]}
        else:
            data = {
                "resultType": "matrix",
                "result": [{"metric": {}, "values": grid_values(form, self.value)}],
            }
        return httpx.Response(200, content=orjson.dumps({"status": "success", "data": data}))

    @property
    def range_queries(self) -> list[dict[str, str]]:
        return [f for f in self.seen if "step" in f]


@dataclass
class MetricsApi:
    client: Client
    prom: FakeProm
    registry: Registry
    admin_key: str
    acme_key: str
    beta_key: str

    def h(self, key: str | None = None) -> dict[str, str]:
        return {"Authorization": f"Bearer {key or self.acme_key}"}

    def register(self, **body: Any) -> str:
        body.setdefault("org", "acme")
        body.setdefault("hostname", "gpu-node-1")
        body.setdefault("status", "completed")
        body.setdefault("start_time", "2026-01-01T10:00:00Z")
        body.setdefault("end_time", "2026-01-01T11:00:00Z")
        r = self.client.post("/api/v2/admin/executions", json=body, headers=self.h(self.admin_key))
        assert r.status_code in (200, 201), r.text
        return str(r.json()["execution_id"])

    def metrics(self, execution_id: str, key: str | None = None, **params: str) -> httpx.Response:
        path = f"/api/v2/external/execution/{urllib.parse.quote(execution_id, safe='')}/metrics"
        return self.client.get(path, params=params, headers=self.h(key))


def scripted_app(
    registry: Registry,
    prom: Callable[[httpx.Request], httpx.Response],
    data_dir: Path,
    *,
    concurrency: int = 12,
    **settings: Any,
) -> Client:
    """The whole app over `registry`, its Prometheus answered by `prom` (at most `concurrency` queries
    at once, first come first served) and its clock stopped at NOW."""
    backend = PrometheusBackend(
        PROM, httpx.Client(transport=httpx.MockTransport(prom)), concurrency=concurrency
    )
    conf = Settings(data_dir=data_dir, prometheus_url=PROM, **settings)
    return Client(create_app(conf, registry=registry, backend=backend, clock=lambda: NOW))


def standard_keys(registry: Registry) -> tuple[str, str, str]:
    """Keys for the platform's service account (admin), org acme and org beta."""
    _, admin = registry.create_key("platform", name="svc", is_admin=True)
    _, acme = registry.create_key("acme", name="acme")
    _, beta = registry.create_key("beta", name="beta")
    return admin, acme, beta


@pytest.fixture
def make_api(tmp_path: Path, make_registry: Callable[[], Registry]) -> Callable[..., MetricsApi]:
    def build(**settings: Any) -> MetricsApi:
        registry = make_registry()
        prom = FakeProm()
        client = scripted_app(registry, prom.handle, tmp_path, **settings)
        return MetricsApi(client, prom, registry, *standard_keys(registry))

    return build


@pytest.fixture
def mapi(make_api: Callable[..., MetricsApi]) -> MetricsApi:
    return make_api()
