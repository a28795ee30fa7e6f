"""Ground truth of the Run:ai pod metricTypes on the `k8s` scenario, computed from the generated samples.

The forms are the catalog's (`catalog.POD_METRICS`, gpulens/domain/catalog.py), evaluated with Prometheus
2.42 semantics on backfilled data, operation for operation (see truth.py): instant selectors take the
last sample in [t - 5m, t]; range selectors are closed [t - w, t]; `rate`/`increase` are
extrapolatedRate; `sum`/`avg`/`max` run over the series in label-set order; `histogram_quantile` is
promql/quantile.go's bucketQuantile. Values are what Prometheus answers for the raw expressions, so
tests can compare bit for bit (1e-9 relative where a sum of more than two floats is involved).

Run:ai grid (docs/compatibility.md, "The `numberOfSamples` grid"; planning/pods.py builds it): n >= 1 ->
step = floor((end - start) / n) ms, points start + k * step (k = 0..n, none after end); n = 0 or
end == start -> one point at end whose interval is end - start (the scrape interval when that is 0).
Windows: rate w = max(step, 4 x scrape interval); increase and the per-interval histogram counts use
[t - step, t].

Keys of per-GPU types: the GPU slot key, "<gpu>" for a whole GPU and "<gpu>/<GPU_I_ID>" for a MIG
instance (dcgm series grouped by (gpu, GPU_I_ID)); pod-level types use the key None.

`stable` marks points every backend and semantics agree on (VictoriaMetrics included): gauges whose
series all have a sample in the last scrape interval (or none in the lookback); rate/increase windows
no backend extrapolates: on the scrape grid every series has samples at both ends or none inside,
off the grid it covers the window fully with a constant slope (histograms and percentiles: only on
the grid). Histogram `counts` are exact: observations counted in samples
with time in (t - step, t]; at stable points Prometheus' `increase` equals them.
"""

from __future__ import annotations

import bisect
import functools
import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from gpulens.backends.embedded.arith import bucket_quantile, extrapolated_rate, prom_max, prom_sum
from gpulens.domain import catalog as c
from gpulens.domain.catalog import Kind, PodForm, PodMetricDef, Source
from gpulens_testkit.k8s_generate import HISTOGRAMS, K8sDataset, K8sSeries
from gpulens_testkit.k8s_scenario import PodSpec
from gpulens_testkit.truth import AGG_FOLDS, LOOKBACK_MS, MetricTruth, rate_window_ms

DEFAULT_SAMPLES = 20


# -- PromQL arithmetic ------------------------------------------------------------------------------


def extrapolated_increase(
    points: Sequence[tuple[int, float]], range_start_ms: int, range_end_ms: int
) -> float | None:
    """`increase()`: promql/functions.go extrapolatedRate(isCounter=true, isRate=false)."""
    return extrapolated_rate(points, range_start_ms, range_end_ms, None)


def nearest_rank(values: Sequence[float], q: float) -> float | None:
    """The ceil(q * n)-th smallest value (the textbook percentile of raw observations)."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def runai_grid(start_ms: int, end_ms: int, n: int) -> tuple[tuple[int, ...], int]:
    """The Run:ai sampling grid and its step (ms), see the module docstring."""
    if n < 0 or end_ms < start_ms:
        raise ValueError("need numberOfSamples >= 0 and end >= start")
    span = end_ms - start_ms
    if n == 0 or span == 0:
        return (end_ms,), span
    step = max(1, span // n)
    return tuple(start_ms + k * step for k in range(n + 1) if start_ms + k * step <= end_ms), step


# -- results ----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RunaiWindow:
    """start/end (ms) and numberOfSamples of a Run:ai request."""

    start_ms: int
    end_ms: int
    n: int = DEFAULT_SAMPLES

    @property
    def grid(self) -> tuple[int, ...]:
        return runai_grid(self.start_ms, self.end_ms, self.n)[0]

    @property
    def step_ms(self) -> int:
        return runai_grid(self.start_ms, self.end_ms, self.n)[1]


@dataclass(frozen=True, slots=True)
class HistogramTruth:
    """A histogram metricType: per grid point the bucket counts of the interval (t - step, t].

    `counts[i]` / `prom[i]` are cumulative over `les` (numeric order, "+Inf" last); None where no
    bucket series has two samples in [t - step, t] (Prometheus returns nothing there).
    """

    type: str
    source: str | None  # the histogram family read (None: the pod exports none)
    les: tuple[str, ...]
    timestamps_ms: tuple[int, ...]
    counts: tuple[tuple[int, ...] | None, ...]  # exact, from the observations
    prom: tuple[tuple[float, ...] | None, ...]  # sum by (le) (increase(<source>_bucket{pod}[step]))
    stable: tuple[bool, ...]

    def points(self) -> list[tuple[int, dict[str, int]]]:
        return [
            (t, dict(zip(self.les, cs, strict=True)))
            for t, cs in zip(self.timestamps_ms, self.counts, strict=True)
            if cs is not None
        ]


@dataclass(frozen=True, slots=True)
class PercentileTruth:
    """A *_PERCENTILES metricType: p50/p90/p99 of histogram_quantile(q, sum by (le) (rate(...[w])))."""

    type: str
    source: str | None
    window_ms: int  # the rate window w
    quantiles: dict[str, MetricTruth]  # "p50", "p90", "p99"; None where NaN or no data


@dataclass(frozen=True, slots=True)
class PodTruth:
    pod: PodSpec
    window: RunaiWindow
    measurements: dict[str, dict[str | None, MetricTruth]]
    histograms: dict[str, HistogramTruth]
    percentiles: dict[str, PercentileTruth]


# -- ground truth -----------------------------------------------------------------------------------


class K8sTruth:
    """Expected Run:ai pod metrics for a generated k8s dataset (pure: computed from its samples)."""

    def __init__(self, dataset: K8sDataset, lookback_ms: int = LOOKBACK_MS) -> None:
        self.dataset = dataset
        self.scenario = dataset.scenario
        self.lookback_ms = lookback_ms
        self.interval_ms = self.scenario.scrape_interval_s * 1000
        self.start_ms = self.scenario.start_s * 1000
        self.end_ms = self.scenario.end_s * 1000
        self._n = dataset.sample_count
        self._selected: dict[tuple[object, ...], list[K8sSeries]] = {}

    # -- public -------------------------------------------------------------------------------------
    def grid(self, window: RunaiWindow) -> tuple[tuple[int, ...], int]:
        """Grid points and the interval each summarises (the step; a lone point: its whole window)."""
        grid, step = runai_grid(window.start_ms, window.end_ms, window.n)
        return grid, step if step > 0 else self.interval_ms

    def pod_window(self, pod_key: str, n: int = DEFAULT_SAMPLES) -> RunaiWindow:
        """The pod's life [start, last sample] with n samples."""
        pod = self.scenario.pod(pod_key)
        return RunaiWindow(pod.start_s * 1000, self.scenario.pod_end_s(pod) * 1000, n)

    def pod(
        self, pod_key: str, window: RunaiWindow | None = None, types: Sequence[str] | None = None
    ) -> PodTruth:
        """Every requested metricType (default: all 46) of a pod (name, uid or namespace/name)."""
        pod = self.scenario.pod(pod_key)
        window = window or self.pod_window(pod_key)
        defs = [c.POD_METRICS_BY_TYPE[t] for t in types] if types is not None else list(c.POD_METRICS)
        out = PodTruth(pod, window, {}, {}, {})
        for d in defs:
            if d.kind is Kind.MEASUREMENT:
                out.measurements[d.type] = self.measurement(pod_key, d.type, window)
            elif d.kind is Kind.HISTOGRAM:
                out.histograms[d.type] = self.histogram(pod_key, d.type, window)
            else:
                out.percentiles[d.type] = self.percentiles(pod_key, d.type, window)
        return out

    def measurement(
        self, pod_key: str, metric_type: str, window: RunaiWindow
    ) -> dict[str | None, MetricTruth]:
        """A measurement type: {slot key: truth} for *_PER_GPU (every slot of the pod), else {None: truth}."""
        pod = self.scenario.pod(pod_key)
        d = c.POD_METRICS_BY_TYPE[metric_type]
        if d.kind is not Kind.MEASUREMENT:
            raise ValueError(f"{metric_type} is a {d.kind.value} type")
        grid, step = self.grid(window)
        if d.form is PodForm.DCGM_PER_GPU or (
            d.form is PodForm.NO_SOURCE and metric_type.endswith("_PER_GPU")
        ):
            return {
                key: self._metric(metric_type, grid, functools.partial(self._per_gpu, d, pod, key))
                for key in pod.slot_keys
            }
        return {None: self._metric(metric_type, grid, lambda t: self._pod_value(d, pod, t, step))}

    def histogram(self, pod_key: str, metric_type: str, window: RunaiWindow) -> HistogramTruth:
        pod = self.scenario.pod(pod_key)
        d = c.POD_METRICS_BY_TYPE[metric_type]
        if d.kind is not Kind.HISTOGRAM:
            raise ValueError(f"{metric_type} is not a histogram type")
        grid, step = self.grid(window)
        source = self.pick_histogram(pod, d, window.start_ms - step, window.end_ms)
        if source is None:
            none = tuple(None for _ in grid)
            return HistogramTruth(metric_type, None, (), grid, none, none, tuple(True for _ in grid))
        h = HISTOGRAMS[source]
        buckets = self._app_series(pod, f"{source}{c.BUCKET_SUFFIX}")
        observations = self.dataset.observations(pod, source)
        counts: list[tuple[int, ...] | None] = []
        prom: list[tuple[float, ...] | None] = []
        stable: list[bool] = []
        for t in grid:
            by_le = self._sum_by_le(buckets, t, step, rate=False)
            if by_le is None:
                counts.append(None)
                prom.append(None)
            else:
                prom.append(tuple(by_le.get(le, 0.0) for le in h.les))
                per_bucket = [0] * len(h.les)
                for k in self._ks_in(t - step, t, left_open=True):
                    for v in observations[k]:
                        per_bucket[bisect.bisect_left(h.bounds, v)] += 1
                cum, acc = [], 0
                for x in per_bucket:
                    acc += x
                    cum.append(acc)
                counts.append(tuple(cum))
            stable.append(step > 0 and self._window_stable(buckets, t, step, on_grid_only=True))
        return HistogramTruth(metric_type, source, h.les, grid, tuple(counts), tuple(prom), tuple(stable))

    def percentiles(self, pod_key: str, metric_type: str, window: RunaiWindow) -> PercentileTruth:
        pod = self.scenario.pod(pod_key)
        d = c.POD_METRICS_BY_TYPE[metric_type]
        if d.kind is not Kind.PERCENTILES:
            raise ValueError(f"{metric_type} is not a percentiles type")
        grid, step = self.grid(window)
        w = rate_window_ms(step, self.interval_ms)
        source = self.pick_histogram(pod, d, window.start_ms - w, window.end_ms)
        buckets = [] if source is None else self._app_series(pod, f"{source}{c.BUCKET_SUFFIX}")
        values: dict[str, list[float | None]] = {name: [] for name, _ in c.PERCENTILES}
        stable: list[bool] = []
        for t in grid:
            by_le = self._sum_by_le(buckets, t, w, rate=True)
            for name, q in c.PERCENTILES:
                if by_le is None:
                    values[name].append(None)
                    continue
                v = bucket_quantile(q, [(float(le), x) for le, x in by_le.items()])
                values[name].append(None if math.isnan(v) else v)
            stable.append(self._window_stable(buckets, t, w, on_grid_only=True))
        quantiles = {
            name: MetricTruth(f"{metric_type}.{name}", grid, tuple(vs), tuple(stable))
            for name, vs in values.items()
        }
        return PercentileTruth(metric_type, source, w, quantiles)

    def pick_histogram(self, pod: PodSpec, d: PodMetricDef, lo_ms: int, hi_ms: int) -> str | None:
        """The first source whose `_bucket` series the pod has, with a sample in [lo, hi] (discovery)."""
        for source in d.sources:
            name = source.series[0]
            for s in self._app_series(pod, f"{name}{c.BUCKET_SUFFIX}"):
                if self._range(s, lo_ms, hi_ms):
                    return name
        return None

    def observations(self, pod_key: str, histogram: str, lo_ms: int, hi_ms: int) -> list[float]:
        """Raw observations of a histogram family counted in samples with time in (lo, hi]."""
        per_k = self.dataset.observations(self.scenario.pod(pod_key), histogram)
        return [v for k in self._ks_in(lo_ms, hi_ms, left_open=True) for v in per_k[k]]

    def to_json(self, n: int = DEFAULT_SAMPLES) -> dict[str, Any]:
        """Scenario, nodes, pods and every pod's metric types over its life (n samples), JSON-ready.

        Measurements are keyed by GPU slot key, or "pod" for pod-level types.
        """
        sc = self.scenario
        pods = []
        for p in sc.pods:
            t = self.pod(p.pod_id, self.pod_window(p.pod_id, n))
            pods.append(
                {
                    "podId": p.pod_id,
                    "workloadId": p.workload_id,
                    "name": p.name,
                    "namespace": p.namespace,
                    "workload": p.workload,
                    "workloadKind": p.workload_kind,
                    "owner": {"kind": p.owner_kind, "name": p.owner_name},
                    "node": p.node,
                    "gpus": list(p.slot_keys),
                    "app": p.app.value,
                    "start": p.start.isoformat(),
                    "end": None if p.end is None else p.end.isoformat(),
                    "phase": p.final_phase.value,
                    "window": {"start_ms": t.window.start_ms, "end_ms": t.window.end_ms, "n": n},
                    "measurements": {
                        typ: {
                            k or "pod": {"values": list(m.values), "stable": list(m.stable)}
                            for k, m in ms.items()
                        }
                        for typ, ms in t.measurements.items()
                    },
                    "histograms": {
                        typ: {
                            "source": h.source,
                            "les": list(h.les),
                            "counts": [None if x is None else list(x) for x in h.counts],
                        }
                        for typ, h in t.histograms.items()
                    },
                    "percentiles": {
                        typ: {"source": pt.source, **{q: list(m.values) for q, m in pt.quantiles.items()}}
                        for typ, pt in t.percentiles.items()
                    },
                }
            )
        return {
            "scenario": sc.name,
            "seed": sc.seed,
            "start": sc.start.isoformat(),
            "end": sc.end.isoformat(),
            "scrape_interval_s": sc.scrape_interval_s,
            "nodes": [
                {
                    "hostname": node.hostname,
                    "honor_labels": node.honor_labels,
                    "host_label": node.host_label,
                    "gpu_model": node.gpu_model.name,
                    "slots": [s.key for s in node.slots()],
                }
                for node in sc.nodes
            ],
            "pods": pods,
        }

    # -- samples ------------------------------------------------------------------------------------
    def _time(self, k: int) -> int:
        return self.start_ms + k * self.interval_ms

    def _ks_in(self, lo_ms: int, hi_ms: int, *, left_open: bool = False) -> range:
        """Sample indices with lo <= time <= hi (lo < time with left_open), inside the data."""
        lo = -((self.start_ms - lo_ms) // self.interval_ms)  # ceil
        if left_open and self._time(lo) == lo_ms:
            lo += 1
        hi = (hi_ms - self.start_ms) // self.interval_ms
        return range(max(0, lo), min(self._n - 1, hi) + 1)

    def _last(self, s: K8sSeries, t_ms: int) -> float | None:
        raw = self.dataset.raw(s)
        for k in reversed(self._ks_in(t_ms - self.lookback_ms, t_ms)):
            v = raw[k]
            if v is not None:
                return float(v)
        return None

    def _range(self, s: K8sSeries, lo_ms: int, hi_ms: int) -> list[tuple[int, float]]:
        raw = self.dataset.raw(s)
        return [(self._time(k), float(v)) for k in self._ks_in(lo_ms, hi_ms) if (v := raw[k]) is not None]

    # -- series of a pod ----------------------------------------------------------------------------
    def _dcgm(self, name: str, pod: PodSpec, key: str) -> list[K8sSeries]:
        memo = ("dcgm", name, pod.namespace, pod.name, key)
        if memo not in self._selected:
            self._selected[memo] = [
                s
                for s in self.dataset.select(name)
                if (s.namespace, s.pod, s.slot) == (pod.namespace, pod.name, key)
            ]
        return self._selected[memo]

    def _app_series(self, pod: PodSpec, name: str, success: bool | None = None) -> list[K8sSeries]:
        memo = ("app", name, pod.namespace, pod.name, success)
        if memo not in self._selected:
            ss = self.dataset.select(name, {c.LABEL_NAMESPACE: pod.namespace, c.LABEL_POD: pod.name})
            if success is not None and name == c.VLLM_REQUEST_SUCCESS:  # NIM 1.x counters have no reason
                ss = [s for s in ss if (s.label(c.LABEL_FINISHED_REASON) in c.SUCCESS_REASONS) is success]
            self._selected[memo] = ss
        return self._selected[memo]

    def _containers(self, pod: PodSpec, name: str) -> list[K8sSeries]:
        memo = ("containers", name, pod.namespace, pod.name)
        if memo not in self._selected:
            self._selected[memo] = self.dataset.select(
                name,
                {c.LABEL_NAMESPACE: pod.namespace, c.LABEL_POD: pod.name},
                {c.LABEL_CONTAINER: ("", c.CADVISOR_SANDBOX_CONTAINER)},
            )
        return self._selected[memo]

    # -- one grid point -----------------------------------------------------------------------------
    def _metric(
        self, key: str, grid: tuple[int, ...], point: Callable[[int], tuple[float | None, bool]]
    ) -> MetricTruth:
        values, stable = [], []
        for t in grid:
            v, ok = point(t)
            values.append(v)
            stable.append(ok)
        return MetricTruth(key, grid, tuple(values), tuple(stable))

    def _per_gpu(self, d: PodMetricDef, pod: PodSpec, key: str, t: int) -> tuple[float | None, bool]:
        candidates: list[K8sSeries] = []
        result: float | None = None
        for source in d.sources:
            series = self._dcgm(source.series[0], pod, key)
            candidates += series
            if result is None:
                vals = [v for s in series if (v := self._last(s, t)) is not None]
                if vals:
                    result = _scaled(source, prom_max(vals))
        return result, self._gauge_stable(candidates, t)

    def _pod_value(self, d: PodMetricDef, pod: PodSpec, t: int, step: int) -> tuple[float | None, bool]:
        form = d.form
        if form is PodForm.NO_SOURCE:
            return None, True
        candidates: list[K8sSeries] = []
        result: float | None = None
        w = rate_window_ms(step, self.interval_ms)
        for source in d.sources:
            name = source.series[0]
            if form is PodForm.DCGM_POD:
                per_slot = {key: self._dcgm(name, pod, key) for key in pod.slot_keys}
                candidates += [s for ss in per_slot.values() for s in ss]
                vals = []
                for ss in per_slot.values():
                    got = [v for s in ss if (v := self._last(s, t)) is not None]
                    if got:
                        vals.append(prom_max(got))
                value = _scaled(source, AGG_FOLDS[d.agg](vals)) if vals else None
            elif form in (PodForm.CONTAINER_RATE, PodForm.CONTAINER_SUM):
                series = self._containers(pod, name)
                candidates += series
                if form is PodForm.CONTAINER_SUM:
                    got = [v for s in series if (v := self._last(s, t)) is not None]
                else:
                    got = [
                        v
                        for s in series
                        if (v := extrapolated_rate(self._range(s, t - w, t), t - w, t, w)) is not None
                    ]
                value = prom_sum(got) if got else None
            else:
                series = self._app_series(pod, name, d.success_filter)
                candidates += series
                if form is PodForm.APP_GAUGE:
                    got = [v for s in series if (v := self._last(s, t)) is not None]
                    value = AGG_FOLDS[d.agg](got) if got else None
                elif form is PodForm.APP_RATE:
                    got = [
                        v
                        for s in series
                        if (v := extrapolated_rate(self._range(s, t - w, t), t - w, t, w)) is not None
                    ]
                    value = prom_sum(got) if got else None
                elif form is PodForm.APP_INCREASE:
                    got = [
                        v
                        for s in series
                        if (v := extrapolated_increase(self._range(s, t - step, t), t - step, t)) is not None
                    ]
                    value = prom_sum(got) if got else None
                else:  # pragma: no cover - histogram forms are not measurements
                    raise AssertionError(form)
            if result is None and value is not None:
                result = value
        if form in (PodForm.CONTAINER_RATE, PodForm.APP_RATE):
            ok = self._window_stable(candidates, t, w)
        elif form is PodForm.APP_INCREASE:
            ok = step > 0 and self._window_stable(candidates, t, step)
        else:
            ok = self._gauge_stable(candidates, t)
        return result, ok

    def _sum_by_le(
        self, buckets: Sequence[K8sSeries], t: int, w: int, *, rate: bool
    ) -> dict[str, float] | None:
        """`sum by (le) (rate|increase(bucket[w]))` at t, series in label-set order; None when empty."""
        out: dict[str, list[float]] = {}
        for s in buckets:
            points = self._range(s, t - w, t)
            v = extrapolated_rate(points, t - w, t, w) if rate else extrapolated_increase(points, t - w, t)
            if v is not None:
                out.setdefault(s.le, []).append(v)
        return {le: prom_sum(vs) for le, vs in out.items()} if out else None

    # -- stability ----------------------------------------------------------------------------------
    def _gauge_stable(self, series: Sequence[K8sSeries], t: int) -> bool:
        """Each series has a sample in the last scrape interval, or none within the lookback."""
        k = (t - self.start_ms) // self.interval_ms
        for s in series:
            raw = self.dataset.raw(s)
            if 0 <= k < self._n and raw[k] is not None:
                continue
            if self._last(s, t) is not None:
                return False
        return True

    def _window_stable(
        self, series: Sequence[K8sSeries], t: int, w: int, *, on_grid_only: bool = False
    ) -> bool:
        """No extrapolation anywhere, so every backend computes the same differences.

        On the scrape grid: every series has samples at both ends of [t - w, t] (gaps and counter
        resets in between are fine: the first sample after a reset is 0) or none in it. Off the grid:
        every series covers [t - w - interval, t] completely with a constant slope, or not at all.
        """
        aligned = (t - self.start_ms) % self.interval_ms == 0 and w % self.interval_ms == 0
        if on_grid_only and not aligned:
            return False
        lo = t - w if aligned else t - w - self.interval_ms
        first = -((self.start_ms - lo) // self.interval_ms)
        last = (t - self.start_ms) // self.interval_ms
        for s in series:
            raw = self.dataset.raw(s)
            present = [0 <= k < self._n and raw[k] is not None for k in range(first, last + 1)]
            if not any(present):
                continue
            if aligned:
                if not (present[0] and present[-1]):
                    return False
                continue
            if not all(present):
                return False
            vals = [float(raw[k] or 0.0) for k in range(first, last + 1)]
            diffs = [b - a for a, b in itertools.pairwise(vals)]
            if any(abs(x - diffs[0]) > 1e-9 * max(1.0, abs(diffs[0])) for x in diffs):
                return False
        return True


def _scaled(source: Source, value: float) -> float:
    return value if source.scale == 1.0 else source.scale * value
