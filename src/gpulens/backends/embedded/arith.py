"""Prometheus 2.42 float arithmetic, operation for operation, so answers match a real server bit for bit.

The one copy: the embedded evaluator folds with it, and the synthetic ground truth
(`gpulens_testkit.truth`, `gpulens_testkit.k8s_truth`) imports it, so the product never imports the
test-data generator. The truth tests check it against a real Prometheus; tests/backends/embedded
check the evaluator against values worked by hand.
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def prom_avg(values: Sequence[float]) -> float:
    """`avg`: Prometheus 2.42's incremental mean (mean += v/n - mean/n) in the given order, with its
    care for infinities (a mean that is already infinite stays so)."""
    mean = values[0]
    for n, v in enumerate(values[1:], start=2):
        if math.isinf(mean):
            if math.isinf(v) and (mean > 0) == (v > 0):
                continue
            if not math.isinf(v) and not math.isnan(v):
                continue
        mean += v / n - mean / n
    return mean


def prom_sum(values: Sequence[float]) -> float:
    total = values[0]
    for v in values[1:]:
        total += v
    return total


def prom_max(values: Sequence[float]) -> float:
    best = values[0]
    for v in values[1:]:
        if best < v or math.isnan(best):
            best = v
    return best


def prom_min(values: Sequence[float]) -> float:
    best = values[0]
    for v in values[1:]:
        if best > v or math.isnan(best):
            best = v
    return best


def duration_seconds(ms: int) -> float:
    """Go's time.Duration.Seconds() of a whole number of milliseconds."""
    sec, rest = divmod(ms, 1000)
    return float(sec) + float(rest * 1_000_000) / 1e9


def extrapolated_rate(
    points: Sequence[tuple[int, float]], range_start_ms: int, range_end_ms: int, range_ms: int | None
) -> float | None:
    """promql/functions.go extrapolatedRate(isCounter=true) for float samples (ms, value):
    `rate()` with the range's length, `increase()` with range_ms None."""
    if len(points) < 2:
        return None
    result = points[-1][1] - points[0][1]
    prev = points[0][1]
    for _, v in points[1:]:
        if v < prev:
            result += prev
        prev = v
    duration_to_start = float(points[0][0] - range_start_ms) / 1000
    duration_to_end = float(range_end_ms - points[-1][0]) / 1000
    sampled_interval = float(points[-1][0] - points[0][0]) / 1000
    average_between = sampled_interval / float(len(points) - 1)
    if result > 0 and points[0][1] >= 0:
        duration_to_zero = sampled_interval * (points[0][1] / result)
        duration_to_start = min(duration_to_start, duration_to_zero)
    threshold = average_between * 1.1
    extrapolate_to = sampled_interval
    extrapolate_to += duration_to_start if duration_to_start < threshold else average_between / 2
    extrapolate_to += duration_to_end if duration_to_end < threshold else average_between / 2
    factor = extrapolate_to / sampled_interval
    if range_ms is not None:
        factor /= duration_seconds(range_ms)
    return result * factor


def bucket_quantile(q: float, buckets: Sequence[tuple[float, float]]) -> float:
    """`histogram_quantile` on classic buckets (upper bound, cumulative count): Prometheus 2.42.

    Linear interpolation inside the bucket (the lowest from 0), NaN without observations or without
    a +Inf bucket, and the upper bound of the second-highest bucket when the rank falls into +Inf.
    """
    if math.isnan(q):
        return math.nan
    if q < 0:
        return -math.inf
    if q > 1:
        return math.inf
    bs = sorted(buckets, key=lambda b: b[0])
    if not bs or not math.isinf(bs[-1][0]):
        return math.nan
    merged: list[list[float]] = []  # coalesceBuckets
    for upper, count in bs:
        if merged and merged[-1][0] == upper:
            merged[-1][1] += count
        else:
            merged.append([upper, count])
    top = -math.inf  # ensureMonotonic
    for b in merged:
        if b[1] > top:
            top = b[1]
        elif b[1] < top:
            b[1] = top
    if len(merged) < 2:
        return math.nan
    observations = merged[-1][1]
    if observations == 0:
        return math.nan
    rank = q * observations
    idx = len(merged) - 1  # sort.Search over all but the last bucket
    for i in range(len(merged) - 1):
        if merged[i][1] >= rank:
            idx = i
            break
    if idx == len(merged) - 1:
        return merged[-2][0]
    if idx == 0 and merged[0][0] <= 0:
        return merged[0][0]
    start, end, count = 0.0, merged[idx][0], merged[idx][1]
    if idx > 0:
        start = merged[idx - 1][0]
        count -= merged[idx - 1][1]
        rank -= merged[idx - 1][1]
    return start + (end - start) * (rank / count)
