"""Settings become plan options at one place: GPULENS_DCGM_HOST_LABEL reaches the host and the pod plans."""

from __future__ import annotations

from gpulens.config import Settings
from gpulens.domain import catalog as c
from gpulens.service.wiring import archive_options, plan_options, pod_plan_options


def test_the_dcgm_host_label_reaches_every_plan() -> None:
    auto = Settings(_env_file=None)  # type: ignore[call-arg]
    assert plan_options(auto).host_labels == pod_plan_options(auto).host_labels == c.DCGM_HOST_LABELS
    named = Settings(_env_file=None, dcgm_host_label="node")  # type: ignore[call-arg]
    assert plan_options(named).host_labels == pod_plan_options(named).host_labels == ("node",)
    assert archive_options(named).pod.host_labels == ("node",)
