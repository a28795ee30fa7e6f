"""Alert delivery (service/alerts/deliver.py, payloads.py) over a real SQLite registry and
httpx.MockTransport receivers: signatures, retries with jittered backoff, failure after the retry
period, channels disabled, restarts, timeouts, redaction, and the per-channel renderings."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from standardwebhooks import Webhook

from gpulens.domain.alerts import (
    AlertEvent,
    Channel,
    ChannelType,
    Delivery,
    DeliveryStatus,
    EventType,
    new_id,
    new_webhook_secret,
)
from gpulens.service.alerts import payloads
from gpulens.service.alerts.deliver import (
    Deliverer,
    DeliveryOptions,
    channel_secrets,
    redact,
    redact_url,
)
from gpulens.storage.alerts import AlertStore
from gpulens.storage.registry import Registry
from tests.conftest import sqlite_registry

ORG = "acme"
T0 = datetime.now(UTC).replace(microsecond=0)  # near the real time: standardwebhooks checks it (5 min)


@dataclass
class Clock:
    now: datetime = T0

    def __call__(self) -> datetime:
        return self.now

    def advance(self, by: timedelta) -> None:
        self.now += by


@dataclass
class Receiver:
    """A scripted receiver: answers `statuses` in turn (the last one for ever after), keeps requests."""

    statuses: list[int] = field(default_factory=lambda: [204])
    body: bytes = b""
    requests: list[httpx.Request] = field(default_factory=list)

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        status = self.statuses[min(len(self.requests), len(self.statuses)) - 1]
        return httpx.Response(status, content=self.body)

    @property
    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self)


def payload(event_id: str, kind: EventType = EventType.FIRING) -> dict[str, Any]:
    return {
        "type": kind.value,
        "id": event_id,
        "timestamp": "2026-12-02T10:00:00.000Z",
        "org": ORG,
        "execution": {"id": "exe-1", "hostname": "gpu-a", "gpus": ["0", "1"], "status": "running"},
        "finding": {
            "kind": "idle_held",
            "severity": "warning",
            "start": "2026-12-02T08:30:00.000Z",
            "end": "2026-12-02T10:00:00.000Z",
            "message": "2 GPUs held idle for 1 h 30 min",
            "gpus": ["0", "1"],
            "impact": {"gpuHours": 3.0, "cost": None},
        },
        "rule": {"id": "rul_1", "kind": "idle_held", "for": "1h", "severity": "critical"},
        "url": "https://gpulens.example/ui/executions/exe-1",
    }


def make_event(kind: EventType = EventType.FIRING, created: datetime = T0) -> AlertEvent:
    event_id = new_id("evt")
    return AlertEvent(event_id, ORG, kind, created, "exe-1", "rul_1", payload(event_id, kind))


@pytest.fixture
def store(registry: Registry) -> AlertStore:
    registry.ensure_org(ORG)
    return AlertStore(registry)


def add_channel(
    store: AlertStore,
    url: str = "https://hooks.example/gpulens",
    kind: ChannelType = ChannelType.WEBHOOK,
    secret: str | None = None,
) -> Channel:
    if secret is None and kind is ChannelType.WEBHOOK:
        secret = new_webhook_secret()
    return store.add_channel(Channel(new_id("chn"), ORG, kind, url, secret, created_at=T0))


def add_event(store: AlertStore, channel: Channel, now: datetime = T0, **kw: Any) -> Delivery:
    (delivery,) = store.add_event(make_event(created=now, **kw), [channel.channel_id], now)
    return delivery


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
async def deliverers() -> AsyncIterator[Callable[..., Deliverer]]:
    made: list[Deliverer] = []

    def make(
        store: AlertStore, clock: Clock, receiver: Receiver | httpx.AsyncBaseTransport, **options: Any
    ) -> Deliverer:
        transport = receiver.transport if isinstance(receiver, Receiver) else receiver
        d = Deliverer(
            store,
            options=DeliveryOptions(**options),
            clock=clock,
            transport=transport,
            rng=random.Random(7),
        )
        made.append(d)
        return d

    yield make
    for d in made:
        await d.aclose()


def backoff_bounds(
    attempts: int, base: float = 30.0, cap: float = 3600.0, jitter: float = 0.2
) -> tuple[float, float]:
    delay = min(base * 2 ** (attempts - 1), cap)
    return delay * (1 - jitter), delay * (1 + jitter)


def signature_ok(secret: str, request: httpx.Request) -> bool:
    stamp = datetime.fromtimestamp(int(request.headers["webhook-timestamp"]), UTC)
    expected = Webhook(secret).sign(request.headers["webhook-id"], stamp, request.content.decode())
    return request.headers["webhook-signature"] == expected


# -- webhooks ---------------------------------------------------------------------------------------------


async def test_webhook_is_signed_per_standard_webhooks_and_delivered(
    store: AlertStore, clock: Clock, deliverers: Callable[..., Deliverer]
) -> None:
    # the real time: the reference library refuses a timestamp 5 minutes off its clock (and T0 was
    # taken at import, maybe longer ago than that in a long suite)
    clock.now = datetime.now(UTC).replace(microsecond=0)
    channel = add_channel(store)
    delivery = add_event(store, channel, clock.now)
    receiver = Receiver([200])
    async with deliverers(store, clock, receiver) as deliverer:
        assert await deliverer.run_once() == 1
    (request,) = receiver.requests
    assert request.method == "POST"
    assert str(request.url) == channel.url
    assert request.headers["content-type"] == "application/json"
    assert request.headers["webhook-id"] == delivery.event_id
    assert request.headers["webhook-timestamp"] == str(int(clock.now.timestamp()))
    assert channel.secret is not None
    body = Webhook(channel.secret).verify(request.content, dict(request.headers))  # the reference library
    assert body == store.get_event(delivery.event_id).payload  # type: ignore[union-attr]
    done = store.get_delivery(ORG, delivery.delivery_id)
    assert done is not None
    assert (done.status, done.attempts, done.last_error, done.delivered_at) == (
        DeliveryStatus.DELIVERED,
        1,
        None,
        clock.now,
    )
    async with deliverers(store, clock, receiver) as deliverer:
        assert await deliverer.run_once() == 0  # nothing left


async def test_a_receiver_failing_three_times_gets_the_same_id_each_time_and_ends_delivered(
    store: AlertStore, clock: Clock, deliverers: Callable[..., Deliverer]
) -> None:
    channel = add_channel(store)
    delivery = add_event(store, channel)
    receiver = Receiver([500, 503, 429, 204])
    async with deliverers(store, clock, receiver) as deliverer:
        for attempt in (1, 2, 3):
            assert await deliverer.run_once() == 1
            pending = store.get_delivery(ORG, delivery.delivery_id)
            assert pending is not None and pending.status is DeliveryStatus.PENDING
            assert pending.attempts == attempt
            assert pending.last_error is not None and pending.last_error.startswith("HTTP ")
            assert pending.next_attempt_at is not None
            low, high = backoff_bounds(attempt)
            assert low <= (pending.next_attempt_at - clock.now).total_seconds() <= high
            assert await deliverer.run_once() == 0  # not due yet
            clock.now = pending.next_attempt_at
        assert await deliverer.run_once() == 1
    assert len(receiver.requests) == 4
    assert {r.headers["webhook-id"] for r in receiver.requests} == {delivery.event_id}
    assert len({r.headers["webhook-timestamp"] for r in receiver.requests}) == 4  # each attempt's time
    assert channel.secret is not None
    assert all(signature_ok(channel.secret, r) for r in receiver.requests)
    assert len({r.content for r in receiver.requests}) == 1  # the same bytes every time
    done = store.get_delivery(ORG, delivery.delivery_id)
    assert done is not None and done.status is DeliveryStatus.DELIVERED and done.attempts == 4
    assert done.last_error is None
    after = store.get_channel(ORG, channel.channel_id)
    assert after is not None and after.failing_since is None  # the success cleared it


async def test_a_restart_between_attempts_still_delivers_once(tmp_path: Path, clock: Clock) -> None:
    path = tmp_path / "registry.db"
    registry = sqlite_registry(path)
    registry.ensure_org(ORG)
    store = AlertStore(registry)
    channel = add_channel(store)
    delivery = add_event(store, channel)
    receiver = Receiver([500, 500, 204])
    async with Deliverer(store, clock=clock, transport=receiver.transport) as first:
        assert await first.run_once() == 1
        due = store.get_delivery(ORG, delivery.delivery_id)
        assert due is not None and due.next_attempt_at is not None
        clock.now = due.next_attempt_at
        assert await first.run_once() == 1
    registry.dispose()  # the process ends

    registry = sqlite_registry(path)  # a new one over the same file
    try:
        store = AlertStore(registry)
        due = store.get_delivery(ORG, delivery.delivery_id)
        assert due is not None and due.status is DeliveryStatus.PENDING and due.attempts == 2
        assert due.next_attempt_at is not None
        clock.now = due.next_attempt_at
        async with Deliverer(store, clock=clock, transport=receiver.transport) as second:
            assert await second.run_once() == 1
            clock.advance(timedelta(days=2))
            assert await second.run_once() == 0
        delivered = [r for r, s in zip(receiver.requests, [500, 500, 204], strict=True) if s == 204]
        assert len(delivered) == 1 and len(receiver.requests) == 3
        assert {r.headers["webhook-id"] for r in receiver.requests} == {delivery.event_id}
        done = store.get_delivery(ORG, delivery.delivery_id)
        assert done is not None and done.status is DeliveryStatus.DELIVERED and done.attempts == 3
    finally:
        registry.dispose()


async def test_a_delivery_claimed_by_a_sender_that_died_is_sent_once_its_claim_lapses(
    store: AlertStore, clock: Clock, deliverers: Callable[..., Deliverer]
) -> None:
    channel = add_channel(store)
    delivery = add_event(store, channel)
    hold = timedelta(seconds=40)
    assert [d.delivery_id for d in store.claim_due(T0, hold, 10)] == [delivery.delivery_id]  # then dies
    receiver = Receiver([204])
    async with deliverers(store, clock, receiver) as deliverer:
        assert await deliverer.run_once() == 0
        clock.advance(hold)
        assert await deliverer.run_once() == 1
    assert len(receiver.requests) == 1


# -- backoff, the retry period, disabled channels -------------------------------------------------------


def test_backoff_doubles_to_its_cap_within_the_jitter(store: AlertStore) -> None:
    deliverer = Deliverer(store, rng=random.Random(1))
    for attempts in range(1, 15):
        for _ in range(50):
            low, high = backoff_bounds(attempts)
            assert low <= deliverer.backoff(attempts).total_seconds() <= high

    class Extreme(random.Random):
        def __init__(self, pick: int) -> None:
            super().__init__(0)
            self.pick = pick

        def uniform(self, a: float, b: float) -> float:
            return (a, b)[self.pick]

    options = DeliveryOptions(
        backoff_base=timedelta(seconds=10), backoff_max=timedelta(seconds=100), jitter=0.1
    )
    low = Deliverer(store, options=options, rng=Extreme(0))
    high = Deliverer(store, options=options, rng=Extreme(1))
    assert [low.backoff(n).total_seconds() for n in (1, 2, 3, 4, 5, 9)] == pytest.approx(
        [9, 18, 36, 72, 90, 90]
    )
    assert [high.backoff(n).total_seconds() for n in (1, 2, 5)] == pytest.approx([11, 22, 110])
    assert low.claim_hold(50) == timedelta(seconds=7 * 10.0 + 30)  # 7 waves of 8 at 10 s, plus the margin


async def test_a_delivery_fails_when_its_next_attempt_would_pass_the_retry_period(
    store: AlertStore, clock: Clock, deliverers: Callable[..., Deliverer]
) -> None:
    retry_for = timedelta(minutes=10)
    channel = add_channel(store)
    delivery = add_event(store, channel)
    receiver = Receiver([500])
    async with deliverers(store, clock, receiver, retry_for=retry_for, backoff_max=timedelta(hours=1)) as d:
        for _ in range(20):
            assert await d.run_once() == 1
            current = store.get_delivery(ORG, delivery.delivery_id)
            assert current is not None
            if current.status is not DeliveryStatus.PENDING:
                break
            assert current.next_attempt_at is not None
            assert current.next_attempt_at <= delivery.created_at + retry_for
            clock.now = current.next_attempt_at
    assert current.status is DeliveryStatus.FAILED and current.next_attempt_at is None
    # 30 + 60 + 120 + 240 s (each +-20 %: at most 540 s) fit in 10 min; with the 5th (384 s or more) not
    assert current.attempts == len(receiver.requests) == 5
    assert current.last_error is not None and current.last_error.startswith("HTTP 500")


async def test_a_channel_failing_for_the_retry_period_is_disabled_and_its_deliveries_end_failed(
    store: AlertStore, clock: Clock, deliverers: Callable[..., Deliverer]
) -> None:
    retry_for = timedelta(minutes=10)
    channel = add_channel(store)
    receiver = Receiver([502])
    async with deliverers(store, clock, receiver, retry_for=retry_for) as d:
        first = add_event(store, channel, clock.now)
        assert await d.run_once() == 1
        failing = store.get_channel(ORG, channel.channel_id)
        assert failing is not None and failing.failing_since == T0 and failing.disabled_at is None
        clock.advance(timedelta(minutes=6))
        second = add_event(store, channel, clock.now)  # younger: retried till T0 + 16 min
        while True:
            current = store.get_delivery(ORG, second.delivery_id)
            assert current is not None
            if current.status is not DeliveryStatus.PENDING:
                break
            clock.now = max(clock.now, current.next_attempt_at or clock.now)
            await d.run_once()
        disabled = store.get_channel(ORG, channel.channel_id)
        assert disabled is not None and disabled.disabled_at is not None
        assert disabled.disabled_at - T0 >= retry_for
        assert current.status is DeliveryStatus.FAILED
        assert current.last_error is not None and "channel disabled: " in current.last_error
        sent = len(receiver.requests)
        # a new event for the disabled channel ends failed without a request
        third = add_event(store, channel, clock.now)
        assert await d.run_once() == 1
        assert len(receiver.requests) == sent
        ended = store.get_delivery(ORG, third.delivery_id)
        assert ended is not None and ended.status is DeliveryStatus.FAILED
        assert ended.last_error is not None and ended.last_error.startswith("channel disabled: ")
        assert store.get_delivery(ORG, first.delivery_id).status is DeliveryStatus.FAILED  # type: ignore[union-attr]


async def test_410_gone_ends_the_delivery_and_disables_the_channel_at_once(
    store: AlertStore, clock: Clock, deliverers: Callable[..., Deliverer]
) -> None:
    channel = add_channel(store)
    delivery = add_event(store, channel)
    async with deliverers(store, clock, Receiver([410])) as d:
        assert await d.run_once() == 1
    done = store.get_delivery(ORG, delivery.delivery_id)
    assert done is not None and done.status is DeliveryStatus.FAILED and done.attempts == 1
    assert done.last_error is not None and done.last_error.startswith("HTTP 410")
    disabled = store.get_channel(ORG, channel.channel_id)
    assert disabled is not None and disabled.disabled_at == T0
    assert disabled.disabled_reason is not None and "410 Gone" in disabled.disabled_reason


# -- time, concurrency, the loop ----------------------------------------------------------------------------


async def test_a_slow_receiver_costs_one_attempt_bounded_by_the_timeout(
    store: AlertStore, clock: Clock, deliverers: Callable[..., Deliverer]
) -> None:
    async def slow(request: httpx.Request) -> httpx.Response:
        await asyncio.sleep(30)
        return httpx.Response(204)

    channel = add_channel(store)
    delivery = add_event(store, channel)
    async with deliverers(store, clock, httpx.MockTransport(slow), timeout_s=0.1) as d:
        started = time.monotonic()
        assert await d.run_once() == 1
        assert time.monotonic() - started < 5
    pending = store.get_delivery(ORG, delivery.delivery_id)
    assert pending is not None and pending.status is DeliveryStatus.PENDING
    assert pending.last_error is not None and pending.last_error.startswith("timed out after 0.1 s")


async def test_sends_run_concurrently_up_to_the_bound(
    store: AlertStore, clock: Clock, deliverers: Callable[..., Deliverer]
) -> None:
    in_flight = most = 0

    async def handler(request: httpx.Request) -> httpx.Response:
        nonlocal in_flight, most
        in_flight += 1
        most = max(most, in_flight)
        await asyncio.sleep(0.02)
        in_flight -= 1
        return httpx.Response(200)

    channel = add_channel(store)
    for _ in range(10):
        add_event(store, channel)
    async with deliverers(store, clock, httpx.MockTransport(handler), concurrency=3) as d:
        assert await d.run_once(limit=8) == 8
        assert await d.run_once(limit=8) == 2
    assert most == 3
    assert len(store.deliveries(ORG, DeliveryStatus.DELIVERED)) == 10


async def test_run_forever_goes_on_after_an_error_until_cancelled(
    store: AlertStore, clock: Clock, deliverers: Callable[..., Deliverer], monkeypatch: pytest.MonkeyPatch
) -> None:
    channel = add_channel(store)
    add_event(store, channel)
    receiver = Receiver([204])
    claim = store.claim_due
    calls = 0

    def flaky(*args: Any) -> list[Delivery]:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("database is locked")
        return claim(*args)

    monkeypatch.setattr(store, "claim_due", flaky)
    async with deliverers(store, clock, receiver) as d:
        task = asyncio.create_task(d.run_forever(0.01))
        for _ in range(500):
            if receiver.requests:
                break
            await asyncio.sleep(0.01)
        assert not task.done()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert len(receiver.requests) == 1 and calls >= 2


async def test_send_test_reports_the_outcome_without_storing_anything(
    store: AlertStore, clock: Clock, deliverers: Callable[..., Deliverer]
) -> None:
    channel = add_channel(store)
    receiver = Receiver([204, 500])
    async with deliverers(store, clock, receiver, public_url="https://gpulens.example/") as d:
        assert await d.send_test(channel) == (True, None)
        ok, error = await d.send_test(channel)
    assert not ok and error is not None and error.startswith("HTTP 500")
    first = orjson.loads(receiver.requests[0].content)
    assert first["type"] == "channel.test" and first["org"] == ORG
    assert first["url"] == "https://gpulens.example/ui/"
    assert receiver.requests[0].headers["webhook-id"] == first["id"]
    assert channel.secret is not None and signature_ok(channel.secret, receiver.requests[0])
    assert store.deliveries(ORG) == []
    assert store.get_channel(ORG, channel.channel_id).failing_since is None  # type: ignore[union-attr]


# -- Alertmanager ------------------------------------------------------------------------------------------


async def test_alertmanager_gets_one_alert_per_event(
    store: AlertStore, clock: Clock, deliverers: Callable[..., Deliverer]
) -> None:
    channel = add_channel(store, "http://am.example:9093/", ChannelType.ALERTMANAGER)
    assert channel.secret is None
    firing = add_event(store, channel)
    resolved = add_event(store, channel, kind=EventType.RESOLVED)
    receiver = Receiver([200])
    async with deliverers(store, clock, receiver) as d:
        assert await d.run_once() == 2
    assert {str(r.url) for r in receiver.requests} == {"http://am.example:9093/api/v2/alerts"}
    assert all("webhook-signature" not in r.headers for r in receiver.requests)
    bodies = [orjson.loads(r.content) for r in receiver.requests]
    # resolved: ends at the finding's end; firing: held an hour past the attempt
    assert {b[0]["endsAt"] for b in bodies} == {
        "2026-12-02T10:00:00.000Z",
        payloads.rfc3339(T0 + timedelta(hours=1)),
    }
    assert bodies[0][0]["labels"] == bodies[1][0]["labels"]  # the resolved post ends the firing alert
    for d_ in (firing, resolved):
        assert store.get_delivery(ORG, d_.delivery_id).status is DeliveryStatus.DELIVERED  # type: ignore[union-attr]


# -- redaction ---------------------------------------------------------------------------------------------


def test_redact_url_drops_user_info_and_query_and_hides_other_schemes() -> None:
    assert (
        redact_url("https://bob:pw@hooks.example/a/b?token=t&x=1#frag") == "https://***@hooks.example/a/b?***"
    )
    assert redact_url("http://hooks.example:8080/x") == "http://hooks.example:8080/x"
    assert redact_url("tgram://123456:ABCDEF/987") == "tgram://***"
    text = "POST https://u:secretpw@h.example/p?sig=abc failed, see json://h:1/x?y=2"
    assert redact(text) == "POST https://***@h.example/p?*** failed, see json://***"
    assert len(redact("x" * 5000)) == 500


async def test_errors_never_hold_the_channel_secret_or_url_credentials(
    store: AlertStore, clock: Clock, deliverers: Callable[..., Deliverer]
) -> None:
    secret = new_webhook_secret()
    url = "https://hookuser:pa55word-xyz@hooks.example/in?token=tok-123456789"

    def echo(request: httpx.Request) -> httpx.Response:
        if request.headers.get("x-raise"):
            raise httpx.ConnectError(f"cannot reach {request.url}")
        # a receiver that echoes what it was given (its URL, the secret) into its error text
        return httpx.Response(400, text=f"bad request to {url} signed with {secret} (pa55word-xyz)")

    channel = add_channel(store, url, secret=secret)
    delivery = add_event(store, channel)

    async def raising(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError(f"cannot reach {request.url} with {secret}")

    for transport in (httpx.MockTransport(echo), httpx.MockTransport(raising)):
        async with deliverers(store, clock, transport) as d:
            clock.advance(timedelta(hours=2))
            assert await d.run_once() == 1
        stored = store.get_delivery(ORG, delivery.delivery_id)
        assert stored is not None and stored.last_error
        for leaked in ("pa55word-xyz", "tok-123456789", secret, secret.removeprefix("whsec_"), "hookuser"):
            assert leaked not in stored.last_error
        assert "hooks.example" in stored.last_error or "ConnectError" in stored.last_error
    ok, error = await deliverers(store, clock, httpx.MockTransport(raising)).send_test(channel)
    assert not ok and error is not None and secret not in error and "pa55word" not in error


def test_an_apprise_channel_hides_its_whole_url() -> None:
    channel = Channel("chn_1", ORG, ChannelType.APPRISE, "tgram://bot123456:AAtoken/99887766")
    text = "failed for tgram://bot123456:AAtoken/99887766 (bot123456:AAtoken, chat 99887766)"
    cleaned = redact(text, channel_secrets(channel))
    assert "AAtoken" not in cleaned and "bot123456" not in cleaned and "99887766" not in cleaned


# -- renderings (pure) -----------------------------------------------------------------------------------


def test_the_signature_is_the_reference_librarys() -> None:
    secret = new_webhook_secret()
    body = b'{"a":1}'
    when = datetime(2026, 12, 2, 10, 0, tzinfo=UTC)
    mine = payloads.webhook_signature(secret, "evt_1", int(when.timestamp()), body)
    assert mine == Webhook(secret).sign("evt_1", when, body.decode())
    unpadded = secret.rstrip("=")  # the reference library accepts it; so does the signer
    assert payloads.webhook_signature(unpadded, "evt_1", 5, body) == payloads.webhook_signature(
        secret, "evt_1", 5, body
    )
    event = make_event()
    headers = payloads.webhook_headers(event, body, 5, None)
    assert "webhook-signature" not in headers and headers["webhook-id"] == event.event_id


def test_alertmanager_rendering() -> None:
    now = datetime(2026, 12, 2, 10, 5, tzinfo=UTC)
    event = make_event()
    (alert,) = payloads.alertmanager_alerts(event, now, timedelta(minutes=10))
    assert alert["labels"] == {
        "alertname": "GpulensFinding",
        "kind": "idle_held",
        "org": ORG,
        "execution_id": "exe-1",
        "hostname": "gpu-a",
        "severity": "critical",  # the rule's
    }
    assert alert["annotations"]["summary"] == "2 GPUs held idle for 1 h 30 min"
    assert "host gpu-a" in alert["annotations"]["description"]
    assert "3.00 GPU-hours" in alert["annotations"]["description"]
    assert alert["startsAt"] == "2026-12-02T08:30:00.000Z"
    assert alert["endsAt"] == "2026-12-02T10:15:00Z"
    assert alert["generatorURL"] == "https://gpulens.example/ui/executions/exe-1"
    stop = make_event(EventType.STOP_REQUESTED)
    stop.payload["dryRun"] = True
    (stop_alert,) = payloads.alertmanager_alerts(stop, now, timedelta(minutes=10))
    assert stop_alert["labels"]["alertname"] == "GpulensStopRequested"
    assert "stop requested (dry run)" in stop_alert["annotations"]["description"]
    bare = AlertEvent("evt_2", ORG, EventType.RESOLVED, now, None, None, {})
    (bare_alert,) = payloads.alertmanager_alerts(bare, now, timedelta(minutes=10))
    assert bare_alert["labels"] == {"alertname": "GpulensFinding", "org": ORG, "severity": "warning"}
    assert bare_alert["endsAt"] == "2026-12-02T10:05:00Z"


def test_titles_and_messages() -> None:
    firing = make_event()
    assert payloads.title(firing) == "gpulens: idle_held on exe-1"
    assert payloads.title(make_event(EventType.RESOLVED)) == "gpulens: resolved: idle_held on exe-1"
    stop = make_event(EventType.STOP_REQUESTED)
    stop.payload["dryRun"] = True
    assert payloads.title(stop) == "gpulens: stop requested (dry run) for exe-1 (idle_held)"
    lines = payloads.message(firing).splitlines()
    assert lines[0] == "2 GPUs held idle for 1 h 30 min"
    assert lines[-1] == "https://gpulens.example/ui/executions/exe-1"
    assert payloads.apprise_notify_type(firing) == "failure"  # critical
    assert payloads.apprise_notify_type(make_event(EventType.RESOLVED)) == "success"
    assert payloads.webhook_body(firing) == orjson.dumps(firing.payload)
