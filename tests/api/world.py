"""A whole gpulens app over the embedded store with a little data, two orgs and every kind of caller.

Built once per test module by `build_world(tmp)` for the fuzzer (tests/api/test_fuzz.py) and the tenant
matrix (tests/api/test_tenant_matrix.py):
* samples: an hour of two fake GPUs and the system series of host `gpu-node-1` at 15 s (the agent's
  own readers, written by its collector into a SampleStore), ending at `T_END`;
* org `acme`, project `nlp`: an execution and a workload with one pod on that host; org `beta`: the
  same again (the "other org");
* keys: the platform's admin key, acme's owner key, an acme key limited to project `vision`, a
  revoked and an expired acme key, beta's key, and spare acme keys for the key routes to act on;
* JWTs (HS256): a valid one for acme, an expired one, and one naming `beta` in X-Org-Slug while its
  `orgs` claim holds only acme.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import jwt
from fastapi import FastAPI

from gpulens.agent.collector import Collector
from gpulens.agent.readers.fake import FakeGpuReader
from gpulens.agent.readers.system import SystemReader
from gpulens.api.app import create_app
from gpulens.backends.embedded import EmbeddedBackend
from gpulens.config import Settings
from gpulens.domain.alerts import AlertEvent, AlertRule, Channel, ChannelType, EventType
from gpulens.domain.models import Execution, ExecutionStatus
from gpulens.domain.workloads import Pod, PodPhase, Workload
from gpulens.storage.registry import Registry
from gpulens.storage.samples import SampleStore
from tests.conftest import sqlite_registry

JWT_SECRET = "w" * 48
HOST = "gpu-node-1"
T_END = datetime(2026, 11, 28, 12, 0, tzinfo=UTC)
T_START = T_END - timedelta(hours=1)
STEP_S = 15

EXECUTION = "exec-acme-1"
OTHER_EXECUTION = "exec-beta-1"
MISSING_EXECUTION = "exec-nobody-1"
WORKLOAD = "6f1c1f58-2a0e-4b8a-9d51-1f0a3a1e0a01"
POD = "6f1c1f58-2a0e-4b8a-9d51-1f0a3a1e0b01"
OTHER_WORKLOAD = "7a2d2a69-3b1f-4c9b-8e62-2a1b4b2f1a02"
OTHER_POD = "7a2d2a69-3b1f-4c9b-8e62-2a1b4b2f1b02"
MISSING_WORKLOAD = "00000000-0000-4000-8000-00000000dead"
MISSING_POD = "00000000-0000-4000-8000-00000000beef"


@dataclass
class World:
    app: FastAPI
    registry: Registry
    store: SampleStore
    admin: str
    owner: str  # acme, every project
    project_key: str  # acme, project "vision" only (the data is in "nlp")
    revoked: str
    expired: str
    other_org: str  # beta
    owner_key_id: str
    spare_key_ids: list[str] = field(default_factory=list)  # acme keys the key routes may act on
    other_key_id: str = ""  # a key of beta
    # acme's live alerts: a rule and its channel (with a delivery), and a spare rule and channel to delete
    alert_rule: str = "rul_acme_used"
    alert_channel: str = "chn_acme_used"
    spare_rule: str = "rul_acme_spare"
    spare_channel: str = "chn_acme_spare"
    alert_delivery: str = ""

    def close(self) -> None:
        self.store.close()
        self.registry.dispose()


def user_jwt(orgs: list[str], *, expired: bool = False) -> str:
    now = int(time.time())
    claims = {"sub": "user-1", "orgs": orgs, "exp": now - 60 if expired else now + 3600}
    return jwt.encode(claims, JWT_SECRET, algorithm="HS256")


def _fill_store(store: SampleStore) -> None:
    clock = [T_START.timestamp()]
    collector = Collector(
        [FakeGpuReader(HOST, 2), SystemReader(HOST)], [store], interval_s=STEP_S, clock=lambda: clock[0]
    )
    while clock[0] <= T_END.timestamp():
        collector.collect()
        clock[0] += STEP_S
    store.flush()


def build_world(tmp: Path) -> World:
    registry = sqlite_registry(tmp / "registry.db")
    store = SampleStore.from_path(tmp / "samples.db")
    _fill_store(store)
    _, admin = registry.create_key("platform", name="scheduler", is_admin=True)
    owner_row, owner = registry.create_key("acme", name="owner")
    _, project_key = registry.create_key("acme", name="vision-only", projects=["vision"])
    revoked_row, revoked = registry.create_key("acme", name="revoked")
    registry.revoke_key(revoked_row.key_id)
    _, expired = registry.create_key("acme", name="expired", expires_at=datetime.now(UTC) - timedelta(days=1))
    other_row, other_org = registry.create_key("beta", name="beta")
    spares = [registry.create_key("acme", name=f"spare-{i}")[0].key_id for i in range(4)]
    for org, execution_id, workload_id, pod_id in (
        ("acme", EXECUTION, WORKLOAD, POD),
        ("beta", OTHER_EXECUTION, OTHER_WORKLOAD, OTHER_POD),
    ):
        _register(registry, org, execution_id, workload_id, pod_id)
    settings = Settings(data_dir=tmp, prometheus_url=None, database_url=registry.url, jwt_secret=JWT_SECRET)
    app = create_app(settings, registry=registry, backend=EmbeddedBackend(store))
    delivery = _alerts(app)
    return World(
        app=app,
        registry=registry,
        store=store,
        admin=admin,
        owner=owner,
        project_key=project_key,
        revoked=revoked,
        expired=expired,
        other_org=other_org,
        owner_key_id=owner_row.key_id,
        spare_key_ids=spares,
        other_key_id=other_row.key_id,
        alert_delivery=delivery,
    )


def _alerts(app: FastAPI) -> str:
    """acme's rules and channels (beta's too), a delivery of acme; a channel test that always works."""
    alerts = app.state.ctx.alerts
    store = alerts.store
    for org, channels, rules in (
        ("acme", ("chn_acme_used", "chn_acme_spare"), ("rul_acme_used", "rul_acme_spare")),
        ("beta", ("chn_beta_used",), ("rul_beta_used",)),
    ):
        for channel_id in channels:
            store.add_channel(
                Channel(
                    channel_id, org, ChannelType.WEBHOOK, "https://hooks.example.com/x", "whsec_x", T_START
                )
            )
        for rule_id in rules:
            store.add_rule(
                AlertRule(rule_id, org, "idle_held", 1_800_000, (channels[0],), created_at=T_START)
            )
    event = AlertEvent("evt_acme_1", "acme", EventType.FIRING, T_START, EXECUTION, "rul_acme_used", {})
    (delivery,) = store.add_event(event, ["chn_acme_used"], T_START)

    async def tester(channel: Channel) -> tuple[bool, str | None]:
        return True, None

    alerts.tester = tester
    return str(delivery.delivery_id)


def _register(registry: Registry, org: str, execution_id: str, workload_id: str, pod_id: str) -> None:
    registry.upsert_execution(
        Execution(
            execution_id=execution_id,
            org=org,
            hostname=HOST,
            gpus=("0", "1"),
            status=ExecutionStatus.COMPLETED,
            created_at=T_START,
            start_time=T_START + timedelta(minutes=5),
            end_time=T_END - timedelta(minutes=5),
            hardware_profile="gpu.h100",
            project="nlp",
        )
    )
    registry.upsert_workload(
        Workload(workload_id, f"train-{org}", org, "nlp", T_START),
        [
            Pod(
                pod_id=pod_id,
                workload_id=workload_id,
                name=f"train-{org}-0",
                namespace=org,
                node=HOST,
                gpus=("0", "1"),
                phase=PodPhase.SUCCEEDED,
                start_time=T_START + timedelta(minutes=5),
                end_time=T_END - timedelta(minutes=5),
            )
        ],
    )
