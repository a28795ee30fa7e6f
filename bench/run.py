"""`make bench`: gpulens' endpoints against the PromQL a person would write by hand, as ratios of one run.

Sections, one after the other, each with its own backend and gpulens server:

* `lyceum`: the execution metrics endpoint on 31 days of one 8-GPU host in Prometheus, against one
  hand-written query per series (bench/handwritten.py); the FB % query forms; throughput.
  Its cases (and lyceum-vm's and runai's) run on the clean data, then on the same data damaged as real
  data is (bench/damaged.py: exporter restarts, missed scrapes, NaN bursts); `--data` picks one.
* `lyceum-vm`: the same cases with gpulens and the hand-written queries on VictoriaMetrics.
* `archive`: a finished execution archived by `gpulens archive` (skipped while there is no such command).
* `runai`: the pod metrics endpoint (46 metricTypes, 24 h) against hand-written queries; throughput.
* `embedded`: the local agent (collector CPU, SampleStore ingest and size, embedded backend vs Prometheus).
* `load`: 64 clients for 60 s over a mix of routes (Lyceum metrics, summary and lists, Run:ai pod metrics
  and pods) on one server, then the same clients sending the metrics routes' hand-written PromQL straight
  to Prometheus; p50/p99 per route, errors, server RSS before and after (bench/mixload.py). Then the
  summary storm: another tenant's 30-minute read alone and while 16 summaries of a year-long running
  execution are asked at once (target <= 2x), and the server's peak RSS against its documented bound
  (bench/storm.py).
* `dashboard`: time to first drawn chart of the execution page in headless chromium, 24 h @ 15 s, against
  a plain HTTP fetch of the same metrics JSON (bench/dashboard.py).
* `alerts`: the live alerts' evaluation pass over 200 running executions with 4 rules, in-process on the
  lyceum data's Prometheus: CPU per pass (target <= 1 s), against hand-written PromQL of the same series
  (bench/alerts.py).
* `usage`: the fleet usage table's query over 10,000 stored executions (about 250,000 hourly slices) on
  SQLite and on a throwaway PostgreSQL (target <= 1 s), against fetching the window's slices and summing
  them in Python (bench/usage.py).

The lyceum section also times the summary of 30 days against the metrics read of the same window
(bench/summary.py; `--only 'Summary'`).

Every ratio is printed with its target and PASS/MISS at the end, and written to bench-data/results.json.
"""

from __future__ import annotations

import argparse
import atexit
import dataclasses
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from types import FrameType
from typing import Any, TypeVar

from rich.console import Console

from bench import alerts, archive, dashboard, embedded, mixload, report, storm, usage
from bench import summary as summary_cost
from bench.cases import (
    CASES,
    Case,
    CaseResult,
    api_path,
    fb_forms,
    replay_queries,
    run_case,
    run_fb_forms,
    served_plan,
    window_for,
)
from bench.clients import ApiClient, Baseline
from bench.damaged import CLEAN, DAMAGE, DAMAGED, DATA_SETS, NO_DAMAGE, restart_window, tolerance
from bench.data import K8S_HOURS, BenchData, prepare, prepare_damaged, prepare_k8s, prepare_k8s_damaged
from bench.handwritten import (
    HandForm,
    HostData,
    PodData,
    hand_chunks,
    lyceum_forms,
    pod_forms,
    pod_grid,
    rate_window_ms,
)
from bench.load import ThroughputResult, run_jobs, run_throughput
from bench.measure import Figure, proc_cpu_seconds
from bench.runai import (
    LLM_POD,
    LYCEUM_THROUGHPUT,
    RUNAI_CASES,
    RUNAI_THROUGHPUT,
    RegisteredPod,
    RunaiCase,
    RunaiCaseResult,
    ThroughputCase,
    lyceum_throughput_paths,
    plan_pod,
    register,
    run_runai_case,
    throughput_paths,
)
from bench.servers import Rss, proc_status_kib, reset_peak_rss, start_gpulens
from bench.vm import start_vm_data, vm_version
from gpulens.backends.promjson import prometheus_time
from gpulens.config import Settings
from gpulens.demo.scenario import Host, Scenario
from gpulens.domain import catalog as c
from gpulens.domain.models import Execution, ExecutionStatus, Window
from gpulens.domain.timeparse import ms_to_datetime
from gpulens.planning.pods import PodTarget
from gpulens.planning.promql import eq, rename, selector
from gpulens.service.discovery import DiscoveryReport
from gpulens.service.metrics import LOOKBACK_MS
from gpulens.storage.registry import Registry
from gpulens_testkit.damage import DamagePlan, history_plan
from gpulens_testkit.k8s_scenario import K8sScenario
from gpulens_testkit.promload import MissingBinary, ServerHandle, find_binary, start_prometheus

ROOT = Path(__file__).resolve().parent.parent
DATA_DIR = ROOT / "bench-data"
EXECUTION_ID = "bench-exec-1"
ORG = "bench"
FB_REPEATS = 9
RSS_TARGET_MIB = 150.0
SECTIONS = ("lyceum", "lyceum-vm", "archive", "runai", "embedded", "load", "dashboard", "alerts", "usage")
PROMETHEUS, VICTORIA = "Prometheus", "VictoriaMetrics"
T = TypeVar("T")


@dataclass
class Cleanup:
    """Stops what we started, newest first, exactly once (finally, atexit and SIGTERM all end here)."""

    steps: list[Callable[[], None]] = field(default_factory=list)

    def add(self, step: Callable[[], None]) -> None:
        self.steps.append(step)

    def run(self) -> None:
        while self.steps:
            step = self.steps.pop()
            try:
                step()
            except Exception as exc:  # keep stopping the rest
                print(f"cleanup: {exc}", file=sys.stderr)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    p.add_argument(
        "--rebuild", action="store_true", help="regenerate bench-data/ even if its manifest matches"
    )
    p.add_argument(
        "--section",
        action="append",
        choices=(*SECTIONS, "client"),
        default=None,
        help="run only this section (repeatable; default: all but `client`, the backend HTTP client's "
        "own bench, bench/client.py, run only when named)",
    )
    p.add_argument(
        "--only",
        action="append",
        default=None,
        help="run only cases whose name starts with this ('24 h', 'Run:ai', 'Archive', 'Lyceum throughput', "
        "'Summary', 'Load', 'Dashboard', 'Alerts')",
    )
    p.add_argument(
        "--data",
        action="append",
        choices=DATA_SETS,
        default=None,
        help="run the Lyceum and Run:ai cases on this data only (repeatable; default: clean, then damaged)",
    )
    p.add_argument(
        "--repeat-scale",
        type=float,
        default=1.0,
        help="multiply every case's rounds (default rounds give medians of >= 7; lower only to try things)",
    )
    p.add_argument("--no-forms", action="store_true", help="skip the FB %% query-form table")
    p.add_argument("--no-throughput", action="store_true", help="skip the throughput measurements")
    p.add_argument(
        "--no-overhead",
        action="store_true",
        help="skip the secondary 'service overhead' figure (gpulens' own plan replayed to the backend)",
    )
    p.add_argument(
        "--throughput-seconds", type=float, default=None, help="measured seconds of each throughput run"
    )
    p.add_argument(
        "--load-seconds",
        type=float,
        default=mixload.DURATION_S,
        help="measured seconds of the load section's mix and of its baseline (default %(default)s)",
    )
    p.add_argument(
        "--load-clients",
        type=int,
        default=mixload.CLIENTS,
        help="concurrent clients of the load section (default %(default)s)",
    )
    p.add_argument(
        "--dashboard-rounds", type=int, default=dashboard.ROUNDS, help="rounds of each dashboard page"
    )
    p.add_argument("--strict", action="store_true", help="exit 1 when a target is missed")
    return p


def _node_instances(prom_url: str, settings: Settings, hostname: str, window: Window) -> tuple[str, ...]:
    """What MetricsService.node_instances asks: node_uname_info{nodename=<host>} -> instance."""
    if settings.node_match not in ("auto", "nodename"):
        return ()
    match = selector(rename(c.NODE_UNAME_INFO, settings.metric_names), [eq(c.LABEL_NODENAME, hostname)])
    query = urllib.parse.urlencode(
        {
            "match[]": match,
            "start": prometheus_time(window.start_ms - LOOKBACK_MS),
            "end": prometheus_time(window.end_ms),
        }
    )
    with urllib.request.urlopen(f"{prom_url}/api/v1/series?{query}", timeout=30) as resp:
        data = json.loads(resp.read())["data"]
    return tuple(sorted({s[c.LABEL_INSTANCE] for s in data if c.LABEL_INSTANCE in s}))


def _version(binary: str, flag: str) -> str:
    try:
        out = subprocess.run([find_binary(binary), flag], capture_output=True, text=True, check=False)
    except (MissingBinary, OSError):
        return "?"
    first = (out.stdout or out.stderr).splitlines()
    return first[0].split(" (")[0] if first else "?"


@dataclass
class Selection:
    """What this run measures, from --section, --only and the --no-* flags."""

    lyceum_cases: list[Case]
    vm_cases: list[Case]
    archive: bool
    forms: bool
    lyceum_load: bool
    runai_cases: list[RunaiCase]
    runai_load: bool
    embedded: bool = False
    summary: bool = False  # the 30-day summary against the metrics read (lyceum section)
    load: bool = False
    dashboard: bool = False
    data: tuple[str, ...] = DATA_SETS  # the cases run on each of these (bench/damaged.py)
    alerts: bool = False  # the live alerts' evaluation pass (bench/alerts.py)
    usage: bool = False  # the fleet usage table over 10,000 stored executions (bench/usage.py)

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> Selection:
        sections = args.section or list(SECTIONS)

        def wanted(section: str, name: str) -> bool:
            if section not in sections:
                return False
            return not args.only or any(name.startswith(prefix) for prefix in args.only)

        data = tuple(d for d in DATA_SETS if d in (args.data or DATA_SETS))
        cases = [k for k in CASES if wanted("lyceum", k.name)]
        # the throughput, the FB % forms and the summary cost are measured on the clean data only
        lyceum_load = CLEAN in data and not args.no_throughput and wanted("lyceum", LYCEUM_THROUGHPUT.name)
        # the FB % forms go with the Lyceum section whenever it runs at all (as before --section)
        forms = (
            CLEAN in data
            and not args.no_forms
            and "lyceum" in sections
            and (not args.only or bool(cases) or lyceum_load)
        )
        return cls(
            cases,
            [k for k in CASES if wanted("lyceum-vm", k.name)],
            wanted("archive", "Archive"),
            forms,
            lyceum_load,
            [k for k in RUNAI_CASES if wanted("runai", k.name)],
            CLEAN in data and not args.no_throughput and wanted("runai", RUNAI_THROUGHPUT.name),
            wanted("embedded", embedded.NAME),
            CLEAN in data and wanted("lyceum", summary_cost.NAME),
            wanted("load", mixload.NAME),
            wanted("dashboard", dashboard.NAME),
            data,
            alerts=wanted("alerts", alerts.NAME),
            usage=wanted("usage", usage.NAME),
        )

    def cases_on(self, cases: list[T], data: str) -> list[T]:
        """`cases` when they run on `data`, else none."""
        return cases if data in self.data else []

    @property
    def lyceum(self) -> bool:
        """The clean data's Lyceum section (the damaged data's: `cases_on(lyceum_cases, DAMAGED)`)."""
        clean = bool(self.cases_on(self.lyceum_cases, CLEAN))
        return clean or self.forms or self.lyceum_load or self.summary

    @property
    def runai(self) -> bool:
        return bool(self.cases_on(self.runai_cases, CLEAN)) or self.runai_load

    @property
    def anything(self) -> bool:
        return (
            self.lyceum
            or bool(self.vm_cases)
            or bool(self.cases_on(self.lyceum_cases, DAMAGED))
            or bool(self.cases_on(self.runai_cases, DAMAGED))
            or self.archive
            or self.runai
            or self.embedded
            or self.load
            or self.dashboard
            or self.alerts
            or self.usage
        )


def _load_case(case: ThroughputCase, args: argparse.Namespace) -> ThroughputCase:
    if args.throughput_seconds is None:
        return case
    return dataclasses.replace(case, duration_s=float(args.throughput_seconds))


def _rounds(case_repeats: int, args: argparse.Namespace) -> int:
    return max(1, round(case_repeats * float(args.repeat_scale)))


@dataclass
class Stack:
    """A section's servers and clients, all stopped by the section's `cleanup`."""

    backend: ServerHandle  # Prometheus or VictoriaMetrics
    backend_name: str
    server: ServerHandle  # gpulens serve
    settings: Settings  # what the server runs with: the replayed plan uses the same
    api: ApiClient  # the server, with the section's API key
    baseline: Baseline  # the backend, as many threads as the server's query concurrency

    @property
    def pids(self) -> dict[str, int]:
        return {"gpulens": self.server.process.pid, self.backend_name: self.backend.process.pid}

    def server_cpu(self) -> float:
        return proc_cpu_seconds(self.server.process.pid)


def _start_stack(
    backend: ServerHandle,
    backend_name: str,
    prefix: str,
    cleanup: Cleanup,
    register: Callable[[str, str, Path], tuple[str, T]],
) -> tuple[Stack, T]:
    """A temp dir (`prefix`) with the registry and the gpulens server on `backend` (already started).

    `register(backend_url, database_url, work_dir)` fills the registry before the server starts; it
    returns the org's API key and what else the section wants back (returned with the stack).
    """
    work = Path(tempfile.mkdtemp(prefix=prefix))
    cleanup.add(lambda: shutil.rmtree(work, ignore_errors=True))
    database_url = f"sqlite:///{work / 'registry.db'}"
    key, registered = register(backend.url, database_url, work)
    server = start_gpulens(backend.url, database_url, work, work / "gpulens.log")
    cleanup.add(server.stop)
    settings = Settings(prometheus_url=backend.url, database_url=database_url, data_dir=work)
    api = ApiClient("127.0.0.1", server.port, key)
    cleanup.add(api.close)
    baseline = Baseline("127.0.0.1", backend.port, threads=settings.query_concurrency)
    cleanup.add(baseline.close)
    return Stack(backend, backend_name, server, settings, api, baseline), registered


def _start_prometheus(
    data_dir: Path, cleanup: Cleanup, err: Console, k8s: bool = False, damaged: bool = False
) -> tuple[Any, ServerHandle]:
    """Prometheus over the bench data: Lyceum's or the k8s scenario's (`k8s`), clean or damaged
    (`damaged`: under `data_dir`/damaged/, bench/damaged.py)."""
    data: BenchData[Any]
    if damaged:
        root = data_dir / "damaged"
        if k8s:
            data = prepare_k8s_damaged(root / "k8s", DAMAGE, log=err.print)
        else:
            data = prepare_damaged(root, DAMAGE, log=err.print)
    else:
        data = prepare_k8s(data_dir / "k8s", log=err.print) if k8s else prepare(data_dir, log=err.print)
    prom = start_prometheus(
        data.tsdb, block_s=data.block_s, scrape_interval_s=data.scenario.scrape_interval_s
    )
    cleanup.add(prom.stop)
    return data, prom


def _print_ratio(err: Console, name: str, api_p50: float, base_p50: float, ratio: float, t0: float) -> None:
    err.print(
        f"{name}: API p50 {api_p50:.3f} s, hand-written p50 {base_p50:.3f} s, "
        f"ratio {ratio:.2f} ({time.monotonic() - t0:.0f} s)"
    )


def _throughput(
    stack: Stack,
    case: ThroughputCase,
    endpoint: str,
    paths: list[str],
    err: Console,
    progress: Callable[[str], None],
) -> ThroughputResult:
    """`case`'s clients on the server's `paths` (`endpoint`: what one request asks, in words)."""
    load = ThroughputResult(case.name, endpoint, case.clients, case.warmup_s, case.duration_s, 0)
    run_throughput(load, "127.0.0.1", stack.server.port, stack.api.headers, paths, stack.pids, progress)
    err.print(f"{case.name}: {load.rps:.1f} requests/s, p50 {load.p50:.3f} s, {load.errors} errors")
    return load


def _register_executions(database_url: str, executions: list[Execution]) -> str:
    """A fresh registry holding `executions`; an org key."""
    registry = Registry.from_url(database_url)
    try:
        registry.migrate()
        _, key = registry.create_key(ORG, name="bench")
        for execution in executions:
            registry.upsert_execution(execution)
    finally:
        registry.dispose()
    return key


def _register_finished(
    database_url: str, scenario: Scenario, execution_id: str, start_ms: int, end_ms: int
) -> None:
    """A finished execution of the whole bench host over [start_ms, end_ms], registered while the server
    runs (so that no background pass computes its summary before the stored-summary case asks)."""
    start, end = ms_to_datetime(start_ms), ms_to_datetime(end_ms)
    finished = replace(
        _running_execution(scenario),
        execution_id=execution_id,
        status=ExecutionStatus.COMPLETED,
        created_at=start,
        start_time=start,
        end_time=end,
    )
    registry = Registry.from_url(database_url)
    try:
        registry.upsert_execution(finished)
    finally:
        registry.dispose()


def _running_execution(scenario: Scenario) -> Execution:
    """The bench execution: the whole host, still running (never an archived read), started with the data."""
    return Execution(
        execution_id=EXECUTION_ID,
        org=ORG,
        hostname=scenario.hosts[0].hostname,
        gpus=(),
        status=ExecutionStatus.RUNNING,
        created_at=scenario.start,
        start_time=scenario.start,
        end_time=None,
        execution_type="bench",
    )


def _host_data(host: Host) -> HostData:
    """What the person writing the queries knows about the bench host's series."""
    return HostData(host.hostname, host.host_label, host.power_limit_series, host.pcie_kbps)


def _check_clock(scenario: Scenario, err: Console) -> list[str]:
    """A running execution's window ends at now: the data's end must lie in the past."""
    if time.time() >= scenario.end_s:
        return []
    line = (
        "the machine's clock is before the bench data's end: gpulens clamps the running execution's windows"
    )
    err.print(f"[red]{line}[/red]")
    return [line]


def _lyceum_cases(
    stack: Stack,
    cases: list[Case],
    scenario: Scenario,
    args: argparse.Namespace,
    err: Console,
    progress: Callable[[str], None],
    *,
    overhead: bool,
    measure_rss: bool,
    data: str = CLEAN,
    damage: DamagePlan | None = None,
) -> list[CaseResult]:
    """`cases` of the running bench execution on the stack's backend, against the hand-written queries;
    `data` the data set's name, `damage` where its damage is (the checks skip the points where the
    hand-written forms are known wrong there)."""
    host = scenario.hosts[0]
    scrape_ms = scenario.scrape_interval_s * 1000
    # the "over a restart" window: around a restart of the damaged data, the same times on the clean
    where = damage or history_plan(scenario, DAMAGE)
    # the clean data's only known-wrong points: the CPU rate window where its counters begin
    zones_of = damage or history_plan(scenario, NO_DAMAGE)
    clock_problems = _check_clock(scenario, err)
    instances: tuple[str, ...] = ()
    if overhead and any(k.overhead for k in cases):
        whole = Window(scenario.start_s * 1000, scenario.end_s * 1000, 15_000)
        instances = _node_instances(stack.backend.url, stack.settings, host.hostname, whole)
    pid = stack.server.process.pid
    results = []
    for case in cases:
        around = None
        if case.anchor == "restart":
            around = restart_window(where, host.hostname, case.span_s, case.step_s, scenario.end_s)
        window = window_for(case, scenario.start_s, scenario.end_s, around)
        forms = lyceum_forms(_host_data(host), (), window.step_ms, scrape_ms)
        n_chunks = len(hand_chunks(window))
        result = CaseResult(case, stack.backend_name, window, n_chunks, len(forms) * n_chunks, data=data)
        result.checks.extend(clock_problems)
        known_wrong = tolerance(zones_of, host.hostname, forms, rate_window_ms(window.step_ms, scrape_ms))
        replay = None
        if overhead and case.overhead:
            plan = served_plan(stack.settings, stack.backend.url, host.hostname, instances, window)
            replay = replay_queries(plan, window)
        rss = measure_rss and case.measure_rss
        t0 = time.monotonic()
        run_case(
            result,
            stack.api,
            stack.baseline,
            stack.backend.url,
            stack.backend.process.pid,
            api_path(EXECUTION_ID, window),
            forms,
            progress,
            repeats=_rounds(case.repeats, args),
            replay=replay,
            server_cpu=stack.server_cpu,
            rss=(lambda k: proc_status_kib(pid, k)) if rss else None,
            reset_peak=(lambda: reset_peak_rss(pid)) if rss else None,
            tolerance=known_wrong,
            strict=damage is None,
        )
        results.append(result)
        _print_ratio(err, result.name, result.api_p50, result.base_p50, result.ratio, t0)
        for problem in result.checks:
            err.print(f"[red]{result.name}: {problem}[/red]")
    return results


def _lyceum_section(
    args: argparse.Namespace,
    select: Selection,
    cleanup: Cleanup,
    err: Console,
    progress: Callable[[str], None],
) -> dict[str, Any]:
    """The execution metrics endpoint on Prometheus (cases, throughput) and the FB % forms."""
    data, prom = _start_prometheus(DATA_DIR, cleanup, err)
    scenario = data.scenario
    host = scenario.hosts[0]
    err.print(
        f"Lyceum data: {scenario.start:%Y-%m-%d %H:%M} .. {scenario.end:%Y-%m-%d %H:%M} UTC, "
        f"host {host.hostname}, {len(host.gpus)} GPUs, "
        + ("reused" if data.reused else f"built in {data.seconds:.0f} s")
    )
    stack, _ = _start_stack(
        prom,
        PROMETHEUS,
        "gpulens-bench-",
        cleanup,
        lambda _url, db, _work: (_register_executions(db, [_running_execution(scenario)]), None),
    )
    results = _lyceum_cases(
        stack,
        select.cases_on(select.lyceum_cases, CLEAN),
        scenario,
        args,
        err,
        progress,
        overhead=not args.no_overhead,
        measure_rss=True,
    )

    load: ThroughputResult | None = None
    if select.lyceum_load:
        load_case = _load_case(LYCEUM_THROUGHPUT, args)
        load = _throughput(
            stack,
            load_case,
            f"execution metrics, {load_case.window_s // 60} min @ {load_case.step_s} s (12 series)",
            lyceum_throughput_paths(load_case, EXECUTION_ID, scenario.end_s),
            err,
            progress,
        )

    cost: summary_cost.SummaryCostResult | None = None
    if select.summary:
        t0 = time.monotonic()
        cost = summary_cost.run_summary_cost(
            stack.api, EXECUTION_ID, scenario.end_s, progress, _rounds(summary_cost.REPEATS, args)
        )
        err.print(
            f"{summary_cost.NAME}: summary p50 {cost.api_p50:.3f} s, metrics read of the same window "
            f"p50 {cost.base_p50:.3f} s, ratio {cost.ratio:.2f} ({time.monotonic() - t0:.0f} s)"
        )
        t0 = time.monotonic()
        cost.stored = stored = summary_cost.run_stored_summary(
            stack.api,
            partial(_register_finished, stack.settings.resolved_database_url, scenario),
            scenario.end_s,
            progress,
            _rounds(summary_cost.REPEATS, args),
        )
        err.print(
            f"{summary_cost.NAME}: stored summary p50 {stored.api_p50:.4f} s, computing it p50 "
            f"{stored.base_p50:.3f} s, ratio {stored.ratio:.3f} ({time.monotonic() - t0:.0f} s)"
        )
        for problem in cost.checks + stored.checks:
            err.print(f"[red]{summary_cost.NAME}: {problem}[/red]")

    forms = []
    if select.forms:
        step_ms = 15_000
        whole = Window(scenario.start_s * 1000, scenario.end_s * 1000, step_ms)
        instances = _node_instances(prom.url, stack.settings, host.hostname, whole)
        fb_window = Window(scenario.end_s * 1000 - 86_400_000, scenario.end_s * 1000, step_ms)
        forms = run_fb_forms(
            fb_forms(stack.settings, host.hostname, instances, step_ms),
            fb_window,
            stack.baseline,
            _rounds(FB_REPEATS, args),
            progress,
        )

    rss_kib = proc_status_kib(stack.server.process.pid, "VmRSS")
    cleanup.run()  # this section's servers stop before the next one starts
    return {
        "cases": results,
        "forms": forms,
        "load": load,
        "summary": cost,
        "env": {
            "host": host.hostname,
            "gpus": len(host.gpus),
            "data": {"start_s": scenario.start_s, "end_s": scenario.end_s, "reused": data.reused},
            "baseline_threads": stack.settings.query_concurrency,
            "server_rss_end_kib": rss_kib,
        },
    }


def _lyceum_damaged_section(
    args: argparse.Namespace,
    select: Selection,
    cleanup: Cleanup,
    err: Console,
    progress: Callable[[str], None],
) -> dict[str, Any]:
    """The Lyceum cases on Prometheus over the damaged data (bench/damaged.py)."""
    data, prom = _start_prometheus(DATA_DIR, cleanup, err, damaged=True)
    scenario = data.scenario
    assert data.damage is not None
    err.print(
        f"damaged Lyceum data: {len(data.damage.restarts)} dcgm-exporter restarts, "
        f"{sum(map(len, data.damage.missed.values()))} missed scrapes, {len(data.damage.bursts)} NaN bursts, "
        + ("reused" if data.reused else f"built in {data.seconds:.0f} s")
    )
    stack, _ = _start_stack(
        prom,
        PROMETHEUS,
        "gpulens-bench-damaged-",
        cleanup,
        lambda _url, db, _work: (_register_executions(db, [_running_execution(scenario)]), None),
    )
    results = _lyceum_cases(
        stack,
        select.cases_on(select.lyceum_cases, DAMAGED),
        scenario,
        args,
        err,
        progress,
        overhead=not args.no_overhead,
        measure_rss=True,
        data=DAMAGED,
        damage=data.damage,
    )
    cleanup.run()
    damage = data.damage
    return {
        "cases": results,
        "env": {
            "damage": DAMAGE.as_json(),
            "restarts": len(damage.restarts),
            "missed_scrapes": sum(map(len, damage.missed.values())),
            "nan_bursts": len(damage.bursts),
            "reused": data.reused,
            "built_s": data.seconds,
        },
    }


def _vm_section(
    args: argparse.Namespace,
    select: Selection,
    cleanup: Cleanup,
    err: Console,
    progress: Callable[[str], None],
) -> dict[str, Any]:
    """The same Lyceum cases with gpulens and the hand-written queries on VictoriaMetrics, on each
    selected data set (clean, damaged) in turn."""
    data = prepare(DATA_DIR, log=lambda _: None)  # only for its scenario (and the shared manifest fields)
    scenario = data.scenario
    results: list[CaseResult] = []
    env: dict[str, Any] = {}
    for which in select.data:
        cases = select.cases_on(select.vm_cases, which)
        if not cases:
            continue
        damage = history_plan(scenario, DAMAGE) if which == DAMAGED else None
        progress(f"starting VictoriaMetrics ({which} data)")
        root = DATA_DIR / "vm" if damage is None else DATA_DIR / "damaged" / "vm"
        vm = start_vm_data(root, scenario, log=err.print, damage=None if damage is None else DAMAGE)
        cleanup.add(vm.handle.stop)
        version = vm_version(vm.handle.url)
        err.print(
            f"VictoriaMetrics {version}, {which} data: "
            + ("reused" if vm.reused else f"imported in {vm.seconds:.0f} s")
        )
        stack, _ = _start_stack(
            vm.handle,
            VICTORIA,
            f"gpulens-bench-vm-{which}-",
            cleanup,
            lambda _url, db, _work: (_register_executions(db, [_running_execution(scenario)]), None),
        )
        results += _lyceum_cases(
            stack,
            cases,
            scenario,
            args,
            err,
            progress,
            overhead=False,
            measure_rss=False,
            data=which,
            damage=damage,
        )
        cleanup.run()
        env["version"] = version
        env[which] = {"imported_s": vm.seconds, "reused": vm.reused}
    return {"cases": results, "env": env}


def _archive_section(
    args: argparse.Namespace, cleanup: Cleanup, err: Console, progress: Callable[[str], None]
) -> archive.ArchiveResult:
    """A finished execution archived by `gpulens archive`, when this gpulens has the command."""
    progress("checking for `gpulens archive`")
    ok, why = archive.available()
    result = archive.ArchiveResult(ok, why)
    if not ok:
        err.print(f"Archive: not available ({why}); its figures read n/a")
        return result
    data, prom = _start_prometheus(DATA_DIR, cleanup, err)
    scenario = data.scenario
    host = scenario.hosts[0]
    window = archive.execution_window(scenario.end_s)
    result.execution = window
    finished = Execution(
        execution_id=archive.ARCHIVED_ID,
        org=ORG,
        hostname=host.hostname,
        gpus=archive.GPUS,
        status=ExecutionStatus.COMPLETED,
        created_at=ms_to_datetime(window.start_ms),
        start_time=ms_to_datetime(window.start_ms),
        end_time=ms_to_datetime(window.end_ms),
        execution_type="bench",
        return_code=0,
    )

    def register_and_archive(url: str, database_url: str, work: Path) -> tuple[str, None]:
        key = _register_executions(database_url, [finished])
        progress(f"gpulens archive {archive.ARCHIVED_ID}")
        archive.archive_execution(result, url, database_url, work)
        return key, None

    stack, _ = _start_stack(prom, PROMETHEUS, "gpulens-bench-archive-", cleanup, register_and_archive)
    if result.checks:  # archiving failed: nothing to read
        err.print(f"[red]Archive: {result.checks[0]}[/red]")
    else:
        archive.run_archive(
            result,
            stack.api,
            stack.baseline,
            _host_data(host),
            scenario.scrape_interval_s * 1000,
            progress,
            _rounds(archive.REPEATS, args),
        )
        for problem in result.checks:
            err.print(f"[red]Archive: {problem}[/red]")
    cleanup.run()
    return result


def _alerts_section(cleanup: Cleanup, err: Console, progress: Callable[[str], None]) -> alerts.AlertsResult:
    """The live alerts' evaluation pass, in-process, on the clean Lyceum data in Prometheus."""
    data, prom = _start_prometheus(DATA_DIR, cleanup, err)
    scenario = data.scenario
    work = Path(tempfile.mkdtemp(prefix="gpulens-bench-alerts-"))
    cleanup.add(lambda: shutil.rmtree(work, ignore_errors=True))
    result = alerts.run_alerts(
        prom.url,
        prom.process.pid,
        [(_host_data(h), len(h.gpus)) for h in scenario.hosts],
        scenario.end_s,
        scenario.scrape_interval_s,
        work,
        progress,
    )
    cleanup.run()
    for line in result.lines():
        err.print(line)
    for problem in result.checks:
        err.print(f"[red]{alerts.NAME}: {problem}[/red]")
    return result


def _runai_section(
    args: argparse.Namespace,
    select: Selection,
    cleanup: Cleanup,
    err: Console,
    progress: Callable[[str], None],
    which: str = CLEAN,
) -> dict[str, Any]:
    """The pod metrics endpoint on the `which` k8s data: the vLLM pod over 24 h (every metricType; the
    overview's six), then throughput (clean data only)."""
    data, prom = _start_prometheus(DATA_DIR, cleanup, err, k8s=True, damaged=which == DAMAGED)
    scenario: K8sScenario = data.scenario
    damage: DamagePlan | None = data.damage
    err.print(
        f"k8s data ({which}): {scenario.start:%Y-%m-%d %H:%M} .. {scenario.end:%Y-%m-%d %H:%M} UTC, "
        f"{len(scenario.nodes)} nodes, {len(scenario.pods)} pods, "
        + ("" if damage is None else f"{len(damage.restarts)} dcgm-exporter restarts, ")
        + ("reused" if data.reused else f"built in {data.seconds:.0f} s")
    )

    def discover(
        prom_url: str, database_url: str, _work: Path
    ) -> tuple[str, tuple[dict[str, RegisteredPod], DiscoveryReport]]:
        progress("discovering the pods from kube-state-metrics")
        key, pods, found = register(prom_url, database_url, ORG, scenario)
        err.print(found.summary())
        return key, (pods, found)

    stack, (pods, found) = _start_stack(prom, PROMETHEUS, f"gpulens-bench-runai-{which}-", cleanup, discover)
    settings = stack.settings

    results: list[RunaiCaseResult] = []
    for case in select.cases_on(select.runai_cases, which):
        metrics = case.metrics()
        types = [m.type for m in metrics]
        pod = pods[LLM_POD]
        node = scenario.node(pod.spec.node)
        end_ms = scenario.end_s * 1000
        start_ms = end_ms - case.span_s * 1000
        grid = pod_grid(start_ms, end_ms, case.samples)
        who = PodData(pod.spec.namespace, pod.spec.name)
        if node.honor_labels:  # dcgm-exporter's pod labels kept as they are
            who = PodData(pod.spec.namespace, pod.spec.name, c.LABEL_NAMESPACE, c.LABEL_POD)
        forms = [f for f in pod_forms(who, grid, scenario.scrape_interval_s * 1000) if f.key in types]
        plan = None
        if not args.no_overhead:
            progress(f"{case.name}: planning gpulens' own queries (service-overhead figure)")
            plan = plan_pod(
                settings,
                prom.url,
                PodTarget.one(pod.spec.namespace, pod.spec.name),
                metrics,
                start_ms,
                end_ms,
                case.samples,
            )
        path = pod.metrics_path(types, start_ms, end_ms, case.samples)
        pod_name = f"{pod.spec.namespace}/{pod.spec.name}"
        result = RunaiCaseResult(case, pod_name, grid, forms, plan, data=which)
        known_wrong = None
        if damage is not None:
            slots = [slot.key for slot in pod.spec.slots]
            window_ms = rate_window_ms(grid.step_ms, scenario.scrape_interval_s * 1000)
            known_wrong = tolerance(damage, node.hostname, forms, window_ms, slots)
        t0 = time.monotonic()
        run_runai_case(
            result,
            stack.api,
            stack.baseline,
            prom.url,
            prom.process.pid,
            path,
            progress,
            _rounds(case.repeats, args),
            stack.server_cpu,
            known_wrong,
        )
        results.append(result)
        _print_ratio(err, result.name, result.api_p50, result.base_p50, result.ratio, t0)
        for problem in result.checks:
            err.print(f"[red]{result.name}: {problem}[/red]")

    load: ThroughputResult | None = None
    if select.runai_load and which == CLEAN:
        case_b = _load_case(RUNAI_THROUGHPUT, args)
        load = _throughput(
            stack,
            case_b,
            f"pod metrics, {case_b.window_s // 60} min, {case_b.samples} samples, 4-5 types, 7 pods",
            throughput_paths(case_b, scenario, pods),
            err,
            progress,
        )

    rss_kib = proc_status_kib(stack.server.process.pid, "VmRSS")
    cleanup.run()
    return {
        "cases": results,
        "load": load,
        "env": {
            "scenario": f"{scenario.name}, seed {scenario.seed}, {K8S_HOURS} h",
            "data": {"start_s": scenario.start_s, "end_s": scenario.end_s, "reused": data.reused},
            "built_s": data.seconds,
            "pods": len(pods),
            "discovery": found.summary(),
            "baseline_threads": settings.query_concurrency,
            "server_rss_end_kib": rss_kib,
        },
    }


def _history(scenario: Scenario, count: int = 40) -> list[Execution]:
    """Completed executions on the bench host, one every 6 hours before the data's end (list routes)."""
    host = scenario.hosts[0].hostname
    out = []
    for i in range(count):
        end_ms = (scenario.end_s - i * 6 * 3600) * 1000
        start = ms_to_datetime(end_ms - 3 * 3600 * 1000)
        out.append(
            Execution(
                execution_id=f"bench-history-{i}",
                org=ORG,
                hostname=host,
                gpus=(str(i % 8),),
                status=ExecutionStatus.COMPLETED,
                created_at=start,
                start_time=start,
                end_time=ms_to_datetime(end_ms),
                execution_type="bench",
                return_code=0,
            )
        )
    return out


def _server_counters(url: str) -> dict[str, float]:
    with urllib.request.urlopen(f"{url}/metrics", timeout=30) as resp:
        return mixload.server_counters(resp.read().decode())


def _load_section(
    args: argparse.Namespace, cleanup: Cleanup, err: Console, progress: Callable[[str], None]
) -> mixload.LoadResult:
    """The load mix on one server over the Lyceum and k8s data in one Prometheus, then its baseline."""
    lyceum = prepare(DATA_DIR, log=err.print)
    k8s = prepare_k8s(DATA_DIR / "k8s", log=err.print)
    scrape_s = lyceum.scenario.scrape_interval_s
    if k8s.scenario.scrape_interval_s != scrape_s:
        raise RuntimeError("the Lyceum and k8s bench data have different scrape intervals")
    block_s = max(lyceum.block_s, k8s.block_s)

    def start(tsdb: Path) -> Callable[[], None]:
        return start_prometheus(tsdb, block_s=block_s, scrape_interval_s=scrape_s).stop

    parts = [(d.tsdb, json.loads((d.tsdb.parent / "manifest.json").read_text())) for d in (lyceum, k8s)]
    progress("Load: the combined Lyceum + k8s TSDB")
    tsdb, reused, seconds = mixload.combined_tsdb(DATA_DIR / "load", parts, block_s, start, err.print)
    prom = start_prometheus(tsdb, block_s=block_s, scrape_interval_s=scrape_s)
    cleanup.add(prom.stop)
    err.print(
        "Load data: the Lyceum host and the k8s nodes in one Prometheus, "
        + ("reused" if reused else f"combined in {seconds:.0f} s")
    )
    host = lyceum.scenario.hosts[0]
    executions = [_running_execution(lyceum.scenario), *_history(lyceum.scenario)]
    # the summary storm's year-long execution and the other tenant's (bench/storm.py)
    executions += storm.executions(ORG, host.hostname, lyceum.scenario.end, datetime.now(UTC))
    other_key: list[str] = []

    def discover(prom_url: str, database_url: str, _work: Path) -> tuple[str, dict[str, RegisteredPod]]:
        progress("Load: discovering the pods from kube-state-metrics")
        key, pods, _found = register(prom_url, database_url, ORG, k8s.scenario)
        registry = Registry.from_url(database_url)
        try:
            for execution in executions:
                registry.upsert_execution(execution)
            other_key.append(registry.create_key(storm.OTHER_ORG, name="bench-other")[1])
        finally:
            registry.dispose()
        return key, pods

    stack, pods = _start_stack(prom, PROMETHEUS, "gpulens-bench-load-", cleanup, discover)
    pod = pods[LLM_POD]
    node = k8s.scenario.node(pod.spec.node)
    who = PodData(pod.spec.namespace, pod.spec.name)
    if node.honor_labels:
        who = PodData(pod.spec.namespace, pod.spec.name, c.LABEL_NAMESPACE, c.LABEL_POD)
    pod_window = (max(pod.spec.start_s, k8s.scenario.end_s - 86_400), k8s.scenario.pod_end_s(pod.spec))
    routes = mixload.build_routes(
        execution_id=EXECUTION_ID,
        host=_host_data(host),
        lyceum_end_s=lyceum.scenario.end_s,
        scrape_s=scrape_s,
        pod=pod,
        pod_data=who,
        pod_window=pod_window,
        headers=stack.api.headers,
    )
    clients, duration = int(args.load_clients), float(args.load_seconds)
    result = mixload.LoadResult(clients, mixload.WARMUP_S, duration, {r.name: r.weight for r in routes})
    pid = stack.server.process.pid
    result.rss_before = Rss.of(pid)
    result.peak_reset = reset_peak_rss(pid)
    counters = _server_counters(stack.server.url)
    api = ThroughputResult(mixload.NAME, "the mix", clients, mixload.WARMUP_S, duration, 0)
    run_jobs(
        api,
        "127.0.0.1",
        stack.server.port,
        mixload.mixed(routes),
        stack.pids,
        progress,
        lambda t: result.rss_samples.append((t, proc_status_kib(pid, "VmRSS"))),
    )
    result.api = api
    result.rss_after = Rss.of(pid)
    result.server_counters = mixload.counter_deltas(counters, _server_counters(stack.server.url))
    err.print(
        f"{mixload.NAME}: {api.rps:.1f} requests/s, p50 {api.p50:.3f} s, p99 {api.p99:.3f} s, "
        f"{api.errors} errors; server RSS {result.rss_before.rss_kib / 1024:.0f} -> "
        f"{result.rss_after.rss_kib / 1024:.0f} MiB (peak {result.rss_after.peak_kib / 1024:.0f} MiB)"
    )
    base = ThroughputResult(
        f"{mixload.NAME} baseline", "hand-written PromQL", clients, mixload.WARMUP_S, duration, 0
    )
    run_jobs(
        base,
        "127.0.0.1",
        prom.port,
        mixload.mixed_baseline(routes),
        {PROMETHEUS: prom.process.pid},
        progress,
    )
    result.baseline = base
    if base.errors:
        result.checks.append(f"the hand-written baseline had {base.errors} errors: {base.error_samples[:2]}")
    err.print(
        f"{mixload.NAME} baseline: {base.rps:.1f} requests/s, p50 {base.p50:.3f} s, {base.errors} errors"
    )
    result.storm = storm.run_storm(
        "127.0.0.1",
        stack.server.port,
        summary_headers=stack.api.headers,
        other_headers={"Authorization": f"Bearer {other_key[0]}"},
        small_path=storm.small_read_path(lyceum.scenario.end),
        pid=pid,
        gpus=len(host.gpus),
        progress=progress,
    )
    for line in result.storm.lines():
        err.print(line)
    result.checks += [f"{storm.NAME}: {problem}" for problem in result.storm.checks]
    cleanup.run()
    return result


def _lyceum_expressions(step_ms: int = 15_000) -> list[HandForm]:
    """The hand-written Lyceum forms of the bench execution at `step_ms` (for the table and the JSON)."""
    scenario = prepare(DATA_DIR, log=lambda _: None).scenario
    return lyceum_forms(_host_data(scenario.hosts[0]), (), step_ms, scenario.scrape_interval_s * 1000)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.section and "client" in args.section:  # in-process, no gpulens server: bench/client.py
        from bench import client

        code = client.main([])
        args.section = [s for s in args.section if s != "client"]
        if not args.section:
            return code
    console = Console(highlight=False, width=None if sys.stdout.isatty() else 200)
    err = Console(stderr=True, highlight=False, width=None if sys.stderr.isatty() else 200)
    started = time.monotonic()
    cleanup = Cleanup()
    atexit.register(cleanup.run)

    def on_term(signum: int, _frame: FrameType | None) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, on_term)
    # Ctrl-C raises KeyboardInterrupt even when started with SIGINT ignored (a background job)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    select = Selection.from_args(args)
    if not select.anything:
        err.print("nothing selected: see --section and --only")
        return 2
    try:
        for binary in ("prometheus", "promtool") + (("victoria-metrics",) if select.vm_cases else ()):
            find_binary(binary)
        DATA_DIR.mkdir(exist_ok=True)
        if args.rebuild:
            for manifest in ("manifest.json", "k8s/manifest.json", "vm/manifest.json", "load/manifest.json"):
                (DATA_DIR / manifest).unlink(missing_ok=True)
                (DATA_DIR / "damaged" / manifest).unlink(missing_ok=True)
        overrides = sorted(k for k in os.environ if k.startswith("GPULENS_"))
        if overrides:
            err.print(f"environment settings in effect for the gpulens servers: {', '.join(overrides)}")

        lyceum: dict[str, Any] = {"cases": [], "forms": [], "load": None, "summary": None, "env": {}}
        damaged: dict[str, Any] = {"cases": [], "env": {}}
        on_vm: dict[str, Any] = {"cases": [], "env": {}}
        runai: dict[str, Any] = {"cases": [], "load": None, "env": {}}
        runai_damaged: dict[str, Any] = {"cases": [], "load": None, "env": {}}
        archived: archive.ArchiveResult | None = None
        local: embedded.EmbeddedResult | None = None
        mix: mixload.LoadResult | None = None
        page: dashboard.DashboardResult | None = None
        live: alerts.AlertsResult | None = None
        fleet: usage.UsageResult | None = None
        with err.status("starting") as status:

            def progress(text: str) -> None:
                status.update(text)

            if select.lyceum:
                lyceum = _lyceum_section(args, select, cleanup, err, progress)
            if select.cases_on(select.lyceum_cases, DAMAGED):
                damaged = _lyceum_damaged_section(args, select, cleanup, err, progress)
            if select.vm_cases:
                on_vm = _vm_section(args, select, cleanup, err, progress)
            if select.archive:
                archived = _archive_section(args, cleanup, err, progress)
            if select.runai:
                runai = _runai_section(args, select, cleanup, err, progress)
            if select.cases_on(select.runai_cases, DAMAGED):
                runai_damaged = _runai_section(args, select, cleanup, err, progress, DAMAGED)
            if select.embedded:
                local = embedded.run_section(DATA_DIR, cleanup.add, err, progress)
                cleanup.run()  # its Prometheus and temp dir go now
            if select.load:
                mix = _load_section(args, cleanup, err, progress)
            if select.dashboard:
                page = dashboard.run_section(
                    DATA_DIR, cleanup.add, err.print, progress, max(1, int(args.dashboard_rounds))
                )
                cleanup.run()
                for line in page.lines():
                    err.print(line)
            if select.alerts:
                live = _alerts_section(cleanup, err, progress)
            if select.usage:
                work = Path(tempfile.mkdtemp(prefix="gpulens-bench-usage-"))
                cleanup.add(lambda: shutil.rmtree(work, ignore_errors=True))
                fleet = usage.run_usage(work, progress)
                cleanup.run()
                for line in fleet.lines():
                    err.print(line)
                for problem in fleet.checks:
                    err.print(f"[red]{usage.NAME}: {problem}[/red]")

        elapsed = time.monotonic() - started
        results: list[CaseResult] = lyceum["cases"] + damaged["cases"] + on_vm["cases"]
        runai_results: list[RunaiCaseResult] = runai["cases"] + runai_damaged["cases"]
        loads = [r for r in (lyceum["load"], runai["load"]) if r is not None]
        lyceum_forms_used = _lyceum_expressions() if results else []
        if results:
            report.print_cases(console, results)
            if any(r.data == DAMAGED or r.tolerated for r in results):
                report.print_damage_note(console, results)
            report.print_expressions(
                console,
                "Hand-written Lyceum baseline (one query per series and chunk; 15 s step)",
                lyceum_forms_used,
            )
        if lyceum["forms"]:
            report.print_forms(console, lyceum["forms"])
        if results or runai_results:
            report.print_clean_vs_damaged(console, results, runai_results)
        if runai_results:
            report.print_runai(console, runai_results)
            report.print_expressions(
                console, "Hand-written Run:ai baseline (vLLM pod, 24 h, 1000 samples)", runai_results[0].forms
            )
        if archived is not None:
            report.print_archive(console, archived)
        if loads:
            report.print_throughput(console, loads)
        if local is not None:
            embedded.print_embedded(console, local)
        cost: summary_cost.SummaryCostResult | None = lyceum["summary"]
        if cost is not None:
            report.print_summary_cost(console, cost)
        if mix is not None:
            report.print_load(console, mix)
        if page is not None:
            report.print_dashboard(console, page)

        figures: list[Figure] = [f for r in results for f in r.figures(RSS_TARGET_MIB)]
        figures += [f for r in runai_results for f in r.figures()]
        if archived is not None:
            figures += archived.figures()
        figures += [Figure(f"{r.name}: errors", float(r.errors), 0.0, "errors") for r in loads]
        if local is not None:
            figures += local.figures()
        if cost is not None:
            figures += cost.figures()
        if mix is not None:
            figures += mix.figures()
        if page is not None:
            figures += page.figures()
        if live is not None:
            figures += live.figures()
        if fleet is not None:
            figures += fleet.figures()
        report.print_summary(console, figures)

        env = {
            "when": datetime.now(UTC).isoformat(timespec="seconds"),
            "python": platform.python_version(),
            "prometheus": _version("prometheus", "--version"),
            "cpus": os.cpu_count(),
            **lyceum["env"],
            "damaged_data": damaged["env"],
            "victoria_metrics_data": on_vm["env"],
            "runai": runai["env"],
            "runai_damaged_data": runai_damaged["env"],
            "total_seconds": elapsed,
        }
        out = {
            "environment": env,
            "baseline": "hand-written PromQL per series (bench/handwritten.py), sent concurrently",
            "cases": [r.as_json() for r in results],
            "handwritten_lyceum_forms_15s": {f.key: f.expr for f in lyceum_forms_used},
            "fb_forms": [f.as_json() for f in lyceum["forms"]],
            "lyceum_throughput": None if lyceum["load"] is None else lyceum["load"].as_json(),
            "archive": None if archived is None else archived.as_json(),
            "runai": {
                "cases": [r.as_json() for r in runai_results],
                "throughput": None if runai["load"] is None else runai["load"].as_json(),
            },
            "embedded": None if local is None else local.as_json(),
            "summary_cost": None if cost is None else cost.as_json(),
            "load": None if mix is None else mix.as_json(),
            "dashboard": None if page is None else page.as_json(),
            "alerts": None if live is None else live.as_json(),
            "usage": None if fleet is None else fleet.as_json(),
            "summary": [f.as_json() for f in figures],
        }
        (DATA_DIR / "results.json").write_text(json.dumps(out, indent=1) + "\n")
        console.print(
            f"total {elapsed:.0f} s on {os.cpu_count()} CPUs ({env['prometheus']}); "
            f"results in {DATA_DIR.relative_to(ROOT) / 'results.json'}"
        )
        failed = (
            any(r.checks for r in results)
            or any(r.checks for r in runai_results)
            or (archived is not None and bool(archived.checks))
            or (local is not None and bool(local.checks))
            or (cost is not None and bool(cost.checks))
            or (mix is not None and bool(mix.checks))
            or (page is not None and bool(page.checks))
            or (live is not None and bool(live.checks))
            or (fleet is not None and bool(fleet.checks))
        )
        errors = any(r.errors for r in loads) or (mix is not None and (mix.api is None or mix.api.errors > 0))
        missed = [f for f in figures if f.verdict == "MISS"]
        return 1 if failed or errors or (args.strict and missed) else 0
    except KeyboardInterrupt:
        err.print("interrupted: stopping the servers")
        return 130
    finally:
        cleanup.run()
