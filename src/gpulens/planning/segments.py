"""Guards only where the data is irregular: a window cut into pieces, each planned for its own layout.

A host's layout over a whole window (planning/layout.py) is irregular as soon as one stretch of it is:
an exporter restart leaves old and new series of every GPU side by side for the 5-minute lookback, and
the whole window then pays `max by (gpu, UUID, GPU_I_ID)` at every step. Here the window is cut into
pieces on fixed, epoch-aligned boundaries; the service looks each piece up (the same series look-ups,
over the piece's range), pieces that are irregular while their siblings differ are cut finer, down to
`finest_ms`, and every metric is then asked per run of pieces that share its expression: the plain form
over the clean stretches, the guarded one only over the irregular ones. Each piece's look-ups cover
its own lookback and rate window, so the expression chosen for it is exact at every grid point in it
(docs/architecture.md, "Guards only where the data is irregular").

Everything here is pure: the service does the look-ups and the caching.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from gpulens.domain.models import Window

# the finest piece: guards cover a restart's lookback plus at most about this much on either side
FINEST_MS = 600_000
FINEST_STEPS = 20  # ... and at least this many grid steps per piece (coarse grids, coarse pieces)
REFINE_BY = 4  # a piece is cut into this many when it is refined
TOP_PIECES = 16  # the first level cuts the window into at most about this many pieces

L = TypeVar("L", bound=Hashable)


def finest_ms(step_ms: int) -> int:
    """FINEST_MS x REFINE_BY^j: the smallest that holds FINEST_STEPS steps (lengths nest by level)."""
    length = FINEST_MS
    while length < FINEST_STEPS * step_ms:
        length *= REFINE_BY
    return length


def top_length_ms(window: Window) -> int:
    """The first level's piece length: finest x REFINE_BY^j, the smallest giving <= TOP_PIECES pieces."""
    length = finest_ms(window.step_ms)
    while (window.end_ms - window.start_ms) / length > TOP_PIECES:
        length *= REFINE_BY
    return length


@dataclass(frozen=True, slots=True)
class Piece:
    """[lo_ms, hi_ms): a stretch of time on epoch-aligned boundaries of `length_ms`, clipped to the window."""

    lo_ms: int
    hi_ms: int
    length_ms: int

    def look_range(self, window: Window) -> tuple[int, int]:
        """(start, end) of the range to look the piece up over (closed at the window's end, the grid's
        last point): its cache key, without a `Window` made for each piece of a warm read."""
        return max(self.lo_ms, window.start_ms), min(self.hi_ms, window.end_ms)

    def look_window(self, window: Window) -> Window:
        """`look_range` as a window on the grid's step."""
        return Window(*self.look_range(window), window.step_ms)


def cut(lo_ms: int, hi_ms: int, length_ms: int) -> list[Piece]:
    """[lo, hi) cut on the multiples of `length_ms` (the first and last pieces clipped)."""
    out = []
    a = lo_ms
    while a < hi_ms:
        b = min((a // length_ms + 1) * length_ms, hi_ms)
        out.append(Piece(a, b, length_ms))
        a = b
    return out


def top_pieces(window: Window) -> list[Piece]:
    """The first level over the whole grid ([start, end] as [start, end + 1))."""
    return cut(window.start_ms, window.end_ms + 1, top_length_ms(window))


def to_refine(
    pieces: Sequence[Piece], layouts: Sequence[L], irregular: Callable[[L], bool], finest: int
) -> list[bool]:
    """Which pieces of one level (siblings) to cut finer: the irregular ones longer than the finest,
    unless every sibling has the same layout (the irregularity spans them all; cutting finer would
    only find it again)."""
    if len(set(layouts)) <= 1:
        return [False] * len(pieces)
    return [irregular(x) and p.length_ms > finest for p, x in zip(pieces, layouts, strict=True)]


def children(piece: Piece) -> list[Piece]:
    return cut(piece.lo_ms, piece.hi_ms, max(1, piece.length_ms // REFINE_BY))


T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Run(Generic[T]):
    """Grid points of one run of pieces that share an expression (or a plan): a sub-grid of the window."""

    window: Window
    value: T


def grid_runs(window: Window, leaves: Sequence[tuple[Piece, T]]) -> list[Run[T]]:
    """The window's grid points grouped into runs of consecutive leaves with equal values. `leaves`
    tile [start, end] in time order; a point t belongs to the leaf with lo <= t < hi. Pieces that hold
    no grid point (shorter than a step) join no run."""
    return _runs(window, [(piece.lo_ms, piece.hi_ms, value) for piece, value in leaves])


def _runs(window: Window, spans: Sequence[tuple[int, int, T]]) -> list[Run[T]]:
    """`grid_runs` of stretches [lo_ms, hi_ms) that tile the window, each with its value."""
    runs: list[tuple[int, int, T]] = []  # (first point, last point, value) of each run
    step = window.step_ms
    for lo_ms, hi_ms, value in spans:
        k_lo = max(0, -(-(lo_ms - window.start_ms) // step))
        k_hi = min(window.points - 1, -(-(hi_ms - window.start_ms) // step) - 1)
        if k_lo > k_hi:
            continue
        if runs and runs[-1][1] + 1 == k_lo and (runs[-1][2] is value or runs[-1][2] == value):
            runs[-1] = (runs[-1][0], k_hi, value)
        else:
            runs.append((k_lo, k_hi, value))
    return [Run(_sub(window, lo, hi), value) for lo, hi, value in runs]


def _sub(window: Window, k_lo: int, k_hi: int) -> Window:
    return Window(
        window.start_ms + k_lo * window.step_ms, window.start_ms + k_hi * window.step_ms, window.step_ms
    )


def runs_per_item(window: Window, leaves: Sequence[tuple[Piece, Sequence[T]]]) -> list[list[Run[T]]]:
    """`leaves` give each piece one value per item (a plan: one expression per metric); the runs of
    each item's values over the grid, item by item. Consecutive pieces given one plan object (pieces
    of one layout share their plan: a day around a restart is ~50 pieces and ~3 plans) are one
    stretch first, so the items are compared per change of plan, not per piece."""
    if not leaves:
        return []
    stretches: list[tuple[int, int, Sequence[T]]] = []
    for piece, values in leaves:
        if stretches and stretches[-1][2] is values and stretches[-1][1] == piece.lo_ms:
            stretches[-1] = (stretches[-1][0], piece.hi_ms, values)
        else:
            stretches.append((piece.lo_ms, piece.hi_ms, values))
    count = len(leaves[0][1])
    return [_runs(window, [(lo, hi, values[i]) for lo, hi, values in stretches]) for i in range(count)]
