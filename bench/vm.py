"""The Lyceum bench data in VictoriaMetrics (bench-data/vm/): imported once, reused while it matches.

The same `bench_scenario` the Prometheus TSDB holds, imported through `/api/v1/import/prometheus`
(gpulens_testkit.promload). The manifest is written after a clean stop (VictoriaMetrics flushes its
in-memory parts on SIGTERM), so an interrupted import means a new import next time.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bench.data import damaged_manifest, manifest_for
from gpulens.demo.scenario import Scenario
from gpulens_testkit.damage import DamageSpec, damage_history
from gpulens_testkit.history import generate
from gpulens_testkit.openmetrics import choose_block_seconds
from gpulens_testkit.promload import ServerHandle, start_victoria_metrics, vm_import_dataset

# `-search.disableCache`: gpulens does not send `nocache=1`, the hand-written baseline does; without the
# flag VictoriaMetrics would serve gpulens' repeated queries from its rollup result cache (not cold).
VM_ARGS = ("-search.disableCache",)
_VERSION = re.compile(rb'vm_app_version\{[^}]*version="([^"]*)"')


@dataclass(frozen=True)
class VmData:
    handle: ServerHandle
    reused: bool
    seconds: float  # spent importing (0 when reused)


def start_vm_data(
    root: Path,
    scenario: Scenario,
    log: Callable[[str], object] = print,
    *,
    timeout_s: float = 120.0,
    damage: DamageSpec | None = None,
) -> VmData:
    """VictoriaMetrics over `root`/vmdata holding `scenario` (damaged by `damage`, when given),
    imported first unless the manifest matches."""
    block_s = choose_block_seconds(scenario.end_s - scenario.start_s)
    manifest = manifest_for(scenario, block_s)
    if damage is not None:
        manifest = damaged_manifest(manifest, damage)
    wanted = {**manifest, "backend": "victoria-metrics"}
    manifest_path = root / "manifest.json"
    data_dir = root / "vmdata"
    try:
        found = json.loads(manifest_path.read_text())
    except (OSError, ValueError):
        found = None
    if found == wanted and data_dir.is_dir():
        return VmData(start_victoria_metrics(data_dir, timeout_s=timeout_s, extra_args=VM_ARGS), True, 0.0)
    what = "the Lyceum bench data" if damage is None else "the damaged Lyceum bench data"
    log(f"importing {what} into VictoriaMetrics in {data_dir} (once; a few minutes)")
    manifest_path.unlink(missing_ok=True)
    shutil.rmtree(data_dir, ignore_errors=True)
    root.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    handle = start_victoria_metrics(data_dir, timeout_s=timeout_s, extra_args=VM_ARGS)
    try:
        dataset = generate(scenario)
        vm_import_dataset(
            handle.url, dataset if damage is None else damage_history(dataset, damage), block_s=block_s
        )
    except BaseException:
        handle.stop()
        raise
    seconds = time.monotonic() - started
    # stop (flushes to disk), write the manifest, start again: the data now survives a crash of this run
    handle.stop(timeout_s=60.0)
    manifest_path.write_text(json.dumps(wanted, indent=1) + "\n")
    return VmData(start_victoria_metrics(data_dir, timeout_s=timeout_s, extra_args=VM_ARGS), False, seconds)


def vm_version(url: str) -> str:
    """`vm_app_version{version=...}` from its /metrics; the Debian build leaves it empty (and its
    -version prints nothing), so then the package's version."""
    try:
        with urllib.request.urlopen(url.rstrip("/") + "/metrics", timeout=30) as resp:
            found = _VERSION.search(resp.read())
    except OSError:
        found = None
    if found and found.group(1):
        return found.group(1).decode()
    try:
        query = ["dpkg-query", "-W", "-f=${Version}", "victoria-metrics"]
        done = subprocess.run(query, capture_output=True, text=True, check=False)
    except OSError:
        return "?"
    return f"{done.stdout.strip()} (Debian package)" if done.returncode == 0 and done.stdout.strip() else "?"
