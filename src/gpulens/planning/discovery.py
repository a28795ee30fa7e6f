"""The kube-state-metrics queries of a Kubernetes discovery (pure: built from validated parts)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gpulens.domain import catalog as c
from gpulens.domain.timeparse import format_duration_ms
from gpulens.planning.promql import Matcher, eq, one_of, over_range, rename, selector

MAX_SUBQUERY_STEP_MS = 240_000  # below the lookback delta, so the last-seen time is exact


@dataclass(frozen=True, slots=True)
class DiscoveryQueries:
    """The instant queries one discovery runs at the window's end (pure: built from validated parts)."""

    info: str
    owner: str
    replicaset_owner: str
    created: str
    started: str
    completed: str
    phase: str
    last_seen: str


def discovery_queries(
    start_ms: int,
    end_ms: int,
    *,
    namespaces: Sequence[str] = (),
    metric_names: Mapping[str, str] | None = None,
) -> DiscoveryQueries:
    """Range functions over (start, end], evaluated at `end`; namespaces must be validated."""
    names = metric_names or {}
    span = format_duration_ms(end_ms - start_ms)
    step = format_duration_ms(
        min(MAX_SUBQUERY_STEP_MS, max(15_000, (end_ms - start_ms) // 1440 // 1000 * 1000))
    )
    ns: list[Matcher] = [one_of(c.KSM_LABEL_NAMESPACE, namespaces)] if namespaces else []

    def over(func: str, metric: str, *extra: Matcher) -> str:
        return over_range(func, rename(metric, names), [[*ns, *extra]], span)

    deployment = eq(c.KSM_LABEL_OWNER_KIND, "Deployment")
    return DiscoveryQueries(
        info=over("last_over_time", c.KSM_POD_INFO),
        owner=over("last_over_time", c.KSM_POD_OWNER),
        replicaset_owner=over("last_over_time", c.KSM_REPLICASET_OWNER, deployment),
        created=over("max_over_time", c.KSM_POD_CREATED),
        started=over("max_over_time", c.KSM_POD_START_TIME),
        completed=over("max_over_time", c.KSM_POD_COMPLETION_TIME),
        phase=over("last_over_time", c.KSM_POD_STATUS_PHASE) + " == 1",
        last_seen=f"max_over_time(timestamp({selector(rename(c.KSM_POD_INFO, names), ns)})[{span}:{step}])",
    )
