"""Registry.list_pods_overlapping on SQLite and PostgreSQL: the pods whose lifetime meets a range."""

from __future__ import annotations

from datetime import timedelta

from gpulens.domain.workloads import PodPhase
from gpulens.storage.registry import Registry
from tests.storage.test_workloads_registry import T0, W1, W2, pod, wl

H = timedelta(hours=1)


def test_overlap_bounds_and_count(registry: Registry) -> None:
    pods = {
        "old": pod(name="old", start_time=T0 - 10 * H, end_time=T0 - 9 * H, phase=PodPhase.SUCCEEDED),
        "ends-at-start": pod(name="ends-at-start", start_time=T0 - 2 * H, end_time=T0),
        "running": pod(name="running", start_time=T0 - H),
        "inside": pod(name="inside", start_time=T0 + H, end_time=T0 + 2 * H),
        "starts-at-end": pod(name="starts-at-end", start_time=T0 + 3 * H),
        "later": pod(name="later", start_time=T0 + 4 * H),
        "pending": pod(name="pending", start_time=None, phase=PodPhase.PENDING),
        "no-start-ended": pod(name="no-start-ended", start_time=None, end_time=T0 - H),
    }
    registry.upsert_workload(wl(), list(pods.values()), now=T0)
    registry.upsert_workload(wl(W2), [pod(workload_id=W2, name="other", start_time=T0)], now=T0)

    found, total = registry.list_pods_overlapping(W1, T0, T0 + 3 * H, limit=100)
    names = [p.name for p in found]
    # list_pods' order: by start time (unstarted last), then name
    assert names == ["ends-at-start", "running", "inside", "starts-at-end", "pending"]
    assert total == 5

    found, total = registry.list_pods_overlapping(W1, T0, T0 + 3 * H, limit=2)
    assert [p.name for p in found] == ["ends-at-start", "running"] and total == 5
    found, total = registry.list_pods_overlapping(W1, T0 - 20 * H, T0 - 15 * H, limit=10)
    # unknown starts are unbounded: a pod that ended later than the range may have run in it
    assert [p.name for p in found] == ["no-start-ended", "pending"] and total == 2
