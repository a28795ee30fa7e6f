"""`gpulens metrics`: the same answer as the API, as JSON, CSV or a table with sparklines."""

from __future__ import annotations

import csv
import io
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from typer.testing import CliRunner

from gpulens.cli.main import app
from gpulens.cli.metrics import sparkline
from gpulens.domain import catalog as c
from gpulens_testkit.promload import LoadedDataset
from tests.integration.lyceum_app import LiveApi, build

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def live(prom_dataset: LoadedDataset, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveApi]:
    api = build(prom_dataset, Path(tmp_path_factory.mktemp("metrics-cli")))
    yield api
    api.registry.dispose()


def run(live: LiveApi, *args: str) -> str:
    result = CliRunner().invoke(
        app,
        [
            "metrics",
            *args,
            "--prometheus-url",
            live.data.url,
            "--database",
            live.settings.resolved_database_url,
        ],
    )
    assert result.exit_code == 0, (result.stdout, result.stderr)
    return result.stdout


def test_json_is_exactly_the_api_answer(live: LiveApi) -> None:
    eid = live.data.scenario.execution("oom").execution_id
    assert orjson.loads(run(live, eid, "--json", "--step", "1m")) == live.metrics(eid, step="1m")


def test_csv_rows(live: LiveApi) -> None:
    eid = live.data.scenario.execution("healthy").execution_id
    rows = list(csv.reader(io.StringIO(run(live, eid, "--csv", "--step", "5m"))))
    api = live.metrics(eid, step="5m")
    assert rows[0] == ["metric", "timestamp", "value"]
    assert len(rows) - 1 == sum(len(api[k]) for k in c.LYCEUM_KEYS)


def test_table(live: LiveApi) -> None:
    eid = live.data.scenario.execution("cpu-only").execution_id
    out = run(live, eid, "--step", "1m")
    assert "systemCpuUsagePercent" in out and "no data" in out  # a CPU-only run has no GPU series
    assert any(ch in out for ch in "▁▂▃▄▅▆▇█")


def test_unknown_execution_is_one_line(live: LiveApi) -> None:
    result = CliRunner().invoke(
        app,
        [
            "metrics",
            "nope",
            "--prometheus-url",
            live.data.url,
            "--database",
            live.settings.resolved_database_url,
        ],
    )
    assert result.exit_code == 1 and result.stderr.strip() == "error: Execution not found"


def test_sparkline() -> None:
    assert sparkline([]) == ""
    assert sparkline([1.0] * 10, width=5) == "▄" * 5
    assert sparkline([44.2, 44.20000000000001, 44.2], width=3) == "▄" * 3
    assert sparkline([0.0, 1.0, 2.0, 3.0], width=4) == "▁▃▆█"
