"""Run:ai plans: the sampling grid and the PromQL per pod metricType."""

from __future__ import annotations

import pytest

from gpulens.domain import catalog as c
from gpulens.domain.models import Window
from gpulens.planning.pods import (
    PodPlanOptions,
    PodTarget,
    collapse_key,
    interval_ms,
    plan_pod_metric,
    sample_grid,
)

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


def test_gpu_reads_ask_both_pod_label_spellings_plainly() -> None:
    """No guard in the query: a GPU's series are made one in shaping (shaping/pod_gpus.py)."""
    (e,) = plan("GPU_UTILIZATION_PER_GPU")
    assert e == (
        '(DCGM_FI_DEV_GPU_UTIL{exported_namespace="team-a",exported_pod="train-0"} or '
        'DCGM_FI_DEV_GPU_UTIL{namespace="team-a",pod="train-0"})'
    )


def test_a_metric_type_and_its_per_gpu_twin_read_the_same_query() -> None:
    assert plan("GPU_UTILIZATION") == plan("GPU_UTILIZATION_PER_GPU")
    assert plan("GPU_MEMORY_USAGE_BYTES") == plan("GPU_MEMORY_USAGE_BYTES_PER_GPU")
    assert plan("NVLINK_BANDWIDTH_TOTAL") == plan("NVLINK_BANDWIDTH_TOTAL_PER_GPU")


def test_units_and_fallback_sources() -> None:
    assert plan("GPU_MEMORY_USAGE_BYTES")[0].startswith("1048576 * (DCGM_FI_DEV_FB_USED{")
    assert plan("GPU_SM_ACTIVITY_PER_GPU")[0].startswith("100 * (DCGM_FI_PROF_SM_ACTIVE{")
    assert plan("NVLINK_BANDWIDTH_TOTAL")[0].startswith("1024000 * (")
    dram, copy = plan("GPU_MEMORY_BANDWIDTH_UTILIZATION_PER_GPU")  # fallback order, one query each
    assert dram.startswith("100 * (DCGM_FI_PROF_DRAM_ACTIVE{")
    assert copy.startswith("(DCGM_FI_DEV_MEM_COPY_UTIL{")
    assert all(" by " not in q for q in plan("GPU_UTILIZATION") + plan("GPU_MEMORY_USAGE_BYTES"))


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
    # GPU 0 of one node is not GPU 0 of another: shaping makes one series per GPU of each node
    assert collapse_key(w) == ("gpu", "GPU_I_ID", "Hostname", "hostname")
    assert collapse_key(T) == ("gpu", "GPU_I_ID")


def test_multi_namespace_workloads_keep_ranges_on_single_selectors() -> None:
    """`rate((a or b)[w])` is not PromQL: the `or` goes around the range functions."""
    w = PodTarget((("team-a", "w-0"), ("team-b", "w-1")))
    grid = sample_grid(0, 600_000, 20)
    for type_ in ("CPU_USAGE_CORES", "NIM_REQUEST_SUCCESS_TOTAL", "NIM_TIME_TO_FIRST_TOKEN_SECONDS"):
        m = c.POD_METRICS_BY_TYPE[type_]
        for q in plan_pod_metric(m, w, grid, interval_ms(grid, 0, 15_000), OPTS, "x_bucket"):
            assert ")[" not in q.expr, q.expr
            assert " or " in q.expr


def test_pod_layout_drops_spellings_and_sources_that_cannot_matter() -> None:
    from gpulens.planning.pods import PodPlanOptions, derive_pod_layout, layout_matches, plan_pod_metric

    target = PodTarget.one("ml", "trainer-0")
    util = c.POD_METRICS_BY_TYPE["GPU_UTILIZATION"]
    memory = c.POD_METRICS_BY_TYPE["GPU_MEMORY_USAGE_BYTES"]
    lookups = layout_matches(target, [util, memory], PodPlanOptions())
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
    layout = derive_pod_layout([util, memory], found, PodPlanOptions())
    assert layout.dcgm_spellings == (("exported_namespace", "exported_pod"),)
    grid = Window(0, 3_600_000, 60_000)
    (q,) = plan_pod_metric(util, target, grid, 60_000, PodPlanOptions(), layout=layout)
    assert q.expr == 'DCGM_FI_DEV_GPU_UTIL{exported_namespace="ml",exported_pod="trainer-0"}'
    (q,) = plan_pod_metric(memory, target, grid, 60_000, PodPlanOptions(), layout=layout)
    assert q.expr == '1048576 * DCGM_FI_DEV_FB_USED{exported_namespace="ml",exported_pod="trainer-0"}'
    nothing = derive_pod_layout([util], [(sp, []) for sp, _ in lookups], PodPlanOptions())
    assert plan_pod_metric(util, target, grid, 60_000, PodPlanOptions(), layout=nothing) == []
