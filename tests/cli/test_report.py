"""`gpulens report`, `gpulens export` and `gpulens metrics` over the demo (`--demo`), and the demo's
stories: each of its executions shows the findings its scenario was built for, and no others, in the
summary API and in the report."""

from __future__ import annotations

import copy
import io
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq  # type: ignore[import-untyped]
import pytest

from gpulens import demo
from gpulens.api.app import create_app
from gpulens.cli.main import app
from gpulens.cli.report import finding_lines, gpu_hours_text
from gpulens.demo.scenario import PhaseKind
from gpulens.domain import catalog as c
from gpulens.service.export import GPU_METRICS, HOST_METRICS
from tests.api.conftest import Client
from tests.cli.conftest import invoke, invoke_ok, one_line_error

# what each demo execution stands for, and the one finding it must show
STORIES = {
    "healthy": ["idle_held"],  # trains well, then holds its GPUs idle for the last 5 minutes
    "throttled": ["power_throttle"],
    "oom": ["oom_suspected"],
    "input-bound": ["input_bound"],
    "cpu-only": [],  # no GPUs: nothing a GPU finding could say
}
PHASE_FINDING = {
    PhaseKind.IDLE: "idle_held",
    PhaseKind.INPUT_STALL: "input_bound",
    PhaseKind.THROTTLE: "power_throttle",
    PhaseKind.OOM: "oom_suspected",
}
NOTE = re.compile(r"^[│ ]*[✖▲●] ([a-z ]+?) \[(\w+)\]", re.MULTILINE)  # a kind's group: label [severity]


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[demo.DemoEnv]:
    data_dir = Path(tmp_path_factory.mktemp("report"))
    with demo.prepare(data_dir / "demo") as prepared:
        yield prepared


@pytest.fixture(autouse=True)
def _demo_dir(env: demo.DemoEnv, monkeypatch: pytest.MonkeyPatch) -> None:
    """`--demo` finds the demo under $GPULENS_DATA_DIR/demo, as `gpulens serve --demo` keeps it."""
    for name in (
        "GPULENS_PROMETHEUS_URL",
        "GPULENS_DATABASE_URL",
        "GPULENS_PRICES",
        "GPULENS_CARBON_INTENSITY",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("GPULENS_DATA_DIR", str(env.data_dir.parent))


@pytest.fixture(scope="module")
def api(env: demo.DemoEnv) -> Client:
    return Client(create_app(env.settings(), registry=env.registry, backend=env.backend()))


def summary(api: Client, env: demo.DemoEnv, execution_id: str) -> bytes:
    r = api.get(
        f"/api/v2/external/execution/{execution_id}/summary", headers={"Authorization": f"Bearer {env.key}"}
    )
    assert r.status_code == 200, r.text
    return r.content


def test_the_stories_follow_the_scenario(env: demo.DemoEnv) -> None:
    """STORIES is what the scenario's phases call for (so the table cannot drift from the data)."""
    for e in env.executions:
        want = [PHASE_FINDING[s.phase.kind] for s in e.spec.spans() if s.phase.kind in PHASE_FINDING]
        assert (want if e.gpus else []) == STORIES[e.name], e.name


@pytest.mark.parametrize("name", list(STORIES))
def test_each_demo_execution_tells_its_story(api: Client, env: demo.DemoEnv, name: str) -> None:
    execution_id = env.execution(name).execution_id
    body = json.loads(summary(api, env, execution_id))
    assert [f["kind"] for f in body["findings"]] == STORIES[name], body["findings"]
    # the report shows the same notes, and their messages
    out = invoke_ok(app, "report", execution_id, "--demo").stdout
    assert [label.replace(" ", "_") for label, _ in NOTE.findall(out)] == STORIES[name], out
    for f in body["findings"]:
        assert f["message"].split(":")[0] in " ".join(out.split())
    if not STORIES[name]:
        assert "no findings" in out


@pytest.mark.parametrize("name", ["healthy", "cpu-only"])
def test_report_json_is_the_api_answer(api: Client, env: demo.DemoEnv, name: str) -> None:
    execution_id = env.execution(name).execution_id
    out = invoke_ok(app, "report", execution_id, "--demo", "--json").stdout
    assert out.encode() == summary(api, env, execution_id) + b"\n"


def test_report_terminal_has_bars_gpu_table_and_receipt(
    env: demo.DemoEnv, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    prices = tmp_path / "prices.toml"
    prices.write_text('currency = "EUR"\n[gpu_hour]\n"gpu.h100" = 2.5\n')
    monkeypatch.setenv("GPULENS_PRICES", str(prices))
    e = env.execution("throttled")
    out = invoke_ok(app, "report", e.execution_id, "--demo").stdout
    for text in ("GPU utilization", "GPU memory", "host CPU", "per GPU", "receipt", "GPU-hours", "EUR", "█"):
        assert text in out, text
    host = env.scenario.host(e.spec.hostname)
    for g in e.gpus:  # one row per GPU, with its UUID
        assert host.gpus[g].uuid in out
    assert "power throttle" in out
    # the receipt in time and money: GPU time, its active and throttled share, at the price
    assert re.search(r"GPU time at 2\.50 EUR per GPU-hour +[\d.]+ GPU-hours +[\d.]+ EUR", out), out
    assert re.search(r"of which throttled +[\d.]+ GPU-hours +[\d.]+ EUR", out), out


def test_report_markdown_and_html_are_self_contained(env: demo.DemoEnv) -> None:
    e = env.execution("oom")
    md = invoke_ok(app, "report", e.execution_id, "--demo", "--markdown").stdout
    assert md.startswith(f"# Execution {e.execution_id}\n")
    assert "## Findings" in md and "### oom suspected (critical)" in md and "| gpu | uuid |" in md
    # the headline first, then the rest
    assert md.index("## Headline") < md.index("## Utilization") < md.index("## Findings")
    # the demo prices its profiles (its prices.toml): the headline has the cost too
    headline = r"^- \d+ min oom suspected on both GPUs: [\d.]+ GPU-hours, [\d.]+ USD$"
    assert re.search(headline, md, re.MULTILINE), md
    page = invoke_ok(app, "report", e.execution_id, "--demo", "--html").stdout
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    assert "oom_suspected" in page and "<style>" in page
    for outside in ("http://", "https://", "src=", "<link", "@import", "url("):
        assert outside not in page, outside


def test_report_refuses_two_formats_and_unknown_ids(env: demo.DemoEnv) -> None:
    e = env.execution("oom")
    one_line_error(invoke(app, "report", e.execution_id, "--demo", "--json", "--html"), code=2)
    assert "not found" in one_line_error(invoke(app, "report", e.execution_id[:-1] + "0", "--demo")).lower()


def test_metrics_sees_the_demo(env: demo.DemoEnv) -> None:
    e = env.execution("input-bound")
    out = invoke_ok(app, "metrics", e.execution_id, "--demo", "--json", "--step", "1m").stdout
    body = json.loads(out)
    assert body["executionId"] == e.execution_id
    assert all(body[k] for k in c.LYCEUM_KEYS)


def test_export_writes_parquet_with_every_row(env: demo.DemoEnv, tmp_path: Path) -> None:
    e = env.execution("healthy")
    target = tmp_path / "healthy.parquet"
    result = invoke_ok(app, "export", e.execution_id, "--demo", "--format", "parquet", "-o", str(target))
    assert "rows" in result.stderr
    table = pq.read_table(io.BytesIO(target.read_bytes()))
    points = (e.spec.end_s - e.spec.start_s) // env.scenario.scrape_interval_s + 1
    assert table.num_rows == points * (len(e.gpus) * len(GPU_METRICS) + len(HOST_METRICS))
    assert not (tmp_path / "healthy.parquet.partial").exists()
    csv_out = invoke_ok(app, "export", e.execution_id, "--demo").stdout
    assert csv_out.startswith("timestamp,hostname,gpu,uuid,metric,value\n")
    assert len(csv_out.splitlines()) == table.num_rows + 1
    one_line_error(invoke(app, "export", e.execution_id, "--demo", "--format", "xlsx"), code=2)


def test_run_prints_the_findings(env: demo.DemoEnv) -> None:
    """What `gpulens run` prints after its summary line: one line per finding."""
    lines = finding_lines(env.settings(), env.registry, env.execution("throttled").execution_id)
    assert len(lines) == 1
    assert lines[0].startswith("gpulens: power_throttle (")
    assert lines[0].endswith(".")
    assert finding_lines(env.settings(), env.registry, env.execution("cpu-only").execution_id) == []


def test_per_gpu_figures_of_a_long_run_are_sampled(
    env: demo.DemoEnv, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The report's per-GPU table (the summary's perGpu) is at the scrape interval while a series fits
    PER_GPU_POINTS, at a multiple of it beyond; the export stays at full resolution."""
    import anyio

    from gpulens.api.app import build_context
    from gpulens.cli.common import CLI_ADMIN
    from gpulens.service import summary as summary_service
    from gpulens.service.export import ExportService

    ctx = build_context(env.settings(), env.registry, env.backend())
    e = env.execution("healthy")  # 90 minutes at 15 s: 361 points a series

    async def exported() -> tuple[int, int]:
        opened = await ExportService(ctx.metrics).open(CLI_ADMIN, e.execution_id, None, None)
        n = 0
        async for batch in opened.batches():
            n += sum(1 for r in batch if r.gpu == "0" and r.metric == "gpuUtilizationPercent")
        return opened.window.step_ms, n

    async def per_gpu() -> tuple[int, int]:
        found = await summary_service.SummaryService(ctx.metrics).summary(
            CLI_ADMIN, e.execution_id, None, None
        )
        gpu0 = next(g for g in found.per_gpu if g.gpu == "0")
        return gpu0.step_ms, gpu0.stats["gpuUtilizationPercent"].samples

    assert anyio.run(exported) == (15_000, 361)
    assert anyio.run(per_gpu) == (15_000, 361)
    monkeypatch.setattr(summary_service, "PER_GPU_POINTS", 50)
    assert anyio.run(per_gpu) == (120_000, 46)


# -- the headline, and a long noisy execution in a screen or two -----------------------------------

# a 72-hour run of a noisy job: 175 episodes over every kind (the count a detector per interval gave)
NOISY_KINDS = {
    "input_bound": 60,
    "idle_held": 40,
    "power_throttle": 30,
    "idle": 15,
    "memory_pressure": 10,
    "no_data": 10,
    "thermal_throttle": 5,
    "gpu_imbalance": 3,
    "low_utilization": 1,
    "oom_suspected": 1,
}


def priced(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    prices = tmp_path / "prices.toml"
    prices.write_text('currency = "EUR"\n[gpu_hour]\n"gpu.h100" = 2.5\n"gpu.a100" = 1.5\n')
    monkeypatch.setenv("GPULENS_PRICES", str(prices))


def noisy_body(base: dict[str, Any], gpus: int = 8) -> dict[str, Any]:
    """`base` (a priced summary) turned into a 72-hour run on `gpus` GPUs with 175 findings, ordered
    as the API orders them (severity, then GPU-hours)."""
    from gpulens.domain.timeparse import format_rfc3339_ms

    body = copy.deepcopy(base)
    start_ms = 1_767_225_600_000 - 72 * 3_600_000
    body["timeRange"] = {
        "start": format_rfc3339_ms(start_ms),
        "end": format_rfc3339_ms(start_ms + 72 * 3_600_000),
    }
    body["gpus"] = [str(g) for g in range(gpus)]
    body["gpuCount"] = gpus
    one = body["perGpu"][0]
    body["perGpu"] = [
        {**one, "gpu": str(g), "uuid": f"GPU-{g:08d}-0000-0000-0000-000000000000"} for g in range(gpus)
    ]
    findings = []
    t = start_ms
    for i, (kind, n) in enumerate(NOISY_KINDS.items()):
        for k in range(n):
            minutes = 3 + (k * 7 + i * 5) % 40
            on = body["gpus"] if k % 3 else [str(k % gpus), str((k + 3) % gpus)]
            hours = minutes / 60 * len(on)
            findings.append(
                {
                    "kind": kind,
                    "severity": c.INSIGHT_SEVERITY[kind],
                    "start": format_rfc3339_ms(t),
                    "end": format_rfc3339_ms(t + minutes * 60_000),
                    "gpus": on,
                    "message": f"Episode {k} of {kind}: GPU utilization was low for {minutes} min while the "
                    "host was busy with something else entirely; look at the input pipeline, the storage "
                    "and the scheduler's placement of this job before the next run.",
                    "evidence": {"durationSeconds": minutes * 60},
                    "impact": {"gpuHours": hours, "cost": hours * 2.5},
                }
            )
            t += 20 * 60_000
    findings.sort(key=lambda f: (c.SEVERITY_RANK[f["severity"]], -f["impact"]["gpuHours"]))
    body["findings"] = findings
    return body


@pytest.fixture
def noisy(env: demo.DemoEnv, api: Client, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> dict[str, Any]:
    """`gpulens report` of the throttled run answers the noisy body (the report's services patched)."""
    from gpulens.cli import report as report_cli

    priced(monkeypatch, tmp_path)
    e = env.execution("throttled")
    base = json.loads(invoke_ok(app, "report", e.execution_id, "--demo", "--json").stdout)
    body = noisy_body(base)
    monkeypatch.setattr(report_cli, "collect", lambda *_: (body, report_cli.gpu_figures(body)))
    return body


def headline_lines(out: str) -> list[str]:
    """The lines of the headline panel (after the title), without the frame."""
    lines = out.splitlines()
    top = next(i for i, line in enumerate(lines) if "headline" in line and line.startswith("╭"))
    end = next(i for i in range(top + 1, len(lines)) if lines[i].startswith("╰"))
    return [line.strip("│ ") for line in lines[top + 1 : end]]


@pytest.mark.parametrize("name", [n for n, kinds in STORIES.items() if kinds])
def test_report_opens_with_the_headline_and_fits_a_screen(
    env: demo.DemoEnv, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, name: str
) -> None:
    priced(monkeypatch, tmp_path)
    e = env.execution(name)
    body = json.loads(invoke_ok(app, "report", e.execution_id, "--demo", "--json").stdout)
    out = invoke_ok(app, "report", e.execution_id, "--demo").stdout
    lines = out.splitlines()
    assert lines[0].startswith(e.execution_id) and lines[1].startswith("╭─ headline")
    (line,) = headline_lines(out)
    (f,) = body["findings"]
    gpus = len(e.gpus) or body["gpuCount"]
    # "40 min power throttle on all 4 GPUs: 2.67 GPU-hours, 6.67 EUR", from the finding's impact
    on = "on both GPUs" if gpus == 2 else f"on all {gpus} GPUs"
    assert re.fullmatch(
        rf"• \d+ (h|min)( \d+ min)? {f['kind'].replace('_', ' ')} {on}: "
        rf"{f['impact']['gpuHours']:.2f} GPU-hours, {f['impact']['cost']:.2f} EUR",
        line,
    ), line
    assert len(lines) <= 60, out
    # a single finding of a kind is its group's head line: nothing is left out, so --full adds nothing
    assert "(--full)" not in out
    assert invoke_ok(app, "report", e.execution_id, "--demo", "--full").stdout == out


def test_report_of_a_noisy_run_is_short_and_full_lists_everything(noisy: dict[str, Any]) -> None:
    findings = noisy["findings"]
    out = invoke_ok(app, "report", noisy["executionId"], "--demo").stdout
    assert len(out.splitlines()) < 150, len(out.splitlines())
    # the headline: the three biggest findings by GPU-hours, biggest first, whatever their severity
    top = sorted(findings, key=lambda f: -f["impact"]["gpuHours"])[:3]
    heads = headline_lines(out)
    assert len(heads) == 3
    for line, f in zip(heads, top, strict=True):
        assert (
            f" {f['kind'].replace('_', ' ')} " in line and f"{f['impact']['gpuHours']:.2f} GPU-hours" in line
        )
    hours = [float(re.search(r": ([\d.]+) GPU-hours", line).group(1)) for line in heads]  # type: ignore[union-attr]
    assert hours == sorted(hours, reverse=True)
    # one group per kind, in the API's order, with its count and GPU-hours; the rest counted, not listed
    groups = NOTE.findall(out)
    assert [label.replace(" ", "_") for label, _ in groups] == list(
        dict.fromkeys(f["kind"] for f in findings)
    )
    for kind, n in NOISY_KINDS.items():
        mine = [f for f in findings if f["kind"] == kind]
        head = next(line for line in out.splitlines() if f"{kind.replace('_', ' ')} [" in line)
        if n > 1:
            total = sum(f["impact"]["gpuHours"] for f in mine)
            assert f"{n} findings · {gpu_hours_text(total)} GPU-hours" in head, head
        if n > 4:
            assert f"… and {n - 3} more (--full)" in out
    # listed under their group's head: the biggest three of a kind (all of a kind of up to four)
    listed = sum((n if n <= 4 else 3) for n in NOISY_KINDS.values() if n > 1)
    assert len(re.findall(r"^│   · 20", out, re.MULTILINE)) == listed
    # --full: every finding with its message
    full = invoke_ok(app, "report", noisy["executionId"], "--demo", "--full").stdout
    flat = " ".join(" ".join(line.strip("│ ") for line in full.splitlines()).split())  # unwrapped
    for f in findings:
        assert f["start"] in full
        assert f["message"] in flat, f["message"]
    assert "(--full)" not in full


def test_documents_of_a_noisy_run_follow_the_same_structure(noisy: dict[str, Any]) -> None:
    findings = noisy["findings"]
    md = invoke_ok(app, "report", noisy["executionId"], "--demo", "--markdown").stdout
    assert md.index("## Headline") < md.index("## Receipt") < md.index("## Findings")
    headline_md = md[md.index("## Headline") : md.index("## Utilization")]
    assert headline_md.count("\n- ") == 3
    assert md.count("\n### ") == len(NOISY_KINDS)
    assert "… and 57 more (\\-\\-full)" in md or "… and 57 more (--full)" in md
    assert len(md.splitlines()) < 150
    md_full = invoke_ok(app, "report", noisy["executionId"], "--demo", "--markdown", "--full").stdout
    assert all(f["start"] in md_full for f in findings)
    page = invoke_ok(app, "report", noisy["executionId"], "--demo", "--html").stdout
    assert page.index("<h2>Headline</h2>") < page.index("<h2>Findings</h2>")
    assert page.count('<ul class="headline">') == 1 and page.count("<li data-kind=") == 3
    assert page.count('<div class="note') == len(NOISY_KINDS)
    assert sum(f["start"] in page for f in findings) < 40
    page_full = invoke_ok(app, "report", noisy["executionId"], "--demo", "--html", "--full").stdout
    assert all(f["start"] in page_full for f in findings)
    # --json stays the API's body, whatever the renderers do
    body = json.loads(invoke_ok(app, "report", noisy["executionId"], "--demo", "--json").stdout)
    assert [f["start"] for f in body["findings"]] == [f["start"] for f in findings]
