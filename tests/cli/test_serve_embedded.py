"""`gpulens serve` with no Prometheus: collector -> embedded store -> both dialects, a local admin key."""

from __future__ import annotations

import signal
import socket
import stat
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx

from gpulens_testkit.gpulens_process import serve_env, start_gpulens, wait_ready
from gpulens_testkit.promload import free_port


def test_serve_collects_this_host_and_answers(tmp_path: Path) -> None:
    port = free_port()
    # no GPULENS_PROMETHEUS_URL or GPULENS_DATABASE_URL: the embedded store and SQLite registry
    proc = start_gpulens(["serve"], serve_env(tmp_path, port, GPULENS_FAKE_GPUS="2"))
    base = f"http://127.0.0.1:{port}"
    try:
        wait_ready(base, proc)
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
