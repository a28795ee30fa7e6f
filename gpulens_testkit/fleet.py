"""A generated fleet for the usage table (docs/usage.md): many executions of several users, projects
and hardware profiles, each a known sequence of phases, and the receipt the generator knows is true.

Each host runs one execution at a time (all its GPUs or the first few), so that one execution's
phases never explain another's (an input-bound stretch makes the whole host's CPU busy). Every
phase lasts well past the detectors' minimum durations, so the truth is the phases' own:

- GPU time: the GPUs x the run's length; idle with memory held: the `idle` phases (utilization 0,
  memory kept); input-bound: the `input_stall` phases; throttled: the `throttle` phases;
- useful GPU-seconds and energy: the integrals the receipt defines (trapezoids between consecutive
  samples, from the sample at the run's start to the one at its end) of the generated utilization /
  100 and power, each GPU's own values.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace

from gpulens.agent.samples import Sample
from gpulens.demo.env import demo_execution
from gpulens.demo.history import Field, SeriesDef
from gpulens.demo.scenario import (
    A100,
    DEFAULT_END_S,
    H100,
    ExecutionSpec,
    Host,
    NodeExporter,
    Phase,
    PhaseKind,
    Scenario,
    aligned,
    make_gpus,
    random_uuid,
)
from gpulens.domain import catalog as c
from gpulens.domain.models import Execution, ExecutionStatus
from gpulens.storage.registry import Registry
from gpulens.storage.samples import SampleStore
from gpulens_testkit.history import Dataset

USERS = ("alice", "bob", "carol", "dave", "erin", "frank")
PROJECTS = ("vision", "llm", "speech", "recsys")
INTERVAL_S = 60
# the phases a run may go through after its warm-up, and how long each lasts (minutes)
MIDDLE = {
    PhaseKind.STEADY: (8, 20),
    PhaseKind.IDLE: (6, 15),
    PhaseKind.INPUT_STALL: (8, 15),
    PhaseKind.THROTTLE: (6, 12),
}
# an idle stretch straight into an input stall is one stretch of low utilization to the detectors,
# whose CPU share decides it as a whole (docs/usage.md): the fleet puts work between the two
UNSPLIT = {PhaseKind.IDLE, PhaseKind.INPUT_STALL}
TRUE_LINE = {
    PhaseKind.IDLE: "idle_held",
    PhaseKind.INPUT_STALL: "input_bound",
    PhaseKind.THROTTLE: "throttled",
}


def fleet_scenario(seed: int = 19, executions: int = 240, hosts: int = 24) -> Scenario:
    """`executions` runs spread over `hosts` hosts (H100 and A100, 2 or 4 GPUs), one after another on
    each host with a few minutes between them; the scenario ends when the busiest host is done."""
    rng = random.Random(seed)  # noqa: S311 - reproducible test data, not secrets
    machines = []
    for i in range(hosts):
        name = f"fleet-{i:02d}"
        machines.append(
            Host(
                name,
                NodeExporter(f"{name}:9100", cpus=2, mem_total_bytes=1_081_947_291_648),
                H100 if i % 3 else A100,
                make_gpus(rng, 4 if i % 2 else 2),
                host_label=c.DCGM_HOST_LABELS[i % 2],
                dcgm_instance=f"{name}:9400",
            )
        )

    def minutes(lo: int, hi: int) -> int:
        return aligned(rng.randint(lo, hi) * 60, INTERVAL_S)

    plans: list[tuple[Host, int, tuple[int, ...], tuple[Phase, ...]]] = []
    clock = dict.fromkeys(range(hosts), minutes(1, 5))  # offsets from the start, per host
    for k in range(executions):
        h = k % hosts
        host = machines[h]
        kinds: list[PhaseKind] = []
        for _ in range(rng.randint(2, 4)):
            choices = [kind for kind in MIDDLE if not kinds or kind is not kinds[-1]]
            kind = rng.choice(choices)
            if kinds and {kind, kinds[-1]} == UNSPLIT:
                kinds.append(PhaseKind.STEADY)
            kinds.append(kind)
        phases = (
            Phase(PhaseKind.WARMUP, minutes(2, 4)),
            *(Phase(kind, minutes(*MIDDLE[kind])) for kind in kinds),
        )
        gpus = () if rng.random() < 0.6 else tuple(range(rng.randint(1, len(host.gpus))))
        plans.append((host, clock[h], gpus, phases))
        clock[h] += sum(p.duration_s for p in phases) + minutes(2, 8)
    span = max(clock.values())
    start = DEFAULT_END_S - span
    specs = tuple(
        ExecutionSpec(
            random_uuid(rng),
            f"fleet-run-{k:04d}",
            host.hostname,
            gpus,
            start + offset,
            phases,
            ExecutionStatus.COMPLETED,
            fb_used_percent=rng.randint(30, 80),
            user=rng.choice(USERS),
            project=rng.choice(PROJECTS),
        )
        for k, (host, offset, gpus, phases) in enumerate(plans)
    )
    return Scenario("fleet", seed, start, DEFAULT_END_S, tuple(machines), specs, INTERVAL_S)


@dataclass(frozen=True, slots=True)
class TrueReceipt:
    """What an execution's receipt should say, from the generator (GPU time in GPU-ms)."""

    execution_id: str
    user: str | None
    project: str | None
    hardware_profile: str
    hostname: str
    gpu_ms: int
    idle_held_ms: int
    input_bound_ms: int
    throttled_ms: int
    useful_gpu_s: float
    energy_j: float


def _integral(dataset: Dataset, series: Sequence[SeriesDef], k0: int, k1: int) -> float:
    """The trapezoids between samples k0 .. k1 - 1 of each series, summed (value x seconds)."""
    total = 0.0
    for one in series:
        v = dataset.values(one, k0, k1)
        total += sum(v) - (v[0] + v[-1]) / 2
    return total * dataset.interval_s


def true_receipts(scenario: Scenario, dataset: Dataset) -> Iterator[TrueReceipt]:
    interval = scenario.scrape_interval_s
    for spec in scenario.executions:
        host = scenario.host(spec.hostname)
        gpus = scenario.gpus_of(spec)
        lines = dict.fromkeys(TRUE_LINE.values(), 0)
        for span in spec.spans():
            line = TRUE_LINE.get(span.phase.kind)
            if line is not None:
                lines[line] += (span.end_s - span.start_s) * 1000 * len(gpus)
        # the samples start <= t <= end: the trapezoids between them
        k0 = (spec.start_s - scenario.start_s) // interval
        k1 = (spec.end_s - scenario.start_s) // interval + 1

        yield TrueReceipt(
            spec.execution_id,
            spec.user,
            spec.project,
            registered(scenario, spec, "").hardware_profile or "",
            host.hostname,
            (spec.end_s - spec.start_s) * 1000 * len(gpus),
            lines["idle_held"],
            lines["input_bound"],
            lines["throttled"],
            _integral(dataset, dataset.gpu_series(host.hostname, Field.GPU_UTIL, gpus), k0, k1) / 100,
            _integral(dataset, dataset.gpu_series(host.hostname, Field.POWER, gpus), k0, k1),
        )


def registered(scenario: Scenario, spec: ExecutionSpec, org: str) -> Execution:
    """The registry's row of a fleet run, as the demo registers its runs (user, project and hardware
    profile included), in `org`."""
    return replace(demo_execution(scenario, spec).execution, org=org)


def write_fleet(
    scenario: Scenario, dataset: Dataset, store: SampleStore, registry: Registry, org: str
) -> int:
    """Every series of the fleet into the embedded store and every run into the registry; the samples
    written."""
    written = 0
    for series in dataset.series:
        written += store.write(
            Sample(series.name, series.labels, float(v), t * 1000) for t, v in dataset.samples(series)
        )
    registry.ensure_org(org)
    for spec in scenario.executions:
        registry.upsert_execution(registered(scenario, spec, org), now=spec.end)
    return written
