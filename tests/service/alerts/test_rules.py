"""AlertService (service/alerts/rules.py): validation of rules and channels, one org's rows only,
snoozes, deliveries, and the operator's default file (GPULENS_ALERTS)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import anyio
import pytest

from gpulens.domain.alerts import AlertEvent, Channel, ChannelType, DeliveryStatus, EventType, StopAction
from gpulens.domain.errors import Conflict, Forbidden, InvalidParameter, InvalidRequest, NotFound, Overloaded
from gpulens.domain.models import Execution, ExecutionStatus, Principal
from gpulens.service.alerts.rules import AlertService, display_url
from gpulens.storage.alerts import AlertStore, Episode
from gpulens.storage.registry import Registry

NOW = datetime(2026, 12, 2, 10, 0, tzinfo=UTC)
SECRET = "whsec_" + "A" * 43 + "="  # the base64 of 32 bytes


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
    created: Channel = run(service.create_channel, org, **fields)
    return created


def rule_fields(**fields: Any) -> dict[str, Any]:
    return {"kind": "idle_held", "for_": "30m", **fields}


# ------------------------------------------------------------------ channels


def test_a_webhook_without_a_secret_gets_one_and_lists_keep_it_hidden(service: AlertService) -> None:
    made = channel(service)
    assert made.secret is not None and made.secret.startswith("whsec_")
    assert made.channel_id.startswith("chn_")
    listed = run(service.list_channels, "acme")
    assert [c.channel_id for c in listed] == [made.channel_id]
    assert run(service.list_channels, "beta") == []


def test_channel_fields_are_checked(service: AlertService) -> None:
    cases: list[tuple[dict[str, Any], str]] = [
        ({"type": "sms", "url": "https://x.example"}, "type"),
        ({"type": "webhook", "url": "ftp://x.example/"}, "url"),
        ({"type": "webhook", "url": "https://user:pw@x.example/"}, "url"),
        ({"type": "webhook", "url": "https://x.example/ a"}, "url"),
        ({"type": "alertmanager", "url": "not a url"}, "url"),
        ({"type": "apprise", "url": "slack"}, "url"),
        ({"type": "webhook", "url": "https://x.example", "secret": "s3cret"}, "secret"),
        ({"type": "webhook", "url": "https://x.example", "secret": "whsec_short"}, "secret"),
        ({"type": "alertmanager", "url": "https://am.example", "secret": SECRET}, "secret"),
    ]
    for fields, name in cases:
        with pytest.raises(InvalidParameter) as caught:
            run(service.create_channel, "acme", **fields)
        assert caught.value.name == name, fields
        assert "s3cret" not in str(caught.value.raw)  # a refused secret is never echoed


def test_channel_kinds_and_their_urls(service: AlertService) -> None:
    hook = channel(service, secret=SECRET)
    assert hook.secret == SECRET
    am = channel(service, type="alertmanager", url="http://alertmanager:9093")
    assert am.type is ChannelType.ALERTMANAGER and am.secret is None
    apprise = channel(service, type="apprise", url="slack://TokenA/TokenB/TokenC/#ops")
    assert display_url(apprise) == "slack://…"
    tokened = channel(service, url="https://hooks.example.com/x?token=abc")
    assert display_url(tokened) == "https://hooks.example.com/x?…"
    assert channel(service, url="http://127.0.0.1:65535/hook").url.endswith(":65535/hook")  # 5 digits
    with pytest.raises(InvalidRequest):
        channel(service, url="http://127.0.0.1:65536/hook")


def test_deleting_a_channel_a_rule_uses_is_a_conflict_naming_the_rule(service: AlertService) -> None:
    used = channel(service)
    rule = run(service.create_rule, "acme", **rule_fields(channels=[used.channel_id]))
    with pytest.raises(Conflict) as caught:
        run(service.delete_channel, "acme", used.channel_id)
    assert rule.rule_id in caught.value.message
    run(service.delete_rule, "acme", rule.rule_id)
    assert run(service.delete_channel, "acme", used.channel_id).channel_id == used.channel_id
    assert run(service.list_channels, "acme") == []


def test_another_orgs_channel_is_not_found(service: AlertService) -> None:
    theirs = channel(service, "beta")
    for call in (service.get_channel, service.delete_channel, service.test_channel):
        with pytest.raises(NotFound) as caught:
            run(call, "acme", theirs.channel_id)
        assert caught.value.message == "Alert channel not found"
    with pytest.raises(NotFound):
        run(service.get_channel, "acme", "chn_" + "x" * 100)


def test_testing_a_channel_needs_a_sender(service: AlertService) -> None:
    made = channel(service)
    with pytest.raises(Overloaded, match="delivery is not running"):
        run(service.test_channel, "acme", made.channel_id)
    seen: list[Channel] = []

    async def tester(target: Channel) -> tuple[bool, str | None]:
        seen.append(target)
        return False, "HTTP 500"

    service.tester = tester
    assert run(service.test_channel, "acme", made.channel_id) == (False, "HTTP 500")
    assert seen[0].secret == made.secret  # the sender signs with it

    async def works(target: Channel) -> tuple[bool, str | None]:
        return True, None

    when = datetime(2026, 1, 1, tzinfo=UTC)
    service.store.channel_failed(made.channel_id, when, timedelta(0))
    service.store.channel_failed(made.channel_id, when, timedelta(0))  # disabled
    service.tester = works
    assert run(service.test_channel, "acme", made.channel_id) == (True, None)
    enabled = run(service.get_channel, "acme", made.channel_id)
    assert enabled.disabled_at is None and enabled.failing_since is None  # a success enables it again


# ------------------------------------------------------------------ rules


def test_a_rule_is_checked_and_stored(service: AlertService) -> None:
    ops = channel(service)
    rule = run(
        service.create_rule,
        "acme",
        **rule_fields(
            for_="1h30m",
            channels=[ops.channel_id, ops.channel_id],
            action={"type": "stop", "after": "2h"},
            match={"project": "nlp", "hostname": None, "user": "alice@example.com"},
        ),
    )
    assert rule.for_ms == 90 * 60_000
    assert rule.channels == (ops.channel_id,)
    assert rule.action == StopAction(2 * 3_600_000)
    assert rule.match == {"project": "nlp", "user": "alice@example.com"}
    assert rule.matches({"project": "nlp", "user": "alice@example.com", "hostname": "n1"})
    assert not rule.matches({"project": "nlp", "user": "bob", "hostname": "n1"})
    assert rule.severity == "warning"  # the kind's own
    assert rule.created_at == NOW
    assert run(service.list_rules, "acme") == [rule]
    assert run(service.list_rules, "beta") == []
    critical = run(
        service.create_rule,
        "acme",
        **rule_fields(kind="idle", channels=[ops.channel_id], severity="critical"),
    )
    assert critical.severity == "critical"


@pytest.mark.parametrize(
    ("fields", "name", "words"),
    [
        ({"kind": "bored"}, "kind", "must be one of"),
        ({"for_": "soon"}, "for", "invalid duration"),
        ({"for_": "0s"}, "for", "positive"),
        ({"for_": "31d"}, "for", "at most 30d"),
        ({"severity": "loud"}, "severity", "must be one of"),
        ({"channels": []}, "channels", "non-empty"),
        ({"channels": "chn_x"}, "channels", "non-empty"),
        ({"channels": ["chn_missing"]}, "channels", "'chn_missing' is not a channel of this organization"),
        ({"action": {"type": "kill"}}, "action", "stop"),
        ({"action": {"type": "stop", "after": "40d"}}, "action.after", "at most"),
        ({"match": {"gpu": "0"}}, "match", "unknown field 'gpu'"),
        ({"match": {"hostname": "bad host"}}, "match.hostname", "host name"),
        ({"match": {"user": "al ice"}}, "match.user", "user name"),
        ({"match": {"hardware_profile": "a\nb"}}, "match.hardware_profile", "control"),
    ],
)
def test_rule_fields_are_checked(
    service: AlertService, fields: dict[str, Any], name: str, words: str
) -> None:
    ops = channel(service)
    given = rule_fields(**{"channels": [ops.channel_id], **fields})
    with pytest.raises(InvalidParameter) as caught:
        run(service.create_rule, "acme", **given)
    assert caught.value.name == name
    assert words in caught.value.message


def test_a_rule_cannot_name_another_orgs_channel(service: AlertService) -> None:
    theirs = channel(service, "beta")
    with pytest.raises(InvalidParameter, match="not a channel of this organization"):
        run(service.create_rule, "acme", **rule_fields(channels=[theirs.channel_id]))


def test_another_orgs_rule_is_not_found(service: AlertService) -> None:
    theirs = run(service.create_rule, "beta", **rule_fields(channels=[channel(service, "beta").channel_id]))
    with pytest.raises(NotFound, match="Alert rule not found"):
        run(service.delete_rule, "acme", theirs.rule_id)
    assert run(service.list_rules, "beta") == [theirs]


def test_project_keys_manage_no_alerts() -> None:
    assert AlertService.org_for(Principal(org="acme", subject="k")) == "acme"
    with pytest.raises(Forbidden):
        AlertService.org_for(Principal(org="acme", subject="k", projects=frozenset({"nlp"})))


# ------------------------------------------------------------------ snoozes


def add_execution(registry: Registry, execution_id: str, org: str) -> None:
    registry.upsert_execution(
        Execution(
            execution_id=execution_id,
            org=org,
            hostname="gpu-node-1",
            gpus=("0",),
            status=ExecutionStatus.RUNNING,
            created_at=NOW - timedelta(hours=1),
        )
    )


def test_snooze(service: AlertService, registry: Registry) -> None:
    add_execution(registry, "exec-1", "acme")
    add_execution(registry, "exec-2", "beta")
    until = NOW + timedelta(hours=4)
    assert run(service.snooze, "acme", "exec-1", until) == until
    assert service.store.snoozed_until(["exec-1"]) == {"exec-1": until}
    for execution_id in ("exec-2", "exec-nobody", "not an id"):
        with pytest.raises(NotFound, match="Execution not found"):
            run(service.snooze, "acme", execution_id, until)
    for when, words in ((NOW, "future"), (NOW + timedelta(days=31), "at most 30 days")):
        with pytest.raises(InvalidParameter, match=words):
            run(service.snooze, "acme", "exec-1", when)
    with pytest.raises(InvalidParameter):
        run(service.snooze, "acme", "exec-1", "tomorrow")


# ------------------------------------------------------------------ deliveries


def add_delivery(service: AlertService, org: str, channel_id: str) -> str:
    event = AlertEvent(
        event_id=f"evt_{org}_{channel_id[-6:]}",
        org=org,
        type=EventType.FIRING,
        created_at=NOW,
        execution_id=None,
        rule_id=None,
        payload={"type": "finding.firing"},
    )
    return service.store.add_event(event, [channel_id], NOW)[0].delivery_id


def test_deliveries_list_and_retry(service: AlertService) -> None:
    ours = add_delivery(service, "acme", channel(service).channel_id)
    theirs = add_delivery(service, "beta", channel(service, "beta").channel_id)
    service.store.delivery_done(
        ours, status=DeliveryStatus.FAILED, attempts=5, error="HTTP 500", next_attempt_at=None, now=NOW
    )
    assert [d.delivery_id for d in run(service.list_deliveries, "acme")] == [ours]
    assert run(service.list_deliveries, "acme", "pending") == []
    assert [d.delivery_id for d in run(service.list_deliveries, "acme", DeliveryStatus.FAILED)] == [ours]
    with pytest.raises(InvalidParameter):
        run(service.list_deliveries, "acme", "lost")
    retried = run(service.retry_delivery, "acme", ours)
    assert retried.status is DeliveryStatus.PENDING and retried.next_attempt_at == NOW
    with pytest.raises(NotFound, match="Delivery not found"):
        run(service.retry_delivery, "acme", theirs)


# ------------------------------------------------------------------ the operator's defaults

DEFAULTS = f"""
[[org]]
slug = "acme"

[[org.channel]]
id = "ops"
type = "webhook"
url = "https://hooks.example.com/gpulens"
secret = "{SECRET}"

[[org.channel]]
id = "chat"
type = "apprise"
url = "slack://TokenA/TokenB/TokenC"

[[org.rule]]
kind = "idle_held"
for = "30m"
channels = ["ops", "chat"]

[[org.rule]]
kind = "oom_suspected"
for = "5m"
channels = ["ops"]
severity = "critical"
action = {{ type = "stop", after = "2h" }}
match = {{ project = "nlp" }}

[[org]]
slug = "new-org"
"""


def test_defaults_are_written_once_under_stable_ids(service: AlertService, tmp_path: Path) -> None:
    path = tmp_path / "alerts.toml"
    path.write_text(DEFAULTS)
    loaded = service.load_defaults(path)
    assert (loaded.orgs, loaded.channels_written, loaded.rules_written, loaded.removed) == (2, 2, 2, 0)
    channels = {c.channel_id: c for c in service.store.channels("acme")}
    assert set(channels) == {"chn_file_acme_ops", "chn_file_acme_chat"}
    assert channels["chn_file_acme_ops"].secret == SECRET
    rules = service.store.rules("acme")
    assert [r.rule_id for r in rules] == ["rul_file_acme_1", "rul_file_acme_2"]
    assert rules[0].channels == ("chn_file_acme_ops", "chn_file_acme_chat")
    assert rules[1].action == StopAction(7_200_000) and rules[1].match == {"project": "nlp"}
    assert service.store.registry.org_exists("new-org")

    again = service.load_defaults(path)  # a restart: nothing to write
    assert (again.channels_written, again.rules_written, again.removed) == (0, 0, 0)
    fired = datetime(2026, 1, 1, tzinfo=UTC)
    open_episode = Episode("rul_file_acme_1", "job-1", "acme", 0, fired, None, None, None, fired)
    service.store.save_episode(open_episode, [], fired)

    # one rule and one channel gone from the file, one rule changed
    path.write_text(
        DEFAULTS.replace('for = "30m"\nchannels = ["ops", "chat"]', 'for = "1h"\nchannels = ["ops"]')
        .split('[[org.rule]]\nkind = "oom_suspected"')[0]
        .replace('[[org.channel]]\nid = "chat"\ntype = "apprise"\nurl = "slack://TokenA/TokenB/TokenC"\n', "")
    )
    changed = service.load_defaults(path)
    assert (changed.channels_written, changed.rules_written, changed.removed) == (0, 1, 2)
    assert [(r.rule_id, r.for_ms) for r in service.store.rules("acme")] == [("rul_file_acme_1", 3_600_000)]
    assert [c.channel_id for c in service.store.channels("acme")] == ["chn_file_acme_ops"]
    assert service.store.episodes(["rul_file_acme_1"]) == [open_episode]  # the changed rule kept it


def test_defaults_leave_the_apis_rows_alone(service: AlertService, tmp_path: Path) -> None:
    ours = channel(service)
    path = tmp_path / "alerts.toml"
    path.write_text('[[org]]\nslug = "acme"\n')
    service.load_defaults(path)
    assert [c.channel_id for c in service.store.channels("acme")] == [ours.channel_id]


def test_a_long_org_slug_gets_hashed_ids(service: AlertService, tmp_path: Path) -> None:
    slug = "a" * 40
    path = tmp_path / "alerts.toml"
    path.write_text(
        f'[[org]]\nslug = "{slug}"\n[[org.channel]]\nid = "ops"\ntype = "alertmanager"\nurl = "http://am:9093"\n'
        '[[org.rule]]\nkind = "idle"\nfor = "1h"\nchannels = ["ops"]\n'
    )
    service.load_defaults(path)
    (made,) = service.store.channels(slug)
    assert made.channel_id.startswith("chn_file_") and len(made.channel_id) <= 40
    assert service.store.rules(slug)[0].channels == (made.channel_id,)
    service.load_defaults(path)
    assert [c.channel_id for c in service.store.channels(slug)] == [made.channel_id]


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("org = 1", "org: must be an array"),
        ("[[org]]\nslug = 'Acme'", "org[0].slug"),
        ("[[org]]\nslug = 'acme'\ncolour = 'red'", "unknown keys ['colour']"),
        (
            "[[org]]\nslug = 'acme'\n[[org.channel]]\nid = 'ops'\ntype = 'webhook'\nurl = 'https://x.example'",
            "secret",
        ),
        (
            "[[org]]\nslug = 'acme'\n[[org.channel]]\nid = 'ops'\ntype = 'apprise'\nurl = 'nope'",
            "org[0].channel[0]",
        ),
        (
            "[[org]]\nslug = 'acme'\n[[org.rule]]\nkind = 'idle'\nfor = '1h'\nchannels = ['ops']",
            "org[0].rule[0]",
        ),
        ("[[org]]\nslug = 'acme'\n[[org.rule]]\nkind = 'idle'\nfor = 'later'\nchannels = []", "for"),
        ("not toml", "not valid TOML"),
    ],
)
def test_a_bad_defaults_file_names_the_entry(
    service: AlertService, tmp_path: Path, text: str, words: str
) -> None:
    path = tmp_path / "alerts.toml"
    path.write_text(text)
    with pytest.raises(InvalidRequest) as caught:
        service.load_defaults(path)
    assert words in caught.value.message
    assert str(path) in caught.value.message
    assert service.store.channels("acme") == []


def test_a_missing_defaults_file(service: AlertService, tmp_path: Path) -> None:
    with pytest.raises(InvalidRequest, match="cannot read"):
        service.load_defaults(tmp_path / "absent.toml")
