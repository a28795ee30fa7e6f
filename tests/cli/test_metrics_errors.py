"""`gpulens metrics` refuses a bad registry or JWT key in one line, never with a traceback."""

from __future__ import annotations

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
