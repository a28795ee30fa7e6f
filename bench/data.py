"""The benchmark's Prometheus TSDB under bench-data/: built once, reused while its manifest matches."""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from gpulens.domain import catalog, workloads
from gpulens.synth import generate as synth_generate
from gpulens.synth import k8s_generate as synth_k8s_generate
from gpulens.synth import k8s_scenario as synth_k8s_scenario
from gpulens.synth import openmetrics as synth_openmetrics
from gpulens.synth import scenario as synth_scenario
from gpulens.synth.generate import generate
from gpulens.synth.k8s_generate import K8sDataset
from gpulens.synth.k8s_scenario import K8sScenario, k8s_scenario
from gpulens.synth.openmetrics import choose_block_seconds
from gpulens.synth.promload import backfill_dataset
from gpulens.synth.scenario import Scenario, bench_scenario

MANIFEST_VERSION = 1
SEED = 11
DAYS = 31  # the 30-day case plus a day of margin (the rate window and the lookback reach back)
K8S_SEED = 21
K8S_HOURS = 26  # the 24 h Run:ai case, starting after the pods did (llm-serve-0 starts at +65 min)


@dataclass(frozen=True)
class BenchData:
    scenario: Scenario
    tsdb: Path
    block_s: int
    reused: bool
    seconds: float  # time spent generating and backfilling (0 when reused)


# the modules the generated data depends on: series and label names come from the catalog
SOURCES: tuple[ModuleType, ...] = (catalog, synth_scenario, synth_generate, synth_openmetrics)
K8S_SOURCES: tuple[ModuleType, ...] = (*SOURCES, workloads, synth_k8s_scenario, synth_k8s_generate)


def _source_digest(modules: tuple[ModuleType, ...] = SOURCES) -> str:
    """The generator's source: data built by another version is rebuilt."""
    digest = hashlib.sha256()
    for module in modules:
        assert module.__file__ is not None
        digest.update(Path(module.__file__).read_bytes())
    return digest.hexdigest()[:16]


def manifest_for(scenario: Scenario, block_s: int) -> dict[str, object]:
    return {
        "version": MANIFEST_VERSION,
        "scenario": scenario.name,
        "seed": scenario.seed,
        "days": DAYS,
        "start_s": scenario.start_s,
        "end_s": scenario.end_s,
        "scrape_interval_s": scenario.scrape_interval_s,
        "hosts": [h.hostname for h in scenario.hosts],
        "block_s": block_s,
        "synth_source": _source_digest(),
    }


def prepare(root: Path, log: object = print) -> BenchData:
    """`root`/tsdb holding `bench_scenario(days=DAYS)`; rebuilt unless `root`/manifest.json matches."""
    scenario = bench_scenario(seed=SEED, days=DAYS)
    block_s = choose_block_seconds(scenario.end_s - scenario.start_s)
    wanted = manifest_for(scenario, block_s)
    assert callable(log)
    tsdb, reused, seconds = build_or_reuse(
        root,
        wanted,
        lambda: generate(scenario),
        block_s,
        lambda: log(
            f"building {DAYS} days of synthetic data for 1 host x 8 GPUs in {root / 'tsdb'} "
            "(once; about a minute)"
        ),
    )
    return BenchData(scenario, tsdb, block_s, reused, seconds)


def build_or_reuse(
    root: Path, wanted: dict[str, object], make: Callable[[], Any], block_s: int, announce: Callable[[], None]
) -> tuple[Path, bool, float]:
    """`root`/tsdb as the manifest describes: reused when `root`/manifest.json matches, else rebuilt
    (the manifest is written last, so a crash means a rebuild). Returns (tsdb, reused, seconds)."""
    manifest_path = root / "manifest.json"
    tsdb = root / "tsdb"
    try:
        found = json.loads(manifest_path.read_text())
    except (OSError, ValueError):
        found = None
    if found == wanted and tsdb.is_dir():
        return tsdb, True, 0.0
    announce()
    root.mkdir(parents=True, exist_ok=True)
    manifest_path.unlink(missing_ok=True)
    shutil.rmtree(tsdb, ignore_errors=True)
    spool = root / "spool"
    shutil.rmtree(spool, ignore_errors=True)
    started = time.monotonic()
    backfill_dataset(make(), tsdb, spool, block_s=block_s, jobs=2)
    shutil.rmtree(spool, ignore_errors=True)
    seconds = time.monotonic() - started
    manifest_path.write_text(json.dumps(wanted, indent=1) + "\n")
    return tsdb, False, seconds


# -- the Run:ai section's k8s data (bench-data/k8s/) ----------------------------------------------------


@dataclass(frozen=True)
class K8sBenchData:
    scenario: K8sScenario
    tsdb: Path
    block_s: int
    reused: bool
    seconds: float  # time spent generating and backfilling (0 when reused)


def k8s_manifest_for(scenario: K8sScenario, block_s: int) -> dict[str, object]:
    return {
        "version": MANIFEST_VERSION,
        "scenario": scenario.name,
        "seed": scenario.seed,
        "hours": K8S_HOURS,
        "start_s": scenario.start_s,
        "end_s": scenario.end_s,
        "scrape_interval_s": scenario.scrape_interval_s,
        "nodes": [n.hostname for n in scenario.nodes],
        "pods": [f"{p.namespace}/{p.name}" for p in scenario.pods],
        "block_s": block_s,
        "synth_source": _source_digest(K8S_SOURCES),
    }


def prepare_k8s(root: Path, log: object = print) -> K8sBenchData:
    """`root`/tsdb holding `k8s_scenario(hours=K8S_HOURS)`; rebuilt unless `root`/manifest.json matches."""
    scenario = k8s_scenario(seed=K8S_SEED, hours=K8S_HOURS)
    block_s = choose_block_seconds(scenario.end_s - scenario.start_s)
    wanted = k8s_manifest_for(scenario, block_s)
    assert callable(log)
    tsdb, reused, seconds = build_or_reuse(
        root,
        wanted,
        lambda: K8sDataset(scenario),
        block_s,
        lambda: log(
            f"building {K8S_HOURS} h of synthetic k8s data ({len(scenario.nodes)} nodes, "
            f"{len(scenario.pods)} pods) in {root / 'tsdb'} (once; under a minute)"
        ),
    )
    return K8sBenchData(scenario, tsdb, block_s, reused, seconds)
