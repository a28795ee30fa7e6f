"""`make bench`: gpulens' metrics endpoint against raw Prometheus, as ratios measured in one run."""

from __future__ import annotations

import argparse
import atexit
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

from rich.console import Console

from bench import report
from bench.cases import (
    CASES,
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
from bench.data import prepare
from bench.servers import GpulensServer, proc_status_kib, reset_peak_rss
from gpulens.config import Settings
from gpulens.domain import catalog as c
from gpulens.domain.models import Execution, ExecutionStatus, Window
from gpulens.planning.chunking import chunks
from gpulens.planning.promql import eq, rename, selector
from gpulens.service.metrics import LOOKBACK_MS
from gpulens.storage.registry import Registry
from gpulens.synth.promload import MissingBinary, find_binary, start_prometheus

ROOT = Path(__file__).resolve().parent.parent
DATA_DIR = ROOT / "bench-data"
EXECUTION_ID = "bench-exec-1"
ORG = "bench"
FB_REPEATS = 9
RSS_TARGET_MIB = 150.0


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
    p.add_argument("--only", action="append", default=None, help="run only cases whose name starts with this")
    p.add_argument("--repeat-scale", type=float, default=1.0, help="multiply every case's repeat count")
    p.add_argument("--no-forms", action="store_true", help="skip the FB %% query-form table")
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
    cases: list[Case] = [
        k for k in CASES if not args.only or any(k.name.startswith(prefix) for prefix in args.only)
    ]
    try:
        for binary in ("prometheus", "promtool"):
            find_binary(binary)
        DATA_DIR.mkdir(exist_ok=True)
        if args.rebuild:
            (DATA_DIR / "manifest.json").unlink(missing_ok=True)
        data = prepare(DATA_DIR, log=err.print)
        scenario = data.scenario
        host = scenario.hosts[0]
        err.print(
            f"data: {scenario.start:%Y-%m-%d %H:%M} .. {scenario.end:%Y-%m-%d %H:%M} UTC, "
            f"host {host.hostname}, {len(host.gpus)} GPUs, "
            + ("reused" if data.reused else f"built in {data.seconds:.0f} s")
        )
        prom = start_prometheus(data.tsdb, block_s=data.block_s, scrape_interval_s=scenario.scrape_interval_s)
        cleanup.add(prom.stop)
        work = Path(tempfile.mkdtemp(prefix="gpulens-bench-"))
        cleanup.add(lambda: shutil.rmtree(work, ignore_errors=True))
        database_url = f"sqlite:///{work / 'registry.db'}"

        registry = Registry.from_url(database_url)
        try:
            registry.migrate()
            _, key = registry.create_key(ORG, name="bench")
            registry.upsert_execution(
                Execution(
                    execution_id=EXECUTION_ID,
                    org=ORG,
                    hostname=host.hostname,
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

        server = GpulensServer.start(prom.url, database_url, work, work / "gpulens.log")
        cleanup.add(server.stop)
        settings = Settings(prometheus_url=prom.url, database_url=database_url, data_dir=work)
        overrides = sorted(k for k in os.environ if k.startswith("GPULENS_"))
        if overrides:
            err.print(f"environment settings in effect for both sides: {', '.join(overrides)}")
        prom_port = int(prom.url.rsplit(":", 1)[1])
        whole = Window(scenario.start_s * 1000, scenario.end_s * 1000, 15_000)
        instances = _node_instances(prom.url, settings, host.hostname, whole)

        api = ApiClient("127.0.0.1", server.port, key)
        cleanup.add(api.close)
        baseline = Baseline("127.0.0.1", prom_port, threads=settings.query_concurrency)
        cleanup.add(baseline.close)

        results: list[CaseResult] = []
        with err.status("starting") as status:

            def progress(text: str) -> None:
                status.update(text)

            for case in cases:
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
                    api,
                    baseline,
                    api_path(EXECUTION_ID, window),
                    queries,
                    plan,
                    progress,
                    rss=lambda k: proc_status_kib(server.pid, k),
                    reset_peak=lambda: reset_peak_rss(server.pid),
                    repeats=repeats,
                )
                results.append(result)
                err.print(
                    f"{case.name}: API p50 {result.api_p50:.3f} s, Prometheus p50 {result.base_p50:.3f} s, "
                    f"ratio {result.ratio:.2f} ({time.monotonic() - t0:.0f} s)"
                )

            forms = []
            if not args.no_forms:
                step_ms = 15_000
                fb_window = Window(scenario.end_s * 1000 - 86_400_000, scenario.end_s * 1000, step_ms)
                forms = run_fb_forms(
                    fb_forms(settings, host.hostname, instances, step_ms),
                    fb_window,
                    baseline,
                    max(1, round(FB_REPEATS * args.repeat_scale)),
                    progress,
                )

        server_rss_kib = proc_status_kib(server.pid, "VmRSS")
        elapsed = time.monotonic() - started
        report.print_cases(console, results, RSS_TARGET_MIB)
        if forms:
            report.print_forms(console, forms)
        env = {
            "when": datetime.now(UTC).isoformat(timespec="seconds"),
            "python": platform.python_version(),
            "prometheus": _prometheus_version(),
            "cpus": os.cpu_count(),
            "host": host.hostname,
            "gpus": len(host.gpus),
            "data": {"start_s": scenario.start_s, "end_s": scenario.end_s, "reused": data.reused},
            "baseline_threads": settings.query_concurrency,
            "server_rss_end_kib": server_rss_kib,
            "total_seconds": elapsed,
        }
        out = {
            "environment": env,
            "cases": [r.as_json() for r in results],
            "fb_forms": [f.as_json() for f in forms],
            "targets": {"ratio_p50": 1.5, "rss_growth_mib": RSS_TARGET_MIB},
        }
        (DATA_DIR / "results.json").write_text(json.dumps(out, indent=1) + "\n")
        console.print(
            f"total {elapsed:.0f} s on {os.cpu_count()} CPUs ({env['prometheus']}); "
            f"results in {DATA_DIR.relative_to(ROOT) / 'results.json'}"
        )
        failed = any(r.checks for r in results)
        missed = report.missed_targets(results, RSS_TARGET_MIB)
        for line in missed:
            console.print(f"[yellow]target missed:[/yellow] {line}")
        return 1 if failed or (args.strict and missed) else 0
    except KeyboardInterrupt:
        err.print("interrupted: stopping the servers")
        return 130
    finally:
        cleanup.run()
