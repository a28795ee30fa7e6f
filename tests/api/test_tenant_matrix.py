"""Every route x every kind of caller (issue 10, item 6): the expected status, and nothing leaked.

The routes are enumerated from the app (`app.routes`), so a new route fails `test_every_route_is_in
_the_matrix` until it says how it treats each caller. The world (tests/api/world.py): org `acme` owns an
execution, a workload and a pod in project `nlp`; org `beta` owns the same kinds.

Callers: the owner (acme's key; the platform's admin key on admin routes), another org (beta's key),
a key of acme limited to project `vision`, a revoked key, an expired key, an expired JWT, and a JWT
of acme that names `beta` in X-Org-Slug.

Expected, by what a route serves:
* an object of acme (an execution's metrics, summary, export or record, a workload's metrics,
  pods, a pod's metrics): owner 200; other org 404; the project key 403; revoked, expired key and
  expired JWT 401; the foreign X-Org-Slug 403;
* an API key of acme (revoke, toggle): as an object, but the project key gets 404: a key it may
  not manage does not exist for it;
* the caller's own organization (lists, key creation, validation): 200 for every valid caller,
  and the bodies of the other org and the project key never name acme's objects;
* live alerts (rules, channels, deliveries: the org's, not a project's): lists and creation 2xx for
  the owner and the other org (its own), a rule naming acme's channel 422 for the other org; one
  rule, channel or delivery of acme (and a snooze of acme's execution) as an object; the project
  key 403 on every one of them;
* admin routes: 2xx for the admin key, 403 for every ordinary key, 401 for unusable credentials;
* public routes (token grant, health, metrics, the API description, the dashboard's pages, which
  hold no data): the same answer whoever calls.
And for every object route: the other org's 404 body is byte-identical to the 404 for ids that
do not exist.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.api import world as w
from tests.api.conftest import Client

OBJECT, KEY, OWN, ADMIN, PUBLIC = "object", "key", "own", "admin", "public"
# live alerts are the org's, not a project's: a key limited to projects manages none (403)
ORG, ORG_REF = "org", "org_ref"

CALLERS = ("owner", "other_org", "project_key", "revoked", "expired", "expired_jwt", "foreign_org_jwt")
EXPECTED: dict[str, dict[str, int | None]] = {  # None: any 2xx
    OBJECT: {"owner": None, "other_org": 404, "project_key": 403},
    KEY: {"owner": None, "other_org": 404, "project_key": 404},
    OWN: {"owner": None, "other_org": None, "project_key": None},
    ADMIN: {"owner": None, "other_org": 403, "project_key": 403},
    ORG: {"owner": None, "other_org": None, "project_key": 403},
    # a body naming acme's objects (a rule's channels): the other org is told they are not its own
    ORG_REF: {"owner": None, "other_org": 422, "project_key": 403},
}
UNUSABLE = {"revoked": 401, "expired": 401, "expired_jwt": 401, "foreign_org_jwt": 403}

WINDOW = {"start": "2026-11-28T11:10:00Z", "end": "2026-11-28T11:20:00Z"}
RUNAI = {**WINDOW, "metricType": "GPU_UTILIZATION", "numberOfSamples": "5"}
ACME_IDS = (w.EXECUTION, w.WORKLOAD, w.POD)


@dataclass
class Spec:
    kind: str
    path: dict[str, str] = field(default_factory=dict)  # acme's object (the owner's)
    query: dict[str, str | list[str]] = field(default_factory=dict)
    body: Any = None
    missing: dict[str, str] = field(default_factory=dict)  # the same route naming nothing that exists


def specs(world: w.World) -> dict[tuple[str, str], Spec]:
    execution = {"execution_id": w.EXECUTION}
    no_execution = {"execution_id": w.MISSING_EXECUTION}
    workload = {"workloadId": w.WORKLOAD}
    no_workload = {"workloadId": w.MISSING_WORKLOAD}
    lyceum = "/api/v2/external"
    alerts = f"{lyceum}/alerts"
    return {
        ("GET", f"{lyceum}/execution/{{execution_id}}/metrics"): Spec(
            OBJECT, execution, {**WINDOW, "step": "1m"}, missing=no_execution
        ),
        ("GET", f"{lyceum}/execution/{{execution_id}}/summary"): Spec(
            OBJECT, execution, WINDOW, missing=no_execution
        ),
        ("GET", f"{lyceum}/execution/{{execution_id}}/export"): Spec(
            OBJECT, execution, {**WINDOW, "format": "json"}, missing=no_execution
        ),
        ("GET", f"{lyceum}/execution/{{execution_id}}"): Spec(OBJECT, execution, missing=no_execution),
        # many executions at once: an id the caller may not see is left out, as one that does not exist
        ("GET", f"{lyceum}/execution-summaries"): Spec(
            OWN, query={"execution_id": [w.EXECUTION, w.OTHER_EXECUTION, w.MISSING_EXECUTION]}
        ),
        # the org's usage table: the caller's org (a project key: its projects) only
        ("GET", f"{lyceum}/usage"): Spec(OWN, query={"group_by": "user,project"}),
        ("GET", f"{lyceum}/workloads/list"): Spec(OWN),
        ("GET", f"{lyceum}/billing/history"): Spec(OWN),
        ("GET", f"{lyceum}/auth/api-keys/"): Spec(OWN),
        ("POST", f"{lyceum}/auth/api-keys/"): Spec(OWN, body={"key_name": "matrix"}),
        ("POST", f"{lyceum}/auth/api-keys/validate"): Spec(OWN),
        ("DELETE", f"{lyceum}/auth/api-keys/{{api_key_id}}"): Spec(
            KEY, {"api_key_id": world.spare_key_ids[0]}, missing={"api_key_id": "no-such-key"}
        ),
        ("PATCH", f"{lyceum}/auth/api-keys/{{api_key_id}}/toggle"): Spec(
            KEY, {"api_key_id": world.spare_key_ids[1]}, missing={"api_key_id": "no-such-key"}
        ),
        ("GET", f"{alerts}/rules"): Spec(ORG),
        ("POST", f"{alerts}/rules"): Spec(
            ORG_REF, body={"kind": "idle", "for": "1h", "channels": [world.alert_channel]}
        ),
        ("DELETE", f"{alerts}/rules/{{rule_id}}"): Spec(
            OBJECT, {"rule_id": world.spare_rule}, missing={"rule_id": "rul_missing"}
        ),
        ("GET", f"{alerts}/channels"): Spec(ORG),
        ("POST", f"{alerts}/channels"): Spec(ORG, body={"type": "webhook", "url": "https://x.example/h"}),
        ("DELETE", f"{alerts}/channels/{{channel_id}}"): Spec(
            OBJECT, {"channel_id": world.spare_channel}, missing={"channel_id": "chn_missing"}
        ),
        ("POST", f"{alerts}/channels/{{channel_id}}/test"): Spec(
            OBJECT, {"channel_id": world.alert_channel}, missing={"channel_id": "chn_missing"}
        ),
        ("GET", f"{alerts}/deliveries"): Spec(ORG),
        ("POST", f"{alerts}/deliveries/{{delivery_id}}/retry"): Spec(
            OBJECT, {"delivery_id": world.alert_delivery}, missing={"delivery_id": "dlv_missing"}
        ),
        ("GET", f"{alerts}/executions/{{execution_id}}"): Spec(OBJECT, execution, missing=no_execution),
        ("POST", f"{alerts}/snooze"): Spec(
            OBJECT,
            body={"execution_id": w.EXECUTION, "until": (datetime.now(UTC) + timedelta(days=1)).isoformat()},
        ),
        ("POST", "/api/v2/admin/executions"): Spec(
            ADMIN, body={"org": "acme", "hostname": w.HOST, "execution_id": "exec-acme-matrix"}
        ),
        ("GET", "/api/v2/admin/executions"): Spec(ADMIN),
        ("GET", "/api/v2/admin/executions/{execution_id}"): Spec(ADMIN, execution),
        ("PATCH", "/api/v2/admin/executions/{execution_id}"): Spec(
            ADMIN, execution, body={"file_name": "x.py"}
        ),
        ("POST", "/api/v2/admin/workloads"): Spec(ADMIN, body={"org": "acme", "name": "matrix"}),
        ("GET", "/api/v2/admin/workloads"): Spec(ADMIN),
        ("GET", "/api/v2/admin/workloads/{workload_id}/pods"): Spec(ADMIN, {"workload_id": w.WORKLOAD}),
        ("PATCH", "/api/v2/admin/workloads/{workload_id}/pods/{pod_id}"): Spec(
            ADMIN, {"workload_id": w.WORKLOAD, "pod_id": w.POD}, body={"node": w.HOST}
        ),
        ("GET", "/api/v1/workloads/{workloadId}/pods/{podId}/metrics"): Spec(
            OBJECT,
            {**workload, "podId": w.POD},
            RUNAI,
            missing={**no_workload, "podId": w.MISSING_POD},
        ),
        ("GET", "/api/v1/workloads/{workloadId}/pods/{podId}/summary"): Spec(
            OBJECT, {**workload, "podId": w.POD}, missing={**no_workload, "podId": w.MISSING_POD}
        ),
        ("GET", "/api/v1/workloads/{workloadId}/metrics"): Spec(OBJECT, workload, RUNAI, missing=no_workload),
        ("GET", "/api/v1/workloads/{workloadId}/pods"): Spec(OBJECT, workload, missing=no_workload),
        ("POST", "/api/v1/token"): Spec(
            PUBLIC, body={"grantType": "client_credentials", "clientID": "x", "clientSecret": "lk_nothing"}
        ),
        ("GET", "/healthz"): Spec(PUBLIC),
        ("GET", "/readyz"): Spec(PUBLIC),
        ("GET", "/metrics"): Spec(PUBLIC),
        ("GET", "/openapi.json"): Spec(PUBLIC),
        ("GET", "/docs"): Spec(PUBLIC),
        ("GET", "/redoc"): Spec(PUBLIC),
        ("GET", "/"): Spec(PUBLIC),
        ("GET", "/ui/executions/{execution_id}"): Spec(PUBLIC, execution),
        ("GET", "/ui/workloads/{workload_id}"): Spec(PUBLIC, {"workload_id": w.WORKLOAD}),
        ("GET", "/ui/alerts"): Spec(PUBLIC),
        ("GET", "/ui/usage"): Spec(PUBLIC),
        ("GET", "/ui/static"): Spec(PUBLIC),  # the assets (a mount): tested as /ui/static/common.js
    }


def _routes(app: Any) -> Any:
    """The app's routes, flat (FastAPI >= 0.16x wraps included routers; older ones list them flat)."""
    try:
        from fastapi.routing import iter_route_contexts
    except ImportError:
        return app.routes
    return iter_route_contexts(app.routes)


def app_routes(world: w.World) -> set[tuple[str, str]]:
    found: set[tuple[str, str]] = set()
    for route in _routes(world.app):
        path = route.path
        assert path is not None
        for method in route.methods or {"GET"}:
            if method != "HEAD":
                found.add((method, path))
    return found


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[w.World]:
    built = w.build_world(Path(tmp_path_factory.mktemp("matrix")))
    try:
        yield built
    finally:
        built.close()


def caller_headers(world: w.World, admin_route: bool) -> dict[str, dict[str, str]]:
    def bearer(token: str, **extra: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {token}", **extra}

    return {
        "owner": bearer(world.admin if admin_route else world.owner),
        "other_org": bearer(world.other_org),
        "project_key": bearer(world.project_key),
        "revoked": bearer(world.revoked),
        "expired": bearer(world.expired),
        "expired_jwt": bearer(w.user_jwt(["acme"], expired=True)),
        "foreign_org_jwt": bearer(w.user_jwt(["acme"]), **{"X-Org-Slug": "beta"}),
    }


def send(
    client: Client, method: str, template: str, spec: Spec, ids: dict[str, str], headers: dict[str, str]
) -> Any:
    url = template.format(**ids) if ids else template
    if template == "/ui/static":
        url = "/ui/static/common.js"
    kwargs: dict[str, Any] = {"headers": headers, "params": spec.query}
    if spec.body is not None:
        kwargs["json"] = spec.body
    return client.request(method, url, **kwargs)


def test_every_route_is_in_the_matrix(world: w.World) -> None:
    routes = app_routes(world)
    table = set(specs(world))
    assert routes - table == set(), "routes the tenant matrix does not cover: say how each caller is treated"
    assert table - routes == set(), "matrix rows for routes that no longer exist"


def test_tenant_matrix(world: w.World, capsys: pytest.CaptureFixture[str]) -> None:
    client = Client(world.app)
    table = specs(world)
    wrong: list[str] = []
    cells = 0
    same_404 = 0

    def expect(ok: Callable[[int], bool], what: str, status: int, label: str, text: str) -> None:
        if not ok(status):
            wrong.append(f"{label}: {status}, expected {what}: {text[:200]}")

    # the owner last on each route: its call may change the object (revoke a key, update a pod)
    order = [c for c in CALLERS if c != "owner"] + ["owner"]
    for (method, template), spec in sorted(table.items(), key=lambda kv: kv[0][1]):
        headers = caller_headers(world, spec.kind == ADMIN)
        if spec.kind == PUBLIC:
            answers = {}
            for caller in order:
                r = send(client, method, template, spec, spec.path, headers[caller])
                answers[caller] = r.status_code
                cells += 1
            anonymous = send(client, method, template, spec, spec.path, {}).status_code
            if set(answers.values()) != {anonymous} or anonymous >= 500:
                wrong.append(
                    f"{method} {template}: public route answers by caller: {answers}, anonymous {anonymous}"
                )
            continue
        expected = {**EXPECTED[spec.kind], **UNUSABLE}
        for caller in order:
            r = send(client, method, template, spec, spec.path, headers[caller])
            cells += 1
            label = f"{method} {template} as {caller}"
            want = expected[caller]
            if want is None:
                expect(lambda s: 200 <= s < 300, "2xx", r.status_code, label, r.text)
                if caller != "owner" and any(i in r.text for i in ACME_IDS):
                    wrong.append(f"{label}: names an object of acme: {r.text[:200]}")
            else:
                expect(lambda s, want=want: s == want, str(want), r.status_code, label, r.text)
        if spec.missing:
            other = headers["other_org"]
            hidden = send(client, method, template, spec, spec.path, other)
            absent = send(client, method, template, spec, spec.missing, other)
            owner_absent = send(client, method, template, spec, spec.missing, headers["owner"])
            if not (
                hidden.status_code == absent.status_code == owner_absent.status_code == 404
                and hidden.content == absent.content == owner_absent.content
            ):
                wrong.append(
                    f"{method} {template}: another org's 404 differs from a missing id's: "
                    f"{hidden.status_code} {hidden.text[:150]} / {absent.status_code} {absent.text[:150]} / "
                    f"{owner_absent.status_code} {owner_absent.text[:150]}"
                )
            same_404 += 1
    with capsys.disabled():
        print(
            f"\ntenant matrix: {len(table)} routes x {len(CALLERS)} callers = {cells} cells; "
            f"{same_404} routes with identical 404s for another org's and a missing id"
        )
    assert not wrong, "\n".join(wrong)
