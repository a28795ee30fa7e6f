"""Lyceum-style plans: one PromQL expression per catalog metric for one host (and some of its GPUs)."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from gpulens.domain import catalog as c
from gpulens.domain.catalog import Agg, Exporter, Form, MetricDef, Source
from gpulens.domain.models import GPU_INDEX_RE, GPU_UUID_RE
from gpulens.domain.timeparse import format_duration_ms
from gpulens.planning.layout import GPU_IDENTITY, HostLayout
from gpulens.planning.promql import (
    Matcher,
    any_of,
    by,
    eq,
    first_of,
    one_of,
    regex_escape,
    rename,
    scaled,
    selector,
)

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
    expr: str | None  # None: no source series exists, nothing to ask


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


@dataclass(frozen=True, slots=True)
class _Selectors:
    """How one target's series are selected: DCGM alternatives and the node matcher."""

    dcgm: list[list[Matcher]]
    node: list[Matcher]
    names: Mapping[str, str]
    layout: HostLayout | None

    def per_gpu(self, metric: str) -> str:
        """Each GPU once: a device seen as two series (pod-labelled and not, Hostname and hostname)
        is collapsed, unless the layout shows no GPU with more than one series."""
        name = rename(metric, self.names)
        sel = any_of(name, self.dcgm)
        if self.layout is not None and name not in self.layout.duplicated:
            return sel
        return f"max {by(GPU_IDENTITY)} ({sel})"

    def all_gpu(self, metric: str) -> str:
        return any_of(rename(metric, self.names), self.dcgm)

    def node_sel(self, metric: str, *extra: Matcher) -> str:
        return any_of(rename(metric, self.names), [[*extra, *self.node]])

    def node_one(self, metric: str) -> str:
        """The host's value of a node gauge: the series itself when it is the only one."""
        sel = self.node_sel(metric)
        if self.layout is not None and rename(metric, self.names) in self.layout.single_node:
            return sel
        return f"max({sel})"

    def present(self, series: Sequence[str]) -> bool:
        return self.layout is None or all(rename(s, self.names) in self.layout.present for s in series)


def gpu_groups(gpus: Sequence[str]) -> list[list[Matcher]]:
    """The GPU filters of an execution: one by index, one by UUID (a list may mix both), or none."""
    indices, uuids = split_gpus(gpus)
    groups: list[list[Matcher]] = []
    if indices:
        groups.append([one_of(c.LABEL_GPU, indices)])
    if uuids:
        groups.append([one_of(c.LABEL_UUID, uuids)])
    return groups or [[]]


def _selectors(target: HostTarget, options: HostPlanOptions, layout: HostLayout | None) -> _Selectors:
    labels = options.host_labels if layout is None else layout.host_labels
    dcgm = [[eq(label, target.hostname), *group] for label in labels for group in gpu_groups(target.gpus)]
    return _Selectors(dcgm, [node_instance_matcher(target, options.node_match)], options.metric_names, layout)


def plan_host(
    metrics: Sequence[MetricDef],
    target: HostTarget,
    step_ms: int,
    options: HostPlanOptions,
    layout: HostLayout | None = None,
    group: Sequence[str] = (),
) -> list[PlannedMetric]:
    """One expression per metric. Without a layout, the guarded form that is right on every exporter
    layout; with one, the simplest form that gives the same answer on it (planning/layout.py). A
    metric none of whose sources exist gets `expr=None`: nothing to ask, an empty series.

    `group` (GPU metrics only, e.g. `("gpu", "UUID")`): one series per group instead of one over all
    the target's GPUs, each what `plan_host` gives for that GPU alone (a MIG GPU's instances folded
    by the metric's own aggregation)."""
    sel = _selectors(target, options, layout)
    grouped = f" {by(group)} " if group else ""
    window = format_duration_ms(rate_window_ms(step_ms, options.scrape_interval_ms))
    planned = []
    for m in metrics:
        forms: list[str] = []
        for source in m.sources:
            s = source.series
            if (not sel.dcgm and m.exporter is Exporter.DCGM) or not sel.present(s):
                continue
            if m.form is Form.GPU_GAUGE and m.agg is Agg.MAX:  # max over duplicates is max already
                expr = f"max{grouped}({sel.all_gpu(s[0])})"
            elif m.form is Form.GPU_GAUGE:
                expr = f"{m.agg.value}{grouped}({sel.per_gpu(s[0])})"
            elif m.form is Form.GPU_FB_PERCENT:
                used, free = sel.per_gpu(s[0]), sel.per_gpu(s[1])
                if layout is not None and layout.fb_equal_totals and m.agg is Agg.AVG:
                    # equal totals T: mean(u_i / T) = sum(u) / (n T) = sum(u) / (sum(u) + sum(f)),
                    # written 1 / (1 + sum(f) / sum(u)) so that each series is selected once (a third
                    # less for the backend to read); u = 0 gives 0, u = f = 0 NaN, as the quotient does
                    su, sf = f"sum{grouped}({used})", f"sum{grouped}({free})"
                    expr = f"100 / (1 + {sf} / {su})"
                else:
                    expr = f"100 * {m.agg.value}{grouped}({used} / ({used} + {free}))"
            elif m.form is Form.NODE_GAUGE:
                expr = sel.node_one(s[0])
            elif m.form is Form.NODE_DIFF:
                if layout is not None and layout.node_labels_aligned:
                    expr = f"{sel.node_sel(s[0])} - {sel.node_sel(s[1])}"
                else:
                    expr = f"max({sel.node_sel(s[0])}) - max({sel.node_sel(s[1])})"
            elif m.form is Form.NODE_CPU_BUSY_PERCENT:
                idle = sel.node_sel(s[0], eq(c.LABEL_CPU_MODE, c.CPU_IDLE_MODE))
                if layout is not None and layout.cpu_covered:
                    # counters cover every rate window: all modes add up to one CPU-second per second
                    expr = f"100 * (1 - avg(rate({idle}[{window}])))"
                else:
                    # idle over all modes, not over the window: a series that starts inside the window
                    # (a host just booted, the local collector of `gpulens run`) is not read as busy
                    every = sel.node_sel(s[0])
                    expr = f"100 * (1 - sum(rate({idle}[{window}])) / sum(rate({every}[{window}])))"
            else:  # pragma: no cover - exhaustive over Form
                raise AssertionError(m.form)
            forms.append(scaled(expr, source.scale))
            if (
                layout is not None
                and m.exporter is Exporter.DCGM
                and _answers_all(layout, m, source, options)
            ):
                break  # the later alternatives of `or` could never answer
        planned.append(PlannedMetric(m, first_of(forms) if forms else None))
    return planned


def _answers_all(layout: HostLayout, m: MetricDef, source: Source, options: HostPlanOptions) -> bool:
    mine = rename(source.series[0], options.metric_names)
    later = [rename(s.series[0], options.metric_names) for s in m.sources[m.sources.index(source) + 1 :]]
    return all(layout.covers(mine, other) for other in later)


def energy_counter_expr(target: HostTarget, options: HostPlanOptions, span_ms: int) -> str:
    """mJ the execution's GPUs drew over `span_ms` before the query time, from dcgm-exporter's energy
    counter (mJ since driver load): its increase per GPU (resets handled by `increase`), each physical
    GPU once (duplicate series and MIG instances repeating it collapsed), summed."""
    name = rename(c.DCGM_TOTAL_ENERGY_CONSUMPTION, options.metric_names)
    window = format_duration_ms(span_ms)
    parts = [
        f"increase({selector(name, [eq(label, target.hostname), *group])}[{window}])"
        for label in options.host_labels
        for group in gpu_groups(target.gpus)
    ]
    inner = parts[0] if len(parts) == 1 else "(" + " or ".join(parts) + ")"
    # the counter belongs to the physical GPU: MIG instances that repeat it count once
    return f"sum(max {by((c.LABEL_GPU, c.LABEL_UUID))} ({inner}))"


def fb_check_exprs(
    target: HostTarget, options: HostPlanOptions, layout: HostLayout
) -> tuple[str, str, str, str]:
    """The FB-total check's expressions: spread of used + free over the GPUs, and how many GPUs report
    used, free and both (planning/layout.py `fb_totals_equal` reads their answers)."""
    sel = _selectors(target, options, layout)
    used, free = sel.per_gpu(c.DCGM_FB_USED), sel.per_gpu(c.DCGM_FB_FREE)
    total = f"({used} + {free})"
    return f"max({total}) - min({total})", f"count({used})", f"count({free})", f"count({total})"
