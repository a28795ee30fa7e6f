"""Two gpulens replicas on one PostgreSQL and one VictoriaMetrics (docs/operations.md, "Several
stateless replicas on one PostgreSQL").

Each replica is its own app (its own registry engine, authenticator cache, backend client and
caches) served over real HTTP by uvicorn in a thread. What is registered through A is read through
B with the same answers; a key revoked on A is refused by B within 5 s; writes through both at once
all succeed.
"""

from __future__ import annotations

import math
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from gpulens.api.app import create_app
from gpulens.config import Settings
from gpulens.domain.timeparse import format_rfc3339
from gpulens.storage.registry import Registry
from gpulens_testkit.promload import LoadedDataset
from tests.integration.conftest import serve_app
from tests.integration.lyceum_app import execution_body
from tests.storage.conftest import postgres_server, postgres_url  # noqa: F401 - fixtures

pytestmark = pytest.mark.integration

SECRET = "replica-test-secret-of-at-least-32-bytes"
REVOKE_WITHIN_S = 5.0
ORDER_DEPENDENT = {"gpuMemoryUtilizationPercent", "systemCpuUsagePercent"}


@dataclass
class Replicas:
    a: httpx.Client
    b: httpx.Client
    admin: dict[str, str]  # headers of a platform admin key
    alice: dict[str, str]  # headers of an acme key
    data: LoadedDataset


@pytest.fixture(scope="module")
def replicas(
    vm_dataset: LoadedDataset,
    postgres_url: str,  # noqa: F811 - the fixture imported above
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Replicas]:
    bootstrap = Registry.from_url(postgres_url)
    bootstrap.migrate()
    _, admin = bootstrap.create_key("platform", name="scheduler", is_admin=True)
    _, alice = bootstrap.create_key("acme", name="alice")
    bootstrap.dispose()

    def settings(name: str) -> Settings:
        return Settings(
            data_dir=Path(tmp_path_factory.mktemp(name)),
            prometheus_url=vm_dataset.url,
            database_url=postgres_url,
            jwt_secret=SECRET,
            archive_interval=0,  # reads go to the live backend on both (the archive has its own tests)
        )

    # no registry passed: each app opens its own engine on the URL, as `gpulens serve` does
    app_a, app_b = create_app(settings("replica-a")), create_app(settings("replica-b"))
    assert app_a.state.ctx.registry is not app_b.state.ctx.registry
    with (
        serve_app(app_a) as url_a,
        serve_app(app_b) as url_b,
        httpx.Client(base_url=url_a, timeout=60) as a,
        httpx.Client(base_url=url_b, timeout=60) as b,
    ):
        yield Replicas(
            a, b, {"Authorization": f"Bearer {admin}"}, {"Authorization": f"Bearer {alice}"}, vm_dataset
        )
    for app in (app_a, app_b):
        app.state.ctx.registry.dispose()


def ok(r: httpx.Response, *codes: int) -> Any:
    assert r.status_code in (codes or (200,)), (r.request.method, r.request.url, r.status_code, r.text)
    return r.json()


def same(r: Replicas, path: str, headers: dict[str, str], **params: Any) -> Any:
    """GET `path` through both replicas: equal statuses and bodies; the body.

    Exactly equal, except the two Lyceum series whose backend sums run in an order VictoriaMetrics
    does not fix (FB % and CPU %: a sum of per-GPU ratios, of per-CPU rates): equal timestamps,
    values within 1e-9 relative (a second read through the same replica differs alike)."""
    body_a = ok(r.a.get(path, params=params, headers=headers))
    body_b = ok(r.b.get(path, params=params, headers=headers))
    if not (isinstance(body_a, dict) and isinstance(body_b, dict)):
        assert body_a == body_b, path
        return body_b
    for key in ORDER_DEPENDENT & body_a.keys():
        a, b = body_a[key], body_b[key]
        assert [p["timestamp"] for p in a] == [p["timestamp"] for p in b], (path, key)
        for pa, pb in zip(a, b, strict=True):
            assert math.isclose(pa["value"], pb["value"], rel_tol=1e-9, abs_tol=1e-9), (path, key, pa, pb)
    rest_a = {k: v for k, v in body_a.items() if k not in ORDER_DEPENDENT}
    assert rest_a == {k: v for k, v in body_b.items() if k not in ORDER_DEPENDENT}, path
    return body_b


def test_registered_through_a_reads_the_same_through_b(replicas: Replicas) -> None:
    r = replicas
    executions = r.data.scenario.executions
    for e in executions:
        ok(r.a.post("/api/v2/admin/executions", json=execution_body(e), headers=r.admin), 200, 201)
    workload_id = str(uuid.uuid4())
    start = executions[0].start
    pods = [
        {
            "name": f"trainer-{i}",
            "namespace": "team-a",
            "node": executions[0].hostname,
            "gpus": [str(i)],
            "start_time": format_rfc3339(start),
            "end_time": format_rfc3339(start + timedelta(hours=1)),
        }
        for i in range(3)
    ]
    workload = {
        "workload_id": workload_id,
        "name": "trainer",
        "org": "acme",
        "project": "team-a",
        "pods": pods,
    }
    ok(r.a.post("/api/v2/admin/workloads", json=workload, headers=r.admin), 201)
    created = ok(r.a.post("/api/v2/external/auth/api-keys/", json={"key_name": "bob"}, headers=r.alice))
    bob = {"Authorization": f"Bearer {created['api_key']}"}

    # reads through B (a fresh process as far as caches go) equal A's
    for e in executions:
        got = same(r, f"/api/v2/external/execution/{e.execution_id}", bob)
        assert got["execution_id"] == e.execution_id
        metrics = same(r, f"/api/v2/external/execution/{e.execution_id}/metrics", bob)
        assert metrics["hostname"] == e.hostname
    assert any(
        same(r, f"/api/v2/external/execution/{e.execution_id}/metrics", bob)["gpuUtilizationPercent"]
        for e in executions
    ), "no GPU data read at all: the comparison would prove nothing"
    billing = same(r, "/api/v2/external/billing/history", bob)
    assert billing
    keys = same(r, "/api/v2/external/auth/api-keys/", r.alice)
    assert {"alice", "bob"} <= {k["key_name"] for k in keys}
    listed = same(r, f"/api/v2/admin/workloads/{workload_id}/pods", r.admin)
    assert sorted(p["name"] for p in listed["pods"]) == ["trainer-0", "trainer-1", "trainer-2"]
    runai = same(r, f"/api/v1/workloads/{workload_id}/pods", bob)
    assert len(runai["pods"]) == 3
    window = {
        "start": format_rfc3339(start),
        "end": format_rfc3339(start + timedelta(hours=1)),
        "numberOfSamples": "20",
        "metricType": ["GPU_UTILIZATION", "GPU_MEMORY_USAGE_BYTES"],
    }
    same(r, f"/api/v1/workloads/{workload_id}/metrics", bob, **window)
    # a token issued by A works on B (same GPULENS_JWT_SECRET)
    token = ok(
        r.a.post(
            "/api/v1/token",
            json={
                "grantType": "client_credentials",
                "clientID": created["key_prefix"],
                "clientSecret": created["api_key"],
            },
        )
    )["accessToken"]
    same(r, f"/api/v1/workloads/{workload_id}/pods", {"Authorization": f"Bearer {token}"})


def wait_refused(client: httpx.Client, headers: dict[str, str], path: str, limit_s: float) -> float:
    """Seconds until `path` answers 401 (polled every 50 ms); fails after `limit_s` + 5 s."""
    t0 = time.monotonic()
    while True:
        status = client.get(path, headers=headers).status_code
        elapsed = time.monotonic() - t0
        if status == 401:
            return elapsed
        assert status == 200, status
        assert elapsed < limit_s + 5, f"still accepted after {elapsed:.1f} s"
        time.sleep(0.05)


@pytest.mark.parametrize("how", ["revoke", "toggle"])
def test_a_key_revoked_on_a_is_refused_by_b_within_5s(replicas: Replicas, how: str) -> None:
    r = replicas
    created = ok(
        r.a.post("/api/v2/external/auth/api-keys/", json={"key_name": f"carol-{how}"}, headers=r.alice)
    )
    carol = {"Authorization": f"Bearer {created['api_key']}"}
    path = "/api/v2/external/auth/api-keys/validate"
    for client in (r.a, r.b):  # both replicas have it cached now
        assert ok(client.post(path, headers=carol))["valid"] is True
    if how == "revoke":
        ok(r.a.delete(f"/api/v2/external/auth/api-keys/{created['id']}", headers=r.alice))
    else:
        assert (
            ok(r.a.patch(f"/api/v2/external/auth/api-keys/{created['id']}/toggle", headers=r.alice))[
                "is_active"
            ]
            is False
        )
    assert r.a.get("/api/v2/external/auth/api-keys/", headers=carol).status_code == 401  # at once on A
    elapsed = wait_refused(r.b, carol, "/api/v2/external/auth/api-keys/", REVOKE_WITHIN_S)
    assert elapsed < REVOKE_WITHIN_S, f"B accepted the revoked key for {elapsed:.2f} s"
    print(f"{how}: refused by the other replica after {elapsed:.2f} s")  # shown with -s


def run_threads(n: int, work: Callable[[int], None]) -> list[BaseException]:
    errors: list[BaseException] = []
    barrier = threading.Barrier(n)

    def one(i: int) -> None:
        try:
            barrier.wait()
            work(i)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads), "a writer is still running"
    return errors


def test_concurrent_writes_through_both_replicas(replicas: Replicas) -> None:
    """2 x 50 execution upserts (the same 25 ids through both replicas, twice each) and 2 x 25 key
    creations, 8 threads per replica: every one succeeds, and both replicas then list them all."""
    r = replicas
    template = r.data.scenario.executions[0]
    ids = [str(uuid.uuid4()) for _ in range(25)]
    now = datetime.now(UTC).replace(microsecond=0)
    statuses: list[int] = []
    lock = threading.Lock()

    def upsert(client: httpx.Client, execution_id: str, n: int) -> None:
        body = execution_body(template) | {
            "execution_id": execution_id,
            "start_time": format_rfc3339(now - timedelta(hours=2)),
            "end_time": format_rfc3339(now - timedelta(hours=1, minutes=n)),
        }
        resp = client.post("/api/v2/admin/executions", json=body, headers=r.admin)
        with lock:
            statuses.append(resp.status_code)
        ok(resp, 200, 201)

    def create_key(client: httpx.Client, name: str) -> None:
        resp = client.post("/api/v2/external/auth/api-keys/", json={"key_name": name}, headers=r.alice)
        with lock:
            statuses.append(resp.status_code)
        ok(resp)

    jobs: list[Callable[[], None]] = []
    for side, client in (("a", r.a), ("b", r.b)):
        for n in range(2):
            jobs += [lambda c=client, e=e, n=n: upsert(c, e, n) for e in ids]  # type: ignore[misc]
        jobs += [lambda c=client, i=i, s=side: create_key(c, f"load-{s}-{i}") for i in range(25)]  # type: ignore[misc]
    per_thread = 8
    threads = 2 * per_thread
    errors = run_threads(threads, lambda t: [job() for job in jobs[t::threads]] and None)
    assert errors == [], errors[:3]
    assert len(statuses) == 150 and set(statuses) <= {200, 201}, sorted(set(statuses))
    for client in (r.a, r.b):
        listed = ok(
            client.get("/api/v2/admin/executions", params={"org": "acme", "limit": 500}, headers=r.admin)
        )
        assert set(ids) <= {e["execution_id"] for e in listed["executions"]}
        names = {k["key_name"] for k in ok(client.get("/api/v2/external/auth/api-keys/", headers=r.alice))}
        assert {f"load-{s}-{i}" for s in "ab" for i in range(25)} <= names
