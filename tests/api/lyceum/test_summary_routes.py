"""The summary routes over stored summaries (service/summary_store.py), through the whole app:

* `.../summary` cancels its work when the client goes away (an ASGI `http.disconnect`; over a real
  socket to uvicorn: tests/integration/test_summary_disconnect.py), while the backend is still being
  read, and while the request waits for a compute slot; the summary's computation then never starts;
* a request that cannot get a slot in time is a 503 in the Lyceum shape with Retry-After;
* `GET /api/v2/external/execution-summaries`: validation (422 in the Lyceum shape), tenants (another
  org's ids and unknown ones are left out alike), pending then ready once the background pass ran,
  with the figures of the stored summary.
"""

from __future__ import annotations

import asyncio
import sys
import threading
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from gpulens.api.disconnect import CLIENT_CLOSED
from tests.api.conftest import Client
from tests.service.summary_env import (
    DONE,
    RUNNING,
    Env,
    build,
    env_fixture,  # noqa: F401 - the `env` fixture
    execution,
)

SUMMARIES = "/api/v2/external/execution-summaries"


def summary_path(execution_id: str) -> str:
    return f"/api/v2/external/execution/{execution_id}/summary"


class AsgiCall:
    """One GET through the app's ASGI interface whose client goes away when told to."""

    def __init__(self, env: Env, path: str, query: str = "") -> None:
        self.gone = asyncio.Event()
        self.sent: list[dict[str, Any]] = []
        self._body_sent = False
        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": "GET",
            "scheme": "http",
            "path": path,
            "raw_path": path.encode(),
            "query_string": query.encode(),
            "root_path": "",
            "headers": [(b"host", b"testserver"), (b"authorization", f"Bearer {env.key}".encode())],
            "client": ("127.0.0.1", 40000),
            "server": ("testserver", 80),
        }
        self.task = asyncio.ensure_future(env.app(scope, self.receive, self.send))

    async def receive(self) -> dict[str, Any]:
        if not self._body_sent:
            self._body_sent = True
            return {"type": "http.request", "body": b"", "more_body": False}
        await self.gone.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: dict[str, Any]) -> None:
        self.sent.append(message)

    @property
    def status(self) -> int | None:
        return next((m["status"] for m in self.sent if m["type"] == "http.response.start"), None)


def no_compute(env: Env, monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """Records every start of the CPU-heavy part of a summary (SummaryService._compute)."""
    started: list[object] = []
    original = env.stored.summaries._compute

    def compute(*args: Any) -> Any:
        started.append(args[0].execution_id)
        return original(*args)

    monkeypatch.setattr(env.stored.summaries, "_compute", compute)
    return started


@pytest.mark.parametrize("execution_id", [DONE, RUNNING])
async def test_a_client_that_goes_away_cancels_the_summary(
    env: Env, monkeypatch: pytest.MonkeyPatch, execution_id: str
) -> None:
    started = no_compute(env, monkeypatch)
    env.backend.held = True
    call = AsgiCall(env, summary_path(execution_id))
    _, asked = env.backend._events()
    await asyncio.wait_for(asked.wait(), 10)
    call.gone.set()
    await asyncio.wait_for(call.task, 10)
    assert env.backend.cancelled >= 1  # the backend reads in flight were cancelled
    assert started == []  # the computation never started
    assert call.status == CLIENT_CLOSED
    state = env.stored._state()
    assert state.flights == {} and state.computing == 0 and state.waiting == 0
    assert env.stored.store.get(execution_id) is None
    env.backend.release()


async def test_a_client_that_goes_away_while_the_summary_computes_stops_it(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The computation already running in its worker thread: the request answers at once, and the
    thread stops at its next step (after the findings, before the per-GPU figures and the stats)."""
    from gpulens.service import summary as summary_module

    in_findings, go_on = threading.Event(), threading.Event()
    later: list[str] = []
    original = summary_module.findings

    def slow_findings(*args: Any, **kwargs: Any) -> Any:
        in_findings.set()
        go_on.wait(10)
        return original(*args, **kwargs)

    def stats(*args: Any, **kwargs: Any) -> Any:
        later.append("stats")
        raise AssertionError("the stats of a summary nobody waits for")

    monkeypatch.setattr(summary_module, "findings", slow_findings)
    monkeypatch.setattr(summary_module, "series_stats", stats)
    call = AsgiCall(env, summary_path(RUNNING))
    assert await asyncio.to_thread(in_findings.wait, 10)
    call.gone.set()
    await asyncio.wait_for(call.task, 5)  # without waiting for the thread
    assert call.status == CLIENT_CLOSED
    assert env.stored._state().computing == 0
    go_on.set()
    for _ in range(100):  # the thread ends at its next step
        if not any(
            t.name.startswith("AnyIO worker") and t.is_alive() and in_use(t) for t in threading.enumerate()
        ):
            break
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.2)
    assert later == []


def in_use(thread: threading.Thread) -> bool:
    """Whether an anyio worker thread is running a call (its frame is not waiting on its queue)."""
    frame = sys._current_frames().get(thread.ident or -1)
    while frame is not None:
        if frame.f_code.co_name == "_compute":
            return True
        frame = frame.f_back
    return False


async def test_a_client_that_goes_away_while_waiting_for_a_slot_never_computes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = build(tmp_path, concurrency=1)
    try:
        started = no_compute(env, monkeypatch)
        env.backend.held = True
        first = AsgiCall(env, summary_path(RUNNING))
        _, asked = env.backend._events()
        await asyncio.wait_for(asked.wait(), 10)
        asked_by_first = env.backend.asked
        second = AsgiCall(env, summary_path(DONE))
        await asyncio.sleep(0.2)
        assert env.stored._state().waiting == 1
        second.gone.set()
        await asyncio.wait_for(second.task, 10)
        assert second.status == CLIENT_CLOSED and env.stored._state().waiting == 0
        env.backend.release()
        await asyncio.wait_for(first.task, 30)  # its client stayed
        assert first.status == 200
        assert started == [RUNNING]  # the second's summary was never read nor computed
        assert env.backend.asked >= asked_by_first
    finally:
        env.close()


async def test_no_slot_in_time_is_a_503_in_the_lyceum_shape(tmp_path: Path) -> None:
    env = build(tmp_path, concurrency=1, wait_s=0.5)
    try:
        env.backend.held = True
        transport = httpx.ASGITransport(app=env.app)
        headers = {"Authorization": f"Bearer {env.key}"}
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as http:
            first = asyncio.ensure_future(http.get(summary_path(RUNNING), headers=headers))
            _, asked = env.backend._events()
            await asyncio.wait_for(asked.wait(), 10)
            refused = await http.get(summary_path(DONE), headers=headers)
            assert refused.status_code == 503
            assert refused.headers["Retry-After"] == "2"
            assert set(refused.json()) == {"detail"} and "busy" in refused.json()["detail"]
            env.backend.release()
            assert (await first).status_code == 200
    finally:
        env.close()


def test_the_list_endpoint(env: Env) -> None:
    env.registry.upsert_execution(execution("beta-1", org="beta"), now=env.now[0])
    env.registry.upsert_execution(execution("no-host", hostname=None), now=env.now[0])
    client = Client(env.app)
    acme = {"Authorization": f"Bearer {env.key}"}
    ids = [DONE, RUNNING, "beta-1", "no-host", "nobody", DONE]
    r = client.get(SUMMARIES, params={"execution_id": ids}, headers=acme)
    assert r.status_code == 200, r.text
    assert r.json() == {
        "summaries": [
            {"executionId": i, "status": s, "meanGpuUtilizationPercent": None, "cost": None, "findings": []}
            for i, s in ((DONE, "pending"), (RUNNING, "pending"), ("no-host", "unavailable"))
        ]
    }
    beta = client.get(
        SUMMARIES, params={"execution_id": ids}, headers={"Authorization": f"Bearer {env.other_key}"}
    )
    assert [row["executionId"] for row in beta.json()["summaries"]] == ["beta-1"]
    report = client_pass(env)
    assert report.computed == 2  # done-1 (queued), beta-1 (ended recently)
    rows = client.get(SUMMARIES, params={"execution_id": [DONE, RUNNING]}, headers=acme).json()["summaries"]
    summary = client.get(summary_path(DONE), headers=acme).json()
    assert rows[0]["status"] == "ready" and rows[1]["status"] == "pending"
    assert rows[0]["meanGpuUtilizationPercent"] == summary["stats"]["gpuUtilizationPercent"]["mean"]
    assert rows[0]["cost"] == {"total": summary["cost"]["total"], "currency": "USD"}
    kinds = {f["kind"] for f in summary["findings"]}
    assert {f["kind"] for f in rows[0]["findings"]} == kinds
    for f in rows[0]["findings"]:
        of_kind = [g for g in summary["findings"] if g["kind"] == f["kind"]]
        assert f["count"] == len(of_kind)
        assert f["gpuHours"] == pytest.approx(sum(g.get("impact", {}).get("gpuHours", 0) for g in of_kind))


def client_pass(env: Env) -> Any:
    import anyio

    return anyio.run(env.stored.run_pass)


@pytest.mark.parametrize(
    "params",
    [
        {},
        {"execution_id": [f"e{i}" for i in range(101)]},
        {"execution_id": ["a" * 129]},
        {"execution_id": ["bad id"]},
        {"execution_id": ["ok", ""]},
    ],
)
def test_the_list_endpoint_refuses_bad_ids(env: Env, params: dict[str, Any]) -> None:
    r = Client(env.app).get(SUMMARIES, params=params, headers={"Authorization": f"Bearer {env.key}"})
    assert r.status_code == 422, r.text
    detail = r.json()["detail"]
    assert isinstance(detail, list) and detail[0]["loc"][:2] == ["query", "execution_id"]


def test_the_list_endpoint_needs_a_key(env: Env) -> None:
    r = Client(env.app).get(SUMMARIES, params={"execution_id": [DONE]})
    assert r.status_code == 401 and set(r.json()) == {"detail"}


def test_a_hundred_ids_are_one_request(env: Env) -> None:
    ids = [DONE, *(f"x-{i}" for i in range(99))]
    r = Client(env.app).get(
        SUMMARIES, params={"execution_id": ids}, headers={"Authorization": f"Bearer {env.key}"}
    )
    assert r.status_code == 200 and [row["executionId"] for row in r.json()["summaries"]] == [DONE]
    assert orjson.loads(r.content)["summaries"][0]["status"] == "pending"
