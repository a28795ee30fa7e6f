"""Build a gpulens app over a loaded dataset, with the scenario's executions registered."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpulens.api.app import create_app
from gpulens.config import Settings
from gpulens.domain.timeparse import format_rfc3339
from gpulens.storage.registry import Registry
from gpulens_testkit.promload import LoadedDataset
from tests.api.conftest import Client
from tests.conftest import sqlite_registry


@dataclass
class LiveApi:
    client: Client
    registry: Registry
    key: str
    admin_key: str
    data: LoadedDataset
    settings: Settings

    def metrics(self, execution_id: str, **params: str) -> Any:
        r = self.client.get(
            f"/api/v2/external/execution/{execution_id}/metrics",
            params=params,
            headers={"Authorization": f"Bearer {self.key}"},
        )
        assert r.status_code == 200, r.text
        return r.json()


def execution_body(e: Any, org: str = "acme") -> dict[str, Any]:
    """The admin registration of a scenario execution (gpulens.demo.scenario.ExecutionSpec)."""
    return {
        "execution_id": e.execution_id,
        "org": org,
        "hostname": e.hostname,
        "gpus": [str(g) for g in e.gpus],
        "status": e.status.value,
        "start_time": format_rfc3339(e.start),
        "end_time": format_rfc3339(e.end),
        "hardware_profile": "gpu.h100" if e.gpus or e.hostname.startswith("gpu") else "cpu",
        "file_name": f"{e.name}.py",
    }


def build(data: LoadedDataset, tmp: Path, **settings: Any) -> LiveApi:
    registry = sqlite_registry(tmp / "registry.db")
    _, admin = registry.create_key("platform", name="scheduler", is_admin=True)
    _, key = registry.create_key("acme", name="alice")
    conf = Settings(
        data_dir=tmp, prometheus_url=data.url, database_url=f"sqlite:///{tmp / 'registry.db'}", **settings
    )
    api = LiveApi(Client(create_app(conf, registry=registry)), registry, key, admin, data, conf)
    for e in data.scenario.executions:
        r = api.client.post(
            "/api/v2/admin/executions", json=execution_body(e), headers={"Authorization": f"Bearer {admin}"}
        )
        assert r.status_code in (200, 201), r.text
    return api
