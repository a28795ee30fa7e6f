"""The tails of many running executions read together, for live alerts (docs/alerts.md, "What a pass
costs").

Read one by one, a pass over hundreds of executions is thousands of small queries whose cost is the
round trip, not the work. Here, per host, each execution's expressions (exactly what the summary's
plans give it: the series the detectors read and, with two GPUs or more, each GPU's utilization and
FB %) are tagged and joined into a few queries (planning/unions.py), and the answers split back by
tag. The summary's detectors then run on each execution's series (`summary.live_result`), so the
findings are those `SummaryService.live_findings` gives.

An execution whose tail is irregular (its layout changes inside the window: a restart, a spelling
that changes) or too long for one query is read alone through `live_findings`: the batched path
covers the regular case and degrades to the plain one execution by execution.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from cachetools import LRUCache

from gpulens.backends.base import MetricsBackend
from gpulens.domain import catalog as c
from gpulens.domain.catalog import InsightThresholds
from gpulens.domain.errors import NotFound
from gpulens.domain.models import Execution, Principal, RangeQuery, Series, Window
from gpulens.planning.hosts import HostTarget, plan_host
from gpulens.planning.layout import HostLayout
from gpulens.planning.unions import TAG_LABEL, unions
from gpulens.service.summary import (
    DETECTOR_METRICS,
    FINDING_GPU_METRICS,
    GPU_LABELS,
    MAX_PER_GPU,
    LiveFindings,
    PerGpuSeries,
    SummaryService,
    live_result,
    per_gpu_series,
    points,
)
from gpulens.shaping.insights import Samples
from gpulens.shaping.merge import single


@dataclass(frozen=True, slots=True)
class TailRequest:
    execution: Execution
    start_ms: int
    end_ms: int
    thresholds: InsightThresholds = c.INSIGHT_THRESHOLDS
    kinds: frozenset[str] | None = None  # the finding kinds wanted (None: all)


@dataclass(slots=True)
class _Reads:
    """One execution's batched reads: its window, its host series' expressions (None: no source) and
    its per-GPU ones (on `gpu_window`; none when it has fewer than two GPUs)."""

    window: Window
    gpu_count: int
    host: list[str | None]
    gpu_window: Window | None = None
    gpu: list[list[str | None]] = field(default_factory=list)  # per GPU read, per metric


@dataclass(frozen=True, slots=True)
class _Answer:
    """One series of a tagged answer, and its finite samples inside the query's grid."""

    series: Series
    samples: Samples


@dataclass(frozen=True, slots=True)
class TailStats:
    """What a `findings` call did: executions read in batches, read alone, and the queries sent."""

    batched: int
    alone: int
    queries: int


class LiveTails:
    def __init__(self, summaries: SummaryService) -> None:
        self.summaries = summaries
        self.last = TailStats(0, 0, 0)
        self._plans: LRUCache[tuple[object, ...], list[str | None]] = LRUCache(maxsize=8192)

    async def findings(self, requests: Sequence[TailRequest]) -> list[LiveFindings | Exception]:
        """Each request's findings, or the error that kept it from being read (in request order)."""
        metrics = self.summaries.metrics
        out: list[LiveFindings | Exception | None] = [None] * len(requests)
        hosts: dict[tuple[int, str], tuple[MetricsBackend, list[int]]] = {}
        for i, request in enumerate(requests):
            execution = request.execution
            if execution.start_time is None or not execution.hostname:
                out[i] = NotFound("No metrics available for this execution yet")
                continue
            try:
                backend = await metrics.backend_for(execution)
            except Exception as exc:  # one execution's failure is its own
                out[i] = exc
                continue
            hosts.setdefault((id(backend), execution.hostname), (backend, []))[1].append(i)
        counts = await asyncio.gather(
            *(
                self._host(backend, [(i, requests[i]) for i in group], out)
                for backend, group in hosts.values()
            )
        )
        self.last = TailStats(sum(n[0] for n in counts), sum(n[1] for n in counts), sum(n[2] for n in counts))
        return [r if r is not None else RuntimeError("not read") for r in out]

    async def _host(
        self,
        backend: MetricsBackend,
        requests: Sequence[tuple[int, TailRequest]],
        out: list[LiveFindings | Exception | None],
    ) -> tuple[int, int, int]:
        """One host's requests: planned, read in tagged queries, split; (batched, alone, queries)."""
        planned = await asyncio.gather(
            *(self._plan(backend, request) for _, request in requests), return_exceptions=True
        )
        batched: list[tuple[int, TailRequest, _Reads]] = []
        alone: list[tuple[int, TailRequest]] = []
        for (i, request), reads in zip(requests, planned, strict=True):
            if isinstance(reads, BaseException):
                if not isinstance(reads, Exception):
                    raise reads
                out[i] = reads
            elif reads is None:
                alone.append((i, request))
            else:
                batched.append((i, request, reads))
        # each distinct (expression, grid) asked once; its answer goes to every (request, slot) using it
        asked: dict[tuple[str, Window], str] = {}
        users: dict[str, list[tuple[int, str]]] = {}
        for k, (_, _, reads) in enumerate(batched):
            slots = [(f"h{m}", e, reads.window) for m, e in enumerate(reads.host)]
            if reads.gpu_window is not None:
                slots += [(f"g{m}", e, reads.gpu_window) for exprs in reads.gpu for m, e in enumerate(exprs)]
            for slot, expr, grid in slots:
                if expr is not None:
                    tag = asked.setdefault((expr, grid), str(len(asked)))
                    users.setdefault(tag, []).append((k, slot))
        by_grid: dict[Window, list[tuple[str, str]]] = {}
        for (expr, grid), tag in asked.items():
            by_grid.setdefault(grid, []).append((tag, expr))
        queries = [(query, grid, tags) for grid, items in by_grid.items() for query, tags in unions(items)]
        answers = await asyncio.gather(
            *(backend.query_range(RangeQuery(q, grid)) for q, grid, _ in queries), return_exceptions=True
        )
        found: dict[int, dict[str, list[_Answer]]] = {k: {} for k in range(len(batched))}
        failed: dict[int, Exception] = {}
        for (_, grid, tags), answer in zip(queries, answers, strict=True):
            if isinstance(answer, BaseException):
                if not isinstance(answer, Exception):
                    raise answer
                for tag in tags:
                    for k, _ in users.get(tag, []):
                        failed.setdefault(k, answer)
                continue
            for one in answer:
                tag = one.labels.pop(TAG_LABEL, "")
                # parsed once for all its users: every user of a tag reads it on the tag's grid
                parsed = _Answer(one, points(one.samples, grid))
                for k, slot in users.get(tag, []):
                    found[k].setdefault(slot, []).append(parsed)
        for k, (i, request, reads) in enumerate(batched):
            out[i] = failed[k] if k in failed else self._result(request, reads, found[k])
        results = await asyncio.gather(*(self._alone(r) for _, r in alone), return_exceptions=True)
        for (i, _), result in zip(alone, results, strict=True):
            if isinstance(result, BaseException) and not isinstance(result, Exception):
                raise result
            out[i] = result
        return len(batched), len(alone), len(queries)

    async def _plan(self, backend: MetricsBackend, request: TailRequest) -> _Reads | None:
        """The execution's expressions over its tail, or None when it is to be read alone."""
        summaries = self.summaries
        metrics = summaries.metrics
        options = metrics.options
        execution = request.execution
        assert execution.hostname
        step = options.scrape_interval_ms
        window = metrics.effective_window(execution, request.start_ms, request.end_ms, step)
        if window.points > metrics.limits.max_points_per_query:
            return None
        instances: tuple[str, ...] = ()
        if options.node_match in ("auto", "nodename"):
            instances = await metrics.node_instances(backend, execution.hostname, window)
        target = HostTarget(execution.hostname, execution.gpus, instances)
        leaves = await metrics.layouts.leaves(backend, DETECTOR_METRICS, target, window, step)
        if len(leaves) != 1:
            return None
        host = self._exprs("host", target, step, leaves[0][1])
        count = await summaries.gpu_count(execution, window)
        reads = _Reads(window, count, host)
        if 2 <= count <= MAX_PER_GPU:
            grid = summaries.gpu_grid(window)
            if grid.points > metrics.limits.max_points_per_query:
                return None
            # each registered GPU's series asked on its own: what the grouped read gives for that GPU,
            # and the same expression for every execution holding it (the host's GPUs read once a pass)
            targets = [HostTarget(execution.hostname, (gpu,)) for gpu in dict.fromkeys(execution.gpus)]
            for alone in targets or [HostTarget(execution.hostname)]:
                leaves = await metrics.layouts.leaves(backend, FINDING_GPU_METRICS, alone, grid, grid.step_ms)
                if len(leaves) != 1:
                    return None
                reads.gpu.append(self._exprs("gpu", alone, grid.step_ms, leaves[0][1]))
            reads.gpu_window = grid
        return reads

    def _exprs(
        self,
        which: Literal["host", "gpu"],
        target: HostTarget,
        step_ms: int,
        layout: HostLayout,
    ) -> list[str | None]:
        """`plan_host`'s expressions of the host series the detectors read, or of each GPU's own
        (grouped by GPU), remembered: a target's layout rarely changes between passes."""
        key = (which, target, step_ms, layout)
        known = self._plans.get(key)
        if known is None:
            options = self.summaries.metrics.options
            metrics, group = (DETECTOR_METRICS, ()) if which == "host" else (FINDING_GPU_METRICS, GPU_LABELS)
            known = [p.expr for p in plan_host(metrics, target, step_ms, options, layout, group=group)]
            self._plans[key] = known
        return known

    def _result(self, request: TailRequest, reads: _Reads, found: dict[str, list[_Answer]]) -> LiveFindings:
        """The detectors on one execution's split answers."""
        window = reads.window

        def one_series(answers: Sequence[_Answer]) -> Samples:
            if len(answers) == 1:
                return answers[0].samples
            return points(single([a.series for a in answers]), window)  # none, or `or` split it

        series = {m.lyceum: one_series(found.get(f"h{k}", [])) for k, m in enumerate(DETECTOR_METRICS)}
        per_gpu: PerGpuSeries | None = None
        if reads.gpu_window is not None:
            joined: dict[tuple[str, str], dict[str, list[Samples]]] = {}
            for k, m in enumerate(FINDING_GPU_METRICS):
                for answer in found.get(f"g{k}", []):
                    # a GPU listed twice (by index and by UUID) answers twice: the first answer stands
                    joined.setdefault(_gpu_key(answer.series), {}).setdefault(m.lyceum, [answer.samples])
            per_gpu = per_gpu_series(request.execution, reads.gpu_window.step_ms, joined)
        return live_result(
            request.execution,
            window,
            window.step_ms,
            series,
            reads.gpu_count,
            per_gpu,
            request.thresholds,
            request.kinds,
        )

    async def _alone(self, request: TailRequest) -> LiveFindings:
        execution = request.execution
        principal = Principal(org=execution.org, subject="alerts", is_admin=True)
        return await self.summaries.live_findings(
            principal,
            execution.execution_id,
            request.start_ms,
            request.end_ms,
            request.thresholds,
            request.kinds,
        )


def _gpu_key(series: Series) -> tuple[str, str]:
    return (series.labels.get(c.LABEL_GPU, ""), series.labels.get(c.LABEL_UUID, ""))
