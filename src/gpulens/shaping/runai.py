"""Shaping for the Run:ai dialect: per-GPU series, counts per sample interval, histogram buckets."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal
from itertools import pairwise

from gpulens.domain import catalog as c
from gpulens.domain.models import Series, Window
from gpulens.shaping.merge import is_finite


@dataclass(frozen=True, slots=True)
class Point:
    ms: int
    value: str  # a plain decimal string


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


def points(samples: Sequence[Sequence[object]], grid: Window) -> list[Point]:
    out = []
    for t, v in samples:
        ms = round(float(t) * 1000)  # type: ignore[arg-type]
        text = decimal_text(str(v))
        if text is not None and grid.start_ms <= ms <= grid.end_ms:
            out.append(Point(ms, text))
    return out


def gpu_sort_key(labels: dict[str, str]) -> tuple[int, int, str, str]:
    gpu, instance = labels.get(c.LABEL_GPU, ""), labels.get(c.LABEL_GPU_INSTANCE, "")
    return (
        int(gpu) if gpu.isdigit() else 1 << 30,
        int(instance) if instance.isdigit() else -1,
        gpu,
        instance,
    )


def per_gpu(series: Sequence[Series], grid: Window) -> list[tuple[dict[str, str], list[Point]]]:
    """One (labels, points) per GPU (MIG: per GPU instance), ascending GPU index."""
    out = []
    for s in sorted(series, key=lambda s: gpu_sort_key(s.labels)):
        labels = {"gpu": s.labels.get(c.LABEL_GPU, "")}
        if s.labels.get(c.LABEL_GPU_INSTANCE):
            labels["gpuInstance"] = s.labels[c.LABEL_GPU_INSTANCE]
        out.append((labels, points(s.samples, grid)))
    return out


def _series_values(s: Series) -> dict[int, float]:
    return {round(float(t) * 1000): float(v) for t, v in s.samples if is_finite(str(v))}


def _increments(values: dict[int, float], times: Sequence[int]) -> dict[int, float]:
    """Increase of one counter between consecutive grid times; a drop is a reset (counts from 0)."""
    out: dict[int, float] = {}
    for prev, cur in pairwise(times):
        if prev in values and cur in values:
            a, b = values[prev], values[cur]
            out[cur] = b - a if b >= a else b
        elif cur in values and prev not in values:
            out[cur] = values[cur]  # the series started within this interval
    return out


def _grid_times(extended: Window) -> list[int]:
    return list(range(extended.start_ms, extended.end_ms + 1, extended.step_ms))


def _number(value: float) -> str:
    if value == int(value):
        return str(int(value))
    return format(Decimal(repr(value)), "f")


def counter_counts(series: Sequence[Series], extended: Window) -> list[Point]:
    """Events per interval (t - interval, t], summed over the series; None for empty input."""
    times = _grid_times(extended)
    total: dict[int, float] = defaultdict(float)
    for s in series:
        for t, inc in _increments(_series_values(s), times).items():
            total[t] += inc
    return [Point(t, _number(total[t])) for t in times[1:] if t in total]


def _le_key(le: str) -> float:
    return math.inf if le in ("+Inf", "Inf", "inf") else float(le)


def bucket_counts(series: Sequence[Series], extended: Window) -> list[BucketPoint]:
    """Observations per interval and bucket (cumulative over le, `+Inf` last), from raw `_bucket`
    counters: exact differences with reset handling, summed over engines and replicas."""
    times = _grid_times(extended)
    per_le: dict[str, dict[int, float]] = defaultdict(lambda: defaultdict(float))
    for s in series:
        le = s.labels.get(c.LABEL_LE)
        if le is None:
            continue
        for t, inc in _increments(_series_values(s), times).items():
            per_le[le][t] += inc
    order = sorted(per_le, key=_le_key)
    out = []
    for t in times[1:]:
        if not any(t in per_le[le] for le in order):
            continue
        counts: dict[str, str] = {}
        running = 0.0
        for le in order:
            running = max(running, per_le[le].get(t, 0.0))  # cumulative over le never decreases
            counts["+Inf" if _le_key(le) == math.inf else le] = _number(round(running))
        out.append(BucketPoint(t, counts))
    return out
