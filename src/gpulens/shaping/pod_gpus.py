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

Decoded range answers lie on the query's grid: their series are merged index by index there, one
numpy pass per series (a day at 1,000 samples, two GPUs each seen as an exporter restart's two
series: 1.9 ms of shaping less per read than sorting every sample by time, which the other forms
still take). Values picked from a series keep the backend's text; computed sums and means are written as the
backend writes a float (shortest round trip, no exponent), equal to its own up to the last digit
(the order of the additions).
"""

from __future__ import annotations

from collections.abc import Sequence
from operator import itemgetter
from typing import Any, NamedTuple

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
        ranked = [(rank, one.samples) for rank, r in enumerate(ranks) for one in r]
        joined = _joined_runs(ranked)
        if joined is not None:
            out.append(Series(dict(gpu), joined))
            continue
        grid = _common_grid([samples for _, samples in ranked])
        if grid is not None:
            ranks_on_grid = [rank for rank, _ in ranked]
            out.append(Series(dict(gpu), _first_on_grid(ranks_on_grid, grid)))
            continue
        # rank 0 first, and within a source the largest value (NaN last): the first row per time wins
        parts = [(rank, _columns(samples)) for rank, samples in ranked]
        out.append(Series(dict(gpu), _first_per_time(parts)))
    return out


def pod_aggregate(series: Sequence[Series], agg: Agg, grid: Window) -> Points:
    """`agg` over the series at each time inside the grid where one has a value; finite results only."""
    if not series:
        return Points()
    common = _common_grid([s.samples for s in series])
    if common is not None:
        return _aggregate_on_grid(common, agg, grid)
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
    return _finite_points(times, result, grid)


def _finite_points(times: npt.NDArray[np.int64], result: npt.NDArray[np.float64], grid: Window) -> Points:
    """The finite results at times inside the grid, as Points (a range when they are its times)."""
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


OnGrid = GridSamples | GridPoints
_ABSENT = np.iinfo(np.int64).max  # no rank holds a sample there yet


class _Grid(NamedTuple):
    """Samples that all lie on one grid (`points` times from `first_ms`, `step` apart)."""

    samples: list[OnGrid]
    first_ms: int
    step: int
    points: int

    def indices(self, samples: OnGrid) -> npt.NDArray[np.int64]:
        """Each of the samples' index on this grid."""
        k0 = (samples.first_ms - self.first_ms) // self.step
        if isinstance(samples, GridSamples):
            return np.arange(k0, k0 + len(samples), dtype=np.int64)
        return np.array(samples.offsets, dtype=np.int64) + k0


def _common_grid(all_samples: Sequence[Any]) -> _Grid | None:
    """The grid every answer's samples lie on (decoded range answers of one query step), or None:
    those on one are merged by index, without sorting."""
    on_grid = [s for s in all_samples if isinstance(s, OnGrid) and len(s)]
    if not on_grid or len(on_grid) != len(all_samples):
        return None
    step = on_grid[0].step_ms
    first = min(s.first_ms for s in on_grid)
    last = first
    for s in on_grid:
        if s.step_ms != step or (s.first_ms - first) % step:
            return None
        last = max(last, s.first_ms + (s.offsets[-1] if isinstance(s, GridPoints) else len(s) - 1) * step)
    points = (last - first) // step + 1
    if points > 4 * sum(len(s) for s in on_grid) + 64:
        return None  # sparse samples over a long grid: sorting them costs less
    return _Grid(on_grid, first, step, points)


_OVERLAP_MAX = 64  # points compared one by one; more (two spellings side by side for an hour): numpy


def _joined_runs(ranked: Sequence[tuple[int, Any]]) -> GridSamples | None:
    """`_first_on_grid` of gap-free finite series (a GPU's series before and after exporter restarts,
    each seen for the lookback after its last sample) that cover one stretch of a grid between them
    and overlap in at most _OVERLAP_MAX points: joined by slicing their lists, the overlapping points
    compared one by one (the lowest rank, then the largest value, then the earlier series wins, as
    there); None for any other shape. No array made and read back: a day of two GPUs' restarts was
    half a millisecond by numpy, most of it converting lists."""
    runs: list[tuple[int, int, int, GridSamples]] = []
    for order, (rank, samples) in enumerate(ranked):
        if type(samples) is not GridSamples or not len(samples):
            return None
        runs.append((samples.first_ms, order, rank, samples))
    step = runs[0][3].step_ms
    first = min(r[0] for r in runs)
    if any(s.step_ms != step or (at - first) % step for at, _, _, s in runs):
        return None
    runs.sort(key=lambda r: (r[0], r[1]))
    texts: list[bytes] = []
    numbers: list[float] = []
    ranks: list[int] = []
    orders: list[int] = []
    compared = 0
    for at, order, rank, samples in runs:
        k0, n = (at - first) // step, len(samples)
        if k0 > len(texts):
            return None  # a gap between them
        over = min(len(texts) - k0, n)
        compared += over
        if compared > _OVERLAP_MAX:
            return None
        for j in range(over):
            k, value, held = k0 + j, samples.numbers[j], numbers[k0 + j]
            if rank < ranks[k] or (
                rank == ranks[k] and (value > held or (value == held and order < orders[k]))
            ):
                texts[k], numbers[k], ranks[k], orders[k] = samples.texts[j], value, rank, order
        if n > over:
            texts += samples.texts[over:]
            numbers += samples.numbers[over:]
            ranks += [rank] * (n - over)
            orders += [order] * (n - over)
    return GridSamples(first, step, texts, numbers)


def _first_on_grid(ranks: Sequence[int], grid: _Grid) -> OnGrid:
    """`_first_per_time` for samples on one grid: at each grid index the lowest rank's largest value
    (NaN only where that rank has nothing else; the earlier series on a tie), picked series by
    series with numpy, texts kept."""
    values = np.full(grid.points, np.nan)
    owner = np.full(grid.points, -1, dtype=np.int64)  # the picked sample's index among all texts
    owner_rank = np.full(grid.points, _ABSENT, dtype=np.int64)
    texts: list[bytes] = []
    for rank, samples in zip(ranks, grid.samples, strict=True):  # ascending rank, as gpu_series lists them
        at = grid.indices(samples)
        new = np.array(samples.numbers, dtype=np.float64)
        held, held_rank = values[at], owner_rank[at]
        with np.errstate(invalid="ignore"):
            better = (np.isnan(held) & ~np.isnan(new)) | (new > held)
        take = np.flatnonzero((held_rank > rank) | ((held_rank == rank) & better))
        where = at[take]
        values[where] = new[take]
        owner[where] = take + len(texts)
        owner_rank[where] = rank
        texts += samples.texts
    at = np.flatnonzero(owner >= 0)
    kept = values[at]
    picked = owner[at].tolist()
    kept_texts = list(itemgetter(*picked)(texts)) if len(picked) > 1 else [texts[picked[0]]]
    start, step = grid.first_ms + int(at[0]) * grid.step, grid.step
    finite = np.isfinite(kept)
    if len(at) == int(at[-1] - at[0]) + 1 and finite.all():
        return GridSamples(start, step, kept_texts, kept.tolist())
    bad = np.flatnonzero(~finite).tolist()
    return GridPoints(start, step, (at - at[0]).tolist(), kept_texts, kept.tolist(), bad)


def _aggregate_on_grid(common: _Grid, agg: Agg, grid: Window) -> Points:
    """`pod_aggregate` for series on one grid: the GPUs' values summed (or maxed) index by index in
    the series' order, as the sorted path adds them."""
    total = np.full(common.points, np.nan)
    count = np.zeros(common.points, dtype=np.int64)
    with np.errstate(invalid="ignore", over="ignore"):  # +Inf + -Inf is NaN, as the backend's sum
        for samples in common.samples:
            at = common.indices(samples)
            new = np.array(samples.numbers, dtype=np.float64)
            if agg is Agg.MAX:
                total[at] = np.fmax(total[at], new)  # NaN only where every value is NaN
            else:  # a time's first value as it is (-0 stays -0), the others added in order
                total[at] = np.where(count[at] == 0, new, total[at] + new)
            count[at] += 1
        held = np.flatnonzero(count)
        result = total[held]
        if agg is Agg.AVG:
            result = result / count[held]
    return _finite_points(common.first_ms + held * common.step, result, grid)
