"""`gpulens serve` with GPULENS_LOG_FORMAT=json: every line on stderr is a JSON object, uvicorn's
start-up, access and shutdown lines included, and none holds the caller's key."""

from __future__ import annotations

import signal
from pathlib import Path

import httpx
import orjson

from gpulens_testkit.gpulens_process import serve_env, start_gpulens, wait_ready
from gpulens_testkit.promload import free_port


def test_serve_logs_only_json_lines(tmp_path: Path) -> None:
    port = free_port()
    env = serve_env(tmp_path, port, GPULENS_LOG_FORMAT="json")
    proc = start_gpulens(["serve", "--log-level", "debug"], env)  # debug: uvicorn's access lines too
    base = f"http://127.0.0.1:{port}"
    try:
        wait_ready(base, proc)
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
