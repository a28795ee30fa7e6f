"""The building blocks of the findings: series on a grid, episodes with hysteresis, and the ledger of
GPU-time that gives each finding its impact and each receipt line its hours. Pure, no I/O.

An *episode* of a condition starts at a sample where its enter threshold holds and lasts while its
exit threshold holds (hysteresis): a series hovering around the enter threshold is one episode, not
many. Missing samples hold the state for up to the minimum duration; a longer hole ends the episode.
A stay test that reads other series is written "not known to fail" (a comparison with NaN is False,
so `~(x < t)`), so a sample missing from another series (scraped separately) does not end it.
Episodes of one kind separated by at most the smoothing gap are merged, and an episode is kept only
when it lasts at least the minimum duration and holds at least `min_samples` samples of the series
it tests (counted in that series' own samples, so coarse per-GPU series need as many as fine ones).
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from operator import itemgetter
from typing import Any

import numpy as np

from gpulens.domain import catalog as c
from gpulens.domain.catalog import InsightThresholds

Point = tuple[int, float]  # (unix ms, value)
FloatArray = np.ndarray[Any, np.dtype[np.float64]]
BoolArray = np.ndarray[Any, np.dtype[np.bool_]]
MS_PER_HOUR = 3_600_000


@dataclass(frozen=True, slots=True)
class Samples:
    """A series as two arrays, unix ms and values (what the summary reads: millions of points a month)."""

    t: FloatArray
    v: FloatArray
    # > 0: the times are t[0] + k * step_ms, every one (a range query's answer with no gap), and the
    # values finite: placed on a grid of that step without a look at the times
    step_ms: int = 0

    def __len__(self) -> int:
        return len(self.t)

    @staticmethod
    def join(parts: Sequence[Samples]) -> Samples:
        if len(parts) == 1:
            return parts[0]
        return Samples(
            np.concatenate([p.t for p in parts]) if parts else np.empty(0),
            np.concatenate([p.v for p in parts]) if parts else np.empty(0),
        )


PointsLike = Sequence[Point] | Samples  # a series: (ms, value) pairs or the same as arrays


@dataclass(frozen=True, slots=True)
class RunInfo:
    """The execution around the series: its window, scrape interval, status and GPUs."""

    start_ms: int
    end_ms: int
    interval_ms: int
    status: str = "completed"
    ended_ms: int | None = None  # the execution's end, when it has ended
    gpus: tuple[str, ...] = ()  # as registered (empty: every GPU of the host)
    gpu_count: int = 0  # how many GPUs the series cover (0: unknown)


@dataclass(frozen=True, slots=True)
class Finding:
    kind: str
    severity: str
    start_ms: int
    end_ms: int
    gpus: tuple[str, ...]
    message: str
    evidence: dict[str, float | int | str | list[str]] = field(default_factory=dict)
    gpu_count: int = 0  # how many of the execution's GPUs it concerns (0: all of them)
    gpu_hours: float = 0.0  # impact: the GPU-time it concerns that no finding before it claims
    cost: float | None = None  # that time at the execution's GPU-hour price (None: unpriced)


def as_arrays(points: PointsLike) -> tuple[FloatArray, FloatArray]:
    """(times, values) of the points as two float arrays (unzipped in C: numpy's own conversion of a
    list of pairs is several times slower)."""
    if isinstance(points, Samples):
        return points.t, points.v
    n = len(points)
    return (
        np.fromiter(map(itemgetter(0), points), dtype=np.float64, count=n),
        np.fromiter(map(itemgetter(1), points), dtype=np.float64, count=n),
    )


class Grid:
    """The series on the grid `start + k * interval`; NaN where a series has no point."""

    def __init__(self, series: Mapping[str, PointsLike], run: RunInfo, held_ms: int | None = None) -> None:
        """`held_ms`: the series are on a coarser grid (a multiple of the interval); each point stands
        for the grid points of the `held_ms` before it, as a range query's point does."""
        self.run = run
        self.interval = run.interval_ms
        self.n = max(0, (run.end_ms - run.start_ms) // run.interval_ms + 1)
        self.span = max(1, (held_ms or run.interval_ms) // run.interval_ms)  # grid points per sample
        self._series = series
        # the columns (NaN where no point) and where a sample of the series itself lands, each made
        # when first read (a per-GPU grid reads 2 of the 12)
        self.arrays: dict[str, FloatArray] = _Columns(self._build)
        self.landed: dict[str, BoolArray] = _Columns(self._build)

    def _build(self, key: str) -> None:
        if key not in c.LYCEUM_KEYS:
            raise KeyError(key)
        col, landed = _column(self._series.get(key, ()), self.run, self.n, self.span)
        dict.__setitem__(self.arrays, key, col)
        dict.__setitem__(self.landed, key, landed)

    def times(self, i: int) -> int:
        return self.run.start_ms + i * self.interval

    def has(self, key: str) -> bool:
        return bool(self.landed[key].any())

    def duration(self, i0: int, i1: int) -> int:
        """ms covered by the points i0..i1 (each stands for the interval before it, inside the window)."""
        return (i1 - i0 + (1 if i0 > 0 else 0)) * self.interval

    def hole_points(self, th: InsightThresholds) -> int:
        """The longest run of missing points an episode holds through: shorter than the minimum
        duration (no `no_data` finding; Prometheus' lookback hides such holes on coarse steps), and
        at least one sample of this grid's series."""
        return max(th.min_duration_ms // self.interval, self.span, 1)

    def gap_points(self, th: InsightThresholds) -> int:
        """The longest hole (in grid points) that does not split an episode: the smoothing gap, and at
        least one sample of this grid's series."""
        return max(th.smoothing_ms // self.interval, self.span, 1)

    def mean(self, key: str, i0: int, i1: int, where: BoolArray | None = None) -> float | None:
        """The mean of the points i0..i1 (only those where `where` holds, when given and any does)."""
        values = self.arrays[key][i0 : i1 + 1]
        if where is not None and where[i0 : i1 + 1].any():
            values = values[where[i0 : i1 + 1]]
        return nan_mean(values)

    def max(self, key: str, i0: int, i1: int) -> float | None:
        return nan_stat(np.nanmax, self.arrays[key][i0 : i1 + 1])


class _Columns(dict):  # type: ignore[type-arg]
    """A dict whose missing keys are built on first read (both of a grid's dicts at once)."""

    def __init__(self, build: Any) -> None:
        super().__init__()
        self._build = build

    def __missing__(self, key: str) -> Any:
        self._build(key)
        return dict.__getitem__(self, key)


def nan_mean(values: FloatArray) -> float | None:
    """np.nanmean of the values (the same sum of the same zero-filled array, without its wrapper's
    cost: the detectors take thousands of short means a pass), None when none is present."""
    missing = np.isnan(values)
    count = len(values) - int(np.count_nonzero(missing))
    if count == 0:
        return None
    return float(np.add.reduce(np.where(missing, 0.0, values)) / count)


def nan_stat(fn: Any, values: FloatArray) -> float | None:
    """`fn` (np.nanmean, np.nanmax, ...) of the values, None when none is present."""
    if not len(values) or np.isnan(values).all():
        return None
    return float(fn(values))


def _column(points: PointsLike, run: RunInfo, n: int, span: int) -> tuple[FloatArray, BoolArray]:
    """The points placed on the run's grid (the nearest grid point; a later point wins), each also
    filling the `span - 1` grid points before it; NaN where no point lands. Also where the points
    themselves land (to count a stretch's samples)."""
    landed = np.zeros(n, dtype=bool)
    if not points or n == 0:
        return np.full(n, np.nan), landed
    t, v = as_arrays(points)
    if span == 1 and _is_grid(t, run, n, points):  # a range query's answer with no gap: as it is
        ok = np.isfinite(v)
        return np.where(ok, v, np.nan), ok
    k = np.rint((t - run.start_ms) / run.interval_ms).astype(np.int64)
    ok = (k >= 0) & (k < n) & np.isfinite(v)
    k, v = k[ok], v[ok]
    landed[k] = True
    col = np.full(n, np.nan)
    for d in range(span):  # grid point i takes the latest point within span of it: largest d last
        i = k - d
        inside = i >= 0
        col[i[inside]] = v[inside]
    return col, landed


def _is_grid(t: FloatArray, run: RunInfo, n: int, points: PointsLike = ()) -> bool:
    """The times are the run's grid itself: n points, from its first to its last, a step apart."""
    step = run.interval_ms
    if len(t) != n or t[0] != run.start_ms:
        return False
    if isinstance(points, Samples) and points.step_ms == step:
        return True
    return t[-1] == run.start_ms + (n - 1) * step and bool((np.diff(t) == step).all())


# -- masks and episodes ------------------------------------------------------------------------------


_NONE: np.ndarray[Any, np.dtype[np.intp]] = np.empty(0, dtype=np.intp)
_NONE.flags.writeable = False


def _run_bounds(
    mask: Sequence[bool] | np.ndarray[Any, Any],
) -> tuple[np.ndarray[Any, np.dtype[np.intp]], ...]:
    """First and last indices of the runs of True (arrays)."""
    on = np.asarray(mask, dtype=bool)
    if not on.any():  # the common case on healthy data: nothing to find
        return _NONE, _NONE
    edges = np.diff(np.concatenate(([0], on.view(np.int8), [0])))
    return np.flatnonzero(edges == 1), np.flatnonzero(edges == -1) - 1


def smooth(mask: Sequence[bool] | BoolArray, max_gap: int) -> list[bool]:
    """`mask` with every run of at most `max_gap` False points between two True points set True."""
    smoothed: list[bool] = smoothed_mask(mask, max_gap).tolist()
    return smoothed


def smoothed_mask(mask: Sequence[bool] | BoolArray, max_gap: int) -> BoolArray:
    out = np.array(mask, dtype=bool)  # a copy
    if not out.any():
        return out
    starts, ends = _run_bounds(~out)
    inner = (starts > 0) & (ends < len(out) - 1) & (ends - starts + 1 <= max_gap)
    for a, b in zip(starts[inner].tolist(), ends[inner].tolist(), strict=True):
        out[a : b + 1] = True
    return out


def runs(mask: Sequence[bool] | BoolArray) -> list[tuple[int, int]]:
    """(first, last) index of every run of True."""
    starts, ends = _run_bounds(mask)
    return list(zip(starts.tolist(), ends.tolist(), strict=True))


def hysteresis(enter: BoolArray, stay: BoolArray, present: BoolArray, max_hole: int) -> BoolArray:
    """The points inside an episode: one starts at a present point where `enter` (and `stay`) holds
    and lasts through present points where `stay` holds and holes of at most `max_hole` missing points
    (those are inside it too); it ends at a present point where `stay` fails or at a longer hole."""
    n = len(present)
    begin = enter & stay & present
    if not begin.any():  # no episode can start
        none: BoolArray = np.zeros(n, dtype=bool)
        return none
    idx = np.arange(n)
    leave = present & ~stay
    starts, ends = _run_bounds(~present)
    long_holes = starts[(ends - starts + 1) > max_hole]
    if len(long_holes):
        leave = leave.copy()
        leave[long_holes] = True
    last_in = np.maximum.accumulate(np.where(begin, idx, -1))
    last_out = np.maximum.accumulate(np.where(leave, idx, -1))
    on: BoolArray = last_in > last_out
    return on


def rolling_share(flag: BoolArray, known: BoolArray, width: int) -> FloatArray:
    """The share of known points where `flag` holds in a centred window of `width` points (NaN where
    none is known)."""
    half = width // 2
    hits = np.concatenate(([0], np.cumsum(flag & known)))
    count = np.concatenate(([0], np.cumsum(known)))
    idx = np.arange(len(flag))
    lo, hi = np.clip(idx - half, 0, len(flag)), np.clip(idx + width - half, 0, len(flag))
    n = count[hi] - count[lo]
    with np.errstate(invalid="ignore", divide="ignore"):
        share: FloatArray = np.where(n > 0, (hits[hi] - hits[lo]) / np.maximum(n, 1), np.nan)
    return share


def episodes(
    grid: Grid, on: BoolArray, key: str, th: InsightThresholds, min_ms: int | None = None
) -> list[tuple[int, int]]:
    """The runs of `on` with gaps of at most the smoothing gap bridged, trimmed to the points where the
    series `key` has a value, lasting at least `min_ms` (the minimum duration by default) and holding
    at least `min_samples` samples of `key`."""
    if not on.any():
        return []
    least = th.min_duration_ms if min_ms is None else min_ms
    valued = ~np.isnan(grid.arrays[key])
    landed = grid.landed[key]
    out = []
    for a, b in runs(smoothed_mask(on, grid.gap_points(th))):
        if int((landed[a : b + 1] & on[a : b + 1]).sum()) < th.min_samples:
            continue
        inside = np.flatnonzero(valued[a : b + 1] & on[a : b + 1])
        first, last = a + int(inside[0]), a + int(inside[-1])
        if grid.duration(first, last) >= least:
            out.append((first, last))
    return out


def cover(n: int, spans: Sequence[tuple[int, int]], widen: int = 0) -> BoolArray:
    """A mask of the points inside the spans, each widened by `widen` points on both sides."""
    mask = np.zeros(n, dtype=bool)
    for a, b in spans:
        mask[max(0, a - widen) : b + widen + 1] = True
    return mask


def overlaps(a: tuple[int, int], others: Sequence[tuple[int, int]]) -> bool:
    return any(a[0] <= b[1] and b[0] <= a[1] for b in others)


# -- the ledger of GPU-time --------------------------------------------------------------------------


class Ledger:
    """GPU-time charged once: each GPU (a row) keeps the time already claimed; a claim returns only the
    time of its GPUs not claimed before (ms summed over the GPUs), so claims in priority order never
    add up to more than GPUs x window. A row holds its claimed time as disjoint spans in order, so a
    claim costs a bisection and the spans it meets (a month's summary can have hundreds of findings)."""

    def __init__(self, run: RunInfo, names: Sequence[str]) -> None:
        self.run = run
        count = run.gpu_count or len(names)
        self.rows = list(names[:count]) + [f"#{k}" for k in range(len(names), count)]  # "#k": unnamed
        self.claimed: dict[str, _Spans] = {r: _Spans() for r in self.rows}

    @property
    def total_ms(self) -> int:
        return len(self.rows) * max(0, self.run.end_ms - self.run.start_ms)

    def span(self, f: Finding) -> tuple[int, int]:
        """The time a finding covers: each of its points stands for the interval before it, clipped to
        the window."""
        return max(self.run.start_ms, f.start_ms - self.run.interval_ms), min(self.run.end_ms, f.end_ms)

    def claim(self, f: Finding) -> int:
        a, b = self.span(f)
        if b <= a:
            return 0
        rows = self.rows if f.gpu_count == 0 else [r for r in map(self._row, f.gpus) if r is not None]
        return sum(self.claimed[row].add(a, b) for row in rows)

    def _row(self, gpu: str) -> str | None:
        """The row of a GPU; a GPU the names do not list takes an unnamed row (they all hold the same
        claims: those of the findings about every GPU), None when there is none left."""
        if gpu in self.claimed:
            return gpu
        for k, row in enumerate(self.rows):
            if row.startswith("#"):
                self.rows[k] = gpu
                self.claimed[gpu] = self.claimed.pop(row)
                return gpu
        return None


class _Spans:
    """Disjoint [start, end) spans in order."""

    __slots__ = ("ends", "starts")

    def __init__(self) -> None:
        self.starts: list[int] = []
        self.ends: list[int] = []

    def add(self, a: int, b: int) -> int:
        """Adds [a, b); returns how much of it was not covered before."""
        i = bisect.bisect_right(self.ends, a)  # the first span ending after a
        j = bisect.bisect_left(self.starts, b, lo=i)  # the first span starting at or after b
        met = zip(self.starts[i:j], self.ends[i:j], strict=True)  # the spans [a, b) overlaps
        free = (b - a) - sum(min(b, y) - max(a, x) for x, y in met)
        if i < j:
            a, b = min(a, self.starts[i]), max(b, self.ends[j - 1])
        self.starts[i:j] = [a]
        self.ends[i:j] = [b]
        return free
