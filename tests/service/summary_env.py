"""An app over an hour of two fake GPUs (tests/api/world.py's data) for the stored-summary tests: a
finished and a running execution of org acme, a prices file, a clock the test moves, and a backend
that can hold its range queries until the test lets them go (to catch work mid-read)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from fastapi import FastAPI

from gpulens.api.app import create_app
from gpulens.backends.embedded import EmbeddedBackend
from gpulens.config import Settings
from gpulens.domain.models import Execution, ExecutionStatus, RangeQuery, Series
from gpulens.service.summary_store import StoredSummaries
from gpulens.storage.registry import Registry
from gpulens.storage.samples import SampleStore
from tests.api.world import HOST, T_END, T_START, _fill_store
from tests.conftest import sqlite_registry

DONE = "done-1"  # completed, gpu.h100
RUNNING = "run-1"
START = T_START + timedelta(minutes=5)
END = T_END - timedelta(minutes=5)
PRICES = 'currency = "USD"\n[gpu_hour]\n"gpu.h100" = 2.5\n"gpu.a100" = 1.5\n'


@dataclass
class GateBackend:
    """The embedded backend, whose range queries wait while `held` (counting who asked and who was
    cancelled waiting)."""

    inner: EmbeddedBackend
    name: str = "gate"
    held: bool = False
    asked: int = 0
    cancelled: int = 0
    released: asyncio.Event | None = None
    first_asked: asyncio.Event | None = None
    loop: asyncio.AbstractEventLoop | None = field(default=None, repr=False)

    def _events(self) -> tuple[asyncio.Event, asyncio.Event]:
        loop = asyncio.get_running_loop()
        if self.loop is not loop or self.released is None or self.first_asked is None:
            self.loop, self.released, self.first_asked = loop, asyncio.Event(), asyncio.Event()
        return self.released, self.first_asked

    def release(self) -> None:
        self.held = False
        if self.released is not None and self.loop is not None:
            self.loop.call_soon_threadsafe(self.released.set)

    async def query_range(self, query: RangeQuery) -> list[Series]:
        released, first_asked = self._events()
        self.asked += 1
        first_asked.set()
        if self.held:
            try:
                await released.wait()
            except asyncio.CancelledError:
                self.cancelled += 1
                raise
        return await self.inner.query_range(query)

    async def query(self, expr: str, time_ms: int) -> list[Series]:
        return await self.inner.query(expr, time_ms)

    async def series_labels(self, match: str, label: str, start_ms: int, end_ms: int) -> list[str]:
        return await self.inner.series_labels(match, label, start_ms, end_ms)

    async def series(self, match: str, start_ms: int, end_ms: int) -> list[dict[str, str]]:
        return await self.inner.series(match, start_ms, end_ms)

    async def query_raw(self, match: str, start_ms: int, end_ms: int) -> list[Series]:
        return await self.inner.query_raw(match, start_ms, end_ms)

    async def ready(self) -> None:
        await self.inner.ready()

    async def aclose(self) -> None:
        await self.inner.aclose()


@dataclass
class Env:
    app: FastAPI
    registry: Registry
    store: SampleStore
    backend: GateBackend
    now: list[datetime]
    prices: Path
    key: str  # acme's
    other_key: str  # beta's
    admin: str

    @property
    def stored(self) -> StoredSummaries:
        found = self.app.state.ctx.summaries
        assert isinstance(found, StoredSummaries)
        return found

    def close(self) -> None:
        self.store.close()
        self.registry.dispose()


def execution(execution_id: str = DONE, **changes: object) -> Execution:
    base: dict[str, object] = {
        "execution_id": execution_id,
        "org": "acme",
        "hostname": HOST,
        "gpus": ("0", "1"),
        "status": ExecutionStatus.COMPLETED,
        "created_at": T_START,
        "start_time": START,
        "end_time": END,
        "hardware_profile": "gpu.h100",
    }
    base.update(changes)
    return Execution(**base)  # type: ignore[arg-type]


def build(tmp: Path, *, concurrency: int = 2, wait_s: float = 30.0) -> Env:
    registry = sqlite_registry(tmp / "registry.db")
    store = SampleStore.from_path(tmp / "samples.db")
    _fill_store(store)
    prices = tmp / "prices.toml"
    prices.write_text(PRICES)
    _, admin = registry.create_key("platform", name="scheduler", is_admin=True)
    _, key = registry.create_key("acme", name="alice")
    _, other = registry.create_key("beta", name="bob")
    registry.upsert_execution(execution(), now=END)
    registry.upsert_execution(
        execution(RUNNING, status=ExecutionStatus.RUNNING, end_time=None, hardware_profile=None), now=START
    )
    now = [T_END + timedelta(hours=1)]
    settings = Settings(
        data_dir=tmp,
        prometheus_url=None,
        database_url=registry.url,
        prices=prices,
        scrape_interval="15s",
        max_concurrent_summaries=concurrency,
        summary_wait=wait_s,
    )
    backend = GateBackend(EmbeddedBackend(store))
    app = create_app(settings, registry=registry, backend=backend, clock=lambda: now[0])
    return Env(app, registry, store, backend, now, prices, key, other, admin)


@pytest.fixture(name="env")
def env_fixture(tmp_path: Path) -> Iterator[Env]:
    """The fixture `env`: this world in tmp_path, closed after the test (a module imports it)."""
    built = build(tmp_path)
    try:
        yield built
    finally:
        built.close()
