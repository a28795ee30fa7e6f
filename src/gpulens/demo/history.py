"""Samples of every dcgm-exporter and node-exporter series of a scenario, computed lazily and exactly.

`generate(scenario)` returns a `Dataset`: the series (names and labels exactly as the exporters write
them) and deterministic values for any range of scrape indices of a series. Nothing is held in memory
per sample, so a month is written block by block. What only tests read (the text exposition, single
samples, lookups by host and field) is the test kit's `gpulens_testkit.history.Dataset`, a subclass.

Value model (all values exactly representable: integers, quarter watts, CPU counters in 1/100 s):
* a GPU sample at t belongs to the phase with start < t <= end of the execution owning the GPU;
  GPUs owned by nobody are idle with their own signature (FB 0 MiB, low clocks, low power);
* host CPU busy % and RAM are the host base plus what every running phase adds (scenario.py);
  each CPU's counters grow by the same whole number of ticks per interval within a phase;
* noise is a pure function of (seed, series, sample index): two seeded tables of co-prime length.
"""

from __future__ import annotations

import bisect
import enum
import itertools
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from gpulens.demo.scenario import (
    MAX_HOST_CPU_PERCENT,
    PHASE_RAM_BYTES,
    ExecutionSpec,
    Host,
    PhaseKind,
    PhaseSpan,
    Scenario,
)
from gpulens.domain import catalog as c

# Label names and values the catalog has no constant for (they only appear in exporter output).
LABEL_DRIVER_VERSION = "DCGM_FI_DRIVER_VERSION"
LABEL_JOB = "job"
LABEL_SYSNAME = "sysname"
LABEL_RELEASE = "release"
LABEL_MACHINE = "machine"
JOB_DCGM = "dcgm"
JOB_NODE = "node"
CPU_MODES = (c.CPU_IDLE_MODE, "iowait", "system", "user")
TICKS_PER_SECOND = 100  # node-exporter reports USER_HZ ticks: counters are multiples of 0.01 s

_NOISE_A = 4093
_NOISE_B = 4099


class Field(enum.Enum):
    """What a series measures; the series name follows from the field and the host's flavour."""

    GPU_UTIL = "gpu_util"
    FB_USED = "fb_used"
    FB_FREE = "fb_free"
    GPU_TEMP = "gpu_temp"
    POWER = "power"
    POWER_LIMIT = "power_limit"
    SM_CLOCK = "sm_clock"
    MEM_CLOCK = "mem_clock"
    PCIE_RX = "pcie_rx"
    PCIE_TX = "pcie_tx"
    MEM_TOTAL = "mem_total"
    MEM_AVAILABLE = "mem_available"
    CPU_SECONDS = "cpu_seconds"
    UNAME = "uname"


GPU_FIELDS = (
    Field.GPU_UTIL,
    Field.FB_USED,
    Field.FB_FREE,
    Field.GPU_TEMP,
    Field.POWER,
    Field.POWER_LIMIT,
    Field.SM_CLOCK,
    Field.MEM_CLOCK,
    Field.PCIE_RX,
    Field.PCIE_TX,
)
NODE_FIELDS = (Field.MEM_TOTAL, Field.MEM_AVAILABLE, Field.CPU_SECONDS, Field.UNAME)

_FIXED_NAMES: dict[Field, str] = {
    Field.GPU_UTIL: c.DCGM_GPU_UTIL,
    Field.FB_USED: c.DCGM_FB_USED,
    Field.FB_FREE: c.DCGM_FB_FREE,
    Field.GPU_TEMP: c.DCGM_GPU_TEMP,
    Field.POWER: c.DCGM_POWER_USAGE,
    Field.SM_CLOCK: c.DCGM_SM_CLOCK,
    Field.MEM_CLOCK: c.DCGM_MEM_CLOCK,
    Field.MEM_TOTAL: c.NODE_MEM_TOTAL,
    Field.MEM_AVAILABLE: c.NODE_MEM_AVAILABLE,
    Field.CPU_SECONDS: c.NODE_CPU_SECONDS,
    Field.UNAME: c.NODE_UNAME_INFO,
}


def series_name(host: Host, field: Field) -> str:
    """The exported series name of `field` on `host` (power limit and PCIe depend on the host)."""
    if field is Field.POWER_LIMIT:
        return host.power_limit_series
    if field is Field.PCIE_RX:
        return c.DCGM_PCIE_RX_THROUGHPUT if host.pcie_kbps else c.DCGM_PCIE_RX_BYTES
    if field is Field.PCIE_TX:
        return c.DCGM_PCIE_TX_THROUGHPUT if host.pcie_kbps else c.DCGM_PCIE_TX_BYTES
    return _FIXED_NAMES[field]


@dataclass(frozen=True, slots=True)
class SeriesDef:
    """One exported series: name, labels in exposition order, and what it measures."""

    name: str
    metric_type: str  # "gauge" or "counter"
    labels: tuple[tuple[str, str], ...]
    hostname: str
    field: Field
    gpu: int | None = None
    cpu: int | None = None
    mode: str | None = None


@dataclass(frozen=True, slots=True)
class _GpuState:
    span: PhaseSpan
    execution: ExecutionSpec


@dataclass(frozen=True, slots=True)
class _HostState:
    cpu_percent: int
    ram_extra_bytes: int


@dataclass(frozen=True, slots=True)
class _Piece:
    """Samples k in [k_lo, k_hi) share one state."""

    k_lo: int
    k_hi: int
    gpu: _GpuState | None = None
    host: _HostState | None = None
    cum_before: tuple[int, ...] = ()  # CPU ticks per mode accumulated over intervals 1..k_lo-1


Kernel = Callable[[int], float]


class Dataset:
    """The series of a scenario and their samples at start + k * interval (k = 0 .. n-1)."""

    def __init__(self, scenario: Scenario) -> None:
        self.scenario = scenario
        self.interval_s = scenario.scrape_interval_s
        self.sample_count = scenario.sample_count
        rng = random.Random(scenario.seed)  # noqa: S311 - reproducible test data, not secrets
        self._table_a = [rng.getrandbits(16) for _ in range(_NOISE_A)]
        self._table_b = [rng.getrandbits(16) for _ in range(_NOISE_B)]
        self.series = self._build_series()
        self._gpu_pieces = {
            (h.hostname, g.index): self._build_gpu_pieces(h, g.index) for h in scenario.hosts for g in h.gpus
        }
        self._host_pieces = {h.hostname: self._build_host_pieces(h) for h in scenario.hosts}
        self._piece_starts = {key: [p.k_lo for p in ps] for key, ps in self._gpu_pieces.items()}
        self._host_piece_starts = {key: [p.k_lo for p in ps] for key, ps in self._host_pieces.items()}
        self._cpu_offsets = self._build_cpu_offsets()
        self._noise_offsets: dict[str, tuple[int, int]] = {}
        self._kernels: dict[tuple[SeriesDef, int], Kernel] = {}

    # -- public API ---------------------------------------------------------------------------------
    def time_of(self, k: int) -> int:
        """The timestamp (s) of sample k."""
        return self.scenario.start_s + k * self.interval_s

    def values(self, series: SeriesDef, k0: int = 0, k1: int | None = None) -> list[float]:
        """Values of samples k0 <= k < k1 (ints where the exporter writes integers)."""
        k1 = self.sample_count if k1 is None else min(k1, self.sample_count)
        k0 = max(0, k0)
        out: list[float] = []
        pieces = self._pieces(series)
        i = max(0, bisect.bisect_right(self._starts(series), k0) - 1)
        while k0 < k1 and i < len(pieces):
            piece = pieces[i]
            hi = min(k1, piece.k_hi)
            if hi > k0:
                out.extend(map(self._kernel(series, i), range(k0, hi)))
                k0 = hi
            i += 1
        return out

    def samples(self, series: SeriesDef) -> Iterator[tuple[int, float]]:
        """(timestamp s, value) for every sample of a series, in time order."""
        for k, v in enumerate(self.values(series)):
            yield self.time_of(k), v

    # -- series -------------------------------------------------------------------------------------
    def _build_series(self) -> tuple[SeriesDef, ...]:
        out: list[SeriesDef] = []
        for field in GPU_FIELDS:
            for host in self.scenario.hosts:
                model = host.gpu_model
                if model is None:
                    continue
                name = series_name(host, field)
                for gpu in host.gpus:
                    labels: tuple[tuple[str, str], ...] = (
                        (c.LABEL_GPU, str(gpu.index)),
                        (c.LABEL_UUID, gpu.uuid),
                        (c.LABEL_PCI_BUS_ID, gpu.pci_bus_id),
                        (c.LABEL_DEVICE, f"nvidia{gpu.index}"),
                        (c.LABEL_MODEL_NAME, model.name),
                        (host.host_label, host.hostname),
                        (LABEL_DRIVER_VERSION, host.driver_version),
                        (c.LABEL_INSTANCE, host.dcgm_instance),
                        (LABEL_JOB, JOB_DCGM),
                    )
                    out.append(SeriesDef(name, "gauge", labels, host.hostname, field, gpu=gpu.index))
        for field in NODE_FIELDS:
            for host in self.scenario.hosts:
                target = ((c.LABEL_INSTANCE, host.node.instance), (LABEL_JOB, JOB_NODE))
                name = series_name(host, field)
                if field is Field.CPU_SECONDS:
                    for cpu in range(host.node.cpus):
                        for mode in CPU_MODES:
                            labels = ((c.LABEL_CPU, str(cpu)), (c.LABEL_CPU_MODE, mode), *target)
                            out.append(
                                SeriesDef(name, "counter", labels, host.hostname, field, cpu=cpu, mode=mode)
                            )
                elif field is Field.UNAME:
                    labels = (
                        (LABEL_MACHINE, host.node.machine),
                        (c.LABEL_NODENAME, host.hostname),
                        (LABEL_RELEASE, host.node.release),
                        (LABEL_SYSNAME, "Linux"),
                        *target,
                    )
                    out.append(SeriesDef(name, "gauge", labels, host.hostname, field))
                else:
                    out.append(SeriesDef(name, "gauge", target, host.hostname, field))
        return tuple(out)

    # -- timelines ----------------------------------------------------------------------------------
    def _k(self, t_s: int) -> int:
        return (t_s - self.scenario.start_s) // self.interval_s

    def _build_gpu_pieces(self, host: Host, gpu: int) -> list[_Piece]:
        spans: list[tuple[PhaseSpan, ExecutionSpec]] = []
        for e in self.scenario.executions:
            if e.hostname == host.hostname and gpu in self.scenario.gpus_of(e):
                spans.extend((span, e) for span in e.spans())
        spans.sort(key=lambda se: se[0].start_s)
        pieces: list[_Piece] = []
        k = 0
        for span, e in spans:
            lo, hi = self._k(span.start_s) + 1, self._k(span.end_s) + 1  # start < t <= end
            if lo > k:
                pieces.append(_Piece(k, lo))
            pieces.append(_Piece(lo, hi, gpu=_GpuState(span, e)))
            k = hi
        if k < self.sample_count:
            pieces.append(_Piece(k, self.sample_count))
        return pieces

    def _host_state_slow(self, host: Host, t_s: int) -> _HostState:
        cpu, ram = host.node.base_cpu_percent, 0
        for e in self.scenario.executions:
            if e.hostname == host.hostname and e.start_s < t_s <= e.end_s:
                span = e.span_at(t_s)
                if span is not None:
                    cpu += span.phase.host_cpu_percent
                    ram += PHASE_RAM_BYTES[span.phase.kind]
        return _HostState(min(cpu, MAX_HOST_CPU_PERCENT), ram)

    def _build_host_pieces(self, host: Host) -> list[_Piece]:
        bounds = {0, self.sample_count}
        for e in self.scenario.executions:
            if e.hostname == host.hostname:
                for span in e.spans():
                    bounds.add(self._k(span.start_s) + 1)
                    bounds.add(self._k(span.end_s) + 1)
        edges = sorted(b for b in bounds if 0 <= b <= self.sample_count)
        pieces: list[_Piece] = []
        cum = [0] * len(CPU_MODES)
        for lo, hi in itertools.pairwise(edges):
            state = self._host_state_slow(host, self.time_of(lo))
            pieces.append(_Piece(lo, hi, host=state, cum_before=tuple(cum)))
            ticks = self._mode_ticks(state.cpu_percent)
            intervals = hi - max(lo, 1)
            for m in range(len(CPU_MODES)):
                cum[m] += ticks[m] * intervals
        return pieces

    def _mode_ticks(self, cpu_percent: int) -> tuple[int, ...]:
        """Ticks per CPU per interval in each mode (CPU_MODES order) for a busy percentage."""
        busy = self.interval_s * cpu_percent
        idle = self.interval_s * (100 - cpu_percent)
        system, iowait = busy // 4, busy // 8
        return (idle, iowait, system, busy - system - iowait)

    def _build_cpu_offsets(self) -> dict[tuple[str, int], tuple[int, ...]]:
        out: dict[tuple[str, int], tuple[int, ...]] = {}
        for host in self.scenario.hosts:
            rng = random.Random(f"{self.scenario.seed}/cpu/{host.hostname}")  # noqa: S311
            # Every CPU's idle counter starts equal: their rates are then bit-identical, so `avg` over
            # CPUs is exact in any order (Prometheus' binary-operator output order is not stable).
            idle = rng.randrange(10**8, 10**9)
            for cpu in range(host.node.cpus):
                busy = rng.randrange(10**6, 10**8)
                out[(host.hostname, cpu)] = (idle, busy // 8, busy // 4, busy - busy // 8 - busy // 4)
        return out

    def _pieces(self, series: SeriesDef) -> list[_Piece]:
        if series.gpu is not None:
            return self._gpu_pieces[(series.hostname, series.gpu)]
        return self._host_pieces[series.hostname]

    def _starts(self, series: SeriesDef) -> list[int]:
        if series.gpu is not None:
            return self._piece_starts[(series.hostname, series.gpu)]
        return self._host_piece_starts[series.hostname]

    # -- values -------------------------------------------------------------------------------------
    def _offsets(self, key: str) -> tuple[int, int]:
        got = self._noise_offsets.get(key)
        if got is None:
            rng = random.Random(f"{self.scenario.seed}/noise/{key}")  # noqa: S311
            got = (rng.randrange(_NOISE_A), rng.randrange(_NOISE_B))
            self._noise_offsets[key] = got
        return got

    def _noise(self, key: str) -> Callable[[int, int], int]:
        """n(k, span): an integer in [-span, span], a pure function of (seed, key, k)."""
        oa, ob = self._offsets(key)
        ta, tb = self._table_a, self._table_b

        def n(k: int, span: int) -> int:
            return (ta[(k + oa) % _NOISE_A] ^ tb[(k + ob) % _NOISE_B]) % (2 * span + 1) - span

        return n

    def _kernel(self, series: SeriesDef, piece_index: int) -> Kernel:
        key = (series, piece_index)
        kernel = self._kernels.get(key)
        if kernel is None:
            piece = self._pieces(series)[piece_index]
            if series.gpu is not None:
                kernel = self._gpu_kernel(series, piece)
            else:
                kernel = self._node_kernel(series, piece)
            self._kernels[key] = kernel
        return kernel

    def _node_kernel(self, series: SeriesDef, piece: _Piece) -> Kernel:
        host = self.scenario.host(series.hostname)
        state = piece.host
        assert state is not None
        if series.field is Field.MEM_TOTAL:
            total = host.node.mem_total_bytes
            return lambda k: total
        if series.field is Field.UNAME:
            return lambda k: 1
        if series.field is Field.MEM_AVAILABLE:
            n = self._noise(f"{host.hostname}/ram")
            avail = host.node.mem_total_bytes - host.node.base_ram_bytes - state.ram_extra_bytes
            return lambda k: avail - 4096 * n(k, 1024)
        assert series.cpu is not None and series.mode is not None
        m = CPU_MODES.index(series.mode)
        start = self._cpu_offsets[(host.hostname, series.cpu)][m] + piece.cum_before[m]
        inc = self._mode_ticks(state.cpu_percent)[m]
        first = max(piece.k_lo, 1)
        return lambda k: (start + max(0, k - first + 1) * inc) / TICKS_PER_SECOND

    def _gpu_kernel(self, series: SeriesDef, piece: _Piece) -> Kernel:
        host = self.scenario.host(series.hostname)
        model = host.gpu_model
        assert model is not None and series.gpu is not None
        field = series.field
        noise_field = Field.FB_USED if field is Field.FB_FREE else field
        n = self._noise(f"{host.hostname}/{series.gpu}/{noise_field.value}")
        if field is Field.POWER_LIMIT:
            limit = model.power_limit_w
            return lambda k: limit
        if field in (Field.FB_USED, Field.FB_FREE):
            used = self._fb_used(model.fb_capacity_mib, piece, n)
            if field is Field.FB_USED:
                return used
            cap = model.fb_capacity_mib
            return lambda k: cap - used(k)
        kernel = self._gpu_gauge(field, piece=piece, n=n, series=series)
        if field in (Field.PCIE_RX, Field.PCIE_TX) and host.pcie_kbps:
            return lambda k: int(kernel(k)) // 1024
        return kernel

    def _fb_used(self, cap: int, piece: _Piece, n: Callable[[int, int], int]) -> Kernel:
        if piece.gpu is None:
            return lambda k: 0
        span, e = piece.gpu.span, piece.gpu.execution
        ws = cap * e.fb_used_percent // 100
        kind = span.phase.kind
        k0, dur = self._k(span.start_s), span.phase.duration_s // self.interval_s
        if kind is PhaseKind.WARMUP:
            return lambda k: 1024 + (ws - 1024) * (k - k0) // dur
        if kind is PhaseKind.OOM:  # linear to the full capacity at the phase's last sample
            return lambda k: ws + (cap - ws) * (k - k0) // dur
        return lambda k: ws + n(k, 32)

    def _gpu_gauge(
        self,
        field: Field,
        *,
        piece: _Piece,
        n: Callable[[int, int], int],
        series: SeriesDef,
    ) -> Kernel:
        host = self.scenario.host(series.hostname)
        model = host.gpu_model
        assert model is not None
        state = piece.gpu
        kind = None if state is None else state.span.phase.kind
        k0 = 0 if state is None else self._k(state.span.start_s)
        dur = 1 if state is None else state.span.phase.duration_s // self.interval_s
        K = PhaseKind

        def ramp(lo: int, hi: int, span: int) -> Kernel:
            return lambda k: lo + (hi - lo) * (k - k0) // dur + n(k, span)

        def around(base: int, span: int, scale: int = 1) -> Kernel:
            return lambda k: base + scale * n(k, span)

        if field is Field.GPU_UTIL:
            if kind is None or kind is K.IDLE:
                return lambda k: 0
            if kind is K.WARMUP:
                r = ramp(10, 90, 2)
                return lambda k: min(100, max(0, r(k)))
            return around(
                {K.STEADY: 94, K.INPUT_STALL: 10, K.THROTTLE: 97, K.OOM: 95}[kind],
                {K.STEADY: 4, K.INPUT_STALL: 5, K.THROTTLE: 2, K.OOM: 3}[kind],
            )
        if field is Field.GPU_TEMP:
            if kind is None:
                return around(29, 1)
            if kind is K.WARMUP:
                return ramp(35, 68, 1)
            return around(
                {K.IDLE: 41, K.STEADY: 70, K.INPUT_STALL: 48, K.THROTTLE: 87, K.OOM: 72}[kind],
                {K.IDLE: 1, K.STEADY: 2, K.INPUT_STALL: 2, K.THROTTLE: 1, K.OOM: 2}[kind],
            )
        if field is Field.POWER:  # quarter watts
            q_idle, q_limit = round(model.idle_power_w * 4), round(model.power_limit_w * 4)
            q: Kernel
            if kind is None:
                q = around(q_idle, 4)
            elif kind is K.IDLE:
                q = around(q_idle + 160, 4)
            elif kind is K.WARMUP:
                q = ramp(q_idle + 160, q_limit * 8 // 10, 8)
            elif kind is K.THROTTLE:  # at the limit: 0 to 1 W under it
                q = lambda k: q_limit - 2 - n(k, 2)  # noqa: E731
            else:
                pct = {K.STEADY: 80, K.INPUT_STALL: 30, K.OOM: 82}[kind]
                q = around(q_limit * pct // 100, {K.STEADY: 40, K.INPUT_STALL: 20, K.OOM: 40}[kind])
            return lambda k: q(k) / 4
        if field is Field.SM_CLOCK:
            if kind is None or kind is K.IDLE:
                return around(model.sm_clock_idle_mhz, 0)
            if kind is K.THROTTLE:
                return around(model.sm_clock_throttle_mhz, 1, 15)
            return around(model.sm_clock_max_mhz, 0)
        if field is Field.MEM_CLOCK:
            return around(model.mem_clock_idle_mhz if kind is None else model.mem_clock_mhz, 0)
        if field is Field.PCIE_RX:
            if kind is None:
                return around(2048, 4, 256)
            if kind is K.IDLE:
                return around(16384, 8, 256)
            base = {K.WARMUP: 4_000_000_000, K.INPUT_STALL: 250_000_000}.get(kind, 1_500_000_000)
            return around(base, {K.WARMUP: 100, K.INPUT_STALL: 20}.get(kind, 50), 1_000_000)
        if field is Field.PCIE_TX:
            if kind is None:
                return around(1024, 4, 128)
            if kind is K.IDLE:
                return around(8192, 8, 128)
            base = {K.WARMUP: 150_000_000, K.INPUT_STALL: 50_000_000}.get(kind, 300_000_000)
            return around(base, {K.WARMUP: 10, K.INPUT_STALL: 5}.get(kind, 20), 1_000_000)
        raise AssertionError(field)  # pragma: no cover


def generate(scenario: Scenario) -> Dataset:
    """The dataset of a scenario: every series, sampled at the scrape interval from start to end."""
    return Dataset(scenario)
