"""Find out what exists for a host over a window (series look-ups, one coarse check), cached briefly.

The answers become a `HostLayout` (planning/layout.py) from which the planner picks the cheapest exact
form. A look-up costs the backend an index scan, not a pass over samples.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Awaitable, Callable, Hashable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import TypeVar, cast

from cachetools import LRUCache

from gpulens.backends.base import MetricsBackend
from gpulens.domain.catalog import MetricDef
from gpulens.domain.models import RangeQuery, Window
from gpulens.planning.hosts import (
    HostPlanOptions,
    HostTarget,
    fb_check_exprs,
    node_instance_matcher,
    rate_window_ms,
    split_gpus,
)
from gpulens.planning.layout import (
    HostLayout,
    LabelSet,
    Probe,
    derive,
    fb_check_window,
    fb_totals_equal,
    needs_fb_check,
    probe,
)
from gpulens.planning.segments import REFINE_BY, Piece, children, finest_ms, to_refine, top_pieces
from gpulens.service.cache import TtlCache
from gpulens.shaping.merge import single

LAYOUT_TTL_S = 60.0
# A look-up whose range ended this long ago sees a settled past: series appear as samples arrive, and
# a scrape lands within the 5-minute lookback, so no new series shows up there (short of a backfill).
# Its answer is kept longer: re-reading a finished window (a dashboard, an export, the next page of a
# report) then plans without a look-up; a cold month is ~470 piece look-ups, twice its warm read.
SETTLED_AFTER_MS = 10 * 60_000
SETTLED_TTL_S = 15 * 60.0
# pieces looked up per read at most (each a series look-up per irregular kind): 30 days with a restart
# a day need about 470; beyond the budget the remaining irregular pieces stay guarded as they are
MAX_PIECES = 640
L = TypeVar("L", bound=Hashable)
R = TypeVar("R")


@dataclass(frozen=True, slots=True)
class Looked:
    """The raw answers of a probe's look-ups (`dcgm[i]`: spelling i of the probe)."""

    dcgm: tuple[Sequence[LabelSet], ...]
    node: Sequence[LabelSet]
    cpu_before: Sequence[LabelSet]
    cpu_after: Sequence[LabelSet]

    def content(self) -> tuple[object, ...]:
        """What the answers hold, as a hashable value equal for equal answers (the derived layouts of
        one host's targets are remembered by it: a fleet's series rarely change between two reads)."""
        return (
            tuple(_label_sets(answer) for answer in self.dcgm),
            _label_sets(self.node),
            _label_sets(self.cpu_before),
            _label_sets(self.cpu_after),
        )


def _label_sets(answer: Sequence[LabelSet]) -> frozenset[tuple[tuple[str, str], ...]]:
    return frozenset(tuple(sorted(labels.items())) for labels in answer)


async def refined(
    window: Window,
    look: Callable[[Piece], Awaitable[tuple[L, Hashable]]],
    irregular: Callable[[L], bool],
    known: Callable[[Piece], tuple[L, Hashable] | None] = lambda _piece: None,
) -> list[tuple[Piece, L]]:
    """The window's pieces in time order with what `look` found for each (a layout, and a digest of
    the series seen), level by level: an irregular piece is cut finer, unless all its siblings (the
    children of one piece) looked up the same series with the same layout (two label sets of one GPU
    all along, or a backend whose look-ups answer per day: finer pieces would only find that again;
    restarts change the series, so they are refined), down to the finest length and within
    MAX_PIECES look-ups (what is left then stays as found). `known`: what `look` would give a piece
    without waiting (a fresh cached answer), else None: only the others are awaited (a day around a
    restart is ~50 pieces, and a task each cost ~2 ms of a warm read)."""
    finest = finest_ms(window.step_ms)
    out: dict[Piece, L] = {}
    groups = [top_pieces(window)]  # each level: the children of one piece are siblings
    budget = MAX_PIECES
    while groups:
        level = [p for group in groups for p in group]
        budget -= len(level)
        answers = [known(p) for p in level]
        missing = [k for k, answer in enumerate(answers) if answer is None]
        if missing:
            loaded = await asyncio.gather(*(look(level[k]) for k in missing))
            for k, answer in zip(missing, loaded, strict=True):
                answers[k] = answer
        found = iter(cast(list[tuple[L, Hashable]], answers))
        decided = []
        for group in groups:
            mine = [next(found) for _ in group]
            decided.append((group, mine, to_refine(group, mine, lambda x: irregular(x[0]), finest)))
        if sum(sum(refine) for _, _, refine in decided) * REFINE_BY > budget:
            decided = [(group, mine, [False] * len(group)) for group, mine, _ in decided]
        groups = []
        for group, mine, refine in decided:
            for piece, (layout, _), finer in zip(group, mine, refine, strict=True):
                if finer:
                    groups.append(children(piece))
                else:
                    out[piece] = layout
    return sorted(out.items(), key=lambda item: item[0].lo_ms)


def series_digest(found: Sequence[Sequence[LabelSet]]) -> int:
    """Which series some look-ups saw, as one hashable digest (siblings that saw the same series)."""
    return hash(frozenset(tuple(sorted(labels.items())) for answer in found for labels in answer))


class HostLayouts:
    """`layout(...)`: the host's layout over a window; `leaves(...)`: the window cut into pieces, each
    with its own layout, finer where the data is irregular (planning/segments.py). Both remembered
    for a minute, or 15 when the range ended 10 minutes before now (SETTLED_AFTER_MS)."""

    def __init__(
        self,
        options: HostPlanOptions,
        ttl_s: float = LAYOUT_TTL_S,
        settled_ttl_s: float = SETTLED_TTL_S,
        clock_ms: Callable[[], float] = lambda: time.time() * 1000,
        timer: Callable[[], float] = time.monotonic,
    ) -> None:
        """`clock_ms`: now, to tell a settled range; `timer`: the caches' own clock."""
        self.options = options

        def lifetime(key: tuple[object, ...]) -> float:
            """Every key here ends with its range's end (ms): settled, it is kept longer."""
            end = key[-1]
            assert isinstance(end, int)
            return settled_ttl_s if end < clock_ms() - SETTLED_AFTER_MS else ttl_s

        self._cache: TtlCache[tuple[object, ...], tuple[HostLayout, Looked]] = TtlCache(
            ttl_s, timer=timer, ttl_for=lifetime
        )
        # the raw look-ups name the host, not the target's GPUs: the executions of one host over one
        # window (a live alerts pass reads hundreds) share them, each deriving its own layout
        self._looked: TtlCache[tuple[object, ...], Looked] = TtlCache(ttl_s, timer=timer, ttl_for=lifetime)
        self._derived: LRUCache[tuple[object, ...], HostLayout] = LRUCache(maxsize=16_384)
        self._contents: LRUCache[int, tuple[Looked, tuple[object, ...]]] = LRUCache(maxsize=1024)
        self._interned: LRUCache[tuple[object, ...], tuple[object, ...]] = LRUCache(maxsize=1024)
        self._pieces: TtlCache[tuple[object, ...], tuple[HostLayout, int]] = TtlCache(
            ttl_s, max_entries=16_384, timer=timer, ttl_for=lifetime
        )

    @property
    def cache(self) -> TtlCache[tuple[object, ...], tuple[HostLayout, Looked]]:
        return self._cache

    @property
    def looked_cache(self) -> TtlCache[tuple[object, ...], Looked]:
        return self._looked

    @property
    def piece_cache(self) -> TtlCache[tuple[object, ...], tuple[HostLayout, int]]:
        return self._pieces

    def _probe(
        self,
        metrics: Sequence[MetricDef],
        labels: Sequence[str],
        target: HostTarget,
        window: Window,
        rate_window: int,
    ) -> Probe:
        opts = self.options
        return probe(
            metrics,
            labels,
            target.hostname,
            node_instance_matcher(target, opts.node_match),
            window,
            rate_window,
            opts.scrape_interval_ms,
            opts.metric_names,
        )

    async def layout(
        self,
        backend: MetricsBackend,
        metrics: Sequence[MetricDef],
        target: HostTarget,
        window: Window,
        step_ms: int,
    ) -> HostLayout:
        return (await self._whole(backend, metrics, target, window, step_ms))[0]

    async def _whole(
        self,
        backend: MetricsBackend,
        metrics: Sequence[MetricDef],
        target: HostTarget,
        window: Window,
        step_ms: int,
    ) -> tuple[HostLayout, Looked]:
        opts = self.options
        rate_window = rate_window_ms(step_ms, opts.scrape_interval_ms)
        key = (
            backend.name,
            target,
            window.start_ms,
            rate_window,
            tuple(m.key for m in metrics),
            window.end_ms,
        )

        async def load() -> tuple[HostLayout, Looked]:
            raw = await self._raw(backend, metrics, target, window, rate_window)
            layout = self._derive(opts.host_labels, raw, target)
            if needs_fb_check(layout, metrics, opts.metric_names):
                equal = await self._fb_equal(backend, metrics, target, window, step_ms, layout)
                layout = dataclasses.replace(layout, fb_equal_totals=equal)
            return layout, raw

        return await self._cache.get_or_load(key, load)

    async def _raw(
        self,
        backend: MetricsBackend,
        metrics: Sequence[MetricDef],
        target: HostTarget,
        window: Window,
        rate_window: int,
    ) -> Looked:
        """The host's series over the window (every spelling of the host label), shared by its targets."""
        opts = self.options
        key = (
            backend.name,
            target.hostname,
            target.node_instances,
            window.start_ms,
            rate_window,
            tuple(m.key for m in metrics),
            window.end_ms,
        )

        async def load() -> Looked:
            p = self._probe(metrics, opts.host_labels, target, window, rate_window)
            looked = [*p.dcgm, p.node, p.cpu_before, p.cpu_after]
            found = await asyncio.gather(*(backend.series(match, lo, hi) for match, lo, hi in looked))
            n = len(p.dcgm)
            return Looked(tuple(found[:n]), found[n], found[n + 1], found[n + 2])

        return await self._looked.get_or_load(key, load)

    async def _fb_equal(
        self,
        backend: MetricsBackend,
        metrics: Sequence[MetricDef],
        target: HostTarget,
        window: Window,
        step_ms: int,
        layout: HostLayout,
    ) -> bool:
        """Whether the target's GPUs all have the same FB total (used + free) over the window. Equal on
        the whole host means equal on every subset of its GPUs: the host's check (one per host and
        window) answers for each execution holding some of them; only a host whose GPUs differ is
        checked per target."""
        opts = self.options
        if target.gpus:
            host = HostTarget(target.hostname, (), target.node_instances)
            if (await self._whole(backend, metrics, host, window, step_ms))[0].fb_equal_totals:
                return True
        grid = fb_check_window(window, opts.scrape_interval_ms)
        answers = await asyncio.gather(
            *(backend.query_range(RangeQuery(e, grid)) for e in fb_check_exprs(target, opts, layout))
        )
        points = [[(float(t), float(v)) for t, v in single(a)] for a in answers]
        return fb_totals_equal(*points)

    def _derive(self, labels: Sequence[str], raw: Looked, target: HostTarget) -> HostLayout:
        """The target's layout from the look-ups; remembered by what they hold (one derivation per
        target while the host's series stay the same, whatever the window)."""
        key = (tuple(labels), self._content(raw), target.gpus)
        known = self._derived.get(key)
        if known is not None:
            return known
        indices, uuids = split_gpus(target.gpus)
        layout = derive(
            labels,
            raw.dcgm,
            raw.node,
            raw.cpu_before,
            raw.cpu_after,
            indices,
            uuids,
            self.options.metric_names,
        )
        self._derived[key] = layout
        return layout

    def _content(self, raw: Looked) -> tuple[object, ...]:
        """`raw.content()`, made once per look-up (the targets of a host share one `Looked`)."""
        made = self._contents.get(id(raw))
        if made is None or made[0] is not raw:
            content = raw.content()
            # one object per distinct content: the memo's keys then compare by identity, not by
            # walking two equal sets of label sets for each target
            content = self._interned.setdefault(content, content)
            made = (raw, content)
            self._contents[id(raw)] = made
        return made[1]

    async def leaves(
        self,
        backend: MetricsBackend,
        metrics: Sequence[MetricDef],
        target: HostTarget,
        window: Window,
        step_ms: int,
    ) -> list[tuple[Piece, HostLayout]]:
        """The window's pieces in time order, each with the layout over its own range. A window whose
        whole layout is regular is one piece; otherwise pieces are looked up level by level, and only
        the look-ups of the irregular kinds (DCGM series, node series) are made per piece."""
        whole, raw = await self._whole(backend, metrics, target, window, step_ms)
        top = Piece(window.start_ms, window.end_ms + 1, window.end_ms + 1 - window.start_ms)
        if not whole.irregular:
            return [(top, whole)]
        rate_window = rate_window_ms(step_ms, self.options.scrape_interval_ms)
        return await refined(
            window,
            lambda p: self._piece(backend, metrics, target, window, p, whole, raw, rate_window),
            lambda layout: layout.irregular,
            partial(self._known, _piece_base(backend, metrics, target, whole, rate_window), window),
        )

    def _known(self, base: tuple[object, ...], window: Window, piece: Piece) -> tuple[HostLayout, int] | None:
        """A piece's cached layout and digest, if fresh (the key `_piece` keeps it under)."""
        return self._pieces.peek((*base, *piece.look_range(window)))

    async def _piece(
        self,
        backend: MetricsBackend,
        metrics: Sequence[MetricDef],
        target: HostTarget,
        window: Window,
        piece: Piece,
        whole: HostLayout,
        raw: Looked,
        rate_window: int,
    ) -> tuple[HostLayout, int]:
        """The layout over one piece, and a digest of the series it saw: the irregular kinds looked up
        over the piece's range, the regular ones taken from the whole window (regular there, regular
        in every piece of it)."""
        look = piece.look_window(window)
        dcgm, node = whole.dcgm_irregular, whole.node_irregular
        key = (*_piece_base(backend, metrics, target, whole, rate_window), look.start_ms, look.end_ms)

        async def load() -> tuple[HostLayout, int]:
            p = self._probe(metrics, whole.host_labels, target, look, rate_window)
            wanted = [*(p.dcgm if dcgm else ()), *((p.node, p.cpu_before, p.cpu_after) if node else ())]
            found = iter(await asyncio.gather(*(backend.series(m, lo, hi) for m, lo, hi in wanted)))
            piece_raw = Looked(
                tuple(next(found) for _ in p.dcgm) if dcgm else self._spelled(raw, whole),
                *(
                    (next(found), next(found), next(found))
                    if node
                    else (raw.node, raw.cpu_before, raw.cpu_after)
                ),
            )
            layout = self._derive(whole.host_labels, piece_raw, target)
            digest = series_digest((*piece_raw.dcgm, piece_raw.node))
            return dataclasses.replace(layout, fb_equal_totals=whole.fb_equal_totals), digest

        return await self._pieces.get_or_load(key, load)

    def _spelled(self, raw: Looked, whole: HostLayout) -> tuple[Sequence[LabelSet], ...]:
        """The whole window's DCGM answers of the spellings that have series, in `whole`'s order."""
        by_label = dict(zip(self.options.host_labels, raw.dcgm, strict=True))
        return tuple(by_label[label] for label in whole.host_labels)


def _piece_base(
    backend: MetricsBackend,
    metrics: Sequence[MetricDef],
    target: HostTarget,
    whole: HostLayout,
    rate_window: int,
) -> tuple[object, ...]:
    """What a piece's cache key holds besides its range: the same for every piece of one read."""
    dcgm = whole.dcgm_irregular
    return (
        backend.name,
        target,
        rate_window,
        tuple(m.key for m in metrics),
        whole.host_labels if dcgm else None,
        whole.node_irregular,
    )


def per_piece(leaves: Sequence[tuple[Piece, L]], plan: Callable[[L], R]) -> list[tuple[Piece, R]]:
    """Each piece's plan, made once per distinct layout (many pieces share one), and one object for
    all the pieces of equal layouts (`runs_per_item` joins them by identity). A layout object seen
    before is not hashed again (a layout's hash walks its sets, ~50 pieces a day around a restart)."""
    memo: dict[L, R] = {}
    by_object: dict[int, R] = {}
    out = []
    for piece, layout in leaves:
        made = by_object.get(id(layout))  # `leaves` holds every layout: no id is reused meanwhile
        if made is None:
            made = memo.get(layout)
            if made is None:
                made = memo[layout] = plan(layout)
            by_object[id(layout)] = made
        out.append((piece, made))
    return out
