"""Run:ai-style plans: the PromQL for one pod metricType, and the sampling grid of numberOfSamples."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from gpulens.domain import catalog as c
from gpulens.domain.catalog import PERCENTILES, PodForm, PodMetricDef
from gpulens.domain.models import Window
from gpulens.domain.timeparse import datetime_to_ms, format_duration_ms
from gpulens.domain.workloads import Pod
from gpulens.planning.hosts import rate_window_ms
from gpulens.planning.promql import (
    Matcher,
    any_of,
    by,
    eq,
    first_of,
    one_of,
    over_range,
    quote,
    rename,
    scaled,
    series_match,
)
from gpulens.planning.slurm import is_slurm_namespace

PER_GPU_KEY = (c.LABEL_GPU, c.LABEL_GPU_INSTANCE)
QUANTILE_LABEL = c.LABEL_QUANTILE


@dataclass(frozen=True, slots=True)
class PodTarget:
    """One pod, or the pods of a workload: (namespace, pod name) pairs; and `hosts`, (node, GPU
    indices) of pods whose GPU series carry no pod labels but are those GPUs of that host (Slurm)."""

    pods: tuple[tuple[str, str], ...]
    hosts: tuple[tuple[str, tuple[str, ...]], ...] = ()

    @classmethod
    def one(cls, namespace: str, pod: str) -> PodTarget:
        return cls(((namespace, pod),))

    def by_namespace(self) -> list[tuple[str, list[str]]]:
        groups: dict[str, list[str]] = {}
        for namespace, pod in self.pods:
            groups.setdefault(namespace, []).append(pod)
        return [(ns, sorted(set(names))) for ns, names in sorted(groups.items())]

    def alternatives(self, ns_label: str, pod_label: str) -> list[list[Matcher]]:
        if pod_label == c.LABEL_GPU:  # (host label, gpu): the hosts' GPUs (`host_spellings`)
            by_host: dict[str, set[str]] = {}
            for node, gpus in self.hosts:
                by_host.setdefault(node, set()).update(gpus)
            return [
                [eq(ns_label, node), one_of(pod_label, sorted(gpus, key=int))]
                for node, gpus in sorted(by_host.items())
                if gpus
            ]
        out = []
        for ns, names in self.by_namespace():
            pod = eq(pod_label, names[0]) if len(names) == 1 else one_of(pod_label, names)
            out.append([eq(ns_label, ns), pod])
        return out


@dataclass(frozen=True, slots=True)
class PodPlanOptions:
    metric_names: Mapping[str, str] = field(default_factory=dict)
    scrape_interval_ms: int = 15_000
    # the labels dcgm-exporter names a GPU's host by (GPULENS_DCGM_HOST_LABEL; "auto": both spellings)
    host_labels: tuple[str, ...] = c.DCGM_HOST_LABELS


@dataclass(frozen=True, slots=True)
class PodLayout:
    """What the pods have over the window (from `layout_matches`' look-ups): the plan drops the
    label spellings and sources that cannot change its answer."""

    present: frozenset[str]  # series names (as renamed) with at least one series
    dcgm_spellings: tuple[tuple[str, str], ...]  # (namespace label, pod label) pairs DCGM series use


def pod_target(pods: Sequence[Pod]) -> PodTarget:
    """The target of registered pods: their (namespace, name) pairs, and the host GPUs of Slurm jobs'
    pods (namespace `slurm-<cluster>`, planning/slurm.py), whose dcgm-exporter series carry the host
    and GPU index but no pod labels."""
    hosts = tuple(
        (p.node, tuple(g for g in p.gpus if g.isdigit()))
        for p in pods
        if p.node and read_by_host(p.namespace, p.node, p.gpus)
    )
    return PodTarget(tuple((p.namespace, p.name) for p in pods), hosts)


def read_by_host(namespace: str, node: str | None, gpus: Sequence[str]) -> bool:
    """Whether a pod's GPUs are read by host and GPU index: a Slurm job node's pod (its namespace
    `slurm-<cluster>`, planning/slurm.py) on a node, holding GPUs by index; no pod label names them."""
    return bool(node) and is_slurm_namespace(namespace) and any(g.isdigit() for g in gpus)


def host_read_bounds(pods: Sequence[Pod], start_ms: int, end_ms: int, now_ms: int) -> tuple[int, int]:
    """[start_ms, end_ms] cut to the lifetime of the pods read by host and GPU index (Slurm jobs'):
    those GPUs serve other jobs before and after, whose samples must not count. Unchanged when no
    pod is read so; `end < start` when the window misses the lifetime."""
    hosted = [p for p in pods if read_by_host(p.namespace, p.node, p.gpus)]
    if not hosted:
        return start_ms, end_ms
    starts = [p.start_time for p in hosted]
    if all(t is not None for t in starts):
        start_ms = max(start_ms, min(datetime_to_ms(t) for t in starts if t is not None))
    end_ms = min(end_ms, max(now_ms if p.end_time is None else datetime_to_ms(p.end_time) for p in hosted))
    return start_ms, end_ms


def dcgm_spellings(host_labels: Sequence[str] = c.DCGM_HOST_LABELS) -> tuple[tuple[str, str], ...]:
    """How DCGM series name a pod's GPUs: its pod labels, either spelling; or (a target with `hosts`:
    GPUs no pod label names, a Slurm job's) the host and GPU index labels."""
    return (
        (c.LABEL_EXPORTED_NAMESPACE, c.LABEL_EXPORTED_POD),
        (c.LABEL_NAMESPACE, c.LABEL_POD),
        *((host, c.LABEL_GPU) for host in host_labels),
    )


def pod_source_names(
    metrics: Sequence[PodMetricDef], names: Mapping[str, str]
) -> tuple[list[str], list[str]]:
    """(DCGM names, the pods' own names incl. histogram buckets) the metricTypes may read."""
    dcgm, app = set(), set()
    for m in metrics:
        for src in m.sources:
            name = rename(src.series[0], names)
            if m.form in (PodForm.DCGM_PER_GPU, PodForm.DCGM_POD):
                dcgm.add(name)
            elif m.form in (PodForm.APP_HISTOGRAM, PodForm.APP_PERCENTILES):
                app.add(rename(src.series[0] + c.BUCKET_SUFFIX, names))
            else:
                app.add(name)
    return sorted(dcgm), sorted(app)


def layout_matches(
    target: PodTarget, metrics: Sequence[PodMetricDef], options: PodPlanOptions
) -> list[tuple[tuple[str, str], str]]:
    """Series look-ups: per (namespace label, pod label) spelling and namespace, one match of every
    name the pods' plans may read under that spelling (DCGM names under both, the rest plainly)."""
    dcgm, app = pod_source_names(metrics, options.metric_names)
    out = []
    for spelling in dcgm_spellings(options.host_labels):
        wanted = dcgm + app if spelling == (c.LABEL_NAMESPACE, c.LABEL_POD) else dcgm
        if not wanted:
            continue
        for alt in target.alternatives(*spelling):
            out.append((spelling, series_match([one_of(c.LABEL_METRIC_NAME, wanted), *alt])))
    return out


def derive_pod_layout(
    metrics: Sequence[PodMetricDef],
    found: Sequence[tuple[tuple[str, str], Sequence[Mapping[str, str]]]],
    options: PodPlanOptions,
) -> PodLayout:
    dcgm = set(pod_source_names(metrics, options.metric_names)[0])
    present: set[str] = set()
    spellings: set[tuple[str, str]] = set()
    for spelling, series in found:
        for s in series:
            name = s.get(c.LABEL_METRIC_NAME, "")
            present.add(name)
            if name in dcgm:
                spellings.add(spelling)
    ordered = tuple(sp for sp in dcgm_spellings(options.host_labels) if sp in spellings)
    return PodLayout(frozenset(present), ordered)


def collapse_key(target: PodTarget, host_labels: Sequence[str] = c.DCGM_HOST_LABELS) -> tuple[str, ...]:
    """The labels that name one GPU of the pods (what the duplicate collapse keeps)."""
    # a workload's pods may sit on several nodes: GPU 0 of one node is not GPU 0 of another
    return PER_GPU_KEY if len(target.pods) == 1 else (*PER_GPU_KEY, *host_labels)


@dataclass(frozen=True, slots=True)
class PodQuery:
    """One range query; `role` says how shaping reads it: value, p50/p90/p99, counter, or buckets."""

    expr: str
    role: str
    window: Window


def sample_grid(start_ms: int, end_ms: int, samples: int) -> Window:
    """numberOfSamples n >= 1: start + k*(end-start)/n for k = 0..n; n = 0: one point at end."""
    if samples == 0 or end_ms == start_ms:
        return Window(end_ms, end_ms, 1)
    step = max(1, (end_ms - start_ms) // samples)
    return Window(start_ms, min(start_ms + samples * step, end_ms), step)


def interval_ms(grid: Window, requested_start_ms: int, scrape_interval_ms: int) -> int:
    """The sample interval each point summarises: the step, or the whole window for a single point."""
    if grid.points > 1:
        return grid.step_ms
    whole = grid.end_ms - requested_start_ms
    return whole if whole > 0 else scrape_interval_ms


def dcgm_pod_alternatives(
    target: PodTarget, layout: PodLayout | None = None, host_labels: Sequence[str] = c.DCGM_HOST_LABELS
) -> list[list[Matcher]]:
    """dcgm-exporter pod labels as scraped with honor_labels false (exported_*) or true (plain), and
    for a target's `hosts` the host labels; with a layout, only the spellings that have series."""
    spellings = dcgm_spellings(host_labels) if layout is None else layout.dcgm_spellings
    return [alt for spelling in spellings for alt in target.alternatives(*spelling)]


def app_alternatives(target: PodTarget, *extra: Matcher) -> list[list[Matcher]]:
    """Series the pods' own targets expose (vLLM, NIM, cAdvisor, kube-state-metrics)."""
    return [[*alt, *extra] for alt in target.alternatives(c.LABEL_NAMESPACE, c.LABEL_POD)]


CONTAINERS_ONLY = (
    Matcher(c.LABEL_CONTAINER, "!=", ""),
    Matcher(c.LABEL_CONTAINER, "!=", c.CADVISOR_SANDBOX_CONTAINER),
)


def success_matchers(metric: PodMetricDef, series: str) -> tuple[Matcher, ...]:
    """vLLM counts every finish in one counter: split it by finished_reason (NIM 1.x has two)."""
    extra = tuple(Matcher(label, "=", value) for label, value in metric.extra)
    if metric.success_filter is None or series != c.VLLM_REQUEST_SUCCESS:
        return extra
    op = "=~" if metric.success_filter else "!~"
    reasons = one_of(c.LABEL_FINISHED_REASON, c.SUCCESS_REASONS).value
    return (*extra, Matcher(c.LABEL_FINISHED_REASON, op, reasons))


def histogram_sources(metric: PodMetricDef) -> list[str]:
    """Bucket series names to try by discovery, in catalog order (never `or` two bucket sets)."""
    return [s.series[0] + c.BUCKET_SUFFIX for s in metric.sources]


DCGM_FORMS = (PodForm.DCGM_PER_GPU, PodForm.DCGM_POD)


def gpu_reads(
    metric: PodMetricDef,
    target: PodTarget,
    grid: Window,
    options: PodPlanOptions,
    layout: PodLayout | None = None,
) -> list[PodQuery]:
    """A DCGM metricType's queries: per source (in fallback order; with a layout, those that have
    series), the pods' GPU series as the exporter wrote them, scaled, with no aggregation and no
    guard. Shaping makes them one series per GPU and aggregates the pod (shaping/pod_gpus.py): the
    answer of `agg(max by (gpu, GPU_I_ID) (M))` at the cost of the plain selector, however many
    series a GPU has in the window (an exporter restart, both pod-label spellings). A metricType and
    its `_PER_GPU` twin ask the same query, which the service sends once."""
    if metric.form not in DCGM_FORMS:
        raise ValueError(f"{metric.type} is not read from DCGM series")
    if layout is not None and not layout.dcgm_spellings:
        return []
    alternatives = dcgm_pod_alternatives(target, layout, options.host_labels)
    out = []
    for source in metric.sources:
        series = rename(source.series[0], options.metric_names)
        if layout is None or series in layout.present:
            out.append(PodQuery(scaled(any_of(series, alternatives), source.scale), "source", grid))
    return out


def plan_pod_metric(
    metric: PodMetricDef,
    target: PodTarget,
    grid: Window,
    interval: int,
    options: PodPlanOptions,
    histogram_series: str | None = None,
    layout: PodLayout | None = None,
) -> list[PodQuery]:
    """Queries for one metricType. Counts per sample interval are `increase(...[interval])` at each
    point (docs/compatibility.md, "Counts and histograms per interval"): Prometheus handles counter
    resets inside the interval. DCGM metricTypes read their GPUs' series as written (`gpu_reads`).
    With a layout, sources without series are not asked."""
    names = options.metric_names
    rate_w = format_duration_ms(rate_window_ms(interval, options.scrape_interval_ms))
    count_w = format_duration_ms(interval)
    form = metric.form

    def present(series: str) -> bool:
        return layout is None or series in layout.present

    if form in DCGM_FORMS:
        return gpu_reads(metric, target, grid, options, layout)
    if form is PodForm.NO_SOURCE:
        return []
    if form in (PodForm.APP_HISTOGRAM, PodForm.APP_PERCENTILES):
        if histogram_series is None:
            return []
        alternatives = app_alternatives(target)  # the name is already renamed by discovery
        if form is PodForm.APP_HISTOGRAM:
            increases = over_range("increase", histogram_series, alternatives, count_w)
            return [PodQuery(f"sum {by((c.LABEL_LE,))} ({increases})", "buckets", grid)]
        summed = f"sum {by((c.LABEL_LE,))} ({over_range('rate', histogram_series, alternatives, rate_w)})"
        # one query for p50/p90/p99, each series tagged with its name: a third of the round trips
        label = quote(QUANTILE_LABEL)
        tagged = [
            f'label_replace(histogram_quantile({q}, {summed}), {label}, {quote(name)}, "", "")'
            for name, q in PERCENTILES
        ]
        return [PodQuery(" or ".join(tagged), "percentiles", grid)]
    if form is PodForm.APP_INCREASE:
        exprs = [
            over_range(
                "increase",
                rename(src.series[0], names),
                app_alternatives(target, *success_matchers(metric, src.series[0])),
                count_w,
            )
            for src in metric.sources
            if present(rename(src.series[0], names))
        ]
        # one query per source: the first source that has series wins (decided in shaping)
        return [PodQuery(f"sum({e})", f"counter:{i}", grid) for i, e in enumerate(exprs)]

    forms: list[str] = []
    for source in metric.sources:
        series = rename(source.series[0], names)
        if not present(series):
            continue
        if form is PodForm.CONTAINER_RATE:
            expr = f"sum({over_range('rate', series, app_alternatives(target, *CONTAINERS_ONLY), rate_w)})"
        elif form is PodForm.CONTAINER_SUM:
            expr = f"sum({any_of(series, app_alternatives(target, *CONTAINERS_ONLY))})"
        elif form is PodForm.APP_GAUGE:
            sel = any_of(series, app_alternatives(target, *success_matchers(metric, source.series[0])))
            expr = f"{metric.agg.value}({sel})"
        elif form is PodForm.APP_RATE:
            alternatives = app_alternatives(target, *success_matchers(metric, source.series[0]))
            expr = f"sum({over_range('rate', series, alternatives, rate_w)})"
        elif form is PodForm.APP_COUNT:
            sel = any_of(series, app_alternatives(target, *success_matchers(metric, source.series[0])))
            expr = f"count({sel})"
        else:  # pragma: no cover - exhaustive over PodForm
            raise AssertionError(form)
        forms.append(scaled(expr, source.scale))
    return [PodQuery(first_of(forms), "value", grid)] if forms else []
