"""Evaluate a parsed expression on a range grid with Prometheus 2.42's semantics on backfilled data.

* an instant selector at t takes each series' last sample in [t - 5 m, t] (closed at both ends; no
  staleness markers, so a series stays visible 5 m after its last sample);
* a range selector [w] at t holds the samples in [t - w, t]; `rate`/`increase` are extrapolatedRate;
* aggregations see the series of a step in label-set order and repeat Prometheus' float operations
  (sum left to right, avg as the 2.x incremental mean, max/min with its NaN rules);
* arithmetic between vectors matches one-to-one on the label set without `__name__`; arithmetic drops
  `__name__`; `or` keeps every left element and the right elements whose label set (without
  `__name__`) the left lacks at that step;
* the result is a matrix sorted by label set, series without any point left out.
A vector is a list of (labels, values, present): numpy arrays with one slot per grid step, the
value used where `present` is set; operations run on whole arrays (the same float operations per
step as Prometheus does, so the same bits).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Protocol

import numpy as np
import numpy.typing as npt

from gpulens.backends.embedded.arith import (
    bucket_quantile,
    duration_seconds,
    extrapolated_rate,
    prom_avg,
    prom_max,
    prom_min,
    prom_sum,
)
from gpulens.backends.embedded.promql import (
    Aggregate,
    Binary,
    Call,
    Expr,
    MatrixSelector,
    NumberLiteral,
    PromQLError,
    StringLiteral,
    VectorSelector,
)
from gpulens.domain import catalog as c

LOOKBACK_MS = c.LOOKBACK_MS
NAME = c.LABEL_METRIC_NAME

Labels = dict[str, str]
Times = npt.NDArray[np.int64]
Values = npt.NDArray[np.float64]
Mask = npt.NDArray[np.bool_]
Column = list[float | None]
# one (labels, values, present) per series: a value slot per grid step, used where `present` is set
Vector = list[tuple[Labels, Values, Mask]]
Arrays = list[tuple[dict[str, str], npt.NDArray[np.int64], npt.NDArray[np.float64]]]
Matchers = Sequence[tuple[str, str, str]]  # (label, op, value); op one of = != =~ !~


class SampleSource(Protocol):
    """What the evaluator and `EmbeddedBackend` read: satisfied by `gpulens.storage.samples.SampleStore`
    (the local store) and `gpulens.storage.archive.ArchiveSource` (a decoded archive)."""

    @property
    def in_memory(self) -> bool:
        """True when reads do no I/O (the backend may then evaluate small grids on the event loop)."""
        ...

    def select_arrays(self, metric: str, matchers: Matchers, start_ms: int, end_ms: int) -> Arrays:
        """The series of `metric` ("" = any name; `__name__` matchers apply) matching every matcher,
        with their samples in [start_ms, end_ms] as (times, values) arrays, time-ordered; labels
        include `__name__`; series without samples in the range are left out."""
        ...

    def select_labels(
        self, metric: str, matchers: Matchers, start_ms: int, end_ms: int
    ) -> list[dict[str, str]]:
        """The labels of the series `select_arrays` would return (a series look-up)."""
        ...


def label_key(labels: Labels) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(labels.items()))


def _without_name(labels: Labels) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((k, v) for k, v in labels.items() if k != NAME))


@lru_cache(maxsize=256)
def _anchored(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern, re.DOTALL)


def go_div(a: float, b: float) -> float:
    """IEEE division as Go does it (x/0 is ±Inf or NaN, never an exception)."""
    if b == 0.0:
        if a == 0.0 or math.isnan(a):
            return math.nan
        return math.copysign(math.inf, a) * math.copysign(1.0, b)
    return a / b


_ARITH: dict[str, Callable[[float, float], float]] = {
    "+": lambda a, b: a + b,
    "-": lambda a, b: a - b,
    "*": lambda a, b: a * b,
    "/": go_div,
}


_NP_ARITH: dict[str, Callable[..., Values]] = {
    "+": np.add,
    "-": np.subtract,
    "*": np.multiply,
    "/": np.divide,
}


@dataclass(frozen=True, slots=True)
class Grid:
    start_ms: int
    end_ms: int
    step_ms: int

    @property
    def times(self) -> range:
        return range(self.start_ms, self.end_ms + 1, self.step_ms)


@dataclass(frozen=True, slots=True)
class _RateWindows:
    """The rate windows [t - w, t] of a grid on one run of timestamps: sample indices and the
    durations extrapolatedRate derives from times alone."""

    lo: npt.NDArray[np.intp]
    hi: npt.NDArray[np.intp]
    ok: Mask  # two samples or more
    last: npt.NDArray[np.intp]
    first: npt.NDArray[np.intp]
    to_start: Values
    to_end: Values
    sampled: Values
    average: Values
    threshold: Values

    @classmethod
    def place(cls, ts: Times, grid: Times, w: int) -> _RateWindows:
        lo = np.searchsorted(ts, grid - w, side="left")
        hi = np.searchsorted(ts, grid, side="right")
        last = np.maximum(hi - 1, 0)
        first = np.minimum(lo, len(ts) - 1)
        with np.errstate(divide="ignore", invalid="ignore"):
            to_start = (ts[first] - (grid - w)).astype(np.float64) / 1000
            to_end = (grid - ts[last]).astype(np.float64) / 1000
            sampled = (ts[last] - ts[first]).astype(np.float64) / 1000
            average = sampled / (hi - lo - 1).astype(np.float64)
            threshold = average * 1.1
        return cls(lo, hi, hi - lo >= 2, last, first, to_start, to_end, sampled, average, threshold)


class Evaluator:
    """One evaluation: selections are cached so a selector written twice is read once."""

    def __init__(self, source: SampleSource, grid: Grid, lookback_ms: int = LOOKBACK_MS) -> None:
        self.source = source
        self.grid = grid
        self.n = len(grid.times)
        self.lookback_ms = lookback_ms
        self._cache: dict[tuple[VectorSelector, int], Arrays] = {}
        self._grid: npt.NDArray[np.int64] | None = None
        # the grid placed on a series' timestamps, by the array (its memory and length: arrays in
        # `_cache` live as long as this evaluation); series of one scrape target share timestamps
        self._placed: dict[tuple[int, int, int], tuple[npt.NDArray[np.intp], Mask]] = {}
        self._windows: dict[tuple[int, int, int], _RateWindows] = {}

    # -- dispatch ---------------------------------------------------------------------------------
    def eval(self, expr: Expr) -> float | Vector:
        value = self._eval(expr)
        return value if isinstance(value, float) else merge(value)

    def _eval(self, expr: Expr) -> float | Vector:
        if isinstance(expr, NumberLiteral):
            return expr.value
        if isinstance(expr, VectorSelector):
            return self.instant(expr)
        if isinstance(expr, Aggregate):
            return self.aggregate(expr)
        if isinstance(expr, Binary):
            return self.binary(expr)
        if isinstance(expr, Call):
            return self.call(expr)
        if isinstance(expr, StringLiteral):
            raise PromQLError("a string is not a valid expression result here")
        raise PromQLError(f"a range vector cannot be evaluated on its own: {expr!r}")

    def vector(self, expr: Expr) -> Vector:
        value = self.eval(expr)
        if isinstance(value, float):
            raise PromQLError("expected an instant vector, got a scalar")
        return value

    # -- selectors --------------------------------------------------------------------------------
    def _select(self, sel: VectorSelector, back_ms: int) -> Arrays:
        """The series of a selector over the grid (and `back_ms` before it), in label-set order, with
        their samples as arrays."""
        key = (sel, back_ms)
        if key not in self._cache:
            start, end = self.grid.start_ms - back_ms, self.grid.end_ms
            got = self.source.select_arrays(sel.name, sel.matchers, start, end)
            self._cache[key] = sorted((g for g in got if len(g[1])), key=lambda item: label_key(item[0]))
        return self._cache[key]

    def _grid_array(self) -> npt.NDArray[np.int64]:
        if self._grid is None:
            g = self.grid
            self._grid = np.arange(g.start_ms, g.end_ms + 1, g.step_ms, dtype=np.int64)
        return self._grid

    def instant(self, sel: VectorSelector) -> Vector:
        out: Vector = []
        lookback = self.lookback_ms
        grid = self._grid_array()
        since = grid - lookback
        for labels, ts, vs in self._select(sel, lookback):
            key = (ts.ctypes.data, len(ts), lookback)
            placed = self._placed.get(key)
            if placed is None:
                # per step: the last sample at or before t, if it is at most `lookback` old
                last = np.searchsorted(ts, grid, side="right") - 1
                np.maximum(last, 0, out=last)
                at = ts[last]
                placed = self._placed[key] = (last, (at <= grid) & (at >= since))
            last, fresh = placed
            out.append((dict(labels), vs[last], fresh))
        return out

    def _rate(self, sel: MatrixSelector, is_rate: bool) -> Vector:
        """`rate`/`increase` at every step: `extrapolated_rate` over the samples in [t - w, t], done on
        arrays with the same float operations in the same order (so the same bits); windows with a
        counter reset go through `extrapolated_rate` itself (its sum of resets is sequential)."""
        out: Vector = []
        w = sel.range_ms
        grid = self._grid_array()
        per = duration_seconds(w) if is_rate else None
        for labels, ts, vs in self._select(sel.vector, w):
            key = (ts.ctypes.data, len(ts), w)
            windows = self._windows.get(key)
            if windows is None:  # what depends on the timestamps only (shared by a target's series)
                windows = self._windows[key] = _RateWindows.place(ts, grid, w)
            lo, hi, ok, last, first = windows.lo, windows.hi, windows.ok, windows.last, windows.first
            falls = vs[1:] < vs[:-1]
            reset = np.zeros(self.n, dtype=bool)
            if falls.any():
                drops = np.concatenate(([0], np.cumsum(falls)))
                reset = ok & (drops[last] - drops[first] > 0)
            with np.errstate(divide="ignore", invalid="ignore"):
                result = vs[last] - vs[first]
                to_start, to_end = windows.to_start, windows.to_end
                sampled, average, threshold = windows.sampled, windows.average, windows.threshold
                to_zero = sampled * (vs[first] / result)
                to_start = np.where((result > 0) & (vs[first] >= 0) & (to_zero < to_start), to_zero, to_start)
                extrapolate = sampled + np.where(to_start < threshold, to_start, average / 2)
                extrapolate = extrapolate + np.where(to_end < threshold, to_end, average / 2)
                factor = extrapolate / sampled
                if per is not None:
                    factor = factor / per
                values = result * factor
            for j in np.flatnonzero(reset).tolist():
                t = int(grid[j])
                a, b = int(lo[j]), int(hi[j])
                window = list(zip(ts[a:b].tolist(), vs[a:b].tolist(), strict=True))
                rate = extrapolated_rate(window, t - w, t, w if is_rate else None)
                assert rate is not None  # two samples or more (`ok`)
                values[j] = rate
            out.append(({k: v for k, v in labels.items() if k != NAME}, values, ok))
        return out

    # -- functions --------------------------------------------------------------------------------
    def call(self, call: Call) -> float | Vector:
        if call.func in ("rate", "increase"):
            sel = call.args[0]
            assert isinstance(sel, MatrixSelector)
            return self._rate(sel, call.func == "rate")
        if call.func == "histogram_quantile":
            return self.histogram_quantile(call.args[0], call.args[1])
        if call.func == "label_replace":
            return self.label_replace(call)
        raise PromQLError(f"unsupported function {call.func}")

    def histogram_quantile(self, q_expr: Expr, expr: Expr) -> Vector:
        q = self.eval(q_expr)
        if not isinstance(q, float):
            raise PromQLError("histogram_quantile needs a scalar quantile")
        groups: dict[tuple[tuple[str, str], ...], tuple[Labels, list[tuple[float, Column]]]] = {}
        for labels, vals, present in self.vector(expr):
            try:
                upper = float(labels.get("le", ""))  # Go ParseFloat: "+Inf" too
            except ValueError:
                continue  # Prometheus ignores series without a parsable `le`
            rest = {k: v for k, v in labels.items() if k not in (c.LABEL_LE, NAME)}
            groups.setdefault(label_key(rest), (rest, []))[1].append((upper, _column(vals, present)))
        out: Vector = []
        for rest, buckets in groups.values():
            res = np.zeros(self.n)
            have = np.zeros(self.n, dtype=bool)
            for j in range(self.n):
                found = [(u, v) for u, col in buckets if (v := col[j]) is not None]
                if found:
                    res[j] = bucket_quantile(q, found)
                    have[j] = True
            out.append((rest, res, have))
        return out

    def label_replace(self, call: Call) -> Vector:
        dst, repl, src, regex = (a.value for a in call.args[1:] if isinstance(a, StringLiteral))
        pattern = _anchored(regex)
        out: Vector = []
        for labels, vals, present in self.vector(call.args[0]):
            m = pattern.fullmatch(labels.get(src, ""))
            if m is None:
                out.append((labels, vals, present))
                continue
            value = m.expand(_go_template(repl))
            new = dict(labels)
            if value:
                new[dst] = value
            else:
                new.pop(dst, None)
            out.append((new, vals, present))
        return out

    # -- aggregation ------------------------------------------------------------------------------
    def aggregate(self, agg: Aggregate) -> Vector:
        inner = self.instant(agg.expr) if isinstance(agg.expr, VectorSelector) else self.vector(agg.expr)
        if agg.by is None:  # one group: no label sets to build
            vals, have = fold(agg.op, [(v, p) for _, v, p in inner], self.n)
            return [({}, vals, have)] if have.any() else []
        groups: dict[tuple[tuple[str, str], ...], tuple[Labels, list[tuple[Values, Mask]]]] = {}
        by = agg.by
        for labels, vals, present in inner:  # in label-set order (selectors sort, results keep it)
            grouped = {k: labels[k] for k in by if labels.get(k, "") != ""}
            groups.setdefault(label_key(grouped), (grouped, []))[1].append((vals, present))
        out: Vector = []
        for labels, cols in groups.values():
            vals, have = fold(agg.op, cols, self.n)
            if have.any():
                out.append((labels, vals, have))
        out.sort(key=lambda item: label_key(item[0]))
        return out

    # -- binary operators -------------------------------------------------------------------------
    def binary(self, b: Binary) -> float | Vector:
        lhs, rhs = self.eval(b.lhs), self.eval(b.rhs)
        if b.op == "or":
            if isinstance(lhs, float) or isinstance(rhs, float):
                raise PromQLError("`or` needs two instant vectors")
            return self._or(lhs, rhs)
        if isinstance(lhs, float) and isinstance(rhs, float):
            return _ARITH[b.op](lhs, rhs)
        op = _NP_ARITH[b.op]
        with np.errstate(all="ignore"):  # IEEE results, as Go's: x/0 is ±Inf or NaN
            if isinstance(lhs, float) and not isinstance(rhs, float):
                x = lhs
                return [(_drop_name(lb), op(x, vals), present) for lb, vals, present in rhs]
            if isinstance(rhs, float) and not isinstance(lhs, float):
                y = rhs
                return [(_drop_name(lb), op(vals, y), present) for lb, vals, present in lhs]
            assert not isinstance(lhs, float) and not isinstance(rhs, float)
            return self._vector_op(op, lhs, rhs)

    def _vector_op(self, op: Callable[[Values, Values], Values], lhs: Vector, rhs: Vector) -> Vector:
        right: dict[tuple[tuple[str, str], ...], list[tuple[Values, Mask]]] = {}
        for labels, vals, present in rhs:
            right.setdefault(_without_name(labels), []).append((vals, present))
        out: Vector = []
        for labels, vals, present in lhs:
            cols = right.get(_without_name(labels))
            if not cols:
                continue
            if len(cols) == 1:
                other, hit = cols[0]
            else:
                hits = np.sum([p for _, p in cols], axis=0)
                if (present & (hits > 1)).any():
                    raise PromQLError("many-to-many matching not allowed: matching labels must be unique")
                other, hit = cols[-1]
                for o, p in reversed(cols[:-1]):
                    other = np.where(p, o, other)
                hit = hits > 0
            out.append((_drop_name(labels), op(vals, other), present & hit))
        return out

    def _or(self, lhs: Vector, rhs: Vector) -> Vector:
        """All of lhs; a rhs value where no lhs series with its labels (name aside) has one at that step."""
        left: dict[tuple[tuple[str, str], ...], Mask] = {}
        for labels, _, present in lhs:
            key = _without_name(labels)
            seen = left.get(key)
            left[key] = present if seen is None else seen | present
        out: Vector = list(lhs)
        for labels, vals, present in rhs:
            taken = left.get(_without_name(labels))
            out.append((labels, vals, present if taken is None else present & ~taken))
        return out


def fold(op: str, cols: Sequence[tuple[Values, Mask]], n: int) -> tuple[Values, Mask]:
    """`op` across series at every step at once: the series' values folded row by row in the given
    order with the same float operations as `_FOLDS` (so the same bits); (values, present)."""
    acc = np.zeros(n)
    have = np.zeros(n, dtype=bool)
    if op not in _FOLDS:  # pragma: no cover - the parser admits only _FOLDS
        raise PromQLError(f"unknown aggregation {op!r}")
    if len(cols) == 1:  # every fold of one value is that value; count is 1
        vals, present = cols[0]
        return (present.astype(np.float64) if op == "count" else vals), present
    count = np.zeros(n)
    with np.errstate(all="ignore"):  # IEEE as Go: Inf - Inf is NaN; slots not yet used hold 0
        for v, present in cols:
            first = present & ~have
            more = present & have
            count += present
            if op == "sum":
                acc = np.where(first, v, np.where(more, acc + v, acc))
            elif op == "avg":  # incremental mean; an infinite mean stays unless ... (prom_avg)
                inf = np.isinf(acc)
                skip = inf & ((np.isinf(v) & ((acc > 0) == (v > 0))) | (~np.isinf(v) & ~np.isnan(v)))
                step = acc + (v / count - acc / count)  # count is 0 where unused: ignored there
                acc = np.where(first, v, np.where(more & ~skip, step, acc))
            elif op in ("max", "min"):
                better = (acc < v) if op == "max" else (acc > v)
                acc = np.where(first | (more & (better | np.isnan(acc))), v, acc)
            have |= present
    return (count if op == "count" else acc), have


def merge(vector: Vector) -> Vector:
    """One entry per label set, in label-set order, as Prometheus' range evaluation assembles series
    by label hash (two points of one label set at one step are its "duplicate labelset" error)."""
    by_key: dict[tuple[tuple[str, str], ...], tuple[Labels, Values, Mask]] = {}
    for labels, vals, present in vector:
        key = label_key(labels)
        seen = by_key.get(key)
        if seen is None:
            by_key[key] = (labels, vals, present)
            continue
        _, acc, have = seen
        if (have & present).any():
            raise PromQLError(f"vector cannot contain metrics with the same labelset {dict(key)}")
        by_key[key] = (seen[0], np.where(present, vals, acc), have | present)
    return [by_key[k] for k in sorted(by_key)]


def _column(vals: Values, present: Mask) -> Column:
    return [v if ok else None for v, ok in zip(vals.tolist(), present.tolist(), strict=True)]


def _drop_name(labels: Labels) -> Labels:
    return {k: v for k, v in labels.items() if k != NAME}


def _go_template(repl: str) -> str:
    """Go's `$1`/`${1}`/`${name}` expansion written for Python's `Match.expand`."""
    out: list[str] = []
    i = 0
    while i < len(repl):
        ch = repl[i]
        if ch == "\\":
            out.append("\\\\")
            i += 1
        elif ch == "$" and i + 1 < len(repl):
            m = re.match(r"\$(?:\{([a-zA-Z0-9_]+)\}|([a-zA-Z0-9_]+))", repl[i:])
            if m is None:
                if repl[i + 1] == "$":
                    out.append("$")
                    i += 2
                    continue
                out.append("$")
                i += 1
                continue
            out.append(f"\\g<{m.group(1) or m.group(2)}>")
            i += m.end()
        else:
            out.append(ch)
            i += 1
    return "".join(out)


_FOLDS: dict[str, Callable[[Sequence[float]], float]] = {
    "sum": prom_sum,
    "avg": prom_avg,
    "max": prom_max,
    "min": prom_min,
    "count": lambda values: float(len(values)),
}


def evaluate(source: SampleSource, expr: Expr, grid: Grid, lookback_ms: int = LOOKBACK_MS) -> float | Vector:
    """A scalar (a number expression) or a vector over `grid` (one value slot per step)."""
    return Evaluator(source, grid, lookback_ms).eval(expr)


def matrix(result: float | Vector, grid: Grid) -> list[tuple[Labels, Times, Values]]:
    """Prometheus' range-query answer as arrays (times, values): a scalar becomes one unlabelled
    series; no empty series; sorted by label set."""
    times = np.arange(grid.start_ms, grid.end_ms + 1, grid.step_ms, dtype=np.int64)
    if isinstance(result, float):
        return [({}, times, np.full(len(times), result))]
    out = []
    for labels, vals, present in result:
        if present.all():
            out.append((labels, times, vals))
        elif present.any():
            out.append((labels, times[present], vals[present]))
    out.sort(key=lambda item: label_key(item[0]))
    return out
