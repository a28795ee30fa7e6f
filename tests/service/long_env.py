"""An app over executions that run for a year, for the bounded-summary tests (issue 21, item 1): an
hour of fake GPUs recorded in the embedded store (seeded: the same samples every run), tiled over
any window asked (gpulens_testkit/longrun.py), so a year of dense series is read without being
stored. Org acme runs the long executions; org beta has a finished 30-minute one on the same host
(the other tenant whose small reads must not suffer)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from fastapi import FastAPI

from gpulens.agent.collector import Collector
from gpulens.agent.readers.fake import FakeGpuReader
from gpulens.agent.readers.system import SystemReader
from gpulens.api.app import create_app
from gpulens.backends.embedded import EmbeddedBackend
from gpulens.config import Settings
from gpulens.domain.models import Execution, ExecutionStatus, Window
from gpulens.domain.timeparse import datetime_to_ms
from gpulens.service.summary_store import StoredSummaries
from gpulens.storage.registry import Registry
from gpulens.storage.samples import SampleStore
from gpulens_testkit.longrun import TiledBackend
from tests.conftest import sqlite_registry

HOST = "gpu-node-long"
END = datetime(2026, 11, 28, 12, 0, tzinfo=UTC)
SOURCE_START = END - timedelta(hours=1)
STEP_S = 15
SMALL = "beta-30min"  # the other tenant's finished execution: the last 30 minutes


def long_id(days: int) -> str:
    return f"acme-{days}d"


def fill(store: SampleStore, gpus: int) -> None:
    clock = [SOURCE_START.timestamp()]
    collector = Collector(
        [FakeGpuReader(HOST, gpus), SystemReader(HOST)], [store], interval_s=STEP_S, clock=lambda: clock[0]
    )
    while clock[0] <= END.timestamp():
        collector.collect()
        clock[0] += STEP_S
    store.flush()


@dataclass
class LongEnv:
    app: FastAPI
    registry: Registry
    store: SampleStore
    backend: TiledBackend
    key: str  # acme's
    other_key: str  # beta's

    @property
    def stored(self) -> StoredSummaries:
        found = self.app.state.ctx.summaries
        assert isinstance(found, StoredSummaries)
        return found

    def close(self) -> None:
        self.store.close()
        self.registry.dispose()


def build_long(
    tmp: Path, *, days: tuple[int, ...] = (365,), gpus: int = 2, concurrency: int = 2, wait_s: float = 60.0
) -> LongEnv:
    registry = sqlite_registry(tmp / "registry.db")
    store = SampleStore.from_path(tmp / "samples.db")
    fill(store, gpus)
    _, key = registry.create_key("acme", name="alice")
    _, other = registry.create_key("beta", name="bob")
    names = tuple(str(g) for g in range(gpus))
    for d in days:
        started = END - timedelta(days=d)
        registry.upsert_execution(
            Execution(
                execution_id=long_id(d),
                org="acme",
                hostname=HOST,
                gpus=names,
                status=ExecutionStatus.RUNNING,
                created_at=started,
                start_time=started,
            ),
            now=END,
        )
    registry.upsert_execution(
        Execution(
            execution_id=SMALL,
            org="beta",
            hostname=HOST,
            gpus=("0",),
            status=ExecutionStatus.COMPLETED,
            created_at=END - timedelta(minutes=30),
            start_time=END - timedelta(minutes=30),
            end_time=END,
        ),
        now=END,
    )
    settings = Settings(
        data_dir=tmp,
        prometheus_url=None,
        database_url=registry.url,
        scrape_interval=f"{STEP_S}s",
        max_concurrent_summaries=concurrency,
        summary_wait=wait_s,
        summary_interval=0,
    )
    source = Window(datetime_to_ms(SOURCE_START), datetime_to_ms(END), STEP_S * 1000)
    backend = TiledBackend(EmbeddedBackend(store), source)
    app = create_app(settings, registry=registry, backend=backend, clock=lambda: END)
    return LongEnv(app, registry, store, backend, key, other)


def summary_path(execution_id: str) -> str:
    return f"/api/v2/external/execution/{execution_id}/summary"


def small_read_path() -> str:
    """The other tenant's 30-minute metrics read."""
    iso = "%Y-%m-%dT%H:%M:%SZ"
    start = (END - timedelta(minutes=30)).strftime(iso)
    return f"/api/v2/external/execution/{SMALL}/metrics?start={start}&end={END.strftime(iso)}&step=15s"


class AsgiCall:
    """One GET through the app's ASGI interface whose client goes away when told to."""

    def __init__(self, app: FastAPI, path: str, key: str) -> None:
        self.gone = asyncio.Event()
        self.sent: list[dict[str, Any]] = []
        self._body_sent = False
        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": "GET",
            "scheme": "http",
            "path": path,
            "raw_path": path.encode(),
            "query_string": b"",
            "root_path": "",
            "headers": [(b"host", b"testserver"), (b"authorization", f"Bearer {key}".encode())],
            "client": ("127.0.0.1", 40000),
            "server": ("testserver", 80),
        }
        self.task = asyncio.ensure_future(app(scope, self.receive, self.send))

    async def receive(self) -> dict[str, Any]:
        if not self._body_sent:
            self._body_sent = True
            return {"type": "http.request", "body": b"", "more_body": False}
        await self.gone.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: dict[str, Any]) -> None:
        self.sent.append(message)

    @property
    def status(self) -> int | None:
        return next((m["status"] for m in self.sent if m["type"] == "http.response.start"), None)
