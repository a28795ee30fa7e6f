"""The gpulens server under test, as a separate process whose memory we can read from /proc."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from gpulens.synth.promload import free_port


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


def _get(url: str, timeout_s: float = 1.0) -> int:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            resp.read()
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return exc.code
    except (urllib.error.URLError, OSError):
        return 0


@dataclass
class GpulensServer:
    """`gpulens serve` on 127.0.0.1; `stop()` ends it (idempotent)."""

    port: int
    process: subprocess.Popen[bytes]
    log_path: Path
    _log: IO[bytes] | None = field(default=None, repr=False)

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @classmethod
    def start(
        cls, prometheus_url: str, database_url: str, data_dir: Path, log_path: Path, timeout_s: float = 60.0
    ) -> GpulensServer:
        env = dict(os.environ)
        env["GPULENS_DATA_DIR"] = str(data_dir)
        last = ""
        for _ in range(3):  # a free port can be taken between probing and binding
            port = free_port()
            argv = [
                gpulens_binary(),
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
            log = log_path.open("ab")
            proc = subprocess.Popen(
                argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env
            )
            server = cls(port, proc, log_path, log)
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline:
                if proc.poll() is not None:
                    break
                if _get(server.url + "/healthz") == 200:
                    return server
                time.sleep(0.1)
            server.stop()
            last = server.log_tail()
            if "address already in use" not in last.lower():
                break
        raise ServerError(f"gpulens serve did not become healthy:\n{last}")

    def stop(self, timeout_s: float = 10.0) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout_s)
        if self._log is not None:
            self._log.close()
            self._log = None

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""


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
