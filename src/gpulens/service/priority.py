"""Other requests before summaries: a summary's work steps aside while anything else is being served.

A summary is seconds of CPU (its backend answers decoded, its findings and statistics); the other
requests of the process are mostly milliseconds. They share one interpreter: a summary computing in a
worker thread still takes the GIL from the event loop every few milliseconds, and 16 of them made
another tenant's 30-minute metrics read 100x slower (issue 21). So the summaries' work is *low
priority*: `Priority` counts the requests in flight (`requests`, kept by the API's middleware) and
the summary requests among them (`low`, kept by the summary store), and while any other request is
in flight a long summary (SummaryService: more than 45 h at 15 s) or one of the background pass

* sends no backend query (`YieldingBackend`: each query of a low-priority task waits first, and
  one at a time (`lane`), summaries together, until no other request came for a second), and
* does not go on to its next step in its worker thread (`pause_sync`, between its steps),

each wait at most `patience_s` and all of one summary's at most `budget_s`, so a steady stream of
other requests (or a long export) slows a summary down by a bounded time and never stops it. What is
low priority is a context variable (`LOW`), set around such a summary's work: the tasks it starts (its
chunked reads) inherit it; everything else is untouched.
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
import weakref
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from contextvars import ContextVar

from gpulens.backends.base import MetricsBackend
from gpulens.domain.models import Execution, RangeQuery, Series
from gpulens.domain.workloads import Pod
from gpulens.service.archived import ArchiveLookup

LOW: ContextVar[bool] = ContextVar("gpulens_low_priority", default=False)


class Yielded:
    """What one low-priority piece of work (a summary) has spent stepping aside, up to its budget."""

    __slots__ = ("budget_s", "spent_s")

    def __init__(self, budget_s: float) -> None:
        self.budget_s = budget_s
        self.spent_s = 0.0

    @property
    def left(self) -> bool:
        return self.spent_s < self.budget_s


_YIELDED: ContextVar[Yielded | None] = ContextVar("gpulens_yielded", default=None)


class Priority:
    """Requests in flight, and how long a summary's step waits for the others to be served."""

    def __init__(
        self, patience_s: float = 0.5, lane: int = 1, quiet_s: float = 1.0, budget_s: float = 30.0
    ) -> None:
        self.patience_s = patience_s
        self.budget_s = budget_s  # one low-priority context steps aside this long at most, in all
        self.quiet_s = quiet_s
        self._last_busy = -math.inf  # monotonic time another request was last in flight
        self.lane = lane  # backend queries of low-priority tasks in flight at once (the process')
        self._lanes: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = (
            weakref.WeakKeyDictionary()
        )
        self.requests = 0  # HTTP requests in flight (api/foreground.py counts them)
        self.low = 0  # ... of which summary requests
        self.yielded_s = 0.0  # seconds summaries spent stepping aside (for tests and the bench)
        self._calm = threading.Event()  # set while no other request is in flight (for worker threads)
        self._calm.set()
        self._waiting: set[asyncio.Future[None]] = set()  # low-priority tasks stepping aside

    def busy(self) -> bool:
        """Whether a request other than a summary is in flight."""
        return self.requests - self.low > 0

    def _changed(self) -> None:
        if self.busy():
            self._last_busy = time.monotonic()
            self._calm.clear()
            return
        if not self._calm.is_set():
            self._last_busy = time.monotonic()  # the last other request just ended
        self._calm.set()
        waiting, self._waiting = self._waiting, set()
        for future in waiting:
            loop = future.get_loop()
            loop.call_soon_threadsafe(_wake, future)

    @contextmanager
    def request(self, *, summary: bool = False) -> Iterator[None]:
        """One HTTP request in flight (the middleware's); `summary`: a summary request, which does
        not count as another request (a short summary does not hold a long one back). Both counts
        change at once: a summary request is never seen as another request, even for an instant
        (that would hold its own queries in the lane for `quiet_s`)."""
        self.requests += 1
        self.low += summary
        self._changed()
        try:
            yield
        finally:
            self.requests -= 1
            self.low -= summary
            self._changed()

    @contextmanager
    def low_priority(self) -> Iterator[None]:
        """Everything started within runs at low priority."""
        token = LOW.set(True)
        spent = _YIELDED.set(Yielded(self.budget_s))
        try:
            yield
        finally:
            _YIELDED.reset(spent)
            LOW.reset(token)

    def yielded(self) -> Yielded | None:
        """The budget of the low-priority work running here (None: not low priority)."""
        return _YIELDED.get() if LOW.get() else None

    @asynccontextmanager
    async def backend_call(self) -> AsyncIterator[None]:
        """Around a backend query: at low priority, one of `lane` at once and after stepping aside
        (so that few are in flight when another request comes), unless no other request was in
        flight for `quiet_s` (then as many as the backend takes: a summary alone goes at full speed),
        or its context has stepped aside for its whole budget (then as any request: the budget bounds
        what low priority costs it, the lane included)."""
        spent = self.yielded()
        quiet = not self.busy() and time.monotonic() - self._last_busy > self.quiet_s
        if spent is None or not spent.left or quiet:
            yield
            return
        loop = asyncio.get_running_loop()
        lane = self._lanes.get(loop)
        if lane is None:
            lane = self._lanes[loop] = asyncio.Semaphore(self.lane)
        async with lane:
            await self.step_aside()
            yield

    async def step_aside(self) -> None:
        """In a low-priority task: return once no other request is in flight (or after patience_s;
        at once when its context has stepped aside for budget_s already: a long export beside it
        slows a summary down by that much at most)."""
        spent = self.yielded()
        if spent is None or not spent.left or not self.busy():
            return
        started = time.monotonic()
        future = asyncio.get_running_loop().create_future()
        self._waiting.add(future)
        try:
            await asyncio.wait_for(future, self.patience_s)
        except TimeoutError:
            pass
        finally:
            self._waiting.discard(future)
            self._spend(spent, time.monotonic() - started)

    def pause_sync(self, spent: Yielded | None = None) -> None:
        """The same, in a worker thread (a summary's computation, between its steps; it waits
        without the GIL); `spent`: its context's budget (`yielded()`, taken on the event loop)."""
        if self._calm.is_set() or (spent is not None and not spent.left):
            return
        started = time.monotonic()
        self._calm.wait(self.patience_s)
        self._spend(spent, time.monotonic() - started)

    def _spend(self, spent: Yielded | None, seconds: float) -> None:
        self.yielded_s += seconds
        if spent is not None:
            spent.spent_s += seconds


def _wake(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class YieldingBackend:
    """`inner`, whose queries from low-priority tasks wait for the other requests first."""

    def __init__(self, inner: MetricsBackend, priority: Priority) -> None:
        self.inner = inner
        self.priority = priority
        self.name = inner.name

    async def query_range(self, query: RangeQuery) -> list[Series]:
        async with self.priority.backend_call():
            return await self.inner.query_range(query)

    async def query(self, expr: str, time_ms: int) -> list[Series]:
        async with self.priority.backend_call():
            return await self.inner.query(expr, time_ms)

    async def series_labels(self, match: str, label: str, start_ms: int, end_ms: int) -> list[str]:
        async with self.priority.backend_call():
            return await self.inner.series_labels(match, label, start_ms, end_ms)

    async def series(self, match: str, start_ms: int, end_ms: int) -> list[dict[str, str]]:
        async with self.priority.backend_call():
            return await self.inner.series(match, start_ms, end_ms)

    async def query_raw(self, match: str, start_ms: int, end_ms: int) -> list[Series]:
        async with self.priority.backend_call():
            return await self.inner.query_raw(match, start_ms, end_ms)

    async def ready(self) -> None:
        await self.inner.ready()

    async def aclose(self) -> None:
        await self.inner.aclose()


class YieldingArchives:
    """`inner` archives whose backends are `YieldingBackend`s: a low-priority summary of an archived
    execution steps aside as one of a live execution does (its queries are in-process evaluation)."""

    def __init__(self, inner: ArchiveLookup, priority: Priority) -> None:
        self.inner = inner
        self.priority = priority

    async def for_execution(self, execution: Execution) -> MetricsBackend | None:
        found = await self.inner.for_execution(execution)
        return None if found is None else YieldingBackend(found, self.priority)

    async def for_pods(self, pods: Sequence[Pod]) -> MetricsBackend | None:
        found = await self.inner.for_pods(pods)
        return None if found is None else YieldingBackend(found, self.priority)
