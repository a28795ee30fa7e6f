"""Raw PromQL against a real Prometheus (and VictoriaMetrics) equals the synthetic ground truth.

This proves generator + loader + truth agree; the expressions follow domain/catalog.py's forms but are
written here independently of gpulens.planning. Prometheus values are compared bit for bit, except
the frame-buffer percentage: it divides two vectors, and Prometheus 2.x hands the quotient's series
to `avg` in Go map order, so identical queries differ in the last bits (measured: 4 distinct answers
in 15 runs over 4 GPUs). That one is compared at rel 1e-12.
"""

from __future__ import annotations

from collections.abc import Sequence

import httpx
import pytest

from gpulens.demo.scenario import Host
from gpulens.domain import catalog as c
from gpulens.domain.catalog import Form, MetricDef
from gpulens.domain.models import Window
from gpulens_testkit.promload import LoadedDataset
from gpulens_testkit.scenarios import node_found_by_uname_only
from tests.integration.conftest import instant, range_result

pytestmark = pytest.mark.integration

# sums and means over many series: Prometheus 2.x does not always add them in label order
ORDER_SENSITIVE = {"gpuMemoryUtilizationPercent", "systemCpuUsagePercent"}


def query_range(client: httpx.Client, url: str, expr: str, w: Window, **extra: str) -> dict[int, float]:
    result = range_result(client, url, expr, w.start_ms, w.end_ms, w.step_ms, **extra)
    assert len(result) <= 1, result
    return {} if not result else {round(float(t) * 1000): float(v) for t, v in result[0]["values"]}


def _duration(ms: int) -> str:
    return f"{ms // 1000}s" if ms % 1000 == 0 else f"{ms}ms"


def promql(m: MetricDef, host: Host, gpus: Sequence[int], step_ms: int, scrape_ms: int) -> str:
    """The catalog form of one metric for a host (node-exporter found by instance or node_uname_info)."""
    gpu_sel = f'{host.host_label}="{host.hostname}",{c.LABEL_GPU}=~"{"|".join(str(g) for g in gpus)}"'
    by_uname = node_found_by_uname_only(host)

    def node(series: str, *matchers: str) -> str:
        if by_uname:
            inner = ",".join(matchers)
            return (
                f"{series}{{{inner}}} * on({c.LABEL_INSTANCE}) group_left() "
                f'{c.NODE_UNAME_INFO}{{{c.LABEL_NODENAME}="{host.hostname}"}}'
            )
        inner = ",".join((*matchers, f'{c.LABEL_INSTANCE}="{host.node.instance}"'))
        return f"{series}{{{inner}}}"

    forms = []
    for source in m.sources:
        s = source.series
        if m.form is Form.GPU_GAUGE:
            expr = f"{m.agg.value}({s[0]}{{{gpu_sel}}})"
        elif m.form is Form.GPU_FB_PERCENT:
            expr = f"100 * avg({s[0]}{{{gpu_sel}}} / ({s[0]}{{{gpu_sel}}} + {s[1]}{{{gpu_sel}}}))"
        elif m.form is Form.NODE_GAUGE:
            expr = f"max({node(s[0])})"
        elif m.form is Form.NODE_DIFF:
            expr = f"max({node(s[0])}) - max({node(s[1])})"
        else:
            window = _duration(max(step_ms, 4 * scrape_ms))

            def rate(*matchers: str) -> str:
                inner = ",".join(matchers)
                if by_uname:
                    return (
                        f"rate({s[0]}{{{inner}}}[{window}]) * on({c.LABEL_INSTANCE}) group_left() "
                        f'{c.NODE_UNAME_INFO}{{{c.LABEL_NODENAME}="{host.hostname}"}}'
                    )
                where = ",".join((*matchers, f'{c.LABEL_INSTANCE}="{host.node.instance}"'))
                return f"rate({s[0]}{{{where}}}[{window}])"

            idle = rate(f'{c.LABEL_CPU_MODE}="{c.CPU_IDLE_MODE}"')
            expr = f"100 * (1 - sum({idle}) / sum({rate()}))"
        forms.append(expr if source.scale == 1.0 else f"{source.scale:g} * {expr}")
    return " or ".join(f"({f})" for f in forms) if len(forms) > 1 else forms[0]


def windows(ds: LoadedDataset, name: str) -> list[Window]:
    e = ds.scenario.execution(name)
    s, t = e.start_s * 1000, e.end_s * 1000
    return [
        Window(s, t, 15_000),  # the Lyceum default: the execution at the scrape interval
        Window(s - 600_000, t + 600_000, 60_000),  # idle margins, 60 s rate window
        Window(s - 420_000 + 7_000, t + 300_000 + 7_000, 10_000),  # off the scrape grid: extrapolated rates
    ]


@pytest.mark.parametrize("name", ["healthy", "throttled", "oom", "input-bound", "cpu-only"])
def test_every_lyceum_metric_equals_truth(
    prom_dataset: LoadedDataset, client: httpx.Client, name: str
) -> None:
    ds = prom_dataset
    e = ds.scenario.execution(name)
    host = ds.scenario.host(e.hostname)
    gpus = ds.scenario.gpus_of(e)
    scrape_ms = ds.scenario.scrape_interval_s * 1000
    for w in windows(ds, name):
        truth = ds.truth.host(e.hostname, gpus, w)
        for m in c.LYCEUM_METRICS:
            got = query_range(client, ds.url, promql(m, host, gpus, w.step_ms, scrape_ms), w)
            want = truth[m.lyceum].as_dict()
            assert got.keys() == want.keys(), (m.lyceum, w)
            if m.lyceum in ORDER_SENSITIVE:
                assert got == pytest.approx(want, rel=1e-12, abs=0), (m.lyceum, w)
            else:
                assert got == want, (m.lyceum, w)


def test_unowned_gpus_change_the_answer(prom_dataset: LoadedDataset, client: httpx.Client) -> None:
    ds = prom_dataset
    host = ds.scenario.host("gpu-node-1")
    w = ds.truth.execution_window("healthy")
    util = next(m for m in c.LYCEUM_METRICS if m.lyceum == "gpuUtilizationPercent")
    all_gpus = query_range(client, ds.url, promql(util, host, range(8), w.step_ms, 15_000), w)
    assert all_gpus == ds.truth.host("gpu-node-1", None, w)["gpuUtilizationPercent"].as_dict()
    assert all_gpus != ds.truth.execution("healthy")["gpuUtilizationPercent"].as_dict()


def test_every_series_loaded_and_visible_five_minutes_after_the_end(
    prom_dataset: LoadedDataset, client: httpx.Client
) -> None:
    ds = prom_dataset
    end = ds.scenario.end_s

    total = instant(client, ds.url, 'count({__name__=~".+"})', end)
    assert total[0]["value"] == [end, str(len(ds.dataset.series))]
    span = f"{end - ds.scenario.start_s}s"  # [start, end], closed: every sample
    for family in ds.dataset.families:
        counted = instant(client, ds.url, f"sum(count_over_time({family.name}[{span}]))", end)
        assert counted[0]["value"] == [end, str(len(family.series) * ds.scenario.sample_count)], family.name
    # backfilled blocks carry no staleness markers: the last sample answers for the full lookback
    assert instant(client, ds.url, c.DCGM_GPU_UTIL, end + 300)
    assert instant(client, ds.url, c.DCGM_GPU_UTIL, end + 301) == []


def test_victoria_metrics_agrees_on_stable_points(vm_dataset: LoadedDataset, client: httpx.Client) -> None:
    """MetricsQL differs at data edges and after slope changes (rate); `stable` points must agree."""
    ds = vm_dataset
    for name in ("throttled", "oom", "cpu-only"):
        e = ds.scenario.execution(name)
        host = ds.scenario.host(e.hostname)
        gpus = ds.scenario.gpus_of(e)
        w = ds.truth.execution_window(name, 60_000)
        truth = ds.truth.host(e.hostname, gpus, w)
        for m in c.LYCEUM_METRICS:
            got = query_range(client, ds.url, promql(m, host, gpus, w.step_ms, 15_000), w, nocache="1")
            for t, want in truth[m.lyceum].stable_points():
                assert got.get(t) == pytest.approx(want, rel=1e-9, abs=1e-9), (name, m.lyceum, t)
