"""Alert delivery against real receivers on 127.0.0.1: an HTTP server that checks the Standard Webhooks
signature with the reference library, Debian's Alertmanager (the alert shows in its API, and the
resolved post ends it), and Apprise's json:// plugin posting to the same HTTP server."""

from __future__ import annotations

import asyncio
import shutil
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import orjson
import pytest
from standardwebhooks import Webhook
from standardwebhooks.webhooks import WebhookVerificationError

from gpulens.domain.alerts import (
    AlertEvent,
    Channel,
    ChannelType,
    DeliveryStatus,
    EventType,
    new_id,
    new_webhook_secret,
)
from gpulens.service.alerts import payloads
from gpulens.service.alerts.deliver import Deliverer, DeliveryOptions
from gpulens.storage.alerts import AlertStore
from gpulens.storage.registry import Registry
from gpulens_testkit.alertmanager import ALERTMANAGER, alerts, start_alertmanager
from gpulens_testkit.promload import ServerHandle
from tests.conftest import missing_server

pytestmark = pytest.mark.integration

ORG = "acme"
FAST = DeliveryOptions(timeout_s=5.0, backoff_base=timedelta(milliseconds=50), jitter=0.0)


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes
    verified: bool | None  # the signature, when the receiver knows the secret


@dataclass
class Receiver:
    """A plain HTTP server in a thread: answers `statuses` in turn (then 204), keeps what it got."""

    url: str = ""
    secret: str | None = None
    statuses: list[int] = field(default_factory=list)
    received: list[Received] = field(default_factory=list)


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    state = Receiver()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("content-length", "0")))
            headers = {k.lower(): v for k, v in self.headers.items()}
            verified = None
            if state.secret is not None:
                try:
                    Webhook(state.secret).verify(body, headers)
                    verified = True
                except WebhookVerificationError:
                    verified = False
            state.received.append(Received(self.path, headers, body, verified))
            status = state.statuses.pop(0) if state.statuses else 204
            self.send_response(status)
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    state.url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


@pytest.fixture
def alertmanager(tmp_path: Path) -> Iterator[ServerHandle]:
    if shutil.which(ALERTMANAGER) is None:
        missing_server(f"{ALERTMANAGER} (Debian package `prometheus-alertmanager`, on PATH)")
    with start_alertmanager(tmp_path / "alertmanager") as handle:
        yield handle


@pytest.fixture
def store(registry: Registry) -> AlertStore:
    registry.ensure_org(ORG)
    return AlertStore(registry)


def add(store: AlertStore, kind: ChannelType, url: str, secret: str | None = None) -> Channel:
    now = datetime.now(UTC)
    return store.add_channel(Channel(new_id("chn"), ORG, kind, url, secret, created_at=now))


def event(kind: EventType, start: datetime, end: datetime) -> AlertEvent:
    event_id = new_id("evt")
    now = datetime.now(UTC)
    body = {
        "type": kind.value,
        "id": event_id,
        "timestamp": payloads.rfc3339(now),
        "org": ORG,
        "execution": {"id": "exe-42", "hostname": "gpu-a", "gpus": ["0"], "status": "running"},
        "finding": {
            "kind": "idle_held",
            "severity": "warning",
            "start": payloads.rfc3339(start),
            "end": payloads.rfc3339(end),
            "message": "GPU 0 held idle for 1 h 30 min",
        },
        "rule": {"id": "rul_1", "kind": "idle_held", "for": "1h", "severity": "warning"},
        "url": "http://gpulens.test/ui/executions/exe-42",
    }
    return AlertEvent(event_id, ORG, kind, now, "exe-42", "rul_1", body)


def send(store: AlertStore, channel: Channel, alert: AlertEvent) -> str:
    (delivery,) = store.add_event(alert, [channel.channel_id], datetime.now(UTC))
    return delivery.delivery_id


async def test_a_webhook_receiver_verifies_every_attempt_and_gets_it_once(
    store: AlertStore, receiver: Receiver
) -> None:
    secret = new_webhook_secret()
    receiver.secret, receiver.statuses = secret, [500]
    channel = add(store, ChannelType.WEBHOOK, receiver.url + "/hooks/gpulens", secret)
    now = datetime.now(UTC)
    alert = event(EventType.FIRING, now - timedelta(minutes=90), now)
    delivery_id = send(store, channel, alert)
    async with Deliverer(store, options=FAST) as deliverer:
        assert await deliverer.run_once() == 1  # 500
        for _ in range(100):
            await asyncio.sleep(0.02)
            if await deliverer.run_once():
                break
    assert [r.verified for r in receiver.received] == [True, True]
    assert {r.headers["webhook-id"] for r in receiver.received} == {alert.event_id}
    assert {r.path for r in receiver.received} == {"/hooks/gpulens"}
    assert orjson.loads(receiver.received[-1].body) == alert.payload
    done = store.get_delivery(ORG, delivery_id)
    assert done is not None and done.status is DeliveryStatus.DELIVERED and done.attempts == 2


async def test_alertmanager_shows_the_firing_alert_and_ends_it_on_resolved(
    store: AlertStore, alertmanager: ServerHandle
) -> None:
    channel = add(store, ChannelType.ALERTMANAGER, alertmanager.url)
    now = datetime.now(UTC).replace(microsecond=0)
    start = now - timedelta(minutes=90)
    firing = send(store, channel, event(EventType.FIRING, start, now))
    async with Deliverer(store, options=FAST) as deliverer:
        assert await deliverer.run_once() == 1
        (shown,) = alerts(alertmanager.url)
        assert shown["labels"] == {
            "alertname": "GpulensFinding",
            "kind": "idle_held",
            "org": ORG,
            "execution_id": "exe-42",
            "hostname": "gpu-a",
            "severity": "warning",
        }
        assert shown["annotations"]["summary"] == "GPU 0 held idle for 1 h 30 min"
        assert shown["generatorURL"] == "http://gpulens.test/ui/executions/exe-42"
        assert shown["status"]["state"] == "active"
        assert datetime.fromisoformat(shown["startsAt"]) == start
        assert datetime.fromisoformat(shown["endsAt"]) > now + timedelta(minutes=30)

        resolved = send(store, channel, event(EventType.RESOLVED, start, datetime.now(UTC)))
        assert await deliverer.run_once() == 1
        assert alerts(alertmanager.url, active=True) == []
        ok, error = await deliverer.send_test(channel)
        assert (ok, error) == (True, None)
        assert any(a["labels"]["alertname"] == "GpulensChannelTest" for a in alerts(alertmanager.url))
    for delivery_id in (firing, resolved):
        done = store.get_delivery(ORG, delivery_id)
        assert done is not None and done.status is DeliveryStatus.DELIVERED


async def test_an_apprise_json_url_posts_the_message(store: AlertStore, receiver: Receiver) -> None:
    host = receiver.url.removeprefix("http://")
    channel = add(store, ChannelType.APPRISE, f"json://{host}/apprise")
    now = datetime.now(UTC)
    delivery_id = send(store, channel, event(EventType.FIRING, now - timedelta(minutes=90), now))
    async with Deliverer(store, options=FAST) as deliverer:
        assert await deliverer.run_once() == 1
        (got,) = receiver.received
        assert got.path == "/apprise"
        body = orjson.loads(got.body)
        assert body["title"] == "gpulens: idle_held on exe-42"
        assert body["message"].splitlines()[0] == "GPU 0 held idle for 1 h 30 min"
        assert body["message"].splitlines()[-1] == "http://gpulens.test/ui/executions/exe-42"
        assert body["type"] == "warning"
        done = store.get_delivery(ORG, delivery_id)
        assert done is not None and done.status is DeliveryStatus.DELIVERED

        receiver.statuses = [500]  # a failing receiver: an attempt failed, no token in the error
        assert await deliverer.send_test(channel) == (False, "apprise: the notification was not sent")
