"""A pod's GPUs from their DCGM series as the exporter wrote them: one series per GPU, pod aggregates.

The Run:ai DCGM metricTypes read each source series of the pod's GPUs plainly (planning/pods.py,
`gpu_reads`) and are shaped here, so that no query needs a guard against a GPU seen as two series:

- `gpu_series`: one series per GPU (the labels of `key`). A GPU's series of one source (an exporter
  restart's old and new series while both are within the lookback, both pod-label spellings) are
  one by their largest value at each time, NaN only where all are NaN: what
  `max by (gpu, GPU_I_ID) (M)` answers. Sources are a fallback chain: at each time a GPU's value
  is the first source's that has one, as `(A) or (B)` answers.
- `pod_aggregate`: the pod's GPUs as one series, `sum`/`avg`/`max` at each time over the GPUs that
  have a value there, as the backend's aggregation does (NaN in a sum or mean makes it NaN, which
  the Run:ai answer leaves out; `max` skips NaN).

Values picked from a series keep the backend's text; computed sums and means are written as the
backend writes a float (shortest round trip, no exponent), equal to its own up to the last digit
(the order of the additions).
"""

from __future__ import annotations

from collections.abc import Sequence
from operator import itemgetter
from typing import Any

import numpy as np
import numpy.typing as npt
import orjson

from gpulens.domain.catalog import Agg
from gpulens.domain.models import DecodedSamples, GridPoints, GridSamples, Series, TimedSamples, Window
from gpulens.shaping.runai import Points, decimal_text

__all__ = ["float_text", "gpu_series", "pod_aggregate"]

Columns = tuple[npt.NDArray[np.int64], npt.NDArray[np.float64], list[bytes]]


def gpu_series(per_source: Sequence[Sequence[Series]], key: Sequence[str]) -> list[Series]:
    """One series per GPU (labelled by the `key` labels it has) from each source's answer, sources
    in fallback order. A GPU with a single series of a single source is that series unchanged."""
    by_gpu: dict[tuple[tuple[str, str], ...], list[list[Series]]] = {}
    for rank, answer in enumerate(per_source):
        for one in answer:
            gpu = tuple((k, one.labels[k]) for k in key if k in one.labels)
            ranks = by_gpu.setdefault(gpu, [[] for _ in per_source])
            ranks[rank].append(one)
    out = []
    for gpu, ranks in by_gpu.items():
        present = [r for r in ranks if r]
        if len(present) == 1 and len(present[0]) == 1:
            out.append(present[0][0])
            continue
        # rank 0 first, and within a source the largest value (NaN last): the first row per time wins
        parts = [(rank, _columns(one.samples)) for rank, r in enumerate(ranks) for one in r]
        out.append(Series(dict(gpu), _first_per_time(parts)))
    return out


def pod_aggregate(series: Sequence[Series], agg: Agg, grid: Window) -> Points:
    """`agg` over the series at each time inside the grid where one has a value; finite results only."""
    if not series:
        return Points()
    columns = [_columns(s.samples) for s in series]
    ms = np.concatenate([c[0] for c in columns])
    values = np.concatenate([c[1] for c in columns])
    if not len(ms):
        return Points()
    order = np.argsort(ms, kind="stable")
    ms, values = ms[order], values[order]
    starts = np.concatenate(([0], np.flatnonzero(ms[1:] != ms[:-1]) + 1))
    times = ms[starts]
    with np.errstate(invalid="ignore", over="ignore"):  # +Inf + -Inf is NaN, as the backend's sum
        if agg is Agg.MAX:
            result = np.fmax.reduceat(values, starts)  # NaN only where every value is NaN
        else:
            result = np.add.reduceat(values, starts)
            if agg is Agg.AVG:
                result = result / np.diff(starts, append=len(ms))
    keep = np.isfinite(result) & (times >= grid.start_ms) & (times <= grid.end_ms)
    kept = times[keep]
    step = grid.step_ms
    gap_free = len(kept) > 1 and kept[-1] - kept[0] == (len(kept) - 1) * step
    if gap_free and not ((kept - kept[0]) % step).any():  # a grid's times: as its range
        return Points(range(int(kept[0]), int(kept[-1]) + step, step), float_text(result[keep]))
    return Points(kept.tolist(), float_text(result[keep]))


def float_text(values: npt.NDArray[np.float64]) -> list[str]:
    """Finite floats as the backend writes them: shortest round trip, no exponent ("62", "0.5")."""
    if not len(values):
        return []
    # orjson writes each float's shortest round trip (as repr does, a sixth of its CPU), "62.0" whole
    joined = orjson.dumps(values, option=orjson.OPT_SERIALIZE_NUMPY).decode("ascii")[1:-1] + ","
    texts = joined.replace(".0,", ",")[:-1].split(",")
    if "e" in joined:
        texts = [decimal_text(t) or "0" if "e" in t else t for t in texts]
    return texts


def _columns(samples: Sequence[Any]) -> Columns:
    """(unix ms, values, texts) of any decoded or plain answer's samples."""
    if isinstance(samples, GridSamples):
        n = len(samples)
        ms = samples.first_ms + np.arange(n, dtype=np.int64) * samples.step_ms
        return ms, np.array(samples.numbers, dtype=np.float64), samples.texts
    if isinstance(samples, GridPoints):
        ms = samples.first_ms + np.array(samples.offsets, dtype=np.int64) * samples.step_ms
        return ms, np.array(samples.numbers, dtype=np.float64), samples.texts
    if isinstance(samples, TimedSamples):
        seconds = np.array(samples.seconds, dtype=np.float64)
        ms = np.rint(seconds * 1000).astype(np.int64)
        return ms, np.array(samples.numbers, dtype=np.float64), samples.texts
    if isinstance(samples, DecodedSamples):  # pragma: no cover - every decoded kind is above
        samples = list(samples)
    times = [round(float(t) * 1000) for t, _ in samples]
    texts = [str(v).encode("ascii") for _, v in samples]
    return (
        np.array(times, dtype=np.int64),
        np.array([float(v) for _, v in samples], dtype=np.float64),
        texts,
    )


def _first_per_time(parts: Sequence[tuple[int, Columns]]) -> GridPoints:
    """The samples of ranked parts as one series: at each time the lowest rank's largest value
    (NaN only where that rank has nothing else), texts kept."""
    ms = np.concatenate([c[0] for _, c in parts])
    if not len(ms):
        return GridPoints(0, 1, [], [], [], [])
    values = np.concatenate([c[1] for _, c in parts])
    nan = np.isnan(values)
    keys: list[npt.NDArray[Any]] = [-np.where(nan, 0.0, values), nan]
    if len({rank for rank, _ in parts}) > 1:
        keys.append(np.repeat([rank for rank, _ in parts], [len(c[0]) for _, c in parts]))
    # lexsort: the last key is the primary one: time, then rank, then not-NaN first, then the largest
    order = np.lexsort((*keys, ms))
    ms = ms[order]
    new = np.empty(len(ms), dtype=bool)
    new[0] = True
    np.not_equal(ms[1:], ms[:-1], out=new[1:])
    first, times = order[new], ms[new]
    texts = [t for _, c in parts for t in c[2]]
    kept_texts = list(itemgetter(*first.tolist())(texts)) if len(first) > 1 else [texts[int(first[0])]]
    kept = values[first]
    bad = np.flatnonzero(~np.isfinite(kept)).tolist()
    # the times are a range query's, on its grid: the grid of their greatest common step
    step = int(np.gcd.reduce(times[1:] - times[:-1])) if len(times) > 1 else 1
    offsets = ((times - times[0]) // step).tolist()
    return GridPoints(int(times[0]), step, offsets, kept_texts, kept.tolist(), bad)
