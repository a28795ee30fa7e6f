"""Throughput: N client threads, each on its own keep-alive connection, looping over GET paths.

Every client starts at once; requests that complete in the measured window (after the warm-up)
count towards requests/s and the latency percentiles. Any answer other than 200, and any exception,
is an error, warm-up included. The server's and Prometheus' CPU time over the measured window come
from /proc, so a figure limited by the machine's cores can be told from one limited by the server.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from bench.clients import KeepAlive
from bench.measure import percentile
from bench.measure import proc_cpu_seconds as cpu_seconds


@dataclass
class ThroughputResult:
    name: str
    endpoint: str  # what one request asks, in words
    clients: int
    warmup_s: float
    duration_s: float
    paths: int  # distinct request paths cycled through
    latencies: list[float] = field(default_factory=list)  # completed in the measured window
    warmup_requests: int = 0
    errors: int = 0  # warm-up and measured window together
    error_samples: list[str] = field(default_factory=list)
    nbytes: int = 0  # bodies in the measured window
    cpu: dict[str, float] = field(default_factory=dict)  # process -> CPU seconds per wall second

    @property
    def requests(self) -> int:
        return len(self.latencies)

    @property
    def rps(self) -> float:
        return self.requests / self.duration_s

    @property
    def p50(self) -> float:
        return percentile(self.latencies, 0.5)

    @property
    def p95(self) -> float:
        return percentile(self.latencies, 0.95)

    def as_json(self) -> dict[str, object]:
        return {
            "name": self.name,
            "endpoint": self.endpoint,
            "clients": self.clients,
            "warmup_s": self.warmup_s,
            "duration_s": self.duration_s,
            "distinct_paths": self.paths,
            "requests": self.requests,
            "requests_per_s": self.rps,
            "p50_s": self.p50,
            "p95_s": self.p95,
            "p99_s": percentile(self.latencies, 0.99),
            "max_s": max(self.latencies, default=float("nan")),
            "mean_bytes": self.nbytes / self.requests if self.requests else None,
            "warmup_requests": self.warmup_requests,
            "errors": self.errors,
            "error_samples": self.error_samples,
            "cpu_cores_used": self.cpu,
        }


def run_throughput(
    result: ThroughputResult,
    host: str,
    port: int,
    headers: dict[str, str],
    paths: Sequence[str],
    pids: dict[str, int],
    progress: Callable[[str], None],
) -> ThroughputResult:
    """Fill `result` (its clients, warmup_s and duration_s say how) and return it."""
    n = result.clients
    lock = threading.Lock()
    ready = threading.Barrier(n + 1)
    per_thread: list[list[tuple[float, float, int]]] = [[] for _ in range(n)]  # (done, seconds, bytes)
    errors: list[str] = []
    marks: dict[str, float] = {}

    def client(i: int) -> None:
        conn = KeepAlive(host, port, timeout_s=60.0)
        mine = per_thread[i]
        k = i * max(1, len(paths) // n)  # each client starts elsewhere in the list
        try:
            ready.wait()
            stop = marks["stop"]
            while True:
                t0 = time.perf_counter()
                if t0 >= stop:
                    break
                path = paths[k % len(paths)]
                k += 1
                try:
                    status, body = conn.request("GET", path, None, headers)
                except Exception as exc:  # counted, and the client goes on with a new connection
                    conn.close()
                    status, body = 0, repr(exc).encode()
                t1 = time.perf_counter()
                if status != 200:
                    with lock:
                        errors.append(f"{status}: {path[:120]} -> {body[:200]!r}")
                    continue
                mine.append((t1, t1 - t0, len(body)))
        finally:
            conn.close()

    threads = [threading.Thread(target=client, args=(i,), name=f"load-{i}", daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    start = time.perf_counter()
    marks["measure"] = start + result.warmup_s
    marks["stop"] = marks["measure"] + result.duration_s
    ready.wait()
    progress(f"{result.name}: warm-up ({result.warmup_s:.0f} s, {n} clients)")
    _sleep_until(marks["measure"])
    cpu0 = {name: cpu_seconds(pid) for name, pid in pids.items()}
    cpu0["bench clients"] = time.process_time()
    progress(f"{result.name}: measuring {result.duration_s:.0f} s")
    _sleep_until(marks["stop"])
    cpu1 = {name: cpu_seconds(pid) for name, pid in pids.items()}
    cpu1["bench clients"] = time.process_time()
    for t in threads:
        t.join()
    result.cpu = {name: (cpu1[name] - cpu0[name]) / result.duration_s for name in cpu0}
    result.paths = len(set(paths))
    for mine in per_thread:
        for done, seconds, nbytes in mine:
            if done < marks["measure"]:
                result.warmup_requests += 1
            elif done <= marks["stop"]:  # those still in flight at the stop mark are not counted
                result.latencies.append(seconds)
                result.nbytes += nbytes
    result.errors = len(errors)
    result.error_samples = errors[:5]
    return result


def _sleep_until(deadline: float) -> None:
    while (left := deadline - time.perf_counter()) > 0:
        time.sleep(min(left, 0.5))
