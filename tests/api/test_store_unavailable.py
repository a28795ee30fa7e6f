"""The embedded store failing under a request (a damaged file: SQLite's own error, raised in a read)
is a 503 with Retry-After in each dialect's error shape, never a 500; the file's path is not shown."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from gpulens.agent.samples import Sample
from gpulens.api.app import create_app
from gpulens.backends.embedded import EmbeddedBackend
from gpulens.config import Settings
from gpulens.storage.registry import Registry
from gpulens.storage.samples import SampleStore
from tests.api.conftest import Client
from tests.api.lyceum.conftest import standard_keys
from tests.api.runai.conftest import POD, WORKLOAD, register

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
MESSAGE = "the metrics store is busy or failing; try again shortly"


@pytest.fixture
def setup(registry: Registry, tmp_path: Path) -> Iterator[tuple[Client, SampleStore, Path, str, str]]:
    path = tmp_path / "samples.db"
    store = SampleStore.from_path(path, busy_timeout_s=0.2)
    labels = (("gpu", "0"), ("Hostname", "gpu-node-1"))
    store.write([Sample("DCGM_FI_DEV_GPU_UTIL", labels, 50.0, int(NOW.timestamp() * 1000) - 60_000)])
    settings = Settings(data_dir=tmp_path, prometheus_url=None, database_url="sqlite://")
    app = create_app(settings, registry=registry, backend=EmbeddedBackend(store), clock=lambda: NOW)
    client = Client(app)
    admin, acme, _ = standard_keys(registry)
    body = {
        "org": "acme",
        "hostname": "gpu-node-1",
        "gpus": ["0"],
        "status": "running",
        "start_time": "2026-01-01T11:00:00Z",
    }
    r = client.post("/api/v2/admin/executions", json=body, headers={"Authorization": f"Bearer {admin}"})
    assert r.status_code in (200, 201), r.text
    register(client, admin, WORKLOAD, POD, "acme", "team-a", "llm-serve")
    try:
        yield client, store, path, acme, r.json()["execution_id"]
    finally:
        store.close()


def _damage(store: SampleStore, path: Path) -> None:
    store._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # everything in the main file
    with path.open("r+b") as f:
        f.write(b"\0" * 100)  # its header: SQLite says "file is not a database"


def test_lyceum_metrics_on_a_failing_store_is_503_with_retry_after(
    setup: tuple[Client, SampleStore, Path, str, str],
) -> None:
    client, store, path, key, eid = setup
    url = f"/api/v2/external/execution/{eid}/metrics?step=1m"
    assert client.get(url, headers={"Authorization": f"Bearer {key}"}).status_code == 200
    _damage(store, path)
    r = client.get(url, headers={"Authorization": f"Bearer {key}"})
    assert r.status_code == 503, r.text
    assert r.headers["retry-after"] == "1"
    assert r.json() == {"detail": MESSAGE}
    assert str(path) not in r.text


def test_runai_pod_metrics_on_a_failing_store_is_503_with_retry_after(
    setup: tuple[Client, SampleStore, Path, str, str],
) -> None:
    client, store, path, key, _ = setup
    url = (
        f"/api/v1/workloads/{WORKLOAD}/pods/{POD}/metrics?metricType=GPU_UTILIZATION"
        "&start=2026-01-01T11:00:00Z&end=2026-01-01T11:30:00Z"
    )
    _damage(store, path)
    r = client.get(url, headers={"Authorization": f"Bearer {key}"})
    assert r.status_code == 503, r.text
    assert r.headers["retry-after"] == "1"
    assert r.json() == {"code": 503, "message": "Please try again in few minutes.", "details": MESSAGE}
    assert str(path) not in r.text
