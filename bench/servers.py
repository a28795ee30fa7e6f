"""The gpulens server under test, as a separate process whose memory we can read from /proc."""

from __future__ import annotations

import os
import shutil
import sys
from dataclasses import dataclass
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


def parse_status_kib(text: str, key: str) -> int:
    """A field of `/proc/<pid>/status` text in KiB (`VmRSS:\t  123456 kB` -> 123456)."""
    for line in text.splitlines():
        name, sep, rest = line.partition(":")
        if sep and name == key:
            value, *unit = rest.split()
            if unit and unit[0] != "kB":
                raise ValueError(f"{key}: unit {unit[0]!r}, expected kB")
            return int(value)
    raise KeyError(key)


def proc_status_kib(pid: int, key: str) -> int:
    """A `/proc/<pid>/status` field in KiB (VmRSS, VmHWM, ...)."""
    return parse_status_kib(Path(f"/proc/{pid}/status").read_text(), key)


@dataclass(frozen=True)
class Rss:
    """A process' resident memory (KiB): VmRSS now and VmHWM, the peak since the last reset."""

    rss_kib: int
    peak_kib: int

    @classmethod
    def of(cls, pid: int) -> Rss:
        text = Path(f"/proc/{pid}/status").read_text()
        return cls(parse_status_kib(text, "VmRSS"), parse_status_kib(text, "VmHWM"))


def reset_peak_rss(pid: int) -> bool:
    """`echo 5 > /proc/<pid>/clear_refs`: VmHWM restarts from the current RSS (False if not allowed)."""
    try:
        Path(f"/proc/{pid}/clear_refs").write_text("5")
    except OSError:
        return False
    return True
