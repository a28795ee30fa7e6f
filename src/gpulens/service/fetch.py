"""Run many range queries with bounded concurrency and hand results back in request order."""

from __future__ import annotations

import asyncio
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

    `early(job)`: jobs started with the first, wherever they stand in the line (while they weigh at
    most half of `ahead` together; the rest in their turn), their results held until it comes: the
    costliest queries of a long read (a month's host CPU chunks, the last metric) then run while the
    cheap ones do, instead of alone at its end, where the backend's cores would wait on them.

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
        early: Callable[[J], bool] | None = None,
    ) -> None:
        self._jobs = list(jobs)
        self._run = run
        self._depth = max(1, depth)
        self._weights = [max(0, (weight or _one)(job)) for job in self._jobs]
        self._rank = rank
        self._ahead = max(self._depth if weight is None else 1, ahead or 0)
        # prime() then waits for every result: they all start at once and it waits for `depth`
        self._one_batch = len(self._jobs) <= self._depth and sum(self._weights) <= self._ahead
        self._tasks: dict[int, asyncio.Task[R]] = {}  # started, not yet handed back
        self._held = 0  # the weight of those
        self._next_start = 0  # the first job not yet started in line
        self._next_out = 0  # the next job to hand back
        self._early = [k for k, job in enumerate(self._jobs) if early is not None and early(job)]

    def _fill(self) -> None:
        if self._early:  # the first fill: the early jobs, while they weigh at most half the bound
            budget = self._ahead // 2
            for k in self._early:
                if self._weights[k] <= budget:
                    budget -= self._weights[k]
                    self._start(k)
            self._early = []
        batch: list[int] = []
        held = self._held  # with the batch's
        while self._next_start < len(self._jobs):
            k = self._next_start
            if k in self._tasks:  # started early: passed over in line
                self._next_start += 1
                continue
            weight = self._weights[k]
            if (self._tasks or batch) and k != self._next_out and held + weight > self._ahead:
                break  # the head of the line always starts
            batch.append(k)
            held += weight
            self._next_start += 1
        rank = self._rank
        for k in batch if rank is None else sorted(batch, key=lambda k: rank(self._jobs[k])):
            self._start(k)  # in rank order

    def _start(self, k: int) -> None:
        self._tasks[k] = asyncio.ensure_future(self._run(self._jobs[k]))
        self._held += self._weights[k]

    async def prime(self) -> None:
        self._fill()
        if not self._tasks:
            return
        first = [self._tasks[k] for k in sorted(self._tasks)[: self._depth]]
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
            while self._next_out < len(self._jobs):
                self._fill()
                k = self._next_out
                task = self._tasks.pop(k)
                self._held -= self._weights[k]
                self._next_out += 1
                yield await task
        finally:
            self.cancel()

    def cancel(self) -> None:
        self._early = []
        self._next_start = self._next_out = len(self._jobs)  # nothing more starts
        self._held = 0
        tasks, self._tasks = self._tasks, {}
        for task in tasks.values():
            task.cancel()
            if task.done() and not task.cancelled():
                task.exception()  # retrieved: no "exception was never retrieved" warnings


def _one(_job: object) -> int:
    return 1
