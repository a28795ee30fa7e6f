"""`gpulens report`, `gpulens export` and `gpulens metrics` over the demo (`--demo`), and the demo's
stories: each of its executions shows the findings its scenario was built for, and no others, in the
summary API and in the report."""

from __future__ import annotations

import io
import json
import re
from collections.abc import Iterator
from pathlib import Path

import pyarrow.parquet as pq  # type: ignore[import-untyped]
import pytest

from gpulens import demo
from gpulens.api.app import create_app
from gpulens.cli.main import app
from gpulens.cli.report import finding_lines
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
NOTE = re.compile(r"^[│ ]*[✖▲●] (\w+) \[(\w+)\]", re.MULTILINE)


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
    assert [kind for kind, _ in NOTE.findall(out)] == STORIES[name], out
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
    assert "power_throttle" in out


def test_report_markdown_and_html_are_self_contained(env: demo.DemoEnv) -> None:
    e = env.execution("oom")
    md = invoke_ok(app, "report", e.execution_id, "--demo", "--markdown").stdout
    assert md.startswith(f"# Execution {e.execution_id}\n")
    assert "## Findings" in md and "**oom_suspected**" in md and "| gpu | uuid |" in md
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
