"""Shared CLI test helpers: a temp registry in the environment, and checks of one-line errors."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner, Result


@pytest.fixture
def db(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    url = f"sqlite:///{tmp_path / 'registry.db'}"
    monkeypatch.setenv("GPULENS_DATABASE_URL", url)
    monkeypatch.setenv("GPULENS_DATA_DIR", str(tmp_path))
    yield url


def invoke(app: typer.Typer, *args: str) -> Result:
    return CliRunner().invoke(app, list(args))


def invoke_ok(app: typer.Typer, *args: str) -> Result:
    result = invoke(app, *args)
    assert result.exit_code == 0, (result.stdout, result.stderr)
    return result


def one_line_error(result: Result, code: int = 1) -> str:
    """The error message: `error: ...` on stderr, one line, no traceback."""
    assert result.exit_code == code, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr + result.stdout
    assert result.stderr.startswith("error:"), result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    return result.stderr.strip()
