"""The demo's generator (gpulens.demo.history) over the default scenario: determinism, exporter-exact
labels, the value model, scenario validation."""

from __future__ import annotations

import re

import pytest

from gpulens.demo.history import CPU_MODES, TICKS_PER_SECOND, Field, SeriesDef, generate
from gpulens.demo.scenario import (
    DEFAULT_END_S,
    ExecutionSpec,
    Phase,
    PhaseKind,
    Scenario,
    default_scenario,
)
from gpulens.domain import catalog as c

SC = default_scenario()
DS = generate(SC)


def k_of(t_s: int) -> int:
    return (t_s - SC.start_s) // SC.scrape_interval_s


def of(hostname: str, field: Field, gpus: tuple[int, ...] | None = None) -> list[SeriesDef]:
    """A host's series of one field, in the dataset's order (GPU index; CPU then mode)."""
    return [
        s
        for s in DS.series
        if s.hostname == hostname and s.field is field and (gpus is None or s.gpu in gpus)
    ]


def at(series: SeriesDef, k: int) -> float:
    [value] = DS.values(series, k, k + 1)
    return value


def test_same_seed_same_history_other_seed_other_history() -> None:
    a, b, other = (generate(default_scenario(seed=seed, hours=1)) for seed in (3, 3, 4))
    assert a.series == b.series
    assert all(a.values(s) == b.values(t) for s, t in zip(a.series, b.series, strict=True))
    assert a.series != other.series  # GPU UUIDs are drawn from the seed
    assert [a.values(s) for s in a.series[:20]] != [other.values(s) for s in other.series[:20]]


def test_default_scenario_shape() -> None:
    assert SC.end_s == DEFAULT_END_S == 1767225600  # 2026-01-01T00:00:00Z
    assert SC.end_s - SC.start_s == 3 * 3600
    assert [h.hostname for h in SC.hosts] == ["gpu-node-1", "gpu-node-2", "cpu-node-1"]
    node1, node2, cpu1 = SC.hosts
    assert (len(node1.gpus), node1.host_label, node1.node.instance) == (8, "Hostname", "gpu-node-1:9100")
    assert (len(node2.gpus), node2.host_label, node2.node.instance) == (2, "hostname", "10.0.0.5:9100")
    assert node2.pcie_kbps and node2.power_limit_series == c.DCGM_POWER_MGMT_LIMIT
    assert cpu1.gpu_model is None and not cpu1.gpus
    assert {e.name for e in SC.executions} == {"healthy", "throttled", "oom", "input-bound", "cpu-only"}
    assert SC.gpus_of(SC.execution("healthy")) == (0, 3)
    assert SC.gpus_of(SC.execution("oom")) == (0, 1)  # empty list = every GPU of the host
    assert len({g.uuid for h in SC.hosts for g in h.gpus}) == 10
    assert default_scenario(seed=7).hosts[0].gpus == default_scenario(seed=7).hosts[0].gpus


def test_dcgm_labels_are_exporter_exact() -> None:
    [s] = of("gpu-node-1", Field.GPU_UTIL, (3,))
    gpu = SC.hosts[0].gpus[3]
    assert s.name == c.DCGM_GPU_UTIL
    assert s.labels == (
        ("gpu", "3"),
        ("UUID", gpu.uuid),
        ("pci_bus_id", gpu.pci_bus_id),
        ("device", "nvidia3"),
        ("modelName", "NVIDIA H100 80GB HBM3"),
        ("Hostname", "gpu-node-1"),
        ("DCGM_FI_DRIVER_VERSION", "580.105.08"),
        ("instance", "gpu-node-1:9400"),
        ("job", "dcgm"),
    )
    assert re.fullmatch(r"GPU-[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}", gpu.uuid)
    lower = dict(of("gpu-node-2", Field.GPU_UTIL)[0].labels)
    assert lower["hostname"] == "gpu-node-2" and "Hostname" not in lower


def test_host_flavours_pick_series_names() -> None:
    names = {
        h: {s.name for s in DS.series if s.hostname == h} for h in ("gpu-node-1", "gpu-node-2", "cpu-node-1")
    }
    assert {c.DCGM_ENFORCED_POWER_LIMIT, c.DCGM_PCIE_RX_BYTES, c.DCGM_PCIE_TX_BYTES} <= names["gpu-node-1"]
    assert not {c.DCGM_POWER_MGMT_LIMIT, c.DCGM_PCIE_RX_THROUGHPUT} & names["gpu-node-1"]
    assert {c.DCGM_POWER_MGMT_LIMIT, c.DCGM_PCIE_RX_THROUGHPUT, c.DCGM_PCIE_TX_THROUGHPUT} <= names[
        "gpu-node-2"
    ]
    assert not {c.DCGM_ENFORCED_POWER_LIMIT, c.DCGM_PCIE_RX_BYTES} & names["gpu-node-2"]
    assert names["cpu-node-1"] == {
        c.NODE_MEM_TOTAL,
        c.NODE_MEM_AVAILABLE,
        c.NODE_CPU_SECONDS,
        c.NODE_UNAME_INFO,
    }
    assert all(dict(s.labels).keys() >= {"instance", "job"} for s in DS.series)


def test_node_exporter_series() -> None:
    uname = dict(of("gpu-node-2", Field.UNAME)[0].labels)
    assert uname["nodename"] == "gpu-node-2" and uname["instance"] == "10.0.0.5:9100"
    assert {"sysname", "release", "machine"} <= uname.keys() and uname["job"] == "node"
    cpus = of("gpu-node-1", Field.CPU_SECONDS)
    assert len(cpus) == 8 * len(CPU_MODES)
    assert {s.mode for s in cpus} == {"idle", "iowait", "user", "system"}
    assert all(s.metric_type == "counter" for s in cpus)


def test_values_slices_agree_and_samples_are_timed() -> None:
    for s in DS.series[::7]:
        whole = DS.values(s)
        assert DS.values(s, 100, 260) == whole[100:260]
        assert DS.values(s, -5, 3) == whole[:3] and DS.values(s, 720, 10_000) == whole[720:]
    assert len(DS.values(DS.series[0])) == SC.sample_count == 721
    first, *_, last = DS.samples(DS.series[0])
    assert (first[0], last[0]) == (SC.start_s, SC.end_s)


def test_fb_used_plus_free_is_constant() -> None:
    for host in SC.hosts[:2]:
        assert host.gpu_model is not None
        cap = host.gpu_model.fb_capacity_mib
        for used, free in zip(
            of(host.hostname, Field.FB_USED), of(host.hostname, Field.FB_FREE), strict=True
        ):
            assert {u + f for u, f in zip(DS.values(used), DS.values(free), strict=True)} == {cap}


def test_oom_fills_the_frame_buffer_then_the_execution_ends() -> None:
    oom = SC.execution("oom")
    free = of("gpu-node-2", Field.FB_FREE)
    end = k_of(oom.end_s)
    last_phase = oom.spans()[-1]
    assert last_phase.phase.kind is PhaseKind.OOM
    climb = DS.values(free[0], k_of(last_phase.start_s) + 1, end + 1)
    assert climb == sorted(climb, reverse=True) and climb[-1] == 0
    assert all(at(s, end) == 0 for s in free)
    assert all(at(s, end + 1) > 0 for s in free)  # memory released once it is gone


def test_phase_signatures_and_unowned_gpus() -> None:
    healthy = SC.execution("healthy")
    steady = next(s for s in healthy.spans() if s.phase.kind is PhaseKind.STEADY)
    k = k_of(steady.start_s) + 40
    util = {s.gpu: at(s, k) for s in of("gpu-node-1", Field.GPU_UTIL)}
    fb = {s.gpu: at(s, k) for s in of("gpu-node-1", Field.FB_USED)}
    sm = {s.gpu: at(s, k) for s in of("gpu-node-1", Field.SM_CLOCK)}
    assert 90 <= util[0] <= 98 and 90 <= util[3] <= 98
    assert util[1] == util[2] == 0 and fb[1] == fb[2] == 0  # unowned GPUs idle, empty
    assert sm[0] == 1980 and sm[1] == 345
    throttle = next(s for s in SC.execution("throttled").spans() if s.phase.kind is PhaseKind.THROTTLE)
    k = k_of(throttle.end_s)
    power = [at(s, k) for s in of("gpu-node-1", Field.POWER, (4, 5, 6, 7))]
    temp = [at(s, k) for s in of("gpu-node-1", Field.GPU_TEMP, (4, 5, 6, 7))]
    assert all(699 <= p <= 700 for p in power) and all(86 <= t <= 88 for t in temp)


def test_cpu_counters_grow_by_the_phase_percentage() -> None:
    stall = next(s for s in SC.execution("input-bound").spans() if s.phase.kind is PhaseKind.INPUT_STALL)
    k = k_of(stall.start_s) + 20
    busy = 90  # host base 5 + input stall 85
    for s in of("gpu-node-2", Field.CPU_SECONDS):
        ticks = round((at(s, k) - at(s, k - 1)) * TICKS_PER_SECOND)
        if s.mode == "idle":
            assert ticks == SC.scrape_interval_s * (100 - busy)
        assert ticks >= 0
    total = sum(
        round((at(s, k) - at(s, k - 1)) * TICKS_PER_SECOND)
        for s in of("gpu-node-2", Field.CPU_SECONDS)
        if s.cpu == 0
    )
    assert total == SC.scrape_interval_s * TICKS_PER_SECOND


def test_scenario_validation() -> None:
    host = SC.hosts[0]
    a = ExecutionSpec("a", "a", host.hostname, (0,), SC.start_s, (Phase(PhaseKind.STEADY, 600),))
    b = ExecutionSpec("b", "b", host.hostname, (0, 1), SC.start_s + 300, (Phase(PhaseKind.STEADY, 600),))
    with pytest.raises(ValueError, match="overlap"):
        Scenario("x", 1, SC.start_s, SC.end_s, (host,), (a, b))
    odd = ExecutionSpec("c", "c", host.hostname, (0,), SC.start_s + 7, (Phase(PhaseKind.STEADY, 600),))
    with pytest.raises(ValueError, match="scrape intervals"):
        Scenario("x", 1, SC.start_s, SC.end_s, (host,), (odd,))
