"""Shaping for the Run:ai dialect: per-GPU series, counts per sample interval, histogram buckets."""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, NamedTuple, cast, overload

import numpy as np

from gpulens.domain import catalog as c
from gpulens.domain.models import GridPoints, GridSamples, Series, Window
from gpulens.shaping.merge import is_finite, single

__all__ = [
    "BucketPoint",
    "Point",
    "Points",
    "bucket_counts",
    "counts",
    "decimal_text",
    "gpu_sort_key",
    "per_gpu",
    "points",
]


class Point(NamedTuple):
    """A value at a time; a tuple, since an answer holds tens of thousands of them."""

    ms: int
    value: str  # a plain decimal string


class Points(Sequence[Point]):
    """A series' points as two columns, `times` (ascending unix ms) and `values` (plain decimal text):
    an answer holds tens of thousands of points, and no object is made per point unless one is read
    as a `Point`. On a gap-free grid `times` is a `range`, which the encoder formats once per grid."""

    __slots__ = ("times", "values")

    def __init__(self, times: Sequence[int] = (), values: Sequence[str] = ()) -> None:
        if len(times) != len(values):
            raise ValueError("one value a time")
        self.times = times
        self.values = values

    def __len__(self) -> int:
        return len(self.values)

    @overload
    def __getitem__(self, index: int) -> Point: ...

    @overload
    def __getitem__(self, index: slice) -> Points: ...

    def __getitem__(self, index: int | slice) -> Point | Points:
        if isinstance(index, slice):
            return Points(self.times[index], self.values[index])
        return Point(self.times[index], self.values[index])

    def __iter__(self) -> Iterator[Point]:
        return map(Point, self.times, self.values)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Points):
            return list(self.times) == list(other.times) and list(self.values) == list(other.values)
        if isinstance(other, Sequence):
            return list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Points({list(self)!r})"


@dataclass(frozen=True, slots=True)
class BucketPoint:
    ms: int
    counts: dict[str, str]  # le -> cumulative count in the interval, "+Inf" last


def decimal_text(value: str) -> str | None:
    """The backend's number as Run:ai wants it: plain decimal, no exponent, no NaN/Inf (None)."""
    if not value or not is_finite(value):
        return None
    if "e" in value or "E" in value:
        text = format(Decimal(value), "f")
        if "." in text:
            text = text.rstrip("0").rstrip(".")
        return text or "0"
    return value


def _inside(samples: GridSamples, lo: int, hi: int) -> range:
    """The indices of a grid's samples inside [lo, hi]."""
    first, step = samples.first_ms, samples.step_ms
    return range(max(0, -((first - lo) // step)), min(len(samples), (hi - first) // step + 1))


def points(samples: Sequence[Sequence[Any]], grid: Window) -> Points:
    """Finite samples inside the grid's bounds, as plain decimal text."""
    lo, hi = grid.start_ms, grid.end_ms
    if isinstance(samples, GridSamples):  # finite, checked decimals on a grid: sliced, decoded at once
        inside = _inside(samples, lo, hi)
        if not inside:
            return Points()
        first, step = samples.first_ms + inside.start * samples.step_ms, samples.step_ms
        times = range(first, first + len(inside) * step, step)
        return _decimals(times, samples.texts[inside.start : inside.stop])
    if isinstance(samples, GridPoints):  # on a grid with gaps or NaN: the same, at its points
        at, texts = samples.finite_inside(lo, hi)
        first, step = samples.first_ms, samples.step_ms
        if at and at[-1] - at[0] == len(at) - 1:  # no gap among the finite ones: a grid
            begin = first + at[0] * step
            return _decimals(range(begin, begin + len(at) * step, step), texts)
        return _decimals((np.array(at, dtype=np.int64) * step + first).tolist(), texts)
    out_times: list[int] = []
    out_values: list[str] = []
    for t, raw in samples:
        if raw[0] == "N" or raw[-1] == "f":  # NaN, +Inf, -Inf
            continue
        text = decimal_text(raw) if "e" in raw or "E" in raw else raw
        ms = round(t * 1000)
        if lo <= ms <= hi and text is not None:
            out_times.append(ms)
            out_values.append(text)
    return Points(out_times, out_values)


def _decimals(times: Sequence[int], texts: list[bytes]) -> Points:
    """Points of checked finite decimal texts, those with an exponent rewritten as Run:ai wants."""
    if not texts:
        return Points()
    joined = b",".join(texts).decode("ascii")
    raw = joined.split(",")
    if "e" not in joined and "E" not in joined:
        return Points(times, raw)
    decimals = [decimal_text(t) for t in raw]
    if None not in decimals:
        return Points(times, cast(list[str], decimals))
    kept = [(ms, t) for ms, t in zip(times, decimals, strict=True) if t is not None]
    return Points([ms for ms, _ in kept], [t for _, t in kept])


def gpu_sort_key(labels: dict[str, str]) -> tuple[int, int, str, str]:
    """Ascending GPU index, then GPU instance; takes exporter labels or our wire labels."""
    gpu = labels.get(c.LABEL_GPU, "")
    instance = labels.get(c.LABEL_GPU_INSTANCE) or labels.get(c.RUNAI_LABEL_GPU_INSTANCE, "")
    return (
        int(gpu) if gpu.isdigit() else 1 << 30,
        int(instance) if instance.isdigit() else -1,
        gpu,
        instance,
    )


def per_gpu(series: Sequence[Series], grid: Window) -> list[tuple[dict[str, str], Points]]:
    """One (labels, points) per GPU (MIG: per GPU instance), ascending GPU index."""
    out = []
    for s in sorted(series, key=lambda s: gpu_sort_key(s.labels)):
        labels = {c.RUNAI_LABEL_GPU: s.labels.get(c.LABEL_GPU, "")}
        if s.labels.get(c.LABEL_GPU_INSTANCE):
            labels[c.RUNAI_LABEL_GPU_INSTANCE] = s.labels[c.LABEL_GPU_INSTANCE]
        out.append((labels, points(s.samples, grid)))
    return out


def counts(series: Sequence[Series], grid: Window) -> Points:
    """Events per sample interval from `sum(increase(...))`, rounded: increase() extrapolates to
    the interval's edges, but requests and observations come in whole numbers. The sum is one
    series; should a backend split it, the series are merged (the first wins a shared timestamp)."""
    found = points(single(series), grid)
    return Points(found.times, [_integer(v) for v in found.values])


def _integer(text: str) -> str:
    return str(max(0, round(float(text))))


def _le_key(le: str) -> float:
    return math.inf if le in ("+Inf", "Inf", "inf") else float(le)


def bucket_counts(series: Sequence[Series], grid: Window) -> list[BucketPoint]:
    """Observations per interval and bucket from `sum by (le) (increase(M_bucket[interval]))`:
    rounded, cumulative over le (never decreasing), `+Inf` last (docs/compatibility.md, "Counts and
    histograms per interval")."""
    start, step, n = grid.start_ms, grid.step_ms, grid.points
    per_le: dict[str, list[float | None]] = {}
    for s in series:
        le = s.labels.get(c.LABEL_LE)
        if le is None:
            continue
        row = per_le.setdefault(le, [None] * n)
        samples = s.samples
        if (
            isinstance(samples, GridSamples)
            and samples.step_ms == step
            and (samples.first_ms - start) % step == 0
        ):
            inside = _inside(samples, start, start + (n - 1) * step)
            k0 = (samples.first_ms - start) // step + inside.start
            row[k0 : k0 + len(inside)] = samples.numbers[inside.start : inside.stop]
            continue
        for t, v in samples:
            if v[0] == "N" or v[-1] == "f":
                continue
            k, off = divmod(round(t * 1000) - start, step)
            if not off and 0 <= k < n:
                row[k] = float(v)
    order = sorted(per_le, key=_le_key)
    names = ["+Inf" if _le_key(le) == math.inf else le for le in order]
    if not order:
        return []
    # as arrays (buckets x points): a day of 1,000 points and 20 buckets is 20,000 cells a histogram
    rows = np.array([per_le[le] for le in order], dtype=np.float64)  # None -> NaN
    missing = np.isnan(rows)
    rounded = np.where(missing, 0.0, np.rint(rows))  # round half to even, as Python's round
    running = np.maximum.accumulate(np.maximum(rounded, 0.0), axis=0)  # cumulative over le, from 0
    kept = np.flatnonzero(~missing.all(axis=0))
    texts = running[:, kept].astype(np.int64).astype(str).T.tolist()
    return [
        BucketPoint(start + int(k) * step, dict(zip(names, row, strict=True)))
        for k, row in zip(kept, texts, strict=True)
    ]
