"""Built-in scenarios the tests and benchmarks use besides the demo's `default_scenario`."""

from __future__ import annotations

import random

from gpulens.demo.scenario import (
    DEFAULT_END_S,
    DEFAULT_SCRAPE_INTERVAL_S,
    H100,
    ExecutionSpec,
    Host,
    NodeExporter,
    Phase,
    PhaseKind,
    Scenario,
    aligned,
    default_scenario,
    make_gpus,
    random_uuid,
)
from gpulens.domain import catalog as c
from gpulens.domain.models import ExecutionStatus


def node_found_by_uname_only(host: Host) -> bool:
    """True when the node-exporter's `instance` does not name the host (only node_uname_info{nodename}
    does): its series reach the host only through a join on node_uname_info."""
    return host.node.instance.rsplit(":", 1)[0] != host.hostname


def bench_scenario(
    seed: int = 11, days: float = 1.0, interval_s: int = DEFAULT_SCRAPE_INTERVAL_S
) -> Scenario:
    """One host with 8 H100s over `days`, two executions per 6-hour cycle (one throttles, one OOMs)."""
    rng = random.Random(seed)  # noqa: S311 - reproducible test data, not secrets
    span = aligned(days * 86_400, interval_s)
    start = DEFAULT_END_S - span
    host = Host(
        "bench-node-1",
        NodeExporter("bench-node-1:9100", cpus=16, mem_total_bytes=2_113_898_102_784),
        H100,
        make_gpus(rng, 8),
        host_label=c.DCGM_HOST_LABELS[0],
        dcgm_instance="bench-node-1:9400",
    )
    k = PhaseKind

    def phases(*items: tuple[PhaseKind, int]) -> tuple[Phase, ...]:
        return tuple(Phase(kind, aligned(minutes * 60, interval_s)) for kind, minutes in items)

    a_phases = phases((k.WARMUP, 10), (k.STEADY, 180), (k.THROTTLE, 30), (k.STEADY, 60), (k.IDLE, 20))
    b_phases = phases((k.WARMUP, 10), (k.STEADY, 120), (k.INPUT_STALL, 60), (k.OOM, 30))
    executions: list[ExecutionSpec] = []
    cycle = 6 * 3600
    for i, cycle_start in enumerate(range(start, DEFAULT_END_S, cycle)):
        a = ExecutionSpec(
            random_uuid(rng),
            f"a-{i}",
            host.hostname,
            (0, 1, 2, 3),
            cycle_start + aligned(600, interval_s),
            a_phases,
            fb_used_percent=70,
        )
        b = ExecutionSpec(
            random_uuid(rng),
            f"b-{i}",
            host.hostname,
            (4, 5, 6, 7),
            cycle_start + aligned(2400, interval_s),
            b_phases,
            ExecutionStatus.FAILED,
            55,
        )
        executions.extend(e for e in (a, b) if e.end_s <= DEFAULT_END_S)
    return Scenario("bench", seed, start, DEFAULT_END_S, (host,), tuple(executions), interval_s)


def build_scenario(name: str, seed: int | None = None, hours: float | None = None) -> Scenario:
    """A built-in scenario by name: `default` (hours, 3 by default) or `bench` (hours, 24 by default)."""
    if name == "default":
        return default_scenario(7 if seed is None else seed, 3.0 if hours is None else hours)
    if name == "bench":
        return bench_scenario(11 if seed is None else seed, (24.0 if hours is None else hours) / 24)
    raise ValueError(f"unknown scenario {name!r} (default, bench)")
