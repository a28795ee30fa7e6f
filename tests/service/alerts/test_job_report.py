"""The job-end report (service/alerts/job_report.py): built from the summary route's documents, sent
to the owner's per-user channels and the channels named, rendered as text for chat and mail."""

from __future__ import annotations

from datetime import UTC, datetime

from gpulens.domain.alerts import Channel, ChannelType, EventType
from gpulens.service.alerts.job_report import execution_part, report_channels, report_event
from gpulens.service.alerts.payloads import apprise_notify_type, message, title

NOW = datetime(2026, 12, 2, 10, 0, tzinfo=UTC)


def doc(execution_id: str, hostname: str, idle: float, cost: float | None) -> dict[str, object]:
    """A summary document as the route answers it (the fields the report reads)."""
    return {
        "executionId": execution_id,
        "hostname": hostname,
        "gpus": ["0", "1"],
        "timeRange": {"start": "2026-12-02T08:00:00Z", "end": "2026-12-02T10:00:00Z"},
        "gpuTime": {"total": 4.0, "active": 4.0 - idle, "idle": 0.0, "idleHeld": idle, "inputBound": 0.5,
                    "throttled": 0.0},
        "cost": None if cost is None else {"total": cost, "currency": "EUR"},
        "findings": [
            {"kind": "no_data", "severity": "info", "impact": {"gpuHours": 0.0, "cost": None}},
            {"kind": "input_bound", "severity": "warning", "start": "s", "end": "e", "message": "m",
             "impact": {"gpuHours": 0.5, "cost": 1.0}},
            {"kind": "idle_held", "severity": "critical", "start": "s", "end": "e", "message": "held",
             "impact": {"gpuHours": idle, "cost": 2.0}},
        ],
    }  # fmt: skip


def test_the_report_of_a_two_node_job() -> None:
    parts = [
        execution_part(doc("e1", "n1", 1.5, 10.0), "n1", "https://gpulens.example/"),
        execution_part(doc("e2", "n2", 0.25, None), "n2", None),
    ]
    event = report_event("acme", "alice", {"cluster": "hpc", "id": "12"}, parts, NOW)
    assert event.type is EventType.JOB_REPORT and event.execution_id is None and event.org == "acme"
    p = event.payload
    assert p["user"] == "alice" and p["job"] == {"cluster": "hpc", "id": "12"}
    assert (p["type"], p["id"], p["org"], p["timestamp"]) == (
        "execution.report",
        event.event_id,
        "acme",
        "2026-12-02T10:00:00Z",
    )
    assert p["totals"]["gpuHours"] == 8.0 and p["totals"]["idleHeldGpuHours"] == 1.75
    assert p["totals"]["cost"] == 10.0 and p["totals"]["currency"] == "EUR"  # the priced part only
    first = p["executions"][0]
    assert [f["kind"] for f in first["findings"]] == ["idle_held", "input_bound"]  # by GPU-hours, none at 0
    assert first["url"] == "https://gpulens.example/ui/executions/e1" and p["executions"][1]["url"] is None
    assert title(event) == "gpulens: report of Slurm job 12 on hpc (2 nodes)"
    text = message(event)
    assert "In all: 8.00 GPU-hours, 10.00 EUR (of which idle with memory held 1.75, input-bound 1.00)" in text
    assert (
        "- n1 (e1): 4.00 GPU-hours, 10.00 EUR" in text and "  - idle_held: 1.50 GPU-hours, 2.00 EUR" in text
    )
    assert "https://gpulens.example/ui/executions/e1" in text
    assert apprise_notify_type(event) == "info"
    one = report_event("acme", None, None, parts[:1], NOW)
    assert one.execution_id == "e1" and title(one) == "gpulens: report of execution e1"


def test_where_it_goes() -> None:
    def channel(cid: str, url: str, kind: ChannelType = ChannelType.WEBHOOK, off: bool = False) -> Channel:
        return Channel(cid, "acme", kind, url, disabled_at=NOW if off else None)

    mine = channel("chn_user", "https://hooks.example/u/{user}")
    team = channel("chn_team", "https://hooks.example/team")
    am = channel("chn_am", "http://am:9093", ChannelType.ALERTMANAGER)
    off = channel("chn_off", "https://hooks.example/old/{user}", off=True)
    channels = [mine, team, am, off]
    assert report_channels(channels, "alice", []) == [mine]  # the owner's per-user channels, not disabled
    assert report_channels(channels, None, []) == []  # no owner: no per-user channel applies
    assert report_channels(channels, "alice", ["chn_team", "chn_am", "nope"]) == [mine, team]
    assert report_channels(channels, None, ["chn_team"]) == [team]
