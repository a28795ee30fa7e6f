"""The live alerts' evaluation pass (docs/alerts.md): its CPU over 200 running executions with rules.

Acceptance figure: "The evaluation pass over 200 running executions with rules costs under 1 s of CPU
per pass". On the lyceum section's clean bench data in Prometheus, a fresh SQLite registry holds 200
RUNNING executions of one org spread over the scenario's hosts (each its own set of GPUs, started
1-24 h before the data's end), one webhook channel (to a port nobody listens on: deliveries are not
run, hence not measured) and 4 rules. The services are built in-process as `serve` builds them
(build_context), and an Evaluator runs one warm-up pass (it opens the episodes and stores the first
events), then `PASSES` measured passes a minute apart, the last at the data's end: each reads new
tail windows, as a live pass does; the process has serve's collector and allocator settings
(gpulens.gctuning) meanwhile. Per pass: this process' CPU (`time.process_time()`: the event loop
and its worker threads, i.e. gpulens' evaluation), wall seconds, and Prometheus' CPU from
/proc/<pid>/stat.

The baseline is what a user would otherwise run: a script polling the same series by hand, i.e. for
each execution the hand-written PromQL (bench/handwritten.py) of the series the detectors read, over
its tail at the scrape interval, each answer parsed with orjson, 4 executions at a time. It is
printed as a ratio (live pass / hand-written reads), without a target: the pass also runs the
detectors and keeps the episodes, which the script would still have to write.
"""

from __future__ import annotations

import asyncio
import gc
import math
import socket
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import anyio
import httpx
import orjson

from bench.handwritten import HostData, lyceum_forms
from bench.measure import Figure, proc_cpu_seconds
from gpulens.api.app import build_context
from gpulens.config import Settings
from gpulens.domain import catalog as c
from gpulens.domain.alerts import AlertRule, Channel, ChannelType, StopAction, new_webhook_secret
from gpulens.domain.models import Execution, ExecutionStatus
from gpulens.domain.timeparse import datetime_to_ms
from gpulens.gctuning import tune_allocator, tune_gc
from gpulens.service.alerts.evaluate import Evaluator, PassReport
from gpulens.service.live_tails import LiveTails
from gpulens.service.running_usage import RunningUsage
from gpulens.service.wiring import eval_options, make_backend
from gpulens.shaping.insights import DETECTOR_KEYS
from gpulens.storage.alerts import AlertStore
from gpulens.storage.registry import Registry

NAME = "Alerts"
ORG = "bench-alerts"
EXECUTIONS = 200
PASSES = 5
BASELINE_ROUNDS = 2
HAND_CONCURRENCY = 4  # executions a polling script reads at once
TARGET_CPU_S = 1.0
MIN_MS = 60_000
HOUR_MS = 60 * MIN_MS
EARLIEST_H, LATEST_H = 24, 1  # executions start 1-24 h before the data's end


def bench_executions(
    hosts: Sequence[tuple[str, int]], end_s: int, count: int = EXECUTIONS
) -> list[Execution]:
    """`count` running executions of ORG over `hosts` ((hostname, GPU count)): execution k on host
    k % len(hosts), with its own set of that host's GPUs (the bits of the host's (k // len(hosts)) + 1-th
    non-empty subset: one to all of them, no two executions of a host alike, as in a fleet where
    every execution is its own target and its own layout look-up), started between EARLIEST_H and
    LATEST_H hours before `end_s` (evenly spread, the first the oldest)."""
    if not hosts:
        raise ValueError("no hosts")
    span_s = (EARLIEST_H - LATEST_H) * 3600
    out = []
    for k in range(count):
        hostname, gpus = hosts[k % len(hosts)]
        ago_s = EARLIEST_H * 3600 - (span_s * k // max(1, count - 1))
        start = datetime.fromtimestamp(end_s - ago_s, UTC)
        out.append(
            Execution(
                execution_id=f"bench-alerts-{k:03d}",
                org=ORG,
                hostname=hostname,
                gpus=_subset(k // len(hosts), gpus),
                status=ExecutionStatus.RUNNING,
                created_at=start,
                start_time=start,
                end_time=None,
                execution_type="bench",
            )
        )
    return out


def _subset(n: int, gpus: int) -> tuple[str, ...]:
    """The GPU indices of the (n % (2**gpus - 1)) + 1-th non-empty subset of `gpus` GPUs (as bits)."""
    if gpus <= 0:
        return ()
    mask = n % (2**gpus - 1) + 1
    return tuple(str(i) for i in range(gpus) if mask >> i & 1)


def bench_rules(channel_id: str, created_at: datetime) -> list[AlertRule]:
    """The org's 4 rules: idle_held 30m; idle 30m, stop after 2h; input_bound 1h; power_throttle 1h."""

    def rule(n: int, kind: str, for_ms: int, action: StopAction | None = None) -> AlertRule:
        return AlertRule(
            rule_id=f"rul_bench{n}",
            org=ORG,
            kind=kind,
            for_ms=for_ms,
            channels=(channel_id,),
            severity=c.INSIGHT_SEVERITY[kind],
            action=action,
            created_at=created_at,
        )

    return [
        rule(1, "idle_held", 30 * MIN_MS),
        rule(2, "idle", 30 * MIN_MS, StopAction(2 * HOUR_MS)),
        rule(3, "input_bound", HOUR_MS),
        rule(4, "power_throttle", HOUR_MS),
    ]


def tail_window(
    execution: Execution, rules: Sequence[AlertRule], end_ms: int, smoothing_ms: int
) -> tuple[int, int]:
    """The window a pass reads for `execution` (service/alerts/evaluate.py, Evaluator._execution):
    the longest `for` and the smoothing before `end_ms`, from its start."""
    assert execution.start_time is not None
    longest = max(r.for_ms for r in rules)
    return max(datetime_to_ms(execution.start_time), end_ms - longest - smoothing_ms), end_ms


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else math.nan


def unused_port() -> int:
    """A 127.0.0.1 port nobody listens on (the channel's: deliveries are not run)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass
class PassSample:
    cpu_s: float
    wall_s: float
    backend_cpu_s: float
    executions: int
    events: int
    errors: int


@dataclass
class AlertsResult:
    measured: bool = True
    why: str = ""
    registered: int = 0
    rules: int = 0
    hosts: int = 0
    warmup: PassSample | None = None
    passes: list[PassSample] = field(default_factory=list)
    # the baseline: hand-written PromQL of the same series and tails, one round = every execution once
    baseline: list[PassSample] = field(default_factory=list)
    # the fleet usage's pass over the same running executions (service/running_usage.py): the first
    # one (their whole runs so far), then one 15 minutes later (each from the hour before its last slice)
    usage_passes: list[PassSample] = field(default_factory=list)
    checks: list[str] = field(default_factory=list)

    @property
    def cpu_s(self) -> float:
        return median([p.cpu_s for p in self.passes])

    @property
    def wall_s(self) -> float:
        return median([p.wall_s for p in self.passes])

    @property
    def backend_cpu_s(self) -> float:
        return median([p.backend_cpu_s for p in self.passes])

    @property
    def baseline_cpu_s(self) -> float:
        return median([p.cpu_s for p in self.baseline])

    @property
    def baseline_wall_s(self) -> float:
        return median([p.wall_s for p in self.baseline])

    @property
    def ratio(self) -> float:
        """The live pass' CPU over the hand-written reads' (what the pass adds to reading the series)."""
        base = self.baseline_cpu_s
        return self.cpu_s / base if math.isfinite(base) and base > 0 else math.nan

    @property
    def executions(self) -> int:
        return min((p.executions for p in self.passes), default=0)

    def figures(self) -> list[Figure]:
        n = self.executions if self.passes else EXECUTIONS
        note = ""
        if self.passes:
            note = (
                f"wall {self.wall_s:.2f} s, Prometheus {self.backend_cpu_s:.2f} s CPU per pass; "
                f"{self.executions} executions, {len(self.passes)} passes"
            )
        return [
            Figure(
                f"{NAME}: the evaluation pass over {n} running executions with rules, CPU per pass",
                self.cpu_s if self.measured else None,
                TARGET_CPU_S,
                unit="s",
                note=note,
            ),
            Figure(
                f"{NAME}: the pass' CPU vs hand-written PromQL of the same series",
                self.ratio if self.measured else None,
                None,
                note=""
                if not self.baseline
                else f"hand-written: {self.baseline_cpu_s:.2f} s CPU, {self.baseline_wall_s:.2f} s wall",
            ),
        ]

    def lines(self) -> list[str]:
        if not self.measured:
            return [f"{NAME}: not measured ({self.why})"]
        out = []
        if self.warmup is not None:
            w = self.warmup
            out.append(
                f"{NAME}: warm-up pass {w.cpu_s:.2f} s CPU, {w.wall_s:.2f} s wall, "
                f"{w.executions} executions, {w.events} events"
            )
        out.append(
            f"{NAME}: {len(self.passes)} passes, median {self.cpu_s:.3f} s CPU, {self.wall_s:.3f} s wall, "
            f"Prometheus {self.backend_cpu_s:.3f} s CPU per pass; "
            f"{self.executions} executions, {sum(p.events for p in self.passes)} events"
        )
        for label, p in zip(("first", "15 min later"), self.usage_passes, strict=False):
            out.append(
                f"{NAME}: running usage pass ({label}) {p.cpu_s:.2f} s CPU, {p.wall_s:.2f} s wall, "
                f"Prometheus {p.backend_cpu_s:.2f} s CPU, {p.executions} executions sliced"
            )
        if self.baseline:
            out.append(
                f"{NAME}: hand-written PromQL of the same series {self.baseline_cpu_s:.3f} s CPU, "
                f"{self.baseline_wall_s:.3f} s wall, Prometheus "
                f"{median([p.backend_cpu_s for p in self.baseline]):.3f} s CPU per round; "
                f"live / hand-written {self.ratio:.2f}x"
            )
        return out

    def as_json(self) -> dict[str, object]:
        def sample(p: PassSample) -> dict[str, object]:
            return {
                "cpu_s": p.cpu_s,
                "wall_s": p.wall_s,
                "prometheus_cpu_s": p.backend_cpu_s,
                "executions": p.executions,
                "events": p.events,
                "errors": p.errors,
            }

        values = (self.cpu_s, self.wall_s, self.backend_cpu_s, self.ratio)
        cpu, wall, prom, ratio = (v if math.isfinite(v) else None for v in values)
        return {
            "case": NAME,
            "measured": self.measured,
            "why": self.why,
            "registered_executions": self.registered,
            "rules": self.rules,
            "hosts": self.hosts,
            "warmup": None if self.warmup is None else sample(self.warmup),
            "passes": [sample(p) for p in self.passes],
            "baseline_handwritten": [sample(p) for p in self.baseline],
            "running_usage_passes": [sample(p) for p in self.usage_passes],
            "cpu_per_pass_p50_s": cpu,
            "wall_per_pass_p50_s": wall,
            "prometheus_cpu_per_pass_p50_s": prom,
            "ratio_to_handwritten": ratio,
            "target_cpu_s": TARGET_CPU_S,
            "problems": self.checks,
        }


async def _measure(
    result: AlertsResult,
    prom_url: str,
    prom_pid: int,
    executions: list[Execution],
    end_s: int,
    scrape_interval_s: int,
    work: Path,
    progress: Callable[[str], None],
    passes: int,
    baseline_rounds: int,
    host_data: dict[str, HostData],
) -> None:
    now = datetime.fromtimestamp(end_s, UTC)
    database_url = f"sqlite:///{work / 'registry.db'}"
    registry = Registry.from_url(database_url)
    try:
        registry.migrate()
        registry.ensure_org(ORG, now=now - timedelta(days=2))
        for execution in executions:
            registry.upsert_execution(execution)
        store = AlertStore(registry)
        channel = store.add_channel(
            Channel(
                "chn_bench",
                ORG,
                ChannelType.WEBHOOK,
                f"http://127.0.0.1:{unused_port()}/hook",
                new_webhook_secret(),
                now,
            )
        )
        rules = [store.add_rule(r) for r in bench_rules(channel.channel_id, now)]
        result.registered, result.rules = len(executions), len(rules)
        settings = Settings(
            prometheus_url=prom_url,
            database_url=database_url,
            data_dir=work,
            scrape_interval=f"{scrape_interval_s}s",
            archive_interval=0,
            summary_interval=0,
            alerts_interval=0,
        )
        backend = make_backend(settings)
        try:
            # the passes a minute apart, the last at the data's end: each pass reads new windows
            # (its look-ups are not the previous pass' cache hits), as a live pass does
            at = [now - timedelta(minutes=passes - i) for i in range(passes + 1)]
            ctx = build_context(settings, registry, backend, clock=lambda: at[0])
            options = eval_options(settings)
            evaluator = Evaluator(
                ctx.alerts.store,
                registry,
                LiveTails(ctx.summaries.summaries),
                clock=lambda: at[0],
                options=options,
            )

            async def one_pass() -> PassSample:
                cpu0, wall0, prom0 = time.process_time(), time.perf_counter(), proc_cpu_seconds(prom_pid)
                report: PassReport = await evaluator.run_once()
                cpu1, wall1, prom1 = time.process_time(), time.perf_counter(), proc_cpu_seconds(prom_pid)
                if not report.held:
                    result.checks.append("the evaluator did not hold its lease")
                return PassSample(
                    cpu1 - cpu0, wall1 - wall0, prom1 - prom0, report.executions, report.events, report.errors
                )

            progress(f"{NAME}: warm-up pass over {len(executions)} running executions")
            result.warmup = await one_pass()
            for i in range(passes):
                progress(f"{NAME}: pass {i + 1} of {passes}")
                at.pop(0)
                result.passes.append(await one_pass())

            # the running usage's passes over the same executions (no target: what the feature costs)
            at[:] = [now - timedelta(minutes=15), now]
            running = RunningUsage(ctx.summaries, clock=lambda: at[0])
            for i in range(2):
                progress(f"{NAME}: running usage pass {i + 1} of 2")
                cpu0, wall0, prom0 = time.process_time(), time.perf_counter(), proc_cpu_seconds(prom_pid)
                usage = await running.run_pass()
                cpu1, wall1, prom1 = time.process_time(), time.perf_counter(), proc_cpu_seconds(prom_pid)
                result.usage_passes.append(
                    PassSample(
                        cpu1 - cpu0, wall1 - wall0, prom1 - prom0, usage.computed, 0, len(usage.failed)
                    )
                )
                if usage.failed:
                    result.checks.append(f"running usage: {len(usage.failed)} failed: {usage.failed[0]}")
                at.pop(0)

            end_ms = datetime_to_ms(now)
            step_ms = scrape_interval_s * 1000
            windows = {
                e.execution_id: tail_window(e, rules, end_ms, options.smoothing_ms) for e in executions
            }
            gate = asyncio.Semaphore(HAND_CONCURRENCY)

            forms = {
                e.execution_id: [
                    f.expr
                    for f in lyceum_forms(host_data[e.hostname or ""], e.gpus, step_ms, step_ms)
                    if f.key in DETECTOR_KEYS
                ]
                for e in executions
            }
            hand = httpx.AsyncClient(base_url=prom_url, timeout=60)

            async def by_hand(execution_id: str) -> None:
                start_ms, stop_ms = windows[execution_id]
                form = {
                    "start": f"{start_ms / 1000:.3f}",
                    "end": f"{stop_ms / 1000:.3f}",
                    "step": f"{step_ms}ms",
                }
                async with gate:
                    for expr in forms[execution_id]:
                        answer = await hand.post("/api/v1/query_range", data={**form, "query": expr})
                        answer.raise_for_status()
                        orjson.loads(answer.content)

            for i in range(baseline_rounds):
                progress(
                    f"{NAME}: hand-written PromQL of the same series, round {i + 1} of {baseline_rounds}"
                )
                cpu0, wall0, prom0 = time.process_time(), time.perf_counter(), proc_cpu_seconds(prom_pid)
                answers = await asyncio.gather(*(by_hand(k) for k in windows), return_exceptions=True)
                cpu1, wall1, prom1 = time.process_time(), time.perf_counter(), proc_cpu_seconds(prom_pid)
                failed = [a for a in answers if isinstance(a, BaseException)]
                if failed:
                    result.checks.append(f"{len(failed)} hand-written reads failed: {failed[0]!r}")
                result.baseline.append(
                    PassSample(
                        cpu1 - cpu0, wall1 - wall0, prom1 - prom0, len(answers) - len(failed), 0, len(failed)
                    )
                )
            await hand.aclose()
        finally:
            await backend.aclose()
    finally:
        registry.dispose()


def run_alerts(
    prom_url: str,
    prom_pid: int,
    hosts: Sequence[tuple[HostData, int]],
    end_s: int,
    scrape_interval_s: int,
    work: Path,
    progress: Callable[[str], None],
    passes: int = PASSES,
    baseline_rounds: int = BASELINE_ROUNDS,
) -> AlertsResult:
    """The section's measurement on a running Prometheus (`prom_url`, its pid for its CPU) over the
    bench data's `hosts` (what a person knows of each host's series, its GPU count) ending at `end_s`;
    the registry goes under `work`."""
    result = AlertsResult(hosts=len(hosts))
    # the collector and the allocator as `gpulens serve` sets them up (cli/serving.py): the pass is
    # measured as the server runs it (and the hand-written reads, in this process too, alike)
    old_thresholds = gc.get_threshold()
    tune_gc()
    tune_allocator()
    executions = bench_executions([(h.hostname, gpus) for h, gpus in hosts], end_s)
    anyio.run(
        _measure,
        result,
        prom_url,
        prom_pid,
        executions,
        end_s,
        scrape_interval_s,
        work,
        progress,
        passes,
        baseline_rounds,
        {h.hostname: h for h, _ in hosts},
    )
    gc.set_threshold(*old_thresholds)
    gc.unfreeze()
    for i, p in enumerate([*([result.warmup] if result.warmup else []), *result.passes]):
        if p.errors:
            result.checks.append(f"pass {i}: {p.errors} executions not evaluated")
        if p.executions != len(executions):
            result.checks.append(f"pass {i}: {p.executions} of {len(executions)} executions evaluated")
    return result
