"""Ground truth: what each Lyceum metric must be at every grid point, computed from the generated samples.

Semantics are those of Prometheus 2.42 on backfilled data (no staleness markers):
* a selector at t takes each series' last sample in [t - lookback, t] (lookback 5 m, closed on both ends);
* every GPU is one series here, so the catalog's per-GPU collapse changes nothing;
* `avg` is Prometheus' incremental mean over series in label-set order, `sum` a left-to-right sum,
  `max` the maximum; percentages as the catalog forms write them: `100 * avg(used / (used + free))`
  and `100 * (1 - sum(rate(idle[w])) / sum(rate(all modes[w])))`, w = max(step, 4 x scrape interval);
* `rate` is `extrapolatedRate` of promql/functions.go over the samples in [t - w, t].
Following the same float operations in the same order makes the values bit-identical to what
Prometheus returns for those expressions; `stable` marks the points every backend and semantics agree
on (gauges inside the data; CPU where the counter slope is constant around the whole window).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from gpulens.backends.embedded.arith import (  # Prometheus 2.42 arithmetic, one copy
    extrapolated_rate,
    prom_avg,
    prom_max,
    prom_sum,
)
from gpulens.demo.history import SeriesDef
from gpulens.demo.scenario import ExecutionSpec
from gpulens.domain import catalog as c
from gpulens.domain.catalog import Agg, Form, MetricDef, Source
from gpulens.domain.models import Window
from gpulens_testkit.history import Dataset, sort_key

LOOKBACK_MS = c.LOOKBACK_MS


@dataclass(frozen=True, slots=True)
class Stats:
    """Summary of the present points of one metric (None when there are none)."""

    count: int
    mean: float | None
    min: float | None
    max: float | None
    first: float | None
    last: float | None

    @staticmethod
    def of(values: Iterable[float | None]) -> Stats:
        present = [v for v in values if v is not None]
        if not present:
            return Stats(0, None, None, None, None, None)
        return Stats(
            len(present),
            math.fsum(present) / len(present),
            min(present),
            max(present),
            present[0],
            present[-1],
        )


@dataclass(frozen=True, slots=True)
class MetricTruth:
    """One metric on a grid: `values[i]` at `timestamps_ms[i]`, None where the backend returns no point."""

    key: str
    timestamps_ms: tuple[int, ...]
    values: tuple[float | None, ...]
    stable: tuple[bool, ...]

    def points(self) -> list[tuple[int, float]]:
        """(timestamp ms, value) of every present point, as a range query returns them."""
        return [(t, v) for t, v in zip(self.timestamps_ms, self.values, strict=True) if v is not None]

    def stable_points(self) -> list[tuple[int, float]]:
        return [
            (t, v)
            for t, v, ok in zip(self.timestamps_ms, self.values, self.stable, strict=True)
            if v is not None and ok
        ]

    def as_dict(self) -> dict[int, float]:
        return dict(self.points())

    def stats(self, start_ms: int | None = None, end_ms: int | None = None) -> Stats:
        return Stats.of(
            v
            for t, v in zip(self.timestamps_ms, self.values, strict=True)
            if (start_ms is None or t >= start_ms) and (end_ms is None or t <= end_ms)
        )


@dataclass(frozen=True, slots=True)
class ExecutionTruth:
    """The twelve Lyceum metrics of one execution on one grid, keyed by Lyceum wire key."""

    execution: ExecutionSpec
    hostname: str
    gpus: tuple[int, ...]
    window: Window
    metrics: dict[str, MetricTruth]

    def __getitem__(self, key: str) -> MetricTruth:
        return self.metrics[key]

    def summary(self, start_ms: int | None = None, end_ms: int | None = None) -> dict[str, Stats]:
        """Count/mean/min/max/first/last of each metric (optionally within a sub-window)."""
        return {k: m.stats(start_ms, end_ms) for k, m in self.metrics.items()}


# -- PromQL arithmetic, operation for operation --------------------------------------------------


AGG_FOLDS: dict[Agg, Callable[[Sequence[float]], float]] = {
    Agg.AVG: prom_avg,
    Agg.SUM: prom_sum,
    Agg.MAX: prom_max,
}


def rate_window_ms(step_ms: int, scrape_interval_ms: int) -> int:
    """The CPU rate window of the catalog: max(step, 4 x scrape interval)."""
    return max(step_ms, 4 * scrape_interval_ms)


# -- ground truth ---------------------------------------------------------------------------------


class GroundTruth:
    """Expected Lyceum metric values for a generated dataset (pure: computed from its samples)."""

    def __init__(self, dataset: Dataset, lookback_ms: int = LOOKBACK_MS) -> None:
        self.dataset = dataset
        self.scenario = dataset.scenario
        self.lookback_ms = lookback_ms
        self.interval_ms = self.scenario.scrape_interval_s * 1000
        self.start_ms = self.scenario.start_s * 1000
        self.end_ms = self.scenario.end_s * 1000
        self._by_name: dict[tuple[str, str], list[SeriesDef]] = {}
        for s in dataset.series:
            self._by_name.setdefault((s.hostname, s.name), []).append(s)
        for ss in self._by_name.values():
            ss.sort(key=sort_key)  # the order Prometheus aggregates in

    # -- public -----------------------------------------------------------------------------------
    def execution_window(self, key: str, step_ms: int | None = None) -> Window:
        """[start, end] of an execution at `step_ms` (default: the scrape interval)."""
        e = self.scenario.execution(key)
        return Window(e.start_s * 1000, e.end_s * 1000, step_ms or self.interval_ms)

    def execution(
        self, key: str, window: Window | None = None, *, step_ms: int | None = None
    ) -> ExecutionTruth:
        """Truth of an execution (by id or name), over `window` or its own lifetime."""
        e = self.scenario.execution(key)
        window = window or self.execution_window(key, step_ms)
        gpus = self.scenario.gpus_of(e)
        return ExecutionTruth(e, e.hostname, gpus, window, self.host(e.hostname, gpus, window))

    def summary(self, key: str, step_ms: int | None = None) -> dict[str, Stats]:
        return self.execution(key, step_ms=step_ms).summary()

    def host(
        self,
        hostname: str,
        gpus: Sequence[int] | None,
        window: Window,
        metrics: Sequence[MetricDef] = c.LYCEUM_METRICS,
    ) -> dict[str, MetricTruth]:
        """Every metric for a host and some of its GPUs (None: all of them)."""
        return {m.lyceum: self.metric(m, hostname, gpus, window) for m in metrics}

    def metric(
        self, metric: MetricDef, hostname: str, gpus: Sequence[int] | None, window: Window
    ) -> MetricTruth:
        grid = tuple(range(window.start_ms, window.end_ms + 1, window.step_ms))
        values: list[float | None] = []
        stable: list[bool] = []
        for t in grid:
            v, ok = self._point(metric, hostname, gpus, t, window.step_ms)
            values.append(v)
            stable.append(ok)
        return MetricTruth(metric.lyceum, grid, tuple(values), tuple(stable))

    def to_json(self, step_ms: int | None = None, grid: bool = True) -> dict[str, Any]:
        """Scenario, executions, their phases, summaries and (optionally) grid values, JSON-ready."""
        execs: list[dict[str, Any]] = []
        for e in self.scenario.executions:
            truth = self.execution(e.execution_id, step_ms=step_ms)
            item: dict[str, Any] = {
                "executionId": e.execution_id,
                "name": e.name,
                "hostname": e.hostname,
                "gpus": list(truth.gpus),
                "status": e.status.value,
                "start": e.start.isoformat(),
                "end": e.end.isoformat(),
                "phases": [
                    {"kind": s.phase.kind.value, "start_s": s.start_s, "end_s": s.end_s} for s in e.spans()
                ],
                "summary": {k: _stats_json(s) for k, s in truth.summary().items()},
            }
            if grid:
                item["grid"] = {
                    "start_ms": truth.window.start_ms,
                    "end_ms": truth.window.end_ms,
                    "step_ms": truth.window.step_ms,
                    "metrics": {
                        k: {"values": list(m.values), "stable": list(m.stable)}
                        for k, m in truth.metrics.items()
                    },
                }
            execs.append(item)
        sc = self.scenario
        return {
            "scenario": sc.name,
            "seed": sc.seed,
            "start": sc.start.isoformat(),
            "end": sc.end.isoformat(),
            "scrape_interval_s": sc.scrape_interval_s,
            "lookback_ms": self.lookback_ms,
            "hosts": [
                {
                    "hostname": h.hostname,
                    "host_label": h.host_label,
                    "node_instance": h.node.instance,
                    "gpus": [{"index": g.index, "uuid": g.uuid} for g in h.gpus],
                    "gpu_model": None if h.gpu_model is None else h.gpu_model.name,
                }
                for h in sc.hosts
            ],
            "executions": execs,
        }

    # -- one grid point ---------------------------------------------------------------------------
    def _series(self, hostname: str, name: str, gpus: Sequence[int] | None) -> list[SeriesDef]:
        """A host's series of one name in aggregation order; `gpus` None or empty: every GPU."""
        return [s for s in self._by_name.get((hostname, name), ()) if not gpus or s.gpu in gpus]

    def _last(self, series: SeriesDef, t_ms: int) -> float | None:
        k = (t_ms - self.start_ms) // self.interval_ms
        if k < 0:
            return None
        k = min(k, self.dataset.sample_count - 1)
        if self.start_ms + k * self.interval_ms < t_ms - self.lookback_ms:
            return None
        return float(self.dataset.value_at(series, k))

    def _gauges(self, series: Sequence[SeriesDef], t_ms: int) -> list[float]:
        out = []
        for s in series:
            v = self._last(s, t_ms)
            if v is not None:
                out.append(v)
        return out

    def _point(
        self, m: MetricDef, hostname: str, gpus: Sequence[int] | None, t_ms: int, step_ms: int
    ) -> tuple[float | None, bool]:
        in_data = self.start_ms <= t_ms <= self.end_ms
        if m.exporter is c.Exporter.NODE:
            gpus = None  # host-wide series
        for source in m.sources:
            if not self._series(hostname, source.series[0], gpus):
                continue  # this host does not export it: next source
            value = self._source_value(m, source, hostname, gpus, t_ms=t_ms, step_ms=step_ms)
            if value is not None:
                if m.form is Form.NODE_CPU_BUSY_PERCENT:
                    return value, self._cpu_stable(hostname, t_ms, step_ms)
                return value, in_data
        exported = any(self._series(hostname, s.series[0], gpus) for s in m.sources)
        return None, not exported  # nothing exported at all: no backend returns a point

    def _source_value(
        self,
        m: MetricDef,
        source: Source,
        hostname: str,
        gpus: Sequence[int] | None,
        *,
        t_ms: int,
        step_ms: int,
    ) -> float | None:
        names, scale = source.series, source.scale
        if m.form is Form.GPU_GAUGE:
            vals = self._gauges(self._series(hostname, names[0], gpus), t_ms)
            if not vals:
                return None
            agg = AGG_FOLDS[m.agg](vals)
            return agg if scale == 1.0 else scale * agg
        if m.form is Form.GPU_FB_PERCENT:
            used_series = self._series(hostname, names[0], gpus)
            free_by_gpu = {s.gpu: s for s in self._series(hostname, names[1], gpus)}
            ratios = []
            for us in used_series:
                fs = free_by_gpu.get(us.gpu)
                u = self._last(us, t_ms)
                f = None if fs is None else self._last(fs, t_ms)
                if u is not None and f is not None:
                    ratios.append(u / (u + f))
            return None if not ratios else 100 * AGG_FOLDS[m.agg](ratios)
        if m.form is Form.NODE_GAUGE:
            vals = self._gauges(self._series(hostname, names[0], None), t_ms)
            if not vals:
                return None
            top = prom_max(vals)
            return top if scale == 1.0 else scale * top
        if m.form is Form.NODE_DIFF:
            a = self._gauges(self._series(hostname, names[0], None), t_ms)
            b = self._gauges(self._series(hostname, names[1], None), t_ms)
            return prom_max(a) - prom_max(b) if a and b else None
        if m.form is Form.NODE_CPU_BUSY_PERCENT:
            w = rate_window_ms(step_ms, self.interval_ms)
            idle: list[float] = []
            every: list[float] = []
            for s in self._series(hostname, names[0], None):  # every CPU and mode, label-set order
                r = extrapolated_rate(self._range(s, t_ms - w, t_ms), t_ms - w, t_ms, w)
                if r is not None:
                    every.append(r)
                    if s.mode == c.CPU_IDLE_MODE:
                        idle.append(r)
            return None if not idle else 100 * (1 - prom_sum(idle) / prom_sum(every))
        raise AssertionError(m.form)  # pragma: no cover

    def _range(self, series: SeriesDef, lo_ms: int, hi_ms: int) -> list[tuple[int, float]]:
        """Samples with lo <= t <= hi (Prometheus 2.x range selectors are closed on both ends)."""
        k_lo = max(0, -((self.start_ms - lo_ms) // self.interval_ms))
        k_hi = min(self.dataset.sample_count - 1, (hi_ms - self.start_ms) // self.interval_ms)
        return [
            (self.start_ms + k * self.interval_ms, float(self.dataset.value_at(series, k)))
            for k in range(k_lo, k_hi + 1)
        ]

    def _cpu_stable(self, hostname: str, t_ms: int, step_ms: int) -> bool:
        """True when the counters' slope is one constant over the window and the interval before it."""
        w = rate_window_ms(step_ms, self.interval_ms)
        if t_ms - w - self.interval_ms < self.start_ms or t_ms > self.end_ms:
            return False
        k_first = -((self.start_ms - (t_ms - w)) // self.interval_ms) - 1  # the sample before the window
        k_last = (t_ms - self.start_ms) // self.interval_ms
        ds = self.dataset
        first = ds.cpu_percent_at(hostname, k_first + 1)
        return all(ds.cpu_percent_at(hostname, k) == first for k in range(k_first + 1, k_last + 1))


def _stats_json(s: Stats) -> dict[str, Any]:
    return {"count": s.count, "mean": s.mean, "min": s.min, "max": s.max, "first": s.first, "last": s.last}


def execution_truth(
    dataset: Dataset, key: str, window: Window | None = None, lookback_ms: int = LOOKBACK_MS
) -> ExecutionTruth:
    """The pure-function form of `GroundTruth(dataset).execution(key, window)`."""
    return GroundTruth(dataset, lookback_ms).execution(key, window)
