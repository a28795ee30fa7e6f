"""`make bench`'s sections and flags: the load and dashboard sections are in the default set, the
30-day summary runs with the lyceum section, and their results print and serialise when not measured."""

from __future__ import annotations

import io
import json
import math

from bench.dashboard import LOADED, STEP_15, TARGET_15S, DashboardResult
from bench.load import ThroughputResult
from bench.mixload import LoadResult
from bench.run import Selection, _parser
from bench.servers import Rss
from bench.summary import TARGET, SummaryCostResult
from rich.console import Console

from bench import report


def _select(*argv: str) -> Selection:
    return Selection.from_args(_parser().parse_args(list(argv)))


def test_default_run_has_load_dashboard_and_summary() -> None:
    s = _select()
    assert s.load and s.dashboard and s.summary and s.lyceum
    args = _parser().parse_args([])
    assert args.load_clients == 64 and args.load_seconds == 60.0


def test_sections_and_only_select_the_new_parts() -> None:
    s = _select("--section", "load", "--load-seconds", "5", "--load-clients", "8")
    assert s.load and not s.dashboard and not s.lyceum and not s.runai and not s.embedded
    s = _select("--section", "dashboard")
    assert s.dashboard and not s.load and s.anything
    s = _select("--section", "lyceum", "--only", "Summary")
    assert s.summary and s.lyceum and not s.lyceum_cases and not s.forms and not s.lyceum_load
    s = _select("--section", "lyceum", "--only", "30 d")
    assert not s.summary and s.lyceum_cases


def test_unmeasured_results_read_n_a() -> None:
    page = DashboardResult(False, "chromium is not installed")
    assert [f.verdict for f in page.figures()] == ["n/a", "n/a", "n/a", "n/a"]
    assert page.lines() == ["Dashboard: not measured (chromium is not installed)"]
    json.dumps(page.as_json())
    load = LoadResult(64, 5.0, 60.0, {})
    assert {f.verdict for f in load.figures()} == {"n/a"}
    json.dumps(load.as_json())
    cost = SummaryCostResult()
    assert cost.figures()[0].verdict == "n/a" and cost.figures()[0].target == TARGET
    assert math.isnan(cost.ratio)


def test_dashboard_figures_and_lines() -> None:
    r = DashboardResult(rounds={STEP_15: [1.2, 1.4, 1.3], LOADED: [0.9, 1.0, 2.5]}, fetch_s=[0.4, 0.5, 0.6])
    first, vs_fetch, loaded, alone = r.figures()
    assert first.value == 1.3 and first.target == TARGET_15S and first.verdict == "PASS"
    assert vs_fetch.value is not None and math.isclose(vs_fetch.value, 1.3 / 0.5)
    assert loaded.value == 1.0 and loaded.verdict == "PASS"
    assert alone.verdict == "n/a" and alone.target is None  # not measured in this result
    text = "\n".join(r.lines())
    assert "24 h @ 15 s <= 1.5 s: PASS" in text and "page / fetch 2.60x" in text


def test_tables_render() -> None:
    api = ThroughputResult("Load", "mix", 2, 0.0, 2.0, 0, latencies=[1.0, 2.0, 0.1])
    api.by_route = {"m": [1.0, 2.0], "list": [0.1]}
    api.cpu = {"gpulens": 0.5, "Prometheus": 0.3}
    base = ThroughputResult("Load baseline", "hand", 2, 0.0, 2.0, 0, latencies=[0.5, 0.5])
    base.by_route = {"m": [0.5, 0.5]}
    base.cpu = {"Prometheus": 0.4}
    load = LoadResult(2, 0.0, 2.0, {"m": 2, "list": 1}, api, base, Rss(100 * 1024, 120 * 1024))
    load.rss_after = Rss(150 * 1024, 160 * 1024)
    load.rss_samples = [(0.5, 110 * 1024), (1.0, 130 * 1024), (1.5, 140 * 1024), (2.0, 150 * 1024)]
    out = io.StringIO()
    console = Console(file=out, width=250, highlight=False)
    report.print_load(console, load)
    report.print_dashboard(console, DashboardResult(rounds={STEP_15: [1.0]}, fetch_s=[0.2]))
    report.print_summary_cost(console, SummaryCostResult(api_s=[3.0], base_s=[1.0]))
    text = out.getvalue()
    [m_row] = [line for line in text.splitlines() if line.startswith("│ m ")]
    assert "1.500" in m_row and "0.500" in m_row and "3.00" in m_row  # p50 1.5 s against 0.5 s
    assert "server RSS: 100 MiB before, 150 MiB after (growth 50 MiB)" in text
    assert "25% 110 MiB, 50% 130 MiB, 75% 140 MiB, 100% 150 MiB" in text
    assert "CPU per request: gpulens 333 ms, Prometheus 200 ms, hand-written: Prometheus 400 ms" in text
    assert "3.00 (<= 2 MISS)" in text
