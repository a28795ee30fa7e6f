"""Usage digests, unit by unit (service/alerts/digest.py, docs/alerts.md "Digests"): the rule's
validation, its periods, the payloads per user and the copy, the per-user channels' URLs and texts."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import anyio
import httpx
import orjson
import pytest

from gpulens.domain.alerts import DIGEST, AlertEvent, AlertRule, Channel, ChannelType, EventType
from gpulens.domain.errors import InvalidParameter, InvalidRequest
from gpulens.domain.models import Execution, ExecutionStatus
from gpulens.domain.timeparse import datetime_to_ms
from gpulens.service.alerts import payloads
from gpulens.service.alerts.deliver import TEST_USER, Deliverer, DeliveryOptions, user_url
from gpulens.service.alerts.digest import (
    DAY_MS,
    HOUR_MS,
    Digest,
    anchor_ms,
    build_digest,
    due_period,
    events_for,
)
from gpulens.service.alerts.rules import AlertService
from gpulens.storage.alerts import AlertStore
from gpulens.storage.digests import ExecutionUsage
from gpulens.storage.registry import Registry

NOW = datetime(2026, 12, 2, 10, 0, tzinfo=UTC)
SECRET = "whsec_" + "A" * 43 + "="


def run(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    async def call() -> Any:
        return await fn(*args, **kwargs)

    return anyio.run(call)


@pytest.fixture
def service(registry: Registry) -> AlertService:
    registry.ensure_org("acme")
    registry.ensure_org("beta")
    return AlertService(AlertStore(registry), clock=lambda: NOW)


def channel(service: AlertService, org: str = "acme", **fields: Any) -> Channel:
    fields.setdefault("type", "webhook")
    fields.setdefault("url", "https://hooks.example.com/gpulens")
    made: Channel = run(service.create_channel, org, **fields)
    return made


# ------------------------------------------------------------------ validation


def test_a_digest_rule_reads_back_with_its_period_and_threshold(service: AlertService) -> None:
    copy = channel(service)
    mail = channel(service, type="apprise", url="mailtos://user:pw@smtp.example.org?to={user}@example.org")
    rule = run(
        service.create_rule,
        "acme",
        kind="digest",
        every="7d",
        min_idle_gpu_hours=24,
        channels=[copy.channel_id, mail.channel_id],
        match={"project": "nlp"},
    )
    assert rule.kind == DIGEST and rule.is_digest
    assert (rule.every_ms, rule.min_idle_gpu_hours, rule.for_ms) == (7 * DAY_MS, 24.0, 0)
    assert rule.severity == "info" and rule.action is None and rule.match == {"project": "nlp"}
    (stored,) = run(service.list_rules, "acme")
    assert (stored.every_ms, stored.min_idle_gpu_hours, stored.kind) == (7 * DAY_MS, 24.0, DIGEST)
    # without a threshold: every user with usage in the period
    plain = run(service.create_rule, "acme", kind="digest", every="1h", channels=[copy.channel_id])
    assert plain.min_idle_gpu_hours == 0.0


def test_digest_fields_are_checked(service: AlertService) -> None:
    hook = channel(service)
    am = channel(service, type="alertmanager", url="http://am.example:9093")
    personal = channel(service, url="https://hooks.example.com/digest/{user}")
    other = channel(service, "beta")
    ok = {"kind": "digest", "every": "7d", "channels": [hook.channel_id]}
    cases: list[tuple[dict[str, Any], str, str]] = [
        ({**ok, "every": None}, "every", "duration"),
        ({**ok, "every": "30m"}, "every", "at least 1h"),
        ({**ok, "every": "0s"}, "every", "positive"),
        ({**ok, "every": "45d"}, "every", "at most"),
        ({**ok, "every": "weekly"}, "every", "every"),
        ({**ok, "min_idle_gpu_hours": -1}, "min_idle_gpu_hours", "between 0"),
        ({**ok, "min_idle_gpu_hours": True}, "min_idle_gpu_hours", "number"),
        ({**ok, "min_idle_gpu_hours": "24"}, "min_idle_gpu_hours", "number"),
        ({**ok, "min_idle_gpu_hours": float("nan")}, "min_idle_gpu_hours", "number"),
        ({**ok, "for_": "1h"}, "for", "no `for`"),
        ({**ok, "action": {"type": "stop", "after": "1h"}}, "action", "no action"),
        ({**ok, "channels": [am.channel_id]}, "channels", "Alertmanager"),
        ({**ok, "channels": [other.channel_id]}, "channels", "not a channel of this organization"),
        ({**ok, "channels": []}, "channels", "non-empty"),
        ({**ok, "match": {"user": "bad user"}}, "match.user", "match.user"),
        ({**ok, "match": {"queue": "x"}}, "match", "unknown field"),
        ({**ok, "severity": "loud"}, "severity", "one of"),
        # a finding rule takes no digest field, and no per-user channel
        ({"kind": "idle", "for_": "1h", "every": "1d", "channels": [hook.channel_id]}, "every", "digest"),
        (
            {"kind": "idle", "for_": "1h", "min_idle_gpu_hours": 1, "channels": [hook.channel_id]},
            "min_idle_gpu_hours",
            "digest",
        ),
        ({"kind": "idle", "channels": [hook.channel_id]}, "for", "required"),
        ({"kind": "idle", "for_": "1h", "channels": [personal.channel_id]}, "channels", "per-user"),
        ({"kind": "digests", "every": "1d", "channels": [hook.channel_id]}, "kind", "digest"),
    ]
    for fields, name, words in cases:
        with pytest.raises(InvalidParameter) as caught:
            run(service.create_rule, "acme", **fields)
        assert caught.value.name == name, fields
        assert words in caught.value.message, (fields, caught.value.message)
    assert run(service.list_rules, "acme") == []


def test_the_operators_file_takes_digest_rules(service: AlertService, tmp_path: Path) -> None:
    path = tmp_path / "alerts.toml"
    path.write_text(
        f"""
[[org]]
slug = "acme"
[[org.channel]]
id = "admins"
type = "webhook"
url = "https://hooks.example.com/digest"
secret = "{SECRET}"
[[org.channel]]
id = "users"
type = "apprise"
url = "mailtos://gpulens:pw@smtp.example.org?to={{user}}@example.org"
[[org.rule]]
kind = "digest"
every = "7d"
min_idle_gpu_hours = 24
channels = ["admins", "users"]
"""
    )
    service.load_defaults(path)
    (rule,) = run(service.list_rules, "acme")
    assert rule.is_digest and rule.every_ms == 7 * DAY_MS and rule.min_idle_gpu_hours == 24.0
    assert rule.channels == ("chn_file_acme_admins", "chn_file_acme_users")
    path.write_text(path.read_text().replace('every = "7d"', 'every = "10m"'))
    with pytest.raises(InvalidRequest) as caught:
        service.load_defaults(path)
    assert "org[0].rule[0]" in caught.value.message and "at least 1h" in caught.value.message


# ------------------------------------------------------------------ periods


def digest_rule(every_ms: int = 7 * DAY_MS, created: datetime = NOW, **kw: Any) -> AlertRule:
    fields: dict[str, Any] = {"channels": ("chn_copy", "chn_user"), "min_idle_gpu_hours": 2.0, **kw}
    return AlertRule("rul_d", "acme", DIGEST, 0, created_at=created, every_ms=every_ms, **fields)


def test_periods_are_aligned_on_the_creation_day_or_hour() -> None:
    created = datetime(2026, 12, 2, 14, 23, tzinfo=UTC)
    week = digest_rule(7 * DAY_MS, created)
    day0 = datetime_to_ms(datetime(2026, 12, 2, tzinfo=UTC))
    assert anchor_ms(week) == day0
    settle = 10 * 60_000
    # nothing before the first period ended and settled
    assert due_period(week, None, datetime_to_ms(created), settle) is None
    assert due_period(week, None, day0 + 7 * DAY_MS + settle - 1, settle) is None
    first = due_period(week, None, day0 + 7 * DAY_MS + settle, settle)
    assert first == (day0, day0 + 7 * DAY_MS)
    # sent: not again within the next period
    assert due_period(week, day0 + 7 * DAY_MS, day0 + 13 * DAY_MS, settle) is None
    assert due_period(week, day0 + 7 * DAY_MS, day0 + 14 * DAY_MS + settle, settle) == (
        day0 + 7 * DAY_MS,
        day0 + 14 * DAY_MS,
    )
    # after a long stop: only the latest ended period, no backlog
    assert due_period(week, day0 + 7 * DAY_MS, day0 + 40 * DAY_MS, settle) == (
        day0 + 28 * DAY_MS,
        day0 + 35 * DAY_MS,
    )
    hourly = digest_rule(90 * 60_000, created)  # not whole days: from the creation's hour
    hour0 = datetime_to_ms(datetime(2026, 12, 2, 14, tzinfo=UTC))
    assert anchor_ms(hourly) == hour0
    assert due_period(hourly, None, hour0 + 3 * HOUR_MS + settle, settle) == (
        hour0 + 90 * 60_000,
        hour0 + 180 * 60_000,
    )


# ------------------------------------------------------------------ payloads

START = datetime(2026, 11, 25, tzinfo=UTC)
START_MS = datetime_to_ms(START)
END_MS = START_MS + 7 * DAY_MS


def usage(
    execution_id: str,
    user: str | None,
    *,
    gpu_h: float,
    idle_h: float = 0.0,
    held_h: float = 0.0,
    input_h: float = 0.0,
    org: str = "acme",
    project: str | None = "nlp",
    cost: float | None = None,
    status: ExecutionStatus = ExecutionStatus.COMPLETED,
) -> ExecutionUsage:
    execution = Execution(
        execution_id=execution_id,
        org=org,
        hostname="gpu-a",
        gpus=("0",),
        status=status,
        created_at=START,
        start_time=START + timedelta(hours=1),
        end_time=None if status.is_active else START + timedelta(hours=30),
        user=user,
        project=project,
    )
    return ExecutionUsage(
        execution=execution,
        gpu_ms=gpu_h * HOUR_MS,
        useful_gpu_s=gpu_h * 1800,
        idle_ms=idle_h * HOUR_MS,
        idle_held_ms=held_h * HOUR_MS,
        input_bound_ms=input_h * HOUR_MS,
        throttled_ms=0.0,
        energy_j=gpu_h * 3_600_000,
        cost=cost,
    )


FLEET = [
    usage("a-1", "alice", gpu_h=10, idle_h=1, held_h=2, cost=20.0),
    usage("a-2", "alice", gpu_h=4, idle_h=3, cost=8.0),
    usage("a-3", "alice", gpu_h=5, input_h=1),
    usage("a-4", "alice", gpu_h=2),  # wasted nothing: never among the worst
    usage("b-1", "bob", gpu_h=8, idle_h=0.5, cost=16.0, status=ExecutionStatus.RUNNING),
    usage("n-1", None, gpu_h=6, idle_h=6),  # no user: in the table, never notified
    usage("c-1", "carol", gpu_h=9, idle_h=9, project="vision"),  # another project
    usage("z-1", "alice", gpu_h=99, idle_h=99, org="beta"),  # another org: never counted
]


def test_each_user_over_the_threshold_gets_their_row_and_worst_executions() -> None:
    rule = digest_rule(match={"project": "nlp"})
    digest = build_digest(
        rule, FLEET, START_MS, END_MS, NOW, public_url="https://gpulens.example/", currency="EUR", worst=2
    )
    assert [user for user, _ in digest.users] == ["alice"]  # 6 idle GPU-h; bob 0.5 < 2
    ((_, alice),) = digest.users
    assert alice["type"] == "usage.digest" and alice["org"] == "acme" and alice["user"] == "alice"
    assert alice["period"] == {"start": "2026-11-25T00:00:00Z", "end": "2026-12-02T00:00:00Z"}
    assert alice["rule"] == {
        "id": "rul_d",
        "kind": "digest",
        "every": "7d",
        "min_idle_gpu_hours": 2.0,
        "match": {"project": "nlp"},
    }
    row = alice["usage"]
    assert row["group"] == {"user": "alice"} and row["executions"] == 4 and row["runningExecutions"] == 0
    assert row["gpuHours"] == pytest.approx(21)
    assert (row["idleGpuHours"], row["idleHeldGpuHours"], row["inputBoundGpuHours"]) == pytest.approx(
        (4, 2, 1)
    )
    assert row["cost"] == pytest.approx(28.0) and alice["currency"] == "EUR"
    assert [f["kind"] for f in row["topFindings"]] == ["idle", "idle_held", "input_bound"]
    # worst first by idle (with or without memory held) GPU-hours: a-1 (3) and a-2 (3) tie, then by waste
    worst = alice["worstExecutions"]
    assert [w["id"] for w in worst] == ["a-1", "a-2"]
    assert worst[0]["url"] == "https://gpulens.example/ui/executions/a-1"
    assert worst[0]["idleHeldGpuHours"] == pytest.approx(2) and worst[0]["project"] == "nlp"
    link = urlsplit(alice["url"])
    assert link.path == "/" and parse_qs(link.query) == {
        "user": ["alice"],
        "start": ["2026-11-25T00:00:00Z"],
        "end": ["2026-12-02T00:00:00Z"],
        "order": ["worst"],
    }
    # nothing of another org or another project
    text = orjson.dumps([alice, digest.copy]).decode()
    assert "z-1" not in text and "c-1" not in text and "carol" not in text


def test_the_copy_has_the_whole_table_and_says_who_was_notified() -> None:
    rule = digest_rule(match={"project": "nlp"})
    copy = build_digest(rule, FLEET, START_MS, END_MS, NOW).copy
    assert copy["user"] is None and copy["notified"] == ["alice"]
    table = [(u["group"]["user"], u["notified"], u["executions"]) for u in copy["users"]]
    # by idle GPU-hours, largest first (as Job Defense Shield sorts its table), then by GPU-hours
    assert table == [("alice", True, 4), (None, False, 1), ("bob", False, 1)]
    assert copy["users"][2]["runningExecutions"] == 1
    totals = copy["totals"]
    assert totals["group"] == {} and totals["executions"] == 6
    assert totals["gpuHours"] == pytest.approx(10 + 4 + 5 + 2 + 8 + 6)
    assert totals["cost"] == pytest.approx(44.0)
    assert [w["id"] for w in copy["worstExecutions"]][:3] == ["n-1", "a-1", "a-2"]
    assert copy["url"].startswith("/ui/usage?group_by=user&start=2026-11-25")
    # a threshold of 0: every named user with usage
    everyone = build_digest(digest_rule(min_idle_gpu_hours=0.0), FLEET, START_MS, END_MS, NOW)
    assert [u for u, _ in everyone.users] == ["carol", "alice", "bob"]


def test_users_go_to_per_user_channels_and_the_copy_to_the_others() -> None:
    rule = digest_rule(channels=("chn_copy", "chn_user", "chn_gone", "chn_am"))
    channels = [
        Channel("chn_copy", "acme", ChannelType.WEBHOOK, "https://hooks.example.com/digest", SECRET),
        Channel("chn_user", "acme", ChannelType.APPRISE, "mailtos://u:p@mail.example.org?to={user}"),
        # turned into Alertmanager by the operator's file after the rule was made: skipped
        Channel("chn_am", "acme", ChannelType.ALERTMANAGER, "http://am.example:9093"),
    ]
    digest = build_digest(rule, FLEET, START_MS, END_MS, NOW)
    events = events_for(rule, digest, channels, NOW)
    users = [(e.payload["user"], targets) for e, targets in events]
    assert users == [("carol", ["chn_user"]), ("alice", ["chn_user"]), (None, ["chn_copy"])]
    for e, _ in events:
        assert e.type is EventType.DIGEST and e.payload["id"] == e.event_id and e.rule_id == "rul_d"
    assert len({e.event_id for e, _ in events}) == 3
    # no per-user channel: the copy only
    only_copy = events_for(digest_rule(channels=("chn_copy",)), digest, channels, NOW)
    assert [e.payload["user"] for e, _ in only_copy] == [None]
    assert events_for(rule, Digest([], {"user": None}), channels[1:], NOW) == []


def test_a_user_name_cannot_change_the_urls_structure() -> None:
    url = "https://hooks.example.com/digest/{user}?to={user}&x=1"
    assert user_url(url, "alice") == "https://hooks.example.com/digest/alice?to=alice&x=1"
    filled = user_url(url, "a.b+c@example.org")
    assert filled == "https://hooks.example.com/digest/a.b%2Bc%40example.org?to=a.b%2Bc%40example.org&x=1"
    assert parse_qs(urlsplit(filled).query) == {"to": ["a.b+c@example.org"], "x": ["1"]}
    mail = user_url("mailtos://u:p@smtp.example.org?to={user}@example.org", "bob")
    assert mail == "mailtos://u:p@smtp.example.org?to=bob@example.org"


def test_texts_of_a_digest() -> None:
    rule = digest_rule(match={"project": "nlp"})
    digest = build_digest(rule, FLEET, START_MS, END_MS, NOW, public_url="https://g.example", currency="EUR")
    ((_, alice),) = digest.users
    event = AlertEvent("evt_1", "acme", EventType.DIGEST, NOW, None, "rul_d", {"id": "evt_1", **alice})
    assert payloads.title(event) == "gpulens: your GPU usage, 2026-11-25 to 2026-12-02 UTC"
    text = payloads.message(event)
    assert text.startswith("alice, 2026-11-25 to 2026-12-02 UTC: 21.0 GPU-hours: 4.0 idle, 2.0 idle with")
    assert "cost 28.00 EUR" in text
    assert "- a-1 on gpu-a: 3.0 idle of 10.0 GPU-hours https://g.example/ui/executions/a-1" in text
    assert payloads.apprise_notify_type(event) == "info"
    copy = AlertEvent("evt_2", "acme", EventType.DIGEST, NOW, None, "rul_d", {"id": "evt_2", **digest.copy})
    assert payloads.title(copy) == "gpulens: GPU usage digest of acme, 2026-11-25 to 2026-12-02 UTC"
    lines = payloads.message(copy).splitlines()
    assert "Users by idle GPU-hours (notified: 2 or more):" in lines
    assert "- alice: 6.0 idle of 21.0 GPU-hours; cost 28.00 EUR (notified)" in lines
    assert "- (no user): 6.0 idle of 6.0 GPU-hours" in lines
    empty = build_digest(rule, [], START_MS, END_MS, NOW).copy
    quiet = AlertEvent("evt_3", "acme", EventType.DIGEST, NOW, None, "rul_d", {"id": "evt_3", **empty})
    assert "No GPU usage in the period." in payloads.message(quiet)


async def test_a_per_user_channel_is_sent_to_at_the_users_url(registry: Registry) -> None:
    seen: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(204)

    personal = Channel("chn_u", "acme", ChannelType.WEBHOOK, "https://hooks.example.com/d/{user}", SECRET)
    registry_free = DeliveryOptions(timeout_s=2.0)
    async with Deliverer(
        AlertStore(registry), options=registry_free, transport=httpx.MockTransport(answer)
    ) as deliverer:
        body = {"type": "usage.digest", "id": "evt_1", "user": "a+b@example.org"}
        event = AlertEvent("evt_1", "acme", EventType.DIGEST, NOW, None, "rul_d", body)
        assert (await deliverer.attempt(personal, event)).ok
        assert str(seen[-1].url) == "https://hooks.example.com/d/a%2Bb%40example.org"
        copy = AlertEvent("evt_2", "acme", EventType.DIGEST, NOW, None, "rul_d", {**body, "user": None})
        refused = await deliverer.attempt(personal, copy)
        assert not refused.ok and "per-user channel" in (refused.error or "") and len(seen) == 1
        ok, error = await deliverer.send_test(personal)
        assert (ok, error) == (True, None)
        assert str(seen[-1].url) == f"https://hooks.example.com/d/{TEST_USER}"
