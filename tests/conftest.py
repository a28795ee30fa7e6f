"""Shared test settings: CI=true turns a missing server into a failure instead of a skip."""

from __future__ import annotations

import os

import pytest

IN_CI = os.environ.get("CI", "").lower() == "true"


def missing_server(what: str) -> None:
    """Fail under CI, skip on a developer machine."""
    if IN_CI:
        pytest.fail(f"{what} is required in CI (CI=true) but is not available")
    pytest.skip(f"{what} is not available")
