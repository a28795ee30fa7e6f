"""Failures of a real backend: down (503), silent (504), error envelope (502); readiness; escaping."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpulens.planning.promql import eq, quote, selector
from gpulens_testkit.promload import LoadedDataset, free_port
from tests.integration.lyceum_app import LiveApi, build

pytestmark = pytest.mark.integration


@pytest.fixture
def silent_server() -> Iterator[str]:
    """Accepts connections and never answers."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        srv.settimeout(0.1)
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
                held.append(conn)
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{srv.getsockname()[1]}"
    stop.set()
    thread.join()
    for c in held:
        c.close()
    srv.close()


def first_id(api: LiveApi) -> str:
    return api.data.scenario.execution("healthy").execution_id


def get(api: LiveApi, path: str) -> httpx.Response:
    return api.client.get(path, headers={"Authorization": f"Bearer {api.key}"})


def test_backend_down_is_503_without_its_address(prom_dataset: LoadedDataset, tmp_path: Path) -> None:
    api = build(prom_dataset, tmp_path)
    port = free_port()
    down = build.__globals__["create_app"](  # same registry, a backend nobody listens on
        api.settings.model_copy(update={"prometheus_url": f"http://127.0.0.1:{port}"}), registry=api.registry
    )
    client = type(api.client)(down)
    r = client.get(
        f"/api/v2/external/execution/{first_id(api)}/metrics", headers={"Authorization": f"Bearer {api.key}"}
    )
    assert r.status_code == 503
    assert r.json()["detail"] == "the metrics backend is unreachable (ConnectError)"
    ready = client.get("/readyz")
    assert ready.status_code == 503 and "backend" in ready.json()["detail"]
    assert str(port) not in r.text and str(port) not in ready.text  # logged, never shown
    assert get(api, "/readyz").status_code == 200


def test_silent_backend_is_504_after_the_timeout(
    prom_dataset: LoadedDataset, tmp_path: Path, silent_server: str
) -> None:
    api = build(prom_dataset, tmp_path)
    app = build.__globals__["create_app"](
        api.settings.model_copy(update={"prometheus_url": silent_server, "backend_timeout": 0.5}),
        registry=api.registry,
    )
    r = type(api.client)(app).get(
        f"/api/v2/external/execution/{first_id(api)}/metrics", headers={"Authorization": f"Bearer {api.key}"}
    )
    assert r.status_code == 504 and "did not answer in time" in r.json()["detail"]


def test_prometheus_error_envelope_is_502_with_its_message(
    prom_dataset: LoadedDataset, tmp_path: Path
) -> None:
    # chunks larger than Prometheus accepts: its own 400 bad_data comes back as a 502
    api = build(prom_dataset, tmp_path, max_points_per_query=20_000)
    e = api.data.scenario.execution("healthy")
    r = get(api, f"/api/v2/external/execution/{e.execution_id}/metrics?step=100ms")
    assert r.status_code == 502
    assert "exceeded maximum resolution of 11,000 points" in r.json()["detail"]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=st.text(min_size=0, max_size=40))
def test_quote_round_trips_through_real_prometheus(prom_dataset: LoadedDataset, value: str) -> None:
    """Whatever the text, Prometheus reads back exactly that text from our literal."""
    # label_replace expands $-groups in its replacement; "$$" is a literal "$" there
    expr = f'label_replace(vector(1), "probe", {quote(value.replace("$", "$$"))}, "", "")'
    r = httpx.post(f"{prom_dataset.url}/api/v1/query", data={"query": expr, "time": "1767225600"})
    body = r.json()
    assert body["status"] == "success", (value, body)
    labels = body["data"]["result"][0]["metric"]
    assert labels.get("probe", "") == value


@pytest.mark.parametrize(
    "payload",
    [
        'x"} or vector(1) or up{a="',
        'gpu-node-1"} or DCGM_FI_DEV_GPU_UTIL{Hostname=~".+',
        "gpu-node-1\\",
        "gpu-node-1\n",
        '.*"} or vector(1) #',
    ],
)
def test_injection_payloads_select_nothing(prom_dataset: LoadedDataset, payload: str, tmp_path: Path) -> None:
    expr = f"count({selector('DCGM_FI_DEV_GPU_UTIL', [eq('Hostname', payload)])})"
    r = httpx.post(f"{prom_dataset.url}/api/v1/query", data={"query": expr, "time": "1767225000"}).json()
    assert r["status"] == "success" and r["data"]["result"] == []
    # and the registry refuses such hostnames outright
    api = build(prom_dataset, tmp_path)
    reg = api.client.post(
        "/api/v2/admin/executions",
        json={"org": "acme", "hostname": payload, "status": "running", "start_time": "2025-12-31T21:00:00Z"},
        headers={"Authorization": f"Bearer {api.admin_key}"},
    )
    assert reg.status_code == 422
