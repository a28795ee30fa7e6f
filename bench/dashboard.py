"""`python -m bench.dashboard`: the dashboard's time to first drawn charts for a 24 h execution.

The Lyceum bench data (one 8-GPU host, bench-data/, built by `make bench` and reused) in a real
Prometheus, `gpulens serve` on it, a completed execution over the data's last 24 hours, and Debian's
chromium driven by Playwright (headless). Each round opens `/ui/executions/<id>` in a fresh tab
(signed in through sessionStorage) and reads `performance` marks: navigation start to all 12 charts
drawn. Two figures: the page as it loads (a step giving ~720 points a series) and `?step=15`
(24 h @ 15 s: 5,761 points a series). The p50 of ROUNDS rounds of each is printed.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.data import prepare
from bench.servers import start_gpulens
from gpulens.domain.models import Execution, ExecutionStatus
from gpulens.domain.timeparse import ms_to_datetime
from gpulens.storage.registry import Registry
from gpulens_testkit.promload import start_prometheus

ROOT = Path(__file__).resolve().parent.parent
DATA_DIR = ROOT / "bench-data"
ORG = "bench"
EXECUTION_ID = "bench-dashboard-24h"
DAY_MS = 86_400_000
ROUNDS = 7
TARGET_S = 2.0  # the page as it loads: 12 charts drawn within this


def _register(database_url: str, end_s: int, hostname: str) -> str:
    registry = Registry.from_url(database_url)
    try:
        registry.migrate()
        _, key = registry.create_key(ORG, name="bench")
        start = ms_to_datetime(end_s * 1000 - DAY_MS)
        registry.upsert_execution(
            Execution(
                execution_id=EXECUTION_ID,
                org=ORG,
                hostname=hostname,
                gpus=(),
                status=ExecutionStatus.COMPLETED,
                created_at=start,
                start_time=start,
                end_time=ms_to_datetime(end_s * 1000),
                execution_type="bench",
            )
        )
    finally:
        registry.dispose()
    return key


def _round(browser: Any, base: str, key: str, query: str) -> float:
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    try:
        context.add_init_script(f"sessionStorage.setItem('gpulens.apiKey', {key!r});")
        page = context.new_page()
        page.goto(f"{base}/ui/executions/{EXECUTION_ID}{query}")
        page.wait_for_selector("body[data-charts=drawn]", state="attached", timeout=120_000)
        ms: float = page.evaluate("performance.getEntriesByName('gpulens:charts-drawn')[0].startTime")
        return ms / 1000
    finally:
        context.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.dashboard", description=__doc__)
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    args = parser.parse_args(argv)
    chromium = shutil.which("chromium")
    if chromium is None:
        print("chromium is not installed (make servers)", file=sys.stderr)
        return 2
    from playwright.sync_api import sync_playwright

    data = prepare(DATA_DIR, log=lambda line: print(line, file=sys.stderr))
    prom = start_prometheus(
        data.tsdb, block_s=data.block_s, scrape_interval_s=data.scenario.scrape_interval_s
    )
    work = Path(tempfile.mkdtemp(prefix="gpulens-bench-dashboard-"))
    server = None
    try:
        database_url = f"sqlite:///{work / 'registry.db'}"
        key = _register(database_url, data.scenario.end_s, data.scenario.hosts[0].hostname)
        server = start_gpulens(prom.url, database_url, work, work / "gpulens.log")
        base = f"http://127.0.0.1:{server.port}"
        results: dict[str, list[float]] = {}
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox", "--disable-gpu"])
            try:
                for name, query in (("as loaded (~720 points)", ""), ("24 h @ 15 s", "?step=15")):
                    _round(browser, base, key, query)  # warm-up: caches, Prometheus' page cache
                    results[name] = [_round(browser, base, key, query) for _ in range(args.rounds)]
            finally:
                browser.close()
        t = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
        print(f"Dashboard, 24 h execution, 8 GPUs, 12 charts ({args.rounds} rounds, {t}):")
        for name, times in results.items():
            p50 = statistics.median(times)
            spread = f"min {min(times):.3f}, max {max(times):.3f}"
            print(f"  {name:<24} time to drawn charts p50 {p50:.3f} s ({spread})")
        first = statistics.median(next(iter(results.values())))
        ok = first <= TARGET_S
        print(f"  target: as loaded <= {TARGET_S:.1f} s: {'PASS' if ok else 'MISS'}")
        return 0
    finally:
        if server is not None:
            server.stop()
        prom.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
