"""`gpulens keys`: create (key shown once, last line), list, revoke, toggle; one-line errors."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest
from typer.testing import Result

from gpulens.cli.keys import app
from gpulens.domain.keys import hash_key
from gpulens.storage.registry import Registry
from tests.cli.conftest import invoke, invoke_ok, one_line_error


def run(*args: str) -> Result:
    return invoke(app, *args)


def ok(*args: str) -> Result:
    return invoke_ok(app, *args)


def open_db(url: str) -> Registry:
    return Registry.from_url(url)


def test_create_prints_the_key_last_and_stores_its_hash(db: str) -> None:
    result = ok("create", "--org", "acme", "--name", "ci")
    key = result.stdout.strip().splitlines()[-1]
    assert key.startswith("lk_")
    registry = open_db(db)
    try:
        stored = registry.find_key(hash_key(key))
        assert stored is not None
        assert stored.org == "acme"
        assert stored.name == "ci"
        assert not stored.is_admin
        assert stored.prefix in result.stdout
    finally:
        registry.dispose()


def test_create_admin_limited_expiring(db: str) -> None:
    result = ok(
        "create",
        "--org",
        "platform",
        "--admin",
        "--project",
        "b",
        "--project",
        "a",
        "--expires-at",
        "2099-01-01T01:00:00+01:00",
    )
    key = result.stdout.strip().splitlines()[-1]
    registry = open_db(db)
    try:
        stored = registry.find_key(hash_key(key))
        assert stored is not None
        assert stored.is_admin
        assert stored.projects == frozenset({"a", "b"})
        assert stored.expires_at == datetime(2099, 1, 1, tzinfo=UTC)
    finally:
        registry.dispose()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--org", "Acme"], "--org"),
        (["--org", "acme", "--project", "no spaces"], "--project"),
        (["--org", "acme", "--expires-at", "tomorrow"], "--expires-at"),
        (["--org", "acme", "--expires-at", "2001-01-01T00:00:00Z"], "past"),
        (["--org", "acme", "--name", " "], "--name"),
    ],
)
def test_create_validation(db: str, args: list[str], message: str) -> None:
    assert message in one_line_error(run("create", *args), 2)


def test_list_revoke_toggle(db: str) -> None:
    first = ok("create", "--org", "acme", "--name", "one").stdout.strip().splitlines()[-1]
    ok("create", "--org", "beta", "--name", "two")
    prefix = first[:8]

    table = ok("list").stdout
    assert prefix in table
    assert "one" in table
    assert "two" in table
    listed = json.loads(ok("list", "--org", "acme", "--json").stdout)
    assert [k["name"] for k in listed] == ["one"]
    assert listed[0]["prefix"] == prefix
    assert first not in ok("list", "--json").stdout  # never the key itself

    assert "now inactive" in ok("toggle", prefix).stdout
    assert "now active" in ok("toggle", listed[0]["id"]).stdout

    assert "revoked" in ok("revoke", prefix).stdout
    assert [k["name"] for k in json.loads(ok("list", "--json").stdout)] == ["two"]
    everything = json.loads(ok("list", "--all", "--json").stdout)
    assert {k["name"]: k["revoked_at"] is not None for k in everything} == {"one": True, "two": False}
    assert "revoked" in ok("list", "--all").stdout

    assert "already revoked" in one_line_error(run("revoke", prefix))
    assert "revoked" in one_line_error(run("toggle", prefix))
    assert "no API key" in one_line_error(run("revoke", "lk_zzzzz"))
    assert "no API key" in one_line_error(run("toggle", "not-an-id"))
    assert "prefix" in one_line_error(run("revoke", first))  # the whole key is not a reference


def test_empty_list(db: str) -> None:
    assert "no API keys" in ok("list").stdout
    assert json.loads(ok("list", "--json").stdout) == []


def test_bad_database_urls_are_one_line(db: str, tmp_path: Path) -> None:
    assert "database_url" in one_line_error(run("list", "--database", "mysql://x/y"), 2)
    refused = one_line_error(run("list", "--database", "postgresql://nobody@127.0.0.1:1/none"))
    assert "registry" in refused
