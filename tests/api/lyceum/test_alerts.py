"""The live alerts' routes (`/api/v2/external/alerts/...`): one org's rules, channels, deliveries and
snoozes; 422s that name the field; the webhook secret shown once; another org's ids as absent as
missing ones; 409 for a channel in use."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from gpulens.api.lyceum import alerts
from gpulens.domain.alerts import AlertEvent, Channel, DeliveryStatus, EventType
from gpulens.domain.errors import InvalidRequest
from gpulens.service.alerts.rules import AlertService
from gpulens.storage.alerts import Episode
from tests.api.conftest import Api
from tests.api.lyceum.conftest import MetricsApi, scripted_app

BASE = "/api/v2/external/alerts"
SECRET = "whsec_" + "A" * 43 + "="


@pytest.fixture
def aapi(api: Api) -> Api:
    api.client.app.include_router(alerts.router)
    return api


def service(api: Api) -> AlertService:
    found: AlertService = api.client.app.state.ctx.alerts
    return found


def ok(response: httpx.Response, status: int = 200) -> Any:
    assert response.status_code == status, response.text
    return response.json()


def new_channel(api: Api, headers: dict[str, str] | None = None, **body: Any) -> dict[str, Any]:
    body.setdefault("type", "webhook")
    body.setdefault("url", "https://hooks.example.com/gpulens")
    created: dict[str, Any] = ok(
        api.client.post(f"{BASE}/channels", json=body, headers=headers or api.acme), 201
    )
    return created


def new_rule(api: Api, channel_id: str, headers: dict[str, str] | None = None, **body: Any) -> dict[str, Any]:
    body = {"kind": "idle_held", "for": "30m", "channels": [channel_id], **body}
    created: dict[str, Any] = ok(
        api.client.post(f"{BASE}/rules", json=body, headers=headers or api.acme), 201
    )
    return created


def detail(response: httpx.Response, status: int = 422) -> Any:
    assert response.status_code == status, response.text
    return response.json()["detail"]


# ------------------------------------------------------------------ channels


def test_the_secret_is_shown_once(aapi: Api) -> None:
    created = new_channel(aapi, url="https://hooks.example.com/x?token=abc")
    assert created["secret"].startswith("whsec_")
    assert created["url"] == "https://hooks.example.com/x?token=abc"
    assert created["id"].startswith("chn_") and created["source"] == "api"
    listed = ok(aapi.client.get(f"{BASE}/channels", headers=aapi.acme))
    assert [c["id"] for c in listed] == [created["id"]]
    assert "secret" not in listed[0]
    assert created["secret"] not in str(listed)
    assert listed[0]["url"] == "https://hooks.example.com/x?…"  # a token in the query is not listed
    given = new_channel(aapi, secret=SECRET)
    assert given["secret"] == SECRET
    am = new_channel(aapi, type="alertmanager", url="http://alertmanager:9093")
    assert am["secret"] is None
    apprise = new_channel(aapi, type="apprise", url="slack://TokenA/TokenB/TokenC")
    assert apprise["url"] == "slack://TokenA/TokenB/TokenC"
    listed = ok(aapi.client.get(f"{BASE}/channels", headers=aapi.acme))
    assert "TokenA" not in str(listed)
    assert ok(aapi.client.get(f"{BASE}/channels", headers=aapi.beta)) == []


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"type": "webhook", "url": "ftp://x.example"}, "url"),
        ({"type": "webhook", "url": "https://x.example", "secret": "hunter2"}, "secret"),
        ({"type": "apprise", "url": "no scheme"}, "url"),
        ({"type": "alertmanager", "url": "https://am.example", "secret": SECRET}, "secret"),
        ({"type": "webhook", "url": "https://x.example", "colour": "red"}, "colour"),
        ({"type": "sms", "url": "https://x.example"}, "type"),
        ({"url": "https://x.example"}, "type"),
    ],
)
def test_channel_bodies_are_checked(aapi: Api, body: dict[str, Any], field: str) -> None:
    errors = detail(aapi.client.post(f"{BASE}/channels", json=body, headers=aapi.acme))
    assert any(field in [str(p) for p in e["loc"]] or field in e["msg"] for e in errors), errors
    assert "hunter2" not in str(errors) or field != "secret"


def test_a_channel_in_use_cannot_be_deleted(aapi: Api) -> None:
    channel = new_channel(aapi)
    rule = new_rule(aapi, channel["id"])
    r = aapi.client.delete(f"{BASE}/channels/{channel['id']}", headers=aapi.acme)
    assert rule["id"] in detail(r, 409)
    ok(aapi.client.delete(f"{BASE}/rules/{rule['id']}", headers=aapi.acme))
    gone = ok(aapi.client.delete(f"{BASE}/channels/{channel['id']}", headers=aapi.acme))
    assert gone["id"] == channel["id"]
    assert ok(aapi.client.get(f"{BASE}/channels", headers=aapi.acme)) == []


def test_testing_a_channel(aapi: Api) -> None:
    channel = new_channel(aapi)
    r = aapi.client.post(f"{BASE}/channels/{channel['id']}/test", headers=aapi.acme)
    assert detail(r, 503) == "delivery is not running"
    assert "Retry-After" in r.headers

    async def tester(target: Channel) -> tuple[bool, str | None]:
        return target.secret == channel["secret"], None

    service(aapi).tester = tester
    assert ok(aapi.client.post(f"{BASE}/channels/{channel['id']}/test", headers=aapi.acme)) == {
        "ok": True,
        "error": None,
    }


# ------------------------------------------------------------------ rules


def test_rules_create_list_delete(aapi: Api) -> None:
    channel = new_channel(aapi)
    rule = new_rule(
        aapi,
        channel["id"],
        **{"for": "90m", "action": {"type": "stop", "after": "2h"}, "match": {"project": "nlp"}},
    )
    assert rule["for"] == "1h30m"
    assert rule["kind"] == "idle_held" and rule["severity"] == "warning"
    assert rule["action"] == {"type": "stop", "after": "2h"}
    assert rule["match"] == {"project": "nlp"}
    assert rule["channels"] == [channel["id"]]
    assert rule["source"] == "api"
    assert datetime.fromisoformat(rule["created_at"]).tzinfo is not None
    assert ok(aapi.client.get(f"{BASE}/rules", headers=aapi.acme)) == [rule]
    assert ok(aapi.client.get(f"{BASE}/rules", headers=aapi.beta)) == []
    assert ok(aapi.client.delete(f"{BASE}/rules/{rule['id']}", headers=aapi.acme))["id"] == rule["id"]
    assert ok(aapi.client.get(f"{BASE}/rules", headers=aapi.acme)) == []
    detail(aapi.client.delete(f"{BASE}/rules/{rule['id']}", headers=aapi.acme), 404)


@pytest.mark.parametrize(
    ("change", "field", "words"),
    [
        ({"kind": "bored"}, "kind", "kind must be one of"),
        ({"for": "soon"}, "for", "invalid duration"),
        ({"for": "45d"}, "for", "at most 30d"),
        ({"severity": "loud"}, "severity", ""),
        ({"channels": []}, "channels", ""),
        ({"channels": ["chn_nope"]}, "channels", "'chn_nope' is not a channel of this organization"),
        ({"action": {"type": "stop"}}, "after", ""),
        ({"action": {"type": "stop", "after": "later"}}, "action.after", "invalid duration"),
        ({"match": {"gpu": "0"}}, "gpu", ""),
        ({"match": {"hostname": "no spaces"}}, "match.hostname", "host name"),
        ({"cooldown": "1h"}, "cooldown", ""),
    ],
)
def test_rule_bodies_are_checked(aapi: Api, change: dict[str, Any], field: str, words: str) -> None:
    channel = new_channel(aapi)
    body = {"kind": "idle_held", "for": "30m", "channels": [channel["id"]], **change}
    errors = detail(aapi.client.post(f"{BASE}/rules", json=body, headers=aapi.acme))
    assert isinstance(errors, list), errors
    assert any(field in [str(p) for p in e["loc"]] for e in errors), errors
    assert any(words in e["msg"] for e in errors), errors


def test_a_digest_rule(aapi: Api) -> None:
    copy = new_channel(aapi)
    mail = new_channel(aapi, type="apprise", url="mailtos://u:p@smtp.example.org?to={user}@example.org")
    body = {
        "kind": "digest",
        "every": "168h",
        "min_idle_gpu_hours": 24,
        "channels": [copy["id"], mail["id"]],
        "match": {"project": "nlp"},
    }
    rule = ok(aapi.client.post(f"{BASE}/rules", json=body, headers=aapi.acme), 201)
    assert (rule["kind"], rule["every"], rule["min_idle_gpu_hours"], rule["for"]) == (
        "digest",
        "7d",
        24.0,
        None,
    )
    assert rule["severity"] == "info" and rule["action"] is None and rule["match"] == {"project": "nlp"}
    assert ok(aapi.client.get(f"{BASE}/rules", headers=aapi.acme)) == [rule]
    finding = new_rule(aapi, copy["id"])
    assert (finding["every"], finding["min_idle_gpu_hours"], finding["for"]) == (None, None, "30m")
    # a per-user channel takes digests only; a digest goes to no Alertmanager
    refused = {"kind": "idle", "for": "1h", "channels": [mail["id"]]}
    errors = detail(aapi.client.post(f"{BASE}/rules", json=refused, headers=aapi.acme))
    assert errors[0]["loc"] == ["body", "channels"] and "per-user" in errors[0]["msg"]
    am = new_channel(aapi, type="alertmanager", url="http://am.example:9093")
    errors = detail(
        aapi.client.post(f"{BASE}/rules", json={**body, "channels": [am["id"]]}, headers=aapi.acme)
    )
    assert errors[0]["loc"] == ["body", "channels"] and "Alertmanager" in errors[0]["msg"]
    for change, field, words in [
        ({"every": "30m"}, "every", "at least 1h"),
        ({"every": None}, "every", "duration"),
        ({"for": "1h"}, "for", "no `for`"),
        ({"min_idle_gpu_hours": -1}, "min_idle_gpu_hours", ""),
        ({"action": {"type": "stop", "after": "1h"}}, "action", "no action"),
    ]:
        errors = detail(aapi.client.post(f"{BASE}/rules", json={**body, **change}, headers=aapi.acme))
        assert any(e["loc"][-1] == field and words in e["msg"] for e in errors), (change, errors)


def test_a_rule_cannot_name_another_orgs_channel(aapi: Api) -> None:
    theirs = new_channel(aapi, aapi.beta)
    body = {"kind": "idle", "for": "1h", "channels": [theirs["id"]]}
    errors = detail(aapi.client.post(f"{BASE}/rules", json=body, headers=aapi.acme))
    assert theirs["id"] in errors[0]["msg"]


def test_a_project_key_manages_no_alerts(aapi: Api) -> None:
    _, key = aapi.registry.create_key("acme", name="nlp-only", projects=["nlp"])
    headers = aapi.bearer(key)
    for method, path in (("GET", "/rules"), ("GET", "/channels"), ("GET", "/deliveries")):
        assert "limited to projects" in detail(aapi.client.request(method, BASE + path, headers=headers), 403)
    r = aapi.client.post(
        f"{BASE}/channels", json={"type": "webhook", "url": "https://x.example"}, headers=headers
    )
    detail(r, 403)


# ------------------------------------------------------------------ another org's ids


def test_another_orgs_ids_answer_as_missing_ones(aapi: Api) -> None:
    channel = new_channel(aapi)
    rule = new_rule(aapi, channel["id"])
    event = AlertEvent("evt_1", "acme", EventType.FIRING, datetime.now(UTC), None, rule["id"], {})
    (delivery,) = service(aapi).store.add_event(event, [channel["id"]], datetime.now(UTC))
    execution = aapi.register(status="running")["execution_id"]
    until = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    routes = [
        ("DELETE", "/rules/{}", rule["id"], "rul_missing", None),
        ("DELETE", "/channels/{}", channel["id"], "chn_missing", None),
        ("POST", "/channels/{}/test", channel["id"], "chn_missing", None),
        ("POST", "/deliveries/{}/retry", delivery.delivery_id, "dlv_missing", None),
        ("POST", "/snooze", execution, "exec-missing", "snooze"),
    ]
    for method, path, ours, missing, kind in routes:
        answers = []
        for object_id, headers in ((ours, aapi.beta), (missing, aapi.beta), (missing, aapi.acme)):
            if kind == "snooze":
                r = aapi.client.post(
                    BASE + path, json={"execution_id": object_id, "until": until}, headers=headers
                )
            else:
                r = aapi.client.request(method, BASE + path.format(object_id), headers=headers)
            answers.append((r.status_code, r.content))
        assert answers[0] == answers[1] == answers[2], (path, answers)
        assert answers[0][0] == 404, (path, answers)
    # and every object of acme is still there
    assert len(ok(aapi.client.get(f"{BASE}/rules", headers=aapi.acme))) == 1
    assert len(ok(aapi.client.get(f"{BASE}/channels", headers=aapi.acme))) == 1


# ------------------------------------------------------------------ snoozes and deliveries


def test_snooze(aapi: Api) -> None:
    execution = aapi.register(status="running")["execution_id"]
    until = datetime.now(UTC).replace(microsecond=0) + timedelta(hours=2)
    body = {"execution_id": execution, "until": until.isoformat()}
    answer = ok(aapi.client.post(f"{BASE}/snooze", json=body, headers=aapi.acme))
    assert answer == {"execution_id": execution, "until": until.strftime("%Y-%m-%dT%H:%M:%SZ")}
    assert service(aapi).store.snoozed_until([execution]) == {execution: until}
    for when, words in (
        (datetime.now(UTC) - timedelta(minutes=1), "in the future"),
        (datetime.now(UTC) + timedelta(days=31), "at most 30 days ahead"),
    ):
        errors = detail(
            aapi.client.post(
                f"{BASE}/snooze",
                json={"execution_id": execution, "until": when.isoformat()},
                headers=aapi.acme,
            )
        )
        assert words in errors[0]["msg"] and errors[0]["loc"] == ["body", "until"]
    errors = detail(aapi.client.post(f"{BASE}/snooze", json={"execution_id": execution}, headers=aapi.acme))
    assert errors[0]["loc"] == ["body", "until"]


def test_deliveries_list_filter_retry(aapi: Api) -> None:
    channel = new_channel(aapi)
    store = service(aapi).store
    now = datetime.now(UTC)
    made = []
    for n in range(2):
        event = AlertEvent(f"evt_{n}", "acme", EventType.FIRING, now, None, None, {"type": "finding.firing"})
        made.append(store.add_event(event, [channel["id"]], now + timedelta(seconds=n))[0])
    store.delivery_done(
        made[0].delivery_id,
        status=DeliveryStatus.FAILED,
        attempts=7,
        error="HTTP 502",
        next_attempt_at=None,
        now=now,
    )
    listed = ok(aapi.client.get(f"{BASE}/deliveries", headers=aapi.acme))
    assert [d["id"] for d in listed] == [made[1].delivery_id, made[0].delivery_id]  # newest first
    failed = ok(aapi.client.get(f"{BASE}/deliveries", params={"status": "failed"}, headers=aapi.acme))
    assert [(d["id"], d["attempts"], d["last_error"]) for d in failed] == [
        (made[0].delivery_id, 7, "HTTP 502")
    ]
    assert failed[0]["event_id"] == "evt_0" and failed[0]["channel_id"] == channel["id"]
    detail(aapi.client.get(f"{BASE}/deliveries", params={"status": "lost"}, headers=aapi.acme))
    assert ok(aapi.client.get(f"{BASE}/deliveries", headers=aapi.beta)) == []
    retried = ok(aapi.client.post(f"{BASE}/deliveries/{made[0].delivery_id}/retry", headers=aapi.acme))
    assert retried["status"] == "pending" and retried["event_id"] == "evt_0"
    assert ok(aapi.client.get(f"{BASE}/deliveries", params={"status": "failed"}, headers=aapi.acme)) == []


def test_the_operators_defaults_are_loaded_at_start(
    make_api: Callable[..., MetricsApi], tmp_path: Path
) -> None:
    path = tmp_path / "alerts.toml"
    path.write_text(
        '[[org]]\nslug = "acme"\n'
        '[[org.channel]]\nid = "ops"\ntype = "webhook"\nurl = "https://hooks.example.com/x"\n'
        f'secret = "{SECRET}"\n'
        '[[org.rule]]\nkind = "idle_held"\nfor = "30m"\nchannels = ["ops"]\n'
    )
    mapi = make_api(alerts=path)
    headers = mapi.h()
    (rule,) = ok(mapi.client.get(f"{BASE}/rules", headers=headers))
    assert rule["id"] == "rul_file_acme_1" and rule["source"] == "file" and rule["for"] == "30m"
    assert rule["channels"] == ["chn_file_acme_ops"]
    (channel,) = ok(mapi.client.get(f"{BASE}/channels", headers=headers))
    assert channel["source"] == "file" and "secret" not in channel
    restarted = scripted_app(mapi.registry, mapi.prom.handle, tmp_path, alerts=path)  # same registry
    assert ok(restarted.get(f"{BASE}/rules", headers=headers)) == [rule]  # unchanged, not written again


def test_a_bad_defaults_file_stops_the_start(make_api: Callable[..., MetricsApi], tmp_path: Path) -> None:
    path = tmp_path / "alerts.toml"
    path.write_text('[[org]]\nslug = "acme"\n[[org.rule]]\nkind = "idle"\nfor = "1h"\nchannels = ["ops"]\n')
    with pytest.raises(InvalidRequest, match=r"org\[0\]\.rule\[0\]"):
        make_api(alerts=path)


# ------------------------------------------------------------------ an execution's live state


def episode(rule_id: str, execution_id: str, **fields: Any) -> Episode:
    values: dict[str, Any] = {
        "org": "acme",
        "started_ms": 0,
        "fired_at": None,
        "fired_event_id": None,
        "stop_event_id": None,
        "resolved_at": None,
        "last_fired_at": None,
        **fields,
    }
    return Episode(rule_id=rule_id, execution_id=execution_id, **values)


def test_an_executions_firing_rules_and_snooze(aapi: Api) -> None:
    channel = new_channel(aapi)
    idle = new_rule(aapi, channel["id"])
    oom = new_rule(
        aapi, channel["id"], kind="oom_suspected", severity="critical", action={"type": "stop", "after": "1h"}
    )
    power = new_rule(aapi, channel["id"], kind="power_throttle")
    quiet = new_rule(aapi, channel["id"], kind="no_data")
    execution = aapi.register(status="running")["execution_id"]
    other = aapi.register(status="running")["execution_id"]
    url = f"{BASE}/executions/{execution}"
    assert ok(aapi.client.get(url, headers=aapi.acme)) == {
        "execution_id": execution,
        "snoozed_until": None,
        "firing": [],
    }
    store = service(aapi).store
    now = datetime.now(UTC).replace(microsecond=0)
    fired = now - timedelta(minutes=20)
    store.save_episode(episode(idle["id"], execution, fired_at=fired, fired_event_id="evt_a"), [], now)
    store.save_episode(
        episode(oom["id"], execution, fired_at=fired + timedelta(minutes=5), stop_event_id="evt_s"), [], now
    )
    # not firing: resolved, not fired yet, another execution
    store.save_episode(episode(power["id"], execution, fired_at=fired, resolved_at=now), [], now)
    store.save_episode(episode(quiet["id"], execution), [], now)
    store.save_episode(episode(quiet["id"], other, fired_at=fired), [], now)
    state = ok(aapi.client.get(url, headers=aapi.acme))
    assert state["firing"] == [
        {
            "rule_id": idle["id"],
            "kind": "idle_held",
            "severity": idle["severity"],
            "since": fired.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "stop_requested": False,
        },
        {
            "rule_id": oom["id"],
            "kind": "oom_suspected",
            "severity": "critical",
            "since": (fired + timedelta(minutes=5)).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "stop_requested": True,
        },
    ]
    assert state["snoozed_until"] is None
    until = now + timedelta(hours=2)
    ok(
        aapi.client.post(
            f"{BASE}/snooze", json={"execution_id": execution, "until": until.isoformat()}, headers=aapi.acme
        )
    )
    assert ok(aapi.client.get(url, headers=aapi.acme))["snoozed_until"] == until.strftime(
        "%Y-%m-%dT%H:%M:%SZ"
    )
    # a snooze that has passed is not shown
    store.snooze("acme", execution, now - timedelta(minutes=1), now - timedelta(hours=1))
    assert ok(aapi.client.get(url, headers=aapi.acme))["snoozed_until"] is None
    # the rule's deletion takes its episodes with it
    ok(aapi.client.delete(f"{BASE}/rules/{oom['id']}", headers=aapi.acme))
    assert [f["rule_id"] for f in ok(aapi.client.get(url, headers=aapi.acme))["firing"]] == [idle["id"]]


def test_an_executions_state_is_its_orgs(aapi: Api) -> None:
    execution = aapi.register(status="running")["execution_id"]
    url = f"{BASE}/executions/{{}}"
    answers = [
        aapi.client.get(url.format(execution), headers=aapi.beta),
        aapi.client.get(url.format("exec-missing"), headers=aapi.beta),
        aapi.client.get(url.format("exec-missing"), headers=aapi.acme),
        aapi.client.get(url.format("x" * 300), headers=aapi.acme),
    ]
    assert {(r.status_code, r.content) for r in answers} == {(404, answers[0].content)}
    assert detail(answers[0], 404) == "Execution not found"
    _, key = aapi.registry.create_key("acme", name="nlp-only", projects=["nlp"])
    r = aapi.client.get(url.format(execution), headers=aapi.bearer(key))
    assert "limited to projects" in detail(r, 403)
