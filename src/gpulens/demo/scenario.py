"""Frozen descriptions of a synthetic cluster history: hosts, GPUs, node-exporters, executions in phases.

`default_scenario` is what `gpulens demo` serves; the test kit (`gpulens_testkit`) builds its other
scenarios from the same parts.
"""

from __future__ import annotations

import enum
import random
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime

from gpulens.domain import catalog as c
from gpulens.domain.models import ExecutionStatus

# The fixed end of every built-in scenario: data, timestamps and ground truth are identical on every run.
DEFAULT_END_S = int(datetime(2026, 1, 1, tzinfo=UTC).timestamp())
DEFAULT_SCRAPE_INTERVAL_S = 15
GIB = 1024**3


class PhaseKind(enum.StrEnum):
    """What an execution does for a while; each kind has its own GPU and host signature."""

    WARMUP = "warmup"  # utilisation, power, temperature and memory ramp up
    STEADY = "steady"  # training: util 90-98, clocks at max, power below the limit
    INPUT_STALL = "input_stall"  # util 5-15 while the host CPU is ~90 % busy feeding data
    THROTTLE = "throttle"  # power at the limit, SM clock down, temperature ~87 C
    OOM = "oom"  # frame-buffer use climbs linearly to 100 % (FB_FREE = 0); the execution then ends
    IDLE = "idle"  # util 0, memory still held


# Host CPU percent (whole host) and RAM each running phase adds on top of the host's base load.
PHASE_CPU_PERCENT: dict[PhaseKind, int] = {
    PhaseKind.WARMUP: 30,
    PhaseKind.STEADY: 20,
    PhaseKind.INPUT_STALL: 85,
    PhaseKind.THROTTLE: 20,
    PhaseKind.OOM: 20,
    PhaseKind.IDLE: 0,
}
PHASE_RAM_BYTES: dict[PhaseKind, int] = {
    PhaseKind.WARMUP: 48 * GIB,
    PhaseKind.STEADY: 64 * GIB,
    PhaseKind.INPUT_STALL: 96 * GIB,
    PhaseKind.THROTTLE: 64 * GIB,
    PhaseKind.OOM: 64 * GIB,
    PhaseKind.IDLE: 32 * GIB,
}
MAX_HOST_CPU_PERCENT = 95


@dataclass(frozen=True, slots=True)
class Phase:
    """One stretch of an execution. `cpu_percent` overrides the host CPU the kind adds."""

    kind: PhaseKind
    duration_s: int
    cpu_percent: int | None = None

    @property
    def host_cpu_percent(self) -> int:
        return PHASE_CPU_PERCENT[self.kind] if self.cpu_percent is None else self.cpu_percent


@dataclass(frozen=True, slots=True)
class PhaseSpan:
    """A phase placed in time: samples at t with start_s < t <= end_s belong to it."""

    phase: Phase
    start_s: int
    end_s: int


@dataclass(frozen=True, slots=True)
class GpuModel:
    """Static properties of one GPU model (MiB, W, MHz)."""

    name: str
    fb_total_mib: int
    fb_reserved_mib: int
    power_limit_w: float
    idle_power_w: float
    sm_clock_max_mhz: int
    sm_clock_throttle_mhz: int
    sm_clock_idle_mhz: int
    mem_clock_mhz: int
    mem_clock_idle_mhz: int

    @property
    def fb_capacity_mib(self) -> int:
        """FB_USED + FB_FREE (= total - reserved), constant."""
        return self.fb_total_mib - self.fb_reserved_mib


H100 = GpuModel("NVIDIA H100 80GB HBM3", 81559, 535, 700.0, 68.5, 1980, 1410, 345, 2619, 1593)
A100 = GpuModel("NVIDIA A100-SXM4-40GB", 40960, 560, 400.0, 52.25, 1410, 1095, 210, 1593, 1215)


@dataclass(frozen=True, slots=True)
class Gpu:
    index: int
    uuid: str
    pci_bus_id: str


@dataclass(frozen=True, slots=True)
class NodeExporter:
    """node-exporter on a host: `instance` may be `<host>:9100` or an IP only `node_uname_info` maps."""

    instance: str
    cpus: int
    mem_total_bytes: int
    base_cpu_percent: int = 5
    base_ram_bytes: int = 8 * GIB
    release: str = "6.8.0-49-generic"
    machine: str = "x86_64"


@dataclass(frozen=True, slots=True)
class Host:
    """One machine: its node-exporter and, if it has GPUs, its dcgm-exporter flavour."""

    hostname: str
    node: NodeExporter
    gpu_model: GpuModel | None = None
    gpus: tuple[Gpu, ...] = ()
    host_label: str = c.DCGM_HOST_LABELS[0]  # "Hostname" (<= 4.5.3-4.8.2) or "hostname" (newer)
    dcgm_instance: str = ""
    power_limit_series: str = c.DCGM_ENFORCED_POWER_LIMIT  # or c.DCGM_POWER_MGMT_LIMIT
    pcie_kbps: bool = False  # DCGM_FI_DEV_PCIE_*_THROUGHPUT (KB/s) instead of DCGM_FI_PROF_PCIE_*_BYTES
    driver_version: str = "580.105.08"


@dataclass(frozen=True, slots=True)
class ExecutionSpec:
    """One execution: its GPUs on one host (empty = all of them) and its phases, back to back."""

    execution_id: str
    name: str
    hostname: str
    gpus: tuple[int, ...]
    start_s: int
    phases: tuple[Phase, ...]
    status: ExecutionStatus = ExecutionStatus.COMPLETED
    fb_used_percent: int = 70  # frame-buffer working set in steady phases, percent of capacity
    user: str | None = None  # who ran it and for which project (the registry's fields; fleet usage)
    project: str | None = None

    @property
    def end_s(self) -> int:
        return self.start_s + sum(p.duration_s for p in self.phases)

    @property
    def start(self) -> datetime:
        return datetime.fromtimestamp(self.start_s, UTC)

    @property
    def end(self) -> datetime:
        return datetime.fromtimestamp(self.end_s, UTC)

    def spans(self) -> tuple[PhaseSpan, ...]:
        out: list[PhaseSpan] = []
        t = self.start_s
        for phase in self.phases:
            out.append(PhaseSpan(phase, t, t + phase.duration_s))
            t += phase.duration_s
        return tuple(out)

    def span_at(self, t_s: int) -> PhaseSpan | None:
        """The phase a sample at `t_s` belongs to (start < t <= end), or None outside the execution."""
        if not self.start_s < t_s <= self.end_s:
            return None
        for span in self.spans():
            if t_s <= span.end_s:
                return span
        return None  # pragma: no cover - unreachable


class Timeline:
    """The scrape grid of a scenario (mixin: the dataclass has start_s, end_s, scrape_interval_s)."""

    __slots__ = ()
    start_s: int
    end_s: int
    scrape_interval_s: int

    @property
    def start(self) -> datetime:
        return datetime.fromtimestamp(self.start_s, UTC)

    @property
    def end(self) -> datetime:
        return datetime.fromtimestamp(self.end_s, UTC)

    @property
    def sample_count(self) -> int:
        return (self.end_s - self.start_s) // self.scrape_interval_s + 1


@dataclass(frozen=True, slots=True)
class Scenario(Timeline):
    """Everything the generator needs; times are epoch seconds, samples at start + k * interval <= end."""

    name: str
    seed: int
    start_s: int
    end_s: int
    hosts: tuple[Host, ...]
    executions: tuple[ExecutionSpec, ...]
    scrape_interval_s: int = DEFAULT_SCRAPE_INTERVAL_S

    def __post_init__(self) -> None:
        if self.scrape_interval_s <= 0 or self.end_s < self.start_s:
            raise ValueError("bad scenario time range or scrape interval")
        names = [h.hostname for h in self.hosts]
        if len(set(names)) != len(names):
            raise ValueError("duplicate hostnames")
        ids = [e.execution_id for e in self.executions]
        if len(set(ids)) != len(ids) or len({e.name for e in self.executions}) != len(ids):
            raise ValueError("duplicate execution ids or names")
        owned: dict[tuple[str, int], list[ExecutionSpec]] = {}
        for e in self.executions:
            host = self.host(e.hostname)
            if host.gpu_model is None and e.gpus:
                raise ValueError(f"{e.name}: host {host.hostname} has no GPUs")
            if any(not 0 <= g < len(host.gpus) for g in e.gpus):
                raise ValueError(f"{e.name}: GPU index out of range")
            if (e.start_s - self.start_s) % self.scrape_interval_s or any(
                p.duration_s <= 0 or p.duration_s % self.scrape_interval_s for p in e.phases
            ):
                raise ValueError(f"{e.name}: start and phase durations must be whole scrape intervals")
            if not e.phases or e.start_s < self.start_s or e.end_s > self.end_s:
                raise ValueError(f"{e.name}: must have phases and lie inside the scenario")
            for g in self.gpus_of(e):
                for other in owned.setdefault((host.hostname, g), []):
                    if e.start_s < other.end_s and other.start_s < e.end_s:
                        raise ValueError(f"{e.name} and {other.name} overlap on GPU {g}")
                owned[(host.hostname, g)].append(e)

    def host(self, hostname: str) -> Host:
        for h in self.hosts:
            if h.hostname == hostname:
                return h
        raise KeyError(hostname)

    def execution(self, key: str) -> ExecutionSpec:
        """By execution id or by name."""
        for e in self.executions:
            if key in (e.execution_id, e.name):
                return e
        raise KeyError(key)

    def gpus_of(self, execution: ExecutionSpec) -> tuple[int, ...]:
        """The GPU indices an execution owns (its list, or every GPU of its host when empty)."""
        if execution.gpus:
            return tuple(sorted(execution.gpus))
        return tuple(g.index for g in self.host(execution.hostname).gpus)


# -- built-in scenarios -----------------------------------------------------------------------------

_H100_BUSES = (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB)


def random_uuid(rng: random.Random) -> str:
    """A version-4 UUID drawn from `rng` (the same for a seed)."""
    return str(uuid.UUID(int=rng.getrandbits(128), version=4))


def make_gpus(rng: random.Random, count: int) -> tuple[Gpu, ...]:
    """GPU UUIDs and PCI bus ids drawn from `rng` (deterministic for a seed)."""
    out = []
    for i in range(count):
        bus = _H100_BUSES[i] if i < len(_H100_BUSES) else 0x10 + i
        out.append(Gpu(i, "GPU-" + random_uuid(rng), f"00000000:{bus:02X}:00.0"))
    return tuple(out)


def aligned(seconds: float, interval: int) -> int:
    """`seconds` rounded to whole scrape intervals (at least one)."""
    return max(interval, round(seconds / interval) * interval)


def default_scenario(
    seed: int = 7, hours: float = 3.0, interval_s: int = DEFAULT_SCRAPE_INTERVAL_S
) -> Scenario:
    """Three hosts, five executions (healthy, throttled, OOM, input-bound, CPU-only) in `hours` (3 h)."""
    rng = random.Random(seed)  # noqa: S311 - reproducible test data, not secrets
    span = aligned(hours * 3600, interval_s)
    start = DEFAULT_END_S - span
    scale = span / 10_800  # the layout below is written for three hours

    def at(minutes: float) -> int:
        return aligned(minutes * 60 * scale, interval_s)

    def ph(kind: PhaseKind, minutes: float, cpu_percent: int | None = None) -> Phase:
        return Phase(kind, at(minutes), cpu_percent)

    node1 = Host(
        "gpu-node-1",
        NodeExporter("gpu-node-1:9100", cpus=8, mem_total_bytes=2_113_898_102_784),
        H100,
        make_gpus(rng, 8),
        host_label=c.DCGM_HOST_LABELS[0],
        dcgm_instance="gpu-node-1:9400",
        power_limit_series=c.DCGM_ENFORCED_POWER_LIMIT,
    )
    node2 = Host(
        "gpu-node-2",
        NodeExporter("10.0.0.5:9100", cpus=4, mem_total_bytes=540_973_645_824),
        A100,
        make_gpus(rng, 2),
        host_label=c.DCGM_HOST_LABELS[1],
        dcgm_instance="10.0.0.5:9400",
        power_limit_series=c.DCGM_POWER_MGMT_LIMIT,
        pcie_kbps=True,
        driver_version="550.127.05",
    )
    cpu1 = Host("cpu-node-1", NodeExporter("cpu-node-1:9100", cpus=8, mem_total_bytes=270_486_822_912))
    k = PhaseKind
    executions = (
        ExecutionSpec(
            random_uuid(rng),
            "healthy",
            node1.hostname,
            (0, 3),
            start + at(10),
            (ph(k.WARMUP, 10), ph(k.STEADY, 75), ph(k.IDLE, 5)),
            fb_used_percent=70,
            user="alice",
            project="vision",
        ),
        ExecutionSpec(
            random_uuid(rng),
            "throttled",
            node1.hostname,
            (4, 5, 6, 7),
            start + at(20),
            (ph(k.WARMUP, 10), ph(k.STEADY, 30), ph(k.THROTTLE, 40), ph(k.STEADY, 20)),
            fb_used_percent=85,
            user="bob",
            project="vision",
        ),
        ExecutionSpec(
            random_uuid(rng),
            "oom",
            node2.hostname,
            (),
            start + at(15),
            (ph(k.WARMUP, 5), ph(k.STEADY, 30), ph(k.OOM, 20)),
            ExecutionStatus.FAILED,
            fb_used_percent=60,
            user="alice",
            project="llm",
        ),
        ExecutionSpec(
            random_uuid(rng),
            "input-bound",
            node2.hostname,
            (),
            start + at(90),
            (ph(k.WARMUP, 5), ph(k.INPUT_STALL, 45), ph(k.STEADY, 15)),
            fb_used_percent=45,
            user="carol",
            project="llm",
        ),
        ExecutionSpec(
            random_uuid(rng),
            "cpu-only",
            cpu1.hostname,
            (),
            start + at(30),
            (ph(k.STEADY, 90, 70), ph(k.IDLE, 10)),
            user="carol",
            project="etl",
        ),
    )
    return Scenario("default", seed, start, DEFAULT_END_S, (node1, node2, cpu1), executions, interval_s)
