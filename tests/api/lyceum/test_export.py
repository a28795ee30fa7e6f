"""The export route against hostile data (issue 21): a window of centuries starts streaming at once and
leaves the event loop free; a `gpu` label that is not an index is exported as it says (never a 500),
and in CSV a label a spreadsheet would run as a formula is neutralised, one test per character."""

from __future__ import annotations

import csv
import gc
import io
import json
import logging
import re
import time
import urllib.parse
from collections.abc import Callable, Iterator
from typing import Any

import anyio
import httpx
import orjson
import pyarrow.parquet as pq  # type: ignore[import-untyped]
import pytest
from fastapi import FastAPI

from gpulens.gctuning import tune_gc
from gpulens.shaping.cells import FORMULA_STARTS
from tests.api.lyceum.conftest import MetricsApi, scripted_series
from tests.shaping.test_cells import PAYLOADS

UUID = "GPU-5d3f6a9e-1c2b-4e8f-9a7d-0b1c2d3e4f50"


def export_path(execution_id: str) -> str:
    return f"/api/v2/external/execution/{urllib.parse.quote(execution_id, safe='')}/export"


def labelled(api: MetricsApi, gpu: str, uuid: str) -> None:
    """The backend's DCGM series of the host carry `gpu=<gpu>` (and `UUID=<uuid>` unless empty)."""

    def series(request: httpx.Request) -> httpx.Response | None:
        if request.url.path != "/api/v1/series":
            return None
        form = {k: v[0] for k, v in urllib.parse.parse_qs(request.content.decode()).items()}
        match = form["match[]"]
        plain = re.match(r"(DCGM_[A-Z0-9_]+)\{", match)  # the export's look-up of the host's GPUs
        found = [{"__name__": plain.group(1)}] if plain else scripted_series(match)
        for s in found:
            if s["__name__"].startswith("DCGM_"):
                s["gpu"] = gpu
                if uuid:
                    s["UUID"] = uuid
        return httpx.Response(200, content=orjson.dumps({"status": "success", "data": found}))

    api.prom.fail = series


def gpu_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in rows if r["metric"].startswith("gpu")]


@pytest.mark.parametrize("start", FORMULA_STARTS, ids=repr)
def test_a_formula_gpu_label_is_neutralised_in_the_csv(mapi: MetricsApi, start: str) -> None:
    """No GPU list, a host whose `gpu` label is a formula: 200, the label in the `gpu` column as it
    says, with a leading `'` in CSV (JSON lines and Parquet carry it unchanged)."""
    payload = PAYLOADS[start]
    labelled(mapi, payload, UUID)
    execution_id = mapi.register(gpus=None)
    r = mapi.client.get(export_path(execution_id), params={"format": "csv"}, headers=mapi.h())
    assert r.status_code == 200, r.text
    rows = gpu_rows(list(csv.DictReader(io.StringIO(r.text))))
    assert rows and {(row["gpu"], row["uuid"]) for row in rows} == {("'" + payload, UUID)}
    for row in csv.reader(io.StringIO(r.text)):
        for cell in row:
            assert not cell.startswith(FORMULA_STARTS) or cell.lstrip("+-").replace(".", "").isdigit(), row


@pytest.mark.parametrize("fmt", ["csv", "json", "parquet"])
def test_a_gpu_label_that_is_not_an_index_is_exported_as_it_says(mapi: MetricsApi, fmt: str) -> None:
    """Was a 500 (ValueError in planning/hosts.py): the GPU is selected by its UUID instead."""
    labelled(mapi, "nvidia0", UUID)
    execution_id = mapi.register(gpus=None)
    r = mapi.client.get(export_path(execution_id), params={"format": fmt}, headers=mapi.h())
    assert r.status_code == 200, r.text
    if fmt == "csv":
        rows = list(csv.DictReader(io.StringIO(r.text)))
    elif fmt == "json":
        rows = [json.loads(line) for line in r.text.splitlines()]
    else:
        rows = pq.read_table(io.BytesIO(r.content)).to_pylist()
    gpus = {(row["gpu"], row["uuid"]) for row in gpu_rows(rows)}
    assert gpus == {("nvidia0", UUID)}
    assert len(gpu_rows(rows)) == 9 * 241  # the 9 GPU series, an hour at 15 s
    queries = [f["query"] for f in mapi.prom.range_queries if "DCGM" in f["query"]]
    assert any("UUID=~" in q and "5d3f6a9e" in q for q in queries)  # the GPU selected by its UUID
    assert not any("nvidia0" in q for q in queries)
    # the metrics route and the summary answered 200 already; they still do
    assert mapi.metrics(execution_id).status_code == 200


def test_a_gpu_with_neither_index_nor_uuid_is_left_out_with_a_warning(
    mapi: MetricsApi, caplog: pytest.LogCaptureFixture
) -> None:
    labelled(mapi, "=cmd|' /C calc'!A0", "")
    execution_id = mapi.register(gpus=None)
    with caplog.at_level(logging.WARNING, logger="gpulens.export"):
        r = mapi.client.get(export_path(execution_id), params={"format": "csv"}, headers=mapi.h())
    assert r.status_code == 200, r.text
    rows = list(csv.DictReader(io.StringIO(r.text)))
    assert rows and not gpu_rows(rows)  # the host's series only
    assert {row["gpu"] for row in rows} == {""}
    (warning,) = [rec for rec in caplog.records if rec.name == "gpulens.export"]
    assert execution_id in warning.getMessage() and "left out" in warning.getMessage()


# -- a window of centuries ----------------------------------------------------------------------------


class Streaming:
    """One request to an ASGI app, driven by hand: when its first rows come, then a disconnect."""

    def __init__(self, app: FastAPI, path: str, headers: dict[str, str]) -> None:
        self.app = app
        self.scope: dict[str, Any] = {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": "1.1",
            "method": "GET",
            "scheme": "http",
            "path": path,
            "raw_path": path.encode(),
            "root_path": "",
            "query_string": b"format=csv",
            "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()],
            "client": ("127.0.0.1", 50000),
            "server": ("testserver", 80),
        }
        self.first_body = anyio.Event()
        self.gone = anyio.Event()
        self.status = 0
        self.body = b""
        self._sent_request = False

    async def receive(self) -> dict[str, Any]:
        if not self._sent_request:
            self._sent_request = True
            return {"type": "http.request", "body": b"", "more_body": False}
        await self.gone.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            self.status = message["status"]
        elif message["type"] == "http.response.body" and message.get("body"):
            if len(self.body) < 100_000:
                self.body += message["body"]
            if self.body.count(b"\n") > 1:  # the header, then the first hour's rows
                self.first_body.set()
        await anyio.sleep(0)

    async def run(self) -> None:
        await self.app(self.scope, self.receive, self.send)


async def timed_get(app: FastAPI, path: str) -> None:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as client:
        r = await client.get(path)
    assert r.status_code == 200


@pytest.fixture
def served_gc() -> Iterator[None]:
    """The cyclic collector as `gpulens serve` sets it (`gctuning.tune_gc`: a large young generation,
    the objects alive so far frozen out of full collections). Without it a full collection walks all
    that the test run has built so far (in the whole suite, 0.3-0.5 s a time, again and again while
    the export makes rows): the test process' heap, not the server's, and not what this test is for."""
    thresholds = gc.get_threshold()
    tune_gc()
    try:
        yield
    finally:
        gc.unfreeze()
        gc.set_threshold(*thresholds)


@pytest.mark.usefixtures("served_gc")
def test_an_execution_of_centuries_starts_at_once_and_health_stays_responsive(
    make_api: Callable[..., MetricsApi],
) -> None:
    """Registered 1970-2261 (2.55 million hours at 15 s): the list of hour chunks was built on the event
    loop before the first byte (2.7-10 s, 333 MiB; `/healthz` waited as long). Now the first hour is
    streamed at once and `/healthz` answers while the export runs."""
    api = make_api()
    execution_id = api.register(start_time="1970-01-01T00:00:00Z", end_time="2261-01-01T00:00:00Z")
    app = api.client.app
    stream = Streaming(app, export_path(execution_id), api.h())
    health: list[float] = []  # each probe's answer time, counted from when it was due
    first_byte = 0.0

    async def probes() -> None:
        """`/healthz` every 50 ms while the export opens and streams (a probe the event loop could not
        send when due counts that delay too)."""
        due = time.perf_counter()
        while True:
            due += 0.05
            await anyio.sleep(max(0.0, due - time.perf_counter()))
            await timed_get(app, "/healthz")
            health.append(time.perf_counter() - due)

    async def scenario() -> None:
        nonlocal first_byte
        async with anyio.create_task_group() as tasks:
            started = time.perf_counter()
            tasks.start_soon(probes)
            tasks.start_soon(stream.run)
            with anyio.fail_after(30):
                await stream.first_body.wait()
            first_byte = time.perf_counter() - started
            opened = len(health)
            while len(health) < opened + 5:  # the probes go on while the export streams
                await anyio.sleep(0.05)
            stream.gone.set()  # the client goes away
            tasks.cancel_scope.cancel()

    anyio.run(scenario)
    assert stream.status == 200
    assert stream.body.startswith(b"timestamp,hostname,gpu,uuid,metric,value\n1970-01-01T00:00:00Z,")
    assert first_byte < 1.5, first_byte
    assert max(health) < 0.5, health
