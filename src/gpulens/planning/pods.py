"""Run:ai-style plans: the PromQL for one pod metricType, and the sampling grid of numberOfSamples."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from gpulens.domain import catalog as c
from gpulens.domain.catalog import PERCENTILES, PodForm, PodMetricDef
from gpulens.domain.models import Window
from gpulens.domain.timeparse import format_duration_ms
from gpulens.planning.hosts import rate_window_ms
from gpulens.planning.promql import Matcher, any_of, by, eq, one_of, rename, scaled

PER_GPU_KEY = (c.LABEL_GPU, c.LABEL_GPU_INSTANCE)


@dataclass(frozen=True, slots=True)
class PodTarget:
    namespace: str
    pod: str


@dataclass(frozen=True, slots=True)
class PodPlanOptions:
    metric_names: Mapping[str, str] = field(default_factory=dict)
    scrape_interval_ms: int = 15_000


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


def dcgm_pod_alternatives(target: PodTarget) -> list[list[Matcher]]:
    """dcgm-exporter pod labels as scraped with honor_labels false (exported_*) or true (plain)."""
    return [
        [eq(c.LABEL_EXPORTED_NAMESPACE, target.namespace), eq(c.LABEL_EXPORTED_POD, target.pod)],
        [eq(c.LABEL_NAMESPACE, target.namespace), eq(c.LABEL_POD, target.pod)],
    ]


def app_matchers(target: PodTarget) -> list[Matcher]:
    return [eq(c.LABEL_NAMESPACE, target.namespace), eq(c.LABEL_POD, target.pod)]


def container_matchers(target: PodTarget) -> list[Matcher]:
    """cAdvisor container series without the pod cgroup (container="") and the sandbox ("POD")."""
    return [
        *app_matchers(target),
        Matcher(c.LABEL_CONTAINER, "!=", ""),
        Matcher(c.LABEL_CONTAINER, "!=", "POD"),
    ]


def success_matchers(metric: PodMetricDef, series: str) -> list[Matcher]:
    """vLLM counts every finish in one counter: split it by finished_reason (NIM 1.x has two)."""
    if metric.success_filter is None or series != c.VLLM_REQUEST_SUCCESS:
        return []
    op = "=~" if metric.success_filter else "!~"
    return [Matcher(c.LABEL_FINISHED_REASON, op, one_of(c.LABEL_FINISHED_REASON, c.SUCCESS_REASONS).value)]


def histogram_sources(metric: PodMetricDef) -> list[str]:
    """Bucket series names to try by discovery, in catalog order (never `or` two bucket sets)."""
    return [s.series[0] + "_bucket" for s in metric.sources]


def plan_pod_metric(
    metric: PodMetricDef,
    target: PodTarget,
    grid: Window,
    interval: int,
    options: PodPlanOptions,
    histogram_series: str | None = None,
) -> list[PodQuery]:
    """Queries for one metricType. Counter types get the grid extended one interval back so each
    point's count over (t - interval, t] can be taken by difference."""
    names = options.metric_names
    rate_w = format_duration_ms(rate_window_ms(interval, options.scrape_interval_ms))
    collapse = by(PER_GPU_KEY)
    form = metric.form

    if form is PodForm.NO_SOURCE:
        return []
    if form in (PodForm.APP_HISTOGRAM, PodForm.APP_PERCENTILES):
        if histogram_series is None:
            return []
        buckets = any_of(histogram_series, [app_matchers(target)])  # already renamed by discovery
        if form is PodForm.APP_HISTOGRAM:
            return [PodQuery(buckets, "buckets", extend_back(grid, interval))]
        summed = f"sum {by((c.LABEL_LE,))} (rate({buckets}[{rate_w}]))"
        return [PodQuery(f"histogram_quantile({q}, {summed})", name, grid) for name, q in PERCENTILES]
    if form is PodForm.APP_INCREASE:
        exprs = [
            any_of(
                rename(src.series[0], names),
                [[*app_matchers(target), *success_matchers(metric, src.series[0])]],
            )
            for src in metric.sources
        ]
        # each source's raw counters; the first source that has series wins (decided in shaping)
        return [PodQuery(e, f"counter:{i}", extend_back(grid, interval)) for i, e in enumerate(exprs)]

    forms: list[str] = []
    for source in metric.sources:
        series = rename(source.series[0], names)
        if form is PodForm.DCGM_PER_GPU:
            expr = f"max {collapse} ({any_of(series, dcgm_pod_alternatives(target))})"
        elif form is PodForm.DCGM_POD:
            expr = f"{metric.agg.value}(max {collapse} ({any_of(series, dcgm_pod_alternatives(target))}))"
        elif form is PodForm.CONTAINER_RATE:
            expr = f"sum(rate({any_of(series, [container_matchers(target)])}[{rate_w}]))"
        elif form is PodForm.CONTAINER_SUM:
            expr = f"sum({any_of(series, [container_matchers(target)])})"
        elif form is PodForm.APP_GAUGE:
            expr = f"{metric.agg.value}({any_of(series, [app_matchers(target)])})"
        elif form is PodForm.APP_RATE:
            sel = any_of(series, [[*app_matchers(target), *success_matchers(metric, source.series[0])]])
            expr = f"sum(rate({sel}[{rate_w}]))"
        else:  # pragma: no cover - exhaustive over PodForm
            raise AssertionError(form)
        forms.append(scaled(expr, source.scale))
    expr = forms[0] if len(forms) == 1 else " or ".join(f"({f})" for f in forms)
    return [PodQuery(expr, "value", grid)]


def extend_back(grid: Window, interval: int) -> Window:
    """The grid plus one point `interval` before its start (for differences of counters)."""
    if grid.points > 1:
        return Window(grid.start_ms - grid.step_ms, grid.end_ms, grid.step_ms)
    return Window(grid.end_ms - interval, grid.end_ms, interval)
