"""Scripted GPUs (`GPULENS_FAKE_GPUS=N`): every Lyceum GPU series, a pure function of time and GPU index.

The same `now_ms` always gives the same values (tests, demos, a fleet's Prometheus without GPUs). Each
GPU follows a sine of period `period_s` with its own phase; power follows utilization and the energy
counter is the exact integral of power, so it only grows and `rate()` of it is the power again.
"""

from __future__ import annotations

import math
import uuid

from gpulens.agent.samples import Labels, Sample, gpu_labels
from gpulens.domain import catalog as c

FAKE_MODEL = "gpulens fake GPU 80GB"
FB_TOTAL_MIB = 81_559  # an 80 GB card's frame buffer
IDLE_W, BUSY_W, LIMIT_W = 70.0, 630.0, 700.0  # power at 0 % and the extra at 100 %, enforced limit
SM_IDLE_MHZ, SM_MAX_MHZ, MEM_MHZ = 345, 1980, 2619
PCIE_RX_PEAK, PCIE_TX_PEAK = 12e9, 6e9  # bytes/s at 100 %
THROTTLE_GPU_IDLE = 0x1  # NVML clocks-event reason "GPU idle"


def fake_uuid(hostname: str, index: int) -> str:
    """Stable per host and index, distinct across hosts (several demo agents feed one Prometheus)."""
    return f"GPU-{uuid.uuid5(uuid.NAMESPACE_DNS, f'gpu{index}.{hostname}.fake.gpulens')}"


class FakeGpuReader:
    name = "fake"

    def __init__(self, hostname: str, count: int, *, period_s: float = 300.0) -> None:
        if count < 0:
            raise ValueError("count must be >= 0")
        if period_s <= 0:
            raise ValueError("period_s must be > 0")
        self.omega = 2 * math.pi / period_s
        self.labels: list[Labels] = [
            gpu_labels(i, fake_uuid(hostname, i), f"00000000:{0x18 + i:02X}:00.0", FAKE_MODEL, hostname)
            for i in range(count)
        ]

    def _phase(self, index: int) -> float:
        return index * 2 * math.pi / max(1, len(self.labels))

    def utilization(self, t_s: float, index: int) -> float:
        """0..100, unrounded (the exposed value is rounded as DCGM's integer field is)."""
        return 50.0 + 45.0 * math.sin(self.omega * t_s + self._phase(index))

    def energy_mj(self, t_s: float, index: int) -> float:
        """mJ since the Unix epoch: the integral of IDLE_W + BUSY_W * utilization / 100."""
        phase = self._phase(index)
        mean_w = IDLE_W + BUSY_W * 0.5
        swing_w = BUSY_W * 0.45
        joules = mean_w * t_s + swing_w / self.omega * (math.cos(phase) - math.cos(self.omega * t_s + phase))
        return float(math.floor(joules * 1000.0))

    def read(self, now_ms: int) -> list[Sample]:
        t = now_ms / 1000.0
        out: list[Sample] = []
        for i, labels in enumerate(self.labels):
            util = self.utilization(t, i)
            busy = util / 100.0
            used = 1_024 + math.floor(busy * 70_000)
            values = (
                (c.DCGM_GPU_UTIL, float(round(util))),
                (c.DCGM_MEM_COPY_UTIL, float(round(util * 0.6))),
                (c.DCGM_FB_USED, float(used)),
                (c.DCGM_FB_FREE, float(FB_TOTAL_MIB - used)),
                (c.DCGM_FB_TOTAL, float(FB_TOTAL_MIB)),
                (c.DCGM_GPU_TEMP, float(round(32 + 45 * busy))),
                (c.DCGM_POWER_USAGE, round(IDLE_W + BUSY_W * busy, 3)),
                (c.DCGM_ENFORCED_POWER_LIMIT, LIMIT_W),
                (c.DCGM_POWER_MGMT_LIMIT, LIMIT_W),
                (c.DCGM_TOTAL_ENERGY_CONSUMPTION, self.energy_mj(t, i)),
                (
                    c.DCGM_SM_CLOCK,
                    float(round(SM_IDLE_MHZ + (SM_MAX_MHZ - SM_IDLE_MHZ) * min(1.0, 4 * busy))),
                ),
                (c.DCGM_MEM_CLOCK, float(MEM_MHZ)),
                (c.DCGM_PCIE_RX_BYTES, float(round(PCIE_RX_PEAK * busy))),
                (c.DCGM_PCIE_TX_BYTES, float(round(PCIE_TX_PEAK * busy))),
                (c.DCGM_CLOCK_THROTTLE_REASONS, float(THROTTLE_GPU_IDLE if util < 10 else 0)),
                (c.DCGM_XID_ERRORS, 0.0),
                (c.DCGM_ECC_SBE_VOL_TOTAL, 0.0),
                (c.DCGM_ECC_DBE_VOL_TOTAL, 0.0),
            )
            out.extend(Sample(name, labels, value, now_ms) for name, value in values)
        return out

    def close(self) -> None:
        return None
