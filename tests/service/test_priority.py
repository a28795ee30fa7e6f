"""service/priority.py: low-priority work steps aside while other requests are in flight (at most
patience_s a step), its backend queries go one at a time, and nothing else is touched."""

from __future__ import annotations

import asyncio
import threading
import time

from gpulens.domain.models import RangeQuery, Series, Window
from gpulens.service.priority import LOW, Priority, YieldingArchives, YieldingBackend


class SlowBackend:
    """Counts the queries in flight (the most at once) and takes 20 ms a query."""

    name = "slow"

    def __init__(self) -> None:
        self.in_flight = 0
        self.most = 0

    async def query_range(self, query: RangeQuery) -> list[Series]:
        self.in_flight += 1
        self.most = max(self.most, self.in_flight)
        await asyncio.sleep(0.02)
        self.in_flight -= 1
        return []

    async def query(self, expr: str, time_ms: int) -> list[Series]:
        return []

    async def series_labels(self, match: str, label: str, start_ms: int, end_ms: int) -> list[str]:
        return []

    async def series(self, match: str, start_ms: int, end_ms: int) -> list[dict[str, str]]:
        return []

    async def query_raw(self, match: str, start_ms: int, end_ms: int) -> list[Series]:
        return []

    async def ready(self) -> None:
        return None

    async def aclose(self) -> None:
        return None


QUERY = RangeQuery("up", Window(0, 60_000, 15_000))


async def test_low_priority_waits_for_the_other_requests_and_others_never_wait() -> None:
    priority = Priority(patience_s=5.0)
    with priority.request():  # another tenant's read in flight
        with priority.low_priority():  # a task started at low priority keeps it
            summary = asyncio.ensure_future(priority.step_aside())
        assert priority.busy()
        await asyncio.wait_for(priority.step_aside(), 0.1)  # this task is not low priority: no wait
        await asyncio.sleep(0.1)
        assert not summary.done()
    await asyncio.wait_for(summary, 1.0)  # released as soon as the read is done
    assert priority.yielded_s >= 0.09
    assert not LOW.get()


async def test_a_summary_request_alone_is_not_held_back() -> None:
    """Not even for quiet_s after it came: its queries go as many at once as the backend takes."""
    priority = Priority(patience_s=5.0, quiet_s=60.0)
    backend = SlowBackend()
    slow = YieldingBackend(backend, priority)  # type: ignore[arg-type]
    with priority.request(summary=True), priority.low_priority():
        assert not priority.busy()
        await asyncio.wait_for(priority.step_aside(), 0.1)
        await asyncio.gather(*(slow.query_range(QUERY) for _ in range(4)))
    assert backend.most == 4 and priority.yielded_s == 0


async def test_a_step_aside_lasts_at_most_patience() -> None:
    priority = Priority(patience_s=0.2)
    with priority.request(), priority.low_priority():
        started = time.monotonic()
        await priority.step_aside()
        assert 0.15 <= time.monotonic() - started < 1.0


async def test_a_worker_thread_pauses_until_the_others_are_served() -> None:
    priority = Priority(patience_s=5.0)
    done = threading.Event()

    def step() -> None:
        priority.pause_sync()
        done.set()

    with priority.request():
        thread = threading.Thread(target=step)
        thread.start()
        await asyncio.sleep(0.1)
        assert not done.is_set()
    await asyncio.to_thread(done.wait, 1.0)
    assert done.is_set()
    thread.join()


async def test_low_priority_queries_go_one_at_a_time_until_the_others_are_quiet() -> None:
    inner = SlowBackend()
    backend = YieldingBackend(inner, Priority(quiet_s=0.3))
    await asyncio.gather(*(backend.query_range(QUERY) for _ in range(5)))
    assert inner.most == 5  # not low priority
    inner.most = 0
    with backend.priority.low_priority():
        await asyncio.gather(*(backend.query_range(QUERY) for _ in range(5)))
        assert inner.most == 5  # nobody else asked anything yet: as the backend takes them
        inner.most = 0
        with backend.priority.request():
            pass  # another request came and went
        await asyncio.gather(*(backend.query_range(QUERY) for _ in range(5)))
        assert inner.most == 1  # within quiet_s of it: one at a time
        await asyncio.sleep(0.3)
        inner.most = 0
        await asyncio.gather(*(backend.query_range(QUERY) for _ in range(5)))
        assert inner.most == 5  # quiet again


async def test_one_summary_steps_aside_for_its_budget_at_most() -> None:
    """A long export beside a summary slows it down by budget_s in all, not by every step's patience."""
    priority = Priority(patience_s=0.1, budget_s=0.25)
    with priority.request(), priority.low_priority():
        started = time.monotonic()
        for _ in range(10):
            await priority.step_aside()
        assert 0.25 <= time.monotonic() - started < 0.6  # 3 waits of 0.1 s, then none
        spent = priority.yielded()
        assert spent is not None and not spent.left
        priority.pause_sync(spent)  # nor in its worker thread
        assert time.monotonic() - started < 0.6
        # nor are its backend queries held to the lane, although another request is still in flight
        now = most = 0

        async def query() -> None:
            nonlocal now, most
            async with priority.backend_call():
                now += 1
                most = max(most, now)
                await asyncio.sleep(0.01)
                now -= 1

        await asyncio.gather(*(query() for _ in range(5)))
        assert most == 5 and time.monotonic() - started < 0.6
        with priority.low_priority():  # the next summary has a budget of its own
            inner = priority.yielded()
            assert inner is not None and inner.left


async def test_an_archived_executions_queries_step_aside_too() -> None:
    """The archive's backends (archived executions, in-process) are wrapped as the live one is."""

    class Archives:
        async def for_execution(self, execution: object) -> SlowBackend | None:
            return SlowBackend() if execution == "archived" else None

        async def for_pods(self, pods: object) -> SlowBackend | None:
            return None

    priority = Priority(patience_s=5.0)
    archives = YieldingArchives(Archives(), priority)  # type: ignore[arg-type]
    assert await archives.for_execution("live") is None  # type: ignore[arg-type]
    assert await archives.for_pods(()) is None
    backend = await archives.for_execution("archived")  # type: ignore[arg-type]
    assert isinstance(backend, YieldingBackend)
    with priority.request():  # another request in flight
        with priority.low_priority():
            query = asyncio.ensure_future(backend.query_range(QUERY))
        await asyncio.sleep(0.1)
        assert not query.done()  # the summary's query waits for it
    await asyncio.wait_for(query, 1.0)
