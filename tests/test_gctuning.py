"""Process tuning at entry points: the collector's thresholds and glibc's allocator."""

from __future__ import annotations

import gc
import subprocess
import sys

from gpulens import gctuning


def test_tune_gc_raises_the_young_threshold() -> None:
    before = gc.get_threshold()
    try:
        gctuning.tune_gc()
        assert gc.get_threshold() == (gctuning.YOUNG_THRESHOLD, *gctuning.OLDER_THRESHOLDS)
    finally:
        gc.set_threshold(*before)
        gc.unfreeze()


def test_tune_allocator_takes_on_glibc_and_large_buffers_still_work() -> None:
    # in a child process: mallopt changes the whole process for good
    code = (
        "from gpulens.gctuning import tune_allocator\n"
        "import platform\n"
        "ok = tune_allocator()\n"
        "assert ok == (platform.libc_ver()[0] == 'glibc'), ok\n"
        "chunks = [bytes(300_000) for _ in range(50)]\n"
        "assert sum(map(len, chunks)) == 15_000_000\n"
        "print('ok')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
