"""Run many range queries with bounded concurrency and hand results back in request order."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Generic, TypeVar

J = TypeVar("J")
R = TypeVar("R")


class OrderedFetch(Generic[J, R]):
    """Keeps jobs started while the ones not yet handed back weigh at most `ahead` together (each job
    `weight(job)`, by default 1; `ahead` by default `depth`; the head of the line always starts);
    results come out in job order, so memory stays bounded by `ahead`. Of the jobs that start
    together, those with a lower `rank(job)` start first (they queue at the backend's connection pool
    in that order): a read's costliest query is not left to start when the others are done.

    `prime()` waits for the first `depth` jobs, so that a failing backend is reported as an HTTP
    error before a streamed response has started. An `ahead` beyond the backend's own concurrency
    bound keeps the backend busy while the result at the head of the line is still outstanding (the
    jobs behind it queue at the backend, not here).
    """

    def __init__(
        self,
        jobs: Sequence[J],
        run: Callable[[J], Awaitable[R]],
        depth: int,
        ahead: int | None = None,
        weight: Callable[[J], int] | None = None,
        rank: Callable[[J], int] | None = None,
    ) -> None:
        self._jobs = deque(jobs)
        self._run = run
        self._depth = max(1, depth)
        self._weight = weight or _one
        self._rank = rank
        self._ahead = max(self._depth if weight is None else 1, ahead or 0)
        self._one_batch = len(jobs) <= self._depth  # prime() then waits for every result
        self._pending: deque[asyncio.Task[R]] = deque()
        self._weights: deque[int] = deque()
        self._held = 0  # the weight of the pending jobs

    def _fill(self) -> None:
        batch: list[J] = []
        while self._jobs:
            weight = max(0, self._weight(self._jobs[0]))
            if (self._pending or batch) and self._held + weight > self._ahead:
                break
            batch.append(self._jobs.popleft())
            self._weights.append(weight)
            self._held += weight
        rank = self._rank
        if rank is None or len(batch) < 2:
            self._pending.extend(asyncio.ensure_future(self._run(job)) for job in batch)
            return
        ranked = sorted(range(len(batch)), key=lambda k: rank(batch[k]))
        tasks: dict[int, asyncio.Task[R]] = {k: asyncio.ensure_future(self._run(batch[k])) for k in ranked}
        self._pending.extend(tasks[k] for k in range(len(batch)))

    async def prime(self) -> None:
        self._fill()
        if not self._pending:
            return
        first = list(self._pending)[: self._depth]
        await asyncio.wait(first)
        for task in first:  # the first failure in job order
            if task.exception() is not None:
                self.cancel()
                raise task.exception()  # type: ignore[misc]

    @property
    def one_batch(self) -> bool:
        """Whether every job runs in the first batch: after `prime()` all results are in hand."""
        return self._one_batch

    async def results(self) -> AsyncIterator[R]:
        try:
            while True:
                self._fill()
                if not self._pending:
                    return
                task = self._pending.popleft()
                self._held -= self._weights.popleft()
                yield await task
        finally:
            self.cancel()

    def cancel(self) -> None:
        self._jobs.clear()  # nothing more starts
        self._weights.clear()
        self._held = 0
        while self._pending:
            task = self._pending.popleft()
            task.cancel()
            if task.done() and not task.cancelled():
                task.exception()  # retrieved: no "exception was never retrieved" warnings


def _one(_job: object) -> int:
    return 1
