"""An archive holds every series a plan could read: each selector of every Lyceum and Run:ai plan is
covered by one of the archive's selections (same name, a subset of its matchers)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from gpulens.backends.embedded.promql import (
    Aggregate,
    Binary,
    Call,
    Expr,
    MatrixSelector,
    VectorSelector,
    parse,
)
from gpulens.domain import catalog as c
from gpulens.domain.models import Window
from gpulens.planning.archive import Selection, execution_selections, pod_selections
from gpulens.planning.hosts import HostPlanOptions, HostTarget, plan_host
from gpulens.planning.pods import PodPlanOptions, PodTarget, histogram_sources, plan_pod_metric
from gpulens.planning.promql import rename

UUID = "GPU-5f0a1b2c-3d4e-5f60-7182-93a4b5c6d7e8"


def selectors(expr: Expr) -> Iterator[VectorSelector]:
    if isinstance(expr, VectorSelector):
        yield expr
    elif isinstance(expr, MatrixSelector):
        yield expr.vector
    elif isinstance(expr, Aggregate):
        yield from selectors(expr.expr)
    elif isinstance(expr, Binary):
        yield from selectors(expr.lhs)
        yield from selectors(expr.rhs)
    elif isinstance(expr, Call):
        for arg in expr.args:
            yield from selectors(arg)


def covered(sel: VectorSelector, archive: list[Selection]) -> bool:
    wanted = set(sel.matchers)
    for a in archive:
        have = {(m.label, m.op, m.value) for m in a.matchers}
        if sel.name in a.names and have <= wanted:
            return True
    return False


NAMES = {
    c.DCGM_GPU_UTIL: "dcgm_util_renamed",
    c.NODE_CPU_SECONDS: "cpu_seconds",
    c.VLLM_TTFT + "_bucket": "ttft_b",
}


@pytest.mark.parametrize("gpus", [(), ("0", "3"), (UUID,), ("1", UUID)])
@pytest.mark.parametrize(
    "options",
    [
        HostPlanOptions(),
        HostPlanOptions(host_labels=("hostname",), node_match="instance", metric_names=NAMES),
        HostPlanOptions(node_match="nodename"),
    ],
)
def test_every_lyceum_selector_is_archived(gpus: tuple[str, ...], options: HostPlanOptions) -> None:
    target = HostTarget("gpu-node-1", gpus, ("10.0.0.5:9100",))
    archive = execution_selections(target, options)
    seen = 0
    for step in (1_000, 15_000, 3_600_000):
        for planned in plan_host(c.LYCEUM_METRICS, target, step, options):
            if planned.expr is None:
                continue
            for sel in selectors(parse(planned.expr)):
                assert covered(sel, archive), (planned.metric.key, sel)
                seen += 1
    # the instance look-up the service makes through node_uname_info is archived too
    uname = parse(f'{rename(c.NODE_UNAME_INFO, options.metric_names)}{{nodename="gpu-node-1"}}')
    assert isinstance(uname, VectorSelector) and covered(uname, archive)
    assert seen > 3 * len(c.LYCEUM_METRICS)


def test_execution_selections_name_series_once_per_alternative() -> None:
    archive = execution_selections(HostTarget("h", ("0",)), HostPlanOptions())
    assert [s.matchers[0].label for s in archive[:2]] == list(c.DCGM_HOST_LABELS)
    assert archive[0].match.startswith('{__name__=~"DCGM_FI_DEV_GPU_UTIL|')
    assert archive[-1].match == 'node_uname_info{nodename="h"}'
    assert all(len(set(s.names)) == len(s.names) for s in archive)
    assert archive[0].per_name()[0] == 'DCGM_FI_DEV_GPU_UTIL{Hostname="h",gpu=~"0"}'


@pytest.mark.parametrize("metric_names", [{}, NAMES])
def test_every_runai_selector_is_archived(metric_names: dict[str, str]) -> None:
    options = PodPlanOptions(metric_names=metric_names)
    archive = pod_selections("team-a", "train-0", metric_names)
    target = PodTarget.one("team-a", "train-0")
    grid = Window(1_767_225_600_000, 1_767_229_200_000, 60_000)
    seen = 0
    for metric in (*c.POD_METRICS, *c.WORKLOAD_METRICS):
        candidates = [rename(n, metric_names) for n in histogram_sources(metric)] or [None]
        for histogram in candidates:
            for query in plan_pod_metric(metric, target, grid, 60_000, options, histogram):
                for sel in selectors(parse(query.expr)):
                    assert covered(sel, archive), (metric.type, sel)
                    seen += 1
    assert seen > len(c.POD_METRICS)
    assert len(archive) == 2  # exported_* (DCGM) and namespace/pod (DCGM with honor_labels, the rest)
