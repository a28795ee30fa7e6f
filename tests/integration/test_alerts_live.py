"""Live alerts end to end (docs/alerts.md): a running execution whose samples arrive as time passes
(written every second), its GPUs busy, then idle with memory held, then busy again, on two backends
at once over the same timeline:

- VictoriaMetrics (its import API), with two gpulens replicas on one PostgreSQL evaluating every 5 s
  with the rule `{"kind": "idle_held", "for": "1m"}`: a local webhook receiver gets exactly one signed
  `finding.firing` within `for` + 2 intervals + one scrape interval of the idle start and one
  `finding.resolved` after the GPUs work again, each once although both replicas run; a real
  Alertmanager shows the alert through its API; an Apprise `json://` URL to the local receiver gets
  the message;
- the embedded default (`gpulens serve` without a Prometheus: its own collector and sample store,
  a SQLite registry), the samples written into its store: the same one firing and one resolved, on
  a webhook of its own."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from standardwebhooks.webhooks import Webhook

from gpulens.api.app import create_app
from gpulens.cli.local import open_local
from gpulens.config import Settings
from gpulens.domain.models import Execution, ExecutionStatus
from gpulens.storage.registry import Registry
from gpulens_testkit.alertmanager import alerts as alertmanager_alerts
from gpulens_testkit.alertmanager import start_alertmanager
from gpulens_testkit.live import LiveWriter, Phase, StoreSink, VmSink
from gpulens_testkit.promload import MissingBinary, start_victoria_metrics
from tests.conftest import missing_server
from tests.integration.conftest import serve_app
from tests.storage.conftest import postgres_server, postgres_url  # noqa: F401 - fixtures

pytestmark = pytest.mark.integration

INTERVAL_S = 5
SCRAPE_S = 1
FOR_S = 60
IDLE_AT_S = 12  # the writer's seconds: busy, then idle with memory held ...
BUSY_AGAIN_S = IDLE_AT_S + FOR_S + 2 * INTERVAL_S + SCRAPE_S + 5  # ... then busy again once it fired
SECRET = "whsec_" + "c2VjcmV0LXNlY3JldC1zZWNyZXQtc2VjcmV0LXNlY3I="


@dataclass
class Receiver:
    """Records every POST (path, headers, body, arrival time)."""

    url: str
    got: list[tuple[str, dict[str, str], bytes, float]] = field(default_factory=list)

    def posts(self, path: str) -> list[tuple[dict[str, str], bytes, float]]:
        return [(h, b, t) for p, h, b, t in self.got if p == path]


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    got: list[tuple[str, dict[str, str], bytes, float]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            got.append((self.path, {k.lower(): v for k, v in self.headers.items()}, body, time.time()))
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *_args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield Receiver(f"http://127.0.0.1:{server.server_address[1]}", got)
    finally:
        server.shutdown()


def test_idle_held_fires_once_and_resolves_once_across_two_replicas(
    receiver: Receiver,
    postgres_url: str,  # noqa: F811 - the fixture imported above
    tmp_path: Path,
) -> None:
    try:
        vm = start_victoria_metrics(tmp_path / "vm")
    except MissingBinary as exc:
        missing_server(f"victoria-metrics: {exc}")
        return
    try:
        am = start_alertmanager(tmp_path / "am")
    except MissingBinary as exc:
        vm.stop()
        missing_server(f"prometheus-alertmanager: {exc}")
        return
    phases = (Phase(0, 95, 80), Phase(IDLE_AT_S, 0, 80), Phase(BUSY_AGAIN_S, 95, 80))
    writer = LiveWriter(VmSink(vm.url), "live-1", ("0",), phases, every_s=SCRAPE_S)

    def settings(name: str, **backend: Any) -> Settings:
        return Settings(
            data_dir=tmp_path / name,
            scrape_interval=f"{SCRAPE_S}s",
            alerts_interval=INTERVAL_S,
            archive_interval=0,
            summary_interval=0,
            public_url="http://gpulens.example",
            **backend,
        )

    fleet = {"prometheus_url": vm.url, "database_url": postgres_url}
    local = settings("embedded", collect_interval=SCRAPE_S)  # the embedded default: no Prometheus
    local.data_dir.mkdir(parents=True)
    keys = {}
    started = datetime.now(UTC)
    for url in (postgres_url, local.resolved_database_url):
        registry = Registry.from_url(url)
        registry.migrate()
        _, keys[url] = registry.create_key("acme", name="owner")
        registry.upsert_execution(
            Execution(
                "live-job", "acme", "live-1", ("0",), ExecutionStatus.RUNNING, started, start_time=started
            )
        )
        registry.dispose()
    headers = {"Authorization": f"Bearer {keys[postgres_url]}"}
    local_headers = {"Authorization": f"Bearer {keys[local.resolved_database_url]}"}
    # the embedded default's store gets the same samples at the same times, from the writer's clock
    local_writer = LiveWriter(StoreSink(local.samples_path), "live-1", ("0",), phases, every_s=SCRAPE_S)

    def subscribe(api: httpx.Client, channels: list[dict[str, str]]) -> None:
        ids = []
        for body in channels:
            answer = api.post("/api/v2/external/alerts/channels", json=body)
            assert answer.status_code in (200, 201), answer.text
            ids.append(answer.json()["id"])
        answer = api.post(
            "/api/v2/external/alerts/rules", json={"kind": "idle_held", "for": "1m", "channels": ids}
        )
        assert answer.status_code in (200, 201), answer.text

    embedded = open_local(local)  # as `gpulens serve` opens it without a Prometheus: collector and store
    embedded.start()
    writer.start()
    local_writer.start()
    try:
        with (
            serve_app(create_app(settings("a", **fleet))) as url_a,
            serve_app(create_app(settings("b", **fleet))) as url_b,
            serve_app(create_app(local, backend=embedded.backend, collector=embedded.collector)) as url_local,
        ):
            api = httpx.Client(base_url=url_a, headers=headers, timeout=30)
            subscribe(
                api,
                [
                    {"type": "webhook", "url": f"{receiver.url}/hook", "secret": SECRET},
                    {"type": "alertmanager", "url": am.url},
                    {"type": "apprise", "url": f"json://{receiver.url.removeprefix('http://')}/apprise"},
                ],
            )
            assert httpx.get(f"{url_b}/api/v2/external/alerts/rules", headers=headers).json()  # B sees it
            local_api = httpx.Client(base_url=url_local, headers=local_headers, timeout=30)
            subscribe(local_api, [{"type": "webhook", "url": f"{receiver.url}/local", "secret": SECRET}])

            idle_start = writer.started + IDLE_AT_S
            deadline = idle_start + FOR_S + 2 * INTERVAL_S + SCRAPE_S
            fired_at = None
            while time.time() < deadline + 30 and fired_at is None:
                hooks = receiver.posts("/hook")
                if hooks:
                    fired_at = hooks[0][2]
                time.sleep(0.5)
            assert fired_at is not None, f"no firing; writer errors: {writer.errors[:3]}"
            assert fired_at <= deadline, f"fired {fired_at - idle_start:.1f} s after the idle start"
            shown = alertmanager_alerts(am.url)
            assert [a["labels"]["kind"] for a in shown] == ["idle_held"]
            assert shown[0]["labels"]["execution_id"] == "live-job"

            busy_again = writer.started + BUSY_AGAIN_S
            while time.time() < busy_again + 4 * INTERVAL_S + 10 and (
                len(receiver.posts("/hook")) < 2 or len(receiver.posts("/local")) < 2
            ):
                time.sleep(0.5)
            time.sleep(2 * INTERVAL_S)  # a second replica's pass would have sent a duplicate by now
    finally:
        writer.stop()
        local_writer.stop()
        embedded.close()
        am.stop()
        vm.stop()

    hooks = receiver.posts("/hook")
    verifier = Webhook(SECRET)
    events = [verifier.verify(body, hdrs) for hdrs, body, _ in hooks]
    assert [e["type"] for e in events] == ["finding.firing", "finding.resolved"]
    assert events[0]["execution"]["id"] == "live-job" and events[0]["finding"]["kind"] == "idle_held"
    assert events[0]["url"] == "http://gpulens.example/ui/executions/live-job"
    assert len({hdrs["webhook-id"] for hdrs, _, _ in hooks}) == 2  # one id per event
    apprise = [json.loads(body) for _, body, _ in receiver.posts("/apprise")]
    assert len(apprise) == 2 and "idle_held" in apprise[0]["title"]
    assert "http://gpulens.example/ui/executions/live-job" in apprise[0]["message"]
    assert not local_writer.errors, local_writer.errors[:3]
    local = [(verifier.verify(body, hdrs), at) for hdrs, body, at in receiver.posts("/local")]
    assert [e["type"] for e, _ in local] == ["finding.firing", "finding.resolved"], "embedded default"
    assert local[0][0]["finding"]["kind"] == "idle_held" and local[0][0]["execution"]["id"] == "live-job"
    local_delay = local[0][1] - (local_writer.started + IDLE_AT_S)
    assert FOR_S <= local_delay <= FOR_S + 2 * INTERVAL_S + SCRAPE_S, (
        f"embedded: fired after {local_delay:.1f} s"
    )
    delay = fired_at - (writer.started + IDLE_AT_S)
    assert timedelta(seconds=FOR_S) <= timedelta(seconds=delay), "fired before the episode lasted `for`"
    bound = FOR_S + 2 * INTERVAL_S + SCRAPE_S
    print(
        f"finding.firing {delay:.1f} s after the idle start, embedded {local_delay:.1f} s (bound {bound} s)"
    )
