"""Run:ai plans: the sampling grid and the PromQL per pod metricType."""

from __future__ import annotations

import pytest

from gpulens.domain import catalog as c
from gpulens.domain.models import Window
from gpulens.planning.pods import PodPlanOptions, PodTarget, interval_ms, plan_pod_metric, sample_grid

T = PodTarget.one("team-a", "train-0")
OPTS = PodPlanOptions()


def plan(type_: str, grid: Window | None = None, hist: str | None = None) -> list[str]:
    grid = grid or sample_grid(0, 600_000, 20)
    m = c.POD_METRICS_BY_TYPE[type_]
    return [q.expr for q in plan_pod_metric(m, T, grid, interval_ms(grid, 0, 15_000), OPTS, hist)]


@pytest.mark.parametrize(
    ("start", "end", "n", "points", "step"),
    [
        (0, 600_000, 20, 21, 30_000),
        (0, 600_000, 1, 2, 600_000),
        (0, 600_000, 0, 1, 1),
        (0, 1000, 7, 8, 142),
        (5, 5, 20, 1, 1),
        (0, 10, 1000, 11, 1),
    ],
)
def test_sample_grid(start: int, end: int, n: int, points: int, step: int) -> None:
    g = sample_grid(start, end, n)
    assert g.points == points and g.step_ms == step
    assert start <= g.start_ms and g.end_ms <= end
    if n == 0:
        assert g.start_ms == g.end_ms == end


def test_per_gpu_reads_both_pod_label_spellings_and_collapses() -> None:
    (e,) = plan("GPU_UTILIZATION_PER_GPU")
    assert e == (
        "max by (gpu, GPU_I_ID) ("
        '(DCGM_FI_DEV_GPU_UTIL{exported_namespace="team-a",exported_pod="train-0"} or '
        'DCGM_FI_DEV_GPU_UTIL{namespace="team-a",pod="train-0"}))'
    )


def test_units_and_aggregations() -> None:
    assert plan("GPU_MEMORY_USAGE_BYTES")[0].startswith("1048576 * sum(max by (gpu, GPU_I_ID)")
    assert plan("GPU_UTILIZATION")[0].startswith("avg(max by")
    assert plan("GPU_SM_ACTIVITY_PER_GPU")[0].startswith("100 * max by")
    assert plan("NVLINK_BANDWIDTH_TOTAL")[0].startswith("1024000 * sum(")
    bw = plan("GPU_MEMORY_BANDWIDTH_UTILIZATION_PER_GPU")[0]
    assert "DCGM_FI_PROF_DRAM_ACTIVE" in bw and ") or (max by" in bw and "DCGM_FI_DEV_MEM_COPY_UTIL" in bw


def test_cadvisor_excludes_pod_cgroup_and_sandbox() -> None:
    cpu = plan("CPU_USAGE_CORES")[0]
    assert cpu == (
        'sum(rate(container_cpu_usage_seconds_total{namespace="team-a",pod="train-0",container!="",'
        'container!="POD"}[1m]))'
    )


def test_vllm_success_splits_finished_reason() -> None:
    ok = plan("VLLM_REQUEST_SUCCESS")
    assert ok == [
        'sum(increase(vllm:request_success_total{namespace="team-a",pod="train-0",'
        'finished_reason=~"stop|length"}[30s]))'
    ]
    fail = plan("NIM_REQUEST_FAILURE_TOTAL")
    assert fail[0] == 'sum(increase(request_failure_total{namespace="team-a",pod="train-0"}[30s]))'
    assert 'finished_reason!~"stop|length"' in fail[1]


def test_histograms_only_with_a_discovered_name() -> None:
    assert plan("VLLM_TIME_TO_FIRST_TOKEN_SECONDS_PERCENTILES") == []
    (p,) = plan(
        "VLLM_TIME_TO_FIRST_TOKEN_SECONDS_PERCENTILES", hist="vllm:time_to_first_token_seconds_bucket"
    )
    parts = p.split(" or ")
    assert [x.split(",")[0] for x in parts] == [
        f"label_replace(histogram_quantile({q}" for q in ("0.5", "0.9", "0.99")
    ]
    assert [x.split(", ")[-3] for x in parts] == ['"p50"', '"p90"', '"p99"']
    assert "sum by (le) (rate(vllm:time_to_first_token_seconds_bucket{" in p
    assert plan("NIM_TIME_TO_FIRST_TOKEN_SECONDS", hist="time_to_first_token_seconds_bucket") == [
        'sum by (le) (increase(time_to_first_token_seconds_bucket{namespace="team-a",pod="train-0"}[30s]))'
    ]


def test_counts_use_the_sample_interval() -> None:
    grid = sample_grid(600_000, 1_200_000, 10)
    m = c.POD_METRICS_BY_TYPE["VLLM_REQUEST_SUCCESS"]
    (q,) = plan_pod_metric(m, T, grid, interval_ms(grid, 600_000, 15_000), OPTS)
    assert q.window == grid and q.expr.endswith("[1m]))")
    one = sample_grid(600_000, 1_200_000, 0)
    (q0,) = plan_pod_metric(m, T, one, interval_ms(one, 600_000, 15_000), OPTS)
    assert q0.window == Window(1_200_000, 1_200_000, 1) and q0.expr.endswith("[10m]))")


def test_swap_memory_has_no_source() -> None:
    assert plan("GPU_SWAP_MEMORY_BYTES_PER_GPU") == []


def test_every_type_plans() -> None:
    for m in c.POD_METRICS:
        plan(m.type, hist="x_bucket")


def test_workload_targets_select_all_pods_and_keep_nodes_apart() -> None:
    w = PodTarget((("team-a", "w-1"), ("team-a", "w-0"), ("team-b", "w-2")))
    grid = sample_grid(0, 600_000, 20)
    m = c.POD_METRICS_BY_TYPE["GPU_UTILIZATION"]
    (q,) = plan_pod_metric(m, w, grid, interval_ms(grid, 0, 15_000), OPTS)
    assert r'exported_namespace="team-a",exported_pod=~"w\\-0|w\\-1"' in q.expr
    assert 'namespace="team-b",pod="w-2"' in q.expr
    assert "max by (gpu, GPU_I_ID, Hostname, hostname)" in q.expr


def test_multi_namespace_workloads_keep_ranges_on_single_selectors() -> None:
    """`rate((a or b)[w])` is not PromQL: the `or` goes around the range functions."""
    w = PodTarget((("team-a", "w-0"), ("team-b", "w-1")))
    grid = sample_grid(0, 600_000, 20)
    for type_ in ("CPU_USAGE_CORES", "NIM_REQUEST_SUCCESS_TOTAL", "NIM_TIME_TO_FIRST_TOKEN_SECONDS"):
        m = c.POD_METRICS_BY_TYPE[type_]
        for q in plan_pod_metric(m, w, grid, interval_ms(grid, 0, 15_000), OPTS, "x_bucket"):
            assert ")[" not in q.expr, q.expr
            assert " or " in q.expr


def test_pod_layout_drops_spellings_sources_and_collapses_that_cannot_matter() -> None:
    from gpulens.planning.pods import PodPlanOptions, derive_pod_layout, layout_matches, plan_pod_metric

    target = PodTarget.one("ml", "trainer-0")
    util = c.POD_METRICS_BY_TYPE["GPU_UTILIZATION"]
    memory = c.POD_METRICS_BY_TYPE["GPU_MEMORY_USAGE_BYTES"]
    lookups = layout_matches(target, [util, memory], {})
    assert [sp for sp, _ in lookups] == [("exported_namespace", "exported_pod"), ("namespace", "pod")]
    found = [
        (
            lookups[0][0],
            [
                {"__name__": c.DCGM_GPU_UTIL, "gpu": "0"},
                {"__name__": c.DCGM_FB_USED, "gpu": "0"},
                {"__name__": c.DCGM_FB_USED, "gpu": "0", "container": "x"},
            ],
        ),
        (lookups[1][0], []),
    ]
    layout = derive_pod_layout(target, [util, memory], found, {})
    assert layout.dcgm_spellings == (("exported_namespace", "exported_pod"),)
    assert layout.duplicated == {c.DCGM_FB_USED}
    grid = Window(0, 3_600_000, 60_000)
    (q,) = plan_pod_metric(util, target, grid, 60_000, PodPlanOptions(), layout=layout)
    assert q.expr == 'avg(DCGM_FI_DEV_GPU_UTIL{exported_namespace="ml",exported_pod="trainer-0"})'
    (q,) = plan_pod_metric(memory, target, grid, 60_000, PodPlanOptions(), layout=layout)
    assert "max by (gpu, GPU_I_ID)" in q.expr and " or " not in q.expr
    nothing = derive_pod_layout(target, [util], [(sp, []) for sp, _ in lookups], {})
    assert plan_pod_metric(util, target, grid, 60_000, PodPlanOptions(), layout=nothing) == []
