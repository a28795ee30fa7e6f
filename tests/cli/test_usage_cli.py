"""`gpulens usage`: the fleet usage table from the registry's stored slices, as a table, CSV or JSON;
one org or every org; bad options in one line."""

from __future__ import annotations

import csv
import io
import json
from datetime import UTC, datetime, timedelta

import pytest

from gpulens.cli.main import app
from gpulens.domain.models import Execution, ExecutionStatus
from gpulens.domain.usage import UsageSlice
from gpulens.storage.registry import Registry
from gpulens.storage.summaries import SummaryInfo, SummaryStore
from tests.cli.conftest import invoke, invoke_ok, one_line_error

H = 3_600_000


def fill(db: str) -> None:
    """Two finished executions of acme (alice, bob) and one of beta, each with two hours of slices."""
    registry = Registry.from_url(db)
    registry.migrate()
    store = SummaryStore(registry)
    now = datetime.now(UTC)
    hour = (int(now.timestamp() * 1000) // H - 3) * H  # three hours ago, on the hour
    start = datetime.fromtimestamp(hour / 1000, UTC)
    for execution_id, org, user, gpus in (
        ("a1", "acme", "alice", 2),
        ("a2", "acme", "bob", 1),
        ("b1", "beta", "carol", 1),
    ):
        registry.upsert_execution(
            Execution(
                execution_id,
                org,
                "node-1",
                tuple(str(g) for g in range(gpus)),
                ExecutionStatus.COMPLETED,
                start,
                start_time=start,
                end_time=start + timedelta(hours=2),
                project="vision",
                user=user,
            )
        )
        slices = [
            UsageSlice(
                hour + k * H,
                hour + k * H,
                hour + (k + 1) * H,
                gpus * H,
                gpus * H // 4,
                0,
                0,
                0,
                1800.0 * gpus,
                1e6,
                2.0 * gpus,
            )
            for k in range(2)
        ]
        info = SummaryInfo(execution_id, org, "k", "s", now, now, 1, 2, {})
        store.put(info, b"{}", slices)
    registry.dispose()


def test_the_table_as_json_csv_and_rich(db: str) -> None:
    fill(db)
    doc = json.loads(invoke_ok(app, "usage", "--org", "acme", "--group-by", "user", "--json").stdout)
    rows = {r["group"]["user"]: r for r in doc["rows"]}
    assert set(rows) == {"alice", "bob"}  # beta's carol never counts for acme
    assert rows["alice"]["gpuHours"] == pytest.approx(4.0) and rows["alice"]["idleGpuHours"] == pytest.approx(
        1.0
    )
    assert rows["bob"]["cost"] == pytest.approx(4.0) and rows["bob"]["usefulGpuHours"] == pytest.approx(1.0)
    assert rows["bob"]["pricedGpuHours"] == pytest.approx(rows["bob"]["gpuHours"])  # what the cost covers
    every = json.loads(invoke_ok(app, "usage", "--group-by", "org", "--json").stdout)
    assert sorted(r["group"]["org"] for r in every["rows"]) == ["acme", "beta"]
    text = invoke_ok(app, "usage", "--org", "acme", "--group-by", "project,user", "--csv").stdout
    table = list(csv.reader(io.StringIO(text)))
    assert table[0][:3] == ["project", "user", "executions"] and len(table) == 3
    shown = invoke_ok(app, "usage", "--org", "acme", "--since", "1d").stdout
    assert "alice" in shown and "bob" in shown and "GPU-h" in shown
    none = invoke_ok(app, "usage", "--org", "acme", "--since", "30m", "--group-by", "user").stdout
    assert "alice" not in none and "no usage in this window" in none  # the slices ended before


@pytest.mark.parametrize(
    ("args", "words"), [(("--since", "soon"), "--since"), (("--group-by", "gpu"), "group_by")]
)
def test_bad_options_are_one_line(db: str, args: tuple[str, ...], words: str) -> None:
    fill(db)
    assert words in one_line_error(invoke(app, "usage", "--org", "acme", *args), 2)
