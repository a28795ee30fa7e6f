"""`gpulens serve` with GPULENS_LOG_FORMAT=json: every line on stderr is a JSON object, uvicorn's
start-up, access and shutdown lines included, and none holds the caller's key."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import orjson

from gpulens_testkit.promload import free_port


def test_serve_logs_only_json_lines(tmp_path: Path) -> None:
    port = free_port()
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("GPULENS_")},
        "GPULENS_DATA_DIR": str(tmp_path),
        "GPULENS_FAKE_GPUS": "1",
        "GPULENS_COLLECT_INTERVAL": "1",
        "GPULENS_PORT": str(port),
        "GPULENS_LOG_FORMAT": "json",
    }
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gpulens",
            "serve",
            "--log-level",
            "debug",
        ],  # debug: uvicorn's access lines too
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                if httpx.get(f"{base}/readyz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        else:
            raise AssertionError(f"server not ready (exit code {proc.poll()})")
        key = (tmp_path / "admin.key").read_text().strip()
        ok = httpx.get(f"{base}/api/v2/external/billing/history", headers={"Authorization": f"Bearer {key}"})
        assert ok.status_code == 200, ok.text
        refused = httpx.get(
            f"{base}/api/v2/external/billing/history", headers={"Authorization": "Bearer lk_no"}
        )
        assert refused.status_code == 401
        assert httpx.get(f"{base}/no/such/route").status_code == 404
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err[-2000:]
    lines = [orjson.loads(line) for line in err.splitlines()]  # each one JSON, or this fails
    loggers = {line["logger"] for line in lines}
    assert {"gpulens.serve", "uvicorn.error", "uvicorn.access", "gpulens.access"} <= loggers
    assert any(ln["msg"].startswith("Finished server process") for ln in lines), "shutdown logged"
    access = [ln for ln in lines if ln["logger"] == "gpulens.access"]
    assert {(ln["route"], ln["status"], ln["org"]) for ln in access} >= {
        ("/api/v2/external/billing/history", 200, "local"),
        ("/api/v2/external/billing/history", 401, None),
        ("unmatched", 404, None),
    }
    assert key not in err and key[:12] not in err
    assert [ln for ln in lines if ln["level"] in ("error", "critical")] == []
    assert key in out  # the first-start admin key goes to stdout, once
