"""Run:ai pod reads with guards only where the data is irregular: a dcgm-exporter restart inside the
window (new exporter labels, old and new series side by side for the lookback) is collapsed only in
the pieces around it, and the stitched answer of every DCGM metricType equals the fully guarded plan's,
GPU by GPU, on the embedded evaluator and on a real Prometheus."""

from __future__ import annotations

import math
import random
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from gpulens.backends.base import MetricsBackend
from gpulens.domain import catalog as c
from gpulens.domain.models import RangeQuery, Series
from gpulens.planning.pods import (
    PodPlanOptions,
    PodTarget,
    collapse_key,
    interval_ms,
    plan_pod_metric,
    sample_grid,
)
from gpulens.service.pod_metrics import DCGM_FORMS, PodMetricsService
from tests.integration.test_plan_layouts import prometheus_and_embedded

pytestmark = pytest.mark.integration

T0 = 1_767_225_600 - 6 * 3_600
SPAN = 6 * 3_600
EVERY = 15
RESTARTS = (2 * 3_600 + 7, 4 * 3_600 + 200)  # the second after 4 min down: a shorter overlap
Row = tuple[str, dict[str, str], list[tuple[int, float]]]
TARGET = PodTarget.one("team-a", "trainer-0")
OPTIONS = PodPlanOptions(scrape_interval_ms=EVERY * 1000)


def dataset() -> list[Row]:
    rng = random.Random(3)
    rows: list[Row] = []
    edges = [(0, RESTARTS[0]), (RESTARTS[0] + 15, RESTARTS[1]), (RESTARTS[1] + 240, SPAN)]
    for i, (lo, hi) in enumerate(edges):
        times = list(range(T0 + lo - lo % EVERY, T0 + hi, EVERY))
        for gpu in ("0", "1"):
            labels = {
                "Hostname": "node-1",
                "gpu": gpu,
                "UUID": f"GPU-{gpu}",
                "exported_namespace": "team-a",
                "exported_pod": "trainer-0",
                "pod": f"dcgm-exporter-{i}",
                "instance": f"10.0.0.{i}:9400",
            }
            for name, lo_v, hi_v in ((c.DCGM_GPU_UTIL, 0, 100), (c.DCGM_FB_USED, 1_000, 80_000)):
                values = [float(rng.randrange(lo_v, hi_v)) for _ in times]
                if gpu == "1" and name == c.DCGM_GPU_UTIL and i == 1:
                    values[100:103] = [math.nan] * 3  # a NaN burst
                rows.append((name, dict(labels), list(zip(times, values, strict=True))))
    return rows


@pytest.fixture(scope="module")
def backends(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, MetricsBackend]]:
    with prometheus_and_embedded(dataset(), Path(tmp_path_factory.mktemp("pods"))) as (prom, embedded):
        yield {"prometheus": prom, "embedded": embedded}


def by_gpu(series: list[Series]) -> dict[tuple[tuple[str, str], ...], list[tuple[float, str]]]:
    key = collapse_key(TARGET)
    return {
        tuple((k, s.labels[k]) for k in key if k in s.labels): [(float(t), str(v)) for t, v in s.samples]
        for s in series
    }


@pytest.mark.parametrize("which", ["prometheus", "embedded"])
@pytest.mark.parametrize("samples", [1000, 97])
def test_stitched_pod_reads_equal_the_guarded_plan(
    backends: dict[str, MetricsBackend], which: str, samples: int
) -> None:
    backend = backends[which]
    service = PodMetricsService(None, backend, OPTIONS)  # type: ignore[arg-type]
    metrics = [m for m in c.POD_METRICS if m.form in DCGM_FORMS]
    grid = sample_grid((T0 + 600) * 1000, (T0 + SPAN) * 1000, samples)
    interval = interval_ms(grid, grid.start_ms, OPTIONS.scrape_interval_ms)

    async def compare() -> int:
        layout = await service._layout(backend, TARGET, metrics, grid)
        pieces = await service._layout_pieces(backend, TARGET, metrics, grid, layout)
        assert len(pieces) > 1
        compared = 0
        for metric in metrics:
            guarded = plan_pod_metric(metric, TARGET, grid, interval, OPTIONS)
            if not plan_pod_metric(metric, TARGET, grid, interval, OPTIONS, None, layout):
                continue  # no series of it: not asked
            want = by_gpu(await backend.query_range(RangeQuery(guarded[0].expr, grid)))
            stitched = await service._stitched(backend, metric, TARGET, grid, interval, pieces)
            got = by_gpu(stitched[0])
            assert got == want, metric.type
            compared += sum(len(v) for v in want.values())
        return compared

    assert anyio.run(compare) > 500


def test_a_restart_is_collapsed_only_around_itself(backends: dict[str, MetricsBackend]) -> None:
    backend = backends["prometheus"]
    service = PodMetricsService(None, backend, OPTIONS)  # type: ignore[arg-type]
    metrics = [c.POD_METRICS_BY_TYPE["GPU_UTILIZATION_PER_GPU"]]
    grid = sample_grid((T0 + 600) * 1000, (T0 + SPAN) * 1000, 1000)

    async def pieces() -> float:
        layout = await service._layout(backend, TARGET, metrics, grid)
        found = await service._layout_pieces(backend, TARGET, metrics, grid, layout)
        return sum(p.hi_ms - p.lo_ms for p, x in found if x.duplicated) / 1000

    assert anyio.run(pieces) <= 2 * 3 * 600  # two restarts, at most three finest pieces each
