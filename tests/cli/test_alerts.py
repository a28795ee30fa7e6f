"""`gpulens alerts rules|channels|deliveries`: one org's rows as tables or JSON, never a secret."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime

import anyio
import pytest

from gpulens.cli.alerts import app
from gpulens.domain.alerts import AlertEvent, DeliveryStatus, EventType
from gpulens.service.alerts.rules import AlertService
from gpulens.storage.alerts import AlertStore
from gpulens.storage.registry import Registry
from tests.cli.conftest import invoke, invoke_ok, one_line_error

NOW = datetime(2026, 12, 2, 10, 0, tzinfo=UTC)


@pytest.fixture
def filled(db: str) -> Iterator[dict[str, str]]:
    """acme: a webhook (with a secret), an Apprise channel, a rule, a failed delivery; beta: a channel."""
    registry = Registry.from_url(db)
    registry.migrate()
    service = AlertService(AlertStore(registry), clock=lambda: NOW)

    async def fill() -> dict[str, str]:
        hook = await service.create_channel(
            "acme", type="webhook", url="https://hooks.example.com/a?token=t0k"
        )
        chat = await service.create_channel("acme", type="apprise", url="slack://TokenA/TokenB/TokenC")
        await service.create_channel("beta", type="webhook", url="https://beta.example.com/h")
        rule = await service.create_rule(
            "acme",
            kind="idle_held",
            for_="90m",
            channels=[hook.channel_id, chat.channel_id],
            action={"type": "stop", "after": "2h"},
            match={"project": "nlp"},
        )
        assert hook.secret is not None
        return {"hook": hook.channel_id, "chat": chat.channel_id, "rule": rule.rule_id, "secret": hook.secret}

    ids = anyio.run(fill)
    event = AlertEvent("evt_1", "acme", EventType.FIRING, NOW, None, ids["rule"], {})
    (delivery,) = service.store.add_event(event, [ids["hook"]], NOW)
    service.store.delivery_done(
        delivery.delivery_id,
        status=DeliveryStatus.FAILED,
        attempts=3,
        error="HTTP 500",
        next_attempt_at=None,
        now=NOW,
    )
    ids["delivery"] = delivery.delivery_id
    registry.dispose()
    yield ids


def test_rules(filled: dict[str, str]) -> None:
    table = invoke_ok(app, "rules", "--org", "acme").stdout
    assert filled["rule"] in table and "idle_held" in table and "1h30m" in table
    assert "stop after 2h" in table and "project=nlp" in table
    (rule,) = json.loads(invoke_ok(app, "rules", "--org", "acme", "--json").stdout)
    assert rule["for"] == "1h30m" and rule["channels"] == [filled["hook"], filled["chat"]]
    assert rule["action"] == {"type": "stop", "after": "2h"} and rule["source"] == "api"
    assert "no alert rules for org beta" in invoke_ok(app, "rules", "--org", "beta").stdout
    assert json.loads(invoke_ok(app, "rules", "--org", "beta", "--json").stdout) == []


def test_channels_never_show_secrets_or_tokens(filled: dict[str, str]) -> None:
    for args in (("channels", "--org", "acme"), ("channels", "--org", "acme", "--json")):
        out = invoke_ok(app, *args).stdout
        assert filled["hook"] in out and filled["chat"] in out
        for hidden in (filled["secret"], "t0k", "TokenA", "whsec_"):
            assert hidden not in out
    listed = json.loads(invoke_ok(app, "channels", "--org", "acme", "--json").stdout)
    urls = {c["id"]: c["url"] for c in listed}  # one clock: same created_at, so ordered by id
    assert urls == {filled["hook"]: "https://hooks.example.com/a?…", filled["chat"]: "slack://…"}
    theirs = json.loads(invoke_ok(app, "channels", "--org", "beta", "--json").stdout)
    assert len(theirs) == 1 and theirs[0]["id"] not in urls


def test_deliveries(filled: dict[str, str]) -> None:
    table = invoke_ok(app, "deliveries", "--org", "acme").stdout
    assert filled["delivery"] in table and "failed" in table and "HTTP 500" in table
    (one,) = json.loads(invoke_ok(app, "deliveries", "--org", "acme", "--status", "failed", "--json").stdout)
    assert one["id"] == filled["delivery"] and one["attempts"] == 3 and one["event_id"] == "evt_1"
    assert (
        json.loads(invoke_ok(app, "deliveries", "--org", "acme", "--status", "pending", "--json").stdout)
        == []
    )
    assert "no deliveries for org beta" in invoke_ok(app, "deliveries", "--org", "beta").stdout
    result = invoke(app, "deliveries", "--org", "acme", "--status", "lost")
    assert result.exit_code == 2


def test_the_org_is_required(db: str) -> None:
    result = invoke(app, "rules")
    assert result.exit_code == 2


def test_an_unreachable_registry_is_one_line(monkeypatch: pytest.MonkeyPatch, db: str) -> None:
    monkeypatch.setenv("GPULENS_DATABASE_URL", "mysql://nowhere/x")
    message = one_line_error(invoke(app, "channels", "--org", "acme"), 2)
    assert "database_url" in message.lower()


def test_a_digest_rule_lists_its_period_and_threshold(db: str) -> None:
    registry = Registry.from_url(db)
    registry.migrate()
    service = AlertService(AlertStore(registry), clock=lambda: NOW)

    async def fill() -> str:
        hook = await service.create_channel("acme", type="webhook", url="https://hooks.example.com/d")
        rule = await service.create_rule(
            "acme", kind="digest", every="7d", min_idle_gpu_hours=24, channels=[hook.channel_id]
        )
        return rule.rule_id

    rule_id = anyio.run(fill)
    registry.dispose()
    table = invoke_ok(app, "rules", "--org", "acme").stdout
    assert rule_id in table and "digest" in table and "every 7d" in table and "idle ≥ 24 GPU-h" in table
    (rule,) = json.loads(invoke_ok(app, "rules", "--org", "acme", "--json").stdout)
    assert (rule["kind"], rule["for"], rule["every"], rule["min_idle_gpu_hours"]) == (
        "digest",
        None,
        "7d",
        24.0,
    )
