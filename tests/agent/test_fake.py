"""The scripted GPU reader: deterministic in time, every Lyceum GPU series for every GPU, plausible values."""

from __future__ import annotations

import itertools

from gpulens.agent.readers.fake import BUSY_W, FB_TOTAL_MIB, IDLE_W, FakeGpuReader
from gpulens.agent.samples import LYCEUM_GPU_SERIES, SERIES, Sample
from gpulens.domain import catalog as c

T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z


def by_series(samples: list[Sample]) -> dict[str, list[Sample]]:
    out: dict[str, list[Sample]] = {}
    for s in samples:
        out.setdefault(s.name, []).append(s)
    return out


def test_same_time_same_values_on_another_reader() -> None:
    a = FakeGpuReader("node-a", 4).read(T0)
    b = FakeGpuReader("node-a", 4).read(T0)
    assert a == b
    assert a != FakeGpuReader("node-a", 4).read(T0 + 30_000)  # time drives the pattern


def test_every_lyceum_gpu_series_for_every_gpu_with_dcgm_labels() -> None:
    samples = FakeGpuReader("node-a", 3).read(T0)
    assert {s.timestamp_ms for s in samples} == {T0}
    groups = by_series(samples)
    for name in LYCEUM_GPU_SERIES:
        assert [s.label(c.LABEL_GPU) for s in groups[name]] == ["0", "1", "2"], name
    assert set(groups) <= set(SERIES)  # every series has HELP/TYPE
    first = groups[c.DCGM_GPU_UTIL][0]
    assert [k for k, _ in first.labels] == ["gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname"]
    assert first.label("Hostname") == "node-a" and first.label("device") == "nvidia0"
    uuids = {s.label(c.LABEL_UUID) for s in groups[c.DCGM_GPU_UTIL]}
    assert len(uuids) == 3 and all(u.startswith("GPU-") for u in uuids)
    other_host = FakeGpuReader("node-b", 3).read(T0)
    assert uuids.isdisjoint({s.label(c.LABEL_UUID) for s in other_host})  # a fleet of demo agents


def test_values_are_plausible_over_a_period() -> None:
    reader = FakeGpuReader("h", 2, period_s=60)
    for k in range(0, 60, 3):
        g = by_series(reader.read(T0 + k * 1000))
        for i in range(2):
            util = g[c.DCGM_GPU_UTIL][i].value
            assert 0 <= util <= 100
            assert g[c.DCGM_FB_USED][i].value + g[c.DCGM_FB_FREE][i].value == FB_TOTAL_MIB
            assert 0 < g[c.DCGM_POWER_USAGE][i].value <= g[c.DCGM_ENFORCED_POWER_LIMIT][i].value
            assert g[c.DCGM_PCIE_RX_BYTES][i].value >= 0


def test_energy_counter_is_the_integral_of_power() -> None:
    reader = FakeGpuReader("h", 1, period_s=60)
    energy = [reader.energy_mj(T0 / 1000 + k, 0) for k in range(0, 121)]
    assert all(b > a for a, b in itertools.pairwise(energy))
    mean_w = (energy[-1] - energy[0]) / 120 / 1000  # two whole periods: the mean power
    assert abs(mean_w - (IDLE_W + BUSY_W * 0.5)) < 0.01
