"""Deterministic synthetic dcgm-exporter + node-exporter history, its ground truth, and loaders."""

from __future__ import annotations

from gpulens.synth.generate import Dataset, Field, SeriesDef, generate
from gpulens.synth.scenario import (
    ExecutionSpec,
    GpuModel,
    Host,
    NodeExporter,
    Phase,
    PhaseKind,
    Scenario,
    bench_scenario,
    build_scenario,
    default_scenario,
)
from gpulens.synth.truth import ExecutionTruth, GroundTruth, MetricTruth, Stats

__all__ = [
    "Dataset",
    "ExecutionSpec",
    "ExecutionTruth",
    "Field",
    "GpuModel",
    "GroundTruth",
    "Host",
    "MetricTruth",
    "NodeExporter",
    "Phase",
    "PhaseKind",
    "Scenario",
    "SeriesDef",
    "Stats",
    "bench_scenario",
    "build_scenario",
    "default_scenario",
    "generate",
]
