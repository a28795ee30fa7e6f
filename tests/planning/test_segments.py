"""Pieces and runs (planning/segments.py): runs tile the grid exactly, pieces nest and align."""

from __future__ import annotations

import itertools

from hypothesis import given
from hypothesis import strategies as st

from gpulens.domain.models import Window
from gpulens.planning.segments import (
    FINEST_MS,
    REFINE_BY,
    TOP_PIECES,
    Piece,
    children,
    cut,
    finest_ms,
    grid_runs,
    runs_per_item,
    to_refine,
    top_length_ms,
    top_pieces,
)

T0 = 1_767_225_600_000

windows = st.builds(
    lambda start, points, step: Window(start, start + (points - 1) * step, step),
    st.integers(T0 - 10**9, T0 + 10**9),
    st.integers(1, 20_000),
    st.sampled_from([1_000, 5_000, 7_000, 15_000, 60_000, 3_600_000]),
)


@given(windows, st.data())
def test_runs_tile_the_grid_and_follow_the_values(window: Window, data: st.DataObject) -> None:
    """Every grid point is in exactly one run, runs are in order, and each point's run carries the
    value of the piece that holds the point; neighbouring runs differ (or are not contiguous)."""
    pieces = top_pieces(window)
    while len(pieces) < 40 and data.draw(st.booleans()):  # refine some pieces, as the service does
        i = data.draw(st.integers(0, len(pieces) - 1))
        if pieces[i].length_ms > 1:
            pieces[i : i + 1] = children(pieces[i])
    values = data.draw(
        st.lists(st.sampled_from(["a", "b", None]), min_size=len(pieces), max_size=len(pieces))
    )
    runs = grid_runs(window, list(zip(pieces, values, strict=True)))
    points = [t for r in runs for t in range(r.window.start_ms, r.window.end_ms + 1, r.window.step_ms)]
    assert points == list(range(window.start_ms, window.end_ms + 1, window.step_ms))
    for r in runs:
        assert (r.window.start_ms - window.start_ms) % window.step_ms == 0
        for t in (r.window.start_ms, r.window.end_ms):
            holder = next(v for p, v in zip(pieces, values, strict=True) if p.lo_ms <= t < p.hi_ms)
            assert holder == r.value
    for a, b in itertools.pairwise(runs):
        assert a.value != b.value or a.window.end_ms + window.step_ms != b.window.start_ms


@given(windows)
def test_top_pieces_cover_the_window_on_aligned_boundaries(window: Window) -> None:
    pieces = top_pieces(window)
    length = top_length_ms(window)
    assert pieces[0].lo_ms == window.start_ms and pieces[-1].hi_ms == window.end_ms + 1
    assert all(a.hi_ms == b.lo_ms for a, b in itertools.pairwise(pieces))
    assert all(p.hi_ms % length == 0 for p in pieces[:-1])
    assert len(pieces) <= TOP_PIECES + 2  # clipped ends add at most one piece each
    assert length % finest_ms(window.step_ms) == 0


def test_finest_piece_holds_enough_steps() -> None:
    assert finest_ms(15_000) == FINEST_MS
    assert finest_ms(60_000) == FINEST_MS * REFINE_BY  # 20 steps of a minute
    assert finest_ms(3_600_000) >= 20 * 3_600_000


def test_children_nest_inside_their_parent() -> None:
    parent = Piece(T0 + 1_000, T0 + 2_400_000, 2_400_000)
    kids = children(parent)
    assert kids[0].lo_ms == parent.lo_ms and kids[-1].hi_ms == parent.hi_ms
    assert all(k.length_ms == 600_000 for k in kids)
    assert cut(0, 10, 4) == [Piece(0, 4, 4), Piece(4, 8, 4), Piece(8, 10, 4)]


def test_refine_only_irregular_pieces_that_differ_from_their_siblings() -> None:
    pieces = cut(0, 4 * 2_400_000, 2_400_000)
    irregular = {"dup": True, "clean": False}.__getitem__
    assert to_refine(pieces, ["clean", "dup", "clean", "clean"], irregular, 600_000) == [
        False,
        True,
        False,
        False,
    ]
    # irregular everywhere alike: cutting finer would find it again
    assert to_refine(pieces, ["dup"] * 4, irregular, 600_000) == [False] * 4
    # already the finest
    assert to_refine(pieces, ["clean", "dup", "clean", "clean"], irregular, 2_400_000) == [False] * 4


def test_runs_per_item_groups_each_item_on_its_own() -> None:
    window = Window(0, 9 * 1_000, 1_000)
    pieces = cut(0, 10_000, 5_000)
    runs = runs_per_item(window, [(pieces[0], ["a", "x"]), (pieces[1], ["b", "x"])])
    assert [(r.window.start_ms, r.window.end_ms, r.value) for r in runs[0]] == [
        (0, 4_000, "a"),
        (5_000, 9_000, "b"),
    ]
    assert [(r.window.start_ms, r.window.end_ms, r.value) for r in runs[1]] == [(0, 9_000, "x")]
    assert runs_per_item(window, []) == []


@given(windows, st.data())
def test_runs_per_item_equal_each_items_own_runs(window: Window, data: st.DataObject) -> None:
    """Pieces that share a plan object are joined before the items are compared: every item's runs are
    what `grid_runs` gives its own values, whether equal plans are one object, equal copies or not
    equal, and with pieces that hold no grid point between them."""
    pieces = top_pieces(window)
    while len(pieces) < 40 and data.draw(st.booleans()):
        i = data.draw(st.integers(0, len(pieces) - 1))
        if pieces[i].length_ms > 1:
            pieces[i : i + 1] = children(pieces[i])
    shared = [["a", "x"], ["b", "x"], ["a", "y"]]  # the plan objects of three layouts
    plans = [
        data.draw(st.sampled_from([*shared, list(shared[0])]))  # one equal copy, not the same object
        for _ in pieces
    ]
    leaves = list(zip(pieces, plans, strict=True))
    expected = [grid_runs(window, [(p, plan[i]) for p, plan in leaves]) for i in range(2)]
    assert runs_per_item(window, leaves) == expected
