"""Agent test helpers: a scripted stand-in for the `pynvml` module; a Prometheus that scrapes the agent."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import types
import urllib.parse
import urllib.request
from collections import Counter, deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pynvml as real_nvml
import pytest

from gpulens_testkit.promload import ServerHandle, free_port
from tests.conftest import missing_server

MIB = 1_048_576


@dataclass
class FakeGpu:
    """What one scripted GPU answers; names in `unsupported` raise NVMLError_NotSupported."""

    name: str = "NVIDIA H100 80GB HBM3"
    uuid: str = "GPU-c4529c8d-69c4-b61d-e0bc-7b2460096005"
    bus_id: bytes = b"00000000:53:00.0"
    util: int = 87
    mem_util: int = 41
    mem_total: int = 81_559 * MIB
    mem_used: int = 21_383 * MIB + 123  # not a whole MiB: DCGM reports whole MiB
    mem_reserved: int = 0  # nvmlMemory_v2 only (v1 counts it in `used`)
    temp: int = 61
    power_mw: int = 413_611
    enforced_mw: int = 700_000
    mgmt_mw: int = 690_000
    energy_mj: int = 9_876_543_210
    sm_mhz: int = 1_980
    mem_mhz: int = 2_619
    pcie_rx_kbps: int = 1_500
    pcie_tx_kbps: int = 250
    reasons: int = 0x4
    ecc_corrected: int = 3
    ecc_uncorrected: int = 0
    compute: list[Any] = field(default_factory=list)
    graphics: list[Any] = field(default_factory=list)
    xids: deque[int] = field(default_factory=deque)
    unsupported: set[str] = field(default_factory=set)


class FakeEventSet:
    def __init__(self) -> None:
        self.gpu: FakeGpu | None = None


def fake_pynvml(
    gpus: list[FakeGpu], *, init_error: int | None = None, events: bool = True, memory_v2: bool = False
) -> types.ModuleType:
    """A `pynvml` look-alike: the real module's constants and error classes, scripted device functions.

    `module.calls` counts (function, gpu index, args) so tests can see every device is read once per pass.
    """
    m = types.ModuleType("pynvml")
    for key, value in vars(real_nvml).items():
        if key.startswith(("NVML_", "NVMLError", "nvmlEventType")):
            setattr(m, key, value)
    calls: Counter[tuple[Any, ...]] = Counter()
    m.calls = calls  # type: ignore[attr-defined]
    state = {"init": 0, "shutdown": 0}
    m.state = state  # type: ignore[attr-defined]
    err = real_nvml.NVMLError

    def nvmlInit() -> None:
        if init_error is not None:
            raise err(init_error)
        state["init"] += 1

    def nvmlShutdown() -> None:
        state["shutdown"] += 1

    m.nvmlInit = nvmlInit  # type: ignore[attr-defined]
    m.nvmlShutdown = nvmlShutdown  # type: ignore[attr-defined]
    m.nvmlDeviceGetCount = lambda: len(gpus)  # type: ignore[attr-defined]
    m.nvmlDeviceGetHandleByIndex = lambda i: i  # type: ignore[attr-defined]

    def device_fn(name: str, answer: Any) -> None:
        def fn(handle: int, *args: Any, **kwargs: Any) -> Any:
            calls[(name, handle, *args, *kwargs.values())] += 1
            gpu = gpus[handle]
            if name in gpu.unsupported or f"{name}{tuple(kwargs.values())}" in gpu.unsupported:
                raise err(real_nvml.NVML_ERROR_NOT_SUPPORTED)
            return answer(gpu, *args, **kwargs)

        setattr(m, name, fn)

    device_fn("nvmlDeviceGetName", lambda g: g.name)
    device_fn("nvmlDeviceGetUUID", lambda g: g.uuid)
    device_fn("nvmlDeviceGetPciInfo", lambda g: types.SimpleNamespace(busId=g.bus_id))
    device_fn("nvmlDeviceGetUtilizationRates", lambda g: types.SimpleNamespace(gpu=g.util, memory=g.mem_util))

    def memory(g: FakeGpu, version: int | None = None) -> types.SimpleNamespace:
        if version is None:  # v1: the reservation is part of `used`
            used = g.mem_used + g.mem_reserved
            return types.SimpleNamespace(total=g.mem_total, used=used, free=g.mem_total - used)
        free = g.mem_total - g.mem_used - g.mem_reserved
        return types.SimpleNamespace(total=g.mem_total, used=g.mem_used, free=free, reserved=g.mem_reserved)

    device_fn("nvmlDeviceGetMemoryInfo", memory)
    if memory_v2:
        m.nvmlMemory_v2 = real_nvml.nvmlMemory_v2  # type: ignore[attr-defined]
    device_fn("nvmlDeviceGetTemperature", lambda g, sensor: g.temp)
    device_fn("nvmlDeviceGetPowerUsage", lambda g: g.power_mw)
    device_fn("nvmlDeviceGetEnforcedPowerLimit", lambda g: g.enforced_mw)
    device_fn("nvmlDeviceGetPowerManagementLimit", lambda g: g.mgmt_mw)
    device_fn("nvmlDeviceGetTotalEnergyConsumption", lambda g: g.energy_mj)
    device_fn(
        "nvmlDeviceGetClockInfo", lambda g, kind: g.sm_mhz if kind == real_nvml.NVML_CLOCK_SM else g.mem_mhz
    )
    device_fn(
        "nvmlDeviceGetPcieThroughput",
        lambda g, counter: g.pcie_rx_kbps if counter == real_nvml.NVML_PCIE_UTIL_RX_BYTES else g.pcie_tx_kbps,
    )
    device_fn("nvmlDeviceGetCurrentClocksEventReasons", lambda g: g.reasons)
    device_fn(
        "nvmlDeviceGetTotalEccErrors",
        lambda g, kind, counter: (
            g.ecc_corrected if kind == real_nvml.NVML_MEMORY_ERROR_TYPE_CORRECTED else g.ecc_uncorrected
        ),
    )
    device_fn("nvmlDeviceGetComputeRunningProcesses", lambda g: list(g.compute))
    device_fn("nvmlDeviceGetGraphicsRunningProcesses", lambda g: list(g.graphics))

    if events:
        m.nvmlEventSetCreate = FakeEventSet  # type: ignore[attr-defined]

        def register(handle: int, kinds: int, event_set: FakeEventSet) -> None:
            calls[("nvmlDeviceRegisterEvents", handle)] += 1
            if "nvmlDeviceRegisterEvents" in gpus[handle].unsupported:
                raise err(real_nvml.NVML_ERROR_NOT_SUPPORTED)
            event_set.gpu = gpus[handle]

        def wait(event_set: FakeEventSet, timeout_ms: int) -> Any:
            assert timeout_ms == 0  # never block a pass
            assert event_set.gpu is not None
            if not event_set.gpu.xids:
                raise err(real_nvml.NVML_ERROR_TIMEOUT)
            return types.SimpleNamespace(
                eventType=real_nvml.nvmlEventTypeXidCriticalError, eventData=event_set.gpu.xids.popleft()
            )

        m.nvmlDeviceRegisterEvents = register  # type: ignore[attr-defined]
        m.nvmlEventSetWait_v2 = wait  # type: ignore[attr-defined]
        m.nvmlEventSetFree = lambda event_set: None  # type: ignore[attr-defined]
    return m


# -- a real Prometheus that scrapes the agent ------------------------------------------------------------


def scrape_config(target: str, scrape_interval_s: int = 1) -> str:
    every = f"{scrape_interval_s}s"
    return (
        f"global:\n  scrape_interval: {every}\n  evaluation_interval: {every}\n"
        "scrape_configs:\n"
        "  - job_name: gpulens-agent\n"
        f"    scrape_interval: {every}\n"
        f"    scrape_timeout: {every}\n"
        "    static_configs:\n"
        f'      - targets: ["{target}"]\n'
    )


def start_scraping_prometheus(workdir: Path, target: str, timeout_s: float = 60.0) -> ServerHandle:
    """Prometheus on 127.0.0.1 (free port) with one scrape job, `gpulens-agent`, on `target`; ready."""
    binary = shutil.which("prometheus")
    if binary is None:
        missing_server("prometheus")
    assert binary is not None
    config = workdir / "prometheus.yml"
    config.write_text(scrape_config(target))
    port = free_port()
    log_path = workdir / "prometheus.log"
    log = log_path.open("ab")
    argv = [
        binary,
        f"--config.file={config}",
        f"--storage.tsdb.path={workdir / 'tsdb'}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--log.level=warn",
    ]
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    handle = ServerHandle("prometheus", f"http://127.0.0.1:{port}", proc, workdir / "tsdb", log_path, log)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            handle.stop()
            pytest.fail(f"prometheus exited with {proc.returncode}: {handle.log_tail()}")
        try:
            with urllib.request.urlopen(handle.url + "/-/ready", timeout=1.0) as resp:
                if resp.status == 200:
                    return handle
        except OSError:
            pass
        time.sleep(0.05)
    handle.stop()
    pytest.fail(f"prometheus not ready after {timeout_s} s: {handle.log_tail()}")


def instant_query(base_url: str, expr: str) -> list[dict[str, Any]]:
    url = base_url + "/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(url, timeout=10.0) as resp:
        body = json.loads(resp.read())
    assert body["status"] == "success", body
    result: list[dict[str, Any]] = body["data"]["result"]
    return result
