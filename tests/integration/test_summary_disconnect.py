"""A summary request whose client closes its socket stops its work, on uvicorn as `gpulens serve` runs
it: the backend reads in flight are cancelled and the summary's computation never starts (the ASGI-level
cases are in tests/api/lyceum/test_summary_routes.py)."""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.api.lyceum.test_summary_routes import no_compute, summary_path
from tests.integration.conftest import serve_app
from tests.service.summary_env import DONE, Env, build

pytestmark = pytest.mark.integration


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Env]:
    levels = {name: logging.getLogger(name).level for name in ("uvicorn", "uvicorn.error", "uvicorn.access")}
    built = build(tmp_path)
    try:
        yield built
    finally:
        built.close()
        for name, level in levels.items():  # uvicorn sets its loggers' levels for the whole process
            logging.getLogger(name).setLevel(level)


def test_a_closed_socket_cancels_the_summary_on_uvicorn(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    started = no_compute(env, monkeypatch)
    env.backend.held = True
    with serve_app(env.app) as url:
        host, port = url.removeprefix("http://").split(":")
        sock = socket.create_connection((host, int(port)), timeout=10)
        try:
            head = f"GET {summary_path(DONE)} HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {env.key}"
            sock.sendall(f"{head}\r\n\r\n".encode())
            deadline = time.monotonic() + 10
            while env.backend.asked == 0 and time.monotonic() < deadline:
                time.sleep(0.02)
            assert env.backend.asked > 0
        finally:
            sock.close()
        deadline = time.monotonic() + 5
        while env.backend.cancelled == 0 and time.monotonic() < deadline:
            time.sleep(0.02)
        try:
            assert env.backend.cancelled >= 1, "the read went on after the client had gone"
            assert started == []
        finally:
            env.backend.release()
