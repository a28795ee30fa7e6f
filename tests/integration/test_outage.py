"""Prometheus killed under load, then restarted on the same port over the same data: gpulens answers
503 while it is down (never a 500, never past the backend deadline), and recovers on its own, without
a restart (its connection pool reconnects).

A small dataset (one host, two GPUs, two hours at 15 s) is backfilled into a Prometheus this module
starts; a gpulens app is served over real HTTP; client threads read the Lyceum metrics route of an
execution on that host throughout.
"""

from __future__ import annotations

import shutil
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from gpulens.api.app import create_app
from gpulens.config import Settings
from gpulens.domain import catalog as c
from gpulens_testkit.promload import ServerHandle, backfill, start_prometheus
from tests.conftest import missing_server, sqlite_registry
from tests.integration.conftest import serve_app

pytestmark = pytest.mark.integration

T0 = 1_767_225_600 - 7_200  # one epoch-aligned 2 h block
EVERY = 15
HOST = "gpu-outage"
EXECUTION = "5d1c0a7e-3b2f-4c1d-9e8f-7a6b5c4d3e2f"
DEADLINE_S = 3.0  # GPULENS_BACKEND_TIMEOUT for this app
CLIENTS = 4
KNOWN_ERRORS = {502, 503, 504}  # docs/operations.md: backend unreachable, timed out, bad answer


def openmetrics() -> str:
    times = range(T0, T0 + 7_200, EVERY)
    lines = []
    for name, value in (
        (c.DCGM_GPU_UTIL, lambda t, g: (t // EVERY + 7 * g) % 100),
        (c.DCGM_FB_USED, lambda t, g: 1_000 + (t // EVERY) % 500 + g),
        (c.DCGM_FB_FREE, lambda t, g: 80_000 - (t // EVERY) % 500 - g),
    ):
        lines.append(f"# TYPE {name} gauge")
        for g in (0, 1):
            labels = f'Hostname="{HOST}",UUID="GPU-{HOST}-{g}",gpu="{g}",modelName="H100"'
            lines.extend(f"{name}{{{labels}}} {float(value(t, g))!r} {t}" for t in times)
    return "\n".join(lines) + "\n# EOF\n"


@dataclass
class Prometheus:
    tsdb: Path
    handle: ServerHandle

    def kill(self) -> None:
        self.handle.process.kill()  # SIGKILL: no clean shutdown, as when a node dies
        self.handle.process.wait(15)
        self.handle.stop()

    def restart(self) -> None:
        self.handle = start_prometheus(self.tsdb, block_s=7_200, port=self.handle.port, timeout_s=120)


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prometheus]:
    for binary in ("prometheus", "promtool"):
        if shutil.which(binary) is None:
            missing_server(f"{binary} (on PATH)")
    work = Path(tmp_path_factory.mktemp("outage"))
    (work / "data.om").write_text(openmetrics())
    backfill([work / "data.om"], work / "tsdb", 7_200)
    prom = Prometheus(work / "tsdb", start_prometheus(work / "tsdb", block_s=7_200))
    try:
        yield prom
    finally:
        prom.handle.stop()


@dataclass
class Load:
    """Client threads reading the metrics route until stopped: (start time, seconds, status) each;
    status -1 for a transport error (a broken or refused connection to gpulens itself)."""

    url: str
    key: str
    results: list[tuple[float, float, int]] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    bodies: list[str] = field(default_factory=list)  # error bodies, for the no-address check
    lock: threading.Lock = field(default_factory=threading.Lock)

    def run(self) -> None:
        path = f"/api/v2/external/execution/{EXECUTION}/metrics"
        with httpx.Client(base_url=self.url, timeout=DEADLINE_S * 4) as client:
            while not self.stop.is_set():
                t0 = time.monotonic()
                try:
                    r = client.get(path, headers={"Authorization": f"Bearer {self.key}"})
                    status = r.status_code
                    if status != 200:
                        with self.lock:
                            self.bodies.append(r.text)
                    else:
                        assert r.json()["gpuUtilizationPercent"], "a 200 without data"
                except httpx.TransportError:
                    status = -1
                with self.lock:
                    self.results.append((t0, time.monotonic() - t0, status))

    def between(self, start: float, end: float) -> list[tuple[float, float, int]]:
        with self.lock:
            return [r for r in self.results if start <= r[0] < end]


@dataclass
class Phases:
    load: Load
    disrupted: float  # monotonic times
    restoring: float
    restored: float
    ended: float

    def done_before_disruption(self) -> list[tuple[float, float, int]]:
        return [r for r in self.load.between(0, self.disrupted) if r[0] + r[1] < self.disrupted]

    def counts(self, start: float, end: float) -> Counter[int]:
        return Counter(s for _, _, s in self.load.between(start, end))

    def report(self, what: str) -> str:
        longest = max(d for _, d, _ in self.load.results)
        return (
            f"{what}: {len(self.load.results)} requests from {CLIENTS} clients; before "
            f"{dict(Counter(s for _, _, s in self.done_before_disruption()))}; while down "
            f"({self.restored - self.disrupted:.1f} s, restoring {self.restored - self.restoring:.1f} s) "
            f"{dict(self.counts(self.disrupted, self.restored))}; after "
            f"{dict(self.counts(self.restored, self.ended + 60))}; longest request {longest:.2f} s "
            f"(deadline {DEADLINE_S} s)"
        )


def under_load(
    prometheus: Prometheus,
    tmp_path: Path,
    disrupt: Callable[[], None],
    restore: Callable[[], None],
    down_s: float,
) -> Phases:
    """Serve gpulens over `prometheus`, read the metrics route from CLIENTS threads for 3 s, call
    `disrupt`, wait `down_s`, call `restore`, read 5 s more."""
    registry = sqlite_registry(tmp_path / "r.db")
    _, key = registry.create_key("acme", name="alice")
    _, admin = registry.create_key("platform", name="svc", is_admin=True)
    settings = Settings(
        data_dir=tmp_path,
        prometheus_url=prometheus.handle.url,
        backend_timeout=DEADLINE_S,
        archive_interval=0,
    )
    app = create_app(settings, registry=registry)
    with serve_app(app) as url:
        body = {
            "execution_id": EXECUTION,
            "org": "acme",
            "hostname": HOST,
            "gpus": ["0", "1"],
            "status": "completed",
            "start_time": "2025-12-31T22:10:00Z",
            "end_time": "2025-12-31T23:50:00Z",
            "hardware_profile": "gpu.h100",
        }
        r = httpx.post(
            f"{url}/api/v2/admin/executions", json=body, headers={"Authorization": f"Bearer {admin}"}
        )
        assert r.status_code == 201, r.text
        load = Load(url, key)
        threads = [threading.Thread(target=load.run, daemon=True) for _ in range(CLIENTS)]
        for t in threads:
            t.start()
        try:
            time.sleep(3)
            disrupted = time.monotonic()
            disrupt()
            time.sleep(down_s)
            restoring = time.monotonic()
            restore()
            restored = time.monotonic()
            time.sleep(5)
            ended = time.monotonic()
        finally:
            load.stop.set()
            for t in threads:
                t.join(DEADLINE_S * 5)
        assert not any(t.is_alive() for t in threads), "a client is still waiting"
    registry.dispose()
    return Phases(load, disrupted, restoring, restored, ended)


def check(phases: Phases, during: int, recovery_s: float) -> None:
    """Only 200s and the documented errors (no 500, no broken connection); all 200 before; `during`
    while down; nothing past the deadline; all 200 from `recovery_s` after the restore."""
    load = phases.load
    statuses = {s for _, _, s in load.results}
    assert 500 not in statuses
    assert statuses <= {200} | KNOWN_ERRORS, statuses
    before = phases.done_before_disruption()
    assert before and all(s == 200 for _, _, s in before), Counter(s for _, _, s in before)
    assert phases.counts(phases.disrupted, phases.restored)[during] > 0
    longest = max(d for _, d, _ in load.results)
    assert longest <= DEADLINE_S + 2.0, longest  # nothing hangs past the backend deadline
    recovered = load.between(phases.restored + recovery_s, phases.ended + 60)
    assert recovered and all(s == 200 for _, _, s in recovered), Counter(s for _, _, s in recovered)
    assert not any("127.0.0.1" in b for b in load.bodies)  # the backend's address: logged only


def test_prometheus_killed_under_load_then_restarted(prometheus: Prometheus, tmp_path: Path) -> None:
    """SIGKILL: connections refused (503) until Prometheus is back on the same port and data."""
    phases = under_load(prometheus, tmp_path, prometheus.kill, prometheus.restart, DEADLINE_S * 2)
    print(phases.report("killed and restarted"))  # shown with -s: the figures the issue asks for
    check(phases, during=503, recovery_s=1.0)


def test_prometheus_frozen_under_load_then_thawed(prometheus: Prometheus, tmp_path: Path) -> None:
    """SIGSTOP (a hung host: connections accepted by the kernel, never answered): 504 at the
    deadline, not later; after SIGCONT the pool's stuck connections are gone and reads succeed."""
    process = prometheus.handle.process

    def freeze() -> None:
        process.send_signal(signal.SIGSTOP)

    def thaw() -> None:
        process.send_signal(signal.SIGCONT)

    try:
        phases = under_load(prometheus, tmp_path, freeze, thaw, DEADLINE_S * 3)
    finally:
        thaw()
    print(phases.report("frozen and thawed"))
    check(phases, during=504, recovery_s=DEADLINE_S + 1.0)
