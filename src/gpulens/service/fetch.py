"""Run many range queries with bounded concurrency and hand results back in request order."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from typing import Generic, TypeVar

J = TypeVar("J")
R = TypeVar("R")


class OrderedFetch(Generic[J, R]):
    """Keeps up to `depth` jobs in flight; results come out in job order, so memory stays flat.

    `prime()` waits for the first batch, so that a failing backend is reported as an HTTP error
    before a streamed response has started.
    """

    def __init__(self, jobs: Sequence[J], run: Callable[[J], Awaitable[R]], depth: int) -> None:
        self._jobs: Iterator[J] = iter(jobs)
        self._run = run
        self._depth = max(1, depth)
        self._pending: deque[asyncio.Task[R]] = deque()

    def _fill(self) -> None:
        while len(self._pending) < self._depth:
            job = next(self._jobs, None)
            if job is None:
                return
            self._pending.append(asyncio.ensure_future(self._run(job)))

    async def prime(self) -> None:
        self._fill()
        if not self._pending:
            return
        await asyncio.wait(list(self._pending))
        for task in self._pending:  # the first failure in job order
            if task.exception() is not None:
                self.cancel()
                raise task.exception()  # type: ignore[misc]

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
