"""Shared test settings and fixtures.

CI=true turns a missing server into a failure instead of a skip. `registry` is a migrated, empty
SQLite registry (tests/storage overrides it with one per dialect); `make_registry` makes more.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NoReturn

import pytest

from gpulens.storage.registry import Registry

# the one reading of CI: any of the usual truthy spellings counts (1, true, yes)
IN_CI = os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


def missing_server(what: str) -> NoReturn:
    """Fail under CI, skip on a developer machine."""
    if IN_CI:
        pytest.fail(f"{what} is required in CI (CI=true) but is not available", pytrace=False)
    pytest.skip(f"{what} is not available (CI=true would fail here)")


def sqlite_registry(path: Path) -> Registry:
    """A migrated registry on the SQLite file `path` (the caller disposes of it)."""
    registry = Registry.from_url(f"sqlite:///{path}")
    registry.migrate()
    return registry


@pytest.fixture
def make_registry(tmp_path: Path) -> Iterator[Callable[[], Registry]]:
    """Makes fresh migrated SQLite registries in tmp_path (r0.db, r1.db, ...); disposes of them after."""
    made: list[Registry] = []

    def make() -> Registry:
        registry = sqlite_registry(tmp_path / f"r{len(made)}.db")
        made.append(registry)
        return registry

    yield make
    for registry in made:
        registry.dispose()


@pytest.fixture
def registry(make_registry: Callable[[], Registry]) -> Registry:
    """A migrated, empty SQLite registry."""
    return make_registry()


@pytest.fixture(params=["compiled", "python"])
def grid_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Runs a test on both grid paths: the compiled one (`gpulens._gridjson`, which `make test`
    builds; missing fails under CI) and the Python one it stands in for."""
    from gpulens import native

    if request.param == "python":
        monkeypatch.setattr(native, "gridjson", None)
    elif native.gridjson is None:
        missing_server("the compiled grid path (gpulens._gridjson: a C compiler and Python's headers)")
    return str(request.param)
