"""Specialised plans (planning/layout.py) answer exactly what the guarded plan answers, on a real
Prometheus and on the embedded evaluator, over exporter layouts that break every shortcut:
host-label spellings that change mid-window, a GPU seen as two series, GPUs of different sizes,
CPU counters that start inside the window, fallback-only sources, MIG instances; and a clean host,
where the specialised plan is the hand-written one.
"""

from __future__ import annotations

import math
import random
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import anyio
import httpx
import pytest

from gpulens.agent.samples import Sample
from gpulens.backends.base import MetricsBackend
from gpulens.backends.embedded.backend import EmbeddedBackend
from gpulens.backends.prometheus import PrometheusBackend
from gpulens.domain import catalog as c
from gpulens.domain.models import RangeQuery, Window
from gpulens.planning.hosts import HostPlanOptions, HostTarget, PlannedMetric, plan_host
from gpulens.planning.segments import Run, runs_per_item
from gpulens.service.layouts import HostLayouts
from gpulens.storage.samples import SampleStore
from gpulens_testkit.promload import (
    backfill,
    start_prometheus,
    start_victoria_metrics,
    vm_force_flush,
    vm_import,
)
from tests.conftest import missing_server

pytestmark = pytest.mark.integration

T0 = 1_767_225_600 - 7_200  # a 2 h block, epoch-aligned (promtool writes one block)
SPAN = 7_200
EVERY = 15
MIB = 1_048_576

Row = tuple[str, dict[str, str], list[tuple[int, float]]]


def _gpu_rows(
    host_label: str,
    host: str,
    gpu: int,
    t_from: int,
    t_to: int,
    total_mib: int,
    rng: random.Random,
    **extra: str,
) -> list[Row]:
    labels = {host_label: host, "gpu": str(gpu), "UUID": f"GPU-{host}-{gpu}", "modelName": "H100", **extra}
    times = list(range(T0 + t_from, T0 + t_to, EVERY))
    used = [float(rng.randrange(1_000, total_mib)) for _ in times]

    def series(name: str, values: list[float]) -> Row:
        return (name, dict(labels), list(zip(times, values, strict=True)))

    def noise(lo: int, hi: int) -> list[float]:
        return [float(rng.randrange(lo, hi)) for _ in times]

    return [
        series(c.DCGM_GPU_UTIL, noise(0, 101)),
        series(c.DCGM_FB_USED, used),
        series(c.DCGM_FB_FREE, [total_mib - u for u in used]),
        series(c.DCGM_GPU_TEMP, noise(30, 90)),
        series(c.DCGM_POWER_USAGE, [v + 0.25 for v in noise(60, 700)]),
        series(c.DCGM_SM_CLOCK, noise(1000, 1980)),
        series(c.DCGM_MEM_CLOCK, noise(2600, 2620)),
    ]


def _cpu_rows(instance: str, cpus: int, t_from: int, base: float) -> list[Row]:
    """Counters whose modes add up to exactly one CPU-second per second."""
    times = list(range(T0 + t_from, T0 + SPAN, EVERY))
    rows: list[Row] = []
    for cpu in range(cpus):
        for mode, share in (("idle", 0.75), ("user", 0.1875), ("system", 0.0625)):
            values = [
                base * share + k * EVERY * share * (1 + 0.5 * ((k // 40 + cpu) % 2))
                for k in range(len(times))
            ]
            rows.append(
                (
                    c.NODE_CPU_SECONDS,
                    {"instance": instance, "cpu": str(cpu), "mode": mode},
                    list(zip(times, values, strict=True)),
                )
            )
    # modes share time unevenly over phases: renormalise so all modes add up to elapsed seconds
    for cpu in range(cpus):
        group = rows[cpu * 3 : cpu * 3 + 3]
        for k in range(len(times)):
            total = sum(g[2][k][1] for g in group)
            want = base + k * EVERY
            for g in group:
                t, v = g[2][k]
                g[2][k] = (t, v * want / total)
    return rows


def _mem_rows(instance: str, t_from: int) -> list[Row]:
    times = list(range(T0 + t_from, T0 + SPAN, EVERY))
    total = 512 * 1024 * MIB
    return [
        (c.NODE_MEM_TOTAL, {"instance": instance}, [(t, float(total)) for t in times]),
        (
            c.NODE_MEM_AVAILABLE,
            {"instance": instance},
            [(t, float(total - (k % 50) * MIB)) for k, t in enumerate(times)],
        ),
    ]


def dataset() -> list[Row]:
    rng = random.Random(5)
    rows: list[Row] = []
    # clean: one spelling, four equal GPUs, profiling PCIe, enforced limit, counters from before the window
    for gpu in range(4):
        rows += _gpu_rows("Hostname", "clean", gpu, 0, SPAN, 81_559, rng)
        labels = {"Hostname": "clean", "gpu": str(gpu), "UUID": f"GPU-clean-{gpu}", "modelName": "H100"}
        times = range(T0, T0 + SPAN, EVERY)
        rows.append(
            (c.DCGM_PCIE_RX_BYTES, dict(labels), [(t, float(rng.randrange(0, 10**9))) for t in times])
        )
        rows.append(
            (c.DCGM_PCIE_TX_BYTES, dict(labels), [(t, float(rng.randrange(0, 10**9))) for t in times])
        )
        rows.append((c.DCGM_ENFORCED_POWER_LIMIT, dict(labels), [(t, 700.0) for t in times]))
    rows += _cpu_rows("clean:9100", 2, 0, 1e6)
    rows += _mem_rows("clean:9100", 0)
    # quirky: the exporter's host label changes spelling at 60 min; GPU 1 is pod-labelled from 30 to 45
    # min (two series for one device); GPU 1 is half the size; only device PCIe and management power
    # limits; node-exporter found through node_uname_info, its counters start at 30 min
    for gpu, total in ((0, 81_559), (1, 40_537)):
        rows += _gpu_rows("Hostname", "quirky", gpu, 0, 3_600, total, rng)
        rows += _gpu_rows("hostname", "quirky", gpu, 3_600, SPAN, total, rng)
    rows += _gpu_rows("Hostname", "quirky", 1, 1_800, 2_700, 40_537, rng, pod="trainer-0", namespace="ml")
    for gpu in (0, 1):
        labels = {"hostname": "quirky", "gpu": str(gpu), "UUID": f"GPU-quirky-{gpu}"}
        times = range(T0, T0 + SPAN, EVERY)
        rows.append(
            (c.DCGM_PCIE_RX_THROUGHPUT, dict(labels), [(t, float(rng.randrange(0, 10**6))) for t in times])
        )
        rows.append((c.DCGM_POWER_MGMT_LIMIT, dict(labels), [(t, 350.0) for t in times]))
    rows.append(
        (
            c.NODE_UNAME_INFO,
            {"instance": "10.9.9.9:9100", "nodename": "quirky"},
            [(t, 1.0) for t in range(T0, T0 + SPAN, EVERY)],
        )
    )
    rows += _cpu_rows("10.9.9.9:9100", 2, 1_800, 3.0)
    rows += _mem_rows("10.9.9.9:9100", 0)
    # mig: two instances of GPU 0 (graphics-engine activity only, different sizes), and GPU_UTIL of GPU 1
    for inst, total in (("1", 9_984), ("2", 19_968)):
        labels = {"Hostname": "mig", "gpu": "0", "UUID": "GPU-mig-0", "GPU_I_ID": inst, "GPU_I_PROFILE": "1g"}
        times = list(range(T0, T0 + SPAN, EVERY))
        used = [float(rng.randrange(0, total)) for _ in times]
        rows.append((c.DCGM_GR_ENGINE_ACTIVE, dict(labels), [(t, rng.random()) for t in times]))
        rows.append((c.DCGM_FB_USED, dict(labels), list(zip(times, used, strict=True))))
        rows.append(
            (c.DCGM_FB_FREE, dict(labels), [(t, total - u) for t, u in zip(times, used, strict=True)])
        )
    rows += [r for r in _gpu_rows("Hostname", "mig", 1, 0, SPAN, 81_559, rng) if r[0] == c.DCGM_GPU_UTIL]
    # restarted: the exporter restarts at 50 min (its pod label changes; no staleness markers, so old
    # and new series overlap for the lookback) and again at 90 min after 4 min down; GPU 2 misses
    # scrapes and carries a NaN burst; node-exporter starts at 20 min
    for gpu in range(4):
        for pod, lo, hi in (("dcgm-exporter-aaaa", 0, 3_000), ("dcgm-exporter-bbbb", 3_015, 5_400)):
            rows += _gpu_rows("Hostname", "restarted", gpu, lo, hi, 81_559, rng, pod=pod)
        for row in _gpu_rows(
            "Hostname", "restarted", gpu, 5_640, SPAN, 81_559, rng, pod="dcgm-exporter-cccc"
        ):
            if gpu == 2:
                points = [(t, v) for k, (t, v) in enumerate(row[2]) if k % 37 != 5]
                row = (
                    row[0],
                    row[1],
                    [(t, math.nan if 20 <= k < 24 else v) for k, (t, v) in enumerate(points)],
                )
            rows.append(row)
    rows += _cpu_rows("restarted:9100", 2, 1_200, 5e5)
    rows += _mem_rows("restarted:9100", 0)
    return rows


def prometheus_text(rows: list[Row]) -> bytes:
    """The rows as Prometheus text with ms timestamps (VictoriaMetrics' import)."""
    lines = []
    for name, labels, points in rows:
        body = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
        lines.extend(f"{name}{{{body}}} {v!r} {t * 1000}" for t, v in points)
    return ("\n".join(lines) + "\n").encode()


def openmetrics(rows: list[Row]) -> str:
    lines = []
    for name in sorted({r[0] for r in rows}):
        counter = name.endswith("_total")
        lines.append(
            f"# TYPE {name.removesuffix('_total') if counter else name} {'counter' if counter else 'gauge'}"
        )
        for row_name, labels, points in rows:
            if row_name == name:
                body = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
                lines.extend(f"{name}{{{body}}} {v!r} {t}" for t, v in points)
    return "\n".join(lines) + "\n# EOF\n"


@contextmanager
def prometheus_and_embedded(rows: list[Row], work: Path) -> Iterator[tuple[MetricsBackend, MetricsBackend]]:
    """The rows backfilled into a real Prometheus and written to an embedded store, both serving."""
    for binary in ("prometheus", "promtool"):
        if shutil.which(binary) is None:
            missing_server(f"{binary} (on PATH)")
    (work / "data.om").write_text(openmetrics(rows))
    backfill([work / "data.om"], work / "tsdb", 7_200)
    handle = start_prometheus(work / "tsdb", block_s=7_200)
    store = SampleStore.from_path(work / "samples.db")
    for name, labels, points in rows:
        # SQLite keeps NaN as NULL: the embedded store holds a NaN burst as missed scrapes
        store.write(Sample(name, labels, v, t * 1000) for t, v in points if not math.isnan(v))
    store.flush()
    prom = PrometheusBackend(handle.url, httpx.Client(timeout=30, headers={"Accept-Encoding": "identity"}))
    try:
        yield prom, EmbeddedBackend(store)
    finally:
        anyio.run(prom.aclose)
        store.close()
        handle.stop()


@contextmanager
def three_backends(rows: list[Row], work: Path) -> Iterator[dict[str, MetricsBackend]]:
    """The rows in a real Prometheus, the embedded store and a real VictoriaMetrics, all serving:
    `prometheus`, `embedded`, `victoria-metrics`."""
    if shutil.which("victoria-metrics") is None:
        missing_server("victoria-metrics (on PATH)")
    with prometheus_and_embedded(rows, work) as (prom, embedded):
        vm_handle = start_victoria_metrics(work / "vm")
        try:
            vm_import(vm_handle.url, [prometheus_text(rows)])
            vm_force_flush(vm_handle.url)
            vm = PrometheusBackend(
                vm_handle.url, httpx.Client(timeout=30, headers={"Accept-Encoding": "identity"})
            )
            try:
                yield {"prometheus": prom, "victoria-metrics": vm, "embedded": embedded}
            finally:
                anyio.run(vm.aclose)
        finally:
            vm_handle.stop()


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[MetricsBackend, MetricsBackend]]:
    with three_backends(dataset(), Path(tmp_path_factory.mktemp("layouts"))) as backends:
        VICTORIA.append(backends["victoria-metrics"])
        try:
            yield backends["prometheus"], backends["embedded"]
        finally:
            VICTORIA.clear()


VICTORIA: list[MetricsBackend] = []  # the module's VictoriaMetrics, while `servers` is up


OPTIONS = HostPlanOptions(scrape_interval_ms=EVERY * 1000)
TARGETS = {
    "clean": HostTarget("clean"),
    "clean-gpus": HostTarget("clean", ("1", "2")),
    "quirky": HostTarget("quirky", (), ("10.9.9.9:9100",)),
    "mig": HostTarget("mig"),
    "restarted": HostTarget("restarted"),
    "restarted-gpus": HostTarget("restarted", ("0", "GPU-restarted-2")),
}
WINDOWS = [
    Window((T0 + 600) * 1000, (T0 + 6_600) * 1000, 15_000),
    Window(T0 * 1000, (T0 + SPAN) * 1000, 60_000),
    Window((T0 + 1_700) * 1000 + 500, (T0 + 3_900) * 1000, 7_000),
]


def run_plan(
    backend: MetricsBackend, plan: list[PlannedMetric], w: Window
) -> dict[str, list[tuple[float, float]]]:
    async def one(p: PlannedMetric) -> list[tuple[float, float]]:
        if p.expr is None:
            return []
        series = await backend.query_range(RangeQuery(p.expr, w))
        assert len(series) <= 1, p.expr
        return [(float(t), float(v)) for t, v in series[0].samples] if series else []

    async def everything() -> dict[str, list[tuple[float, float]]]:
        return {p.metric.lyceum: await one(p) for p in plan}

    return anyio.run(everything)


def specialised(backend: MetricsBackend, target: HostTarget, w: Window) -> list[PlannedMetric]:
    layout = anyio.run(HostLayouts(OPTIONS).layout, backend, c.LYCEUM_METRICS, target, w, w.step_ms)
    return plan_host(c.LYCEUM_METRICS, target, w.step_ms, OPTIONS, layout)


def same(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> bool:
    return len(a) == len(b) and all(
        ta == tb and (math.isclose(va, vb, rel_tol=1e-9, abs_tol=1e-9) or (math.isnan(va) and math.isnan(vb)))
        for (ta, va), (tb, vb) in zip(a, b, strict=True)
    )


@pytest.mark.parametrize("which", ["prometheus", "embedded"])
@pytest.mark.parametrize("name", sorted(TARGETS))
def test_specialised_plan_answers_what_the_guarded_plan_answers(
    servers: tuple[MetricsBackend, MetricsBackend], which: str, name: str
) -> None:
    backend = servers[0] if which == "prometheus" else servers[1]
    target = TARGETS[name]
    compared = 0
    for w in WINDOWS:
        guarded = run_plan(backend, plan_host(c.LYCEUM_METRICS, target, w.step_ms, OPTIONS), w)
        fast = run_plan(backend, specialised(backend, target, w), w)
        for key in c.LYCEUM_KEYS:
            assert same(fast[key], guarded[key]), (name, w, key, fast[key][:3], guarded[key][:3])
            compared += len(guarded[key])
    assert compared > 1_000


def test_clean_host_gets_the_hand_written_forms(servers: tuple[MetricsBackend, MetricsBackend]) -> None:
    for backend in servers:
        exprs = {p.metric.lyceum: p.expr or "" for p in specialised(backend, TARGETS["clean"], WINDOWS[0])}
        assert exprs["gpuUtilizationPercent"] == 'avg(DCGM_FI_DEV_GPU_UTIL{Hostname="clean"})'
        assert exprs["gpuMemoryUtilizationPercent"] == (  # the ratio of sums, each series selected once
            '100 / (1 + sum(DCGM_FI_DEV_FB_FREE{Hostname="clean"}) '
            '/ sum(DCGM_FI_DEV_FB_USED{Hostname="clean"}))'
        )
        assert exprs["systemCpuUsagePercent"].startswith(
            '100 * (1 - avg(rate(node_cpu_seconds_total{mode="idle"'
        )
        assert exprs["systemRamTotalBytes"].startswith("node_memory_MemTotal_bytes{")
        assert not any(" or " in e or "max by" in e for e in exprs.values()), exprs


def test_quirky_host_keeps_the_guards_it_needs(servers: tuple[MetricsBackend, MetricsBackend]) -> None:
    for backend in servers:
        exprs = {p.metric.lyceum: p.expr or "" for p in specialised(backend, TARGETS["quirky"], WINDOWS[0])}
        util = exprs["gpuUtilizationPercent"]
        assert 'Hostname="quirky"' in util and 'hostname="quirky"' in util and "max by" in util
        assert "PROF_GR_ENGINE" not in util  # no series: not asked
        assert "avg(max by" in exprs["gpuMemoryUtilizationPercent"]  # different sizes: mean of ratios
        assert "MGMT" in exprs["gpuPowerLimitWatt"] and "ENFORCED" not in exprs["gpuPowerLimitWatt"]
        assert "1024 * " in exprs["gpuPcieThroughputRxBytesPerSec"]
        assert "/ sum(rate(" in exprs["systemCpuUsagePercent"]  # counters start inside the window


@pytest.mark.parametrize("which", ["prometheus", "embedded"])
@pytest.mark.parametrize("name", sorted(TARGETS))
def test_grouped_plan_gives_each_gpu_what_its_own_plan_gives(
    servers: tuple[MetricsBackend, MetricsBackend], which: str, name: str
) -> None:
    """`plan_host(..., group=("gpu", "UUID"))` (the summary's perGpu: one query per series for every
    GPU) answers, per GPU, exactly what the guarded plan of that GPU alone answers."""
    backend = servers[0] if which == "prometheus" else servers[1]
    target = TARGETS[name]
    gpu_metrics = [m for m in c.LYCEUM_METRICS if m.exporter is c.Exporter.DCGM]
    compared = 0
    for w in WINDOWS[:2]:
        layout = anyio.run(HostLayouts(OPTIONS).layout, backend, gpu_metrics, target, w, w.step_ms)
        grouped = plan_host(
            gpu_metrics, target, w.step_ms, OPTIONS, layout, group=(c.LABEL_GPU, c.LABEL_UUID)
        )
        for planned in grouped:
            if planned.expr is None:
                continue
            answer = anyio.run(backend.query_range, RangeQuery(planned.expr, w))
            assert answer, (name, planned.expr)
            for series in answer:
                gpu = series.labels[c.LABEL_GPU]
                own = plan_host(
                    [planned.metric],
                    HostTarget(target.hostname, (gpu,), target.node_instances),
                    w.step_ms,
                    OPTIONS,
                )
                want = run_plan(backend, own, w)[planned.metric.lyceum]
                got = [(float(t), float(v)) for t, v in series.samples]
                assert same(got, want), (name, w, planned.metric.lyceum, gpu, got[:3], want[:3])
                compared += len(want)
    assert compared > 1_000


def stitched(
    backend: MetricsBackend, target: HostTarget, w: Window
) -> tuple[dict[str, list[tuple[float, float]]], list[list[Run[str | None]]]]:
    """What the service asks: each metric per run of pieces sharing its expression, concatenated."""
    leaves = anyio.run(HostLayouts(OPTIONS).leaves, backend, c.LYCEUM_METRICS, target, w, w.step_ms)
    plans = [
        (piece, [p.expr for p in plan_host(c.LYCEUM_METRICS, target, w.step_ms, OPTIONS, layout)])
        for piece, layout in leaves
    ]
    runs = runs_per_item(w, plans)
    out: dict[str, list[tuple[float, float]]] = {}
    for metric, metric_runs in zip(c.LYCEUM_METRICS, runs, strict=True):
        got: list[tuple[float, float]] = []
        for run in metric_runs:
            got += run_plan(backend, [PlannedMetric(metric, run.value)], run.window)[metric.lyceum]
        out[metric.lyceum] = got
    return out, runs


@pytest.mark.parametrize("which", ["prometheus", "embedded", "victoria-metrics"])
@pytest.mark.parametrize("name", sorted(TARGETS))
def test_stitched_plan_answers_what_the_guarded_plan_answers(
    servers: tuple[MetricsBackend, MetricsBackend], which: str, name: str
) -> None:
    """Guards only where the data is irregular (planning/segments.py): the window's runs, each with the
    plan of its own pieces, give exactly the fully guarded plan's answer at every grid point."""
    backend = {"prometheus": servers[0], "embedded": servers[1]}.get(which) or VICTORIA[0]
    target = TARGETS[name]
    compared = 0
    for w in WINDOWS:
        guarded = run_plan(backend, plan_host(c.LYCEUM_METRICS, target, w.step_ms, OPTIONS), w)
        fast, _ = stitched(backend, target, w)
        for key in c.LYCEUM_KEYS:
            assert same(fast[key], guarded[key]), (name, w, key, fast[key][:3], guarded[key][:3])
            compared += len(guarded[key])
    assert compared > 1_000


@pytest.mark.parametrize("which", ["prometheus", "embedded"])
def test_restarts_are_guarded_only_around_themselves(
    servers: tuple[MetricsBackend, MetricsBackend], which: str
) -> None:
    """Over the restarted host's two hours, the GPU average is guarded only in the pieces around the two
    restarts (the overlap plus at most a piece either side), plain everywhere else; the CPU's
    all-modes form only until its counters cover a rate window."""
    backend = servers[0] if which == "prometheus" else servers[1]
    w = Window(T0 * 1000, (T0 + SPAN) * 1000, 15_000)
    _, runs = stitched(backend, TARGETS["restarted"], w)
    by_key = dict(zip(c.LYCEUM_KEYS, runs, strict=True))

    def guarded_s(key: str, mark: str) -> float:
        return sum(
            (r.window.end_ms - r.window.start_ms) / 1000 + 15 for r in by_key[key] if mark in (r.value or "")
        )

    util = by_key["gpuUtilizationPercent"]
    assert any("max by" not in (r.value or "") for r in util)
    assert guarded_s("gpuUtilizationPercent", "max by") <= 2 * 3 * 600  # two restarts, <= 3 pieces each
    assert guarded_s("systemCpuUsagePercent", "/ sum(rate(") <= 1_200 + 2 * 600
    assert guarded_s("gpuTemperatureCelsius", "max by") == 0  # max over duplicates is max already
