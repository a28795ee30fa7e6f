"""The benchmark's Prometheus TSDB under bench-data/: built once, reused while its manifest matches."""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from importlib import import_module
from pathlib import Path
from types import ModuleType
from typing import Generic, TypeVar

from gpulens.demo import history as synth_generate
from gpulens.demo import scenario as synth_scenario
from gpulens.demo.scenario import Scenario
from gpulens.domain import catalog, workloads
from gpulens_testkit import damage as synth_damage
from gpulens_testkit import history as synth_history
from gpulens_testkit import k8s_generate as synth_k8s_generate
from gpulens_testkit import openmetrics as synth_openmetrics
from gpulens_testkit import scenarios as synth_scenarios
from gpulens_testkit.damage import DamagePlan, DamageSpec, damage_history, damage_k8s, history_plan, k8s_plan
from gpulens_testkit.history import generate
from gpulens_testkit.k8s_generate import K8sDataset
from gpulens_testkit.k8s_scenario import K8sScenario, k8s_scenario
from gpulens_testkit.openmetrics import Exposable, choose_block_seconds
from gpulens_testkit.promload import backfill_dataset
from gpulens_testkit.scenarios import bench_scenario

MANIFEST_VERSION = 1
SEED = 11
DAYS = 31  # the 30-day case plus a day of margin (the rate window and the lookback reach back)
K8S_SEED = 21
K8S_HOURS = 26  # the 24 h Run:ai case, starting after the pods did (llm-serve-0 starts at +65 min)


ScenarioT = TypeVar("ScenarioT", Scenario, K8sScenario)


@dataclass(frozen=True)
class BenchData(Generic[ScenarioT]):
    scenario: ScenarioT
    tsdb: Path
    block_s: int
    reused: bool
    seconds: float  # time spent generating and backfilling (0 when reused)
    damage: DamagePlan | None = None  # where the damage is (damaged data only)


# `gpulens_testkit` re-exports the function `k8s_scenario` under its module's name, so
# `from gpulens_testkit import k8s_scenario` is the function: the module is taken by its full name
synth_k8s_scenario = import_module("gpulens_testkit.k8s_scenario")

# the modules the generated data depends on: series and label names come from the catalog
SOURCES: tuple[ModuleType, ...] = (
    catalog,
    synth_scenario,
    synth_scenarios,
    synth_generate,
    synth_history,
    synth_openmetrics,
)
K8S_SOURCES: tuple[ModuleType, ...] = (*SOURCES, workloads, synth_k8s_scenario, synth_k8s_generate)
DAMAGED_SOURCES: tuple[ModuleType, ...] = (*K8S_SOURCES, synth_damage)


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


def prepare(root: Path, log: Callable[[str], object] = print) -> BenchData[Scenario]:
    """`root`/tsdb holding `bench_scenario(days=DAYS)`; rebuilt unless `root`/manifest.json matches."""
    scenario = bench_scenario(seed=SEED, days=DAYS)
    return _prepare(
        root,
        scenario,
        manifest_for,
        lambda: generate(scenario),
        f"building {DAYS} days of synthetic data for 1 host x 8 GPUs in {root / 'tsdb'} "
        "(once; about a minute)",
        log,
    )


def _prepare(
    root: Path,
    scenario: ScenarioT,
    manifest: Callable[[ScenarioT, int], dict[str, object]],
    make: Callable[[], Exposable],
    announce: str,
    log: Callable[[str], object],
) -> BenchData[ScenarioT]:
    """`root`/tsdb holding what `make` generates for `scenario`, as `manifest` describes it."""
    block_s = choose_block_seconds(scenario.end_s - scenario.start_s)
    tsdb, reused, seconds = build_or_reuse(
        root, manifest(scenario, block_s), make, block_s, lambda: log(announce)
    )
    return BenchData(scenario, tsdb, block_s, reused, seconds)


def build_or_reuse(
    root: Path,
    wanted: dict[str, object],
    make: Callable[[], Exposable],
    block_s: int,
    announce: Callable[[], object],
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


def prepare_k8s(root: Path, log: Callable[[str], object] = print) -> BenchData[K8sScenario]:
    """`root`/tsdb holding `k8s_scenario(hours=K8S_HOURS)`; rebuilt unless `root`/manifest.json matches."""
    scenario = k8s_scenario(seed=K8S_SEED, hours=K8S_HOURS)
    return _prepare(
        root,
        scenario,
        k8s_manifest_for,
        lambda: K8sDataset(scenario),
        f"building {K8S_HOURS} h of synthetic k8s data ({len(scenario.nodes)} nodes, "
        f"{len(scenario.pods)} pods) in {root / 'tsdb'} (once; under a minute)",
        log,
    )


# -- the same data damaged (bench-data/damaged/, bench-data/damaged/k8s/) --------------------------------


def damaged_manifest(manifest: dict[str, object], spec: DamageSpec) -> dict[str, object]:
    """A clean data set's manifest, for the same data damaged by `spec` (its own generator digest)."""
    return {**manifest, "damage": spec.as_json(), "synth_source": _source_digest(DAMAGED_SOURCES)}


def prepare_damaged(
    root: Path, spec: DamageSpec, log: Callable[[str], object] = print
) -> BenchData[Scenario]:
    """`root`/tsdb holding `prepare`'s data damaged by `spec` (gpulens_testkit/damage.py)."""
    scenario = bench_scenario(seed=SEED, days=DAYS)
    data = _prepare(
        root,
        scenario,
        lambda sc, block_s: damaged_manifest(manifest_for(sc, block_s), spec),
        lambda: damage_history(generate(scenario), spec),
        f"building {DAYS} days of damaged synthetic data for 1 host x 8 GPUs in {root / 'tsdb'} "
        "(once; a minute or two)",
        log,
    )
    return replace(data, damage=history_plan(scenario, spec))


def prepare_k8s_damaged(
    root: Path, spec: DamageSpec, log: Callable[[str], object] = print
) -> BenchData[K8sScenario]:
    """`root`/tsdb holding `prepare_k8s`' data with its dcgm-exporter series damaged by `spec`."""
    scenario = k8s_scenario(seed=K8S_SEED, hours=K8S_HOURS)
    data = _prepare(
        root,
        scenario,
        lambda sc, block_s: damaged_manifest(k8s_manifest_for(sc, block_s), spec),
        lambda: damage_k8s(K8sDataset(scenario), spec),
        f"building {K8S_HOURS} h of damaged synthetic k8s data in {root / 'tsdb'} (once; under a minute)",
        log,
    )
    return replace(data, damage=k8s_plan(scenario, spec))
