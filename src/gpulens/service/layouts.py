"""Find out what exists for a host over a window (series look-ups, one coarse check), cached briefly.

The answers become a `HostLayout` (planning/layout.py) from which the planner picks the cheapest exact
form. A look-up costs the backend an index scan, not a pass over samples.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Sequence

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
    derive,
    fb_check_window,
    fb_totals_equal,
    needs_fb_check,
    probe,
)
from gpulens.service.cache import TtlCache
from gpulens.shaping.merge import single

LAYOUT_TTL_S = 60.0


class HostLayouts:
    """`layout(backend, target, window, step)`: the host's layout, remembered for a minute per window."""

    def __init__(self, options: HostPlanOptions, ttl_s: float = LAYOUT_TTL_S) -> None:
        self.options = options
        self._cache: TtlCache[tuple[object, ...], HostLayout] = TtlCache(ttl_s)

    @property
    def cache(self) -> TtlCache[tuple[object, ...], HostLayout]:
        return self._cache

    async def layout(
        self,
        backend: MetricsBackend,
        metrics: Sequence[MetricDef],
        target: HostTarget,
        window: Window,
        step_ms: int,
    ) -> HostLayout:
        opts = self.options
        rate_window = rate_window_ms(step_ms, opts.scrape_interval_ms)
        key = (
            backend.name,
            target,
            window.start_ms,
            window.end_ms,
            rate_window,
            tuple(m.key for m in metrics),
        )
        hit = self._cache.get(key)
        if hit is not None:
            return hit[0]
        p = probe(
            metrics,
            opts.host_labels,
            target.hostname,
            node_instance_matcher(target, opts.node_match),
            window,
            rate_window,
            opts.scrape_interval_ms,
            opts.metric_names,
        )
        looked = [*p.dcgm, p.node, p.cpu_before, p.cpu_after]
        found = await asyncio.gather(*(backend.series(match, lo, hi) for match, lo, hi in looked))
        indices, uuids = split_gpus(target.gpus)
        n = len(p.dcgm)
        layout = derive(
            opts.host_labels,
            found[:n],
            found[n],
            found[n + 1],
            found[n + 2],
            indices,
            uuids,
            opts.metric_names,
        )
        if needs_fb_check(layout, metrics, opts.metric_names):
            grid = fb_check_window(window, opts.scrape_interval_ms)
            answers = await asyncio.gather(
                *(backend.query_range(RangeQuery(e, grid)) for e in fb_check_exprs(target, opts, layout))
            )
            points = [[(float(t), float(v)) for t, v in single(a)] for a in answers]
            layout = dataclasses.replace(layout, fb_equal_totals=fb_totals_equal(*points))
        self._cache.put(key, layout)
        return layout
