"""Shaping for the Run:ai dialect: per-GPU series, counts per sample interval, histogram buckets."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal

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
    """Ascending GPU index, then GPU instance; takes exporter labels or our wire labels."""
    gpu = labels.get(c.LABEL_GPU, "")
    instance = labels.get(c.LABEL_GPU_INSTANCE) or labels.get("gpuInstance", "")
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


def counts(series: Sequence[Series], grid: Window) -> list[Point]:
    """Events per sample interval from `sum(increase(...))`, rounded: increase() extrapolates to
    the interval's edges, but requests and observations come in whole numbers."""
    return [Point(p.ms, _integer(p.value)) for p in points(merged(series), grid)]


def merged(series: Sequence[Series]) -> Sequence[Sequence[object]]:
    return series[0].samples if series else []


def _integer(text: str) -> str:
    return str(max(0, round(float(text))))


def _le_key(le: str) -> float:
    return math.inf if le in ("+Inf", "Inf", "inf") else float(le)


def bucket_counts(series: Sequence[Series], grid: Window) -> list[BucketPoint]:
    """Observations per interval and bucket from `sum by (le) (increase(M_bucket[interval]))`:
    rounded, cumulative over le (never decreasing), `+Inf` last (catalog §5.2)."""
    per_le: dict[str, dict[int, float]] = {}
    for s in series:
        le = s.labels.get(c.LABEL_LE)
        if le is None:
            continue
        values = per_le.setdefault(le, {})
        for p in points(s.samples, grid):
            values[p.ms] = float(p.value)
    order = sorted(per_le, key=_le_key)
    times = sorted({t for values in per_le.values() for t in values})
    out = []
    for t in times:
        result: dict[str, str] = {}
        running = 0
        for le in order:
            running = max(running, round(per_le[le].get(t, 0.0)))
            result["+Inf" if _le_key(le) == math.inf else le] = str(running)
        out.append(BucketPoint(t, result))
    return out
