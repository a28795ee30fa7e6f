"""OrderedFetch: results in job order, bounded in flight, failures surface at prime()."""

from __future__ import annotations

import asyncio

import pytest

from gpulens.service.fetch import OrderedFetch


async def test_results_come_in_job_order_with_bounded_concurrency() -> None:
    running = 0
    peak = 0

    async def run(job: int) -> int:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await asyncio.sleep(0.001 * ((7 * job) % 5))
        running -= 1
        return job * 10

    fetch = OrderedFetch(list(range(40)), run, depth=4)
    await fetch.prime()
    assert [r async for r in fetch.results()] == [j * 10 for j in range(40)]
    assert peak == 4  # bounded, and actually concurrent


async def test_prime_raises_first_failure_in_job_order() -> None:
    async def run(job: int) -> int:
        if job in (1, 2):
            await asyncio.sleep(0.01 if job == 1 else 0)
            raise ValueError(f"job {job}")
        return job

    fetch = OrderedFetch([0, 1, 2, 3], run, depth=8)
    with pytest.raises(ValueError, match="job 1"):
        await fetch.prime()


async def test_late_failure_surfaces_while_streaming() -> None:
    async def run(job: int) -> int:
        if job == 5:
            raise RuntimeError("late")
        return job

    fetch = OrderedFetch(list(range(8)), run, depth=2)
    await fetch.prime()
    got = []
    with pytest.raises(RuntimeError, match="late"):
        async for r in fetch.results():
            got.append(r)
    assert got == [0, 1, 2, 3, 4]


async def test_empty_jobs() -> None:
    async def run(job: int) -> int:
        return job

    fetch: OrderedFetch[int, int] = OrderedFetch([], run, depth=3)
    await fetch.prime()
    assert [r async for r in fetch.results()] == []


async def test_a_slow_head_does_not_idle_the_backend_when_looking_ahead() -> None:
    """The backend admits 4 at once (its own gate); 8 started: while job 0 is slow, jobs 1-7 keep the
    backend busy, results still come in job order, and prime() waited for the first 4 only."""
    gate = asyncio.Semaphore(4)
    busy = 0
    peak = 0
    done: list[int] = []
    release_head = asyncio.Event()

    async def run(job: int) -> int:
        nonlocal busy, peak
        async with gate:
            busy += 1
            peak = max(peak, busy)
            if job == 0:
                await release_head.wait()
            else:
                await asyncio.sleep(0.001)
            busy -= 1
        done.append(job)
        return job

    fetch = OrderedFetch(list(range(20)), run, depth=4, ahead=8)
    assert not fetch.one_batch
    primed = asyncio.ensure_future(fetch.prime())
    await asyncio.sleep(0.05)
    assert not primed.done()  # job 0 is one of the first 4: prime waits for it
    assert sorted(done) == list(range(1, 8))  # the 7 behind the head ran meanwhile (3 at a time)
    release_head.set()
    await primed
    assert [r async for r in fetch.results()] == list(range(20))
    assert peak == 4


async def test_one_batch_is_known_after_prime() -> None:
    async def run(job: int) -> int:
        return job

    fetch = OrderedFetch([1, 2, 3], run, depth=4, ahead=8)
    assert fetch.one_batch
    await fetch.prime()
    assert [r async for r in fetch.results()] == [1, 2, 3]


async def test_jobs_start_while_the_unconsumed_weigh_at_most_ahead() -> None:
    """Weighted: light jobs all start at once when they fit (a day's ~30 short pieces), heavy ones
    a few at a time; a job heavier than `ahead` still starts alone; results stay in job order."""
    weights = [3, 3, 3, 3, 3, 3, 3, 3, 12, 1, 1, 1, 5, 5, 5]
    started: list[int] = []
    held_peak = 0
    consumed: set[int] = set()

    async def run(job: int) -> int:
        nonlocal held_peak
        started.append(job)
        held = sum(weights[j] for j in started if j not in consumed)
        held_peak = max(held_peak, held if job != 8 else 0)
        await asyncio.sleep(0.001 * (job % 3))
        return job

    fetch = OrderedFetch(list(range(len(weights))), run, depth=2, ahead=10, weight=weights.__getitem__)
    await fetch.prime()
    assert started[:3] == [0, 1, 2]  # 9 of 10: the fourth (3) waits
    got = []
    async for r in fetch.results():
        got.append(r)
        consumed.add(r)
    assert got == list(range(len(weights)))
    assert held_peak <= 10


async def test_all_light_jobs_start_before_any_result_is_taken() -> None:
    started: list[int] = []

    async def run(job: int) -> int:
        started.append(job)
        await asyncio.sleep(0)
        return job

    fetch = OrderedFetch(list(range(30)), run, depth=12, ahead=24 * 11_000, weight=lambda job: 5_761 // 3)
    await fetch.prime()
    assert sorted(started) == list(range(30))
    assert [r async for r in fetch.results()] == list(range(30))


async def test_lower_rank_starts_first_results_in_job_order() -> None:
    """Jobs that start together queue at the backend in rank order (the costliest first)."""
    gate = asyncio.Semaphore(1)  # a backend that takes one at a time, first come first served
    order: list[str] = []

    async def run(job: str) -> str:
        async with gate:
            order.append(job)
            await asyncio.sleep(0)
        return job.upper()

    jobs = ["gpu", "fb", "temp", "ram", "cpu"]
    fetch = OrderedFetch(jobs, run, depth=5, rank=lambda job: 0 if job == "cpu" else 1)
    await fetch.prime()
    assert order == ["cpu", "gpu", "fb", "temp", "ram"]  # the rest keep their order
    assert [r async for r in fetch.results()] == ["GPU", "FB", "TEMP", "RAM", "CPU"]


async def test_early_jobs_start_with_the_first_and_come_out_in_their_turn() -> None:
    """A month's costliest chunks (the last metric) start with the first ones, within half the
    bound; the rest of them in their turn; the head of the line still always starts, the held
    weight stays within `ahead`, and the results keep job order."""
    weights = [4] * 12 + [6, 6, 6]  # twelve cheap chunks, then three costly ones
    costly = {12, 13, 14}
    started: list[int] = []
    consumed: set[int] = set()
    held_peak = 0

    async def run(job: int) -> int:
        nonlocal held_peak
        started.append(job)
        held_peak = max(held_peak, sum(weights[j] for j in started if j not in consumed))
        await asyncio.sleep(0.001 * (job % 4))
        return job

    fetch = OrderedFetch(
        list(range(15)), run, depth=2, ahead=20, weight=weights.__getitem__, early=costly.__contains__
    )
    await fetch.prime()
    assert started[:2] == [12, 0]  # one costly chunk fits half the bound (6 + 6 > 10); the line goes on
    assert 13 not in started and 14 not in started
    got = []
    async for r in fetch.results():
        got.append(r)
        consumed.add(r)
    assert got == list(range(15))
    assert sorted(started) == list(range(15)) and started.count(12) == 1
    assert held_peak <= 20


async def test_an_early_job_heavier_than_half_the_bound_waits_for_its_turn() -> None:
    started: list[int] = []

    async def run(job: int) -> int:
        started.append(job)
        await asyncio.sleep(0)
        return job

    fetch = OrderedFetch([0, 1, 2], run, depth=1, ahead=10, weight=lambda job: 6, early=lambda job: job == 2)
    await fetch.prime()
    assert started == [0]
    assert [r async for r in fetch.results()] == [0, 1, 2]


async def test_nothing_starts_after_cancel() -> None:
    started: list[int] = []

    async def run(job: int) -> int:
        started.append(job)
        await asyncio.sleep(0)
        return job

    fetch = OrderedFetch(list(range(10)), run, depth=2)
    await fetch.prime()
    fetch.cancel()
    assert [r async for r in fetch.results()] == []
    assert sorted(started) == [0, 1]


async def test_few_jobs_too_heavy_to_start_together_are_not_one_batch() -> None:
    async def run(job: int) -> int:
        return job

    assert OrderedFetch([1, 2], run, depth=4, ahead=10, weight=lambda job: 4).one_batch
    heavy = OrderedFetch([1, 2], run, depth=4, ahead=10, weight=lambda job: 6)
    assert not heavy.one_batch  # the second starts only when the first is handed on
    await heavy.prime()
    assert [r async for r in heavy.results()] == [1, 2]
