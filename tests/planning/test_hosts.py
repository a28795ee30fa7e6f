"""Lyceum plans: one expression per catalog metric, escaped, aggregated across GPUs as
docs/compatibility.md ("Cross-GPU aggregations") lists."""

from __future__ import annotations

import pytest

from gpulens.domain import catalog as c
from gpulens.planning.hosts import HostPlanOptions, HostTarget, plan_host, rate_window_ms, split_gpus


def exprs(target: HostTarget, step_ms: int = 15_000, **opts: object) -> dict[str, str]:
    plan = plan_host(c.LYCEUM_METRICS, target, step_ms, HostPlanOptions(**opts))  # type: ignore[arg-type]
    return {p.metric.lyceum: p.expr for p in plan}


def test_one_expression_per_lyceum_key_in_catalog_order() -> None:
    plan = plan_host(c.LYCEUM_METRICS, HostTarget("h"), 15_000, HostPlanOptions())
    assert [p.metric.lyceum for p in plan] == list(c.LYCEUM_KEYS)
    assert len(plan) == 12


def test_gpu_util_collapses_each_gpu_and_tries_both_host_labels() -> None:
    e = exprs(HostTarget("gpu-node-1", ("0", "3")))["gpuUtilizationPercent"]
    assert e.startswith(
        '(avg(max by (gpu, UUID, GPU_I_ID) ((DCGM_FI_DEV_GPU_UTIL{Hostname="gpu-node-1",gpu=~"0|3"} or '
        'DCGM_FI_DEV_GPU_UTIL{hostname="gpu-node-1",gpu=~"0|3"}))))'
    )
    assert "100 * avg(max by (gpu, UUID, GPU_I_ID) ((DCGM_FI_PROF_GR_ENGINE_ACTIVE" in e


def test_cross_gpu_aggregations_mean_max_and_sum() -> None:
    """Mean: utilization, FB %, clocks; max: temperature; sum: power, power limit, PCIe."""
    e = exprs(HostTarget("h"))
    assert e["gpuTemperatureCelsius"].startswith("max((DCGM_FI_DEV_GPU_TEMP{")  # no collapse needed for max
    assert e["gpuPowerWatt"].startswith("sum(")
    assert (
        e["gpuPowerLimitWatt"].count("sum(") == 2 and "ENFORCED" in e["gpuPowerLimitWatt"].split(" or (")[0]
    )
    assert e["gpuClockSmMhz"].startswith("avg(")
    assert "1024 * sum(" in e["gpuPcieThroughputRxBytesPerSec"]
    assert e["gpuMemoryUtilizationPercent"].startswith("100 * avg(")


def test_uuids_and_indices_are_alternatives() -> None:
    uuid = "GPU-c4529c8d-69c4-b61d-e0bc-7b2460096005"
    e = exprs(HostTarget("h", ("1", uuid)), host_labels=("Hostname",))["gpuPowerWatt"]
    assert 'gpu=~"1"' in e and f'UUID=~"{uuid.replace("-", chr(92) * 2 + "-")}"' in e


def test_node_selection_by_instance_and_uname_instances() -> None:
    e = exprs(HostTarget("gpu-node-2", (), ("10.0.0.5:9100",)))
    assert 'instance=~"gpu\\\\-node\\\\-2(:[0-9]+)?|10\\\\.0\\\\.0\\\\.5:9100"' in e["systemRamTotalBytes"]
    only_instance = exprs(HostTarget("n", (), ("10.0.0.5:9100",)), node_match="instance")
    assert "10" not in only_instance["systemRamTotalBytes"]
    nothing = exprs(HostTarget("n"), node_match="nodename")
    assert 'instance=~""' in nothing["systemRamTotalBytes"]


def test_cpu_rate_window_is_max_of_step_and_four_scrapes() -> None:
    assert rate_window_ms(5_000, 15_000) == 60_000
    assert rate_window_ms(300_000, 15_000) == 300_000
    assert "[1m]" in exprs(HostTarget("h"), 5_000)["systemCpuUsagePercent"]
    assert "[5m]" in exprs(HostTarget("h"), 300_000)["systemCpuUsagePercent"]
    assert '{mode="idle",instance=~' in exprs(HostTarget("h"))["systemCpuUsagePercent"]


def test_metric_name_overrides() -> None:
    e = exprs(HostTarget("h"), metric_names={"DCGM_FI_DEV_GPU_UTIL": "dcgm_gpu_utilization"})
    assert "dcgm_gpu_utilization{" in e["gpuUtilizationPercent"]


@pytest.mark.parametrize("bad", ["0|1", 'GPU-x"}', "", "-1", "12345"])
def test_bad_gpu_ids_are_rejected(bad: str) -> None:
    with pytest.raises(ValueError):
        split_gpus([bad])


def test_hostname_injection_is_quoted() -> None:
    e = exprs(HostTarget('x"} or vector(1) or up{a="'))["gpuUtilizationPercent"]
    assert 'Hostname="x\\"} or vector(1) or up{a=\\""' in e
