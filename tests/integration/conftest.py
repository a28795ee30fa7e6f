"""Real servers loaded with the synthetic `default` scenario: `prom_dataset` and `vm_dataset` (session-wide).

Each yields a `gpulens.synth.promload.LoadedDataset`: `.url` (base URL of the server's HTTP API),
`.truth` (GroundTruth), `.scenario`, `.dataset`, `.backend` ("prometheus" or "victoriametrics"), `.handle`.

The Kubernetes / Run:ai scenario `k8s` is served separately by `prom_k8s_dataset` and `vm_k8s_dataset`
(`LoadedK8sDataset`: the same fields, `.truth` a `K8sTruth`, `.scenario` a `K8sScenario`).
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

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


def _missing(what: str) -> None:
    missing_server(f"{what} (on PATH)")


@pytest.fixture(scope="session")
def synth_default() -> tuple[Dataset, GroundTruth]:
    dataset = generate(default_scenario())
    return dataset, GroundTruth(dataset)


@pytest.fixture(scope="session")
def prom_dataset(
    synth_default: tuple[Dataset, GroundTruth], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LoadedDataset]:
    for binary in ("prometheus", "promtool"):
        if shutil.which(binary) is None:
            _missing(binary)
    dataset, truth = synth_default
    handle = load_prometheus(dataset, Path(tmp_path_factory.mktemp("prometheus")))
    try:
        yield LoadedDataset(handle.url, truth, dataset.scenario, dataset, "prometheus", handle)
    finally:
        handle.stop()


@pytest.fixture(scope="session")
def vm_dataset(
    synth_default: tuple[Dataset, GroundTruth], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LoadedDataset]:
    if shutil.which("victoria-metrics") is None:
        _missing("victoria-metrics")
    dataset, truth = synth_default
    handle = load_victoria_metrics(dataset, Path(tmp_path_factory.mktemp("victoriametrics")))
    try:
        yield LoadedDataset(handle.url, truth, dataset.scenario, dataset, "victoriametrics", handle)
    finally:
        handle.stop()


@pytest.fixture(scope="session")
def synth_k8s() -> tuple[K8sDataset, K8sTruth]:
    dataset = K8sDataset(k8s_scenario())
    return dataset, K8sTruth(dataset)


@pytest.fixture(scope="session")
def prom_k8s_dataset(
    synth_k8s: tuple[K8sDataset, K8sTruth], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LoadedK8sDataset]:
    for binary in ("prometheus", "promtool"):
        if shutil.which(binary) is None:
            _missing(binary)
    dataset, truth = synth_k8s
    handle = load_prometheus(dataset, Path(tmp_path_factory.mktemp("prometheus-k8s")))
    try:
        yield LoadedK8sDataset(handle.url, truth, dataset.scenario, dataset, "prometheus", handle)
    finally:
        handle.stop()


@pytest.fixture(scope="session")
def vm_k8s_dataset(
    synth_k8s: tuple[K8sDataset, K8sTruth], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LoadedK8sDataset]:
    if shutil.which("victoria-metrics") is None:
        _missing("victoria-metrics")
    dataset, truth = synth_k8s
    handle = load_victoria_metrics(dataset, Path(tmp_path_factory.mktemp("victoriametrics-k8s")))
    try:
        yield LoadedK8sDataset(handle.url, truth, dataset.scenario, dataset, "victoriametrics", handle)
    finally:
        handle.stop()
