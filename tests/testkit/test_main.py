"""`python -m gpulens_testkit`: writes the OpenMetrics files and the truth of a scenario and summarises it."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpulens_testkit.__main__ import main


def test_cli_writes_files_truth_and_summary(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--out", str(tmp_path), "--hours", "1.5", "--seed", "5"]) == 0
    out = capsys.readouterr().out
    for name in ("healthy", "throttled", "oom", "input-bound", "cpu-only", "gpu-node-2"):
        assert name in out
    assert (tmp_path / "truth.json").is_file()
    assert sorted(p.suffix for p in tmp_path.iterdir()) == [".json", ".om", ".om"]
