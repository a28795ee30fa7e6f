"""`GET /api/v2/external/usage` (docs/usage.md): the fleet usage table from the stored summaries'
hourly slices: its totals equal the sum of the receipts, a window cuts executions by time, tenants
see their org only, an admin may group by org, CSV cannot carry formulas, bad input is a 422."""

from __future__ import annotations

import csv
import io
import math
from datetime import timedelta
from typing import Any

import orjson
import pytest

from gpulens.domain.timeparse import datetime_to_ms, format_rfc3339
from tests.api.conftest import Client
from tests.service.summary_env import (
    DONE,
    END,
    START,
    Env,
    env_fixture,  # noqa: F401 - the `env` fixture
    execution,
)

USAGE = "/api/v2/external/usage"
WIDE = {"start": format_rfc3339(START - timedelta(days=1)), "end": format_rfc3339(END + timedelta(days=1))}


def stored(env: Env, client: Client, *ids: str, key: str | None = None) -> list[dict[str, Any]]:
    """Each execution's whole-life summary, computed and stored by asking for it."""
    headers = {"Authorization": f"Bearer {key or env.key}"}
    out = []
    for execution_id in ids:
        r = client.get(f"/api/v2/external/execution/{execution_id}/summary", headers=headers)
        assert r.status_code == 200, r.text
        out.append(orjson.loads(r.content))
    return out


def setup(env: Env) -> tuple[Client, list[dict[str, Any]]]:
    """Three finished executions of acme (two users, one of them twice; two profiles) and one of beta."""
    env.registry.upsert_execution(execution(DONE, user="alice", project="vision"), now=END)
    env.registry.upsert_execution(
        execution("done-2", user="bob", project="vision", hardware_profile="gpu.a100"), now=END
    )
    env.registry.upsert_execution(execution("done-3", user="alice", project="nlp", gpus=("0",)), now=END)
    env.registry.upsert_execution(execution("beta-1", org="beta", user="carol"), now=END)
    client = Client(env.app)
    docs = stored(env, client, DONE, "done-2", "done-3")
    stored(env, client, "beta-1", key=env.other_key)
    return client, docs


def test_the_totals_are_the_sum_of_the_receipts(env: Env) -> None:
    client, docs = setup(env)
    acme = {"Authorization": f"Bearer {env.key}"}
    r = client.get(USAGE, params={"group_by": "user", **WIDE}, headers=acme)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["groupBy"] == ["user"] and body["currency"] == "USD"
    rows = {row["group"]["user"]: row for row in body["rows"]}
    assert set(rows) == {"alice", "bob"}  # beta's carol never counts
    assert rows["alice"]["executions"] == 2 and rows["bob"]["executions"] == 1
    by_user = {"alice": [docs[0], docs[2]], "bob": [docs[1]]}
    for user, receipts in by_user.items():
        row = rows[user]
        assert math.isclose(row["gpuHours"], sum(d["gpuTime"]["total"] for d in receipts), rel_tol=1e-9)
        assert math.isclose(row["idleGpuHours"], sum(d["gpuTime"]["idle"] for d in receipts), abs_tol=1e-9)
        assert math.isclose(row["cost"], sum(d["cost"]["total"] for d in receipts), rel_tol=1e-9)
        assert math.isclose(row["pricedGpuHours"], row["gpuHours"], rel_tol=1e-9)  # every profile priced
    # two keys: one row per (project, user)
    pairs = client.get(USAGE, params={"group_by": "project,user", **WIDE}, headers=acme).json()["rows"]
    assert sorted((p["group"]["project"], p["group"]["user"]) for p in pairs) == [
        ("nlp", "alice"),
        ("vision", "alice"),
        ("vision", "bob"),
    ]
    assert math.isclose(sum(p["gpuHours"] for p in pairs), sum(r["gpuHours"] for r in rows.values()))


def test_a_window_counts_the_part_inside_it(env: Env) -> None:
    client, _ = setup(env)
    acme = {"Authorization": f"Bearer {env.key}"}
    whole = client.get(USAGE, params={"group_by": "hostname", **WIDE}, headers=acme).json()["rows"]
    middle = START + (END - START) / 2
    first = {"start": WIDE["start"], "end": format_rfc3339(middle)}
    second = {"start": format_rfc3339(middle), "end": WIDE["end"]}
    halves = [
        client.get(USAGE, params={"group_by": "hostname", **w}, headers=acme).json()["rows"]
        for w in (first, second)
    ]
    assert len(whole) == 1 and all(len(h) == 1 for h in halves)
    for field in ("gpuHours", "idleGpuHours", "usefulGpuHours", "energyKwh", "cost"):
        assert math.isclose(
            halves[0][0][field] + halves[1][0][field], whole[0][field], rel_tol=1e-9, abs_tol=1e-9
        )
    # the execution's GPU-hours are prorated by time: 3 executions x GPUs x the part of their window
    span_h = (datetime_to_ms(middle) - datetime_to_ms(START)) / 3_600_000
    assert math.isclose(halves[0][0]["gpuHours"], span_h * (2 + 2 + 1), rel_tol=1e-9)
    nothing = {"start": format_rfc3339(END + timedelta(hours=2)), "end": WIDE["end"]}
    assert client.get(USAGE, params={"group_by": "user", **nothing}, headers=acme).json()["rows"] == []


def test_tenants_and_admins(env: Env) -> None:
    client, _ = setup(env)
    beta = client.get(
        USAGE, params={"group_by": "user", **WIDE}, headers={"Authorization": f"Bearer {env.other_key}"}
    )
    assert [r["group"]["user"] for r in beta.json()["rows"]] == ["carol"]
    refused = client.get(
        USAGE, params={"group_by": "org", **WIDE}, headers={"Authorization": f"Bearer {env.key}"}
    )
    assert refused.status_code == 403 and "detail" in refused.json()
    admin = client.get(
        USAGE, params={"group_by": "org", **WIDE}, headers={"Authorization": f"Bearer {env.admin}"}
    )
    assert admin.status_code == 200, admin.text
    assert sorted(r["group"]["org"] for r in admin.json()["rows"]) == ["acme", "beta"]
    assert client.get(USAGE, params={"group_by": "user"}).status_code == 401


@pytest.mark.parametrize(
    "params",
    [
        {"group_by": "gpu"},
        {"group_by": "user,user"},
        {"group_by": "user,project,day"},
        {"group_by": "user", "start": "yesterday"},
        {"group_by": "user", "start": "2026-11-02T00:00:00Z", "end": "2026-11-01T00:00:00Z"},
        {"group_by": "user", "start": "2020-01-01T00:00:00Z", "end": "2026-01-01T00:00:00Z"},
        {"group_by": "user", "format": "xlsx"},
    ],
)
def test_bad_input_is_a_422(env: Env, params: dict[str, str]) -> None:
    r = Client(env.app).get(USAGE, params=params, headers={"Authorization": f"Bearer {env.key}"})
    assert r.status_code == 422, r.text
    assert "detail" in r.json()


def test_csv_by_day_cannot_carry_formulas(env: Env) -> None:
    client, _ = setup(env)
    env.registry.upsert_execution(execution(DONE, hardware_profile="=HYPERLINK(1)"), now=END)
    stored(env, client, DONE)
    r = client.get(
        USAGE,
        params={"group_by": "hardware_profile,day", "format": "csv", **WIDE},
        headers={"Authorization": f"Bearer {env.key}"},
    )
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/csv")
    rows = list(csv.reader(io.StringIO(r.text)))
    assert rows[0][:3] == ["hardware_profile", "day", "executions"]
    assert "'=HYPERLINK(1)" in [row[0] for row in rows[1:]]
    assert all(not cell.startswith(("=", "+", "@")) for row in rows for cell in row)
