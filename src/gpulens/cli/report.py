"""`gpulens report EXECUTION_ID`: the execution's summary (the `/summary` endpoint) for people.

In a terminal: utilization bars, a per-GPU table, the cost receipt and the findings as notes. With
`--json` exactly what the API answers; with `--markdown` or `--html` a self-contained document (the
HTML asks nothing from anywhere). Like `gpulens metrics`, the services run in-process over the
embedded store (`GPULENS_DATA_DIR`), Prometheus (`--prometheus-url`), or the demo (`--demo`).
"""

from __future__ import annotations

import html
import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any

import anyio
import typer
from rich.console import Console, Group
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
from gpulens.domain.timeparse import parse_timestamp_ms

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
    from gpulens.service.summary import SummaryService

    async def run() -> dict[str, Any]:
        service = SummaryService(ctx.metrics, ctx.settings.prices, ctx.settings.carbon_intensity)
        return to_json(await service.summary(CLI_ADMIN, execution_id, start_ms, end_ms), execution_id)

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


def receipt(body: dict[str, Any]) -> list[tuple[str, str]]:
    """(line, amount) of the cost receipt; empty without prices."""
    cost = body["cost"]
    if cost is None:
        return []
    cur = cost["currency"]

    def money(v: float | None) -> str:
        return "—" if v is None else f"{v:,.2f} {cur}"

    return [
        (f"{cost['gpuHours']:.2f} GPU-hours x {cost['gpuHourPrice']:.2f} {cur}", money(cost["total"])),
        ("  active", money(cost["active"])),
        ("  idle", money(cost["idle"])),
        ("  idle, memory held", money(cost["idleHeld"])),
        ("  input-bound", money(cost["inputBound"])),
        ("  throttled", money(cost["throttled"])),
        (
            f"useful GPU-hours {cost['usefulGpuHours']:.2f}",
            "per useful GPU-hour " + money(cost["perUsefulGpuHour"]),
        ),
    ]


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


# -- terminal --------------------------------------------------------------------------------------


def _bar_text(percent: float | None, width: int = 30) -> Text:
    if percent is None:
        return Text("·" * width, style="dim")
    filled = max(0, min(width, round(percent / 100 * width)))
    style = "green" if percent >= 60 else ("yellow" if percent >= 30 else "red")
    return Text("█" * filled, style=style) + Text("░" * (width - filled), style="dim")


def render_terminal(body: dict[str, Any], figures: list[GpuFigures], console: Console) -> None:
    console.print(Text(title(body), style="bold"))
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
    lines = receipt(body)
    energy = energy_line(body)
    if lines or energy:
        rec = Table.grid(padding=(0, 4))
        rec.add_column()
        rec.add_column(justify="right")
        for i, (what, amount) in enumerate(lines):
            rec.add_row(Text(what, style="bold" if i == 0 else ""), amount)
        if energy:
            rec.add_row("energy", energy)
        console.print(Panel(rec, title="receipt", title_align="left", expand=False))
    if not body["findings"]:
        console.print(Text("no findings: nothing to improve was found in this window", style="green"))
    notes = []
    for f in body["findings"]:
        style = SEVERITY_STYLE.get(f["severity"], "")
        head = Text(f"{SEVERITY_MARK.get(f['severity'], '-')} {f['kind']} ", style=style) + Text(
            f"[{f['severity']}] {finding_when(f)}", style="dim"
        )
        notes.append(Group(head, Text("  " + f["message"])))
    if notes:
        console.print(Panel(Group(*notes), title="findings", title_align="left"))


# -- documents -------------------------------------------------------------------------------------


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render_markdown(body: dict[str, Any], figures: list[GpuFigures]) -> str:
    out = [f"# Execution {body['executionId']}", "", _md_cell(title(body)), "", "## Utilization", ""]
    out += ["| | | |", "|---|---|---|"]
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
    lines = receipt(body)
    energy = energy_line(body)
    if lines or energy:
        out += ["", "## Receipt", "", "| | |", "|---|---:|"]
        out += [f"| {_md_cell(w.strip())} | {_md_cell(a)} |" for w, a in lines]
        if energy:
            out.append(f"| energy | {_md_cell(energy)} |")
    out += ["", "## Findings", ""]
    if not body["findings"]:
        out.append("No findings: nothing to improve was found in this window.")
    for f in body["findings"]:
        out.append(f"> **{f['kind']}** ({f['severity']}), {finding_when(f)}  ")
        out.append(f"> {f['message']}")
        out.append("")
    return "\n".join(out).rstrip() + "\n"


_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2rem auto;max-width:960px;
color:#1b1f24;padding:0 1rem}
h1{font-size:1.4rem}h2{font-size:1.1rem;margin-top:2rem}.sub{color:#57606a}
table{border-collapse:collapse;margin:.5rem 0}td,th{padding:.3rem .7rem;border-bottom:1px solid #d0d7de;
text-align:left}th{background:#f6f8fa}td.num{text-align:right;font-variant-numeric:tabular-nums}
.bar{width:240px;height:12px;background:#eaeef2;border-radius:3px;overflow:hidden}
.bar div{height:100%}.good{background:#2da44e}.mid{background:#d4a72c}.low{background:#cf222e}
.note{border-left:4px solid #0969da;background:#f6f8fa;padding:.5rem .8rem;margin:.6rem 0}
.note.warning{border-color:#d4a72c}.note.critical{border-color:#cf222e}.when{color:#57606a;font-size:.9em}
"""


def render_html(body: dict[str, Any], figures: list[GpuFigures]) -> str:
    e = html.escape
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>gpulens report {e(body['executionId'])}</title>",
        f"<style>{_CSS}</style></head><body>",
        f"<h1>Execution {e(body['executionId'])}</h1>",
        f'<p class="sub">{e(title(body))}</p>',
        "<h2>Utilization</h2><table>",
    ]
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
    lines = receipt(body)
    energy = energy_line(body)
    if lines or energy:
        parts.append("<h2>Receipt</h2><table>")
        parts += [f'<tr><td>{e(w.strip())}</td><td class="num">{e(a)}</td></tr>' for w, a in lines]
        if energy:
            parts.append(f'<tr><td>energy</td><td class="num">{e(energy)}</td></tr>')
        parts.append("</table>")
    parts.append("<h2>Findings</h2>")
    if not body["findings"]:
        parts.append("<p>No findings: nothing to improve was found in this window.</p>")
    for f in body["findings"]:
        parts.append(
            f'<div class="note {e(f["severity"])}"><strong>{e(f["kind"])}</strong> ({e(f["severity"])}) '
            f'<span class="when">{e(finding_when(f))}</span><br>{e(f["message"])}</div>'
        )
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def api_json(body: dict[str, Any]) -> str:
    """The body as the API sends it: validated by the response model, encoded as FastAPI encodes it."""
    from gpulens.api.lyceum.summary import ExecutionSummaryResponse

    data = ExecutionSummaryResponse.model_validate(body).model_dump(mode="json")
    return json.dumps(data, ensure_ascii=False, allow_nan=False, indent=None, separators=(",", ":"))


def finding_lines(settings: Settings, registry: Registry, execution_id: str) -> list[str]:
    """One stderr line per finding of a finished local execution (`gpulens run`), from the embedded
    store; a failure to compute them is one line too, never an error of the run."""
    from gpulens.api.app import build_context
    from gpulens.api.lyceum.summary import to_json
    from gpulens.backends.embedded import EmbeddedBackend
    from gpulens.service.summary import SummaryService
    from gpulens.storage.samples import SampleStore

    try:
        store = SampleStore.from_path(settings.samples_path)
        try:
            ctx = build_context(settings, registry, EmbeddedBackend(store))
            service = SummaryService(ctx.metrics, settings.prices, settings.carbon_intensity)

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


def report(
    execution_id: Annotated[str, typer.Argument(help="The execution's id")],
    start: Annotated[str | None, typer.Option(help="RFC 3339 start (default: the execution's start)")] = None,
    end: Annotated[str | None, typer.Option(help="RFC 3339 end (default: its end, or now)")] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print exactly what the summary API answers")
    ] = False,
    as_markdown: Annotated[bool, typer.Option("--markdown", help="A Markdown document")] = False,
    as_html: Annotated[bool, typer.Option("--html", help="A self-contained HTML page")] = False,
    prometheus_url: PrometheusOpt = None,
    database: DatabaseOpt = None,
    demo: DemoOpt = False,
) -> None:
    """How an execution used its hardware: utilization, per-GPU figures, cost and findings."""
    if sum((as_json, as_markdown, as_html)) > 1:
        fail("choose one of --json, --markdown, --html", 2)
    start_ms, end_ms = parse_bounds(start, end)
    with in_process(prometheus_url, database, demo) as ctx:
        body, figures = collect(ctx, execution_id, start_ms, end_ms)
    if as_json:
        sys.stdout.write(api_json(body) + "\n")
    elif as_markdown:
        sys.stdout.write(render_markdown(body, figures))
    elif as_html:
        sys.stdout.write(render_html(body, figures))
    else:
        render_terminal(body, figures, out_console())
