"""The public lyceum CLI (its own venv, unchanged) against a live gpulens over a real Prometheus."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gpulens_testkit.promload import LoadedDataset
from tests.conftest import missing_server
from tests.integration.conftest import serve_app
from tests.integration.lyceum_app import LiveApi, build

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


def lyceum_binary() -> str:
    candidate = os.environ.get("GPULENS_LYCEUM_CLI") or str(ROOT / ".venv-lyceum" / "bin" / "lyceum")
    if not Path(candidate).exists():
        found = shutil.which("lyceum")
        if found is None:
            missing_server("lyceum-cli (make lyceum-cli)")
        return str(found)
    return candidate


@pytest.fixture(scope="module")
def served(
    prom_dataset: LoadedDataset, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[LiveApi, str]]:
    api = build(prom_dataset, Path(tmp_path_factory.mktemp("cli")))
    try:
        with serve_app(api.client.app) as url:
            yield api, url
    finally:
        api.registry.dispose()


def lyceum(served: tuple[LiveApi, str], tmp_path: Path, *args: str) -> str:
    api, url = served
    home = tmp_path / "home"
    (home / ".lyceum").mkdir(parents=True, exist_ok=True)
    (home / ".lyceum" / "config.json").write_text(json.dumps({"api_key": api.key, "base_url": url}))
    env = {
        "HOME": str(home),
        "PATH": os.environ.get("PATH", ""),
        "COLUMNS": "200",
        "NO_COLOR": "1",
        "TERM": "dumb",
    }
    done = subprocess.run([lyceum_binary(), *args], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def fmt_bytes(value: float) -> str:  # the CLI's own rule
    for unit in ["B", "KB", "MB", "GB", "TB"]:
        if value < 1024:
            return f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} PB"


def test_jobs_metrics_prints_ground_truth(served: tuple[LiveApi, str], tmp_path: Path) -> None:
    api, _ = served
    for name in ("healthy", "oom", "cpu-only"):
        e = api.data.scenario.execution(name)
        out = lyceum(served, tmp_path, "jobs", "metrics", e.execution_id)
        truth = api.data.truth.execution(name, api.data.truth.execution_window(name, 15_000))
        rows = [
            ("GPU utilization", "gpuUtilizationPercent", "%"),
            ("GPU memory", "gpuMemoryUtilizationPercent", "%"),
            ("GPU temperature", "gpuTemperatureCelsius", "°C"),
            ("GPU power", "gpuPowerWatt", "W"),
            ("CPU usage", "systemCpuUsagePercent", "%"),
            ("RAM used", "systemRamUsedBytes", "B"),
        ]
        for label, key, unit in rows:
            values = [v for _, v in truth[key].points()]
            line = next((ln for ln in out.splitlines() if label in ln), None)
            if not values:
                assert line is None, (name, label)
                continue
            assert line is not None, (name, label, out)
            avg, peak = sum(values) / len(values), max(values)
            if unit == "B":
                assert fmt_bytes(avg) in line and fmt_bytes(peak) in line, line
            else:
                assert f"{avg:.1f} {unit}" in line and f"{peak:.1f} {unit}" in line, (line, avg, peak)
        window = truth.window
        assert f"{e.start:%Y-%m-%d %H:%M:%S} → {e.end:%Y-%m-%d %H:%M:%S}" in out
        assert window.start_ms == e.start_s * 1000


def test_jobs_status_list_and_history(served: tuple[LiveApi, str], tmp_path: Path) -> None:
    api, url = served
    e = api.data.scenario.execution("oom")
    status = lyceum(served, tmp_path, "jobs", "status", e.execution_id)
    assert "failed" in status and "oom.py" in status and "gpu.h100" in status
    assert f"{e.start:%Y-%m-%d %H:%M:%S}" in status
    # make one execution running so `jobs list` has something to print
    running = api.data.scenario.execution("healthy")
    r = httpx.patch(
        f"{url}/api/v2/admin/executions/{running.execution_id}",
        json={"status": "running", "end_time": None},
        headers={"Authorization": f"Bearer {api.admin_key}"},
    )
    assert r.status_code == 200, r.text
    listing = lyceum(served, tmp_path, "jobs", "list")
    assert running.execution_id in listing and e.execution_id not in listing
    history = lyceum(served, tmp_path, "jobs", "history", "--json")
    ids: list[Any] = [x["execution_id"] for x in json.loads(history)]
    assert set(ids) == {x.execution_id for x in api.data.scenario.executions}
    r = httpx.patch(
        f"{url}/api/v2/admin/executions/{running.execution_id}",
        json={"status": "completed", "end_time": f"{running.end:%Y-%m-%dT%H:%M:%SZ}"},
        headers={"Authorization": f"Bearer {api.admin_key}"},
    )
    assert r.status_code == 200


def test_key_commands(served: tuple[LiveApi, str], tmp_path: Path) -> None:
    out = lyceum(served, tmp_path, "auth", "keys", "create", "ci-key")
    assert "lk_" in out
    listing = lyceum(served, tmp_path, "auth", "keys", "list", "--json")
    assert "ci-key" in [k["key_name"] for k in json.loads(listing)]
