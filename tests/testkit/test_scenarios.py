"""gpulens_testkit.scenarios: which hosts' node-exporter is found only through node_uname_info."""

from __future__ import annotations

from gpulens.demo.scenario import default_scenario
from gpulens_testkit.scenarios import bench_scenario, node_found_by_uname_only


def test_node_found_by_uname_only_when_instance_does_not_name_the_host() -> None:
    node1, node2, cpu1 = default_scenario().hosts
    assert [node_found_by_uname_only(h) for h in (node1, node2, cpu1)] == [False, True, False]
    assert not any(node_found_by_uname_only(h) for h in bench_scenario(days=0.25).hosts)
