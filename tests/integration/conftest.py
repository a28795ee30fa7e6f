"""Real servers loaded with the synthetic `default` scenario: `prom_dataset` and `vm_dataset` (session-wide).

Each yields a `gpulens.synth.promload.LoadedDataset`: `.url` (base URL of the server's HTTP API),
`.truth` (GroundTruth), `.scenario`, `.dataset`, `.backend` ("prometheus" or "victoriametrics"), `.handle`.

The Kubernetes / Run:ai scenario `k8s` is served separately by `prom_k8s_dataset` and `vm_k8s_dataset`
(`LoadedK8sDataset`: the same fields, `.truth` a `K8sTruth`, `.scenario` a `K8sScenario`).

`embedded_store` and `embedded_k8s_store` hold the same samples in a `SampleStore` (the embedded
default), for the differential tests against the real servers.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpulens.agent.samples import Sample
from gpulens.storage.samples import SampleStore
from gpulens.synth.generate import Dataset, generate
from gpulens.synth.k8s_generate import K8sDataset
from gpulens.synth.k8s_scenario import k8s_scenario
from gpulens.synth.k8s_truth import K8sTruth
from gpulens.synth.promload import (
    LoadedDataset,
    LoadedK8sDataset,
    load_prometheus,
    load_victoria_metrics,
)
from gpulens.synth.scenario import default_scenario
from gpulens.synth.truth import GroundTruth
from tests.conftest import missing_server

BINARIES = {"prometheus": ("prometheus", "promtool"), "victoriametrics": ("victoria-metrics",)}
LOADERS = {"prometheus": load_prometheus, "victoriametrics": load_victoria_metrics}


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
