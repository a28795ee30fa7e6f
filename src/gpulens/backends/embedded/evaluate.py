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
A vector is a list of (labels, values) with one value slot per grid step (None: no point).
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
Column = list[float | None]
Vector = list[tuple[Labels, Column]]
Selected = Sequence[tuple[dict[str, str], Sequence[tuple[int, float]]]]
Arrays = list[tuple[dict[str, str], npt.NDArray[np.int64], npt.NDArray[np.float64]]]


class SampleSource(Protocol):
    """What the evaluator reads: satisfied by `gpulens.storage.samples.SampleStore`."""

    def select(
        self, metric: str, matchers: Sequence[tuple[str, str, str]], start_ms: int, end_ms: int
    ) -> Selected: ...

    def series_names(self) -> list[str]: ...


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


@dataclass(frozen=True, slots=True)
class Grid:
    start_ms: int
    end_ms: int
    step_ms: int

    @property
    def times(self) -> range:
        return range(self.start_ms, self.end_ms + 1, self.step_ms)


class Evaluator:
    """One evaluation: selections are cached so a selector written twice is read once."""

    def __init__(self, source: SampleSource, grid: Grid, lookback_ms: int = LOOKBACK_MS) -> None:
        self.source = source
        self.grid = grid
        self.times = list(grid.times)
        self.n = len(self.times)
        self.lookback_ms = lookback_ms
        self._cache: dict[tuple[VectorSelector, int], Arrays] = {}
        self._grid: npt.NDArray[np.int64] | None = None

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
        their samples as arrays (from the source's `select_arrays` when it has one)."""
        key = (sel, back_ms)
        if key not in self._cache:
            start, end = self.grid.start_ms - back_ms, self.grid.end_ms
            arrays = getattr(self.source, "select_arrays", None)
            got: Arrays
            if arrays is not None:
                got = arrays(sel.name, sel.matchers, start, end)
            else:
                got = [
                    (
                        labels,
                        np.fromiter((t for t, _ in pts), dtype=np.int64, count=len(pts)),
                        np.fromiter((v for _, v in pts), dtype=np.float64, count=len(pts)),
                    )
                    for labels, pts in self.source.select(sel.name, sel.matchers, start, end)
                ]
            self._cache[key] = sorted((g for g in got if len(g[1])), key=lambda item: label_key(item[0]))
        return self._cache[key]

    def _grid_array(self) -> npt.NDArray[np.int64]:
        if self._grid is None:
            self._grid = np.array(self.times, dtype=np.int64)
        return self._grid

    def instant(self, sel: VectorSelector) -> Vector:
        out: Vector = []
        lookback = self.lookback_ms
        grid = self._grid_array()
        for labels, ts, vs in self._select(sel, lookback):
            # per step: the last sample at or before t, if it is at most `lookback` old
            last = np.maximum(np.searchsorted(ts, grid, side="right") - 1, 0)
            fresh = (ts[last] <= grid) & (ts[last] >= grid - lookback)
            col: Column = [v if ok else None for v, ok in zip(vs[last].tolist(), fresh.tolist(), strict=True)]
            out.append((dict(labels), col))
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
            lo = np.searchsorted(ts, grid - w, side="left")
            hi = np.searchsorted(ts, grid, side="right")
            ok = hi - lo >= 2
            last = np.maximum(hi - 1, 0)
            drops = np.concatenate(([0], np.cumsum(vs[1:] < vs[:-1])))
            first = np.minimum(lo, len(ts) - 1)
            reset = ok & (drops[last] - drops[first] > 0)
            with np.errstate(divide="ignore", invalid="ignore"):
                result = vs[last] - vs[first]
                to_start = (ts[first] - (grid - w)).astype(np.float64) / 1000
                to_end = (grid - ts[last]).astype(np.float64) / 1000
                sampled = (ts[last] - ts[first]).astype(np.float64) / 1000
                average = sampled / (hi - lo - 1).astype(np.float64)
                to_zero = sampled * (vs[first] / result)
                to_start = np.where((result > 0) & (vs[first] >= 0) & (to_zero < to_start), to_zero, to_start)
                threshold = average * 1.1
                extrapolate = sampled + np.where(to_start < threshold, to_start, average / 2)
                extrapolate = extrapolate + np.where(to_end < threshold, to_end, average / 2)
                factor = extrapolate / sampled
                if per is not None:
                    factor = factor / per
                values = (result * factor).tolist()
            col: Column = [v if good else None for v, good in zip(values, ok.tolist(), strict=True)]
            for j in np.flatnonzero(reset).tolist():
                t = self.times[j]
                a, b = int(lo[j]), int(hi[j])
                window = list(zip(ts[a:b].tolist(), vs[a:b].tolist(), strict=True))
                col[j] = extrapolated_rate(window, t - w, t, w if is_rate else None)
            out.append(({k: v for k, v in labels.items() if k != NAME}, col))
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
        for labels, col in self.vector(expr):
            try:
                upper = float(labels.get("le", ""))  # Go ParseFloat: "+Inf" too
            except ValueError:
                continue  # Prometheus ignores series without a parsable `le`
            rest = {k: v for k, v in labels.items() if k not in (c.LABEL_LE, NAME)}
            groups.setdefault(label_key(rest), (rest, []))[1].append((upper, col))
        out: Vector = []
        for rest, buckets in groups.values():
            res: Column = [None] * self.n
            for j in range(self.n):
                present = [(u, v) for u, col in buckets if (v := col[j]) is not None]
                if present:
                    res[j] = bucket_quantile(q, present)
            out.append((rest, res))
        return out

    def label_replace(self, call: Call) -> Vector:
        dst, repl, src, regex = (a.value for a in call.args[1:] if isinstance(a, StringLiteral))
        pattern = _anchored(regex)
        out: Vector = []
        for labels, col in self.vector(call.args[0]):
            m = pattern.fullmatch(labels.get(src, ""))
            if m is None:
                out.append((labels, col))
                continue
            value = m.expand(_go_template(repl))
            new = dict(labels)
            if value:
                new[dst] = value
            else:
                new.pop(dst, None)
            out.append((new, col))
        return out

    # -- aggregation ------------------------------------------------------------------------------
    def aggregate(self, agg: Aggregate) -> Vector:
        if agg.by is None and isinstance(agg.expr, VectorSelector):
            return self._fold_selector(agg.op, agg.expr)
        inner = self.vector(agg.expr)
        groups: dict[tuple[tuple[str, str], ...], tuple[Labels, list[Column]]] = {}
        for labels, col in inner:  # inner is in label-set order (selectors sort, results keep it)
            grouped = {} if agg.by is None else {k: labels[k] for k in agg.by if labels.get(k, "") != ""}
            groups.setdefault(label_key(grouped), (grouped, []))[1].append(col)
        fold = _FOLDS[agg.op]
        out: Vector = []
        for labels, cols in groups.values():
            res: Column
            if len(cols) == 1:  # every fold of one value is that value; count is 1
                res = [None if v is None else 1.0 for v in cols[0]] if agg.op == "count" else list(cols[0])
            else:
                res = [None] * self.n
                for j, row in enumerate(zip(*cols, strict=True)):
                    values = [v for v in row if v is not None]
                    if values:
                        res[j] = fold(values)
            out.append((labels, res))
        out.sort(key=lambda item: label_key(item[0]))
        return out

    def _fold_selector(self, op: str, sel: VectorSelector) -> Vector:
        """`op(selector)` over the whole grid at once: the series' values at each step as rows of an
        array, folded row by row in label-set order with the same float operations as `_FOLDS`."""
        grid = self._grid_array()
        acc = np.zeros(self.n)
        have = np.zeros(self.n, dtype=bool)
        count = np.zeros(self.n)
        for _, ts, vs in self._select(sel, self.lookback_ms):
            last = np.maximum(np.searchsorted(ts, grid, side="right") - 1, 0)
            present = (ts[last] <= grid) & (ts[last] >= grid - self.lookback_ms)
            v = vs[last]
            first = present & ~have
            more = present & have
            count += present
            if op == "sum":
                acc = np.where(first, v, np.where(more, acc + v, acc))
            elif op == "avg":  # incremental mean; an infinite mean stays unless a finite... (prom_avg)
                with np.errstate(invalid="ignore", over="ignore", divide="ignore"):  # 0 where unused
                    inf = np.isinf(acc)
                    skip = inf & ((np.isinf(v) & ((acc > 0) == (v > 0))) | (~np.isinf(v) & ~np.isnan(v)))
                    step = acc + (v / count - acc / count)
                acc = np.where(first, v, np.where(more & ~skip, step, acc))
            elif op in ("max", "min"):
                with np.errstate(invalid="ignore"):
                    better = (acc < v) if op == "max" else (acc > v)
                acc = np.where(first | (more & (better | np.isnan(acc))), v, acc)
            elif op != "count":  # pragma: no cover - the parser admits only _FOLDS
                raise PromQLError(f"unknown aggregation {op!r}")
            have |= present
        if not have.any():
            return []
        values = count if op == "count" else acc
        col: Column = [v if ok else None for v, ok in zip(values.tolist(), have.tolist(), strict=True)]
        return [({}, col)]

    # -- binary operators -------------------------------------------------------------------------
    def binary(self, b: Binary) -> float | Vector:
        lhs, rhs = self.eval(b.lhs), self.eval(b.rhs)
        if b.op == "or":
            if isinstance(lhs, float) or isinstance(rhs, float):
                raise PromQLError("`or` needs two instant vectors")
            return self._or(lhs, rhs)
        fn = _ARITH[b.op]
        if isinstance(lhs, float) and isinstance(rhs, float):
            return fn(lhs, rhs)
        if isinstance(lhs, float) and not isinstance(rhs, float):
            x = lhs
            return [(_drop_name(lb), [None if v is None else fn(x, v) for v in col]) for lb, col in rhs]
        if isinstance(rhs, float) and not isinstance(lhs, float):
            y = rhs
            return [(_drop_name(lb), [None if v is None else fn(v, y) for v in col]) for lb, col in lhs]
        assert not isinstance(lhs, float) and not isinstance(rhs, float)
        return self._vector_op(fn, lhs, rhs)

    def _vector_op(self, fn: Callable[[float, float], float], lhs: Vector, rhs: Vector) -> Vector:
        right: dict[tuple[tuple[str, str], ...], list[Column]] = {}
        for labels, col in rhs:
            right.setdefault(_without_name(labels), []).append(col)
        out: Vector = []
        for labels, col in lhs:
            cols = right.get(_without_name(labels))
            if not cols:
                continue
            res: Column = [None] * self.n
            for j, a in enumerate(col):
                if a is None:
                    continue
                hits = [v for other in cols if (v := other[j]) is not None]
                if len(hits) > 1:
                    raise PromQLError("many-to-many matching not allowed: matching labels must be unique")
                if hits:
                    res[j] = fn(a, hits[0])
            out.append((_drop_name(labels), res))
        return out

    def _or(self, lhs: Vector, rhs: Vector) -> Vector:
        """All of lhs; a rhs value where no lhs series with its labels (name aside) has one at that step."""
        left: dict[tuple[tuple[str, str], ...], list[Column]] = {}
        for labels, col in lhs:
            left.setdefault(_without_name(labels), []).append(col)
        out: Vector = list(lhs)
        for labels, col in rhs:
            cols = left.get(_without_name(labels))
            if cols is None:
                out.append((labels, col))
                continue
            taken = [any(v is not None for v in row) for row in zip(*cols, strict=True)]
            out.append((labels, [None if t else v for v, t in zip(col, taken, strict=True)]))
        return out


def merge(vector: Vector) -> Vector:
    """One entry per label set, in label-set order, as Prometheus' range evaluation assembles series
    by label hash (two points of one label set at one step are its "duplicate labelset" error)."""
    by_key: dict[tuple[tuple[str, str], ...], tuple[Labels, Column]] = {}
    for labels, col in vector:
        key = label_key(labels)
        seen = by_key.get(key)
        if seen is None:
            by_key[key] = (labels, list(col))
            continue
        acc = seen[1]
        for j, v in enumerate(col):
            if v is None:
                continue
            if acc[j] is not None:
                raise PromQLError(f"vector cannot contain metrics with the same labelset {dict(key)}")
            acc[j] = v
    return [by_key[k] for k in sorted(by_key)]


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


def matrix(result: float | Vector, grid: Grid) -> list[tuple[Labels, list[tuple[int, float]]]]:
    """Prometheus' range-query answer: a scalar becomes one unlabelled series; no empty series;
    sorted by label set."""
    times = list(grid.times)
    if isinstance(result, float):
        return [({}, [(t, result) for t in times])]
    out = []
    for labels, col in result:
        points = [(t, v) for t, v in zip(times, col, strict=True) if v is not None]
        if points:
            out.append((labels, points))
    out.sort(key=lambda item: label_key(item[0]))
    return out
