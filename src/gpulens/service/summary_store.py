"""Summaries computed once: stored for finished executions, bounded for everything else.

The summary of a whole execution (`.../summary` without `start`/`end`) costs about a second of CPU
for three days of data. For a finished execution it cannot change until its registration, the
settings or the code do, so `StoredSummaries`:

* serves it from the registry (storage/summaries.py) when one was stored for the execution's current
  *key*: a digest of the registration fields a summary depends on (host, GPUs, status, start, end,
  hardware profile), the settings (scrape interval, point limit, plan options, carbon intensity,
  the findings' thresholds), SUMMARY_FORMAT and gpulens' version, and the price (currency and GPU-hour
  price) the execution's cost used. A row with another key is stale and never served;
* computes it otherwise, once however many requests ask at the same time (they share one
  computation, cancelled when the last of them goes away), and stores it once the execution ended
  `grace` ago (late samples are in);
* computes every other summary (a running execution, a window) on demand.

At most `concurrency` summaries compute at once per process (per event loop); a request that cannot
start within `wait_s` is answered 503 (Overloaded). The background pass (`summary_task`, started by
`gpulens serve`) computes the summaries of executions that finished within `horizon`, and those the
list endpoint asked for (`enqueue`), one at a time and only while no request computes one, so it
never takes a slot a request is waiting for. `rows` answers the dashboard's list: the figures of the
stored summaries, "pending" for the rest.
"""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

import numpy as np
import orjson

from gpulens import __version__
from gpulens.domain import catalog as c
from gpulens.domain.errors import GpulensError, Overloaded
from gpulens.domain.models import Execution, Principal
from gpulens.domain.timeparse import datetime_to_ms, ms_to_datetime
from gpulens.service.archive import digest
from gpulens.service.checks import may_see, run_sync
from gpulens.service.summary import SUMMARY_POINTS, ExecutionSummary, SummaryService, load_prices
from gpulens.shaping.insights import UTIL, Finding
from gpulens.shaping.usage import Cost, Prices
from gpulens.storage.summaries import Registered, SummaryInfo, SummaryStore

log = logging.getLogger(__name__)

# What a stored summary holds and how it is computed: bump it when the summary's body or its findings
# change in a way the settings do not show (a new detector, a new field), so no stored one is served.
SUMMARY_FORMAT = 2  # 2: windows beyond a week read at SUMMARY_POINTS a series (issue 21)
SYSTEM = Principal(org="gpulens", subject="gpulens-summaries", is_admin=True)  # the background's reads

Render = Callable[[ExecutionSummary, str], dict[str, Any]]  # the dialect's body of a summary
RowStatus = Literal["ready", "pending", "unavailable"]


@dataclass(frozen=True, slots=True)
class StoredSummaryOptions:
    concurrency: int = 2  # summaries computing at once (per process)
    wait_s: float = 30.0  # how long a request waits for a slot before a 503
    grace_ms: int = 300_000  # a finished execution's summary is stored once now >= end + this
    horizon_ms: int = 7 * 86_400_000  # the background pass looks for executions that ended this recently
    batch: int = 5  # summaries the background computes per pass
    queue_max: int = 1_000  # executions waiting for the background (the oldest asked are dropped)
    retry_ms: int = 3_600_000  # an execution whose summary failed is left alone this long
    patience_s: float = 30.0  # the background waits this long for no request to compute, then goes on


@dataclass(frozen=True, slots=True)
class SummaryRow:
    """What the dashboard's list shows of one execution: its status and, when "ready", the figures
    stored beside its summary (`list_row`)."""

    execution_id: str
    status: RowStatus
    figures: dict[str, Any] | None = None


@dataclass(slots=True)
class PassReport:
    computed: int = 0  # summaries computed and stored
    unchanged: int = 0  # rows whose registry row or settings changed without changing their key
    skipped: int = 0  # not ready yet, gone, or nothing to summarize
    failed: list[tuple[str, str]] = field(default_factory=list)  # (execution id, why)


@dataclass(slots=True)
class _Flight:
    """One computation of a whole-life summary, shared by everyone who asked for it meanwhile."""

    task: asyncio.Task[bytes]
    waiters: int = 0


@dataclass(slots=True)
class _LoopState:
    """What lives on one event loop: the compute slots, who uses and wants them, shared computations."""

    slots: asyncio.Semaphore
    wake: asyncio.Event
    computing: int = 0  # summaries holding a slot
    waiting: int = 0  # requests waiting for one
    flights: dict[tuple[str, str], _Flight] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class SummaryFigures:
    stored: int  # whole-life summaries served from the store
    computed: int  # ... and computed (not stored yet, stale, or not storable)
    computing: int  # summaries holding a compute slot now
    waiting: int  # requests waiting for one
    queued: int  # executions the background pass has yet to compute


def _plain(value: object) -> object:
    """orjson's fallback: numpy scalars as Python numbers."""
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def encode(doc: dict[str, Any]) -> bytes:
    return orjson.dumps(doc, default=_plain, option=orjson.OPT_SERIALIZE_NUMPY)


def storable(execution: Execution) -> bool:
    """A finished execution with a host, a start and an end: its whole-life summary is final."""
    e = execution
    return not e.status.is_active and bool(e.hostname) and e.start_time is not None and e.end_time is not None


def list_row(summary: ExecutionSummary) -> dict[str, Any]:
    """What a list row shows of a summary (stored beside it, in the list endpoint's spelling)."""
    return row_figures(summary.findings, summary.cost, summary.stats[UTIL].mean)


def row_figures(found: Sequence[Finding], money: Cost | None, mean_util: float | None) -> dict[str, Any]:
    """Mean GPU utilization, cost, and the findings by kind (count, worst severity, summed impact in
    GPU-hours), worst first."""
    kinds: dict[str, dict[str, Any]] = {}
    for f in found:
        one = kinds.setdefault(f.kind, {"kind": f.kind, "severity": f.severity, "count": 0, "gpuHours": 0.0})
        one["count"] += 1
        one["gpuHours"] += f.gpu_hours
        if c.SEVERITY_RANK[f.severity] < c.SEVERITY_RANK[one["severity"]]:
            one["severity"] = f.severity
    return {
        "meanGpuUtilizationPercent": mean_util,
        "cost": None if money is None else {"total": money.total, "currency": money.currency},
        "findings": sorted(
            kinds.values(), key=lambda k: (c.SEVERITY_RANK[k["severity"]], -k["gpuHours"], k["kind"])
        ),
    }


class StoredSummaries:
    """Whole-life summaries of finished executions, computed once and stored; all summaries bounded."""

    def __init__(
        self,
        summaries: SummaryService,
        store: SummaryStore,
        render: Render,
        options: StoredSummaryOptions | None = None,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.summaries = summaries
        self.store = store
        self.render = render
        self.options = options or StoredSummaryOptions()
        self.clock = clock
        self.hits = 0  # whole-life summaries served from the store ...
        self.misses = 0  # ... and computed
        self._loops: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopState] = (
            weakref.WeakKeyDictionary()
        )
        self._queue: OrderedDict[str, None] = OrderedDict()  # asked for by the list, for the background
        self._failed: dict[str, float] = {}  # execution id -> monotonic time of its last failure
        self._prices: tuple[Prices, str] | None = None  # the prices last read, and their digest
        m = summaries.metrics
        self._base = digest(
            {
                "format": SUMMARY_FORMAT,
                "version": __version__,
                "scrape_interval_ms": m.options.scrape_interval_ms,
                "max_points_per_series": m.limits.max_points_per_series,
                "summary_points": SUMMARY_POINTS,
                "host_labels": list(m.options.host_labels),
                "node_match": m.options.node_match,
                "metric_names": dict(m.options.metric_names),
                "carbon_g_per_kwh": summaries.carbon,
                "thresholds": asdict(c.INSIGHT_THRESHOLDS),
                "severity": c.INSIGHT_SEVERITY,
            }
        )

    # -- keys ------------------------------------------------------------------------------------------
    def _price_table(self) -> tuple[Prices | None, str]:
        """The prices file (read again when it changed) and the digest of all of it."""
        if self.summaries.prices is None:
            return None, ""
        prices = load_prices(self.summaries.prices)
        if self._prices is None or self._prices[0] is not prices:
            self._prices = (prices, digest([prices.currency, sorted(prices.gpu_hour.items())]))
        return self._prices

    def settings_digest(self) -> str:
        """The settings every stored summary depends on, the whole prices file included."""
        return digest([self._base, self._price_table()[1]])

    def key(self, execution: Execution) -> str:
        """What a stored summary of `execution` must have been computed for to be served."""
        e = execution
        prices, _ = self._price_table()
        price = None
        if prices is not None and e.hardware_profile:
            hit = prices.gpu_hour.get(e.hardware_profile)
            price = None if hit is None else [prices.currency, hit]
        return digest(
            [
                self._base,
                e.execution_id,
                e.hostname,
                list(e.gpus),
                e.status.value,
                None if e.start_time is None else datetime_to_ms(e.start_time),
                None if e.end_time is None else datetime_to_ms(e.end_time),
                e.hardware_profile,
                price,
            ]
        )

    def ready(self, execution: Execution) -> bool:
        """Whether the execution ended long enough ago for its summary to be final (late samples in)."""
        assert execution.end_time is not None
        return datetime_to_ms(execution.end_time) + self.options.grace_ms <= datetime_to_ms(self.clock())

    # -- the compute slots -----------------------------------------------------------------------------
    def figures(self) -> SummaryFigures:
        """For /metrics: summaries served from the store and computed, and what computes, waits and is
        queued now (over every event loop of the process)."""
        states = list(self._loops.values())
        return SummaryFigures(
            self.hits,
            self.misses,
            sum(s.computing for s in states),
            sum(s.waiting for s in states),
            len(self._queue),
        )

    def _state(self) -> _LoopState:
        loop = asyncio.get_running_loop()
        state = self._loops.get(loop)
        if state is None:
            state = _LoopState(asyncio.Semaphore(self.options.concurrency), asyncio.Event())
            self._loops[loop] = state
        return state

    @asynccontextmanager
    async def _slot(self, *, background: bool = False) -> AsyncIterator[None]:
        """One of the `concurrency` slots; a request waits at most `wait_s` for it (then Overloaded)."""
        state = self._state()
        if background:  # only while no request computes or waits, unless that lasts past patience_s
            deadline = time.monotonic() + self.options.patience_s
            while (state.computing or state.waiting) and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
        else:
            state.waiting += 1
        try:
            async with asyncio.timeout(None if background else self.options.wait_s):
                await state.slots.acquire()
        except TimeoutError:
            raise Overloaded(
                f"every summary slot ({self.options.concurrency}) stayed busy for {self.options.wait_s:g} s; "
                "retry shortly"
            ) from None
        finally:
            if not background:
                state.waiting -= 1
        state.computing += 1
        try:
            yield
        finally:
            state.computing -= 1
            state.slots.release()

    def background_slot(self) -> AbstractAsyncContextManager[None]:
        """One of the slots for other background work on summaries (the running usage pass): counted
        in the concurrency limit, taken only while no request computes or waits."""
        return self._slot(background=True)

    # -- serving ---------------------------------------------------------------------------------------
    async def body(
        self, principal: Principal, execution_id: str, start_ms: int | None, end_ms: int | None
    ) -> bytes:
        """The summary route's JSON body: stored for a finished execution's whole life, else computed
        (one of `concurrency` at once; a long one at low priority: service/priority.py; the API's
        middleware counts the request as a summary request)."""
        if start_ms is None and end_ms is None:
            execution = await self.summaries.metrics.executions.get_for(principal, execution_id)
            if storable(execution):
                key = self.key(execution)
                stored = await run_sync(self.store.body, execution_id, key)
                if stored is not None:
                    self.hits += 1
                    return stored
                self.misses += 1
                return await self._shared(execution_id, key)
        async with self._slot():
            summary = await self.summaries.summary(principal, execution_id, start_ms, end_ms)
        return encode(self.render(summary, execution_id))

    async def _shared(self, execution_id: str, key: str, *, background: bool = False) -> bytes:
        """The execution's whole-life summary, computed (and stored when final) once for everyone who
        asks meanwhile; cancelled when every one of them has gone away."""
        state = self._state()
        flight = state.flights.get((execution_id, key))
        if flight is None:
            task = asyncio.ensure_future(self._compute_and_store(execution_id, background))
            flight = _Flight(task)
            state.flights[(execution_id, key)] = flight

            def forget(done: asyncio.Task[bytes], flight: _Flight = flight) -> None:
                if state.flights.get((execution_id, key)) is flight:
                    del state.flights[(execution_id, key)]
                if not done.cancelled():
                    done.exception()  # retrieved: its waiters (if any are left) got it too

            task.add_done_callback(forget)
        flight.waiters += 1
        try:
            return await asyncio.shield(flight.task)
        except asyncio.CancelledError:
            if flight.waiters == 1 and not flight.task.done():  # nobody else wants it: stop the work
                if state.flights.get((execution_id, key)) is flight:
                    del state.flights[(execution_id, key)]
                flight.task.cancel()
            raise
        finally:
            flight.waiters -= 1

    async def _compute_and_store(self, execution_id: str, background: bool) -> bytes:
        found = await run_sync(self.store.executions, [execution_id])  # its row's updated_at, read first
        async with self._slot(background=background):
            started = time.perf_counter()
            summary = await self.summaries.summary(SYSTEM, execution_id, None, None, slices=True)
            doc = self.render(summary, execution_id)
            elapsed = time.perf_counter() - started
        body = encode(doc)
        execution = summary.execution
        registered = found.get(execution_id)
        if registered is not None and storable(execution) and self.ready(execution):
            info = SummaryInfo(
                execution_id=execution_id,
                org=execution.org,
                key_digest=self.key(execution),
                settings_digest=self.settings_digest(),
                source_updated_at=registered.updated_at,
                computed_at=self.clock(),
                compute_ms=round(elapsed * 1000),
                byte_count=len(body),
                row=list_row(summary),
            )
            await run_sync(self.store.put, info, body, summary.slices)
            log.info(
                "stored the summary of execution %s (%.2f s, %d bytes)", execution_id, elapsed, len(body)
            )
        return body

    # -- the list --------------------------------------------------------------------------------------
    async def rows(self, principal: Principal, execution_ids: Sequence[str]) -> list[SummaryRow]:
        """For each id the caller may see (others are left out, as if unknown), in the order asked:
        the stored summary's figures, or "pending" (running, or not computed yet: a finished one is
        queued for the background) or "unavailable" (no host or no start: nothing to summarize)."""
        wanted = list(dict.fromkeys(execution_ids))
        found = await run_sync(self.store.executions, wanted)
        out: list[SummaryRow] = []
        queued = False
        for execution_id in wanted:
            registered = found.get(execution_id)
            if registered is None or not may_see(
                principal, registered.execution.org, registered.execution.project
            ):
                continue
            execution, stored = registered.execution, registered.summary
            if execution.status.is_active:
                out.append(SummaryRow(execution_id, "pending"))
            elif not storable(execution):
                out.append(SummaryRow(execution_id, "unavailable"))
            elif stored is not None and stored.key_digest == self.key(execution):
                out.append(SummaryRow(execution_id, "ready", stored.row))
            else:
                out.append(SummaryRow(execution_id, "pending"))
                if self.ready(execution):
                    queued |= self.enqueue(execution_id)
        if queued:
            self.wake()
        return out

    def wake(self) -> None:
        """Start the next background pass now."""
        self._state().wake.set()

    def enqueue(self, execution_id: str) -> bool:
        """Ask the background for this execution's summary (True when it was not queued already)."""
        if execution_id in self._queue:
            return False
        self._queue[execution_id] = None
        while len(self._queue) > self.options.queue_max:
            self._queue.popitem(last=False)
        return True

    # -- the background --------------------------------------------------------------------------------
    async def wait_for_work(self, interval_s: float) -> None:
        """Until `interval_s` passed or the list queued an execution."""
        if self._queue:
            return
        wake = self._state().wake
        try:
            async with asyncio.timeout(interval_s):
                await wake.wait()
        except TimeoutError:
            pass
        wake.clear()

    def _recent_failures(self) -> list[str]:
        horizon = time.monotonic() - self.options.retry_ms / 1000
        self._failed = {k: t for k, t in self._failed.items() if t > horizon}
        return list(self._failed)

    def _targets(self, queued: list[str], limit: int, skip: list[str]) -> list[Registered]:
        """The queued executions first, then those that finished recently without a fresh summary
        (blocking: the registry)."""
        now_ms = datetime_to_ms(self.clock())
        found = self.store.executions(queued)
        out = [found[i] for i in queued if i in found]
        seen = {r.execution.execution_id for r in out}
        for r in self.store.pending(
            ended_after=ms_to_datetime(now_ms - self.options.horizon_ms),
            ready_before=ms_to_datetime(now_ms - self.options.grace_ms),
            settings_digest=self.settings_digest(),
            limit=limit,
            exclude=skip,
        ):
            if r.execution.execution_id not in seen:
                out.append(r)
        return out

    async def run_pass(self, limit: int | None = None) -> PassReport:
        """Compute (one at a time) up to `limit` summaries the store lacks; record the rows that still
        hold. Failures are logged, reported and left alone for `retry_ms`."""
        with self.summaries.priority.low_priority():
            return await self._pass(self.options.batch if limit is None else limit)

    async def _pass(self, limit: int) -> PassReport:
        report = PassReport()
        skip = self._recent_failures()
        queued: list[str] = []
        while self._queue and len(queued) < limit:
            execution_id, _ = self._queue.popitem(last=False)
            if execution_id not in skip:
                queued.append(execution_id)
        for target in await run_sync(self._targets, queued, limit, skip):
            if report.computed + len(report.failed) >= limit:
                break
            execution, stored = target.execution, target.summary
            execution_id = execution.execution_id
            if not storable(execution) or not self.ready(execution):
                report.skipped += 1
                continue
            try:
                key = self.key(execution)
                if stored is not None and stored.key_digest == key:
                    await run_sync(
                        self.store.mark,
                        execution_id,
                        settings_digest=self.settings_digest(),
                        source_updated_at=target.updated_at,
                    )
                    report.unchanged += 1
                    continue
                await self._shared(execution_id, key, background=True)
            except GpulensError as exc:
                log.warning("the summary of execution %s failed: %s", execution_id, exc.message)
                self._failed[execution_id] = time.monotonic()
                report.failed.append((execution_id, exc.message))
                continue
            report.computed += 1
        return report


async def summary_task(stored: StoredSummaries, *, interval_s: float) -> None:
    """A background pass every `interval_s`, or as soon as the list queued executions (and again at
    once while a pass finds a full batch), until cancelled; `gpulens serve` runs it."""
    while True:
        await stored.wait_for_work(interval_s)
        try:
            report = await stored.run_pass()
        except Exception:
            log.exception("summary pass failed")
            await asyncio.sleep(interval_s)
            continue
        if report.computed or report.failed:
            log.info(
                "summary pass: %d computed, %d unchanged, %d failed",
                report.computed,
                report.unchanged,
                len(report.failed),
            )
        if report.computed + len(report.failed) >= stored.options.batch:  # more may be waiting
            await asyncio.sleep(1.0)
            stored.wake()
