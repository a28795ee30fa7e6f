"""`gpulens serve` with no Prometheus: collector -> embedded store -> both dialects, a local admin key."""

from __future__ import annotations

import os
import signal
import socket
import stat
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx

from gpulens_testkit.promload import free_port


def test_serve_collects_this_host_and_answers(tmp_path: Path) -> None:
    port = free_port()
    env = {
        **os.environ,
        "GPULENS_DATA_DIR": str(tmp_path),
        "GPULENS_FAKE_GPUS": "2",
        "GPULENS_COLLECT_INTERVAL": "1",
        "GPULENS_PORT": str(port),
        "GPULENS_PROMETHEUS_URL": "",
        "GPULENS_DATABASE_URL": "",
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpulens", "serve"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{base}/readyz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        else:
            raise AssertionError("server did not become ready")
        key_file = tmp_path / "admin.key"
        assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
        key = key_file.read_text().strip()
        headers = {"Authorization": f"Bearer {key}"}
        host = socket.gethostname()
        start = (datetime.now(UTC) - timedelta(seconds=5)).strftime("%Y-%m-%dT%H:%M:%SZ")
        r = httpx.post(
            f"{base}/api/v2/admin/executions",
            headers=headers,
            json={"org": "local", "hostname": host, "status": "running", "start_time": start},
        )
        assert r.status_code == 201, r.text
        eid = r.json()["execution_id"]
        time.sleep(3)
        body = httpx.get(
            f"{base}/api/v2/execution/{eid}/metrics".replace("/v2/", "/v2/external/"),
            params={"step": "1s"},
            headers=headers,
        ).json()
        for key_ in ("gpuUtilizationPercent", "gpuPowerWatt", "systemRamTotalBytes", "systemRamUsedBytes"):
            assert body[key_], key_
        assert body["hostname"] == host
    finally:
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    assert "created org 'local' and its admin key" in out
    assert proc.returncode == 0, err
