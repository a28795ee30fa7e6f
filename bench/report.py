"""Rich tables for the results."""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Console
from rich.table import Table

from bench.cases import CaseResult, FormResult, percentile
from bench.load import ThroughputResult
from bench.runai import RunaiCaseResult

MB = 1e6


def _s(value: float) -> str:
    return f"{value:.3f}"


def print_cases(console: Console, results: Sequence[CaseResult], rss_target_mib: float) -> None:
    table = Table(title="gpulens metrics endpoint vs raw Prometheus (1 host, 8 GPUs, 12 series; seconds)")
    for name, justify in (
        ("case", "left"),
        ("points/series", "right"),
        ("chunks", "right"),
        ("queries", "right"),
        ("runs", "right"),
        ("API p50", "right"),
        ("API p95", "right"),
        ("Prom p50", "right"),
        ("Prom p95", "right"),
        ("ratio p50", "right"),
        ("target", "right"),
        ("API MB", "right"),
        ("Prom MB", "right"),
        ("check", "left"),
    ):
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    for r in results:
        target = r.case.target_ratio
        ratio = f"{r.ratio:.2f}"
        if target is not None:
            ratio = f"[{'green' if r.ratio <= target else 'red'}]{ratio}[/]"
        table.add_row(
            r.case.name,
            f"{r.window.points:,}",
            str(r.chunks),
            str(r.queries),
            str(len(r.api_s)),
            _s(r.api_p50),
            _s(percentile(r.api_s, 0.95)),
            _s(r.base_p50),
            _s(percentile(r.base_s, 0.95)),
            ratio,
            "-" if target is None else f"<= {target}",
            f"{r.api_bytes / MB:.1f}",
            f"{r.base_bytes / MB:.1f}",
            "ok" if not r.checks else "[red]" + "; ".join(r.checks[:3]) + "[/]",
        )
    console.print(table)
    for r in results:
        growth = r.rss_growth_mib
        if growth is None:
            continue
        assert r.rss_before_kib is not None and r.rss_peak_kib is not None
        color = "green" if growth <= rss_target_mib else "red"
        console.print(
            f"server RSS, {r.case.name}: {r.rss_before_kib / 1024:.0f} MiB before, peak "
            f"{r.rss_peak_kib / 1024:.0f} MiB, growth [{color}]{growth:.0f} MiB[/] "
            f"(target <= {rss_target_mib:.0f}), "
            f"{(r.rss_after_kib or 0) / 1024:.0f} MiB after"
        )


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


def missed_targets(results: Sequence[CaseResult], rss_target_mib: float) -> list[str]:
    out = []
    for r in results:
        if r.case.target_ratio is not None and r.ratio > r.case.target_ratio:
            out.append(f"{r.case.name}: ratio {r.ratio:.2f} > {r.case.target_ratio}")
        growth = r.rss_growth_mib
        if growth is not None and growth > rss_target_mib:
            out.append(f"{r.case.name}: RSS growth {growth:.0f} MiB > {rss_target_mib:.0f} MiB")
    return out


def print_runai(console: Console, results: Sequence[RunaiCaseResult]) -> None:
    table = Table(title="Run:ai pod metrics endpoint vs raw Prometheus (same PromQL, thread pool; seconds)")
    for name, justify in (
        ("case", "left"),
        ("pod", "left"),
        ("points", "right"),
        ("queries", "right"),
        ("runs", "right"),
        ("API p50", "right"),
        ("API p95", "right"),
        ("Prom p50", "right"),
        ("Prom p95", "right"),
        ("ratio p50", "right"),
        ("target", "right"),
        ("API MB", "right"),
        ("Prom MB", "right"),
        ("meas./hist.", "right"),
        ("check", "left"),
    ):
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    for r in results:
        target = r.case.target_ratio
        ratio = f"{r.ratio:.2f}"
        if target is not None:
            ratio = f"[{'green' if r.ratio <= target else 'red'}]{ratio}[/]"
        table.add_row(
            r.case.name,
            r.pod,
            f"{r.plan.grid.points:,}",
            str(len(r.plan.queries)),
            str(len(r.api_s)),
            _s(r.api_p50),
            _s(percentile(r.api_s, 0.95)),
            _s(r.base_p50),
            _s(percentile(r.base_s, 0.95)),
            ratio,
            "-" if target is None else f"<= {target}",
            f"{r.api_bytes / MB:.2f}",
            f"{r.base_bytes / MB:.2f}",
            f"{r.measurements}/{r.histograms}",
            "ok" if not r.checks else "[red]" + "; ".join(r.checks[:3]) + "[/]",
        )
    console.print(table)
    for r in results:
        console.print(
            f"{r.case.name}: histogram-name look-ups: {len(r.plan.lookups)} x /api/v1/series, "
            f"p50 {_s(percentile(r.lookup_s, 0.5))} s from the pool; the server caches the names for 60 s, "
            f"so its timed requests make none and the timed baseline leaves them out "
            f"(counted in: ratio {r.ratio_with_lookups:.2f}). First API request, names not cached: "
            f"{_s(r.api_first_s)} s."
        )


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


def missed_runai(results: Sequence[RunaiCaseResult], loads: Sequence[ThroughputResult]) -> list[str]:
    out = [
        f"{r.case.name}: ratio {r.ratio:.2f} > {r.case.target_ratio}"
        for r in results
        if r.case.target_ratio is not None and r.ratio > r.case.target_ratio
    ]
    out.extend(f"{r.name}: {r.errors} errors (target 0)" for r in loads if r.errors)
    return out
