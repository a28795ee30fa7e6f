"""`make bench`: gpulens' endpoints against raw Prometheus, as ratios measured in one run.

Three sections, one after the other, each with its own Prometheus (and gpulens server): `lyceum` (the
execution metrics endpoint on 31 days of one 8-GPU host, the FB % query forms, throughput), `runai`
(the pod metrics endpoint on 26 h of the k8s scenario, throughput) and `embedded` (the local agent:
collector CPU, SampleStore ingest and size, embedded backend vs Prometheus on the Lyceum data).
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
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType
from typing import Any, TypeVar

from rich.console import Console

from bench import embedded, report
from bench.cases import (
    CASES,
    ApiVsBaseline,
    Case,
    CaseResult,
    api_path,
    baseline_queries,
    fb_forms,
    planned,
    run_case,
    run_fb_forms,
    window_for,
)
from bench.clients import ApiClient, Baseline, seconds_text
from bench.data import K8S_HOURS, BenchData, prepare, prepare_k8s
from bench.load import ThroughputResult, run_throughput
from bench.runai import (
    LLM_POD,
    LYCEUM_THROUGHPUT,
    RUNAI_CASE,
    RUNAI_THROUGHPUT,
    RegisteredPod,
    RunaiCaseResult,
    ThroughputCase,
    lyceum_throughput_paths,
    plan_pod,
    register,
    run_runai_case,
    throughput_paths,
)
from bench.servers import proc_status_kib, reset_peak_rss, start_gpulens
from gpulens.config import Settings
from gpulens.domain import catalog as c
from gpulens.domain.models import Execution, ExecutionStatus, Window
from gpulens.planning.chunking import chunks
from gpulens.planning.pods import PodTarget
from gpulens.planning.promql import eq, rename, selector
from gpulens.service.discovery import DiscoveryReport
from gpulens.service.metrics import LOOKBACK_MS
from gpulens.storage.registry import Registry
from gpulens.synth.promload import MissingBinary, ServerHandle, find_binary, start_prometheus
from gpulens.synth.scenario import Scenario

ROOT = Path(__file__).resolve().parent.parent
DATA_DIR = ROOT / "bench-data"
EXECUTION_ID = "bench-exec-1"
ORG = "bench"
FB_REPEATS = 9
RSS_TARGET_MIB = 150.0
SECTIONS = ("lyceum", "runai", "embedded")
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
        choices=SECTIONS,
        default=None,
        help="run only this section (repeatable; default: all)",
    )
    p.add_argument(
        "--only",
        action="append",
        default=None,
        help="run only cases whose name starts with this (e.g. '24 h', 'Run:ai', 'Lyceum throughput')",
    )
    p.add_argument("--repeat-scale", type=float, default=1.0, help="multiply every case's repeat count")
    p.add_argument("--no-forms", action="store_true", help="skip the FB %% query-form table")
    p.add_argument("--no-throughput", action="store_true", help="skip the throughput measurements")
    p.add_argument(
        "--throughput-seconds", type=float, default=None, help="measured seconds of each throughput run"
    )
    p.add_argument("--strict", action="store_true", help="exit 1 when a target is missed")
    return p


def _node_instances(prom_url: str, settings: Settings, hostname: str, window: Window) -> tuple[str, ...]:
    """What MetricsService._node_instances asks: node_uname_info{nodename=<host>} -> instance."""
    if settings.node_match not in ("auto", "nodename"):
        return ()
    match = selector(rename(c.NODE_UNAME_INFO, settings.metric_names), [eq(c.LABEL_NODENAME, hostname)])
    query = urllib.parse.urlencode(
        {
            "match[]": match,
            "start": seconds_text(window.start_ms - LOOKBACK_MS),
            "end": seconds_text(window.end_ms),
        }
    )
    with urllib.request.urlopen(f"{prom_url}/api/v1/series?{query}", timeout=30) as resp:
        data = json.loads(resp.read())["data"]
    return tuple(sorted({s[c.LABEL_INSTANCE] for s in data if c.LABEL_INSTANCE in s}))


def _prometheus_version() -> str:
    try:
        out = subprocess.run(
            [find_binary("prometheus"), "--version"], capture_output=True, text=True, check=False
        )
    except (MissingBinary, OSError):
        return "?"
    first = (out.stdout or out.stderr).splitlines()
    return first[0].split(" (")[0] if first else "?"


@dataclass
class Selection:
    """What this run measures, from --section, --only and the --no-* flags."""

    lyceum_cases: list[Case]
    forms: bool
    lyceum_load: bool
    runai_case: bool
    runai_load: bool
    embedded: bool = False

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> Selection:
        sections = args.section or list(SECTIONS)

        def wanted(section: str, name: str) -> bool:
            if section not in sections:
                return False
            return not args.only or any(name.startswith(prefix) for prefix in args.only)

        cases = [k for k in CASES if wanted("lyceum", k.name)]
        lyceum_load = not args.no_throughput and wanted("lyceum", LYCEUM_THROUGHPUT.name)
        # the FB % forms go with the Lyceum section whenever it runs at all (as before --section)
        forms = not args.no_forms and "lyceum" in sections and (not args.only or bool(cases) or lyceum_load)
        return cls(
            cases,
            forms,
            lyceum_load,
            wanted("runai", RUNAI_CASE.name),
            not args.no_throughput and wanted("runai", RUNAI_THROUGHPUT.name),
            wanted("embedded", embedded.NAME),
        )

    @property
    def lyceum(self) -> bool:
        return bool(self.lyceum_cases) or self.forms or self.lyceum_load

    @property
    def runai(self) -> bool:
        return self.runai_case or self.runai_load


def _load_case(case: ThroughputCase, args: argparse.Namespace) -> ThroughputCase:
    if args.throughput_seconds is None:
        return case
    return dataclasses.replace(case, duration_s=float(args.throughput_seconds))


@dataclass
class Stack:
    """A section's servers and clients, all stopped by the section's `cleanup`."""

    prom: ServerHandle
    server: ServerHandle  # gpulens serve
    settings: Settings  # what the server runs with: the baseline plans with the same
    api: ApiClient  # the server, with the section's API key
    baseline: Baseline  # Prometheus, as many threads as the server's query concurrency

    @property
    def pids(self) -> dict[str, int]:
        return {"gpulens": self.server.process.pid, "prometheus": self.prom.process.pid}


def _start_stack(
    data: BenchData[Any],
    prefix: str,
    cleanup: Cleanup,
    register: Callable[[str, str], tuple[str, T]],
) -> tuple[Stack, T]:
    """Prometheus over the section's TSDB, a temp dir (`prefix`) with the registry, the gpulens server.

    `register(prometheus_url, database_url)` fills the registry before the server starts; it returns
    the org's API key and what else the section wants back (returned with the stack).
    """
    prom = start_prometheus(
        data.tsdb, block_s=data.block_s, scrape_interval_s=data.scenario.scrape_interval_s
    )
    cleanup.add(prom.stop)
    work = Path(tempfile.mkdtemp(prefix=prefix))
    cleanup.add(lambda: shutil.rmtree(work, ignore_errors=True))
    database_url = f"sqlite:///{work / 'registry.db'}"
    key, registered = register(prom.url, database_url)
    server = start_gpulens(prom.url, database_url, work, work / "gpulens.log")
    cleanup.add(server.stop)
    settings = Settings(prometheus_url=prom.url, database_url=database_url, data_dir=work)
    api = ApiClient("127.0.0.1", server.port, key)
    cleanup.add(api.close)
    baseline = Baseline("127.0.0.1", prom.port, threads=settings.query_concurrency)
    cleanup.add(baseline.close)
    return Stack(prom, server, settings, api, baseline), registered


def _print_ratio(err: Console, name: str, result: ApiVsBaseline, t0: float) -> None:
    err.print(
        f"{name}: API p50 {result.api_p50:.3f} s, Prometheus p50 {result.base_p50:.3f} s, "
        f"ratio {result.ratio:.2f} ({time.monotonic() - t0:.0f} s)"
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


def _register_execution(database_url: str, scenario: Scenario) -> str:
    """A fresh registry holding the bench execution (the whole scenario on its first host); an org key."""
    registry = Registry.from_url(database_url)
    try:
        registry.migrate()
        _, key = registry.create_key(ORG, name="bench")
        registry.upsert_execution(
            Execution(
                execution_id=EXECUTION_ID,
                org=ORG,
                hostname=scenario.hosts[0].hostname,
                gpus=(),
                status=ExecutionStatus.COMPLETED,
                created_at=scenario.start,
                start_time=scenario.start,
                end_time=scenario.end,
                execution_type="bench",
            )
        )
    finally:
        registry.dispose()
    return key


def _lyceum_section(
    args: argparse.Namespace,
    select: Selection,
    cleanup: Cleanup,
    err: Console,
    progress: Callable[[str], None],
) -> dict[str, Any]:
    """The execution metrics endpoint (cases, throughput) and the FB % forms; servers stopped after."""
    data = prepare(DATA_DIR, log=err.print)
    scenario = data.scenario
    host = scenario.hosts[0]
    err.print(
        f"Lyceum data: {scenario.start:%Y-%m-%d %H:%M} .. {scenario.end:%Y-%m-%d %H:%M} UTC, "
        f"host {host.hostname}, {len(host.gpus)} GPUs, "
        + ("reused" if data.reused else f"built in {data.seconds:.0f} s")
    )
    stack, _ = _start_stack(
        data,
        "gpulens-bench-",
        cleanup,
        lambda _url, database_url: (_register_execution(database_url, scenario), None),
    )
    settings, server = stack.settings, stack.server
    whole = Window(scenario.start_s * 1000, scenario.end_s * 1000, 15_000)
    instances = _node_instances(stack.prom.url, settings, host.hostname, whole)

    results: list[CaseResult] = []
    for case in select.lyceum_cases:
        window = window_for(case, scenario.end_s)
        plan = planned(settings, host.hostname, instances, window.step_ms)
        queries = baseline_queries(plan, window, settings.max_points_per_query)
        n_chunks = len(chunks(window, settings.max_points_per_query))
        result = CaseResult(case, window, n_chunks, len(queries))
        repeats = max(1, round(case.repeats * args.repeat_scale))
        t0 = time.monotonic()
        run_case(
            case,
            result,
            stack.api,
            stack.baseline,
            api_path(EXECUTION_ID, window),
            queries,
            plan,
            progress,
            rss=lambda k: proc_status_kib(server.process.pid, k),
            reset_peak=lambda: reset_peak_rss(server.process.pid),
            repeats=repeats,
        )
        results.append(result)
        _print_ratio(err, case.name, result, t0)

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

    forms = []
    if select.forms:
        step_ms = 15_000
        fb_window = Window(scenario.end_s * 1000 - 86_400_000, scenario.end_s * 1000, step_ms)
        forms = run_fb_forms(
            fb_forms(settings, host.hostname, instances, step_ms),
            fb_window,
            stack.baseline,
            max(1, round(FB_REPEATS * args.repeat_scale)),
            progress,
        )

    rss_kib = proc_status_kib(server.process.pid, "VmRSS")
    cleanup.run()  # this section's servers stop before the next one starts
    return {
        "cases": results,
        "forms": forms,
        "load": load,
        "env": {
            "host": host.hostname,
            "gpus": len(host.gpus),
            "data": {"start_s": scenario.start_s, "end_s": scenario.end_s, "reused": data.reused},
            "baseline_threads": settings.query_concurrency,
            "server_rss_end_kib": rss_kib,
        },
    }


def _runai_section(
    args: argparse.Namespace,
    select: Selection,
    cleanup: Cleanup,
    err: Console,
    progress: Callable[[str], None],
) -> dict[str, Any]:
    """The pod metrics endpoint: every metricType of the vLLM pod over 24 h, then throughput."""
    data = prepare_k8s(DATA_DIR / "k8s", log=err.print)
    scenario = data.scenario
    err.print(
        f"k8s data: {scenario.start:%Y-%m-%d %H:%M} .. {scenario.end:%Y-%m-%d %H:%M} UTC, "
        f"{len(scenario.nodes)} nodes, {len(scenario.pods)} pods, "
        + ("reused" if data.reused else f"built in {data.seconds:.0f} s")
    )

    def discover(
        prom_url: str, database_url: str
    ) -> tuple[str, tuple[dict[str, RegisteredPod], DiscoveryReport]]:
        progress("discovering the pods from kube-state-metrics")
        key, pods, found = register(prom_url, database_url, ORG, scenario)
        err.print(found.summary())
        return key, (pods, found)

    stack, (pods, found) = _start_stack(data, "gpulens-bench-runai-", cleanup, discover)
    settings = stack.settings

    results: list[RunaiCaseResult] = []
    if select.runai_case:
        case = RUNAI_CASE
        pod = pods[LLM_POD]
        end_ms = scenario.end_s * 1000
        start_ms = end_ms - case.span_s * 1000
        progress(f"{case.name}: planning the baseline")
        plan = plan_pod(
            settings,
            stack.baseline,
            PodTarget.one(pod.spec.namespace, pod.spec.name),
            c.POD_METRICS,
            start_ms,
            end_ms,
            case.samples,
        )
        path = pod.metrics_path([m.type for m in c.POD_METRICS], start_ms, end_ms, case.samples)
        result = RunaiCaseResult(case, f"{pod.spec.namespace}/{pod.spec.name}", plan)
        t0 = time.monotonic()
        run_runai_case(
            result, stack.api, stack.baseline, path, progress, max(1, round(case.repeats * args.repeat_scale))
        )
        results.append(result)
        _print_ratio(err, case.name, result, t0)

    load: ThroughputResult | None = None
    if select.runai_load:
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
            "pods": len(pods),
            "discovery": found.summary(),
            "baseline_threads": settings.query_concurrency,
            "server_rss_end_kib": rss_kib,
        },
    }


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
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
    if not select.lyceum and not select.runai and not select.embedded:
        err.print("nothing selected: see --section and --only")
        return 2
    try:
        for binary in ("prometheus", "promtool"):
            find_binary(binary)
        DATA_DIR.mkdir(exist_ok=True)
        if args.rebuild:
            (DATA_DIR / "manifest.json").unlink(missing_ok=True)
            (DATA_DIR / "k8s" / "manifest.json").unlink(missing_ok=True)
        overrides = sorted(k for k in os.environ if k.startswith("GPULENS_"))
        if overrides:
            err.print(f"environment settings in effect for both sides: {', '.join(overrides)}")

        lyceum: dict[str, Any] = {"cases": [], "forms": [], "load": None, "env": {}}
        runai: dict[str, Any] = {"cases": [], "load": None, "env": {}}
        with err.status("starting") as status:

            def progress(text: str) -> None:
                status.update(text)

            if select.lyceum:
                lyceum = _lyceum_section(args, select, cleanup, err, progress)
            if select.runai:
                runai = _runai_section(args, select, cleanup, err, progress)
            local: embedded.EmbeddedResult | None = None
            if select.embedded:
                local = embedded.run_section(DATA_DIR, cleanup.add, err, progress)
                cleanup.run()  # its Prometheus and temp dir go now

        elapsed = time.monotonic() - started
        results: list[CaseResult] = lyceum["cases"]
        runai_results: list[RunaiCaseResult] = runai["cases"]
        loads = [r for r in (lyceum["load"], runai["load"]) if r is not None]
        if results:
            report.print_cases(console, results, RSS_TARGET_MIB)
        if lyceum["forms"]:
            report.print_forms(console, lyceum["forms"])
        if runai_results:
            report.print_runai(console, runai_results)
        if loads:
            report.print_throughput(console, loads)
        if local is not None:
            embedded.print_embedded(console, local)
        env = {
            "when": datetime.now(UTC).isoformat(timespec="seconds"),
            "python": platform.python_version(),
            "prometheus": _prometheus_version(),
            "cpus": os.cpu_count(),
            **lyceum["env"],
            "runai": runai["env"],
            "total_seconds": elapsed,
        }
        out = {
            "environment": env,
            "cases": [r.as_json() for r in results],
            "fb_forms": [f.as_json() for f in lyceum["forms"]],
            "lyceum_throughput": None if lyceum["load"] is None else lyceum["load"].as_json(),
            "runai": {
                "cases": [r.as_json() for r in runai_results],
                "throughput": None if runai["load"] is None else runai["load"].as_json(),
            },
            "embedded": None if local is None else local.as_json(),
            "targets": {"ratio_p50": 1.5, "rss_growth_mib": RSS_TARGET_MIB, "throughput_errors": 0},
        }
        (DATA_DIR / "results.json").write_text(json.dumps(out, indent=1) + "\n")
        console.print(
            f"total {elapsed:.0f} s on {os.cpu_count()} CPUs ({env['prometheus']}); "
            f"results in {DATA_DIR.relative_to(ROOT) / 'results.json'}"
        )
        failed = (
            any(r.checks for r in results)
            or any(r.checks for r in runai_results)
            or (local is not None and bool(local.checks))
        )
        errors = any(r.errors for r in loads)
        missed = report.missed_targets(results, RSS_TARGET_MIB) + report.missed_runai(runai_results, loads)
        if local is not None:
            missed += local.missed()
        for line in missed:
            console.print(f"[yellow]target missed:[/yellow] {line}")
        return 1 if failed or errors or (args.strict and missed) else 0
    except KeyboardInterrupt:
        err.print("interrupted: stopping the servers")
        return 130
    finally:
        cleanup.run()
