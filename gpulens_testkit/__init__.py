"""Test support, not part of the product (not in the wheel): synthetic exporter history, its ground truth,
and the launchers and loaders of real servers, for tests/ and bench/.

`default`/`bench`: dcgm-exporter + node-exporter per host (Lyceum); the scenario model and the
generator are the demo's (`gpulens.demo.scenario`, `gpulens.demo.history`), re-exported here, the
dataset as `history.Dataset`: the demo's plus the families, single samples and lookups tests read.
`k8s`: pods on Kubernetes GPU nodes with dcgm-exporter, cAdvisor, kube-state-metrics, vLLM and NIM
series (Run:ai). gpulens never imports this package (an import-linter contract).
"""

from __future__ import annotations

from gpulens.demo.history import Field, SeriesDef
from gpulens.demo.scenario import (
    ExecutionSpec,
    GpuModel,
    Host,
    NodeExporter,
    Phase,
    PhaseKind,
    Scenario,
    default_scenario,
)
from gpulens_testkit.history import Dataset, Family, generate
from gpulens_testkit.k8s_generate import K8sDataset, K8sSeries, Request
from gpulens_testkit.k8s_scenario import AppKind, GpuSlot, K8sNode, K8sScenario, PodSpec, k8s_scenario
from gpulens_testkit.k8s_truth import (
    HistogramTruth,
    K8sTruth,
    PercentileTruth,
    PodTruth,
    RunaiWindow,
    runai_grid,
)
from gpulens_testkit.scenarios import bench_scenario, build_scenario
from gpulens_testkit.truth import ExecutionTruth, GroundTruth, MetricTruth, Stats

__all__ = [
    "AppKind",
    "Dataset",
    "ExecutionSpec",
    "ExecutionTruth",
    "Family",
    "Field",
    "GpuModel",
    "GpuSlot",
    "GroundTruth",
    "HistogramTruth",
    "Host",
    "K8sDataset",
    "K8sNode",
    "K8sScenario",
    "K8sSeries",
    "K8sTruth",
    "MetricTruth",
    "NodeExporter",
    "PercentileTruth",
    "Phase",
    "PhaseKind",
    "PodSpec",
    "PodTruth",
    "Request",
    "RunaiWindow",
    "Scenario",
    "SeriesDef",
    "Stats",
    "bench_scenario",
    "build_scenario",
    "default_scenario",
    "generate",
    "k8s_scenario",
    "runai_grid",
]
