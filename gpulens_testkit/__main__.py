"""`python -m gpulens_testkit --out DIR`: a scenario as OpenMetrics files plus truth.json, and a summary."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

from gpulens.demo.scenario import Scenario
from gpulens.domain import catalog as c
from gpulens_testkit.history import Dataset, generate
from gpulens_testkit.k8s_generate import K8sDataset
from gpulens_testkit.k8s_scenario import K8S_DEFAULT_SEED, AppKind, k8s_scenario
from gpulens_testkit.k8s_truth import DEFAULT_SAMPLES, K8sTruth
from gpulens_testkit.openmetrics import (
    ScenarioSpan,
    choose_block_seconds,
    format_block_duration,
    write_openmetrics,
)
from gpulens_testkit.scenarios import build_scenario, node_found_by_uname_only
from gpulens_testkit.truth import GroundTruth

_SUMMARY_KEYS = (
    ("gpuUtilizationPercent", "util", "mean", "%"),
    ("gpuMemoryUtilizationPercent", "FB", "max", "% peak"),
    ("gpuTemperatureCelsius", "temp", "max", " C max"),
    ("gpuPowerWatt", "power", "mean", " W"),
    ("systemCpuUsagePercent", "CPU", "mean", "%"),
)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m gpulens_testkit", description=__doc__)
    p.add_argument("--out", type=Path, required=True, help="output directory")
    p.add_argument("--scenario", choices=("default", "bench", "k8s"), default="default")
    p.add_argument("--hours", type=float, default=None, help="length (default 3 h; bench 24 h)")
    p.add_argument("--days", type=float, default=None, help="length in days (overrides --hours)")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--block-hours", type=int, default=None, help="block window: 2, 6, 18, 54, 162 or 486")
    p.add_argument(
        "--step", type=int, default=None, help="truth grid/summary step in s (default 15; bench 60)"
    )
    p.add_argument(
        "--grid",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="include per-point truth in truth.json (default: on for `default`, off for `bench`)",
    )
    p.add_argument("--no-files", action="store_true", help="only truth.json and the summary")
    p.add_argument(
        "--samples",
        type=int,
        default=DEFAULT_SAMPLES,
        help="k8s: Run:ai numberOfSamples per pod in truth.json",
    )
    return p


def _block_seconds(args: argparse.Namespace, scenario: ScenarioSpan) -> int:
    """`--block-hours`, or the block duration `choose_block_seconds` picks for the scenario's span."""
    if args.block_hours:
        return int(args.block_hours) * 3600
    return choose_block_seconds(scenario.end_s - scenario.start_s)


def _fmt(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def print_summary(scenario: Scenario, dataset: Dataset, truth_doc: dict[str, Any], out: TextIO) -> None:
    """The scenario, its hosts and executions, with each execution's truth summary from `truth_doc`
    (`GroundTruth.to_json`, executions in scenario order)."""
    samples = len(dataset.series) * dataset.sample_count
    print(
        f"scenario {scenario.name} (seed {scenario.seed}): {scenario.start.isoformat()} .. "
        f"{scenario.end.isoformat()}, scrape {scenario.scrape_interval_s} s, {len(scenario.hosts)} hosts, "
        f"{len(dataset.series)} series, {samples:,} samples",
        file=out,
    )
    for h in scenario.hosts:
        gpus = "no GPUs" if h.gpu_model is None else f"{len(h.gpus)} x {h.gpu_model.name}"
        dcgm = (
            ""
            if h.gpu_model is None
            else (
                f", dcgm label {h.host_label}, {h.power_limit_series}, "
                f"PCIe {'KB/s' if h.pcie_kbps else 'bytes/s'}"
            )
        )
        via = " (only via node_uname_info)" if node_found_by_uname_only(h) else ""
        print(f"  host {h.hostname}: {gpus}, node {h.node.instance}{via}, {h.node.cpus} CPUs{dcgm}", file=out)
    for e, doc in zip(scenario.executions, truth_doc["executions"], strict=True):
        gpus = ",".join(str(g) for g in scenario.gpus_of(e)) or "-"
        print(
            f"  execution {e.name} {e.execution_id} on {e.hostname} GPUs {gpus}: "
            f"{e.start:%H:%M} -> {e.end:%H:%M} UTC, {e.status.value}",
            file=out,
        )
        phases = ", ".join(f"{s.phase.kind.value} {s.phase.duration_s // 60}m" for s in e.spans())
        print(f"      phases: {phases}", file=out)
        parts = []
        for key, label, stat, unit in _SUMMARY_KEYS:
            value = doc["summary"][key][stat]
            if value is not None:
                parts.append(f"{label} {_fmt(value)}{unit}")
        print("      " + (" | ".join(parts) or "no data"), file=out)


def main_k8s(args: argparse.Namespace) -> int:
    """`--scenario k8s`: OpenMetrics files, truth.json (every pod, every Run:ai type) and a summary."""
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    scenario = k8s_scenario(K8S_DEFAULT_SEED if args.seed is None else args.seed)
    dataset = K8sDataset(scenario)
    block_s = _block_seconds(args, scenario)
    files = [] if args.no_files else write_openmetrics(dataset, out, block_s)
    truth = K8sTruth(dataset)
    (out / "truth.json").write_text(json.dumps(truth.to_json(args.samples), indent=1) + "\n")
    samples = sum(1 for s in dataset.series for v in dataset.raw(s) if v is not None)
    print(
        f"scenario k8s (seed {scenario.seed}): {scenario.start.isoformat()} .. {scenario.end.isoformat()}, "
        f"{len(dataset.series)} series, {samples:,} samples"
    )
    for node in scenario.nodes:
        mode = "honor_labels=true" if node.honor_labels else "honor_labels=false (exported_*)"
        slots = ",".join(s.key for s in node.slots())
        print(f"  node {node.hostname}: {node.gpu_model.name} slots {slots}, {mode}, label {node.host_label}")
    for p in scenario.pods:
        end = "running" if p.end is None else f"{p.end:%H:%M} {p.final_phase.value}"
        app = "" if p.app is AppKind.NONE else f", {p.app.value} {p.model_name}"
        print(
            f"  pod {p.namespace}/{p.name} uid {p.pod_id} (workload {p.workload} {p.workload_id}) on "
            f"{p.node} GPUs {','.join(p.slot_keys)}: {p.start:%H:%M} -> {end}{app}"
        )
    print(
        f"wrote {len(files)} OpenMetrics file(s) (block {format_block_duration(block_s)}) and truth.json "
        f"to {out} in {time.monotonic() - started:.1f} s"
    )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.scenario == "k8s":
        return main_k8s(args)
    hours = args.days * 24 if args.days is not None else args.hours
    try:
        scenario = build_scenario(args.scenario, args.seed, hours)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    bench = args.scenario == "bench"
    step_ms = (args.step or (60 if bench else scenario.scrape_interval_s)) * 1000
    grid = (not bench) if args.grid is None else args.grid
    block_s = _block_seconds(args, scenario)
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    dataset = generate(scenario)
    files: list[Path] = []
    if not args.no_files:
        files = write_openmetrics(dataset, out, block_s)
    truth_doc = GroundTruth(dataset).to_json(step_ms, grid=grid)
    (out / "truth.json").write_text(json.dumps(truth_doc, indent=1) + "\n")
    print_summary(scenario, dataset, truth_doc, sys.stdout)
    print(
        f"wrote {len(files)} OpenMetrics file(s) (block {format_block_duration(block_s)}: promtool tsdb "
        f"create-blocks-from openmetrics --max-block-duration={format_block_duration(block_s)}) and "
        f"truth.json ({len(c.LYCEUM_KEYS)} metrics) to {out} in {time.monotonic() - started:.1f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
