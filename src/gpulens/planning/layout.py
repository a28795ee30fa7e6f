"""What exists for one host over one window, and the look-ups that find it out (pure).

Every guard in a Lyceum plan (`or` over the two host-label spellings, `max by (gpu, UUID, GPU_I_ID)`
against duplicate series, the per-GPU FB ratio, CPU time over all modes) is paid at every step of
every range query. The service asks the backend a few cheap questions first (series look-ups and one
coarse range query), this module turns the answers into a `HostLayout`, and `plan_host` sends the
simplest form that gives the same answer on that layout. docs/architecture.md ("Plans specialised to
what exists") has the rules and why each is exact.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from gpulens.domain import catalog as c
from gpulens.domain.catalog import LOOKBACK_MS, Exporter, Form, MetricDef
from gpulens.domain.models import Window
from gpulens.planning.promql import Matcher, eq, one_of, rename, series_match

# the per-GPU identity of a DCGM series: one device is one (gpu, UUID, GPU_I_ID)
GPU_IDENTITY = (c.LABEL_GPU, c.LABEL_UUID, c.LABEL_GPU_INSTANCE)
# points of the coarse FB-total check across the window (plus its two ends)
FB_CHECK_POINTS = 16


@dataclass(frozen=True, slots=True)
class HostLayout:
    """The series of one host over one window, as far as the plan's shape depends on them."""

    host_labels: tuple[str, ...]  # dcgm host-label spellings that have series (plan order kept)
    present: frozenset[str]  # exporter series names (as renamed) with at least one series
    duplicated: frozenset[str]  # names with more than one series for some GPU (collapse needed)
    single_node: frozenset[str]  # node series names with exactly one series (no aggregation needed)
    node_labels_aligned: bool  # MemTotal and MemAvailable carry the same labels (a plain `A - B` matches)
    fb_equal_totals: bool  # every GPU's used + free is the same (ratio of sums = mean of ratios)
    cpu_covered: bool  # every CPU counter has samples from before the first rate window to the end
    mig: bool = False  # some series carry a GPU instance id (MIG)
    multi_node: frozenset[str] = frozenset()  # node gauge names seen as more than one series
    # the GPUs (gpu, UUID, GPU_I_ID) each DCGM name has series for
    gpus: Mapping[str, frozenset[tuple[str, str, str]]] = field(default_factory=dict, hash=False)

    @property
    def dcgm_irregular(self) -> bool:
        """A GPU seen as two series somewhere (a restart, two label sets) or both host-label spellings."""
        return bool(self.duplicated) or len(self.host_labels) > 1

    @property
    def node_irregular(self) -> bool:
        """CPU counters that do not cover every rate window, or node gauges seen as several series."""
        return not self.cpu_covered or bool(self.multi_node) or not self.node_labels_aligned

    @property
    def irregular(self) -> bool:
        """Some metric's plan carries a guard on this layout."""
        return self.dcgm_irregular or self.node_irregular

    def covers(self, name: str, other: str) -> bool:
        """Every GPU with series of `other` also has series of `name`: both come from the same
        exporter pass, so `name` answers wherever `other` would and `(name) or (other)` is `name`."""
        mine = self.gpus.get(name)
        return mine is not None and self.gpus.get(other, frozenset()) <= mine


@dataclass(frozen=True, slots=True)
class Probe:
    """The series look-ups a layout is derived from: each a selector and its time range."""

    dcgm: tuple[tuple[str, int, int], ...]  # one per host-label spelling (GPU filter applied after)
    node: tuple[str, int, int]
    cpu_before: tuple[str, int, int]  # idle CPU counters present just before the first rate window
    cpu_after: tuple[str, int, int]  # ... and at the window's end


def _names(metrics: Sequence[MetricDef], exporter: Exporter, names: Mapping[str, str]) -> list[str]:
    return sorted(
        {rename(s, names) for m in metrics if m.exporter is exporter for src in m.sources for s in src.series}
    )


def probe(
    metrics: Sequence[MetricDef],
    host_labels: Sequence[str],
    hostname: str,
    node_sel: Matcher,
    window: Window,
    rate_window_ms: int,
    scrape_interval_ms: int,
    names: Mapping[str, str],
) -> Probe:
    lo, hi = window.start_ms - LOOKBACK_MS, window.end_ms
    dcgm = one_of(c.LABEL_METRIC_NAME, _names(metrics, Exporter.DCGM, names))
    node = one_of(c.LABEL_METRIC_NAME, _names(metrics, Exporter.NODE, names))
    idle = series_match(
        [
            eq(c.LABEL_METRIC_NAME, rename(c.NODE_CPU_SECONDS, names)),
            eq(c.LABEL_CPU_MODE, c.CPU_IDLE_MODE),
            node_sel,
        ]
    )
    first = window.start_ms - rate_window_ms
    return Probe(
        tuple((series_match([dcgm, eq(label, hostname)]), lo, hi) for label in host_labels),
        (series_match([node, node_sel]), first - LOOKBACK_MS, hi),
        (idle, first - scrape_interval_ms, first),
        (idle, hi - scrape_interval_ms, hi),
    )


def gpu_identity(labels: Mapping[str, str]) -> tuple[str, str, str]:
    return (labels.get(c.LABEL_GPU, ""), labels.get(c.LABEL_UUID, ""), labels.get(c.LABEL_GPU_INSTANCE, ""))


def wanted_gpu(labels: Mapping[str, str], indices: Sequence[str], uuids: Sequence[str]) -> bool:
    """The plan's GPU filter (`gpu=~indices` or `UUID=~uuids`) applied to a looked-up series."""
    if not indices and not uuids:
        return True
    return labels.get(c.LABEL_GPU) in indices or labels.get(c.LABEL_UUID) in uuids


LabelSet = Mapping[str, str]


def _without_name(s: LabelSet) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((k, v) for k, v in s.items() if k != c.LABEL_METRIC_NAME))


def derive(
    host_labels: Sequence[str],
    dcgm: Sequence[Sequence[LabelSet]],
    node: Sequence[LabelSet],
    cpu_before: Sequence[LabelSet],
    cpu_after: Sequence[LabelSet],
    indices: Sequence[str],
    uuids: Sequence[str],
    names: Mapping[str, str],
) -> HostLayout:
    """The layout from the look-ups of `probe` (`dcgm[i]` answers spelling `host_labels[i]`), before
    the FB-total check (`fb_equal_totals` is False until `with_fb_check` says otherwise)."""
    spellings: list[str] = []
    per_name: dict[str, dict[tuple[str, str, str], set[tuple[tuple[str, str], ...]]]] = {}
    for label, found in zip(host_labels, dcgm, strict=True):
        kept = [s for s in found if wanted_gpu(s, indices, uuids)]
        if kept:
            spellings.append(label)
        for s in kept:
            by_gpu = per_name.setdefault(s[c.LABEL_METRIC_NAME], {})
            by_gpu.setdefault(gpu_identity(s), set()).add(tuple(sorted(s.items())))
    duplicated = {name for name, gpus in per_name.items() if any(len(v) > 1 for v in gpus.values())}
    node_by_name: dict[str, list[LabelSet]] = {}
    for s in node:
        node_by_name.setdefault(s[c.LABEL_METRIC_NAME], []).append(s)
    single = {name for name, found in node_by_name.items() if len(found) == 1}
    total, avail = rename(c.NODE_MEM_TOTAL, names), rename(c.NODE_MEM_AVAILABLE, names)
    aligned = (
        # without both series the difference is never asked (plan_host needs every source present)
        total not in node_by_name
        or avail not in node_by_name
        or (
            total in single
            and avail in single
            and _without_name(node_by_name[total][0]) == _without_name(node_by_name[avail][0])
        )
    )
    idle = {
        _without_name(s)
        for s in node_by_name.get(rename(c.NODE_CPU_SECONDS, names), ())
        if s.get(c.LABEL_CPU_MODE) == c.CPU_IDLE_MODE
    }
    covered = not idle or (  # no idle counters: both CPU forms are empty alike
        idle <= {_without_name(s) for s in cpu_before} and idle <= {_without_name(s) for s in cpu_after}
    )
    return HostLayout(
        host_labels=tuple(spellings),
        present=frozenset(per_name) | frozenset(node_by_name),
        duplicated=frozenset(duplicated),
        single_node=frozenset(single),
        node_labels_aligned=aligned,
        fb_equal_totals=False,
        cpu_covered=covered,
        mig=any(ident[2] for gpus in per_name.values() for ident in gpus),
        multi_node=frozenset(node_by_name) - single - {rename(c.NODE_CPU_SECONDS, names)},
        gpus={name: frozenset(by_gpu) for name, by_gpu in per_name.items()},
    )


def fb_check_window(window: Window, scrape_interval_ms: int) -> Window:
    """A coarse grid over the window for the FB-total check: its start, its end and a few points between."""
    span = window.end_ms - window.start_ms
    step = max(math.ceil(span / FB_CHECK_POINTS), scrape_interval_ms, 1)
    return Window(window.start_ms, window.end_ms, step)


Points = Sequence[tuple[float, float]]


def fb_totals_equal(spread: Points, used: Points, free: Points, both: Points) -> bool:
    """At every checked point the GPUs' used + free agree, and every GPU reports both."""
    if any(v != 0.0 for _, v in spread):
        return False
    return list(used) == list(free) == list(both)


def needs_fb_check(layout: HostLayout, metrics: Sequence[MetricDef], names: Mapping[str, str]) -> bool:
    """The check is worth a query: an FB metric is asked, both its series exist, and no MIG instances
    (their sizes differ by profile, so their totals are never all equal)."""
    fb = [m for m in metrics if m.form is Form.GPU_FB_PERCENT]
    return (
        bool(fb)
        and not layout.mig
        and all(rename(s, names) in layout.present for m in fb for src in m.sources for s in src.series)
    )
