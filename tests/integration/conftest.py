"""Real servers loaded with the synthetic `default` scenario: `prom_dataset` and `vm_dataset` (session-wide).

Each yields a `gpulens_testkit.promload.LoadedDataset`: `.url` (base URL of the server's HTTP API),
`.truth` (GroundTruth), `.scenario`, `.dataset`, `.backend` ("prometheus" or "victoriametrics"), `.handle`.

The Kubernetes / Run:ai scenario `k8s` is served separately by `prom_k8s_dataset` and `vm_k8s_dataset`
(`LoadedK8sDataset`: the same fields, `.truth` a `K8sTruth`, `.scenario` a `K8sScenario`).

`embedded_store` and `embedded_k8s_store` hold the same samples in a `SampleStore` (the embedded
default), for the differential tests against the real servers.

`serve_app(app)` serves an app over real HTTP (uvicorn in a thread) for clients that need a URL;
`client` (an httpx.Client per module), `range_result` and `instant` send raw PromQL to a server.
"""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from fastapi import FastAPI

from gpulens.agent.samples import Sample
from gpulens.demo.scenario import default_scenario
from gpulens.storage.samples import SampleStore
from gpulens_testkit.history import Dataset, generate
from gpulens_testkit.k8s_generate import K8sDataset
from gpulens_testkit.k8s_scenario import k8s_scenario
from gpulens_testkit.k8s_truth import K8sTruth
from gpulens_testkit.promload import (
    LoadedDataset,
    LoadedK8sDataset,
    free_port,
    load_prometheus,
    load_victoria_metrics,
)
from gpulens_testkit.truth import GroundTruth
from tests.conftest import missing_server

BINARIES = {"prometheus": ("prometheus", "promtool"), "victoriametrics": ("victoria-metrics",)}
LOADERS = {"prometheus": load_prometheus, "victoriametrics": load_victoria_metrics}


@contextmanager
def serve_app(app: FastAPI, start_timeout_s: float = 10.0) -> Iterator[str]:
    """Serves `app` with uvicorn on a free 127.0.0.1 port in a daemon thread; yields its base URL."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + start_timeout_s
        while not server.started and thread.is_alive() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert server.started, f"uvicorn did not start on 127.0.0.1:{port} within {start_timeout_s} s"
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)


@pytest.fixture(scope="module")
def client() -> Iterator[httpx.Client]:
    """For raw queries to the servers (uncompressed: the test compares what the server wrote)."""
    with httpx.Client(timeout=30.0, headers={"Accept-Encoding": "identity"}) as cl:
        yield cl


def range_result(
    client: httpx.Client, url: str, expr: str, start_ms: int, end_ms: int, step_ms: int, **extra: str
) -> list[dict[str, Any]]:
    """The `result` of a successful range query (`extra`: more form fields)."""
    form = {
        "query": expr,
        "start": f"{start_ms / 1000:.3f}",
        "end": f"{end_ms / 1000:.3f}",
        "step": f"{step_ms / 1000:.3f}",
        **extra,
    }
    resp = client.post(url + "/api/v1/query_range", data=form)
    assert resp.status_code == 200, (expr, resp.text)
    body = resp.json()
    assert body["status"] == "success", body
    result: list[dict[str, Any]] = body["data"]["result"]
    return result


def instant(client: httpx.Client, url: str, expr: str, t_s: float) -> list[dict[str, object]]:
    """The `result` of an instant query at `t_s`."""
    resp = client.post(url + "/api/v1/query", data={"query": expr, "time": str(t_s)})
    assert resp.status_code == 200, resp.text
    result: list[dict[str, object]] = resp.json()["data"]["result"]
    return result


def _serve(backend: str, dataset: Any, tmp: Path) -> Any:
    """A started server of `backend` holding `dataset` (fails under CI=true when its binary is missing)."""
    for binary in BINARIES[backend]:
        if shutil.which(binary) is None:
            missing_server(f"{binary} (on PATH)")
    return LOADERS[backend](dataset, tmp)


@pytest.fixture(scope="session")
def synth_default() -> tuple[Dataset, GroundTruth]:
    dataset = generate(default_scenario())
    return dataset, GroundTruth(dataset)


@pytest.fixture(scope="session")
def synth_k8s() -> tuple[K8sDataset, K8sTruth]:
    dataset = K8sDataset(k8s_scenario())
    return dataset, K8sTruth(dataset)


def _loaded(
    backend: str, synth: tuple[Any, Any], factory: pytest.TempPathFactory, kind: type[Any]
) -> Iterator[Any]:
    dataset, truth = synth
    handle = _serve(backend, dataset, Path(factory.mktemp(backend)))
    try:
        yield kind(handle.url, truth, dataset.scenario, dataset, backend, handle)
    finally:
        handle.stop()


@pytest.fixture(scope="session")
def prom_dataset(
    synth_default: tuple[Dataset, GroundTruth], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LoadedDataset]:
    yield from _loaded("prometheus", synth_default, tmp_path_factory, LoadedDataset)


@pytest.fixture(scope="session")
def vm_dataset(
    synth_default: tuple[Dataset, GroundTruth], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LoadedDataset]:
    yield from _loaded("victoriametrics", synth_default, tmp_path_factory, LoadedDataset)


@pytest.fixture(scope="session")
def prom_k8s_dataset(
    synth_k8s: tuple[K8sDataset, K8sTruth], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LoadedK8sDataset]:
    yield from _loaded("prometheus", synth_k8s, tmp_path_factory, LoadedK8sDataset)


@pytest.fixture(scope="session")
def vm_k8s_dataset(
    synth_k8s: tuple[K8sDataset, K8sTruth], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LoadedK8sDataset]:
    yield from _loaded("victoriametrics", synth_k8s, tmp_path_factory, LoadedK8sDataset)


def _stored(dataset: Dataset | K8sDataset, path: Path) -> Iterator[SampleStore]:
    """Every sample of `dataset` in a SampleStore at `path`, sealed into chunks as a live store would be."""
    store = SampleStore.from_path(path)
    try:
        for s in dataset.series:
            store.write(Sample(s.name, s.labels, float(v), t * 1000) for t, v in dataset.samples(s))
        store.flush()
        yield store
    finally:
        store.close()


@pytest.fixture(scope="session")
def embedded_store(
    synth_default: tuple[Dataset, GroundTruth], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SampleStore]:
    yield from _stored(synth_default[0], Path(tmp_path_factory.mktemp("embedded")) / "samples.db")


@pytest.fixture(scope="session")
def embedded_k8s_store(
    synth_k8s: tuple[K8sDataset, K8sTruth], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SampleStore]:
    yield from _stored(synth_k8s[0], Path(tmp_path_factory.mktemp("embedded-k8s")) / "samples.db")


# -- the browser the dashboard tests drive --------------------------------------------------------------

CHROMIUM_CANDIDATES = ("chromium", "chromium-browser")


def chromium_path() -> str:
    """Debian's chromium (`make servers` installs it; Playwright's own browser download is never used)."""
    for name in CHROMIUM_CANDIDATES:
        found = shutil.which(name)
        if found:
            return found
    missing_server("chromium (Debian package `chromium`, on PATH)")


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Headless chromium through Playwright for Python (a missing one fails under CI=true)."""
    executable = chromium_path()
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        missing_server("playwright (pip install -e '.[dev]')")
    with sync_playwright() as p:
        b = p.chromium.launch(
            executable_path=executable, headless=True, args=["--no-sandbox", "--disable-gpu"]
        )
        try:
            yield b
        finally:
            b.close()


# -- a two-node Slurm on this host (munged, slurmctld, two slurmd, slurmrestd) ----------------------------


@pytest.fixture(scope="session")
def slurm() -> Iterator[Any]:
    """`gpulens_testkit.slurm.LocalSlurm`, started once a session (a missing package, or not being
    root, fails under CI=true)."""
    from gpulens_testkit.slurm import SlurmUnavailable, missing_binaries, start_slurm

    missing = missing_binaries()
    if missing:
        missing_server(f"Slurm ({', '.join(missing)}; `make servers` installs them)")
    try:
        local = start_slurm()
    except SlurmUnavailable as exc:
        missing_server(f"a local Slurm ({exc})")
    try:
        yield local
    finally:
        local.stop()
