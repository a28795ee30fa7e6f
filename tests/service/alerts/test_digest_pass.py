"""The digests' pass over a SQLite registry (service/alerts/digest.py, docs/alerts.md "Digests"):
executions of two orgs with stored usage slices, a digest rule per org, a fake clock, two passes
(replicas) on one registry and a webhook receiver on 127.0.0.1 that checks every signature. A period is
sent once, after it ended, by one replica; users under the threshold get nothing; the figures are the
usage table's; nothing of one org reaches the other's channels."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import anyio
import orjson
import pytest
from sqlalchemy import func, select
from standardwebhooks import Webhook

from gpulens.domain.alerts import AlertRule, DeliveryStatus
from gpulens.domain.models import Execution, ExecutionStatus, Principal
from gpulens.domain.timeparse import datetime_to_ms
from gpulens.domain.usage import UsageSlice
from gpulens.service.alerts.deliver import Deliverer, DeliveryOptions
from gpulens.service.alerts.digest import Digester, DigestOptions
from gpulens.service.alerts.rules import AlertService
from gpulens.service.usage import UsageService
from gpulens.storage.alerts import AlertStore
from gpulens.storage.digests import DigestStore
from gpulens.storage.registry import Registry
from gpulens.storage.summaries import SummaryInfo, SummaryStore
from gpulens.storage.tables import AlertDeliveryRow, AlertDigestRow, AlertEventRow
from gpulens.storage.usage import UsageStore

HOUR = 3_600_000
CREATED = datetime(2026, 11, 18, 10, 0, tzinfo=UTC)  # the rules' creation: periods from 11-18 00:00
PERIOD_END = datetime(2026, 11, 25, tzinfo=UTC)
SECRET = "whsec_" + "QUJD" * 10 + "QUI="  # the base64 of 32 bytes


@dataclass
class Clock:
    now: datetime = CREATED

    def __call__(self) -> datetime:
        return self.now


@dataclass
class Received:
    path: str
    body: dict[str, Any]
    verified: bool


@dataclass
class Receiver:
    url: str = ""
    received: list[Received] = field(default_factory=list)

    def paths(self) -> list[str]:
        return sorted(r.path for r in self.received)

    def at(self, path: str) -> dict[str, Any]:
        (found,) = [r.body for r in self.received if r.path == path]
        return found


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    state = Receiver()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("content-length", "0")))
            headers = {k.lower(): v for k, v in self.headers.items()}
            try:
                Webhook(SECRET).verify(body, headers)
                verified = True
            except Exception:
                verified = False
            state.received.append(Received(self.path, orjson.loads(body), verified))
            self.send_response(204)
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


def at(day: int, hour: int = 0) -> datetime:
    return datetime(2026, 11, day, hour, tzinfo=UTC)


def store_run(
    registry: Registry,
    execution_id: str,
    org: str,
    user: str | None,
    start: datetime,
    end: datetime,
    *,
    gpus: int = 1,
    idle: float = 0.0,  # the share of each GPU-hour idle
    held: float = 0.0,  # ... idle with memory held
    input_bound: float = 0.0,
    project: str = "nlp",
) -> None:
    """A finished execution and its stored hourly usage slices (as the summary's receipt cuts them)."""
    registry.upsert_execution(
        Execution(
            execution_id=execution_id,
            org=org,
            hostname="gpu-a",
            gpus=tuple(str(g) for g in range(gpus)),
            status=ExecutionStatus.COMPLETED,
            created_at=start,
            start_time=start,
            end_time=end,
            user=user,
            project=project,
        ),
        now=end,
    )
    slices = []
    lo_ms, hi_ms = datetime_to_ms(start), datetime_to_ms(end)
    hour = lo_ms - lo_ms % HOUR
    while hour < hi_ms:
        lo, hi = max(lo_ms, hour), min(hi_ms, hour + HOUR)
        gpu_ms = gpus * (hi - lo)
        slices.append(
            UsageSlice(
                hour_ms=hour,
                start_ms=lo,
                end_ms=hi,
                gpu_ms=gpu_ms,
                idle_ms=round(gpu_ms * idle),
                idle_held_ms=round(gpu_ms * held),
                input_bound_ms=round(gpu_ms * input_bound),
                throttled_ms=0,
                useful_gpu_s=gpu_ms / 1000 * 0.3,
                energy_j=gpu_ms * 0.25,
                cost=gpu_ms / HOUR * 2.0,
            )
        )
        hour += HOUR
    info = SummaryInfo(execution_id, org, "k", "s", end, end + timedelta(minutes=5), 1, 2, {})
    SummaryStore(registry).put(info, b"{}", slices)


@dataclass
class World:
    registry: Registry
    clock: Clock
    service: AlertService
    rules: dict[str, AlertRule]
    receiver: Receiver

    def digester(self, holder: str) -> Digester:
        options = DigestOptions(interval_s=60.0, public_url="https://gpulens.example")
        return Digester(AlertStore(self.registry), DigestStore(self.registry), self.clock, options, holder)

    def count(self, table: Any, **where: str) -> int:
        with self.registry.transaction() as session:
            stmt = select(func.count()).select_from(table)
            for name, value in where.items():
                stmt = stmt.where(getattr(table, name) == value)
            return int(session.scalar(stmt) or 0)

    async def deliver(self) -> None:
        # on the real clock: the receiver checks each signature's timestamp against its own (5 minutes)
        options = DeliveryOptions(timeout_s=5.0, jitter=0.0)
        async with Deliverer(AlertStore(self.registry), options=options) as deliverer:
            while await deliverer.run_once():
                pass


def run(fn: Callable[..., Any], *args: Any) -> Any:
    async def call() -> Any:
        return await fn(*args)

    return anyio.run(call)


@pytest.fixture
def world(registry: Registry, receiver: Receiver) -> World:
    for org in ("acme", "beta"):
        registry.ensure_org(org)
    # acme, in the period [11-18, 11-25): alice wastes 30 GPU-hours idle (20 idle, 10 held), bob 1,
    # carol's run crosses the period's end (8 idle GPU-hours inside it, 8 after); executions without a
    # user and of another project count in the table
    store_run(registry, "a-1", "acme", "alice", at(19, 8), at(19, 18), gpus=4, idle=0.5, held=0.25)
    store_run(registry, "a-2", "acme", "alice", at(20, 8), at(20, 13), input_bound=0.4)
    store_run(registry, "b-1", "acme", "bob", at(21, 0), at(21, 10), idle=0.1)
    store_run(registry, "c-1", "acme", "carol", at(24, 20), at(25, 4), gpus=2, idle=1.0)
    store_run(registry, "n-1", "acme", None, at(22, 0), at(22, 4), idle=1.0)
    # beta: another alice, wasting far more; acme's channels must never hear of her
    store_run(registry, "x-1", "beta", "alice", at(19, 0), at(21, 0), gpus=4, idle=0.9)
    clock = Clock()
    service = AlertService(AlertStore(registry), clock=clock)
    rules = {}
    for org, prefix in (("acme", ""), ("beta", "/beta")):
        personal = run(
            lambda o=org, p=prefix: service.create_channel(
                o, type="webhook", url=f"{receiver.url}{p}/digest/{{user}}", secret=SECRET
            )
        )
        copy = run(
            lambda o=org, p=prefix: service.create_channel(
                o, type="webhook", url=f"{receiver.url}{p}/copy", secret=SECRET
            )
        )
        rules[org] = run(
            lambda o=org, c=(personal, copy): service.create_rule(
                o,
                kind="digest",
                every="7d",
                min_idle_gpu_hours=24,
                channels=[ch.channel_id for ch in c],
            )
        )
    return World(registry, clock, service, rules, receiver)


async def test_a_period_is_sent_once_after_it_ended_by_one_replica(world: World) -> None:
    first, second = world.digester("replica-1"), world.digester("replica-2")
    world.clock.now = PERIOD_END + timedelta(minutes=5)  # ended, not settled: nothing yet
    report = await first.run_once()
    assert report.held and report.sent == []
    world.clock.now = PERIOD_END + timedelta(minutes=10)
    report = await first.run_once()
    end_ms = datetime_to_ms(PERIOD_END)
    assert sorted(report.sent) == sorted((r.rule_id, end_ms) for r in world.rules.values())
    assert report.events == 4  # per org: alice's digest and the copy
    # the other replica: the lease is held, then (lease expired) the period is already recorded
    assert not (await second.run_once()).held
    world.clock.now += timedelta(minutes=5)
    again = await second.run_once()
    assert again.held and again.sent == [] and again.events == 0
    # a replica that read the record before the first one wrote it: the period's key refuses it
    stale = world.digester("replica-3")
    stale.store.last_digests = lambda: {}  # type: ignore[method-assign]
    stale.store.take_lease = lambda *a: True  # type: ignore[method-assign]
    late = await stale.run_once()
    assert late.sent == [] and late.events == 0 and late.errors == 0
    assert world.count(AlertDigestRow) == 2 and world.count(AlertEventRow) == 4
    assert world.count(AlertDeliveryRow) == 4

    await world.deliver()
    received = world.receiver
    assert all(r.verified for r in received.received)
    assert received.paths() == ["/beta/copy", "/beta/digest/alice", "/copy", "/digest/alice"]
    assert world.count(AlertDeliveryRow, status=DeliveryStatus.DELIVERED.value) == 4

    alice = received.at("/digest/alice")
    assert alice["type"] == "usage.digest" and alice["org"] == "acme" and alice["user"] == "alice"
    assert alice["period"] == {"start": "2026-11-18T00:00:00Z", "end": "2026-11-25T00:00:00Z"}
    row = alice["usage"]
    assert row["executions"] == 2 and row["gpuHours"] == pytest.approx(45)
    assert (row["idleGpuHours"], row["idleHeldGpuHours"], row["inputBoundGpuHours"]) == pytest.approx(
        (20, 10, 2)
    )
    assert row["cost"] == pytest.approx(90)
    assert [w["id"] for w in alice["worstExecutions"]] == ["a-1", "a-2"]
    assert alice["worstExecutions"][0]["url"] == "https://gpulens.example/ui/executions/a-1"

    copy = received.at("/copy")
    assert copy["user"] is None and copy["notified"] == ["alice"]
    rows = {u["group"]["user"]: u for u in copy["users"]}
    assert set(rows) == {"alice", "bob", "carol", None}
    assert rows["carol"]["idleGpuHours"] == pytest.approx(8)  # the part of c-1 inside the period
    assert rows["bob"]["idleGpuHours"] == pytest.approx(1) and not rows["bob"]["notified"]
    assert copy["totals"]["gpuHours"] == pytest.approx(45 + 10 + 8 + 4)
    # the table's figures are the usage table's (GET /api/v2/external/usage?group_by=user)
    usage = UsageService(UsageStore(world.registry), clock=world.clock)
    table = await usage.table(
        Principal(org="acme", subject="t"),
        datetime_to_ms(CREATED) - 10 * HOUR,
        datetime_to_ms(PERIOD_END),
        ["user"],
    )
    for group in table.groups:
        mine = rows[group.keys["user"]]  # type: ignore[index]
        assert mine["gpuHours"] == pytest.approx(group.gpu_hours)
        assert mine["idleHeldGpuHours"] == pytest.approx(group.idle_held_gpu_hours)
        assert mine["cost"] == pytest.approx(group.cost)

    # another org's figures never leak: acme's payloads know nothing of beta's alice, and back
    acme_text = orjson.dumps([alice, copy]).decode()
    assert "x-1" not in acme_text and '"beta"' not in acme_text
    beta_alice = received.at("/beta/digest/alice")
    assert beta_alice["org"] == "beta" and beta_alice["usage"]["gpuHours"] == pytest.approx(192)
    beta_text = orjson.dumps([beta_alice, received.at("/beta/copy")]).decode()
    assert not any(name in beta_text for name in ("a-1", "a-2", "b-1", "c-1", "bob", "carol"))


async def test_the_next_period_comes_a_period_later_and_skips_users_under_the_threshold(
    world: World,
) -> None:
    digester = world.digester("replica-1")
    world.clock.now = PERIOD_END + timedelta(minutes=10)
    await digester.run_once()
    await world.deliver()
    world.receiver.received.clear()
    # within the next period: nothing more, however often the pass runs
    for hours in (1, 24, 6 * 24):
        world.clock.now = PERIOD_END + timedelta(hours=hours)
        assert (await digester.run_once()).sent == []
    world.clock.now = PERIOD_END + timedelta(days=7, minutes=10)
    report = await digester.run_once()
    assert len(report.sent) == 2 and report.events == 2  # the copies only: nobody reached 24 idle GPU-h
    await world.deliver()
    assert world.receiver.paths() == ["/beta/copy", "/copy"]
    copy = world.receiver.at("/copy")
    assert copy["period"] == {"start": "2026-11-25T00:00:00Z", "end": "2026-12-02T00:00:00Z"}
    assert copy["notified"] == [] and [u["group"]["user"] for u in copy["users"]] == ["carol"]
    assert copy["users"][0]["idleGpuHours"] == pytest.approx(8)
    assert world.receiver.at("/beta/copy")["users"] == []


async def test_a_deleted_rule_sends_nothing_and_a_rule_without_per_user_channels_only_the_copy(
    world: World,
) -> None:
    await world.service.delete_rule("beta", world.rules["beta"].rule_id)
    acme = world.rules["acme"]
    copy_only = await world.service.create_rule(
        "acme", kind="digest", every="7d", min_idle_gpu_hours=0, channels=[acme.channels[1]]
    )
    world.clock.now = PERIOD_END + timedelta(minutes=10)
    report = await world.digester("replica-1").run_once()
    assert sorted(r for r, _ in report.sent) == sorted([acme.rule_id, copy_only.rule_id])
    await world.deliver()
    # acme's rule: alice and its copy; the rule without a per-user channel: a copy, no user's digest
    assert world.receiver.paths() == ["/copy", "/copy", "/digest/alice"]
    copies = [r.body for r in world.receiver.received if r.path == "/copy"]
    threshold_zero = next(c for c in copies if c["rule"]["id"] == copy_only.rule_id)
    assert threshold_zero["notified"] == ["alice", "carol", "bob"]


async def test_an_apprise_per_user_channel_gets_each_users_text(world: World) -> None:
    port = world.receiver.url.rsplit(":", 1)[1]
    mail = await world.service.create_channel(
        "acme", type="apprise", url=f"json://127.0.0.1:{port}/mail/{{user}}"
    )
    await world.service.delete_rule("beta", world.rules["beta"].rule_id)
    await world.service.delete_rule("acme", world.rules["acme"].rule_id)
    await world.service.create_rule(
        "acme", kind="digest", every="7d", min_idle_gpu_hours=1, channels=[mail.channel_id]
    )
    world.clock.now = PERIOD_END + timedelta(minutes=10)
    assert (await world.digester("replica-1").run_once()).events == 3  # alice, carol, bob: no copy
    await world.deliver()
    assert world.receiver.paths() == ["/mail/alice", "/mail/bob", "/mail/carol"]
    alice = world.receiver.at("/mail/alice")
    assert alice["title"] == "gpulens: your GPU usage, 2026-11-18 to 2026-11-25 UTC"
    lines = alice["message"].splitlines()
    assert lines[0].startswith("alice, 2026-11-18 to 2026-11-25 UTC: 45.0 GPU-hours: 20.0 idle, 10.0 idle")
    assert "- a-1 on gpu-a: 30.0 idle of 40.0 GPU-hours https://gpulens.example/ui/executions/a-1" in lines
    assert "carol" not in alice["message"] and "bob" not in alice["message"]
