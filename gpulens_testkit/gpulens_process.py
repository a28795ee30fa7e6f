"""gpulens as a user starts it: a `python -m gpulens ...` process, its environment, waiting until ready."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import httpx


def serve_env(data_dir: Path, port: int, **extra: str) -> dict[str, str]:
    """This environment without any GPULENS_* variable, plus a `gpulens serve` on the embedded default
    in `data_dir` on `port` (one fake GPU, collected every second) and `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPULENS_")}
    env.update(
        GPULENS_DATA_DIR=str(data_dir),
        GPULENS_PORT=str(port),
        GPULENS_FAKE_GPUS="1",
        GPULENS_COLLECT_INTERVAL="1",
    )
    env.update(extra)
    return env


def start_gpulens(args: Sequence[str], env: Mapping[str, str]) -> subprocess.Popen[str]:
    """`python -m gpulens ARGS` with `env`, its stdout and stderr captured as text."""
    return subprocess.Popen(  # noqa: S603 - this interpreter running gpulens, no shell
        [sys.executable, "-m", "gpulens", *args],
        env=dict(env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_ready(base_url: str, proc: subprocess.Popen[str], timeout_s: float = 60) -> None:
    """Until `base_url`/readyz answers 200; AssertionError (with stderr) if `proc` exits or time runs out."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"gpulens exited with {proc.returncode}: {proc.communicate()[1]}")
        try:
            if httpx.get(f"{base_url}/readyz", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"gpulens at {base_url} was not ready within {timeout_s:g} s")
