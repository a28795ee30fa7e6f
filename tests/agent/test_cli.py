"""`gpulens agent`: --once prints one pass; bad flags are one-line errors."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpulens.cli.main import app
from tests.cli.conftest import invoke, invoke_ok, one_line_error


def test_once_prints_one_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPULENS_FAKE_GPUS", "2")
    out = invoke_ok(app, "agent", "--once", "--hostname", "gpu-node-1").stdout
    families = {f.name: f for f in text_string_to_metric_families(out)}
    util = families["DCGM_FI_DEV_GPU_UTIL"].samples
    assert [s.labels["gpu"] for s in util] == ["0", "1"]
    assert {s.labels["Hostname"] for s in util} == {"gpu-node-1"}
    assert "node_cpu_seconds" in families and "node_memory_MemAvailable_bytes" in families


def test_fake_gpus_flag_wins_over_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPULENS_FAKE_GPUS", "2")
    out = invoke_ok(app, "agent", "--once", "--fake-gpus", "3").stdout
    assert 'DCGM_FI_DEV_GPU_UTIL{gpu="2"' in out


def test_bad_listen_and_bad_settings_are_one_line_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPULENS_FAKE_GPUS", "1")
    assert "HOST:PORT" in one_line_error(invoke(app, "agent", "--listen", "9400"), 2)
    assert "GPULENS_COLLECT_INTERVAL" in one_line_error(invoke(app, "agent", "--interval", "0.5"), 2)
    monkeypatch.setenv("GPULENS_FAKE_GPUS", "65")
    assert "GPULENS_FAKE_GPUS" in one_line_error(invoke(app, "agent", "--once"), 2)
