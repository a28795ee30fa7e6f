"""Shared test settings: CI=true turns a missing server into a failure instead of a skip."""

from __future__ import annotations

import os
from typing import NoReturn

import pytest

# the one reading of CI: any of the usual truthy spellings counts (1, true, yes)
IN_CI = os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


def missing_server(what: str) -> NoReturn:
    """Fail under CI, skip on a developer machine."""
    if IN_CI:
        pytest.fail(f"{what} is required in CI (CI=true) but is not available", pytrace=False)
    pytest.skip(f"{what} is not available (CI=true would fail here)")
