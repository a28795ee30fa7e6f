"""The gpulens server under test, as a separate process whose memory we can read from /proc."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from gpulens_testkit.promload import ServerHandle, start_server


class ServerError(RuntimeError):
    pass


def gpulens_binary() -> str:
    beside = Path(sys.executable).parent / "gpulens"
    if beside.exists():
        return str(beside)
    found = shutil.which("gpulens")
    if found is None:
        raise ServerError("the `gpulens` script was not found (run `make venv`)")
    return found


def start_gpulens(
    prometheus_url: str, database_url: str, data_dir: Path, log_path: Path, timeout_s: float = 60.0
) -> ServerHandle:
    """`gpulens serve` on 127.0.0.1 (a free port), healthy when this returns; `stop()` ends it."""
    binary = gpulens_binary()
    env = {**os.environ, "GPULENS_DATA_DIR": str(data_dir)}

    def argv(port: int) -> list[str]:
        return [
            binary,
            "serve",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--prometheus-url",
            prometheus_url,
            "--database",
            database_url,
            "--log-level",
            "warning",
        ]

    return start_server("gpulens", argv, "/healthz", data_dir, log_path, timeout_s=timeout_s, env=env)


def proc_status_kib(pid: int, key: str) -> int:
    """A `/proc/<pid>/status` field in KiB (VmRSS, VmHWM, ...)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise KeyError(key)


def reset_peak_rss(pid: int) -> bool:
    """`echo 5 > /proc/<pid>/clear_refs`: VmHWM restarts from the current RSS (False if not allowed)."""
    try:
        Path(f"/proc/{pid}/clear_refs").write_text("5")
    except OSError:
        return False
    return True
