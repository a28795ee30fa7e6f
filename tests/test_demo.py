"""`gpulens demo`: set-up twice (store and key reused), and gpulens answering over the demo."""

from __future__ import annotations

import json
import signal
import socket
import sqlite3
import stat
import time
from pathlib import Path

import httpx
import pytest

from gpulens import demo
from gpulens.api.app import create_app
from gpulens.cli.main import main
from gpulens.demo.scenario import default_scenario
from gpulens.storage.registry import Registry
from gpulens_testkit.gpulens_process import serve_env, start_gpulens, wait_ready
from gpulens_testkit.promload import free_port
from tests.api.conftest import Client

NAMES = ("healthy", "throttled", "oom", "input-bound", "cpu-only")


@pytest.fixture(autouse=True)
def _no_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("GPULENS_DATA_DIR", "GPULENS_HOST", "GPULENS_PORT", "GPULENS_DATABASE_URL"):
        monkeypatch.delenv(name, raising=False)


def test_no_serve_twice_reuses_store_and_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))  # no Prometheus (nor anything else) on PATH
    data_dir = tmp_path / "demo"
    assert main(["demo", "--no-serve", "--data-dir", str(data_dir)]) == 0
    first = capsys.readouterr()
    assert "generating" in first.err
    key_file = data_dir / "demo.key"
    key = key_file.read_text().strip()
    assert key.startswith("lk_")
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    store = data_dir / "samples.db"
    assert store.is_file() and not (data_dir / "samples.db.partial").exists()
    built = store.stat().st_mtime_ns

    assert main(["demo", "--no-serve", "--data-dir", str(data_dir)]) == 0
    second = capsys.readouterr()
    assert "reusing" in second.err and "generating" not in second.err
    assert key_file.read_text().strip() == key
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    assert store.stat().st_mtime_ns == built  # not rewritten

    scenario = default_scenario()
    healthy = scenario.execution("healthy").execution_id
    out = second.out
    assert f"in the embedded store at {store}" in out and "Prometheus" not in out
    assert key in out
    assert "http://127.0.0.1:8080" in out
    assert f"/api/v2/external/execution/{healthy}/metrics?step=1m" in out and "head -c 600" in out
    assert f"lyceum jobs metrics {healthy}" in out and "~/.lyceum/config.json" in out
    throttled = scenario.execution("throttled").execution_id
    assert "http://127.0.0.1:8080/   (sign in with the key)" in out
    assert f"http://127.0.0.1:8080/ui/executions/{throttled}" in out
    assert f"gpulens report {throttled} --demo" in out
    for e in scenario.executions:
        assert e.execution_id in out and e.name in out

    registry = Registry.from_url(f"sqlite:///{data_dir / 'demo.db'}")
    try:
        stored, total = registry.list_executions(org="demo")
        assert total == 5
        by_id = {e.execution_id: e for e in stored}
        for spec in scenario.executions:
            got = by_id[spec.execution_id]
            assert (got.hostname, got.status, got.start_time, got.end_time) == (
                spec.hostname,
                spec.status,
                spec.start,
                spec.end,
            )
            assert got.gpus == tuple(str(g) for g in spec.gpus)
            assert got.file_name is not None and got.file_name.endswith(".py")
        assert by_id[healthy].hardware_profile == "gpu.h100"
        assert by_id[scenario.execution("cpu-only").execution_id].hardware_profile == "cpu"
        assert [k.name for k in registry.list_keys("demo")] == ["demo"]  # one key, not one per start
    finally:
        registry.dispose()


def test_metrics_over_the_demo_store(tmp_path: Path) -> None:
    with demo.prepare(tmp_path / "demo") as env:
        assert [e.name for e in env.executions] == list(NAMES)
        assert env.settings().prometheus_url is None
        app = create_app(env.settings(), registry=env.registry, backend=env.backend())
        client = Client(app)

        def metrics(name: str) -> dict[str, list[object]]:
            response = client.get(
                f"/api/v2/external/execution/{env.execution(name).execution_id}/metrics",
                params={"step": "1m"},
                headers={"Authorization": f"Bearer {env.key}"},
            )
            assert response.status_code == 200, response.text
            return {k: v for k, v in response.json().items() if isinstance(v, list)}  # the 12 arrays

        healthy = metrics("healthy")
        assert len(healthy) == 12, sorted(healthy)
        assert all(healthy.values()), sorted(k for k, v in healthy.items() if not v)
        cpu_only = metrics("cpu-only")  # no GPUs: the GPU arrays are empty, the system ones are not
        assert len(cpu_only) == 12
        assert {k for k, v in cpu_only.items() if v} == {k for k in cpu_only if k.startswith("system")}
        store = env.store
    with pytest.raises(sqlite3.ProgrammingError):  # closed on leaving the block
        store.write([])


def test_port_taken_is_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["demo", "--data-dir", str(tmp_path / "demo"), "--port", str(port)]) == 2
    captured = capsys.readouterr()
    assert f"127.0.0.1:{port}" in captured.err and "--port" in captured.err
    assert len(captured.err.strip().splitlines()) == 1
    assert not (tmp_path / "demo").exists()  # nothing was set up


def test_base_url_maps_wildcards_to_loopback() -> None:
    assert demo.base_url("0.0.0.0", 8080) == "http://127.0.0.1:8080"
    assert demo.base_url("::", 9000) == "http://[::1]:9000"
    assert demo.base_url("gpu-box", 80) == "http://gpu-box:80"


def test_demo_serves_the_api_and_dashboard_until_sigterm(tmp_path: Path) -> None:
    """`gpulens demo --port N` as a user runs it: the API and the dashboard answer; SIGTERM stops it."""
    port, data_dir = free_port(), tmp_path / "demo"
    env = serve_env(data_dir, port, GPULENS_LOG_FORMAT="json")  # server lines as JSON, as serve writes them
    args = ["demo", "--data-dir", str(data_dir), "--port", str(port), "--log-level", "info"]
    proc = start_gpulens(args, env)
    base = f"http://127.0.0.1:{port}"
    healthy = default_scenario().execution("healthy").execution_id
    try:
        wait_ready(base, proc, timeout_s=120)
        key = (data_dir / "demo.key").read_text().strip()
        r = httpx.get(
            f"{base}/api/v2/external/execution/{healthy}/metrics",
            params={"step": "5m"},
            headers={"Authorization": f"Bearer {key}"},
        )
        assert r.status_code == 200, r.text
        assert r.json()["gpuUtilizationPercent"]
        assert httpx.get(f"{base}/").status_code == 200
        assert httpx.get(f"{base}/ui/executions/{healthy}").status_code == 200
        # the runs' summaries are stored from the start: the fleet usage table has them, priced
        window = {"start": "2025-12-31T00:00:00Z", "end": "2026-01-01T01:00:00Z", "group_by": "user"}
        rows: list[dict[str, object]] = []
        deadline = time.monotonic() + 60
        while len(rows) < 3 and time.monotonic() < deadline:
            time.sleep(0.5)
            usage = httpx.get(
                f"{base}/api/v2/external/usage", params=window, headers={"Authorization": f"Bearer {key}"}
            )
            assert usage.status_code == 200, usage.text
            rows = usage.json()["rows"]
        assert {r["group"]["user"] for r in rows} == {"alice", "bob", "carol"}  # type: ignore[index]
        assert all(isinstance(r["cost"], float) and r["cost"] > 0 for r in rows)
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert "Serving until Ctrl-C." in out and f"{base}/ui/executions/" in out
    assert err.rstrip().endswith("gpulens demo: stopped")
    logged = [json.loads(line) for line in err.splitlines() if line.startswith("{")]
    assert any(r.get("msg") == "Application startup complete." for r in logged), err
