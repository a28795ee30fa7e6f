"""A long execution as real data looks: noise and flicker in every phase, missed scrapes, an exporter
outage, four alike GPUs, and its ground truth (one episode per finding it must give).

The series are the summary's inputs: the 12 Lyceum series of the execution (utilization and FB % the
mean over its GPUs, temperature the hottest, power and its limit the sum, the SM clock the mean) and
each GPU's utilization and FB %, as `Samples` on the scrape grid. Every value is a pure function of
the seed.

The story (`noisy_execution`, 72 h by default, its phases scaled with `hours`):
warm-up; training (utilization 85-99 with checkpoint dips, clocks that wobble, CPU 20-45 %); a
multi-hour data-loading stall (every GPU at 0-6 % utilization, memory held, the host CPU hovering
around the busy threshold); training; a power-throttled stretch (power hovering around the limit's
95 %, the SM clock down and wobbling, temperature around 85 C); training; memory climbing to full,
then released with utilization falling to 0 (an OOM the job survived); idle to the end (utilization
0-1 % with rare monitoring blips, memory freed). A 10-minute exporter outage in the first training
phase leaves every series empty there; 0.5 % of the scrapes are missed everywhere.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gpulens.agent.samples import HOST_LABEL
from gpulens.domain import catalog as c
from gpulens.shaping.insights import RunInfo, Samples

T0_MS = 1_767_225_600_000 - 72 * 3_600_000  # ends on 2026-01-01T00:00:00Z at 72 h
POWER_LIMIT_W = 700.0
FB_CAPACITY_MIB = 81_024  # an H100's FB_USED + FB_FREE
RAM_TOTAL_BYTES = 2.0e12
PEAK_CLOCK_MHZ = 1980.0
IDLE_CLOCK_MHZ = 345.0
FloatArray = np.ndarray[Any, np.dtype[np.float64]]
IntArray = np.ndarray[Any, np.dtype[np.int64]]


@dataclass(frozen=True, slots=True)
class Episode:
    """A finding the data must give: its kind and where it lies (ms, the points it covers)."""

    kind: str
    start_ms: int
    end_ms: int
    gpus: tuple[str, ...] = ()  # () = every GPU of the execution


@dataclass(frozen=True, slots=True)
class Raw:
    """What each GPU and the host measured at every scrape (GPU x scrape arrays), and which scrapes
    reached the store (`kept`: every series of the host; `gpu_kept`: the per-GPU reads)."""

    times_ms: FloatArray
    util: FloatArray
    fb: FloatArray
    temp: FloatArray
    power: FloatArray
    clock: FloatArray
    rx: FloatArray
    cpu: FloatArray
    kept: Any
    gpu_kept: Any


@dataclass(frozen=True, slots=True)
class NoisyRun:
    run: RunInfo
    series: dict[str, Samples]
    per_gpu: dict[str, dict[str, Samples]]
    episodes: list[Episode] = field(default_factory=list)
    phases: list[tuple[str, int, int]] = field(default_factory=list)  # (name, first, last point)
    raw: Raw | None = None
    outage_ms: tuple[int, int] = (0, 0)  # the exporters' outage: first and last scrape missed

    def exporter_series(
        self, hostname: str, cpus: int = 4
    ) -> Iterator[tuple[dict[str, str], IntArray, FloatArray]]:
        """The same history as dcgm-exporter and node-exporter series of `hostname` (labels with
        `__name__`, unix-ms times, values; what an embedded store or Prometheus holds): per GPU its
        utilization, FB used/free (MiB), temperature, power and its limit, clocks, PCIe bytes; the
        host's CPU-seconds counters (idle and user, `cpus` CPUs) and memory. Only the scrapes that
        were kept."""
        raw = self.raw
        assert raw is not None
        cap = float(FB_CAPACITY_MIB)
        kept = raw.kept
        times = raw.times_ms[kept].astype(np.int64)
        for g in range(raw.util.shape[0]):
            labels = {
                c.LABEL_GPU: str(g),
                c.LABEL_UUID: f"GPU-{g:08d}-1111-2222-3333-444444444444",
                HOST_LABEL: hostname,
            }
            used = np.round(raw.fb[g] * cap / 100)
            values = {
                c.DCGM_GPU_UTIL: np.round(raw.util[g]),
                c.DCGM_FB_USED: used,
                c.DCGM_FB_FREE: cap - used,
                c.DCGM_GPU_TEMP: np.round(raw.temp[g]),
                c.DCGM_POWER_USAGE: raw.power[g],
                c.DCGM_ENFORCED_POWER_LIMIT: np.full(len(raw.times_ms), POWER_LIMIT_W),
                c.DCGM_SM_CLOCK: np.round(raw.clock[g]),
                c.DCGM_MEM_CLOCK: np.where(raw.util[g] > 1.5, 2619.0, 1593.0),
                c.DCGM_PCIE_RX_BYTES: raw.rx[g],
                c.DCGM_PCIE_TX_BYTES: raw.rx[g] / 8,
            }
            for name, v in values.items():
                yield {c.LABEL_METRIC_NAME: name, **labels}, times, np.asarray(v, dtype=np.float64)[kept]
        node = {c.LABEL_INSTANCE: f"{hostname}:9100"}
        step_s = self.run.interval_ms / 1000
        busy = np.cumsum(raw.cpu / 100 * step_s)  # each CPU as busy as the host
        idle = np.arange(len(busy)) * step_s - busy
        for cpu in range(cpus):
            for mode, counter in (("idle", idle), ("user", busy)):
                labels = {
                    c.LABEL_METRIC_NAME: c.NODE_CPU_SECONDS,
                    c.LABEL_CPU: str(cpu),
                    c.LABEL_CPU_MODE: mode,
                }
                yield labels | node, times, (1e6 + counter)[kept]
        yield {c.LABEL_METRIC_NAME: c.NODE_MEM_TOTAL, **node}, times, np.full(len(times), RAM_TOTAL_BYTES)
        available = RAM_TOTAL_BYTES - (7e10 + raw.cpu * 1e9)
        yield {c.LABEL_METRIC_NAME: c.NODE_MEM_AVAILABLE, **node}, times, available[kept]


def noisy_execution(
    seed: int = 1, hours: float = 72.0, gpus: int = 4, interval_s: int = 15, missed: float = 0.005
) -> NoisyRun:
    """The story above over `hours` (72: the issue's execution), on `gpus` alike GPUs."""
    rng = np.random.default_rng(seed)
    interval_ms = interval_s * 1000
    n = int(hours * 3600 // interval_s) + 1
    scale = hours / 72.0

    def pts(h: float) -> int:
        return max(8, round(h * scale * 3600 / interval_s))

    plan = [
        ("warmup", pts(1 / 3)),
        ("train", pts(20)),
        ("stall", pts(7.2)),
        ("train", pts(10)),
        ("throttle", pts(3)),
        ("train", pts(10)),
        ("climb", pts(2)),
    ]
    phases: list[tuple[str, int, int]] = []
    k = 0
    for name, length in plan:
        phases.append((name, k, k + length - 1))
        k += length
    phases.append(("idle", k, n - 1))
    assert k < n - 8, "too short for the story"

    util = np.zeros((gpus, n))
    fb = np.zeros((gpus, n))
    temp = np.zeros((gpus, n))
    power = np.zeros((gpus, n))
    clock = np.zeros((gpus, n))
    cpu = np.zeros(n)
    rx = np.zeros((gpus, n))

    def u(lo: float, hi: float, size: Any = None) -> Any:
        return rng.uniform(lo, hi, size)

    for name, a, b in phases:
        m = b - a + 1
        sl = slice(a, b + 1)
        shape = (gpus, m)
        if name == "warmup":
            ramp = np.linspace(0, 1, m)
            util[:, sl] = 10 + 80 * ramp + u(-3, 3, shape)
            fb[:, sl] = 2 + 68 * ramp + u(-0.5, 0.5, shape)
            temp[:, sl] = 35 + 33 * ramp + u(-1, 1, shape)
            power[:, sl] = 110 + 450 * ramp + u(-10, 10, shape)
            clock[:, sl] = PEAK_CLOCK_MHZ - u(0, 30, shape)
            cpu[sl] = u(25, 45, m)
            rx[:, sl] = u(3e9, 5e9, shape)
        elif name == "train":
            util[:, sl] = u(85, 99, shape)
            dips = np.arange(a + 60, b, 120)  # a checkpoint every 30 min: two samples at 20-40 %
            for d in dips:
                util[:, d : d + 2] = u(20, 40, (gpus, min(2, b + 1 - d)))
                cpu[d : d + 2] = u(50, 90, min(2, b + 1 - d))
            fb[:, sl] = 70 + u(-1.5, 1.5, shape)
            temp[:, sl] = u(64, 76, shape)
            power[:, sl] = u(480, 620, shape)
            clock[:, sl] = PEAK_CLOCK_MHZ - u(0, 45, shape)  # boost wobbles
            rest = np.setdiff1d(np.arange(a, b + 1), np.concatenate([dips, dips + 1]))
            cpu[rest] = u(20, 45, len(rest))
            rx[:, sl] = u(1e9, 2.5e9, shape)
        elif name == "stall":
            util[:, sl] = u(0, 6, shape)
            fb[:, sl] = 70 + u(-1.5, 1.5, shape)
            temp[:, sl] = u(44, 52, shape)
            power[:, sl] = u(120, 180, shape)
            clock[:, sl] = np.where(u(0, 1, shape) < 0.7, IDLE_CLOCK_MHZ, PEAK_CLOCK_MHZ - u(0, 45, shape))
            cpu[sl] = u(74, 96, m)  # hovers around the 80 % busy threshold
            rx[:, sl] = u(1e8, 4e8, shape)
        elif name == "throttle":
            util[:, sl] = u(92, 99, shape)
            fb[:, sl] = 70 + u(-1.5, 1.5, shape)
            temp[:, sl] = u(82, 89, shape)  # around 85 C
            power[:, sl] = POWER_LIMIT_W * u(0.92, 1.0, shape)  # around 95 % of the limit
            clock[:, sl] = u(1380, 1800, shape)  # mostly below 90 % of the peak, wobbling
            cpu[sl] = u(20, 45, m)
            rx[:, sl] = u(1e9, 2.5e9, shape)
        elif name == "climb":
            ramp = np.linspace(0, 1, m)
            util[:, sl] = u(85, 99, shape)
            fb[:, sl] = 70 + 29.5 * ramp + u(-0.8, 0.8, shape)  # to ~99.5 %, hovering past 95
            temp[:, sl] = u(64, 76, shape)
            power[:, sl] = u(480, 620, shape)
            clock[:, sl] = PEAK_CLOCK_MHZ - u(0, 45, shape)
            cpu[sl] = u(20, 45, m)
            rx[:, sl] = u(1e9, 2.5e9, shape)
        else:  # idle to the end: memory freed, rare blips of monitoring
            util[:, sl] = u(0, 1.2, shape)
            blips = u(0, 1, shape) < 0.003
            util[:, sl] = np.where(blips, u(5, 9, shape), util[:, sl])
            fb[:, sl] = u(0.3, 0.8, shape)
            temp[:, sl] = u(33, 40, shape)
            power[:, sl] = u(65, 80, shape)
            clock[:, sl] = IDLE_CLOCK_MHZ
            cpu[sl] = u(2, 8, m)
            rx[:, sl] = u(1e4, 5e4, shape)
    np.clip(util, 0, 100, out=util)
    np.clip(fb, 0, 100, out=fb)

    times = T0_MS + np.arange(n, dtype=np.float64) * interval_ms
    keep = u(0, 1, n) >= missed  # missed scrapes (every series of the host at once)
    outage_at = phases[1][1] + pts(5)
    outage = slice(outage_at, outage_at + 600 // interval_s)  # ten minutes without the exporters
    keep[outage] = False
    gpu_keep = keep & (u(0, 1, n) >= missed / 2)  # and a few more on the per-GPU reads

    def samples(values: FloatArray, mask: Any = keep) -> Samples:
        return Samples(times[mask], np.asarray(values, dtype=np.float64)[mask])

    ram_total = RAM_TOTAL_BYTES
    series = {
        "gpuUtilizationPercent": samples(util.mean(axis=0)),
        "gpuMemoryUtilizationPercent": samples(fb.mean(axis=0)),
        "gpuTemperatureCelsius": samples(temp.max(axis=0)),
        "gpuPowerWatt": samples(power.sum(axis=0)),
        "gpuPowerLimitWatt": samples(np.full(n, POWER_LIMIT_W * gpus)),
        "gpuClockSmMhz": samples(clock.mean(axis=0)),
        "gpuClockMemMhz": samples(np.where(util.mean(axis=0) > 1.5, 2619.0, 1593.0)),
        "gpuPcieThroughputRxBytesPerSec": samples(rx.sum(axis=0)),
        "gpuPcieThroughputTxBytesPerSec": samples(rx.sum(axis=0) / 8),
        "systemRamTotalBytes": samples(np.full(n, ram_total)),
        "systemRamUsedBytes": samples(7e10 + cpu * 1e9),
        "systemCpuUsagePercent": samples(cpu),
    }
    assert set(series) == set(c.LYCEUM_KEYS)
    per_gpu = {
        str(g): {
            "gpuUtilizationPercent": samples(util[g], gpu_keep),
            "gpuMemoryUtilizationPercent": samples(fb[g], gpu_keep),
        }
        for g in range(gpus)
    }
    names = tuple(str(g) for g in range(gpus))
    end_ms = T0_MS + (n - 1) * interval_ms
    run = RunInfo(T0_MS, end_ms, interval_ms, "completed", end_ms, names, gpus)

    def at(i: int) -> int:
        return T0_MS + i * interval_ms

    by = {name: (a, b) for name, a, b in phases if name != "train"}
    episodes = [
        Episode("no_data", at(outage.start), at(outage.stop - 1)),
        Episode("input_bound", at(by["stall"][0]), at(by["stall"][1])),
        Episode("power_throttle", at(by["throttle"][0]), at(by["throttle"][1])),
        Episode("oom_suspected", at(by["climb"][0]), at(by["climb"][1])),
        Episode("idle", at(by["idle"][0]), at(by["idle"][1])),
    ]
    raw = Raw(times, util, fb, temp, power, clock, rx, cpu, keep, gpu_keep)
    return NoisyRun(run, series, per_gpu, episodes, phases, raw, (at(outage.start), at(outage.stop - 1)))
