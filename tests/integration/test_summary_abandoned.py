"""Issue 21's probe, on uvicorn as `gpulens serve` runs it: 24 summaries of a year-long running
execution (8 GPUs, tests/service/long_env.py), each client gone 0.2 s (or 1 s) after it asked. The server
answers none of them and, a second later, no longer uses the CPU (the probe found 1.2-1.5 cores busy
for 7 s after the clients had gone)."""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.conftest import serve_app
from tests.service.long_env import LongEnv, build_long, long_id, summary_path

pytestmark = pytest.mark.integration


@pytest.fixture
def year(tmp_path: Path) -> Iterator[LongEnv]:
    levels = {name: logging.getLogger(name).level for name in ("uvicorn", "uvicorn.error", "uvicorn.access")}
    built = build_long(tmp_path, days=(365,), gpus=8, concurrency=2)
    try:
        yield built
    finally:
        built.close()
        for name, level in levels.items():  # uvicorn sets its loggers' levels for the whole process
            logging.getLogger(name).setLevel(level)


@pytest.mark.parametrize("after_s", [0.2, 1.0])  # while reading; while computing
def test_abandoned_summaries_leave_the_cpu_idle_within_a_second(year: LongEnv, after_s: float) -> None:
    with serve_app(year.app) as url:
        host, port = url.removeprefix("http://").split(":")
        head = (
            f"GET {summary_path(long_id(365))} HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {year.key}"
        )
        sockets = []
        for _ in range(24):
            sock = socket.create_connection((host, int(port)), timeout=10)
            sock.sendall(f"{head}\r\n\r\n".encode())
            sockets.append(sock)
        time.sleep(after_s)
        for sock in sockets:
            sock.close()
        gone = time.monotonic()
        deadline = gone + 5
        figures = year.stored.figures
        while (figures().computing or figures().waiting) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert figures().computing == 0 and figures().waiting == 0
        time.sleep(max(0.0, gone + 1.0 - time.monotonic()))
        cpu, wall = time.process_time(), time.perf_counter()
        time.sleep(1.0)
        used = (time.process_time() - cpu) / (time.perf_counter() - wall)
    assert used < 0.15, f"{used:.2f} of a core still busy from 1 s to 2 s after the clients went away"
