"""A writer SIGKILLed mid-write loses at most the pass in flight; the store reopens cleanly.

A pass is one minute apart, so the writer crosses an hour every 60 passes and seals chunks (8 series
per write) all the time: kills land in sealing transactions too."""

from __future__ import annotations

import os
import random
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from gpulens.agent.samples import Sample
from gpulens.storage.samples import SampleStore

SERIES = 300  # samples per pass: big enough that a kill often lands inside a write
PASS_MS = 60_000
KILLS = 10

CHILD = """
import sys
from gpulens.agent.samples import Sample
from gpulens.storage.samples import SampleStore

path, first, series = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
store = SampleStore.from_path(path)
n = first
while True:
    store.write(Sample("m", (("gpu", str(g)),), float(n), n * 60_000) for g in range(series))
    print(n, flush=True)
    n += 1
"""

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL")


def _run_and_kill(path: Path, first: int, delay_s: float) -> list[int]:
    """Start a writer at pass `first`, kill it `delay_s` after its first committed pass."""
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(path), str(first), str(SERIES)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    reported: list[int] = []
    first_seen = threading.Event()

    def reader() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            reported.append(int(line))
            first_seen.set()

    thread = threading.Thread(target=reader, daemon=True)
    thread.start()
    try:
        if not first_seen.wait(30):
            raise AssertionError(
                f"writer never committed a pass: {proc.stderr.read() if proc.stderr else ''}"
            )
        time.sleep(delay_s)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        thread.join(10)
        if proc.stderr is not None:
            proc.stderr.close()
    assert proc.returncode == -signal.SIGKILL
    return reported


def test_sigkill_loses_at_most_the_pass_in_flight(tmp_path: Path) -> None:
    rng = random.Random(20240611)
    path = tmp_path / "crash.db"
    committed: set[int] = set()
    in_flight: set[int] = set()
    first = 0
    for _ in range(KILLS):
        reported = _run_and_kill(path, first, rng.uniform(0.0, 0.25))
        assert reported == list(range(first, first + len(reported)))
        committed.update(reported)
        in_flight.add(first + len(reported))  # may or may not have committed
        first += len(reported) + 1

    conn = sqlite3.connect(str(path))
    try:
        assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    finally:
        conn.close()
    store = SampleStore.from_path(path)  # reopens cleanly (and reads head and chunks alike)
    per_pass: dict[int, int] = {}
    for _, pts in store.select("m", [], 0, first * PASS_MS):
        for t, v in pts:
            assert v == t // PASS_MS
            per_pass[t // PASS_MS] = per_pass.get(t // PASS_MS, 0) + 1
    store.close()
    missing = committed - per_pass.keys()
    assert not missing, f"committed passes lost: {sorted(missing)}"
    assert per_pass.keys() <= committed | in_flight
    assert set(per_pass.values()) == {SERIES}  # each pass whole or absent, never half-written

    store = SampleStore.from_path(path)  # reopens cleanly and writes on
    try:
        [(_, pts)] = store.select("m", [("gpu", "=", "0")], 0, first * PASS_MS)
        assert {t // PASS_MS for t, _ in pts} == per_pass.keys()
        assert store.stats().chunks > 0  # the writer did seal hours between the kills
        t = (first + 1) * PASS_MS  # after everything the killed writers may have left
        assert store.write([Sample("m", (("gpu", "0"),), 1.5, t)]) == 1
        [(_, after)] = store.select("m", [("gpu", "=", "0")], t, t)
        assert after == [(t, 1.5)]
    finally:
        store.close()
