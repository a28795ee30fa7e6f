"""The embedded backend answers every plan exactly as a real Prometheus 2.x does (the API-level
comparison, both dialects' responses, is `test_embedded_api_differential`).

The synthetic `default` scenario goes into a SampleStore and (via the `prom_dataset` fixture) into a
real Prometheus; each plan runs through both backends on several windows and steps, including the
data's edges (a series stays visible 5 m after its last sample) and chunk borders.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import anyio
import pytest

from gpulens.backends.embedded import EmbeddedBackend
from gpulens.backends.prometheus import PrometheusBackend, make_client
from gpulens.domain import catalog as c
from gpulens.domain.catalog import PodMetricDef
from gpulens.domain.models import RangeQuery, Series, Window
from gpulens.planning import hosts
from gpulens.planning.pods import (
    PodPlanOptions,
    PodTarget,
    app_alternatives,
    histogram_sources,
    interval_ms,
    plan_pod_metric,
    sample_grid,
)
from gpulens.planning.promql import one_of, series_match
from gpulens.storage.samples import SampleStore
from gpulens_testkit.promload import LoadedDataset, LoadedK8sDataset

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def backends(
    prom_dataset: LoadedDataset, embedded_store: SampleStore
) -> Iterator[tuple[PrometheusBackend, EmbeddedBackend]]:
    prom = PrometheusBackend(prom_dataset.url, make_client(60.0, False, 4))
    yield prom, EmbeddedBackend(embedded_store)
    anyio.run(prom.aclose)


def _points(series: list[Series]) -> dict[tuple[tuple[str, str], ...], list[tuple[object, str]]]:
    return {tuple(sorted(s.labels.items())): [(t, v) for t, v in s.samples] for s in series}


def assert_same(expected: list[Series], got: list[Series], expr: str) -> None:
    want, have = _points(expected), _points(got)
    assert want.keys() == have.keys(), expr
    for key, points in want.items():
        other = have[key]
        assert [float(t) for t, _ in points] == [float(t) for t, _ in other], (expr, key)
        for (t, a), (_, b) in zip(points, other, strict=True):
            x, y = float(a), float(b)
            if math.isnan(x) or math.isnan(y):
                assert math.isnan(x) and math.isnan(y), (expr, key, t, a, b)
            else:
                assert y == pytest.approx(x, rel=1e-9, abs=1e-12), (expr, key, t, a, b)


def windows(ds: LoadedDataset) -> list[Window]:
    sc = ds.scenario
    start, end = sc.start_s * 1000, sc.end_s * 1000
    interval = sc.scrape_interval_s * 1000
    return [
        Window(start - 600_000, start + 1_800_000, interval),  # before the first sample
        Window(end - 1_800_000, end + 900_000, interval),  # past the last: 5 m lookback, then nothing
        Window(start + 7_000, start + 7_000 + 3_600_000, 60_000),  # off the scrape grid
        Window(start, min(end, start + 86_400_000), 300_000),
        Window(start + 1_000_000, start + 1_000_000 + 2_000_000, 13_000),
        Window(start + 3_000_000, start + 3_000_000 + 11_000 * 1000, 1_000),  # a full chunk at 1 s
    ]


def test_every_lyceum_plan_matches_prometheus(
    prom_dataset: LoadedDataset, backends: tuple[PrometheusBackend, EmbeddedBackend]
) -> None:
    prom, emb = backends
    sc = prom_dataset.scenario
    checked = points = 0
    for host in sc.hosts:
        gpu_sets: list[tuple[str, ...]] = [(), tuple(str(g.index) for g in host.gpus[:2])]
        for gpus in gpu_sets:
            target = hosts.HostTarget(host.hostname, gpus, (host.node.instance,))
            for w in windows(prom_dataset):
                options = hosts.HostPlanOptions(scrape_interval_ms=sc.scrape_interval_s * 1000)
                for planned in hosts.plan_host(c.LYCEUM_METRICS, target, w.step_ms, options):
                    q = RangeQuery(planned.expr, w)
                    expected = anyio.run(prom.query_range, q)
                    got = anyio.run(emb.query_range, q)
                    assert_same(expected, got, planned.expr)
                    checked += 1
                    points += sum(len(s.samples) for s in expected)
    assert checked > 100
    assert points > 100_000


def test_chunks_tile_like_prometheus(
    prom_dataset: LoadedDataset, backends: tuple[PrometheusBackend, EmbeddedBackend]
) -> None:
    """Two adjacent chunks of one grid: same points on both sides of the border."""
    prom, emb = backends
    sc = prom_dataset.scenario
    host = sc.hosts[0]
    target = hosts.HostTarget(host.hostname, (), (host.node.instance,))
    step = 15_000
    first = Window(sc.start_s * 1000, sc.start_s * 1000 + 100 * step, step)
    second = Window(first.end_ms + step, first.end_ms + 200 * step, step)
    for planned in hosts.plan_host(c.LYCEUM_METRICS, target, step, hosts.HostPlanOptions()):
        for w in (first, second):
            q = RangeQuery(planned.expr, w)
            assert_same(anyio.run(prom.query_range, q), anyio.run(emb.query_range, q), planned.expr)


def test_series_labels_match(
    prom_dataset: LoadedDataset, backends: tuple[PrometheusBackend, EmbeddedBackend]
) -> None:
    prom, emb = backends
    sc = prom_dataset.scenario
    start, end = sc.start_s * 1000, sc.end_s * 1000
    for match, label in (('{__name__=~"DCGM_FI_DEV_.*"}', "Hostname"), ("node_uname_info", "nodename")):
        want = anyio.run(prom.series_labels, match, label, start, end)
        assert want and want == anyio.run(emb.series_labels, match, label, start, end)


# -- Run:ai pod plans on the Kubernetes scenario (pods come and go: gaps longer than the lookback) --


@pytest.fixture(scope="module")
def k8s_backends(
    prom_k8s_dataset: LoadedK8sDataset, embedded_k8s_store: SampleStore
) -> Iterator[tuple[PrometheusBackend, EmbeddedBackend]]:
    prom = PrometheusBackend(prom_k8s_dataset.url, make_client(60.0, False, 4))
    yield prom, EmbeddedBackend(embedded_k8s_store)
    anyio.run(prom.aclose)


def _histogram_name(emb: EmbeddedBackend, metric: PodMetricDef, target: PodTarget, w: Window) -> str | None:
    for name in histogram_sources(metric):
        for alt in app_alternatives(target, one_of("__name__", [name])):
            if anyio.run(emb.series_labels, series_match(alt), "__name__", w.start_ms - 300_000, w.end_ms):
                return name
    return None


def test_pod_plans_match_prometheus(
    prom_k8s_dataset: LoadedK8sDataset, k8s_backends: tuple[PrometheusBackend, EmbeddedBackend]
) -> None:
    prom, emb = k8s_backends
    sc = prom_k8s_dataset.scenario
    scrape = sc.scrape_interval_s * 1000
    options = PodPlanOptions(scrape_interval_ms=scrape)
    targets = [PodTarget.one(p.namespace, p.name) for p in sc.pods]
    by_ns: dict[str, list[tuple[str, str]]] = {}
    for p in sc.pods:
        by_ns.setdefault(p.namespace, []).append((p.namespace, p.name))
    targets += [PodTarget(tuple(pods)) for pods in by_ns.values() if len(pods) > 1]
    # a workload across namespaces: range functions must wrap single selectors (rate(a[w]) or rate(b[w]))
    targets.append(PodTarget(tuple((p.namespace, p.name) for p in sc.pods)))
    start, end = sc.start_s * 1000, sc.end_s * 1000
    checked = points = 0
    roles: set[str] = set()
    for target in targets:
        for samples in (0, 7, 120):
            grid = sample_grid(start + 90_000, end + 600_000, samples)
            interval = interval_ms(grid, start + 90_000, scrape)
            metric_defs = c.POD_METRICS if len(target.pods) == 1 else c.WORKLOAD_METRICS
            for metric in metric_defs:
                hist = _histogram_name(emb, metric, target, grid)
                for q in plan_pod_metric(metric, target, grid, interval, options, hist):
                    rq = RangeQuery(q.expr, q.window)
                    expected = anyio.run(prom.query_range, rq)
                    assert_same(expected, anyio.run(emb.query_range, rq), q.expr)
                    checked += 1
                    points += sum(len(s.samples) for s in expected)
                    roles.add(q.role.split(":")[0])
    assert checked > 100
    assert points > 1000
    assert roles == {"source", "value", "counter", "buckets", "percentiles"}
