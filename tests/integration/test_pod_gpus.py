"""Run:ai DCGM reads without guards in the query: every DCGM metricType of a pod whose GPUs' series
break every shortcut (two dcgm-exporter restarts, new exporter labels each time, old and new series
side by side for the lookback; a NaN burst; MIG instances; a GPU under both pod-label spellings for an
hour; a GPU whose series start inside the window) answers what the fully guarded query answers,
`agg(max by (gpu, GPU_I_ID) (M))` written by hand, point by point, on a real Prometheus, a real
VictoriaMetrics and the embedded evaluator."""

from __future__ import annotations

import math
import random
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import anyio
import pytest

from gpulens.backends.base import MetricsBackend
from gpulens.domain import catalog as c
from gpulens.domain.models import RangeQuery, Window
from gpulens.domain.workloads import Pod, PodPhase, Workload
from gpulens.planning.pods import DCGM_FORMS, PodPlanOptions, sample_grid
from gpulens.service.pod_metrics import PodMetricsService, TypeResult
from gpulens.shaping.merge import single
from gpulens.shaping.runai import Points, per_gpu, points
from tests.integration.test_plan_layouts import three_backends

pytestmark = pytest.mark.integration

T0 = 1_767_225_600 - 6 * 3_600
SPAN = 6 * 3_600
EVERY = 15
RESTARTS = (2 * 3_600 + 7, 4 * 3_600 + 200)  # the second after 4 min down: a shorter overlap
Row = tuple[str, dict[str, str], list[tuple[int, float]]]
WORKLOAD = Workload(
    "5d1c0b2a-3e4f-4a5b-8c6d-7e8f9a0b1c2d", "train", "acme", None, datetime(2025, 1, 1, tzinfo=UTC)
)
POD = Pod(
    "6e2d1c3b-4f5a-4b6c-9d7e-8f9a0b1c2d3e",
    WORKLOAD.workload_id,
    "trainer-0",
    "team-a",
    "node-1",
    ("0", "1", "2", "3"),
    PodPhase.RUNNING,
    datetime(2025, 1, 1, tzinfo=UTC),
)
OPTIONS = PodPlanOptions(scrape_interval_ms=EVERY * 1000)
EXPORTED = {"exported_namespace": "team-a", "exported_pod": "trainer-0"}
PLAIN = {"namespace": "team-a", "pod": "trainer-0"}


def dataset() -> list[Row]:
    rng = random.Random(3)
    rows: list[Row] = []

    def add(labels: dict[str, str], lo: int, hi: int, nan: slice | None = None) -> None:
        times = list(range(T0 + lo - lo % EVERY, T0 + hi, EVERY))
        for name, lo_v, hi_v in ((c.DCGM_GPU_UTIL, 0, 100), (c.DCGM_FB_USED, 1_000, 80_000)):
            values = [float(rng.randrange(lo_v, hi_v)) for _ in times]
            if nan is not None and name == c.DCGM_GPU_UTIL:
                values[nan] = [math.nan] * len(values[nan])  # a NaN burst
            rows.append((name, dict(labels), list(zip(times, values, strict=True))))

    edges = [(0, RESTARTS[0]), (RESTARTS[0] + 15, RESTARTS[1]), (RESTARTS[1] + 240, SPAN)]
    for i, (lo, hi) in enumerate(edges):
        exporter = {"Hostname": "node-1", "pod": f"dcgm-exporter-{i}", "instance": f"10.0.0.{i}:9400"}
        for gpu in ("0", "1"):
            labels = {**exporter, "gpu": gpu, "UUID": f"GPU-{gpu}", **EXPORTED}
            # GPU 1: a burst inside a series; GPU 0: the old series' last values, seen through the overlap
            burst = slice(100, 103) if gpu == "1" and i == 1 else slice(-3, None) if i == 0 else None
            add(labels, lo, hi, burst)
        for instance in ("1", "2"):  # GPU 2: two MIG instances, each its own series throughout
            add({**exporter, "gpu": "2", "UUID": "GPU-2", "GPU_I_ID": instance, **EXPORTED}, lo, hi)
    # GPU 3: starts an hour in; an hour under both spellings (honor_labels changed), then the plain one
    gpu3 = {"Hostname": "node-1", "gpu": "3", "UUID": "GPU-3", "instance": "10.0.0.9:9400"}
    add({**gpu3, **EXPORTED}, 3_600, 3 * 3_600)
    add({**gpu3, **PLAIN}, 2 * 3_600, SPAN)
    return rows


@pytest.fixture(scope="module")
def backends(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, MetricsBackend]]:
    with three_backends(dataset(), Path(tmp_path_factory.mktemp("pods"))) as backends:
        yield backends


def guarded(metric: c.PodMetricDef) -> str:
    """The fully guarded query, by hand: each source's GPUs collapsed by max, sources as a fallback."""
    forms = []
    for source in metric.sources:
        name = source.series[0]
        sel = f"max by (gpu, GPU_I_ID) ({name}{{{_labels(EXPORTED)}}} or {name}{{{_labels(PLAIN)}}})"
        expr = sel if metric.form is c.PodForm.DCGM_PER_GPU else f"{metric.agg.value}({sel})"
        forms.append(expr if source.scale == 1.0 else f"{source.scale!r} * {expr}")
    return " or ".join(f"({f})" for f in forms)


def _labels(labels: dict[str, str]) -> str:
    return ",".join(f'{k}="{v}"' for k, v in labels.items())


def close(got: Points, want: Points) -> bool:
    """Equal times, and values equal up to the order of a sum's additions."""
    return list(got.times) == list(want.times) and all(
        math.isclose(float(a), float(b), rel_tol=1e-12) for a, b in zip(got.values, want.values, strict=True)
    )


@pytest.mark.parametrize("which", ["prometheus", "victoria-metrics", "embedded"])
@pytest.mark.parametrize(
    ("lo_s", "hi_s", "samples"),
    [(600, SPAN, 1000), (600, SPAN, 97), (0, SPAN, 0), (RESTARTS[0] - 300, RESTARTS[0] + 400, 50)],
)
def test_dcgm_reads_equal_the_fully_guarded_query(
    backends: dict[str, MetricsBackend], which: str, lo_s: int, hi_s: int, samples: int
) -> None:
    backend = backends[which]
    service = PodMetricsService(None, backend, OPTIONS)  # type: ignore[arg-type]
    metrics = [m for m in c.POD_METRICS if m.form in DCGM_FORMS]
    start, end = (T0 + lo_s) * 1000, (T0 + hi_s) * 1000
    grid = sample_grid(start, end, samples)

    async def compare() -> int:
        handed: dict[int, list[object]] = {}  # each result as `ready` saw it: its measurements' labels

        def ready(result: TypeResult) -> None:
            assert id(result) not in handed  # once each
            handed[id(result)] = [labels for labels, _ in result.measurements]

        answer = await service.answer(WORKLOAD, (POD,), metrics, start, end, samples, ready)
        # every result handed on complete (every registered GPU in it) before the answer returned
        assert handed == {id(r): [labels for labels, _ in r.measurements] for r in answer.results}
        compared = 0
        for result in answer.results:
            assert result.ok, (result.metric.type, result.error)
            want = await backend.query_range(
                RangeQuery(guarded(result.metric), Window(grid.start_ms, grid.end_ms, grid.step_ms))
            )
            if result.metric.per_gpu:
                expected = dict((tuple(sorted(labels.items())), pts) for labels, pts in per_gpu(want, grid))
                got = {tuple(sorted((labels or {}).items())): pts for labels, pts in result.measurements}
                got = {k: v for k, v in got.items() if len(v)}  # the registered GPUs without data
                assert got.keys() == expected.keys(), result.metric.type
                for k, pts in expected.items():
                    assert got[k] == pts, (result.metric.type, k)
                    compared += len(pts)
            else:
                ((_, pts),) = result.measurements
                expected_pts = points(single(want), grid)
                assert close(pts, expected_pts), result.metric.type
                compared += len(pts)
        return compared

    assert anyio.run(compare) >= (5 if samples == 0 else 100)
