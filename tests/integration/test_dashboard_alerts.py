"""Where people look at live alerts (docs/alerts.md), in headless Chromium: the `/ui/alerts` page
and the execution page's live alert state.

An app (its evaluation pass and deliverer off: GPULENS_ALERTS_INTERVAL=0, so the rows set up here
stay as they are) is served on 127.0.0.1 with org `acme`'s rules and channels made through the API,
and deliveries and episodes written through the AlertStore. The alerts page must list the rules,
the channels (a disabled one with its reason) and the deliveries, and a failed delivery's Retry
must make it pending; the page of an execution with open fired episodes must show one badge per
firing rule, and its "Snooze stop for 2 h" must store the snooze and say until when. An org with
nothing says what to do; an execution with nothing firing shows nothing; an API error is shown.
Every page logs no console error and asks nothing of another host.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from gpulens.api.app import create_app
from gpulens.backends.embedded import EmbeddedBackend
from gpulens.config import Settings
from gpulens.domain.alerts import AlertEvent, DeliveryStatus, EventType
from gpulens.storage.alerts import AlertStore, Episode
from gpulens.storage.samples import SampleStore
from tests.conftest import sqlite_registry
from tests.integration import test_dashboard as dash
from tests.integration.conftest import serve_app

pytestmark = pytest.mark.integration

BASE = "/api/v2/external/alerts"


@dataclass
class AlertSite:
    url: str
    key: str  # acme's
    empty_key: str  # beta's: no rules, channels or deliveries
    project_key: str  # acme's, limited to project nlp: manages no alerts
    store: AlertStore
    firing: str  # a running execution with two rules firing on it
    quiet: str  # a running execution with nothing firing
    rules: dict[str, str]  # kind -> rule id
    channels: dict[str, str]  # name -> channel id
    failed: str  # a failed delivery
    delivered: str
    idle_fired_at: datetime  # when the idle_held rule fired on `firing`


def episode(rule_id: str, execution_id: str, fired_at: datetime, **fields: Any) -> Episode:
    values: dict[str, Any] = {
        "started_ms": int((fired_at - timedelta(minutes=30)).timestamp() * 1000),
        "fired_event_id": None,
        "stop_event_id": None,
        "resolved_at": None,
        "last_fired_at": fired_at,
        **fields,
    }
    return Episode(rule_id, execution_id, "acme", fired_at=fired_at, **values)


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AlertSite]:
    tmp = Path(tmp_path_factory.mktemp("dashboard-alerts"))
    registry = sqlite_registry(tmp / "registry.db")
    samples = SampleStore.from_path(tmp / "samples.db")
    _, admin = registry.create_key("platform", name="scheduler", is_admin=True)
    _, key = registry.create_key("acme", name="alice")
    _, empty_key = registry.create_key("beta", name="bob")
    _, project_key = registry.create_key("acme", name="nlp-only", projects=["nlp"])
    settings = Settings(
        data_dir=tmp,
        prometheus_url=None,
        database_url=f"sqlite:///{tmp / 'registry.db'}",
        alerts_interval=0,  # no pass, no deliverer: the rows below stay as written
    )
    app = create_app(settings, registry=registry, backend=EmbeddedBackend(samples))
    store: AlertStore = app.state.ctx.alerts.store
    now = datetime.now(UTC).replace(microsecond=0)
    try:
        with serve_app(app) as url, httpx.Client(base_url=url, timeout=30) as http:
            admin_h = {"Authorization": f"Bearer {admin}"}
            acme = {"Authorization": f"Bearer {key}"}

            def post(path: str, body: dict[str, Any], headers: dict[str, str]) -> dict[str, Any]:
                r = http.post(path, json=body, headers=headers)
                assert r.status_code in (200, 201), r.text
                answer: dict[str, Any] = r.json()
                return answer

            start = (now - timedelta(hours=1)).isoformat()
            running = {"org": "acme", "hostname": "gpu-node-1", "status": "running", "start_time": start}
            firing = post("/api/v2/admin/executions", running, admin_h)["execution_id"]
            quiet = post("/api/v2/admin/executions", running, admin_h)["execution_id"]
            hook = post(
                f"{BASE}/channels", {"type": "webhook", "url": "https://hooks.example.com/g?token=t"}, acme
            )
            chat = post(f"{BASE}/channels", {"type": "apprise", "url": "slack://TokenA/TokenB/TokenC"}, acme)
            idle = post(f"{BASE}/rules", {"kind": "idle_held", "for": "30m", "channels": [hook["id"]]}, acme)
            oom = post(
                f"{BASE}/rules",
                {
                    "kind": "oom_suspected",
                    "for": "5m",
                    "channels": [hook["id"], chat["id"]],
                    "severity": "critical",
                    "action": {"type": "stop", "after": "2h"},
                    "match": {"project": "nlp"},
                },
                acme,
            )
            digest = post(
                f"{BASE}/rules",
                {"kind": "digest", "every": "168h", "min_idle_gpu_hours": 24, "channels": [hook["id"]]},
                acme,
            )
            # the Apprise channel failed for the whole retry period: disabled, saying why
            store.channel_failed(chat["id"], now - timedelta(days=2), timedelta(days=1))
            store.channel_failed(chat["id"], now - timedelta(hours=1), timedelta(days=1))
            # a delivered and a failed delivery
            made = []
            for n in range(2):
                event = AlertEvent(
                    f"evt_page_{n}",
                    "acme",
                    EventType.FIRING,
                    now,
                    firing,
                    idle["id"],
                    {"type": "finding.firing"},
                )
                made.append(store.add_event(event, [hook["id"]], now - timedelta(minutes=10 - n))[0])
            store.delivery_done(
                made[0].delivery_id,
                status=DeliveryStatus.DELIVERED,
                attempts=1,
                error=None,
                next_attempt_at=None,
                now=now,
            )
            store.delivery_done(
                made[1].delivery_id,
                status=DeliveryStatus.FAILED,
                attempts=9,
                error="HTTP 502 from hooks.example.com",
                next_attempt_at=None,
                now=now,
            )
            # two rules firing on one execution, the second with its stop requested
            store.save_episode(episode(idle["id"], firing, now - timedelta(minutes=42)), [], now)
            store.save_episode(
                episode(oom["id"], firing, now - timedelta(minutes=7), stop_event_id="evt_stop"), [], now
            )
            yield AlertSite(
                url,
                key,
                empty_key,
                project_key,
                store,
                firing,
                quiet,
                {"idle_held": idle["id"], "oom_suspected": oom["id"], "digest": digest["id"]},
                {"hook": hook["id"], "chat": chat["id"]},
                made[1].delivery_id,
                made[0].delivery_id,
                now - timedelta(minutes=42),
            )
    finally:
        samples.close()
        registry.dispose()


def signed_in(pg: Any, site: AlertSite, path: str, key: str | None = None) -> None:
    """Open `path` signed in with `key` (acme's by default): the key lives in the tab's sessionStorage."""
    pg.goto(site.url + "/")  # the sign-in form: the origin, nothing asked of the API yet
    pg.evaluate("k => sessionStorage.setItem('gpulens.apiKey', k)", key or site.key)
    pg.goto(site.url + path)


def test_the_alerts_page_lists_rules_channels_deliveries(
    page: tuple[Any, dash.Recorder], site: AlertSite, artifacts: Path
) -> None:
    pg, rec = page
    pg.goto(site.url + "/")
    pg.fill("input[name=api_key]", site.key)
    pg.click("form#signin button[type=submit]")
    dash.wait_for_attr(pg, "body[data-summaries=loaded]")
    pg.click("header nav a:text('Alerts')")  # the navigation of every page leads here
    pg.wait_for_url("**/ui/alerts")
    dash.wait_for_attr(pg, "body[data-alerts=loaded]")
    assert pg.locator("header nav a[aria-current=page]").inner_text() == "Alerts"

    rules = pg.locator("#rules tr[data-rule]")
    assert rules.count() == 3
    oom = pg.locator(f'#rules tr[data-rule="{site.rules["oom_suspected"]}"]')
    text = oom.inner_text()
    assert "oom suspected" in text and "5m" in text and "critical" in text
    assert oom.locator('[data-field="action"]').inner_text() == "stop after 2h"
    assert oom.locator('[data-field="match"]').inner_text() == "project = nlp"
    assert site.channels["hook"] in text and site.channels["chat"] in text
    idle = pg.locator(f'#rules tr[data-rule="{site.rules["idle_held"]}"]')
    assert idle.locator('[data-field="action"]').inner_text() == "tell only"
    assert idle.locator('[data-field="match"]').inner_text() == "every running execution"
    digest = pg.locator(f'#rules tr[data-rule="{site.rules["digest"]}"]')
    assert "every 7d" in digest.inner_text()
    assert digest.locator('[data-field="action"]').inner_text() == "users with ≥ 24 idle GPU-hours"
    assert digest.locator('[data-field="match"]').inner_text() == "every execution"

    hook = pg.locator(f'#channels tr[data-channel="{site.channels["hook"]}"]')
    assert hook.locator('[data-field="url"]').inner_text() == "https://hooks.example.com/g?…"  # no token
    assert hook.locator('[data-field="state"]').inner_text() == "working"
    chat = pg.locator(f'#channels tr[data-channel="{site.channels["chat"]}"]')
    assert chat.get_attribute("data-disabled") == "true"
    state = chat.locator('[data-field="state"]').inner_text()
    assert state.startswith("disabled since") and "every delivery failed since" in state
    assert "TokenA" not in pg.locator("#channels").inner_text()

    failed = pg.locator(f'#deliveries tr[data-delivery="{site.failed}"]')
    assert failed.get_attribute("data-status") == "failed"
    assert failed.locator('[data-field="attempts"]').inner_text() == "9"
    assert failed.locator('[data-field="error"]').inner_text() == "HTTP 502 from hooks.example.com"
    delivered = pg.locator(f'#deliveries tr[data-delivery="{site.delivered}"]')
    assert delivered.get_attribute("data-status") == "delivered"
    assert delivered.locator("button.retry").count() == 0
    # newest first
    order = pg.eval_on_selector_all(
        "#deliveries tr[data-delivery]", "els => els.map(e => e.dataset.delivery)"
    )
    assert order == [site.failed, site.delivered]
    shot = artifacts / "alerts.png"
    pg.screenshot(path=str(shot), full_page=True)
    print(f"screenshot: {shot}")

    # the filter asks the API for failed ones only
    pg.select_option("#delivery-status", "failed")
    pg.wait_for_selector(f'#deliveries tr[data-delivery="{site.delivered}"]', state="detached")
    assert pg.locator("#deliveries tr[data-delivery]").count() == 1
    pg.select_option("#delivery-status", "")
    pg.wait_for_selector(f'#deliveries tr[data-delivery="{site.delivered}"]')

    # Retry: the delivery is pending again, due now (the same event)
    failed.locator("button.retry").click()
    pg.wait_for_selector(f'#deliveries tr[data-delivery="{site.failed}"][data-status=pending]')
    assert failed.locator("button.retry").count() == 0
    assert failed.locator('[data-field="next"]').inner_text() != "–"
    (stored,) = [d for d in site.store.deliveries("acme") if d.delivery_id == site.failed]
    assert stored.status is DeliveryStatus.PENDING and stored.event_id == "evt_page_1"
    assert rec.errors == []
    assert rec.foreign() == []


def test_a_failed_retry_is_shown(page: tuple[Any, dash.Recorder], site: AlertSite) -> None:
    pg, rec = page
    site.store.delivery_done(
        site.failed,
        status=DeliveryStatus.FAILED,
        attempts=9,
        error="HTTP 502",
        next_attempt_at=None,
        now=datetime.now(UTC),
    )
    signed_in(pg, site, "/ui/alerts")
    dash.wait_for_attr(pg, "body[data-alerts=loaded]")
    row = pg.locator(f'#deliveries tr[data-delivery="{site.failed}"]')
    # the key is no longer accepted when the page retries: the 401 is said, not swallowed
    pg.evaluate("sessionStorage.setItem('gpulens.apiKey', 'lk_revoked')")
    row.locator("button.retry").click()
    pg.wait_for_selector(f'#deliveries tr[data-delivery="{site.failed}"] .error[role=alert]')
    assert row.locator(".error").inner_text().strip()
    assert row.get_attribute("data-status") == "failed"
    assert [e for e in rec.errors if "401" not in e] == []  # the browser logs the failed request


def test_an_org_without_alerts_is_told_what_to_do(page: tuple[Any, dash.Recorder], site: AlertSite) -> None:
    pg, rec = page
    signed_in(pg, site, "/ui/alerts", site.empty_key)
    dash.wait_for_attr(pg, "body[data-alerts=loaded]")
    assert f"No rules yet: create one with POST {BASE}/rules" in pg.locator("#rules").inner_text()
    assert f"POST {BASE}/channels" in pg.locator("#channels").inner_text()
    assert "No deliveries yet" in pg.locator("#deliveries").inner_text()
    assert pg.locator("table").count() == 0
    assert rec.errors == []


def test_the_apis_refusal_is_shown(page: tuple[Any, dash.Recorder], site: AlertSite) -> None:
    pg, _ = page
    signed_in(pg, site, "/ui/alerts", site.project_key)
    dash.wait_for_attr(pg, "body[data-alerts=loaded]")
    for box in ("rules", "channels", "deliveries"):
        error = pg.locator(f"#{box} .error[role=alert]")
        assert "limited to projects" in error.inner_text(), box


def test_the_execution_page_shows_what_fires_and_snoozes(
    page: tuple[Any, dash.Recorder], site: AlertSite, artifacts: Path
) -> None:
    pg, rec = page
    signed_in(pg, site, f"/ui/executions/{site.firing}")
    dash.wait_for_attr(pg, "body[data-alerts=loaded]")
    box = pg.locator("#alerts-live")
    assert box.is_visible()
    badges = box.locator(".badge[data-rule]")
    assert badges.count() == 2
    idle = box.locator(f'.badge[data-rule="{site.rules["idle_held"]}"]')
    fired = site.idle_fired_at  # as the fixture stored it (a minute may have turned since)
    assert idle.inner_text().startswith("idle_held firing since ")
    assert fired.strftime("%H:%M") in idle.inner_text() or fired.strftime("%Y-%m-%d") in idle.inner_text()
    assert "warning" in (idle.get_attribute("class") or "")
    oom = box.locator(f'.badge[data-rule="{site.rules["oom_suspected"]}"]')
    assert "critical" in (oom.get_attribute("class") or "")
    assert oom.inner_text().endswith("stop requested")
    assert pg.locator("#snoozed").inner_text() == ""
    shot = artifacts / "execution-alerts.png"
    pg.screenshot(path=str(shot), full_page=False)
    print(f"screenshot: {shot}")

    before = datetime.now(UTC)
    pg.click("#snooze")
    # (not wait_for_function: the page's CSP refuses the string it evaluates)
    pg.locator("#snoozed", has_text="Stop snoozed until").wait_for()
    until = site.store.snoozed_until([site.firing])[site.firing]
    assert (
        before + timedelta(hours=2) - timedelta(seconds=5) <= until <= datetime.now(UTC) + timedelta(hours=2)
    )
    assert until.strftime("%Y-%m-%d %H:%M:%S") in pg.locator("#snoozed").inner_text()
    # and the page opened again says so from the API
    pg.reload()
    dash.wait_for_attr(pg, "body[data-alerts=loaded]")
    assert pg.locator("#snoozed").inner_text().startswith("Stop snoozed until")
    assert rec.errors == []
    assert rec.foreign() == []


def test_nothing_firing_shows_nothing(page: tuple[Any, dash.Recorder], site: AlertSite) -> None:
    pg, rec = page
    signed_in(pg, site, f"/ui/executions/{site.quiet}")
    dash.wait_for_attr(pg, "body[data-alerts=loaded]")
    assert pg.locator("#alerts-live").is_hidden()
    assert pg.locator("#snooze").count() == 0
    assert any(f"{BASE}/executions/{site.quiet}" in u for u in rec.requests)
    assert rec.errors == []


# the fixtures of the dashboard's tests: a fresh browser context per test, the artifacts folder
page = dash.page
artifacts = dash.artifacts
