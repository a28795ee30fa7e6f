"""The one server runner (`gpulens serve`, `gpulens demo`): a taken port fails at once; SIGTERM ends it."""

from __future__ import annotations

import signal
import socket
import time
from pathlib import Path

import pytest

from gpulens.cli.main import main
from gpulens.cli.serving import bind
from gpulens_testkit.gpulens_process import serve_env, start_gpulens, wait_ready
from gpulens_testkit.promload import free_port


def test_serve_on_a_taken_port_fails_before_setting_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    data_dir = tmp_path / "data"
    monkeypatch.setenv("GPULENS_DATA_DIR", str(data_dir))
    monkeypatch.setenv("GPULENS_PROMETHEUS_URL", "")
    monkeypatch.delenv("GPULENS_DATABASE_URL", raising=False)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        started = time.monotonic()
        assert main(["serve", "--host", "127.0.0.1", "--port", str(port)]) == 2
        assert time.monotonic() - started < 5
    err = capsys.readouterr().err
    assert f"127.0.0.1:{port}" in err and "--port" in err
    assert len(err.strip().splitlines()) == 1
    assert not data_dir.exists()  # no registry, store or key was made


def test_bind_listens_before_the_app_exists() -> None:
    sock = bind("127.0.0.1", 0)
    try:
        port = sock.getsockname()[1]
        with socket.create_connection(("127.0.0.1", port), timeout=2):  # accepted into the backlog
            pass
        with pytest.raises(OSError):
            bind("127.0.0.1", port)
    finally:
        sock.close()


def test_serve_stops_on_sigterm_with_exit_0(tmp_path: Path) -> None:
    port = free_port()
    proc = start_gpulens(["serve", "--log-level", "warning"], serve_env(tmp_path, port))
    try:
        wait_ready(f"http://127.0.0.1:{port}", proc)
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err  # not killed by the signal uvicorn re-raises
    assert "Traceback" not in err


def test_an_unknown_log_level_is_a_usage_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPULENS_DATA_DIR", str(tmp_path / "data"))
    for command in ("serve", "demo"):
        assert main([command, "--log-level", "loud"]) == 2  # typer's usage error, not uvicorn's KeyError
    assert not (tmp_path / "data").exists()
