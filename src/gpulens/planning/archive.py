"""Which raw series an archive of a finished execution or pod copies: every series a plan could read.

An archive must answer every read of its object exactly as the live backend would, so it holds every
series the Lyceum plans (hosts.py) or the Run:ai plans (pods.py) could select for that object, derived
here from the same catalog entries and the same matcher helpers, never spelled out a second time:

* an execution: each DCGM source series of `LYCEUM_METRICS` on its host (both host-label spellings
  unless the settings fix one, restricted to its GPUs as `plan_host` does), each node-exporter source
  series of its host's `instance`s, and `node_uname_info` of the host (the plan finds instances by
  `nodename` through it);
* a pod: each source series of `POD_METRICS` and `WORKLOAD_METRICS` with the pod's labels: DCGM under
  `exported_namespace`/`exported_pod` or `namespace`/`pod`, everything else (cAdvisor, vLLM, NIM,
  kube-state-metrics, histogram buckets under every name discovery may pick) under `namespace`/`pod`.

Each selection names its series with one `__name__=~"a|b|..."` matcher, so an archive costs a few
requests instead of one per series name. Matchers that plans add on top (`container!=""`,
`finished_reason=~...`, `mode="idle"`, `resource="cpu"`) are left out: the archive keeps the superset.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from gpulens.domain import catalog as c
from gpulens.domain.catalog import Exporter, PodForm, PodMetricDef
from gpulens.planning.hosts import HostPlanOptions, HostTarget, gpu_groups, node_instance_matcher
from gpulens.planning.pods import (
    PodTarget,
    app_alternatives,
    dcgm_pod_alternatives,
    histogram_sources,
    read_by_host,
)
from gpulens.planning.promql import Matcher, eq, one_of, rename, selector, series_match

DCGM_POD_FORMS = frozenset({PodForm.DCGM_PER_GPU, PodForm.DCGM_POD})
HISTOGRAM_FORMS = frozenset({PodForm.APP_HISTOGRAM, PodForm.APP_PERCENTILES})


@dataclass(frozen=True, slots=True)
class Selection:
    """Series of any of `names` that match every one of `matchers`."""

    names: tuple[str, ...]
    matchers: tuple[Matcher, ...]

    @property
    def match(self) -> str:
        """One selector: `{__name__=~"a|b",label="value",...}` (`name{...}` for a single name)."""
        if len(self.names) == 1:
            return selector(self.names[0], self.matchers)
        return series_match([one_of(c.LABEL_METRIC_NAME, self.names), *self.matchers])

    def per_name(self) -> list[str]:
        """One selector per name (for functions that drop `__name__`, such as count_over_time)."""
        return [selector(name, self.matchers) for name in self.names]


def _unique(names: Iterable[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(names))


def lyceum_series(exporter: Exporter, metric_names: Mapping[str, str]) -> tuple[str, ...]:
    """Every source series (renamed) of the Lyceum metrics read from `exporter`, in catalog order."""
    return _unique(
        rename(series, metric_names)
        for m in c.LYCEUM_METRICS
        if m.exporter is exporter
        for source in m.sources
        for series in source.series
    )


def node_uname_selector(hostname: str, options: HostPlanOptions) -> str:
    """`node_uname_info{nodename="host"}`: the look-up of a host's node-exporter instances."""
    return selector(rename(c.NODE_UNAME_INFO, options.metric_names), [eq(c.LABEL_NODENAME, hostname)])


def execution_selections(target: HostTarget, options: HostPlanOptions) -> list[Selection]:
    """What an execution's archive copies (`target.node_instances`: found through node_uname_info)."""
    dcgm = lyceum_series(Exporter.DCGM, options.metric_names)
    out = [
        Selection(dcgm, (eq(label, target.hostname), *group))
        for label in options.host_labels
        for group in gpu_groups(target.gpus)
    ]
    node = lyceum_series(Exporter.NODE, options.metric_names)
    out.append(Selection(node, (node_instance_matcher(target, options.node_match),)))
    uname = rename(c.NODE_UNAME_INFO, options.metric_names)
    out.append(Selection((uname,), (eq(c.LABEL_NODENAME, target.hostname),)))
    return out


def pod_series(metrics: Sequence[PodMetricDef], metric_names: Mapping[str, str]) -> tuple[set[str], set[str]]:
    """(DCGM series, other series) the pod plans of `metrics` may read, renamed; histogram metrics
    contribute the bucket series of every name discovery may choose."""
    dcgm: set[str] = set()
    app: set[str] = set()
    for m in metrics:
        if m.form in HISTOGRAM_FORMS:
            app.update(rename(n, metric_names) for n in histogram_sources(m))
            continue
        names = {rename(s, metric_names) for source in m.sources for s in source.series}
        (dcgm if m.form in DCGM_POD_FORMS else app).update(names)
    return dcgm, app


def pod_selections(
    namespace: str,
    name: str,
    metric_names: Mapping[str, str],
    node: str | None = None,
    gpus: Sequence[str] = (),
    host_labels: Sequence[str] = c.DCGM_HOST_LABELS,
) -> list[Selection]:
    """What a pod's archive copies: the series of every Run:ai pod and workload metricType (a Slurm
    job node's pod: also its node's GPUs by host and index, as its reads select them)."""
    dcgm, app = pod_series((*c.POD_METRICS, *c.WORKLOAD_METRICS), metric_names)
    indices = tuple(g for g in gpus if g.isdigit())
    hosts = ((node, indices),) if node and read_by_host(namespace, node, indices) else ()
    target = PodTarget(((namespace, name),), hosts)
    # the same label pair may serve both (dcgm-exporter scraped with honor_labels: namespace/pod)
    groups: dict[tuple[Matcher, ...], set[str]] = {}
    for alternative in dcgm_pod_alternatives(target, None, host_labels):
        groups.setdefault(tuple(alternative), set()).update(dcgm)
    for alternative in app_alternatives(target):
        groups.setdefault(tuple(alternative), set()).update(app)
    return [Selection(tuple(sorted(names)), matchers) for matchers, names in groups.items()]
