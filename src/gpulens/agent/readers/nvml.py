"""GPU readings through NVML (nvidia-ml-py's `pynvml`); the only module in gpulens that imports it.

Every device is read once per pass (devices in parallel: NVML's PCIe throughput call samples the bus for
~20 ms). A call the GPU does not support (NotSupported, NoPermission, FunctionNotFound) is logged once
and never made again for that GPU: its series are left out, never written as 0. Other NVML errors
(e.g. GPU lost) leave the value out of that pass and are logged once per kind.

NVML's units become the dcgm-exporter series' units here, in `to_series_units` and nowhere else:
memory bytes -> MiB, power mW -> W, PCIe KB/s -> bytes/s (x 1024, as the catalog's KIB).

Per-process GPU memory is one series per (GPU, PID), and PIDs come and go: a store keeps every series
it was given, so a run gives at most `max_process_series` (GPULENS_MAX_PROCESS_SERIES) of them. The
memory of processes seen after that is summed into their GPU's `pid="other"` series, and each such
process is counted in `gpulens_gpu_process_series_dropped_total` (per GPU).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import pynvml  # type: ignore[import-untyped]

from gpulens.agent.samples import Labels, Sample, gpu_labels
from gpulens.domain import catalog as c

log = logging.getLogger("gpulens.agent")

MAX_EVENTS_PER_PASS = 64
MAX_CACHED_PIDS = 1024
_MISSING: Any = object()

# NVML answers that will not change while the agent runs: stop asking that GPU
_PERMANENT_ERRORS = ("NVML_ERROR_NOT_SUPPORTED", "NVML_ERROR_NO_PERMISSION", "NVML_ERROR_FUNCTION_NOT_FOUND")

# What each NVML call feeds (for the log line that says what is left out)
CALL_SERIES: dict[str, tuple[str, ...]] = {
    "utilization": (c.DCGM_GPU_UTIL, c.DCGM_MEM_COPY_UTIL),
    "memory_v2": (),  # falls back to "memory" (v1: `used` includes the driver's reserved memory)
    "memory": (c.DCGM_FB_USED, c.DCGM_FB_FREE, c.DCGM_FB_TOTAL),
    "temperature": (c.DCGM_GPU_TEMP,),
    "power": (c.DCGM_POWER_USAGE,),
    "enforced_power_limit": (c.DCGM_ENFORCED_POWER_LIMIT,),
    "power_management_limit": (c.DCGM_POWER_MGMT_LIMIT,),
    "energy": (c.DCGM_TOTAL_ENERGY_CONSUMPTION,),
    "sm_clock": (c.DCGM_SM_CLOCK,),
    "mem_clock": (c.DCGM_MEM_CLOCK,),
    "pcie_rx": (c.DCGM_PCIE_RX_BYTES,),
    "pcie_tx": (c.DCGM_PCIE_TX_BYTES,),
    "clock_event_reasons": (c.DCGM_CLOCK_THROTTLE_REASONS,),
    "ecc_corrected": (c.DCGM_ECC_SBE_VOL_TOTAL,),
    "ecc_uncorrected": (c.DCGM_ECC_DBE_VOL_TOTAL,),
    "compute_processes": (c.GPULENS_PROCESS_GPU_MEMORY,),
    "graphics_processes": (c.GPULENS_PROCESS_GPU_MEMORY,),
    "xid_events": (c.DCGM_XID_ERRORS,),
}


def to_series_units(series: str, nvml_value: float) -> float:
    """NVML's unit -> the unit of the dcgm-exporter series (domain/catalog.py): the one conversion table."""
    if series in (c.DCGM_FB_USED, c.DCGM_FB_FREE, c.DCGM_FB_TOTAL, c.DCGM_FB_RESERVED):  # bytes -> MiB
        return float(int(nvml_value) // int(c.MIB))
    if series in (c.DCGM_POWER_USAGE, c.DCGM_ENFORCED_POWER_LIMIT, c.DCGM_POWER_MGMT_LIMIT):  # mW -> W
        return nvml_value * c.MILLI
    if series in (c.DCGM_PCIE_RX_BYTES, c.DCGM_PCIE_TX_BYTES):  # KB/s -> bytes/s
        return nvml_value * c.KIB
    return float(nvml_value)  # %, degrees C, MHz, mJ, counts, bitmask: as NVML gives them


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


@dataclass(slots=True)
class NvmlDevice:
    index: int
    handle: Any
    labels: Labels
    model: str = ""
    events: Any = None  # NVML event set for XID errors, None when the GPU cannot deliver them
    last_xid: int = 0
    pid_labels: dict[int, Labels] = field(default_factory=dict)


class ProcessSeries:
    """Which (GPU, PID) pairs get a series of their own: the first `limit` a run sees. The others
    are counted once per appearance (a process absent from a pass and seen again counts again), and
    only the pairs of the last pass are remembered for that, so memory stays bounded too."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._given: set[tuple[int, int]] = set()
        self._refused: dict[int, set[int]] = {}  # GPU -> the PIDs refused in its last pass
        self.dropped: dict[int, int] = {}  # GPU -> processes refused a series so far
        self._lock = threading.Lock()  # the GPUs of a pass are read in parallel

    def split(self, gpu: int, pids: list[int]) -> tuple[list[int], list[int]]:
        """This pass's PIDs of one GPU as (with a series, summed into `other`)."""
        own: list[int] = []
        refused: list[int] = []
        with self._lock:
            for pid in pids:
                key = (gpu, pid)
                if key in self._given or len(self._given) < self.limit:
                    self._given.add(key)
                    own.append(pid)
                else:
                    refused.append(pid)
            before = self._refused.get(gpu, set())
            self.dropped[gpu] = self.dropped.get(gpu, 0) + sum(p not in before for p in refused)
            self._refused[gpu] = set(refused)
        return own, refused


class NvmlReader:
    """Reads the GPUs `open_nvml_reader` found; build it through that function."""

    name = "nvml"

    def __init__(
        self, nvml: Any, devices: list[NvmlDevice], *, max_process_series: int = c.MAX_PROCESS_SERIES
    ) -> None:
        self._nvml = nvml
        self.devices = devices
        self.processes = ProcessSeries(max_process_series)
        self._permanent = {getattr(nvml, n) for n in _PERMANENT_ERRORS if hasattr(nvml, n)}
        self._disabled: set[tuple[int, str]] = set()
        self._logged: set[tuple[str, Any]] = set()
        self._lock = threading.Lock()
        self._pool = (
            ThreadPoolExecutor(max_workers=min(len(devices), 8), thread_name_prefix="gpulens-nvml")
            if len(devices) > 1
            else None
        )
        for dev in devices:
            self._register_xid(dev)

    # -- NVML calls, with the once-only bookkeeping ------------------------------------------------------
    def _log_once(self, key: tuple[str, Any], level: int, msg: str, *args: object) -> None:
        with self._lock:
            if key in self._logged:
                return
            self._logged.add(key)
        log.log(level, msg, *args)

    def _failed(self, dev: NvmlDevice, key: str, exc: Exception) -> None:
        code = getattr(exc, "value", None)
        series = ", ".join(dict.fromkeys(CALL_SERIES.get(key, ()))) or "nothing"
        if code in self._permanent:
            with self._lock:
                self._disabled.add((dev.index, key))
            self._log_once(
                (key, "permanent"),
                logging.INFO,
                "NVML: %s not available on GPU %d (%s); %s left out for GPUs without it",
                key,
                dev.index,
                exc,
                series,
            )
        else:
            self._log_once(
                (key, code),
                logging.WARNING,
                "NVML: %s failed on GPU %d (%s); %s left out of the passes where it fails",
                key,
                dev.index,
                exc,
                series,
            )

    def _call(
        self, dev: NvmlDevice, key: str, names: str | tuple[str, ...], *args: Any, **kwargs: Any
    ) -> Any:
        """The NVML function's answer for this device, or _MISSING (unsupported, failed)."""
        if (dev.index, key) in self._disabled:
            return _MISSING
        candidates = (names,) if isinstance(names, str) else names
        fn: Callable[..., Any] | None = next(
            (getattr(self._nvml, n) for n in candidates if hasattr(self._nvml, n)), None
        )
        if fn is None:  # an nvidia-ml-py without this function
            with self._lock:
                self._disabled.add((dev.index, key))
            self._log_once((key, "absent"), logging.INFO, "NVML: %s has no binding here; left out", key)
            return _MISSING
        try:
            return fn(dev.handle, *args, **kwargs)
        except self._nvml.NVMLError as exc:
            self._failed(dev, key, exc)
            return _MISSING

    def _register_xid(self, dev: NvmlDevice) -> None:
        nv = self._nvml
        events = None
        try:
            events = nv.nvmlEventSetCreate()
            nv.nvmlDeviceRegisterEvents(dev.handle, nv.nvmlEventTypeXidCriticalError, events)
        except nv.NVMLError as exc:
            if events is not None:
                self._free_events(events)
            self._failed(dev, "xid_events", exc)
            return
        except AttributeError:
            self._log_once(("xid_events", "absent"), logging.INFO, "NVML: no event API here; no XID series")
            return
        dev.events = events

    def _free_events(self, events: Any) -> None:
        with contextlib.suppress(self._nvml.NVMLError):
            self._nvml.nvmlEventSetFree(events)

    def _poll_xid(self, dev: NvmlDevice) -> bool:
        """Drain pending XID events (timeout 0); False when the event set broke."""
        nv = self._nvml
        wait = getattr(nv, "nvmlEventSetWait_v2", None) or nv.nvmlEventSetWait
        for _ in range(MAX_EVENTS_PER_PASS):
            try:
                data = wait(dev.events, 0)
            except nv.NVMLError as exc:
                if getattr(exc, "value", None) == getattr(nv, "NVML_ERROR_TIMEOUT", 10):
                    return True  # nothing pending
                self._failed(dev, "xid_events", exc)
                return False
            if int(data.eventType) & int(nv.nvmlEventTypeXidCriticalError):
                dev.last_xid = int(data.eventData)
        return True

    # -- one device ----------------------------------------------------------------------------------------
    def _read_device(self, dev: NvmlDevice, now_ms: int) -> list[Sample]:
        nv = self._nvml
        out: list[Sample] = []

        def put(series: str, nvml_value: Any, labels: Labels = dev.labels) -> None:
            if nvml_value is not _MISSING and nvml_value is not None:
                out.append(Sample(series, labels, to_series_units(series, nvml_value), now_ms))

        util = self._call(dev, "utilization", "nvmlDeviceGetUtilizationRates")
        if util is not _MISSING:
            put(c.DCGM_GPU_UTIL, util.gpu)
            put(c.DCGM_MEM_COPY_UTIL, util.memory)
        # v2 splits the driver's reservation out of `used`, as DCGM does (used + free + reserved = total)
        mem = _MISSING
        if hasattr(nv, "nvmlMemory_v2"):
            mem = self._call(dev, "memory_v2", "nvmlDeviceGetMemoryInfo", version=nv.nvmlMemory_v2)
        if mem is _MISSING:
            mem = self._call(dev, "memory", "nvmlDeviceGetMemoryInfo")
        if mem is not _MISSING:
            put(c.DCGM_FB_USED, mem.used)
            put(c.DCGM_FB_FREE, mem.free)
            put(c.DCGM_FB_TOTAL, mem.total)
            put(c.DCGM_FB_RESERVED, getattr(mem, "reserved", None))
        put(
            c.DCGM_GPU_TEMP,
            self._call(dev, "temperature", "nvmlDeviceGetTemperature", nv.NVML_TEMPERATURE_GPU),
        )
        put(c.DCGM_POWER_USAGE, self._call(dev, "power", "nvmlDeviceGetPowerUsage"))
        put(
            c.DCGM_ENFORCED_POWER_LIMIT,
            self._call(dev, "enforced_power_limit", "nvmlDeviceGetEnforcedPowerLimit"),
        )
        put(
            c.DCGM_POWER_MGMT_LIMIT,
            self._call(dev, "power_management_limit", "nvmlDeviceGetPowerManagementLimit"),
        )
        put(
            c.DCGM_TOTAL_ENERGY_CONSUMPTION,
            self._call(dev, "energy", "nvmlDeviceGetTotalEnergyConsumption"),
        )
        put(c.DCGM_SM_CLOCK, self._call(dev, "sm_clock", "nvmlDeviceGetClockInfo", nv.NVML_CLOCK_SM))
        put(c.DCGM_MEM_CLOCK, self._call(dev, "mem_clock", "nvmlDeviceGetClockInfo", nv.NVML_CLOCK_MEM))
        put(
            c.DCGM_PCIE_RX_BYTES,
            self._call(dev, "pcie_rx", "nvmlDeviceGetPcieThroughput", nv.NVML_PCIE_UTIL_RX_BYTES),
        )
        put(
            c.DCGM_PCIE_TX_BYTES,
            self._call(dev, "pcie_tx", "nvmlDeviceGetPcieThroughput", nv.NVML_PCIE_UTIL_TX_BYTES),
        )
        put(
            c.DCGM_CLOCK_THROTTLE_REASONS,
            self._call(
                dev,
                "clock_event_reasons",
                ("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons"),
            ),
        )
        for key, series, kind in (
            ("ecc_corrected", c.DCGM_ECC_SBE_VOL_TOTAL, nv.NVML_MEMORY_ERROR_TYPE_CORRECTED),
            ("ecc_uncorrected", c.DCGM_ECC_DBE_VOL_TOTAL, nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED),
        ):
            put(series, self._call(dev, key, "nvmlDeviceGetTotalEccErrors", kind, nv.NVML_VOLATILE_ECC))
        xid_ok = dev.events is not None and (dev.index, "xid_events") not in self._disabled
        if xid_ok and self._poll_xid(dev):
            put(c.DCGM_XID_ERRORS, dev.last_xid)
        # per-process memory: a process can be in both lists; usedGpuMemory is None where NVML hides it
        used_by_pid: dict[int, int] = {}
        for key, fn in (
            ("compute_processes", "nvmlDeviceGetComputeRunningProcesses"),
            ("graphics_processes", "nvmlDeviceGetGraphicsRunningProcesses"),
        ):
            procs = self._call(dev, key, fn)
            for proc in () if procs is _MISSING else procs:
                used = getattr(proc, "usedGpuMemory", None)
                if used is not None:
                    used_by_pid[int(proc.pid)] = max(used_by_pid.get(int(proc.pid), 0), int(used))
        own, refused = self.processes.split(dev.index, sorted(used_by_pid))
        for pid in own:
            labels = dev.pid_labels.get(pid)
            if labels is None:
                labels = dev.pid_labels[pid] = (*dev.labels, (c.LABEL_PID, str(pid)))
            put(c.GPULENS_PROCESS_GPU_MEMORY, used_by_pid[pid], labels)
        if refused:
            other = (*dev.labels, (c.LABEL_PID, c.PID_OTHER))
            put(c.GPULENS_PROCESS_GPU_MEMORY, sum(used_by_pid[pid] for pid in refused), other)
        dropped = self.processes.dropped.get(dev.index, 0)
        if dropped:  # from the first refusal on, every pass
            put(c.GPULENS_PROCESS_SERIES_DROPPED, dropped)
        if len(dev.pid_labels) > MAX_CACHED_PIDS:  # forget the labels of exited processes
            dev.pid_labels = {p: dev.pid_labels[p] for p in own}  # refused PIDs have none
        return out

    def read(self, now_ms: int) -> list[Sample]:
        if self._pool is None:
            return [s for dev in self.devices for s in self._read_device(dev, now_ms)]
        parts = self._pool.map(lambda dev: self._read_device(dev, now_ms), self.devices)
        return [s for part in parts for s in part]

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        for dev in self.devices:
            if dev.events is not None:
                self._free_events(dev.events)
                dev.events = None
        try:
            self._nvml.nvmlShutdown()
        except self._nvml.NVMLError as exc:  # pragma: no cover - shutdown of a broken driver
            log.debug("nvmlShutdown: %s", exc)


def _identity(nv: Any, index: int, hostname: str) -> NvmlDevice:
    handle = nv.nvmlDeviceGetHandleByIndex(index)

    def text(fn: str, default: str, attr: str | None = None) -> str:
        try:
            value = getattr(nv, fn)(handle)
        except nv.NVMLError:
            return default
        return _text(getattr(value, attr) if attr else value)

    model = text("nvmlDeviceGetName", "unknown")
    uuid = text("nvmlDeviceGetUUID", f"GPU-unknown-{index}")
    bus = text("nvmlDeviceGetPciInfo", "", "busId")
    return NvmlDevice(index, handle, gpu_labels(index, uuid, bus, model, hostname), model)


def open_nvml_reader(
    hostname: str, *, nvml: Any = None, max_process_series: int = c.MAX_PROCESS_SERIES
) -> NvmlReader | None:
    """An NVML reader over every GPU, or None (and one log line) when there is no NVML or no GPU."""
    nv = pynvml if nvml is None else nvml
    try:
        nv.nvmlInit()
    except nv.NVMLError as exc:
        log.info("no NVML (%s): collecting host series only", exc)
        return None
    try:
        count = int(nv.nvmlDeviceGetCount())
        devices = [_identity(nv, i, hostname) for i in range(count)]
    except nv.NVMLError as exc:
        log.warning("NVML could not list the GPUs (%s): collecting host series only", exc)
        nv.nvmlShutdown()
        return None
    if not devices:
        log.info("NVML found no GPU: collecting host series only")
        nv.nvmlShutdown()
        return None
    models = sorted({d.model for d in devices})
    log.info("NVML: %d GPU(s) (%s)", len(devices), ", ".join(models))
    return NvmlReader(nv, devices, max_process_series=max_process_series)
