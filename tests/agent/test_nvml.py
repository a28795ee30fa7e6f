"""The NVML reader on a scripted `pynvml`: units, once-only logging, omitted series, no GPU, no library."""

from __future__ import annotations

import logging
import types

import pynvml as real_nvml
import pytest

from gpulens.agent.readers import nvml as nvml_reader
from gpulens.agent.readers.nvml import NvmlReader, open_nvml_reader, to_series_units
from gpulens.agent.samples import LYCEUM_GPU_SERIES, Sample
from gpulens.domain import catalog as c
from tests.agent.conftest import MIB, FakeGpu, fake_pynvml

NOW = 1_767_225_600_000


def values(samples: list[Sample], gpu: str = "0") -> dict[str, float]:
    return {s.name: s.value for s in samples if s.label(c.LABEL_GPU) == gpu and not s.label(c.LABEL_PID)}


def open_reader(gpus: list[FakeGpu], **kw: object) -> tuple[NvmlReader, types.ModuleType]:
    module = fake_pynvml(gpus, **kw)  # type: ignore[arg-type]
    reader = open_nvml_reader("gpu-node-1", nvml=module)
    assert reader is not None
    return reader, module


def test_units_become_the_dcgm_series_units() -> None:
    gpu = FakeGpu()
    reader, _ = open_reader([gpu])
    try:
        v = values(reader.read(NOW))
    finally:
        reader.close()
    assert v[c.DCGM_GPU_UTIL] == 87 and v[c.DCGM_MEM_COPY_UTIL] == 41
    assert v[c.DCGM_FB_USED] == 21_383 and v[c.DCGM_FB_TOTAL] == 81_559  # whole MiB
    assert v[c.DCGM_FB_FREE] == 81_559 - 21_383 - 1  # free = total - used, floored
    assert v[c.DCGM_POWER_USAGE] == pytest.approx(413.611)
    assert v[c.DCGM_ENFORCED_POWER_LIMIT] == 700 and v[c.DCGM_POWER_MGMT_LIMIT] == 690
    assert v[c.DCGM_TOTAL_ENERGY_CONSUMPTION] == 9_876_543_210  # mJ, as DCGM
    assert v[c.DCGM_SM_CLOCK] == 1_980 and v[c.DCGM_MEM_CLOCK] == 2_619
    assert v[c.DCGM_PCIE_RX_BYTES] == 1_500 * 1024 and v[c.DCGM_PCIE_TX_BYTES] == 250 * 1024
    assert v[c.DCGM_CLOCK_THROTTLE_REASONS] == 4
    assert v[c.DCGM_ECC_SBE_VOL_TOTAL] == 3 and v[c.DCGM_ECC_DBE_VOL_TOTAL] == 0
    assert v[c.DCGM_XID_ERRORS] == 0
    assert v[c.DCGM_GPU_TEMP] == 61
    assert set(LYCEUM_GPU_SERIES) <= set(v)


def test_memory_v2_splits_out_the_reservation_as_dcgm() -> None:
    gpu = FakeGpu(mem_used=20_000 * MIB, mem_reserved=500 * MIB)
    reader, _ = open_reader([gpu], memory_v2=True)
    try:
        v = values(reader.read(NOW))
    finally:
        reader.close()
    assert v[c.DCGM_FB_USED] == 20_000 and v[c.DCGM_FB_RESERVED] == 500
    assert v[c.DCGM_FB_FREE] == 81_559 - 20_500


def test_memory_v2_unsupported_falls_back_to_v1(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="gpulens.agent")
    gpu = FakeGpu(mem_used=20_000 * MIB, mem_reserved=500 * MIB)
    gpu.unsupported.add(f"nvmlDeviceGetMemoryInfo{(real_nvml.nvmlMemory_v2,)}")
    reader, module = open_reader([gpu], memory_v2=True)
    try:
        passes = [values(reader.read(NOW + k)) for k in range(2)]
    finally:
        reader.close()
    for v in passes:
        assert v[c.DCGM_FB_USED] == 20_500 and c.DCGM_FB_RESERVED not in v
    assert module.calls[("nvmlDeviceGetMemoryInfo", 0, real_nvml.nvmlMemory_v2)] == 1  # type: ignore[attr-defined]
    assert sum("memory_v2" in r.getMessage() for r in caplog.records) == 1


def test_conversion_table_is_the_one_place() -> None:
    assert to_series_units(c.DCGM_PCIE_RX_BYTES, 2) == 2 * c.KIB
    assert to_series_units(c.DCGM_FB_USED, 3 * MIB + 5) == 3
    assert to_series_units(c.DCGM_POWER_USAGE, 250_000) == pytest.approx(250.0)
    assert to_series_units(c.DCGM_GPU_TEMP, 40) == 40.0


def test_labels_are_dcgm_exporters() -> None:
    reader, _ = open_reader([FakeGpu(), FakeGpu(uuid="GPU-2", bus_id=b"00000000:64:00.0")])
    try:
        util = [s for s in reader.read(NOW) if s.name == c.DCGM_GPU_UTIL]
    finally:
        reader.close()
    assert util[0].labels == (
        ("gpu", "0"),
        ("UUID", "GPU-c4529c8d-69c4-b61d-e0bc-7b2460096005"),
        ("pci_bus_id", "00000000:53:00.0"),
        ("device", "nvidia0"),
        ("modelName", "NVIDIA H100 80GB HBM3"),
        ("Hostname", "gpu-node-1"),
    )
    assert util[1].label("UUID") == "GPU-2" and util[1].label("device") == "nvidia1"
    assert all(s.timestamp_ms == NOW for s in util)


def test_each_device_is_read_once_per_pass() -> None:
    reader, module = open_reader([FakeGpu(), FakeGpu(), FakeGpu()])
    try:
        module.calls.clear()  # type: ignore[attr-defined]
        reader.read(NOW)
    finally:
        reader.close()
    calls = module.calls  # type: ignore[attr-defined]
    assert calls and all(n == 1 for n in calls.values()), calls  # none repeated
    n = real_nvml
    per_pass = {
        ("nvmlDeviceGetUtilizationRates",),
        ("nvmlDeviceGetMemoryInfo",),
        ("nvmlDeviceGetTemperature", n.NVML_TEMPERATURE_GPU),
        ("nvmlDeviceGetPowerUsage",),
        ("nvmlDeviceGetEnforcedPowerLimit",),
        ("nvmlDeviceGetPowerManagementLimit",),
        ("nvmlDeviceGetTotalEnergyConsumption",),
        ("nvmlDeviceGetClockInfo", n.NVML_CLOCK_SM),
        ("nvmlDeviceGetClockInfo", n.NVML_CLOCK_MEM),
        ("nvmlDeviceGetPcieThroughput", n.NVML_PCIE_UTIL_TX_BYTES),
        ("nvmlDeviceGetPcieThroughput", n.NVML_PCIE_UTIL_RX_BYTES),
        ("nvmlDeviceGetCurrentClocksEventReasons",),
        ("nvmlDeviceGetTotalEccErrors", n.NVML_MEMORY_ERROR_TYPE_CORRECTED, n.NVML_VOLATILE_ECC),
        ("nvmlDeviceGetTotalEccErrors", n.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, n.NVML_VOLATILE_ECC),
        ("nvmlDeviceGetComputeRunningProcesses",),
        ("nvmlDeviceGetGraphicsRunningProcesses",),
    }
    assert set(calls) == {(name, h, *args) for h in range(3) for name, *args in per_pass}


def test_unsupported_call_is_logged_once_and_its_series_left_out(caplog: pytest.LogCaptureFixture) -> None:
    gpus = [
        FakeGpu(unsupported={"nvmlDeviceGetPowerUsage", "nvmlDeviceGetTotalEnergyConsumption"}),
        FakeGpu(unsupported={"nvmlDeviceGetPowerUsage"}),
    ]
    caplog.set_level(logging.INFO, logger="gpulens.agent")
    reader, module = open_reader(gpus)
    try:
        passes = [reader.read(NOW + k * 1000) for k in range(3)]
    finally:
        reader.close()
    for samples in passes:
        names0, names1 = set(values(samples, "0")), set(values(samples, "1"))
        assert c.DCGM_POWER_USAGE not in names0 | names1  # never a fake 0
        assert c.DCGM_TOTAL_ENERGY_CONSUMPTION not in names0 and c.DCGM_TOTAL_ENERGY_CONSUMPTION in names1
        assert c.DCGM_GPU_UTIL in names0 and c.DCGM_GPU_UTIL in names1
    lines = [r.getMessage() for r in caplog.records if "not available" in r.getMessage()]
    assert sum("power " in m for m in lines) == 1, lines
    assert sum("energy" in m for m in lines) == 1, lines
    assert any(c.DCGM_POWER_USAGE in m for m in lines)
    # and NVML is not asked again
    calls = module.calls  # type: ignore[attr-defined]
    assert calls[("nvmlDeviceGetPowerUsage", 0)] == 1 and calls[("nvmlDeviceGetPowerUsage", 1)] == 1


def test_transient_error_leaves_the_value_out_of_that_pass_only(caplog: pytest.LogCaptureFixture) -> None:
    gpu = FakeGpu()
    reader, module = open_reader([gpu])
    real_temp = module.nvmlDeviceGetTemperature  # type: ignore[attr-defined]
    broken = {"on": True}

    def flaky(handle: int, sensor: int) -> int:
        if broken["on"]:
            raise real_nvml.NVMLError(real_nvml.NVML_ERROR_UNKNOWN)
        result: int = real_temp(handle, sensor)
        return result

    module.nvmlDeviceGetTemperature = flaky  # type: ignore[attr-defined]
    try:
        first = values(reader.read(NOW))
        second = values(reader.read(NOW + 1000))
        broken["on"] = False
        third = values(reader.read(NOW + 2000))
    finally:
        reader.close()
    assert c.DCGM_GPU_TEMP not in first and c.DCGM_GPU_TEMP not in second
    assert third[c.DCGM_GPU_TEMP] == 61
    assert sum("temperature failed" in r.getMessage() for r in caplog.records) == 1


def test_xid_events_and_process_memory() -> None:
    gpu = FakeGpu(
        compute=[types.SimpleNamespace(pid=4242, usedGpuMemory=512 * MIB)],
        graphics=[
            types.SimpleNamespace(pid=4242, usedGpuMemory=512 * MIB),
            types.SimpleNamespace(pid=7, usedGpuMemory=None),  # NVML hides it (e.g. containers)
        ],
    )
    reader, _ = open_reader([gpu])
    try:
        assert values(reader.read(NOW))[c.DCGM_XID_ERRORS] == 0
        gpu.xids.extend([13, 79])
        samples = reader.read(NOW + 1000)
        later = values(reader.read(NOW + 2000))
    finally:
        reader.close()
    assert values(samples)[c.DCGM_XID_ERRORS] == 79 and later[c.DCGM_XID_ERRORS] == 79  # the last one
    procs = [s for s in samples if s.name == c.GPULENS_PROCESS_GPU_MEMORY]
    assert [(s.label(c.LABEL_PID), s.value) for s in procs] == [("4242", 512.0 * MIB)]
    assert procs[0].label(c.LABEL_UUID) == gpu.uuid


def test_xid_registration_unsupported_means_no_xid_series(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="gpulens.agent")
    reader, _ = open_reader([FakeGpu(unsupported={"nvmlDeviceRegisterEvents"})])
    try:
        assert c.DCGM_XID_ERRORS not in values(reader.read(NOW))
    finally:
        reader.close()
    assert sum("xid_events not available" in r.getMessage() for r in caplog.records) == 1


def test_no_event_api_still_reads_the_rest() -> None:
    reader, _ = open_reader([FakeGpu()], events=False)
    try:
        v = values(reader.read(NOW))
    finally:
        reader.close()
    assert c.DCGM_XID_ERRORS not in v and c.DCGM_GPU_UTIL in v


def test_no_library_means_no_reader_and_one_line(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    caplog.set_level(logging.INFO, logger="gpulens.agent")
    monkeypatch.setattr(
        nvml_reader, "pynvml", fake_pynvml([], init_error=real_nvml.NVML_ERROR_LIBRARY_NOT_FOUND)
    )
    assert open_nvml_reader("h") is None  # the default module, replaced
    assert len(caplog.records) == 1
    assert "host series only" in caplog.records[0].getMessage()


def test_no_gpu_means_no_reader_and_one_line(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="gpulens.agent")
    module = fake_pynvml([])
    assert open_nvml_reader("h", nvml=module) is None
    assert [r.getMessage() for r in caplog.records] == ["NVML found no GPU: collecting host series only"]
    assert module.state == {"init": 1, "shutdown": 1}  # type: ignore[attr-defined]


def test_old_binding_without_clocks_event_reasons_uses_the_throttle_name() -> None:
    module = fake_pynvml([FakeGpu()])
    module.nvmlDeviceGetCurrentClocksThrottleReasons = module.nvmlDeviceGetCurrentClocksEventReasons  # type: ignore[attr-defined]
    del module.nvmlDeviceGetCurrentClocksEventReasons
    reader = open_nvml_reader("h", nvml=module)
    assert reader is not None
    try:
        assert values(reader.read(NOW))[c.DCGM_CLOCK_THROTTLE_REASONS] == 4
    finally:
        reader.close()


def test_close_shuts_nvml_down() -> None:
    reader, module = open_reader([FakeGpu(), FakeGpu()])
    reader.close()
    assert module.state == {"init": 1, "shutdown": 1}  # type: ignore[attr-defined]


def _procs(*pids: int, mib: int = 100) -> list[types.SimpleNamespace]:
    return [types.SimpleNamespace(pid=p, usedGpuMemory=mib * MIB) for p in pids]


def test_process_series_are_bounded_per_run_and_the_rest_summed_and_counted() -> None:
    """With GPULENS_MAX_PROCESS_SERIES=3 over two GPUs: the first three (GPU, PID) pairs keep their
    series for the whole run, whichever pass they are seen in; later processes are summed into
    their GPU's pid="other" series and counted once per appearance in the dropped counter."""
    gpus = [FakeGpu(compute=_procs(10, 11)), FakeGpu(uuid="GPU-second", compute=_procs(20))]
    module = fake_pynvml(gpus)
    reader = open_nvml_reader("gpu-node-1", nvml=module, max_process_series=3)
    assert reader is not None

    def memory(samples: list[Sample]) -> dict[tuple[str, str], float]:
        return {
            (s.label(c.LABEL_GPU), s.label(c.LABEL_PID)): s.value
            for s in samples
            if s.name == c.GPULENS_PROCESS_GPU_MEMORY
        }

    def dropped(samples: list[Sample]) -> dict[str, float]:
        return {s.label(c.LABEL_GPU): s.value for s in samples if s.name == c.GPULENS_PROCESS_SERIES_DROPPED}

    try:
        first = reader.read(NOW)
        gpus[0].compute = _procs(10, 12, 13)  # 11 exited; 12 and 13 are new, the bound is reached
        gpus[1].compute = _procs(20, 21, mib=50)
        second = reader.read(NOW + 1000)
        third = reader.read(NOW + 2000)  # the same processes: not counted again
        gpus[0].compute = _procs(11)  # 11 had a series this run: it keeps it
        gpus[1].compute = _procs(21, 22, 23, mib=50)
        fourth = reader.read(NOW + 3000)
    finally:
        reader.close()
    assert memory(first) == {("0", "10"): 100 * MIB, ("0", "11"): 100 * MIB, ("1", "20"): 100 * MIB}
    assert dropped(first) == {}  # no counter before anything is dropped
    assert memory(second) == {
        ("0", "10"): 100 * MIB,
        ("0", c.PID_OTHER): 200 * MIB,  # 12 + 13
        ("1", "20"): 50 * MIB,
        ("1", c.PID_OTHER): 50 * MIB,  # 21
    }
    assert dropped(second) == {"0": 2, "1": 1}
    assert memory(third) == memory(second) and dropped(third) == {"0": 2, "1": 1}
    assert memory(fourth) == {("0", "11"): 100 * MIB, ("1", c.PID_OTHER): 150 * MIB}
    assert dropped(fourth) == {"0": 2, "1": 3}  # 22 and 23 are new refusals; 21 was refused already
    distinct = {k for p in (first, second, third, fourth) for k in memory(p)}
    assert len({k for k in distinct if k[1] != c.PID_OTHER}) == 3


def test_process_series_off_sums_every_process() -> None:
    module = fake_pynvml([FakeGpu(compute=_procs(1, 2))])
    reader = open_nvml_reader("gpu-node-1", nvml=module, max_process_series=0)
    assert reader is not None
    try:
        samples = reader.read(NOW)
    finally:
        reader.close()
    procs = [(s.label(c.LABEL_PID), s.value) for s in samples if s.name == c.GPULENS_PROCESS_GPU_MEMORY]
    assert procs == [(c.PID_OTHER, 200 * MIB)]
    assert [s.value for s in samples if s.name == c.GPULENS_PROCESS_SERIES_DROPPED] == [2]


def test_the_process_series_bound_is_a_setting() -> None:
    from gpulens.config import Settings

    assert Settings().max_process_series == c.MAX_PROCESS_SERIES == 1024
    assert Settings(max_process_series=5).max_process_series == 5


def test_refused_processes_survive_the_label_cache_trim(monkeypatch: pytest.MonkeyPatch) -> None:
    """A bound above the label cache's size: trimming the cache while some PIDs are refused a series
    (they have no cached labels) keeps the pass going."""
    monkeypatch.setattr(nvml_reader, "MAX_CACHED_PIDS", 1)
    gpu = FakeGpu(compute=_procs(10, 11))
    reader = open_nvml_reader("gpu-node-1", nvml=fake_pynvml([gpu]), max_process_series=2)
    assert reader is not None
    try:
        reader.read(NOW)
        gpu.compute = _procs(10, 11, 12)
        samples = reader.read(NOW + 1000)
    finally:
        reader.close()
    procs = {s.label(c.LABEL_PID): s.value for s in samples if s.name == c.GPULENS_PROCESS_GPU_MEMORY}
    assert procs == {"10": 100 * MIB, "11": 100 * MIB, c.PID_OTHER: 100 * MIB}
