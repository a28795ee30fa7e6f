"""`GET .../execution/{id}/export`: every sample of a generated execution once, per GPU, against the
generator's truth, in CSV, Parquet and JSON lines alike; same tenants and errors as `/metrics`."""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq  # type: ignore[import-untyped]
import pytest

from gpulens.api.app import create_app
from gpulens.backends.embedded import EmbeddedBackend
from gpulens.domain import catalog as c
from gpulens.domain.timeparse import format_rfc3339_ms, parse_timestamp_ms
from gpulens.service.export import COLUMNS, GPU_METRICS, HOST_METRICS
from gpulens.storage.samples import SampleStore
from gpulens_testkit.promload import LoadedDataset
from tests.api.conftest import Client
from tests.integration.lyceum_app import LiveApi, build

pytestmark = pytest.mark.integration

NAMES = ["healthy", "throttled", "oom", "input-bound", "cpu-only"]
Key = tuple[int, str, str]  # (ms, gpu, metric)


@pytest.fixture(scope="module")
def live(prom_dataset: LoadedDataset, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveApi]:
    api = build(prom_dataset, Path(tmp_path_factory.mktemp("export")))
    yield api
    api.registry.dispose()


def export(client: Client, key: str, execution_id: str, fmt: str, **params: str) -> Any:
    r = client.get(
        f"/api/v2/external/execution/{execution_id}/export",
        params={"format": fmt, **params},
        headers={"Authorization": f"Bearer {key}"},
    )
    assert r.status_code == 200, r.text
    return r


def rows_csv(content: bytes) -> list[dict[str, Any]]:
    reader = csv.DictReader(io.StringIO(content.decode()))
    assert tuple(reader.fieldnames or ()) == COLUMNS
    return [{**r, "value": float(r["value"])} for r in reader]


def rows_json(content: bytes) -> list[dict[str, Any]]:
    return [json.loads(line) for line in content.decode().splitlines()]


def rows_parquet(content: bytes) -> list[dict[str, Any]]:
    table = pq.read_table(io.BytesIO(content))
    assert tuple(table.column_names) == COLUMNS
    out = []
    for r in table.to_pylist():
        ts = r["timestamp"]
        out.append({**r, "timestamp": format_rfc3339_ms(round(ts.timestamp() * 1000))})
    return out


def keyed(rows: list[dict[str, Any]]) -> dict[Key, float]:
    out: dict[Key, float] = {}
    for r in rows:
        k = (parse_timestamp_ms(r["timestamp"]), r["gpu"], r["metric"])
        assert k not in out, f"twice: {k}"
        out[k] = float(r["value"])
    return out


def truth_of(live: LiveApi, name: str) -> tuple[dict[Key, float], set[Key]]:
    """The generator's value of every (time, gpu, metric) of the execution, and those that are stable
    (the CPU rate window's edges are not)."""
    truth = live.data.truth
    e = live.data.scenario.execution(name)
    window = truth.execution_window(name)
    want: dict[Key, float] = {}
    stable: set[Key] = set()
    gpus = live.data.scenario.gpus_of(e)
    for m in GPU_METRICS:
        for g in gpus:
            mt = truth.metric(m, e.hostname, (g,), window)
            for t, v, ok in zip(mt.timestamps_ms, mt.values, mt.stable, strict=True):
                if v is not None:
                    want[(t, str(g), m.lyceum)] = v
                    if ok:
                        stable.add((t, str(g), m.lyceum))
    for m in HOST_METRICS:
        mt = truth.metric(m, e.hostname, None, window)
        for t, v, ok in zip(mt.timestamps_ms, mt.values, mt.stable, strict=True):
            if v is not None:
                want[(t, "", m.lyceum)] = v
                if ok:
                    stable.add((t, "", m.lyceum))
    return want, stable


@pytest.mark.parametrize("name", NAMES)
def test_every_sample_once_as_generated(live: LiveApi, name: str) -> None:
    e = live.data.scenario.execution(name)
    r = export(live.client, live.key, e.execution_id, "csv")
    assert r.headers["content-type"].startswith("text/csv")
    got = keyed(rows_csv(r.content))
    want, stable = truth_of(live, name)
    assert stable, "the truth has points"
    assert {k for k in got if k in stable} == stable  # every stable sample is there
    assert set(got) <= set(want), sorted(set(got) - set(want))[:5]
    bad = [
        (k, got[k], want[k]) for k in stable if not math.isclose(got[k], want[k], rel_tol=1e-9, abs_tol=1e-6)
    ]
    assert not bad, bad[:5]
    uuids = {r["gpu"]: r["uuid"] for r in rows_csv(r.content)}
    host = live.data.scenario.host(e.hostname)
    for g in live.data.scenario.gpus_of(e):
        assert uuids[str(g)] == host.gpus[g].uuid
    if not live.data.scenario.gpus_of(e):
        assert {k[2] for k in got} == {m.lyceum for m in HOST_METRICS}


@pytest.mark.parametrize("name", ["healthy", "cpu-only"])
def test_csv_parquet_and_json_agree(live: LiveApi, name: str) -> None:
    e = live.data.scenario.execution(name)
    csv_rows = rows_csv(export(live.client, live.key, e.execution_id, "csv").content)
    r = export(live.client, live.key, e.execution_id, "json")
    assert r.headers["content-type"].startswith("application/x-ndjson")
    json_rows = rows_json(r.content)
    parquet = export(live.client, live.key, e.execution_id, "parquet")
    assert parquet.content.startswith(b"PAR1") and parquet.content.endswith(b"PAR1")
    assert f'{e.execution_id}.parquet"' in parquet.headers["content-disposition"]
    parquet_rows = rows_parquet(parquet.content)
    assert len(csv_rows) == len(json_rows) == len(parquet_rows) > 0
    for a, b, p in zip(csv_rows, json_rows, parquet_rows, strict=True):
        assert a == b == p
    # sorted by time, then GPU, then metric; the hostname on every row
    assert [parse_timestamp_ms(r["timestamp"]) for r in csv_rows] == sorted(
        parse_timestamp_ms(r["timestamp"]) for r in csv_rows
    )
    assert {r["hostname"] for r in csv_rows} == {e.hostname}


def test_a_window_inside_the_execution(live: LiveApi) -> None:
    e = live.data.scenario.execution("throttled")
    start, end = e.start_s * 1000 + 600_000, e.start_s * 1000 + 1_200_000
    rows = rows_json(
        export(
            live.client,
            live.key,
            e.execution_id,
            "json",
            start=format_rfc3339_ms(start),
            end=format_rfc3339_ms(end),
        ).content
    )
    times = {parse_timestamp_ms(r["timestamp"]) for r in rows}
    assert min(times) == start and max(times) == end
    assert len(times) == (end - start) // 15_000 + 1
    gpus = {r["gpu"] for r in rows if r["gpu"]}
    assert gpus == {str(g) for g in e.gpus}
    per_time = len(gpus) * len(GPU_METRICS) + len(HOST_METRICS)
    assert len(rows) == len(times) * per_time


def test_tenants_and_errors_like_the_metrics_route(live: LiveApi) -> None:
    _, other = live.registry.create_key("gamma", name="carol")
    e = live.data.scenario.execution("healthy")
    path = f"/api/v2/external/execution/{e.execution_id}"
    for headers in ({"Authorization": f"Bearer {other}"}, {}):
        r = live.client.get(f"{path}/export", headers=headers)
        m = live.client.get(f"{path}/metrics", headers=headers)
        assert r.status_code == m.status_code
        assert r.status_code in (401, 404)
        assert r.json() == m.json()
    own = {"Authorization": f"Bearer {live.key}"}
    r = live.client.get(f"{path}/export", params={"start": "yesterday"}, headers=own)
    m = live.client.get(f"{path}/metrics", params={"start": "yesterday"}, headers=own)
    assert r.status_code == m.status_code and r.json() == m.json()
    r = live.client.get("/api/v2/external/execution/not-an-id/export", headers=own)
    assert r.status_code == 404
    r = live.client.get(f"{path}/export", params={"format": "xlsx"}, headers=own)
    assert r.status_code in (400, 422)


def test_the_embedded_store_exports_the_same(live: LiveApi, embedded_store: SampleStore) -> None:
    embedded = Client(
        create_app(live.settings, registry=live.registry, backend=EmbeddedBackend(embedded_store))
    )
    e = live.data.scenario.execution("oom")
    a = keyed(rows_csv(export(live.client, live.key, e.execution_id, "csv").content))
    b = keyed(rows_csv(export(embedded, live.key, e.execution_id, "csv").content))
    assert a.keys() == b.keys()
    assert all(math.isclose(a[k], b[k], rel_tol=1e-9, abs_tol=1e-9) for k in a)
    assert c.LYCEUM_KEYS  # the names are the Lyceum keys
    assert {k[2] for k in a} == set(c.LYCEUM_KEYS)


def cli(live: LiveApi, *args: str) -> Any:
    from typer.testing import CliRunner

    from gpulens.cli.main import app

    result = CliRunner().invoke(
        app,
        [*args, "--prometheus-url", live.data.url, "--database", live.settings.resolved_database_url],
    )
    assert result.exit_code == 0, (result.stdout, result.stderr)
    return result


def test_the_cli_over_prometheus_exports_and_reports_what_the_api_answers(
    live: LiveApi, tmp_path: Path
) -> None:
    e = live.data.scenario.execution("input-bound")
    target = tmp_path / "run.parquet"
    cli(live, "export", e.execution_id, "--format", "parquet", "-o", str(target))
    api = rows_csv(export(live.client, live.key, e.execution_id, "csv").content)
    assert rows_parquet(target.read_bytes()) == api
    r = live.client.get(
        f"/api/v2/external/execution/{e.execution_id}/summary",
        headers={"Authorization": f"Bearer {live.key}"},
    )
    out = cli(live, "report", e.execution_id, "--json").stdout
    assert out.encode() == r.content + b"\n"
    table = cli(live, "report", e.execution_id).stdout
    assert "input bound" in table and "per GPU" in table  # kinds are written with spaces
