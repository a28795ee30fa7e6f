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
        # prime() then waits for every result: they all start at once and it waits for `depth`
        self._one_batch = len(jobs) <= self._depth and sum(map(self._weight, jobs)) <= self._ahead
        self._pending: deque[tuple[asyncio.Task[R], int]] = deque()  # started, with their weights
        self._held = 0  # the weight of the pending jobs

    def _fill(self) -> None:
        batch: list[tuple[J, int]] = []
        while self._jobs:
            weight = max(0, self._weight(self._jobs[0]))
            if (self._pending or batch) and self._held + weight > self._ahead:
                break
            batch.append((self._jobs.popleft(), weight))
            self._held += weight
        rank = self._rank
        order = (
            range(len(batch)) if rank is None else sorted(range(len(batch)), key=lambda k: rank(batch[k][0]))
        )
        tasks = {k: asyncio.ensure_future(self._run(batch[k][0])) for k in order}  # started in rank order
        self._pending.extend((tasks[k], weight) for k, (_, weight) in enumerate(batch))

    async def prime(self) -> None:
        self._fill()
        if not self._pending:
            return
        first = [task for task, _ in list(self._pending)[: self._depth]]
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
                task, weight = self._pending.popleft()
                self._held -= weight
                yield await task
        finally:
            self.cancel()

    def cancel(self) -> None:
        self._jobs.clear()  # nothing more starts
        self._held = 0
        while self._pending:
            task, _ = self._pending.popleft()
            task.cancel()
            if task.done() and not task.cancelled():
                task.exception()  # retrieved: no "exception was never retrieved" warnings


def _one(_job: object) -> int:
    return 1
