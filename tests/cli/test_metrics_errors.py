"""`gpulens metrics` refuses a bad registry or JWT key in one line; the CLI imports stay light."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from gpulens.cli.main import app
from tests.cli.conftest import invoke, one_line_error


def test_unreachable_registry_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPULENS_DATA_DIR", str(tmp_path))
    result = invoke(app, "metrics", "abc", "--database", f"sqlite:///{tmp_path}/missing/dir/x.db")
    assert "registry" in one_line_error(result)


def test_unreadable_jwt_key_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPULENS_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("GPULENS_JWT_PUBLIC_KEY", str(tmp_path / "missing.pem"))
    result = invoke(app, "metrics", "abc")
    assert "missing.pem" in one_line_error(result, code=2)


def test_the_cli_does_not_load_the_api_stack_until_a_command_needs_it() -> None:
    """`gpulens run`, `agent`, `keys` start without FastAPI (about 0.35 s of imports)."""
    code = "import sys, gpulens.cli.main; print('fastapi' in sys.modules, 'gpulens.api.app' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]
