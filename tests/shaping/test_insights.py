"""Findings on generated series: a condition inserted into a steady run is found at its edges."""

from __future__ import annotations

import random
from collections.abc import Callable

from hypothesis import given, settings
from hypothesis import strategies as st

from gpulens.domain import catalog as c
from gpulens.shaping import insights as ins
from gpulens.shaping.insights import Finding, RunInfo, findings, runs, smooth

INTERVAL = 15_000
T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z
TOLERANCE = INTERVAL + c.INSIGHT_THRESHOLDS.smoothing_ms
Row = dict[str, float]


def steady(rng: random.Random) -> Row:
    return {
        ins.UTIL: rng.uniform(85, 99),
        ins.FB: rng.uniform(60, 80),
        ins.TEMP: rng.uniform(60, 75),
        ins.POWER: rng.uniform(450, 600),
        ins.LIMIT: 700.0,
        ins.SM_CLOCK: 1980.0,
        "gpuClockMemMhz": 2619.0,
        ins.PCIE_RX: rng.uniform(1e9, 2e9),
        "gpuPcieThroughputTxBytesPerSec": rng.uniform(1e8, 3e8),
        "systemRamTotalBytes": 2e12,
        "systemRamUsedBytes": rng.uniform(7e10, 8e10),
        ins.CPU: rng.uniform(15, 35),
    }


CONDITIONS: dict[str, Callable[[random.Random], Row]] = {
    "idle": lambda r: {ins.UTIL: r.uniform(0, 3), ins.FB: r.uniform(0, 2), ins.POWER: 70.0, ins.CPU: 5.0},
    "idle_held": lambda r: {ins.UTIL: r.uniform(0, 3), ins.CPU: r.uniform(3, 20), ins.SM_CLOCK: 345.0},
    "input_bound": lambda r: {ins.UTIL: r.uniform(5, 20), ins.CPU: r.uniform(85, 95)},
    "power_throttle": lambda r: {
        ins.POWER: r.uniform(695, 700),
        ins.SM_CLOCK: r.uniform(1395, 1425),
        ins.TEMP: r.uniform(80, 88),
    },
    "thermal_throttle": lambda r: {
        ins.TEMP: r.uniform(86, 92),
        ins.SM_CLOCK: r.uniform(1300, 1500),
        ins.POWER: r.uniform(400, 500),
    },
    "memory_pressure": lambda r: {ins.FB: r.uniform(96, 99.5)},
}


def series_of(rows: list[Row]) -> dict[str, list[tuple[int, float]]]:
    out: dict[str, list[tuple[int, float]]] = {k: [] for k in c.LYCEUM_KEYS}
    for i, row in enumerate(rows):
        for k, v in row.items():
            out[k].append((T0 + i * INTERVAL, v))
    return out


def run_of(n: int, **kw: object) -> RunInfo:
    return RunInfo(T0, T0 + (n - 1) * INTERVAL, INTERVAL, gpus=("0",), gpu_count=1, **kw)  # type: ignore[arg-type]


def only(found: list[Finding], kind: str) -> Finding:
    assert [f.kind for f in found] == [kind], [(f.kind, f.message) for f in found]
    return found[0]


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32), n=st.integers(8, 400))
def test_steady_series_give_no_findings(seed: int, n: int) -> None:
    rng = random.Random(seed)
    rows = [steady(rng) for _ in range(n)]
    assert findings(series_of(rows), run_of(n)) == []


@settings(max_examples=150, deadline=None)
@given(
    kind=st.sampled_from(sorted(CONDITIONS)),
    seed=st.integers(0, 2**32),
    before=st.integers(4, 100),
    length=st.integers(12, 200),
    after=st.integers(4, 100),
    blip=st.one_of(st.none(), st.floats(0.1, 0.9)),
)
def test_inserted_condition_is_found_at_its_edges(
    kind: str, seed: int, before: int, length: int, after: int, blip: float | None
) -> None:
    rng = random.Random(seed)
    rows = [steady(rng) for _ in range(before + length + after)]
    for i in range(before, before + length):
        rows[i].update(CONDITIONS[kind](rng))
    if blip is not None:  # 30 s (two points) of normal running inside: still one finding
        at = before + 1 + round(blip * (length - 4))
        for i in (at, at + 1):
            rows[i] = steady(rng)
    found = only(findings(series_of(rows), run_of(len(rows))), kind)
    assert abs(found.start_ms - (T0 + before * INTERVAL)) <= TOLERANCE
    assert abs(found.end_ms - (T0 + (before + length - 1) * INTERVAL)) <= TOLERANCE
    assert found.severity in ("info", "warning", "critical")
    assert found.message.endswith(".") and "\n" not in found.message
    assert found.evidence["durationSeconds"] == (found.end_ms - found.start_ms + INTERVAL) // 1000


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32), n=st.integers(20, 200), at=st.floats(0, 1))
def test_a_30s_blip_alone_is_no_finding(seed: int, n: int, at: float) -> None:
    rng = random.Random(seed)
    rows = [steady(rng) for _ in range(n)]
    i = round(at * (n - 2))
    for j in (i, i + 1):
        rows[j].update(CONDITIONS["idle_held"](rng))
    assert findings(series_of(rows), run_of(n)) == []


def test_oom_climb_then_failure() -> None:
    rng = random.Random(1)
    rows = [steady(rng) for _ in range(200)]
    for i in range(200):
        rows[i][ins.FB] = 60 + rng.uniform(-0.08, 0.08)
    for j, i in enumerate(range(120, 200)):  # climbs to 100 % over 80 points
        rows[i][ins.FB] = 60 + 40 * (j + 1) / 80
    run = run_of(200, status="failed", ended_ms=T0 + 199 * INTERVAL)
    found = only(findings(series_of(rows), run), "oom_suspected")
    assert found.start_ms == T0 + 119 * INTERVAL
    assert found.end_ms == T0 + 199 * INTERVAL
    assert found.severity == "critical"
    # the same run completing: memory pressure, no OOM
    ok = only(findings(series_of(rows), run_of(200)), "memory_pressure")
    assert ok.start_ms >= T0 + 185 * INTERVAL


def test_oom_release_then_idle() -> None:
    rng = random.Random(2)
    rows = [steady(rng) for _ in range(100)]
    for j, i in enumerate(range(30, 54)):  # climbs from 70 % to 99 % over 6 min, then released
        rows[i][ins.FB] = 70 + 29 * min(1.0, (j + 1) / 20)
    for i in range(54, 100):
        rows[i].update({ins.UTIL: 0.0, ins.FB: 1.0})
    kinds = sorted(f.kind for f in findings(series_of(rows), run_of(100)))
    assert kinds == ["idle", "oom_suspected"]
    oom = next(f for f in findings(series_of(rows), run_of(100)) if f.kind == "oom_suspected")
    assert abs(oom.start_ms - (T0 + 30 * INTERVAL)) <= 2 * INTERVAL
    # near full for a moment (three samples), with no climb before it: too short to tell
    for i in range(30, 51):
        rows[i][ins.FB] = rng.uniform(60, 80)
    assert [f.kind for f in findings(series_of(rows), run_of(100))] == ["idle"]


def test_gap_is_no_data_and_low_utilization() -> None:
    rng = random.Random(3)
    rows = [steady(rng) for _ in range(100)]
    for i in range(100):
        rows[i][ins.UTIL] = rng.uniform(15, 30)
    for i in range(40, 60):
        rows[i] = {}
    found = findings(series_of(rows), run_of(100))
    assert [f.kind for f in found] == ["low_utilization", "no_data"]
    gap = found[1]
    assert (gap.start_ms, gap.end_ms) == (T0 + 40 * INTERVAL, T0 + 59 * INTERVAL)
    assert gap.evidence["series"] == [ins.UTIL, ins.CPU]


def test_cpu_only_run_has_no_gpu_findings() -> None:
    rows = [{ins.CPU: 70.0} for _ in range(50)]
    assert findings(series_of(rows), RunInfo(T0, T0 + 49 * INTERVAL, INTERVAL)) == []


def test_smooth_and_runs() -> None:
    mask = [True, False, False, True, False, False, False, True]
    assert smooth(mask, 2) == [True, True, True, True, False, False, False, True]
    assert runs(smooth(mask, 2)) == [(0, 3), (7, 7)]
    assert runs([False, False]) == []


def per_gpu_rows(rows: list[Row]) -> dict[str, list[tuple[int, float]]]:
    return {k: v for k, v in series_of(rows).items() if k in (ins.UTIL, ins.FB)}


def host_findings(per_gpu: dict[str, list[Row]]) -> list[ins.Finding]:
    """The findings of a host whose GPUs have these rows: the host series the mean of the GPUs'
    utilization (the other series GPU 0's), each GPU's rows its per-GPU series."""
    gpus, n = len(per_gpu), len(per_gpu["0"])
    mean = [
        {ins.UTIL: sum(per_gpu[str(g)][i][ins.UTIL] for g in range(gpus)) / gpus}
        | {k: v for k, v in per_gpu["0"][i].items() if k != ins.UTIL}
        for i in range(n)
    ]
    run = RunInfo(T0, T0 + (n - 1) * INTERVAL, INTERVAL, gpus=tuple(per_gpu), gpu_count=gpus)
    return findings(series_of(mean), run, per_gpu={g: per_gpu_rows(r) for g, r in per_gpu.items()})


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**32),
    gpus=st.integers(2, 8),
    unused=st.integers(1, 7),
    held=st.booleans(),
    before=st.integers(0, 60),
    length=st.integers(12, 120),
    after=st.integers(0, 60),
)
def test_unused_gpus_among_working_ones(
    seed: int, gpus: int, unused: int, held: bool, before: int, length: int, after: int
) -> None:
    unused = min(unused, gpus - 1)
    rng = random.Random(seed)
    n = before + length + after
    per_gpu: dict[str, list[Row]] = {str(g): [steady(rng) for _ in range(n)] for g in range(gpus)}
    idle_ids = [str(g) for g in range(gpus - unused, gpus)]
    for g in idle_ids:
        for i in range(before, before + length):
            per_gpu[g][i].update({ins.UTIL: rng.uniform(0, 3), ins.FB: rng.uniform(60, 80) if held else 0.0})
    found = host_findings(per_gpu)
    assert len(found) == 1, [(f.kind, f.gpus, f.message) for f in found]  # nor low_utilization
    f = found[0]
    assert f.kind == ("idle_held" if held else "idle")
    assert list(f.gpus) == idle_ids and f.gpu_count == unused
    assert abs(f.start_ms - (T0 + before * INTERVAL)) <= TOLERANCE
    assert abs(f.end_ms - (T0 + (before + length - 1) * INTERVAL)) <= TOLERANCE
    assert f.message.startswith("GPU")


def test_all_gpus_idle_is_no_per_gpu_finding() -> None:
    rng = random.Random(4)
    rows = [steady(rng) for _ in range(60)]
    for i in range(20, 40):
        rows[i].update({ins.UTIL: 0.0, ins.CPU: 5.0})
    per_gpu = {g: per_gpu_rows(rows) for g in ("0", "1")}
    found = findings(series_of(rows), run_of(60), per_gpu=per_gpu)
    assert [(f.kind, f.gpu_count) for f in found] == [("idle_held", 0)]


def test_low_utilization_of_the_working_gpus() -> None:
    """A GPU unused beside one that really works (>= the working threshold) is its own finding, and
    low utilization then counts only the working GPU; beside one that barely works (15-30 %), the
    unused GPU is no finding of its own: the whole run's low utilization says it."""
    rng = random.Random(5)
    n = 80

    def run(lo: float, hi: float) -> list[Finding]:
        busy = [steady(rng) | {ins.UTIL: rng.uniform(lo, hi)} for _ in range(n)]
        unused = [steady(rng) | {ins.UTIL: 0.0, ins.FB: 0.0} for _ in range(n)]
        mean = [b | {ins.UTIL: (b[ins.UTIL] + u[ins.UTIL]) / 2} for b, u in zip(busy, unused, strict=True)]
        per_gpu = {"0": per_gpu_rows(busy), "1": per_gpu_rows(unused)}
        two = RunInfo(T0, T0 + (n - 1) * INTERVAL, INTERVAL, gpus=("0", "1"), gpu_count=2)
        return findings(series_of(mean), two, per_gpu=per_gpu)

    barely = run(15, 30)
    assert [(f.kind, f.gpus) for f in barely] == [("low_utilization", ("0", "1"))]
    assert 5 <= float(barely[0].evidence["meanUtilizationUnexplainedPercent"]) <= 17
    working = run(45, 60)
    assert [(f.kind, f.gpus) for f in working] == [("idle", ("1",))]


def test_input_bound_by_pcie_receive() -> None:
    rng = random.Random(6)
    rows = [steady(rng) for _ in range(60)]
    for i in range(20, 40):
        rows[i].update({ins.UTIL: rng.uniform(5, 20), ins.PCIE_RX: 2 * 9e9})  # 2 GPUs at 9 GB/s
    run = RunInfo(T0, T0 + 59 * INTERVAL, INTERVAL, gpus=("0", "1"), gpu_count=2)
    found = only(findings(series_of(rows), run), "input_bound")
    assert (found.start_ms, found.end_ms) == (T0 + 20 * INTERVAL, T0 + 39 * INTERVAL)
    # at 4 GB/s per GPU the bus is not busy: low utilization with memory held, nothing more specific
    for i in range(20, 40):
        rows[i][ins.PCIE_RX] = 2 * 4e9
    assert findings(series_of(rows), run) == []


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 2**32), hold=st.integers(2, 6), before=st.integers(0, 60), length=st.integers(24, 90)
)
def test_unused_gpu_found_from_coarser_per_gpu_series(seed: int, hold: int, before: int, length: int) -> None:
    """Per-GPU series on a grid `hold` times coarser (a long window's): each point stands for the grid
    points before it, so the unused GPU is still found, its edges within one coarse step."""
    rng = random.Random(seed)
    n = before + length + 30
    per_gpu: dict[str, list[Row]] = {g: [steady(rng) for _ in range(n)] for g in ("0", "1")}
    for i in range(before, before + length):
        per_gpu["1"][i].update({ins.UTIL: rng.uniform(0, 3), ins.FB: 0.0})
    mean = [
        {ins.UTIL: (per_gpu["0"][i][ins.UTIL] + per_gpu["1"][i][ins.UTIL]) / 2}
        | {k: v for k, v in per_gpu["0"][i].items() if k != ins.UTIL}
        for i in range(n)
    ]

    def coarse(rows: list[Row]) -> dict[str, list[tuple[int, float]]]:
        # what a range query at step hold * INTERVAL gives: the value at each of its grid points
        return {k: [p for j, p in enumerate(v) if j % hold == 0] for k, v in per_gpu_rows(rows).items()}

    run = RunInfo(T0, T0 + (n - 1) * INTERVAL, INTERVAL, gpus=("0", "1"), gpu_count=2)
    found = findings(
        series_of(mean),
        run,
        per_gpu={g: coarse(r) for g, r in per_gpu.items()},
        per_gpu_interval_ms=hold * INTERVAL,
    )
    assert [(f.kind, f.gpus) for f in found] == [("idle", ("1",))], [(f.kind, f.message) for f in found]
    f = found[0]
    step = hold * INTERVAL
    assert abs(f.start_ms - (T0 + before * INTERVAL)) <= TOLERANCE + step
    assert abs(f.end_ms - (T0 + (before + length - 1) * INTERVAL)) <= TOLERANCE + step


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 2**32),
    gpus=st.integers(3, 8),
    slow=st.floats(20, 45),
    before=st.integers(0, 60),
    length=st.integers(12, 120),
    after=st.integers(0, 60),
)
def test_a_gpu_far_from_the_others_is_an_imbalance(
    seed: int, gpus: int, slow: float, before: int, length: int, after: int
) -> None:
    """One working GPU well below the others (a straggler) is one `gpu_imbalance` finding naming it,
    at its edges; with every GPU alike there is none."""
    rng = random.Random(seed)
    n = before + length + after
    per_gpu: dict[str, list[Row]] = {str(g): [steady(rng) for _ in range(n)] for g in range(gpus)}
    straggler = str(gpus - 1)
    for i in range(before, before + length):
        per_gpu[straggler][i][ins.UTIL] = rng.uniform(slow - 5, slow + 5)
    found = host_findings(per_gpu)
    kinds = [(f.kind, f.gpus) for f in found]
    assert kinds == [("gpu_imbalance", (straggler,))], [(f.kind, f.gpus, f.message) for f in found]
    f = found[0]
    assert abs(f.start_ms - (T0 + before * INTERVAL)) <= TOLERANCE
    assert abs(f.end_ms - (T0 + (before + length - 1) * INTERVAL)) <= TOLERANCE
    assert host_findings({g: [steady(rng) for _ in range(n)] for g in per_gpu}) == []  # all alike
