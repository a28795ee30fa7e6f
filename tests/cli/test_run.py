"""`gpulens run`: stdio and exit code passed through, the execution registered and sampled, Ctrl-C aborts."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import orjson
import pytest

from gpulens.api.app import create_app
from gpulens.backends.embedded import EmbeddedBackend
from gpulens.cli.run import login_name
from gpulens.config import Settings
from gpulens.domain.models import ExecutionStatus
from gpulens.storage.registry import Registry
from gpulens.storage.samples import SampleStore
from tests.api.conftest import Client


def env(tmp: Path) -> dict[str, str]:
    return {
        **os.environ,
        "GPULENS_DATA_DIR": str(tmp),
        "GPULENS_FAKE_GPUS": "2",
        "GPULENS_COLLECT_INTERVAL": "1",
        "GPULENS_DATABASE_URL": "",
        "GPULENS_PROMETHEUS_URL": "",
        "LOGNAME": "runner-7",  # getpass.getuser reads it first: who ran it
    }


def gpulens_run(tmp: Path, *command: str, **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpulens", "run", *command],
        env=env(tmp),
        capture_output=True,
        text=True,
        timeout=60,
        **kw,  # type: ignore[call-overload]
    )


def only_execution(tmp: Path) -> tuple[Registry, str]:
    registry = Registry.from_url(f"sqlite:///{tmp / 'gpulens.db'}")
    executions, total = registry.list_executions(org="local")
    assert total == 1
    return registry, executions[0].execution_id


def test_passes_stdio_and_exit_code_and_is_sampled(tmp_path: Path) -> None:
    done = gpulens_run(
        tmp_path,
        "--name",
        "job",
        "--gpus",
        "1",
        "--",
        sys.executable,
        "-c",
        "import sys,time; d=sys.stdin.read(); print(d.upper()); time.sleep(3); sys.exit(3)",
        input="hello",
    )
    assert done.returncode == 3
    assert done.stdout == "HELLO\n"
    lines = done.stderr.strip().splitlines()
    assert lines[0].startswith("gpulens: execution ") and " failed (exit 3) after " in lines[-1]
    assert "mean GPU util" in lines[-1] and "energy" in lines[-1]
    registry, eid = only_execution(tmp_path)
    e = registry.get_execution(eid)
    assert e is not None and e.status is ExecutionStatus.FAILED and e.return_code == 3
    assert e.gpus == ("1",) and e.file_name == "job" and e.end_time is not None
    assert e.user == "runner-7"  # the login running it (LOGNAME)
    # the Lyceum endpoint over the same store shows the run's GPU, CPU and RAM series
    store = SampleStore.from_path(tmp_path / "samples.db")
    _, key = registry.create_key("local", name="reader")
    app = create_app(Settings(data_dir=tmp_path), registry=registry, backend=EmbeddedBackend(store))
    r = Client(app).get(
        f"/api/v2/external/execution/{eid}/metrics?step=1s", headers={"Authorization": f"Bearer {key}"}
    )
    body = orjson.loads(r.content)
    assert r.status_code == 200
    for series in ("gpuUtilizationPercent", "gpuPowerWatt", "systemCpuUsagePercent", "systemRamUsedBytes"):
        assert body[series], series
    store.close()
    registry.dispose()


def _default_sigint() -> None:
    # as from a terminal, whatever this test runner inherited (a script's `cmd &` ignores SIGINT)
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def ctrl_c_run(
    tmp: Path,
    preexec_fn: Callable[[], None],
    sleep_s: int,
    settle_s: float,
    status: ExecutionStatus,
    code: int,
) -> None:
    """SIGINT to `gpulens run` of a `sleep_s` child, `settle_s` after sampling starts: it exits `code`
    and the execution is recorded with `status` and that code."""
    child = f"import time; time.sleep({sleep_s})"
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpulens", "run", "--", sys.executable, "-c", child],
        env=env(tmp),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=preexec_fn,
    )
    deadline = time.monotonic() + 20
    while not (tmp / "samples.db").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(settle_s)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == code, err
    registry, eid = only_execution(tmp)
    e = registry.get_execution(eid)
    assert e is not None and e.status is status and e.return_code == code
    registry.dispose()


def test_ctrl_c_aborts_and_forwards_the_signal(tmp_path: Path) -> None:
    ctrl_c_run(tmp_path, _default_sigint, sleep_s=30, settle_s=1.5, status=ExecutionStatus.ABORTED, code=130)


def test_a_run_started_ignoring_sigint_keeps_ignoring_it(tmp_path: Path) -> None:
    """`nohup gpulens run ...` or `gpulens run ... &` in a script: Ctrl-C is not for this run."""
    ctrl_c_run(tmp_path, _ignore_sigint, sleep_s=4, settle_s=1.0, status=ExecutionStatus.COMPLETED, code=0)


def test_the_login_is_kept_only_when_it_is_a_user_name(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, kept in [("alice", "alice"), ("a.b+c@example.com", "a.b+c@example.com"), ("bad name", None)]:
        monkeypatch.setenv("LOGNAME", name)
        assert login_name() == kept


def test_missing_command_and_bad_gpus(tmp_path: Path) -> None:
    assert gpulens_run(tmp_path, "--", "/nonexistent/program").returncode == 127
    bad = gpulens_run(tmp_path, "--gpus", '0,x"}', "--", "true")
    assert bad.returncode == 2 and bad.stderr.startswith("error: not a GPU index or UUID")
