"""Pod summary helpers: how per-GPU series are named, and the run status a pod stands for."""

from __future__ import annotations

from datetime import UTC, datetime

from gpulens.domain.workloads import Pod, PodPhase
from gpulens.service.pod_summary import gpu_name, pod_status


def test_mig_instances_are_entries_of_their_own() -> None:
    assert gpu_name({"gpu": "0"}) == "0"
    assert gpu_name({"gpu": "0", "gpuInstance": "1"}) == "0/1"
    assert gpu_name({"gpu": "0", "gpuInstance": "2"}) == "0/2"
    assert gpu_name({}) == ""


def test_a_failed_pod_is_a_failed_run() -> None:
    start = datetime(2026, 1, 1, tzinfo=UTC)

    def pod(phase: PodPhase) -> Pod:
        return Pod("p", "w", "name", "ns", "node", (), phase, start)

    assert pod_status(pod(PodPhase.FAILED), 1) == "failed"
    assert pod_status(pod(PodPhase.SUCCEEDED), 1) == "completed"
    assert pod_status(pod(PodPhase.RUNNING), None) == "running"
