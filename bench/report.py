"""Rich tables for the results."""

from __future__ import annotations

import math
from collections.abc import Sequence

from rich.console import Console
from rich.table import Table

from bench.archive import TARGET_ARCHIVE_S, TARGET_BYTES_PER_SAMPLE, TARGET_SAME, TARGET_VARIED, ArchiveResult
from bench.cases import CaseResult, FormResult
from bench.damaged import CLEAN, DAMAGED
from bench.dashboard import LOADED, STEP_15, TARGET_15S, TARGET_LOADED, DashboardResult
from bench.handwritten import HandForm, pod_types
from bench.load import ThroughputResult
from bench.measure import Figure, percentile
from bench.mixload import LoadResult
from bench.runai import RunaiCaseResult
from bench.summary import STORED_TARGET, SummaryCostResult
from bench.summary import TARGET as SUMMARY_TARGET

MB = 1e6


def _s(value: float) -> str:
    return f"{value:.3f}"


def _verdict(value: float, target: float | None) -> str:
    if target is None or not math.isfinite(value):
        return "-"
    return "[green]PASS[/]" if value <= target else "[red]MISS[/]"


def _cpu_ms(seconds: float) -> str:
    return "-" if not math.isfinite(seconds) else f"{seconds * 1000:.0f}"


def _check(checks: Sequence[str]) -> str:
    return "ok" if not checks else f"[red]{len(checks)} problems: " + "; ".join(checks[:2]) + "[/]"


def _against(value: float, target: float | None) -> str:
    """`1.03 (<= 1.2 PASS)`"""
    if not math.isfinite(value):
        return "n/a"
    if target is None:
        return f"{value:.2f}"
    return f"{value:.2f} (<= {target:g} {_verdict(value, target)})"


def print_cases(console: Console, results: Sequence[CaseResult]) -> None:
    table = Table(
        title="Lyceum execution metrics: gpulens vs hand-written PromQL on the same backend "
        "(1 host, 8 GPUs, 12 series; wall seconds; backend CPU ms per request)"
    )
    for name in (
        "backend",
        "case",
        "data",
        "points",
        "queries",
        "runs",
        "API p50",
        "hand p50",
        "ratio (target)",
        "CPU API/hand",
        "CPU ratio (target)",
        "gpulens CPU",
        "own plan p50",
        "MB API/hand",
        "check",
    ):
        table.add_column(name, justify="left" if name in ("backend", "case", "data", "check") else "right")
    for r in results:
        overhead = "-" if not r.replay_s else f"{r.replay_p50:.3f} ({r.overhead_ratio:.2f}x)"
        table.add_row(
            r.backend,
            r.case.name,
            r.data,
            f"{r.window.points:,}",
            str(r.queries),
            str(len(r.api_s)),
            _s(r.api_p50),
            _s(r.base_p50),
            _against(r.ratio, r.target_ratio),
            f"{_cpu_ms(r.cpu.api)}/{_cpu_ms(r.cpu.base)}",
            _against(r.cpu.ratio, r.target_cpu),
            _cpu_ms(r.cpu.server),
            overhead,
            f"{r.api_bytes / MB:.1f}/{r.base_bytes / MB:.1f}",
            _check(r.checks),
        )
    console.print(table)
    console.print(
        "CPU: the backend's process_cpu_seconds_total (10 ms ticks) around a batch of requests of one "
        "side, per request; gpulens CPU: the server's own per API request (/proc). 'own plan': gpulens' "
        "plan sent straight to the backend (API p50 over it in brackets): the service's overhead, not "
        "the baseline."
    )
    for r in results:
        growth = r.rss_growth_mib
        if growth is None:
            continue
        assert r.rss_before_kib is not None and r.rss_peak_kib is not None
        console.print(
            f"server RSS, {r.name}: {r.rss_before_kib / 1024:.0f} MiB before, peak "
            f"{r.rss_peak_kib / 1024:.0f} MiB, growth {growth:.0f} MiB, "
            f"{(r.rss_after_kib or 0) / 1024:.0f} MiB after"
        )


def print_damage_note(console: Console, results: Sequence[CaseResult]) -> None:
    """How many points each damaged case's check compared and skipped (bench/handwritten.py)."""
    console.print(
        "Damaged data (bench/damaged.py): one dcgm-exporter restart per day under new pod/instance "
        "labels, 0.5 % missed scrapes, NaN bursts, series that begin with the data. Its checks skip "
        "the points where the hand-written form is known wrong (a restart's lookback, a NaN burst, "
        "the CPU rate window after a gap or the counters' start) and compare every other one:"
    )
    for r in results:
        if r.data != CLEAN or r.tolerated:  # clean: the CPU rate window where the counters begin
            console.print(
                f"  {r.name}: {r.compared:,} points compared, {r.tolerated:,} skipped as known wrong, "
                f"{r.absent:,} in neither answer"
            )


def _pair(value: float, target: float | None) -> str:
    return _against(value, target) if math.isfinite(value) else "-"


def print_clean_vs_damaged(
    console: Console, results: Sequence[CaseResult], runai: Sequence[RunaiCaseResult]
) -> None:
    """Each case's ratios on the clean and the damaged data side by side, with their targets."""
    table = Table(
        title="gpulens / hand-written PromQL, clean vs damaged data (medians of interleaved rounds; "
        "the targets are for the damaged data)"
    )
    for name in ("case", "wall, clean", "wall, damaged", "backend CPU, clean", "backend CPU, damaged"):
        table.add_column(name, justify="left" if name == "case" else "right")
    rows: dict[str, dict[str, tuple[float, float | None, float, float | None]]] = {}
    for r in results:
        key = f"Lyceum {r.backend} {r.case.name}"
        rows.setdefault(key, {})[r.data] = (r.ratio, r.target_ratio, r.cpu.ratio, r.target_cpu)
    for q in runai:
        rows.setdefault(q.case.name, {})[q.data] = (q.ratio, q.case.target_ratio, q.cpu.ratio, None)
    none = (math.nan, None, math.nan, None)
    for key, by_data in rows.items():
        clean, damaged = by_data.get(CLEAN, none), by_data.get(DAMAGED, none)
        table.add_row(
            key,
            _pair(clean[0], clean[1]),
            _pair(damaged[0], damaged[1]),
            _pair(clean[2], clean[3]),
            _pair(damaged[2], damaged[3]),
        )
    console.print(table)


def print_expressions(console: Console, title: str, forms: Sequence[HandForm]) -> None:
    table = Table(title=title)
    table.add_column("series / metricType", justify="left")
    table.add_column("hand-written PromQL", justify="left", overflow="fold")
    for f in forms:
        key = f.key if f.role in ("value", "per_gpu", "count", "buckets") else f"{f.key} {f.role}"
        table.add_row(key, f.expr or "[dim](no query: the pod has no such series)[/]")
    console.print(table)


def print_forms(console: Console, forms: Sequence[FormResult]) -> None:
    table = Table(title="FB % query forms, 24 h @ 15 s, one query straight to Prometheus (seconds)")
    for name in ("form", "p50", "p95", "x planner", "points", "MB", "max |diff| vs planner"):
        table.add_column(name, justify="left" if name == "form" else "right")
    planner = next((f for f in forms if f.name.startswith("planner:")), None)
    for f in forms:
        rel = "-" if planner is None else f"{f.p50 / planner.p50:.2f}"
        diff = "-" if f.max_abs_diff is None else f"{f.max_abs_diff:.2g}"
        table.add_row(
            f.name,
            _s(f.p50),
            _s(percentile(f.seconds, 0.95)),
            rel,
            f"{f.points:,}",
            f"{f.nbytes / MB:.2f}",
            diff,
        )
    console.print(table)


def print_runai(console: Console, results: Sequence[RunaiCaseResult]) -> None:
    table = Table(
        title="Run:ai pod metrics: gpulens vs hand-written PromQL on Prometheus "
        "(wall seconds; Prometheus CPU ms per request)"
    )
    for name in (
        "case",
        "data",
        "pod",
        "points",
        "queries",
        "runs",
        "API p50",
        "hand p50",
        "ratio (target)",
        "CPU API/hand",
        "CPU ratio",
        "gpulens CPU",
        "own plan p50",
        "MB API/hand",
        "meas./hist.",
        "types compared",
        "check",
    ):
        table.add_column(
            name,
            justify="left" if name in ("case", "data", "pod", "check") else "right",
            no_wrap=name == "pod",
        )
    for r in results:
        overhead = "-" if not r.replay_s else f"{percentile(r.replay_s, 0.5):.3f} ({r.overhead_ratio:.2f}x)"
        table.add_row(
            r.case.name,
            r.data,
            r.pod,
            f"{r.grid.points:,}",
            str(r.queries),
            str(len(r.api_s)),
            _s(r.api_p50),
            _s(r.base_p50),
            _against(r.ratio, r.case.target_ratio),
            f"{_cpu_ms(r.cpu.api)}/{_cpu_ms(r.cpu.base)}",
            _against(r.cpu.ratio, None),
            _cpu_ms(r.cpu.server),
            overhead,
            f"{r.api_bytes / MB:.2f}/{r.base_bytes / MB:.2f}",
            f"{r.measurements}/{r.histograms}",
            f"{r.types_with_values}/{len(pod_types(r.forms))}",
            _check(r.checks),
        )
    console.print(table)
    for r in results:
        console.print(
            f"{r.name}: first API request (the pod's layout look-ups not cached) {_s(r.api_first_s)} s;"
            " the server caches the layout for 60 s, then looks it up again inside a timed request."
        )


def print_archive(console: Console, r: ArchiveResult) -> None:
    if not r.available:
        console.print(f"Archived executions: not available ({r.reason}); figures n/a")
        return
    table = Table(title="Archived execution (24 h, 8 GPUs, completed) vs hand-written PromQL on Prometheus")
    for name in ("what", "gpulens", "hand-written", "ratio / value", "target", ""):
        table.add_column(name, justify="left" if name == "what" else "right")
    if r.same is not None and r.same.api_s:
        table.add_row(
            f"same request 24 h @ 15 s, {len(r.same.api_s)} rounds (p50)",
            _s(r.same.api_p50),
            _s(r.same.base_p50),
            f"{r.same.ratio:.2f}",
            f"<= {TARGET_SAME}",
            _verdict(r.same.ratio, TARGET_SAME),
        )
    if r.varied:
        steps = ", ".join(sorted({f"{v.window.step_ms // 1000}" for v in r.varied}, key=int))
        table.add_row(
            f"other step/window each round ({steps} s), median of {len(r.varied)} ratios",
            _s(percentile([v.api_s for v in r.varied], 0.5)),
            _s(percentile([v.base_s for v in r.varied], 0.5)),
            f"{r.varied_ratio:.2f}",
            f"<= {TARGET_VARIED}",
            _verdict(r.varied_ratio, TARGET_VARIED),
        )
    table.add_row(
        "gpulens archive <id> (wall s, process start included)",
        "n/a" if not math.isfinite(r.archive_s) else _s(r.archive_s),
        "",
        "",
        f"<= {TARGET_ARCHIVE_S}",
        _verdict(r.archive_s, TARGET_ARCHIVE_S),
    )
    bps = r.bytes_per_sample
    table.add_row(
        "bytes per archived sample (archive --stats --json)",
        "n/a" if not math.isfinite(bps) else f"{bps:.2f}",
        "",
        "",
        f"<= {TARGET_BYTES_PER_SAMPLE}",
        _verdict(bps, TARGET_BYTES_PER_SAMPLE),
    )
    console.print(table)
    if r.checks:
        console.print("[red]archive problems:[/red] " + "; ".join(r.checks[:5]))


def print_throughput(console: Console, results: Sequence[ThroughputResult]) -> None:
    table = Table(title="Throughput: one gpulens server process, concurrent keep-alive clients (seconds)")
    for name in (
        "endpoint",
        "request",
        "clients",
        "measured s",
        "requests",
        "req/s",
        "p50",
        "p95",
        "p99",
        "KB/resp",
        "errors",
        "CPU cores used",
    ):
        table.add_column(
            name, justify="left" if name in ("endpoint", "request", "CPU cores used") else "right"
        )
    for r in results:
        table.add_row(
            r.name,
            r.endpoint,
            str(r.clients),
            f"{r.duration_s:.0f}",
            f"{r.requests:,}",
            f"{r.rps:.1f}",
            _s(r.p50),
            _s(r.p95),
            _s(percentile(r.latencies, 0.99)),
            f"{r.nbytes / r.requests / 1e3:.1f}" if r.requests else "-",
            f"[{'green' if r.errors == 0 else 'red'}]{r.errors}[/]",
            ", ".join(f"{k} {v:.2f}" for k, v in r.cpu.items()),
        )
    console.print(table)
    for r in results:
        for sample in r.error_samples:
            console.print(f"[red]{r.name} error:[/red] {sample}")


def print_summary_cost(console: Console, r: SummaryCostResult) -> None:
    w = r.window
    step = "-" if w is None else f"{w.step_ms / 1000:g} s"
    points = "-" if w is None else f"{w.points:,}"
    table = Table(
        title="Summary of 30 days vs the metrics read of the same window and step, same server (seconds)"
    )
    columns = ("step", "points/series", "runs", "summary p50", "metrics p50", "ratio (target)", "MB", "first")
    for name in columns:
        table.add_column(name, justify="right")
    table.add_row(
        step,
        points,
        str(len(r.api_s)),
        _s(r.api_p50),
        _s(r.base_p50),
        _against(r.ratio, SUMMARY_TARGET),
        f"{r.api_bytes / MB:.2f}/{r.base_bytes / MB:.1f}",
        _s(r.first_s),
    )
    console.print(table)
    if r.checks:
        console.print("[red]summary problems:[/red] " + "; ".join(r.checks[:5]))
    stored = r.stored
    if stored is not None:
        table = Table(
            title="A stored summary (30 days, finished) vs computing the same summary, same server (seconds)"
        )
        for name in (
            "runs",
            "stored p50",
            "computed p50",
            "ratio (target)",
            "MB",
            "first (computed, stored)",
        ):
            table.add_column(name, justify="right")
        table.add_row(
            str(len(stored.api_s)),
            f"{stored.api_p50:.4f}",
            _s(stored.base_p50),
            "n/a"
            if not math.isfinite(stored.ratio)
            else f"{stored.ratio:.4f} (<= {STORED_TARGET:g} {_verdict(stored.ratio, STORED_TARGET)})",
            f"{stored.bytes / MB:.3f}",
            _s(stored.first_s),
        )
        console.print(table)
        if stored.checks:
            console.print("[red]stored summary problems:[/red] " + "; ".join(stored.checks[:5]))


def _mib(kib: int) -> str:
    return f"{kib / 1024:.0f}"


def print_load(console: Console, r: LoadResult) -> None:
    api, base = r.api, r.baseline
    if api is None:
        console.print("Load: not measured")
        return
    table = Table(
        title=f"Load: {r.clients} clients for {r.duration_s:.0f} s over a mix of routes, one gpulens server "
        "(seconds); hand-written: the same metrics requests' PromQL straight to Prometheus, as many clients"
    )
    for name in (
        "route",
        "weight",
        "requests",
        "req/s",
        "p50",
        "p99",
        "hand p50",
        "hand p99",
        "p50 ratio",
        "errors",
    ):
        table.add_column(name, justify="left" if name == "route" else "right")
    for route, seconds in api.by_route.items():
        hand = base.by_route.get(route) if base is not None else None
        table.add_row(
            route,
            str(r.weights.get(route, "")),
            f"{len(seconds):,}",
            f"{len(seconds) / api.duration_s:.1f}",
            _s(percentile(seconds, 0.5)),
            _s(percentile(seconds, 0.99)),
            "-" if hand is None else _s(percentile(hand, 0.5)),
            "-" if hand is None else _s(percentile(hand, 0.99)),
            "-" if hand is None else f"{r.route_ratio(route):.2f}",
            f"[{'green' if not api.route_errors.get(route) else 'red'}]{api.route_errors.get(route, 0)}[/]",
        )
    table.add_row(
        "all",
        "",
        f"{api.requests:,}",
        f"{api.rps:.1f}",
        _s(api.p50),
        _s(api.p99),
        "-" if base is None else _s(base.p50),
        "-" if base is None else _s(base.p99),
        f"{r.baselined_ratio():.2f} (metrics routes)",
        f"[{'green' if api.errors == 0 else 'red'}]{api.errors}[/]",
    )
    console.print(table)
    console.print(
        "CPU cores used, gpulens mix: "
        + ", ".join(f"{k} {v:.2f}" for k, v in api.cpu.items())
        + (
            ""
            if base is None
            else "; hand-written: " + ", ".join(f"{k} {v:.2f}" for k, v in base.cpu.items())
        )
    )
    per_request = [
        f"{who} {api.cpu[who] / api.rps * 1000:.0f} ms" for who in ("gpulens", "Prometheus") if who in api.cpu
    ]
    if base is not None and "Prometheus" in base.cpu and base.rps:
        per_request.append(f"hand-written: Prometheus {base.cpu['Prometheus'] / base.rps * 1000:.0f} ms")
    if api.rps:
        console.print("CPU per request: " + ", ".join(per_request))
    if r.rss_before is not None and r.rss_after is not None:
        console.print(
            f"server RSS: {_mib(r.rss_before.rss_kib)} MiB before, {_mib(r.rss_after.rss_kib)} MiB after "
            f"(growth {r.rss_growth_mib:.0f} MiB), peak {_mib(r.rss_after.peak_kib)} MiB "
            + ("during the load (VmHWM reset before it)" if r.peak_reset else "since the server started")
        )
    if r.server_counters:
        caches = sorted({k.rsplit(" ", 1)[0] for k in r.server_counters if k.startswith("cache ")})
        console.print(
            f"gpulens over the mix (warm-up included, {r.jobs_done:,} requests): "
            f"{r.server_counters.get('backend calls', 0):,.0f} backend calls "
            f"({r.backend_calls_per_request:.1f} a request); "
            + ", ".join(
                f"{c.removeprefix('cache ')} {r.server_counters.get(c + ' hit', 0):,.0f} hits / "
                f"{r.server_counters.get(c + ' miss', 0):,.0f} misses"
                for c in caches
            )
        )
    quarters = [(q, r.rss_at(q)) for q in (0.25, 0.5, 0.75, 1.0)]
    if all(kib is not None for _, kib in quarters):
        console.print(
            "server RSS during the load: "
            + ", ".join(f"{q:.0%} {_mib(kib or 0)} MiB" for q, kib in quarters)
            + " of the measured window"
        )
    for sample in api.error_samples:
        console.print(f"[red]load error:[/red] {sample}")
    for problem in r.checks:
        console.print(f"[red]load problem:[/red] {problem}")


def print_dashboard(console: Console, r: DashboardResult) -> None:
    if not r.available:
        console.print(f"Dashboard: not measured ({r.reason}); figures n/a")
        return
    table = Table(
        title="Dashboard: navigation to first drawn chart, headless chromium, 24 h execution, 8 GPUs "
        "(seconds)"
    )
    for name in ("page", "rounds", "p50", "min", "max", "target", ""):
        table.add_column(name, justify="left" if name == "page" else "right")
    for page, times in r.rounds.items():
        target = {STEP_15: TARGET_15S, LOADED: TARGET_LOADED}.get(page)
        table.add_row(
            page,
            str(len(times)),
            _s(percentile(times, 0.5)),
            _s(min(times, default=math.nan)),
            _s(max(times, default=math.nan)),
            "-" if target is None else f"<= {target}",
            _verdict(percentile(times, 0.5), target),
        )
    table.add_row(
        f"baseline: {STEP_15} metrics JSON, plain HTTP ({r.fetch_bytes / MB:.1f} MB)",
        str(len(r.fetch_s)),
        _s(r.fetch_p50),
        _s(min(r.fetch_s, default=math.nan)),
        _s(max(r.fetch_s, default=math.nan)),
        "",
        "",
    )
    console.print(table)


def print_summary(console: Console, figures: Sequence[Figure]) -> None:
    table = Table(title="Summary: every figure with its target (ratios: gpulens / hand-written, medians)")
    for name in ("figure", "value", "target", "verdict", "note"):
        table.add_column(name, justify="left" if name in ("figure", "note") else "right")
    colors = {"PASS": "green", "MISS": "red", "n/a": "yellow", "-": "dim"}
    for f in figures:
        table.add_row(f.name, f.text(), f.target_text(), f"[{colors[f.verdict]}]{f.verdict}[/]", f.note)
    console.print(table)
