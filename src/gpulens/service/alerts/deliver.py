"""Delivery of alert events (docs/alerts.md): pending deliveries are claimed row by row, sent per
channel type, and end delivered, pending again after a backoff, or failed.

- An attempt is bounded by `timeout_s` (httpx's timeouts, Apprise's socket timeouts, and a wait_for
  around both): a slow receiver costs one attempt, never the loop.
- Backoff: `backoff_base * 2**(attempts - 1)`, at most `backoff_max`, times a jitter in
  [1 - jitter, 1 + jitter]. A delivery whose next attempt would come later than its creation plus
  `retry_for` ends failed.
- A channel failing for `retry_for` is disabled by the store (`channel_failed`); its deliveries then
  end failed with `channel disabled: <why>`; a success clears the channel's failing state.
- A webhook answering 410 Gone (Standard Webhooks: "stop sending") ends its delivery failed at once
  and disables the channel at once.
- Errors stored or logged never hold the channel's secret, a URL's user info or query string, or an
  Apprise URL's tokens (`redact`).
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from functools import partial
from types import TracebackType
from typing import Any
from urllib.parse import parse_qsl, quote, urlsplit

import anyio
import httpx
import orjson

from gpulens.domain.alerts import (
    USER_PLACEHOLDER,
    AlertEvent,
    Channel,
    ChannelType,
    Delivery,
    DeliveryStatus,
    EventType,
    new_id,
    per_user,
)
from gpulens.service.alerts import payloads
from gpulens.storage.alerts import AlertStore

log = logging.getLogger(__name__)

USER_AGENT = "gpulens-alerts"
TEST_USER = "gpulens-test"  # the user a per-user channel's test event is addressed to
ERROR_CHARS = 500  # the longest error text stored
_CLAIM_MARGIN = timedelta(seconds=30)  # held beyond the batch's longest send (store writes, a slow loop)


def utc_now() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True, slots=True)
class DeliveryOptions:
    """How deliveries are sent and retried (`Settings`: alerts_retry_for, alerts_timeout, public_url)."""

    retry_for: timedelta = timedelta(
        days=1
    )  # a delivery is retried this long; a channel failing so long is disabled
    timeout_s: float = 10.0  # one attempt, connect to answer
    backoff_base: timedelta = timedelta(seconds=30)  # after the first failed attempt; doubling
    backoff_max: timedelta = timedelta(hours=1)
    jitter: float = 0.2  # the backoff times a uniform factor in [1 - jitter, 1 + jitter]
    concurrency: int = 8  # attempts in flight at once
    alertmanager_hold: timedelta = timedelta(hours=1)  # a firing alert's endsAt: the attempt's time + this
    public_url: str | None = None  # the dashboard's address (the test event's link)

    def __post_init__(self) -> None:
        if self.timeout_s <= 0 or self.concurrency < 1 or not 0 <= self.jitter < 1:
            raise ValueError("timeout_s > 0, concurrency >= 1 and 0 <= jitter < 1")
        if self.backoff_base <= timedelta(0) or self.backoff_max < self.backoff_base:
            raise ValueError("0 < backoff_base <= backoff_max")


@dataclass(frozen=True, slots=True)
class Attempt:
    """What one send did: delivered, or not with a (redacted) error; `gone`: the receiver said 410."""

    ok: bool
    error: str | None = None
    gone: bool = False


# -- redaction ------------------------------------------------------------------------------------------

_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*://[^\s'\"<>()\[\]{}]+")
_MIN_SECRET = 4  # shorter fragments are not searched for (they would blank ordinary words)


def redact_url(url: str) -> str:
    """An http(s) URL without its user info, query and fragment; any other scheme (Apprise's tokens
    live in the host and path) as `scheme://***`."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<url>"
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https"):
        return f"{scheme}://***"
    netloc = parts.netloc.rpartition("@")[2]
    if parts.netloc != netloc:
        netloc = "***@" + netloc
    query = "?***" if parts.query else ""
    return f"{scheme}://{netloc}{parts.path}{query}"


def channel_secrets(channel: Channel) -> list[str]:
    """The texts of a channel that no error may show: its secret (and the key inside it), the URL's
    password and query values, and for Apprise every part of the URL after the scheme."""
    found: list[str] = []
    if channel.secret:
        found += [channel.secret, channel.secret.removeprefix(payloads.SECRET_PREFIX)]
    try:
        parts = urlsplit(channel.url)
    except ValueError:
        return [*found, channel.url]
    found += [p for p in (parts.password, parts.username) if p]
    found += [value for _, value in parse_qsl(parts.query)]
    if channel.type is ChannelType.APPRISE or parts.scheme.lower() not in ("http", "https"):
        found.append(channel.url.partition("://")[2])
        found += [parts.netloc, *parts.path.split("/")]
    return found


def redact(text: str, secrets: Iterable[str] = ()) -> str:
    """`text` without the given secrets (longest first) and with every URL in it redacted; cut to
    ERROR_CHARS."""
    for secret in sorted({s for s in secrets if s and len(s) >= _MIN_SECRET}, key=len, reverse=True):
        text = text.replace(secret, "***")
    text = _URL.sub(lambda m: redact_url(m.group()), text)
    return text if len(text) <= ERROR_CHARS else text[: ERROR_CHARS - 1] + "…"


def user_url(url: str, user: str) -> str:
    """A per-user channel's URL for `user`: every `{user}` replaced by the name percent-escaped (all but
    RFC 3986's unreserved characters: `alice@example.org` is `alice%40example.org`), so that a name
    never changes the URL's structure (a `+` read as a space, an `&` starting a parameter)."""
    return url.replace(USER_PLACEHOLDER, quote(user, safe="-._~"))


# -- the deliverer ----------------------------------------------------------------------------------------


class Deliverer:
    """Sends the registry's pending deliveries (`run_once`, `run_forever`) and test events (`send_test`).

    Several deliverers (replicas, or one after a restart) may share a registry: a delivery is claimed
    by one of them for the batch's longest possible duration, and one that dies holding it leaves it to
    the others once the claim lapses. An event is stored before it is sent, so a restart loses none; a
    receiver may see one event twice (a crash between its 2xx and the store's write) and tells by the
    stable `webhook-id`.
    """

    def __init__(
        self,
        store: AlertStore,
        *,
        options: DeliveryOptions | None = None,
        clock: Callable[[], datetime] = utc_now,
        transport: httpx.AsyncBaseTransport | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.store = store
        self.options = options or DeliveryOptions()
        self.clock = clock
        self.rng = rng or random.Random()  # noqa: S311 - backoff jitter, not a secret
        timeout = httpx.Timeout(self.options.timeout_s)
        self.client = httpx.AsyncClient(
            transport=transport, timeout=timeout, follow_redirects=False, headers={"user-agent": USER_AGENT}
        )

    async def aclose(self) -> None:
        await self.client.aclose()

    async def __aenter__(self) -> Deliverer:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    # -- the schedule -------------------------------------------------------------------------------------
    def backoff(self, attempts: int) -> timedelta:
        """The wait after the `attempts`-th failed attempt (1, 2, ...), jittered."""
        o = self.options
        base = o.backoff_base.total_seconds()
        doublings = min(max(attempts - 1, 0), 62)
        delay = min(base * 2.0**doublings, o.backoff_max.total_seconds())
        return timedelta(seconds=delay * self.rng.uniform(1 - o.jitter, 1 + o.jitter))

    def claim_hold(self, limit: int) -> timedelta:
        """How long a batch of `limit` holds its claims: every wave of `concurrency` sends at its
        timeout, plus a margin."""
        waves = math.ceil(max(limit, 1) / self.options.concurrency)
        return timedelta(seconds=waves * self.options.timeout_s) + _CLAIM_MARGIN

    # -- the loop -------------------------------------------------------------------------------------------
    async def run_once(self, limit: int = 50) -> int:
        """Claim up to `limit` due deliveries, send them (at most `concurrency` at once), store each
        outcome; the number claimed."""
        now = self.clock()
        claimed = await anyio.to_thread.run_sync(
            partial(self.store.claim_due, now, self.claim_hold(limit), limit)
        )
        if not claimed:
            return 0
        gate = asyncio.Semaphore(self.options.concurrency)

        async def one(delivery: Delivery) -> None:
            async with gate:
                try:
                    await self._deliver(delivery)
                except Exception:  # one delivery's bug must not lose the batch; its claim lapses
                    log.exception("alert delivery %s failed unexpectedly", delivery.delivery_id)

        await asyncio.gather(*(one(d) for d in claimed))
        return len(claimed)

    async def run_forever(self, interval_s: float, limit: int = 50) -> None:
        """`run_once` every `interval_s` (at once again while batches come back full) until cancelled;
        an error is logged and the loop goes on."""
        while True:
            try:
                sent = await self.run_once(limit)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("alert delivery pass failed; next in %.0f s", interval_s)
                sent = 0
            if sent < limit:
                await asyncio.sleep(interval_s)

    async def _deliver(self, delivery: Delivery) -> None:
        event, channel = await anyio.to_thread.run_sync(self._load, delivery)
        attempts = delivery.attempts + 1
        if event is None or channel is None:
            what = "event" if event is None else "channel"
            await self._done(delivery, DeliveryStatus.FAILED, attempts - 1, f"{what} no longer exists", None)
            return
        if channel.disabled_at is not None:
            error = f"channel disabled: {channel.disabled_reason or 'failing'}"
            await self._done(delivery, DeliveryStatus.FAILED, attempts - 1, error, None)
            return
        attempt = await self.attempt(channel, event)
        if attempt.ok:
            await self._done(delivery, DeliveryStatus.DELIVERED, attempts, None, None)
            if channel.failing_since is not None:  # a write only when there is a failing state to clear
                await anyio.to_thread.run_sync(self.store.channel_succeeded, channel.channel_id)
            return
        error = attempt.error or "failed"
        now = self.clock()
        # a 410 from one user's address (a per-user channel) ends that delivery, not the channel
        stop = attempt.gone and not per_user(channel.url)
        failed = await anyio.to_thread.run_sync(self._channel_failed, channel.channel_id, now, stop)
        if failed is not None and failed.disabled_at is not None:
            why = failed.disabled_reason or "failing"
            await self._done(
                delivery, DeliveryStatus.FAILED, attempts, f"{error}; channel disabled: {why}", None
            )
            log.warning("alert channel %s disabled: %s", channel.channel_id, why)
            return
        next_at = now + self.backoff(attempts)
        if attempt.gone or next_at > delivery.created_at + self.options.retry_for:
            await self._done(delivery, DeliveryStatus.FAILED, attempts, error, None)
        else:
            await self._done(delivery, DeliveryStatus.PENDING, attempts, error, next_at)
        log.info("alert delivery %s attempt %d failed: %s", delivery.delivery_id, attempts, error)

    def _load(self, delivery: Delivery) -> tuple[AlertEvent | None, Channel | None]:
        return (
            self.store.get_event(delivery.event_id),
            self.store.get_channel(delivery.org, delivery.channel_id),
        )

    def _channel_failed(self, channel_id: str, now: datetime, gone: bool) -> Channel | None:
        if not gone:
            return self.store.channel_failed(channel_id, now, disable_after=self.options.retry_for)
        return self.store.disable_channel(channel_id, now, "the receiver answered 410 Gone (stop sending)")

    async def _done(
        self,
        delivery: Delivery,
        status: DeliveryStatus,
        attempts: int,
        error: str | None,
        next_attempt_at: datetime | None,
    ) -> None:
        done = partial(
            self.store.delivery_done,
            delivery.delivery_id,
            status=status,
            attempts=attempts,
            error=error,
            next_attempt_at=next_attempt_at,
            now=self.clock(),
        )
        await anyio.to_thread.run_sync(done)

    # -- sending ------------------------------------------------------------------------------------------
    async def send_test(self, channel: Channel) -> tuple[bool, str | None]:
        """Send a `channel.test` event to `channel` now (nothing stored): (delivered, redacted error)."""
        attempt = await self.attempt(channel, self.test_event(channel))
        return attempt.ok, attempt.error

    def test_event(self, channel: Channel) -> AlertEvent:
        now = self.clock()
        event_id = new_id("evt")
        payload: dict[str, Any] = {
            "type": EventType.TEST.value,
            "id": event_id,
            "timestamp": payloads.rfc3339(now),
            "org": channel.org,
            "channel": {"id": channel.channel_id, "type": channel.type.value},
            "message": "gpulens test notification: this channel receives the org's alerts",
        }
        if self.options.public_url:
            payload["url"] = self.options.public_url.rstrip("/") + "/ui/"
        if per_user(channel.url):
            payload["user"] = TEST_USER
        return AlertEvent(
            event_id=event_id,
            org=channel.org,
            type=EventType.TEST,
            created_at=now,
            execution_id=None,
            rule_id=None,
            payload=payload,
        )

    async def attempt(self, channel: Channel, event: AlertEvent) -> Attempt:
        """One attempt to send `event` to `channel`, never longer than the timeout (plus a second for
        the worker thread to report) and never raising for the receiver's failures. A per-user channel
        is sent to at its URL filled with the event's `user`."""
        if per_user(channel.url):
            user = event.payload.get("user")
            if not isinstance(user, str) or not user:
                return Attempt(False, "a per-user channel ({user} in its URL) takes events for a user only")
            channel = replace(channel, url=user_url(channel.url, user))
        try:
            async with asyncio.timeout(self.options.timeout_s + 1.0):
                if channel.type is ChannelType.WEBHOOK:
                    result = await self._webhook(channel, event)
                elif channel.type is ChannelType.ALERTMANAGER:
                    result = await self._alertmanager(channel, event)
                else:
                    result = await self._apprise(channel, event)
        except TimeoutError:
            result = Attempt(False, f"timed out after {self.options.timeout_s:g} s")
        except httpx.TimeoutException as exc:
            result = Attempt(False, f"timed out after {self.options.timeout_s:g} s ({type(exc).__name__})")
        except (httpx.HTTPError, httpx.InvalidURL, OSError, ValueError) as exc:
            # what others wrote (an exception's text may quote the URL) is redacted; our own words not
            result = Attempt(False, f"{type(exc).__name__}: {redact(str(exc), channel_secrets(channel))}")
        return result

    async def _post(self, channel: Channel, url: str, content: bytes, headers: dict[str, str]) -> Attempt:
        response = await self.client.post(url, content=content, headers=headers)
        if response.is_success:
            return Attempt(True)
        body = redact(response.text[:200].strip(), channel_secrets(channel))  # a receiver may echo the URL
        reason = f"HTTP {response.status_code}" + (f": {body}" if body else "")
        return Attempt(False, reason, gone=response.status_code == 410)

    async def _webhook(self, channel: Channel, event: AlertEvent) -> Attempt:
        body = payloads.webhook_body(event)
        stamp = int(self.clock().timestamp())
        headers = payloads.webhook_headers(event, body, stamp, channel.secret)
        attempt = await self._post(channel, channel.url, body, headers)
        return attempt

    async def _alertmanager(self, channel: Channel, event: AlertEvent) -> Attempt:
        alerts = payloads.alertmanager_alerts(event, self.clock(), self.options.alertmanager_hold)
        url = channel.url.rstrip("/") + "/api/v2/alerts"
        attempt = await self._post(channel, url, orjson.dumps(alerts), {"content-type": "application/json"})
        return Attempt(attempt.ok, attempt.error)  # a 410 from Alertmanager is no request to stop

    async def _apprise(self, channel: Channel, event: AlertEvent) -> Attempt:
        title, body, kind = (
            payloads.title(event),
            payloads.message(event),
            payloads.apprise_notify_type(event),
        )
        ok = await anyio.to_thread.run_sync(
            partial(_apprise_notify, channel.url, title, body, kind, self.options.timeout_s),
            abandon_on_cancel=True,
        )
        return Attempt(True) if ok else Attempt(False, "apprise: the notification was not sent")


def _apprise_notify(url: str, title: str, body: str, notify_type: str, timeout_s: float) -> bool:
    """Apprise's blocking send, in a worker thread, with its socket timeouts set to ours."""
    import apprise  # imported on first use: a few hundred plugins

    plugin = apprise.Apprise.instantiate(url)
    if plugin is None:
        raise ValueError("apprise cannot read this channel's URL")
    plugin.socket_connect_timeout = timeout_s
    plugin.socket_read_timeout = timeout_s
    sender = apprise.Apprise()
    sender.add(plugin)
    return bool(sender.notify(body=body, title=title, notify_type=notify_type))
