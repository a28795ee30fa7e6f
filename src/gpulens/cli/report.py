"""`gpulens report EXECUTION_ID`: the execution's summary (the `/summary` endpoint) for people.

In a terminal: the headline (the biggest findings by the GPU time they concern), utilization bars, a
per-GPU table, the receipt (GPU-hours, and money when priced) and the findings grouped by kind, the
biggest few of each (`--full`: every one with its message), so a long noisy run still fits a screen or
two. With `--json` exactly what the API answers; with `--markdown` or `--html` a self-contained
document of the same structure (the HTML asks nothing from anywhere). Like `gpulens metrics`, the
services run in-process over the embedded store (`GPULENS_DATA_DIR`), Prometheus (`--prometheus-url`),
or the demo (`--demo`).
"""

from __future__ import annotations

import html
import re
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any

import anyio
import typer
from rich.console import Console, Group, RenderableType
from rich.padding import Padding
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from gpulens.cli.common import (
    CLI_ADMIN,
    DatabaseOpt,
    DemoOpt,
    PrometheusOpt,
    fail,
    load_settings,
    out_console,
    registry_for,
)
from gpulens.cli.metrics import human
from gpulens.domain import catalog as c
from gpulens.domain.errors import GpulensError
from gpulens.domain.timeparse import human_duration, parse_timestamp_ms

if TYPE_CHECKING:
    from gpulens.api.deps import AppContext
    from gpulens.config import Settings
    from gpulens.storage.registry import Registry

SEVERITY_STYLE = {"critical": "bold red", "warning": "yellow", "info": "cyan"}
SEVERITY_MARK = {"critical": "✖", "warning": "▲", "info": "●"}
UNITS = {m.lyceum: m.unit for m in c.LYCEUM_METRICS}


# -- the services, in-process ----------------------------------------------------------------------


@contextmanager
def in_process(prometheus_url: str | None, database: str | None, demo: bool = False) -> Iterator[AppContext]:
    """The API's services over the embedded store, Prometheus, or the demo (its store and registry);
    closed on leaving. Domain errors inside the block become one red line (exit 1)."""
    from gpulens.api.app import build_context, make_backend  # the API stack only when it is used
    from gpulens.backends.base import MetricsBackend
    from gpulens.backends.embedded import EmbeddedBackend
    from gpulens.storage.samples import SampleStore

    if demo:  # the store and registry `gpulens demo` serves (built here on first use)
        from gpulens.demo import DemoError, prepare

        base = load_settings()
        try:
            env = prepare(base.data_dir / "demo")
        except DemoError as exc:
            fail(str(exc), 2)
        with env:
            ctx = build_context(env.settings(), env.registry, env.backend())
            try:
                yield ctx
            except GpulensError as exc:
                fail(exc.message)
        return
    settings = load_settings(prometheus_url=prometheus_url, database_url=database)
    with registry_for(database=database) as registry:
        store = None
        if settings.prometheus_url:
            backend: MetricsBackend = make_backend(settings)
        else:  # the embedded default: the store `gpulens serve` and `gpulens run` write
            store = SampleStore.from_path(settings.samples_path)
            backend = EmbeddedBackend(store)
        try:
            try:
                ctx = build_context(settings, registry, backend)
            except (ValueError, OSError) as exc:  # e.g. an unreadable GPULENS_JWT_PUBLIC_KEY
                fail(f"cannot read the metrics: {exc}", 2)
            yield ctx
        finally:
            anyio.run(backend.aclose)
            if store is not None:
                store.close()


def parse_bounds(start: str | None, end: str | None) -> tuple[int | None, int | None]:
    try:
        return (
            parse_timestamp_ms(start) if start else None,
            parse_timestamp_ms(end) if end else None,
        )
    except ValueError as exc:
        fail(str(exc), 2)


# -- per-GPU figures (the summary's perGpu) --------------------------------------------------------


@dataclass(frozen=True, slots=True)
class GpuFigures:
    """One GPU's means and peaks, as the summary's `perGpu` gives them."""

    gpu: str
    uuid: str
    stats: dict[str, dict[str, Any]]

    def mean(self, key: str) -> float | None:
        value = self.stats.get(key, {}).get("mean")
        return None if value is None else float(value)

    def peak(self, key: str) -> float | None:
        value = self.stats.get(key, {}).get("max")
        return None if value is None else float(value)


def gpu_figures(body: dict[str, Any]) -> list[GpuFigures]:
    return [GpuFigures(g["gpu"], g["uuid"], g["stats"]) for g in body.get("perGpu", [])]


def collect(
    ctx: AppContext, execution_id: str, start_ms: int | None, end_ms: int | None
) -> tuple[dict[str, Any], list[GpuFigures]]:
    from gpulens.api.lyceum.summary import to_json

    async def run() -> dict[str, Any]:
        found = await ctx.summaries.summaries.summary(CLI_ADMIN, execution_id, start_ms, end_ms)
        return to_json(found, execution_id)

    body = anyio.run(run)
    return body, gpu_figures(body)


# -- shared figures --------------------------------------------------------------------------------


def fmt(value: float | None, unit: str, digits: int = 1) -> str:
    if value is None:
        return "—"
    if unit in ("bytes", "bytes_per_second"):
        return human(value, unit)
    suffix = {"percent": " %", "celsius": " °C", "watt": " W", "megahertz": " MHz"}.get(unit, "")
    return f"{value:.{digits}f}{suffix}"


def duration(seconds: float) -> str:
    seconds = round(seconds)
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h} h {m:02d} min" if h else (f"{m} min {s:02d} s" if m else f"{s} s")


def span_seconds(body: dict[str, Any]) -> float:
    tr = body["timeRange"]
    return (parse_timestamp_ms(tr["end"]) - parse_timestamp_ms(tr["start"])) / 1000


@dataclass(frozen=True, slots=True)
class Bar:
    label: str
    percent: float | None  # 0..100 (None: no data)
    text: str


def bars(body: dict[str, Any]) -> list[Bar]:
    st = body["stats"]
    out = []
    for key, label in (
        ("gpuUtilizationPercent", "GPU utilization"),
        ("gpuMemoryUtilizationPercent", "GPU memory"),
        ("systemCpuUsagePercent", "host CPU"),
    ):
        s = st[key]
        text = (
            "no data"
            if s["mean"] is None
            else f"mean {s['mean']:.1f} %, p95 {s['p95']:.1f} %, max {s['max']:.1f} %"
        )
        out.append(Bar(label, s["mean"], text))
    power, limit = st["gpuPowerWatt"], st["gpuPowerLimitWatt"]
    if power["mean"] is not None and limit["mean"]:
        share = 100 * power["mean"] / limit["mean"]
        out.append(
            Bar("GPU power", share, f"mean {power['mean']:.0f} W of {limit['mean']:.0f} W ({share:.0f} %)")
        )
    ram, total = st["systemRamUsedBytes"], st["systemRamTotalBytes"]
    if ram["mean"] is not None and total["mean"]:
        share = 100 * ram["mean"] / total["mean"]
        out.append(
            Bar("host RAM", share, f"mean {human(ram['mean'], 'bytes')} of {human(total['mean'], 'bytes')}")
        )
    return out


@dataclass(frozen=True, slots=True)
class ReceiptRow:
    """A line of the receipt: GPU time, and its price when the execution is priced."""

    label: str
    depth: int  # 0: the whole, 1: its parts, 2: parts of the active time
    hours: str
    amount: str | None


# active + idle + idleHeld = total; input-bound and throttled time are part of the active time
RECEIPT_LINES: tuple[tuple[str, str, int], ...] = (
    ("total", "GPU time", 0),
    ("active", "active", 1),
    ("inputBound", "of which input-bound", 2),
    ("throttled", "of which throttled", 2),
    ("idle", "idle", 1),
    ("idleHeld", "idle, memory held", 1),
)


def receipt(body: dict[str, Any]) -> list[ReceiptRow]:
    """The receipt in GPU-hours (the summary's gpuTime), with money beside it when priced; empty when
    the GPU count is unknown (no gpuTime, and then no cost either)."""
    cost = body.get("cost")
    hours = body.get("gpuTime")
    if hours is None:
        return []
    price = float(cost["gpuHourPrice"]) if cost else 0.0
    cur = currency(body)
    rows = []
    for key, label, depth in RECEIPT_LINES:
        h = hours[key]
        amount = None if cost is None or cost.get(key) is None else money_text(cost[key], cur)
        if depth == 0 and cost is not None:
            label = f"GPU time at {price:.2f} {cur} per GPU-hour"  # noqa: PLW2901 - the whole, priced
        if depth == 2 and h == 0:  # no input-bound or throttled time: nothing to say
            continue
        rows.append(ReceiptRow(label, depth, f"{h:,.2f} GPU-hours", amount))
    return rows


def useful_row(body: dict[str, Any]) -> ReceiptRow | None:
    """Useful GPU-hours (utilization x GPUs x time) and the price of each, when priced."""
    cost = body.get("cost")
    if cost is None:
        return None
    per = cost["perUsefulGpuHour"]
    amount = "—" if per is None else money_text(per, cost["currency"]) + " per GPU-hour"
    return ReceiptRow("useful", 0, f"{cost['usefulGpuHours']:,.2f} GPU-hours", amount)


def energy_line(body: dict[str, Any]) -> str | None:
    e = body["energy"]
    if e is None:
        return None
    line = f"{e['kwh']:.3f} kWh"
    if e["co2eKg"] is not None:
        line += f", {e['co2eKg']:.3f} kg CO2e at {e['carbonIntensityGPerKwh']:g} g/kWh"
    return line


GPU_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("util mean", "gpuUtilizationPercent", "mean"),
    ("memory mean", "gpuMemoryUtilizationPercent", "mean"),
    ("memory max", "gpuMemoryUtilizationPercent", "peak"),
    ("power mean", "gpuPowerWatt", "mean"),
    ("temp max", "gpuTemperatureCelsius", "peak"),
    ("SM clock mean", "gpuClockSmMhz", "mean"),
)


def gpu_rows(figures: list[GpuFigures]) -> list[list[str]]:
    rows = []
    for g in figures:
        cells = [g.gpu or "—", g.uuid or "—"]
        for _, key, how in GPU_COLUMNS:
            v = g.mean(key) if how == "mean" else g.peak(key)
            cells.append(fmt(v, UNITS[key], 0 if key in ("gpuPowerWatt", "gpuClockSmMhz") else 1))
        rows.append(cells)
    return rows


def finding_when(f: dict[str, Any]) -> str:
    start, end = parse_timestamp_ms(f["start"]), parse_timestamp_ms(f["end"])
    gpus = f" on GPU {', '.join(f['gpus'])}" if f["gpus"] else ""
    return f"{f['start']} → {f['end']} ({duration((end - start) / 1000)}){gpus}"


def title(body: dict[str, Any]) -> str:
    gpus = ", ".join(body["gpus"]) if body["gpus"] else f"all ({body['gpuCount']})"
    return (
        f"{body['executionId']} on {body['hostname']} · GPUs {gpus} · "
        f"{body['timeRange']['start']} → {body['timeRange']['end']} ({duration(span_seconds(body))}) · "
        f"step {body['stepSeconds']:g} s"
    )


# -- findings: impact, headline, groups ------------------------------------------------------------

HEADLINE_ITEMS = 3  # the biggest findings, by the GPU time they concern
GROUP_SHOWN = 3  # findings of one kind listed before "... and N more (--full)"


def kind_label(kind: str) -> str:
    return kind.replace("_", " ")


def impact_hours(f: dict[str, Any]) -> float:
    """The GPU-hours a finding concerns (0 when the summary does not say)."""
    return float((f.get("impact") or {}).get("gpuHours") or 0.0)


def impact_cost(f: dict[str, Any]) -> float | None:
    value = (f.get("impact") or {}).get("cost")
    return None if value is None else float(value)


def gpu_hours_text(hours: float) -> str:
    return f"{hours:.1f}" if hours >= 10 else f"{hours:.2f}"


def currency(body: dict[str, Any]) -> str:
    cost = body.get("cost")
    return str(cost["currency"]) if cost else ""


def money_text(value: float, cur: str) -> str:
    return f"{value:,.2f} {cur}".rstrip()


def finding_seconds(f: dict[str, Any]) -> float:
    """The finding's duration: its evidence's (the points it covers x the interval), else end - start."""
    seconds = (f.get("evidence") or {}).get("durationSeconds")
    if isinstance(seconds, int | float) and seconds >= 0:
        return float(seconds)
    return (parse_timestamp_ms(f["end"]) - parse_timestamp_ms(f["start"])) / 1000


def gpu_phrase(f: dict[str, Any], body: dict[str, Any]) -> str:
    """ "on all 4 GPUs" / "on both GPUs" (a finding about every GPU of the execution), "on GPUs 1, 3", or
    "" (no GPUs)."""
    gpus: list[str] = list(f["gpus"])
    count = int(body.get("gpuCount") or 0)
    whole = not gpus or (sorted(gpus) == sorted(body["gpus"]) if body["gpus"] else len(gpus) == count)
    if whole:
        if count > 1:
            return "on both GPUs" if count == 2 else f"on all {count} GPUs"
        return f"on GPU {gpus[0]}" if gpus else ("on its GPU" if count == 1 else "")
    return f"on GPU {gpus[0]}" if len(gpus) == 1 else f"on GPUs {', '.join(gpus)}"


def impact_text(f: dict[str, Any], body: dict[str, Any]) -> str:
    """ "2.65 GPU-hours, 6.63 USD" (the cost only when priced); "" when the finding concerns no GPU time."""
    hours = impact_hours(f)
    if hours <= 0:
        return ""
    text = f"{gpu_hours_text(hours)} GPU-hours"
    cost = impact_cost(f)
    return text if cost is None else f"{text}, {money_text(cost, currency(body))}"


def headline_text(f: dict[str, Any], body: dict[str, Any]) -> str:
    """One finding in a line: "7 h 12 min input bound on all 4 GPUs: 28.8 GPU-hours, 72.00 USD"."""
    what = " ".join(
        x
        for x in (
            human_duration(round(finding_seconds(f) * 1000)),
            kind_label(f["kind"]),
            gpu_phrase(f, body),
        )
        if x
    )
    impact = impact_text(f, body)
    return f"{what}: {impact}" if impact else what


def headline(body: dict[str, Any], limit: int = HEADLINE_ITEMS) -> list[dict[str, Any]]:
    """The biggest findings by impact (GPU-hours), the API's order among equals; at most `limit`."""
    return sorted(body["findings"], key=impact_hours, reverse=True)[:limit]


@dataclass(frozen=True, slots=True)
class KindGroup:
    """The findings of one kind, in the API's order, with their count and total impact."""

    kind: str
    severity: str
    findings: list[dict[str, Any]]

    @property
    def gpu_hours(self) -> float:
        return sum(impact_hours(f) for f in self.findings)

    @property
    def cost(self) -> float | None:
        costs = [impact_cost(f) for f in self.findings]
        return None if all(x is None for x in costs) else sum(x for x in costs if x is not None)

    def head(self, body: dict[str, Any]) -> str:
        """How many and their impact ("3 findings · 28.8 GPU-hours · 72.00 USD"); a lone finding's own
        when and impact."""
        n = len(self.findings)
        if n == 1:
            return finding_item(self.findings[0], body)
        parts = [f"{n} finding" + ("" if n == 1 else "s")]
        if self.gpu_hours > 0:
            parts.append(f"{gpu_hours_text(self.gpu_hours)} GPU-hours")
            if self.cost is not None:
                parts.append(money_text(self.cost, currency(body)))
        return " · ".join(parts)


def kind_groups(body: dict[str, Any]) -> list[KindGroup]:
    """One group per kind, in the order the API first lists each kind (severity, then impact)."""
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for f in body["findings"]:
        by_kind.setdefault(f["kind"], []).append(f)
    return [
        KindGroup(kind, min((f["severity"] for f in fs), key=c.SEVERITY_RANK.__getitem__), fs)
        for kind, fs in by_kind.items()
    ]


def finding_item(f: dict[str, Any], body: dict[str, Any]) -> str:
    """One finding of a group: when, on which GPUs, and its impact."""
    start, end = f["start"], f["end"]
    if start[:10] == end[:10]:  # the same day: the end's time only
        end = end[11:]
    parts = [f"{start} → {end} ({duration(finding_seconds(f))})"]
    where = gpu_phrase(f, body)
    if where:
        parts[0] += f" {where}"
    impact = impact_text(f, body)
    if impact:
        parts.append(impact)
    return " · ".join(parts)


def shown(group: KindGroup, full: bool) -> tuple[list[dict[str, Any]], int]:
    """The findings of a group to list under its head, and how many are left out (--full lists them
    all); a lone finding is its head."""
    if len(group.findings) == 1:
        return [], 0
    if full or len(group.findings) <= GROUP_SHOWN + 1:  # "and 1 more" would take the line it saves
        return group.findings, 0
    return group.findings[:GROUP_SHOWN], len(group.findings) - GROUP_SHOWN


def more_line(n: int) -> str:
    return f"… and {n} more (--full)"


# -- terminal --------------------------------------------------------------------------------------


def _bar_text(percent: float | None, width: int = 30) -> Text:
    if percent is None:
        return Text("·" * width, style="dim")
    filled = max(0, min(width, round(percent / 100 * width)))
    style = "green" if percent >= 60 else ("yellow" if percent >= 30 else "red")
    return Text("█" * filled, style=style) + Text("░" * (width - filled), style="dim")


NO_FINDINGS = "no findings: nothing to improve was found in this window"


def render_terminal(
    body: dict[str, Any], figures: list[GpuFigures], console: Console, full: bool = False
) -> None:
    """Title, headline, utilization, per-GPU table, receipt, then the findings by kind (the biggest
    few of each unless `full`)."""
    console.print(Text(title(body), style="bold"))
    top = headline(body)
    if top:
        lines = [
            Text("• ", style=SEVERITY_STYLE.get(f["severity"], "")) + Text(headline_text(f, body))
            for f in top
        ]
        console.print(Panel(Group(*lines), title="headline", title_align="left"))
    else:
        console.print(Text(NO_FINDINGS, style="green"))
    grid = Table.grid(padding=(0, 2))
    grid.add_column()
    grid.add_column()
    grid.add_column()
    for b in bars(body):
        grid.add_row(b.label, _bar_text(b.percent), b.text)
    console.print(Panel(grid, title="utilization", title_align="left"))
    if figures:
        table = Table(title="per GPU", title_justify="left")
        table.add_column("gpu")
        table.add_column("uuid")
        for header, _, _ in GPU_COLUMNS:
            table.add_column(header, justify="right")
        for row in gpu_rows(figures):
            table.add_row(*row)
        console.print(table)
    rows = receipt(body)
    energy = energy_line(body)
    useful = useful_row(body)
    if rows or energy:
        priced = any(r.amount is not None for r in rows)
        rec = Table.grid(padding=(0, 4))
        rec.add_column()
        rec.add_column(justify="right")
        if priced:
            rec.add_column(justify="right")
        for r in rows:
            label = Text("  " * r.depth + r.label, style="bold" if r.depth == 0 else "")
            if priced:
                rec.add_row(label, r.hours, r.amount or "—")
            else:
                rec.add_row(label, r.hours)
        if useful:
            rec.add_row(useful.label, useful.hours, useful.amount)
        if energy:
            rec.add_row("energy", energy)
        console.print(Panel(rec, title="receipt", title_align="left", expand=False))
    notes: list[RenderableType] = []

    def indented(text: str, indent: int, style: str = "") -> Padding:  # wrapped lines keep the indent
        return Padding(Text(text, style=style), (0, 0, 0, indent))

    for group in kind_groups(body):
        style = SEVERITY_STYLE.get(group.severity, "")
        notes.append(
            Text(f"{SEVERITY_MARK.get(group.severity, '-')} {kind_label(group.kind)} ", style=style)
            + Text(f"[{group.severity}] ", style=style)
            + Text(group.head(body), style="bold")
        )
        listed, more = shown(group, full)
        if not (full and listed):  # the message of the kind's biggest finding, once
            notes.append(indented(group.findings[0]["message"], 2))
        for f in listed:
            notes.append(indented("· " + finding_item(f, body), 2, "dim"))
            if full:
                notes.append(indented(f["message"], 4))
        if more:
            notes.append(indented(more_line(more), 2, "dim"))
    if notes:
        console.print(Panel(Group(*notes), title="findings", title_align="left"))


# -- documents -------------------------------------------------------------------------------------


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _md_text(text: str) -> str:
    """Running Markdown text: characters that would start markup are escaped."""
    for ch in "\\`*_[]<>#|":
        text = text.replace(ch, "\\" + ch)
    return text


def render_markdown(body: dict[str, Any], figures: list[GpuFigures], full: bool = False) -> str:
    out = [f"# Execution {body['executionId']}", "", _md_cell(title(body)), "", "## Headline", ""]
    top = headline(body)
    out += [f"- {_md_text(headline_text(f, body))}" for f in top] or [
        "No findings: nothing to improve was found."
    ]
    out += ["", "## Utilization", "", "| | | |", "|---|---|---|"]
    for b in bars(body):
        width = 20
        filled = 0 if b.percent is None else max(0, min(width, round(b.percent / 100 * width)))
        out.append(f"| {b.label} | `{'█' * filled}{'░' * (width - filled)}` | {_md_cell(b.text)} |")
    if figures:
        out += ["", "## Per GPU", ""]
        headers = ["gpu", "uuid", *(h for h, _, _ in GPU_COLUMNS)]
        out.append("| " + " | ".join(headers) + " |")
        out.append("|" + "|".join("---" if i < 2 else "---:" for i in range(len(headers))) + "|")
        out += ["| " + " | ".join(_md_cell(x) for x in row) + " |" for row in gpu_rows(figures)]
    rows = receipt(body)
    energy = energy_line(body)
    useful = useful_row(body)
    if rows or energy:
        priced = any(r.amount is not None for r in rows)
        out += ["", "## Receipt", ""]
        out += ["| | GPU-hours | cost |", "|---|---:|---:|"] if priced else ["| | GPU-hours |", "|---|---:|"]
        for r in rows:
            label = "&emsp;" * r.depth + _md_cell(r.label)
            if r.depth == 0:
                label = f"**{label}**"
            out.append(
                f"| {label} | {_md_cell(r.hours)} |" + (f" {_md_cell(r.amount or '—')} |" if priced else "")
            )
        if useful:
            out.append(f"| {useful.label} | {_md_cell(useful.hours)} | {_md_cell(useful.amount or '—')} |")
        if energy:
            out.append(f"| energy | {_md_cell(energy)} |" + (" |" if priced else ""))
    out += ["", "## Findings", ""]
    groups = kind_groups(body)
    if not groups:
        out.append("No findings: nothing to improve was found in this window.")
    for group in groups:
        out += [f"### {kind_label(group.kind)} ({group.severity}): {_md_text(group.head(body))}", ""]
        listed, more = shown(group, full)
        if not (full and listed):
            out += [f"> {_md_text(group.findings[0]['message'])}", ""]
        for f in listed:
            out.append(
                f"- {_md_text(finding_item(f, body))}" + (f"  \n  {_md_text(f['message'])}" if full else "")
            )
        if more:
            out.append(f"- {_md_text(more_line(more))}")
        out.append("")
    return "\n".join(out).rstrip() + "\n"


_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2rem auto;max-width:960px;
color:#1b1f24;padding:0 1rem}
h1{font-size:1.4rem}h2{font-size:1.1rem;margin-top:2rem}h3{font-size:1rem;margin:1.2rem 0 .3rem}
.sub,.head{color:#57606a}.head{font-weight:400}
table{border-collapse:collapse;margin:.5rem 0}td,th{padding:.3rem .7rem;border-bottom:1px solid #d0d7de;
text-align:left}th{background:#f6f8fa}td.num{text-align:right;font-variant-numeric:tabular-nums}
tr.total td{font-weight:600}
.bar{width:240px;height:12px;background:#eaeef2;border-radius:3px;overflow:hidden}
.bar div{height:100%}.good{background:#2da44e}.mid{background:#d4a72c}.low{background:#cf222e}
.headline li{font-size:1.05rem;margin:.2rem 0}
.note{border-left:4px solid #0969da;background:#f6f8fa;padding:.5rem .8rem;margin:.6rem 0}
.note.warning{border-color:#d4a72c}.note.critical{border-color:#cf222e}.when{color:#57606a;font-size:.9em}
.note ul{margin:.3rem 0 0;padding-left:1.2rem}.note p{margin:.2rem 0}
"""


def render_html(body: dict[str, Any], figures: list[GpuFigures], full: bool = False) -> str:
    e = html.escape
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>gpulens report {e(body['executionId'])}</title>",
        f"<style>{_CSS}</style></head><body>",
        f"<h1>Execution {e(body['executionId'])}</h1>",
        f'<p class="sub">{e(title(body))}</p>',
        "<h2>Headline</h2>",
    ]
    top = headline(body)
    if top:
        parts.append('<ul class="headline">')
        parts += [f'<li data-kind="{e(f["kind"])}">{e(headline_text(f, body))}</li>' for f in top]
        parts.append("</ul>")
    else:
        parts.append("<p>No findings: nothing to improve was found.</p>")
    parts.append("<h2>Utilization</h2><table>")
    for b in bars(body):
        pct = 0.0 if b.percent is None else max(0.0, min(100.0, b.percent))
        cls = "good" if pct >= 60 else ("mid" if pct >= 30 else "low")
        parts.append(
            f'<tr><td>{e(b.label)}</td><td><div class="bar"><div class="{cls}" style="width:{pct:.1f}%">'
            f"</div></div></td><td>{e(b.text)}</td></tr>"
        )
    parts.append("</table>")
    if figures:
        parts.append("<h2>Per GPU</h2><table><tr><th>gpu</th><th>uuid</th>")
        parts += [f"<th>{e(h)}</th>" for h, _, _ in GPU_COLUMNS]
        parts.append("</tr>")
        for row in gpu_rows(figures):
            cells = [f"<td>{e(row[0])}</td>", f"<td>{e(row[1])}</td>"]
            cells += [f'<td class="num">{e(x)}</td>' for x in row[2:]]
            parts.append("<tr>" + "".join(cells) + "</tr>")
        parts.append("</table>")
    rows = receipt(body)
    energy = energy_line(body)
    useful = useful_row(body)
    if rows or energy:
        priced = any(r.amount is not None for r in rows)
        parts.append("<h2>Receipt</h2><table>")
        parts.append("<tr><th></th><th>GPU-hours</th>" + ("<th>cost</th>" if priced else "") + "</tr>")
        for r in rows:
            cls = ' class="total"' if r.depth == 0 else ""
            label = "&emsp;" * r.depth + e(r.label)
            amount = f'<td class="num">{e(r.amount or "—")}</td>' if priced else ""
            parts.append(f'<tr{cls}><td>{label}</td><td class="num">{e(r.hours)}</td>{amount}</tr>')
        if useful:
            parts.append(
                f'<tr><td>{e(useful.label)}</td><td class="num">{e(useful.hours)}</td>'
                f'<td class="num">{e(useful.amount or "—")}</td></tr>'
            )
        if energy:
            parts.append(
                f'<tr><td>energy</td><td class="num">{e(energy)}</td>'
                + ("<td></td>" if priced else "")
                + "</tr>"
            )
        parts.append("</table>")
    parts.append("<h2>Findings</h2>")
    groups = kind_groups(body)
    if not groups:
        parts.append("<p>No findings: nothing to improve was found in this window.</p>")
    for group in groups:
        listed, more = shown(group, full)
        parts.append(
            f'<div class="note {e(group.severity)}" data-kind="{e(group.kind)}">'
            f"<strong>{e(kind_label(group.kind))}</strong> ({e(group.severity)}) "
            f'<span class="head">{e(group.head(body))}</span>'
        )
        if not (full and listed):
            parts.append(f"<p>{e(group.findings[0]['message'])}</p>")
        if listed:
            parts.append("<ul>")
        for f in listed:
            message = f"<br>{e(f['message'])}" if full else ""
            parts.append(f'<li><span class="when">{e(finding_item(f, body))}</span>{message}</li>')
        if more:
            parts.append(f'<li class="when">{e(more_line(more))}</li>')
        parts.append("</ul></div>" if listed else "</div>")
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def api_json(body: dict[str, Any]) -> str:
    """The body as the summary route sends it: its `to_json` document encoded as the route encodes it
    (service/summary_store.encode, also what a stored summary is)."""
    from gpulens.service.summary_store import encode

    return encode(body).decode()


def finding_lines(settings: Settings, registry: Registry, execution_id: str) -> list[str]:
    """One stderr line per finding of a finished local execution (`gpulens run`), from the embedded
    store; a failure to compute them is one line too, never an error of the run."""
    from gpulens.api.app import build_context
    from gpulens.api.lyceum.summary import to_json
    from gpulens.backends.embedded import EmbeddedBackend
    from gpulens.storage.samples import SampleStore

    try:
        store = SampleStore.from_path(settings.samples_path)
        try:
            service = build_context(settings, registry, EmbeddedBackend(store)).summaries.summaries

            async def run() -> dict[str, Any]:
                return to_json(await service.summary(CLI_ADMIN, execution_id, None, None), execution_id)

            body = anyio.run(run)
        finally:
            store.close()
    except Exception as exc:
        return [f"gpulens: no findings ({type(exc).__name__}: {exc})"]
    return [
        f"gpulens: {f['kind']} ({f['severity']}) {finding_when(f)}: {f['message']}" for f in body["findings"]
    ]


# -- the command -----------------------------------------------------------------------------------


def slurm_executions(registry: Registry, job: str, cluster: str | None) -> list[tuple[str, str]]:
    """(execution id, node) of every node of Slurm job `job` (12, an array task 10_3 or a whole
    array 10, a heterogeneous job 20), from the workloads `gpulens discover slurm` registered."""
    from gpulens.planning.slurm import SLURM_POD_NAMESPACE_PREFIX, pod_namespace

    names = (f"slurm-{job}", f"slurm-{job} ", f"slurm-{job}_")
    namespace = pod_namespace(cluster) if cluster else None
    workloads, _ = registry.list_workloads(limit=None)
    found: list[tuple[str, str]] = []
    for w in sorted(workloads, key=lambda w: w.name):
        if not (w.name == names[0] or w.name.startswith(names[1:])):
            continue
        pods, _ = registry.list_pods(w.workload_id, limit=None)
        for pod in pods:
            if not pod.namespace.startswith(SLURM_POD_NAMESPACE_PREFIX):
                continue
            if namespace is None or pod.namespace == namespace:
                found.append((pod.pod_id, pod.node or "?"))
    return found


def hooked_executions(registry: Registry, cluster: str, job: int, hostlist: str) -> list[tuple[str, str]]:
    """(execution id, node) of the job's nodes registered under the ids the hooks and discovery both
    compute (a UUIDv5 of cluster, job and node)."""
    from gpulens.planning.slurm import execution_uuid, expand_hostlist

    try:
        names = expand_hostlist(hostlist)
    except ValueError as exc:
        fail(f"--nodes: {exc}", 2)
    found = [(execution_uuid(cluster, job, node), node) for node in names]
    return [(e, node) for e, node in found if registry.get_execution(e) is not None]


def report(
    execution_id: Annotated[
        str | None, typer.Argument(help="The execution's id (or --slurm JOBID)", show_default=False)
    ] = None,
    slurm: Annotated[
        str | None,
        typer.Option(
            "--slurm",
            metavar="JOBID",
            help="Every node of this Slurm job (12, 10_3, an array's or heterogeneous job's id), as "
            "`gpulens discover slurm` registered it",
        ),
    ] = None,
    cluster: Annotated[
        str | None,
        typer.Option("--cluster", help="With --slurm: the job's Slurm cluster, where several are registered"),
    ] = None,
    hostlist: Annotated[
        str | None,
        typer.Option(
            "--nodes",
            metavar="HOSTLIST",
            help="With --slurm and --cluster: the job's nodes (a Slurm hostlist: $SLURM_JOB_NODELIST), "
            "to find the executions deploy/slurm's hooks registered where discovery does not run",
        ),
    ] = None,
    start: Annotated[str | None, typer.Option(help="RFC 3339 start (default: the execution's start)")] = None,
    end: Annotated[str | None, typer.Option(help="RFC 3339 end (default: its end, or now)")] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print exactly what the summary API answers")
    ] = False,
    as_markdown: Annotated[bool, typer.Option("--markdown", help="A Markdown document")] = False,
    as_html: Annotated[bool, typer.Option("--html", help="A self-contained HTML page")] = False,
    full: Annotated[
        bool,
        typer.Option("--full", help="Every finding with its message (default: the biggest few of each kind)"),
    ] = False,
    notify: Annotated[
        bool,
        typer.Option(
            "--notify",
            help="Also send the report to its owner: the org's per-user channels ({user} in the URL) and "
            "each --channel, delivered by `gpulens serve` (for a job-end hook)",
        ),
    ] = False,
    channel: Annotated[
        list[str] | None,
        typer.Option("--channel", help="With --notify: a channel id of the org to send the report to too"),
    ] = None,
    prometheus_url: PrometheusOpt = None,
    database: DatabaseOpt = None,
    demo: DemoOpt = False,
) -> None:
    """How an execution used its hardware: the headline (its biggest findings), utilization, per-GPU
    figures, the receipt and the findings by kind."""
    if sum((as_json, as_markdown, as_html)) > 1:
        fail("choose one of --json, --markdown, --html", 2)
    if channel and not notify:
        fail("--channel goes with --notify", 2)
    if notify and demo:
        fail("--notify sends through a registry's channels: not with --demo", 2)
    if (execution_id is None) == (slurm is None):
        fail("give an execution id or --slurm JOBID (one of them)", 2)
    if slurm is not None and not _SLURM_JOB.fullmatch(slurm):
        fail(f"--slurm: not a Slurm job id: {slurm!r} (12, 10_3 or 20+1)", 2)
    start_ms, end_ms = parse_bounds(start, end)
    channels = channel or []
    if hostlist is not None and (slurm is None or not slurm.isdigit() or not cluster):
        fail("--nodes goes with --slurm JOBID (a plain job id) and --cluster", 2)
    if slurm is not None:
        reports = report_slurm(
            slurm,
            cluster,
            hostlist,
            start_ms,
            end_ms,
            as_json,
            as_markdown,
            as_html,
            full,
            prometheus_url,
            database,
        )
        if notify:
            job: dict[str, str | None] = {"cluster": cluster or load_settings().slurm_cluster, "id": slurm}
            with in_process(prometheus_url, database) as ctx:
                queue_report(ctx, reports, job, channels)
        return
    assert execution_id is not None
    with in_process(prometheus_url, database, demo) as ctx:
        body, figures = collect(ctx, execution_id, start_ms, end_ms)
        if notify:
            queue_report(ctx, [(execution_id, None, body)], None, channels)
    if as_json:
        sys.stdout.write(api_json(body) + "\n")
    elif as_markdown:
        sys.stdout.write(render_markdown(body, figures, full))
    elif as_html:
        sys.stdout.write(render_html(body, figures, full))
    else:
        render_terminal(body, figures, out_console(), full)


_SLURM_JOB = re.compile(r"[0-9]{1,10}(?:[_+][0-9]{1,10})?")


def report_slurm(
    job: str,
    cluster: str | None,
    hostlist: str | None,
    start_ms: int | None,
    end_ms: int | None,
    as_json: bool,
    as_markdown: bool,
    as_html: bool,
    full: bool,
    prometheus_url: str | None,
    database: str | None,
) -> list[tuple[str, str | None, dict[str, Any]]]:
    """`report --slurm JOBID`: one report per node of the job, in node order; `--json` one document
    {"slurmJob", "executions": [{"executionId", "node", "summary"}]}. Returns (execution id, node,
    summary document) of each node."""
    settings = load_settings(prometheus_url=prometheus_url, database_url=database)
    with registry_for(database) as registry:
        nodes = slurm_executions(registry, job, cluster or settings.slurm_cluster)
        if not nodes and hostlist and cluster:
            nodes = hooked_executions(registry, cluster, int(job), hostlist)
    if not nodes:
        fail(f"no registered executions of Slurm job {job} (run `gpulens discover slurm` first)")
    reports = []
    with in_process(prometheus_url, database) as ctx:
        for execution_id, node in nodes:
            body, figures = collect(ctx, execution_id, start_ms, end_ms)
            reports.append((execution_id, node, body, figures))
    if as_json:
        import json

        items = [{"executionId": e, "node": n, "summary": json.loads(api_json(b))} for e, n, b, _ in reports]
        sys.stdout.write(json.dumps({"slurmJob": job, "executions": items}) + "\n")
        return [(e, n, b) for e, n, b, _ in reports]
    console = out_console()
    for execution_id, node, body, figures in reports:
        heading = f"Slurm job {job} on {node} (execution {execution_id})"
        if as_markdown:
            sys.stdout.write(f"# {heading}\n\n" + render_markdown(body, figures, full) + "\n")
        elif as_html:
            sys.stdout.write(render_html(body, figures, full))
        else:
            console.rule(heading)
            render_terminal(body, figures, console, full)
    return [(e, n, b) for e, n, b, _ in reports]


def queue_report(
    ctx: AppContext,
    parts: Sequence[tuple[str, str | None, dict[str, Any]]],
    job: dict[str, str | None] | None,
    channels: list[str],
) -> None:
    """Store the report event with one pending delivery per channel (`serve` sends them, with its
    retries); say where it goes on stderr, or fail when it goes nowhere."""
    from datetime import UTC, datetime

    from gpulens.service.alerts.job_report import execution_part, report_channels, report_event

    first = ctx.registry.get_execution(parts[0][0])
    assert first is not None  # its summary was just computed
    owners = {e.user for e in (ctx.registry.get_execution(p[0]) for p in parts) if e is not None}
    user = first.user if len(owners) == 1 else None
    store = ctx.alerts.store
    known = {c.channel_id for c in store.channels(first.org)}
    unknown = [c for c in channels if c not in known]
    if unknown:
        fail(f"--channel: no channel {unknown[0]} in org {first.org}", 2)
    chosen = report_channels(store.channels(first.org), user, channels)
    if not chosen:
        who = f"user {user}" if user else "an execution without a user"
        fail(
            f"--notify: nowhere to send the report of {who} "
            f"(no per-user channel in org {first.org}, no --channel)"
        )
    public_url = ctx.settings.public_url
    now = datetime.now(UTC)
    event = report_event(
        first.org, user, job, [execution_part(body, node, public_url) for _, node, body in parts], now
    )
    store.add_event(event, [c.channel_id for c in chosen], now)
    where = ", ".join(c.channel_id for c in chosen)
    print(f"report {event.event_id} queued for {user or 'no user'} to {where}", file=sys.stderr)
