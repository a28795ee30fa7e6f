"""Run many range queries with bounded concurrency and hand results back in request order."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from typing import Generic, TypeVar

J = TypeVar("J")
R = TypeVar("R")


class OrderedFetch(Generic[J, R]):
    """Keeps up to `ahead` jobs started (default `depth`); results come out in job order, so memory
    stays bounded by `ahead` results.

    `prime()` waits for the first `depth` jobs, so that a failing backend is reported as an HTTP
    error before a streamed response has started. An `ahead` beyond the backend's own concurrency
    bound keeps the backend busy while the result at the head of the line is still outstanding (the
    jobs behind it queue at the backend, not here).
    """

    def __init__(
        self, jobs: Sequence[J], run: Callable[[J], Awaitable[R]], depth: int, ahead: int | None = None
    ) -> None:
        self._jobs: Iterator[J] = iter(jobs)
        self._run = run
        self._depth = max(1, depth)
        self._ahead = max(self._depth, ahead or 0)
        self._one_batch = len(jobs) <= self._depth  # prime() then waits for every result
        self._pending: deque[asyncio.Task[R]] = deque()

    def _fill(self) -> None:
        while len(self._pending) < self._ahead:
            job = next(self._jobs, None)
            if job is None:
                return
            self._pending.append(asyncio.ensure_future(self._run(job)))

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
                yield await task
        finally:
            self.cancel()

    def cancel(self) -> None:
        while self._pending:
            task = self._pending.popleft()
            task.cancel()
            if task.done() and not task.cancelled():
                task.exception()  # retrieved: no "exception was never retrieved" warnings
