"""Merge the series a query returned into one ascending, duplicate-free sample list."""

from __future__ import annotations

from collections.abc import Sequence

from gpulens.domain.models import Sample, Series

__all__ = [
    "is_finite",
    "single",
]


def single(series: Sequence[Series]) -> Sequence[Sample]:
    """The samples of an aggregated query (normally exactly one series, or none).

    Should a backend split the answer (e.g. `or` of two label sets), the first series wins at a
    timestamp that several carry, which is PromQL's own `or` rule.
    """
    if not series:
        return []
    if len(series) == 1:
        return series[0].samples
    seen: dict[float, Sample] = {}
    for s in series:
        for sample in s.samples:
            seen.setdefault(sample[0], sample)
    return [seen[t] for t in sorted(seen)]


def is_finite(value: str) -> bool:
    """NaN, +Inf and -Inf are the only non-finite spellings of the Prometheus API."""
    return not (value[0] == "N" or value[-1] == "f")
