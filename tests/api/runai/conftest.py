"""The whole app over a temp registry and a scripted Prometheus that answers like a Run:ai pod's exporters."""

from __future__ import annotations

import re
import urllib.parse
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from gpulens.storage.registry import Registry
from tests.api.conftest import Client
from tests.api.lyceum.conftest import grid_values, scripted_app, standard_keys

WORKLOAD = "3f2b8c1e-5a4d-4e6f-9b7a-1c2d3e4f5a6b"
POD = "7e1d2c3b-4a59-4687-8b9c-0d1e2f3a4b5c"
OTHER_WORKLOAD = "9a8b7c6d-5e4f-4a3b-8c2d-1e0f9a8b7c6d"
OTHER_POD = "0f1e2d3c-4b5a-4968-8776-5a4b3c2d1e0f"
LE = ["0.01", "0.1", "1.0", "+Inf"]


@dataclass
class FakeRunaiProm:
    """Per-GPU queries get GPUs 4 and 5, bucket queries cumulative `le` counters, the rest one series."""

    seen: list[dict[str, str]] = field(default_factory=list)
    fail: Callable[[dict[str, str]], httpx.Response | None] = lambda form: None
    histogram_names: list[str] = field(default_factory=lambda: ["vllm:time_to_first_token_seconds_bucket"])

    def handle(self, request: httpx.Request) -> httpx.Response:
        form = {k: v[0] for k, v in urllib.parse.parse_qs(request.content.decode()).items()}
        self.seen.append(form)
        override = self.fail(form)
        if override is not None:
            return override
        if request.url.path == "/api/v1/series":
            data: Any = self.series(form["match[]"])
        else:
            data = {"resultType": "matrix", "result": self.result(form)}
        return httpx.Response(200, content=orjson.dumps({"status": "success", "data": data}))

    def series(self, match: str) -> list[dict[str, str]]:
        """Every name asked for exists (buckets: only `histogram_names`); DCGM series only under the
        exported_* spelling, GPUs 4 and 5 each seen twice (with and without a container label)."""
        names = re.search(r'__name__=~"([^"]*)"', match)
        assert names is not None, match
        asked = [n.replace("\\", "") for n in names.group(1).split("|")]
        out: list[dict[str, str]] = []
        for name in asked:
            if name.startswith("DCGM_"):
                if "exported_pod" in match:
                    out += [
                        {"__name__": name, "gpu": g, **extra}
                        for g in ("4", "5")
                        for extra in ({}, {"container": "c"})
                    ]
            elif not name.endswith("_bucket") or name in self.histogram_names:
                out.append({"__name__": name})
        return out

    def result(self, form: dict[str, str]) -> list[dict[str, Any]]:
        q = form["query"]
        if "DCGM_" in q:  # a DCGM read: the pod's GPUs' series, each GPU's pod aggregates made of them
            if "1048576" in q:  # framebuffer bytes: 7.5e+08 a GPU, a pod's sum 1500000000
                fb = [{"metric": {"gpu": g}, "values": grid_values(form, lambda t: "7.5e+08")} for g in "54"]
                return fb
            return [
                {
                    "metric": {"gpu": g},
                    "values": grid_values(form, lambda t, g=g: str(int(g) * 10 + int(t) % 7)),
                }
                for g in ("5", "4")
            ]
        if q.startswith("sum by (le) (increase("):
            # per-interval increases of counters growing by (1, 3, 6, 10) per second, with extrapolation noise
            secs = float(form["step"]) if float(form["step"]) > 1 else 900.0
            return [
                {
                    "metric": {"le": le},
                    "values": grid_values(form, lambda t, i=i: str(secs * (i + 1) * (i + 2) / 2 + 0.3)),
                }
                for i, le in enumerate(LE)
            ]
        if q.startswith("label_replace(histogram_quantile("):
            values = {
                "p50": lambda t: "0.05",
                "p90": lambda t: "0.25",
                "p99": lambda t: "NaN" if int(t) % 120 == 0 else "0.9",
            }
            return [
                {"metric": {"gpulens_quantile": k}, "values": grid_values(form, f)} for k, f in values.items()
            ]
        if q.startswith("sum(increase("):  # *_SUCCESS / *_FAILURE per interval
            return [{"metric": {}, "values": grid_values(form, lambda t: "89.6")}]
        return [
            {"metric": {}, "values": grid_values(form, lambda t: "1.5e+09" if "1048576" in q else "42.5")}
        ]


@dataclass
class RunaiApi:
    client: Client
    prom: FakeRunaiProm
    registry: Registry
    admin_key: str
    acme_key: str
    beta_key: str
    limited_key: str

    def h(self, key: str | None = None) -> dict[str, str]:
        return {"Authorization": f"Bearer {key or self.acme_key}"}

    def metrics(
        self,
        query: str,
        *,
        workload: str = WORKLOAD,
        pod: str = POD,
        key: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> httpx.Response:
        return self.client.get(
            f"/api/v1/workloads/{workload}/pods/{pod}/metrics?{query}",
            headers={**self.h(key), **(headers or {})},
        )


def register(client: Client, admin: str, workload: str, pod: str, org: str, project: str, name: str) -> None:
    body = {
        "workload_id": workload,
        "name": name,
        "org": org,
        "project": project,
        "pods": [
            {
                "pod_id": pod,
                "name": f"{name}-0",
                "namespace": project,
                "node": "gpu-node-1",
                "gpus": ["4", "5"],
                "start_time": "2026-01-01T09:00:00Z",
                "end_time": None,
                "phase": "Running",
            }
        ],
    }
    r = client.post("/api/v2/admin/workloads", json=body, headers={"Authorization": f"Bearer {admin}"})
    assert r.status_code in (200, 201), r.text


@pytest.fixture
def make_runai(tmp_path: Path, make_registry: Callable[[], Registry]) -> Callable[..., RunaiApi]:
    def build(**settings: Any) -> RunaiApi:
        registry = make_registry()
        prom = FakeRunaiProm()
        client = scripted_app(registry, prom.handle, tmp_path, **settings)
        admin, acme, beta = standard_keys(registry)
        _, limited = registry.create_key("acme", name="limited", projects=["team-z"])
        register(client, admin, WORKLOAD, POD, "acme", "team-a", "llm-serve")
        register(client, admin, OTHER_WORKLOAD, OTHER_POD, "acme", "team-b", "other")
        prom.seen.clear()
        return RunaiApi(client, prom, registry, admin, acme, beta, limited)

    return build


@pytest.fixture
def runai(make_runai: Callable[..., RunaiApi]) -> RunaiApi:
    return make_runai()


def new_uuid() -> str:
    return str(uuid.uuid4())
