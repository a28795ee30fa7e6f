"""Lyceum-style plans: one PromQL expression per catalog metric for one host (and some of its GPUs)."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from gpulens.domain import catalog as c
from gpulens.domain.catalog import Agg, Form, MetricDef
from gpulens.domain.models import GPU_INDEX_RE, GPU_UUID_RE
from gpulens.domain.timeparse import format_duration_ms
from gpulens.planning.promql import Matcher, any_of, by, eq, first_of, one_of, regex_escape, rename, scaled

_GPU_UUID = re.compile(GPU_UUID_RE)
_GPU_INDEX = re.compile(GPU_INDEX_RE)


@dataclass(frozen=True, slots=True)
class HostTarget:
    """What to select: a host, optionally some of its GPUs, plus node-exporter instances found for it."""

    hostname: str
    gpus: tuple[str, ...] = ()
    node_instances: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class HostPlanOptions:
    host_labels: tuple[str, ...] = c.DCGM_HOST_LABELS
    node_match: str = "auto"  # auto | instance | nodename
    metric_names: Mapping[str, str] = field(default_factory=dict)
    scrape_interval_ms: int = 15_000


@dataclass(frozen=True, slots=True)
class PlannedMetric:
    metric: MetricDef
    expr: str


def split_gpus(gpus: Sequence[str]) -> tuple[list[str], list[str]]:
    """Indices and UUIDs, validated (anything else is a ValueError)."""
    indices, uuids = [], []
    for gpu in gpus:
        if _GPU_INDEX.fullmatch(gpu):
            indices.append(str(int(gpu)))
        elif _GPU_UUID.fullmatch(gpu):
            uuids.append(gpu)
        else:
            raise ValueError(f"not a GPU index or UUID: {gpu!r}")
    return indices, uuids


def rate_window_ms(step_ms: int, scrape_interval_ms: int) -> int:
    """max(step, 4 x scrape interval): always at least two samples per rate window."""
    return max(step_ms, 4 * scrape_interval_ms)


def node_instance_matcher(target: HostTarget, node_match: str) -> Matcher:
    """`instance=~"host(:port)?|<instances found through node_uname_info>"`."""
    alternatives: list[str] = []
    if node_match in ("auto", "instance"):
        alternatives.append(regex_escape(target.hostname) + "(:[0-9]+)?")
    if node_match in ("auto", "nodename"):
        alternatives.extend(regex_escape(i) for i in target.node_instances)
    if not alternatives:  # nodename matching found nothing: match nothing rather than everything
        return Matcher(c.LABEL_INSTANCE, "=~", "")
    return Matcher(c.LABEL_INSTANCE, "=~", "|".join(alternatives))


def plan_host(
    metrics: Sequence[MetricDef], target: HostTarget, step_ms: int, options: HostPlanOptions
) -> list[PlannedMetric]:
    indices, uuids = split_gpus(target.gpus)
    gpu_groups: list[list[Matcher]] = []
    if indices:
        gpu_groups.append([one_of(c.LABEL_GPU, indices)])
    if uuids:
        gpu_groups.append([one_of(c.LABEL_UUID, uuids)])
    if not gpu_groups:
        gpu_groups.append([])
    dcgm_alternatives = [
        [eq(label, target.hostname), *group] for label in options.host_labels for group in gpu_groups
    ]
    node_sel = [node_instance_matcher(target, options.node_match)]
    names = options.metric_names
    collapse = by((c.LABEL_GPU, c.LABEL_UUID, c.LABEL_GPU_INSTANCE))

    def per_gpu(metric: str) -> str:
        # Each GPU once: a device seen as two series (pod-labelled and not, Hostname and hostname)
        return f"max {collapse} ({any_of(rename(metric, names), dcgm_alternatives)})"

    def node(metric: str, *extra: Matcher) -> str:
        return any_of(rename(metric, names), [[*extra, *node_sel]])

    window = format_duration_ms(rate_window_ms(step_ms, options.scrape_interval_ms))
    planned = []
    for m in metrics:
        forms: list[str] = []
        for source in m.sources:
            s = source.series
            if m.form is Form.GPU_GAUGE and m.agg is Agg.MAX:  # max over duplicates is max already
                expr = f"max({any_of(rename(s[0], names), dcgm_alternatives)})"
            elif m.form is Form.GPU_GAUGE:
                expr = f"{m.agg.value}({per_gpu(s[0])})"
            elif m.form is Form.GPU_FB_PERCENT:
                used, free = per_gpu(s[0]), per_gpu(s[1])
                expr = f"100 * {m.agg.value}({used} / ({used} + {free}))"
            elif m.form is Form.NODE_GAUGE:
                expr = f"max({node(s[0])})"
            elif m.form is Form.NODE_DIFF:
                expr = f"max({node(s[0])}) - max({node(s[1])})"
            elif m.form is Form.NODE_CPU_BUSY_PERCENT:
                # idle over all modes, not over the window: a series that starts inside the window
                # (a host just booted, the local collector of `gpulens run`) is not read as busy
                idle = node(s[0], eq(c.LABEL_CPU_MODE, c.CPU_IDLE_MODE))
                expr = f"100 * (1 - sum(rate({idle}[{window}])) / sum(rate({node(s[0])}[{window}])))"
            else:  # pragma: no cover - exhaustive over Form
                raise AssertionError(m.form)
            forms.append(scaled(expr, source.scale))
        planned.append(PlannedMetric(m, first_of(forms)))
    return planned
