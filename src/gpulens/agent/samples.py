"""The unit the agent moves around: one series value at one instant, named and labelled as exporters do."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass

from gpulens.domain import catalog as c

Labels = tuple[tuple[str, str], ...]
HOST_LABEL = c.DCGM_HOST_LABELS[0]  # "Hostname": what dcgm-exporter <= 4.5.3-4.8.2 writes


@dataclass(frozen=True, slots=True)
class Sample:
    """`name{labels} value` at `timestamp_ms` (Unix ms; every sample of one pass shares it).

    `labels` keep the exporter's order (dcgm-exporter: gpu, UUID, pci_bus_id, device, modelName,
    Hostname); values are in the series' own unit (DCGM memory in MiB, power in W, energy in mJ).
    """

    name: str
    labels: Labels
    value: float
    timestamp_ms: int

    def label(self, name: str, default: str = "") -> str:
        for key, value in self.labels:
            if key == name:
                return value
        return default


class SeriesType(enum.StrEnum):
    GAUGE = "gauge"
    COUNTER = "counter"


@dataclass(frozen=True, slots=True)
class SeriesInfo:
    type: SeriesType
    help: str


_G, _C = SeriesType.GAUGE, SeriesType.COUNTER

# HELP/TYPE of every series the agent writes; dcgm-exporter's CSV help texts and node-exporter's, so a
# scrape of the agent looks like a scrape of the two exporters. Bandwidth fields are gauges (they are
# rates already, as dcgm-exporter types them).
SERIES: Mapping[str, SeriesInfo] = {
    c.DCGM_GPU_UTIL: SeriesInfo(_G, "GPU utilization (in %)."),
    c.DCGM_MEM_COPY_UTIL: SeriesInfo(_G, "Memory utilization (in %)."),
    c.DCGM_FB_USED: SeriesInfo(_G, "Framebuffer memory used (in MiB)."),
    c.DCGM_FB_FREE: SeriesInfo(_G, "Framebuffer memory free (in MiB)."),
    c.DCGM_FB_TOTAL: SeriesInfo(_G, "Framebuffer memory total (in MiB)."),
    c.DCGM_FB_RESERVED: SeriesInfo(_G, "Framebuffer memory reserved (in MiB)."),
    c.DCGM_GPU_TEMP: SeriesInfo(_G, "GPU temperature (in C)."),
    c.DCGM_POWER_USAGE: SeriesInfo(_G, "Power draw (in W)."),
    c.DCGM_ENFORCED_POWER_LIMIT: SeriesInfo(_G, "Enforced power limit (in W)."),
    c.DCGM_POWER_MGMT_LIMIT: SeriesInfo(_G, "Power management limit (in W)."),
    c.DCGM_TOTAL_ENERGY_CONSUMPTION: SeriesInfo(_C, "Total energy consumption since boot (in mJ)."),
    c.DCGM_SM_CLOCK: SeriesInfo(_G, "SM clock frequency (in MHz)."),
    c.DCGM_MEM_CLOCK: SeriesInfo(_G, "Memory clock frequency (in MHz)."),
    c.DCGM_PCIE_RX_BYTES: SeriesInfo(_G, "The rate of data received over the PCIe bus in bytes per second."),
    c.DCGM_PCIE_TX_BYTES: SeriesInfo(
        _G, "The rate of data transmitted over the PCIe bus in bytes per second."
    ),
    c.DCGM_CLOCK_THROTTLE_REASONS: SeriesInfo(_G, "Frequency throttling reasons (NVML bitmask)."),
    c.DCGM_XID_ERRORS: SeriesInfo(_G, "Value of the last XID error encountered."),
    c.DCGM_ECC_SBE_VOL_TOTAL: SeriesInfo(_C, "Total number of single-bit volatile ECC errors."),
    c.DCGM_ECC_DBE_VOL_TOTAL: SeriesInfo(_C, "Total number of double-bit volatile ECC errors."),
    c.GPULENS_PROCESS_GPU_MEMORY: SeriesInfo(_G, "GPU memory used by a process (in bytes)."),
    c.GPULENS_PROCESS_SERIES_DROPPED: SeriesInfo(
        _C, 'Processes whose GPU memory went to the pid="other" series (GPULENS_MAX_PROCESS_SERIES).'
    ),
    c.NODE_CPU_SECONDS: SeriesInfo(_C, "Seconds the CPUs spent in each mode."),
    c.NODE_MEM_TOTAL: SeriesInfo(_G, "Memory information field MemTotal_bytes."),
    c.NODE_MEM_AVAILABLE: SeriesInfo(_G, "Memory information field MemAvailable_bytes."),
    c.NODE_UNAME_INFO: SeriesInfo(_G, "Labeled system information as provided by the uname system call."),
}

# the dcgm-exporter series the Lyceum metrics read first (each metric's preferred source)
LYCEUM_GPU_SERIES: tuple[str, ...] = tuple(
    dict.fromkeys(s for m in c.LYCEUM_METRICS if m.exporter is c.Exporter.DCGM for s in m.sources[0].series)
)


def gpu_labels(index: int, uuid: str, pci_bus_id: str, model: str, hostname: str) -> Labels:
    """dcgm-exporter's labels for a whole GPU, in its order."""
    return (
        (c.LABEL_GPU, str(index)),
        (c.LABEL_UUID, uuid),
        (c.LABEL_PCI_BUS_ID, pci_bus_id),
        (c.LABEL_DEVICE, f"nvidia{index}"),
        (c.LABEL_MODEL_NAME, model),
        (HOST_LABEL, hostname),
    )
