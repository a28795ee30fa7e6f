"""The load section's summary storm (issue 21, item 1): another tenant's small read while 16 summaries
of a year-long running execution are asked at once, and the server's peak RSS meanwhile.

On the load section's server and Prometheus: org `bench` registers an execution of the bench host that
started 365 days ago and still runs (its window: a year, of which the data fills the last month or
so), and another org (`bench-other`) a finished execution on the same host over the data's last 30
minutes. First the other tenant reads its 30-minute metrics `IDLE_READS` times alone (p50: its idle
latency); then 16 clients ask the year-long summary at once (each on its own connection), and the
other tenant reads again every 50 ms for as long as any of them is still waiting for its answer. The
figures: the busy p50 over the idle p50 (target at most 2), and the server's VmHWM (reset before the
storm when allowed) against the documented bound: its RSS at rest plus, for each summary that may
compute at once (GPULENS_MAX_CONCURRENT_SUMMARIES), twice the bound of one summary's memory
(service/summary.py `memory_bound`: traced allocations; twice for the allocator's own). Last, 24
summaries of the same execution whose clients close their sockets 0.2 s after asking: the server's
CPU from 1 s to 2 s after they went away (target at most 0.15 of a core).
"""

from __future__ import annotations

import math
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from bench.clients import KeepAlive
from bench.measure import Figure, percentile, proc_cpu_seconds, ratio
from bench.servers import Rss, reset_peak_rss
from gpulens.config import usable_cpus
from gpulens.domain.models import Execution, ExecutionStatus
from gpulens.service.summary import memory_bound

NAME = "Summary storm"
SUMMARIES = 16
SPAN_DAYS = 365
TARGET = 2.0
IDLE_READS = 20
READ_EVERY_S = 0.05
RSS_FACTOR = 2.0  # the server's RSS per summary against its traced bound (the allocator's own)
YEAR_ID = "bench-exec-year"
OTHER_ORG = "bench-other"
OTHER_ID = "bench-other-30min"
SUMMARY_TIMEOUT_S = 600.0
ABANDONED = 24  # summaries whose clients go away ...
ABANDON_AFTER_S = 0.2  # ... this long after asking
IDLE_CPU_TARGET = 0.15  # the server's cores busy from 1 s to 2 s after they went away


def executions(org: str, hostname: str, data_end: datetime, now: datetime) -> list[Execution]:
    """The year-long running execution (of `org`) and the other tenant's 30 minutes."""
    started = now - timedelta(days=SPAN_DAYS)
    return [
        Execution(
            execution_id=YEAR_ID,
            org=org,
            hostname=hostname,
            gpus=(),
            status=ExecutionStatus.RUNNING,
            created_at=started,
            start_time=started,
            execution_type="bench",
        ),
        Execution(
            execution_id=OTHER_ID,
            org=OTHER_ORG,
            hostname=hostname,
            gpus=(),
            status=ExecutionStatus.COMPLETED,
            created_at=data_end - timedelta(minutes=30),
            start_time=data_end - timedelta(minutes=30),
            end_time=data_end,
            execution_type="bench",
            return_code=0,
        ),
    ]


def small_read_path(data_end: datetime) -> str:
    iso = "%Y-%m-%dT%H:%M:%SZ"
    start = (data_end - timedelta(minutes=30)).astimezone(UTC).strftime(iso)
    end = data_end.astimezone(UTC).strftime(iso)
    return f"/api/v2/external/execution/{OTHER_ID}/metrics?start={start}&end={end}&step=15s"


SUMMARY_PATH = f"/api/v2/external/execution/{YEAR_ID}/summary"


@dataclass
class StormResult:
    gpus: int
    concurrency: int = field(default_factory=usable_cpus)
    idle_s: list[float] = field(default_factory=list)
    busy_s: list[float] = field(default_factory=list)
    summary_s: list[float] = field(default_factory=list)
    statuses: Counter[int] = field(default_factory=Counter)
    rss_before: Rss | None = None
    rss_after: Rss | None = None
    peak_reset: bool = False
    abandoned_cpu: float = math.nan  # the server's cores busy from 1 s to 2 s after the clients left
    checks: list[str] = field(default_factory=list)

    @property
    def ratio(self) -> float:
        return ratio(percentile(self.busy_s, 0.5), percentile(self.idle_s, 0.5))

    @property
    def bound_mib(self) -> float:
        if self.rss_before is None:
            return math.nan
        per = RSS_FACTOR * memory_bound(self.gpus) / (1 << 20)
        return self.rss_before.rss_kib / 1024 + self.concurrency * per

    @property
    def peak_mib(self) -> float:
        return math.nan if self.rss_after is None else self.rss_after.peak_kib / 1024

    def lines(self) -> list[str]:
        rest = math.nan if self.rss_before is None else self.rss_before.rss_kib / 1024
        done = ", ".join(f"{n} x {status}" for status, n in sorted(self.statuses.items()))
        return [
            f"{NAME}: {SUMMARIES} summaries of a {SPAN_DAYS}-day running execution ({self.gpus} GPUs) at "
            f"once, {self.concurrency} computing at a time: {done}; answered in "
            f"{percentile(self.summary_s, 0.5):.1f} s p50, {max(self.summary_s, default=math.nan):.1f} s max",
            f"{NAME}: the other tenant's 30-minute read p50 {percentile(self.idle_s, 0.5) * 1000:.1f} ms "
            f"alone, {percentile(self.busy_s, 0.5) * 1000:.1f} ms meanwhile "
            f"(p90 {percentile(self.busy_s, 0.9) * 1000:.1f} ms, {len(self.busy_s)} reads): "
            f"{self.ratio:.2f}x (target <= {TARGET:g}x)",
            f"{NAME}: server peak RSS {self.peak_mib:.0f} MiB (at rest {rest:.0f} MiB; documented bound "
            f"{self.bound_mib:.0f} MiB = rest + {self.concurrency} x {RSS_FACTOR:g} x "
            f"{memory_bound(self.gpus) / (1 << 20):.0f} MiB)"
            + ("" if self.peak_reset else ", VmHWM since start"),
            f"{NAME}: {ABANDONED} summaries whose clients went away after {ABANDON_AFTER_S:g} s: the server "
            f"used {self.abandoned_cpu:.2f} of a core from 1 s to 2 s after (target <= {IDLE_CPU_TARGET:g})",
        ]

    def figures(self) -> list[Figure]:
        return [
            Figure(
                f"{NAME}: other tenant's 30-min read p50 under {SUMMARIES} year-long summaries vs alone",
                self.ratio,
                TARGET,
            ),
            Figure(
                f"{NAME}: server peak RSS",
                self.peak_mib,
                self.bound_mib,
                "MiB",
                note="VmHWM against rest + concurrency x 2 x one summary's bound",
            ),
            Figure(
                f"{NAME}: server CPU 1-2 s after {ABANDONED} summary clients went away",
                self.abandoned_cpu,
                IDLE_CPU_TARGET,
                "cores",
                note=f"each client gone {ABANDON_AFTER_S:g} s after asking",
            ),
        ]

    def as_json(self) -> dict[str, object]:
        def rss(r: Rss | None) -> dict[str, int] | None:
            return None if r is None else {"vm_rss_kib": r.rss_kib, "vm_hwm_kib": r.peak_kib}

        return {
            "summaries": SUMMARIES,
            "span_days": SPAN_DAYS,
            "gpus": self.gpus,
            "concurrency": self.concurrency,
            "statuses": {str(k): v for k, v in self.statuses.items()},
            "summary_seconds": self.summary_s,
            "idle_read_seconds": self.idle_s,
            "busy_read_seconds": self.busy_s,
            "ratio_p50": self.ratio,
            "target_ratio": TARGET,
            "server_rss_before": rss(self.rss_before),
            "server_rss_after": rss(self.rss_after),
            "server_peak_is_the_storms": self.peak_reset,
            "rss_bound_mib": self.bound_mib,
            "abandoned": ABANDONED,
            "abandoned_after_s": ABANDON_AFTER_S,
            "server_cores_busy_1_to_2_s_after": self.abandoned_cpu,
            "problems": self.checks,
        }


def run_storm(
    host: str,
    port: int,
    *,
    summary_headers: dict[str, str],
    other_headers: dict[str, str],
    small_path: str,
    pid: int,
    gpus: int,
    progress: Callable[[str], None],
) -> StormResult:
    result = StormResult(gpus)
    reader = KeepAlive(host, port, timeout_s=120.0)

    def read() -> float:
        started = time.perf_counter()
        status, body = reader.request("GET", small_path, None, other_headers)
        took = time.perf_counter() - started
        if status != 200:
            result.checks.append(f"the other tenant's read answered {status}: {body[:200]!r}")
        return took

    progress(f"{NAME}: the other tenant's read alone")
    for _ in range(5):
        read()
    result.idle_s = [read() for _ in range(IDLE_READS)]
    result.rss_before = Rss.of(pid)
    result.peak_reset = reset_peak_rss(pid)
    lock = threading.Lock()

    def summary() -> None:
        client = KeepAlive(host, port, timeout_s=SUMMARY_TIMEOUT_S)
        started = time.perf_counter()
        try:
            status, _ = client.request("GET", SUMMARY_PATH, None, summary_headers)
        except OSError as exc:
            with lock:
                result.checks.append(f"a summary request failed: {exc!r}")
            return
        finally:
            client.close()
        with lock:
            result.statuses[status] += 1
            result.summary_s.append(time.perf_counter() - started)

    progress(f"{NAME}: {SUMMARIES} year-long summaries at once")
    threads = [threading.Thread(target=summary, daemon=True) for _ in range(SUMMARIES)]
    for t in threads:
        t.start()
    time.sleep(0.3)
    while any(t.is_alive() for t in threads):
        took = read()
        if any(t.is_alive() for t in threads):  # still running when the read ended
            result.busy_s.append(took)
        time.sleep(READ_EVERY_S)
    for t in threads:
        t.join()
    reader.close()
    result.rss_after = Rss.of(pid)
    result.abandoned_cpu = abandoned_cpu(host, port, summary_headers, pid, progress)
    if not result.statuses.get(200):
        result.checks.append(f"no summary of the {SPAN_DAYS}-day execution was answered 200")
    unexpected = set(result.statuses) - {200, 503}
    if unexpected:
        result.checks.append(f"summaries answered {sorted(unexpected)}")
    return result


def abandoned_cpu(
    host: str, port: int, headers: dict[str, str], pid: int, progress: Callable[[str], None]
) -> float:
    """ABANDONED summary requests, each socket closed ABANDON_AFTER_S after it was sent; the server's
    CPU (cores) from 1 s to 2 s after they were all closed."""
    progress(f"{NAME}: {ABANDONED} summaries abandoned after {ABANDON_AFTER_S:g} s")
    lines = [
        f"GET {SUMMARY_PATH} HTTP/1.1",
        f"Host: {host}:{port}",
        *(f"{k}: {v}" for k, v in headers.items()),
    ]
    request = ("\r\n".join(lines) + "\r\n\r\n").encode()
    sockets = []
    for _ in range(ABANDONED):
        sock = socket.create_connection((host, port), timeout=30)
        sock.sendall(request)
        sockets.append(sock)
    time.sleep(ABANDON_AFTER_S)
    for sock in sockets:
        sock.close()
    time.sleep(1.0)
    cpu, wall = proc_cpu_seconds(pid), time.perf_counter()
    time.sleep(1.0)
    return (proc_cpu_seconds(pid) - cpu) / (time.perf_counter() - wall)
