"""Fleet usage of running executions (docs/usage.md): their provisional hourly slices.

A finished execution's slices come with its stored whole-life summary. A running one has none, so
every `GPULENS_USAGE_INTERVAL` this pass computes the summary of each running execution from the
start of the hour of its last stored slice (the hour the last pass saw only part of) to now, and
stores that window's slices in place of those it had from that hour on, with the daily rollup of the
days they touch. The first pass reads the whole run so far. Hours before are kept as they were.
Once the whole-life summary is stored its slices replace all of these, and the pass writes no more.

The usage table counts a running execution up to its last pass and says so (`runningExecutions`).
Findings cut at the window's start are found from there (an idle stretch that began earlier counts
from the window's start), which is why these figures are provisional.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

from gpulens.domain.errors import GpulensError
from gpulens.domain.timeparse import datetime_to_ms
from gpulens.service.checks import run_sync
from gpulens.service.summary_store import SYSTEM, StoredSummaries
from gpulens.shaping.findings_core import MS_PER_HOUR

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class RunningUsageOptions:
    batch: int = 500  # running executions a pass computes, those never sliced first


@dataclass
class RunningReport:
    computed: int = 0
    unchanged: int = 0  # finished meanwhile (their whole-life summary is stored): left alone
    failed: list[tuple[str, str]] = field(default_factory=list)


class RunningUsage:
    def __init__(
        self,
        stored: StoredSummaries,
        options: RunningUsageOptions | None = None,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.stored = stored  # its slots count this pass' summaries in GPULENS_MAX_CONCURRENT_SUMMARIES
        self.summaries = stored.summaries
        self.store = stored.store
        self.options = options or RunningUsageOptions()
        self.clock = clock

    async def run_pass(self) -> RunningReport:
        """Provisional slices for each running execution (one at a time, in a summary slot, at low
        priority); failures
        are logged and reported, and tried again next pass."""
        report = RunningReport()
        now_ms = datetime_to_ms(self.clock())
        with self.summaries.priority.low_priority():
            for execution, last_hour in await run_sync(self.store.running, self.options.batch):
                assert execution.start_time is not None  # the store's query asks for one
                start_ms = datetime_to_ms(execution.start_time)
                first_hour = start_ms - start_ms % MS_PER_HOUR
                from_hour = first_hour if last_hour is None else max(first_hour, last_hour)
                if now_ms <= max(start_ms, from_hour):
                    continue
                execution_id = execution.execution_id
                try:
                    async with self.stored.background_slot():
                        summary = await self.summaries.summary(
                            SYSTEM, execution_id, max(start_ms, from_hour), now_ms, slices=True
                        )
                except GpulensError as exc:
                    log.warning("the running usage of execution %s failed: %s", execution_id, exc.message)
                    report.failed.append((execution_id, exc.message))
                    continue
                written = await run_sync(
                    self.store.put_running, execution_id, execution.org, from_hour, summary.slices
                )
                if written:
                    report.computed += 1
                else:
                    report.unchanged += 1
        return report


async def running_usage_task(running: RunningUsage, *, interval_s: float) -> None:
    """A pass every `interval_s` (the first one `interval_s` after the start) until cancelled;
    `gpulens serve` runs it."""
    while True:
        await asyncio.sleep(interval_s)
        try:
            report = await running.run_pass()
        except Exception:
            log.exception("running usage pass failed")
        else:
            if report.computed or report.failed:
                log.info("running usage pass: %d computed, %d failed", report.computed, len(report.failed))
