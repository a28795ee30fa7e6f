"""Throughput: N client threads, each on its own keep-alive connection, looping over jobs.

A job is what one client does for one measured request: usually one GET to gpulens; for a baseline
it can be several requests sent one after another on the same connection (the queries gpulens would
send for that request, straight to the backend). Every client starts at once; jobs that complete in
the measured window (after the warm-up) count towards requests/s and the latency percentiles, overall
and per route (each job names its route). Any answer other than 200, and any exception, is an error,
warm-up included. The server's and the backend's CPU time over the measured window come from /proc,
so a figure limited by the machine's cores can be told from one limited by the server.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from bench.clients import KeepAlive
from bench.measure import percentile
from bench.measure import proc_cpu_seconds as cpu_seconds

SAMPLE_EVERY_S = 1.0


@dataclass(frozen=True)
class Job:
    """One measured request of a client: `requests` ((method, path, body)) in order, on one connection."""

    route: str
    requests: tuple[tuple[str, str, bytes | None], ...]
    headers: dict[str, str]

    @classmethod
    def get(cls, route: str, path: str, headers: dict[str, str]) -> Job:
        return cls(route, (("GET", path, None),), headers)

    @property
    def key(self) -> tuple[str, tuple[tuple[str, str, bytes | None], ...]]:
        return self.route, self.requests


def route_mix(routes: Sequence[tuple[Sequence[Job], int]], count: int) -> list[Job]:
    """`count` jobs interleaving the routes by weight: in every run of sum(weights) consecutive jobs,
    route i appears weights[i] times, spread out (smooth weighted round-robin); each route's own jobs
    are taken in turn. A route without jobs or with weight 0 is left out."""
    live = [(list(jobs), w) for jobs, w in routes if jobs and w > 0]
    if not live or count <= 0:
        return []
    total = sum(w for _, w in live)
    credit = [0] * len(live)
    taken = [0] * len(live)
    out: list[Job] = []
    for _ in range(count):
        for i, (_, w) in enumerate(live):
            credit[i] += w
        best = max(range(len(live)), key=lambda i: credit[i])
        credit[best] -= total
        jobs = live[best][0]
        out.append(jobs[taken[best] % len(jobs)])
        taken[best] += 1
    return out


@dataclass
class ThroughputResult:
    name: str
    endpoint: str  # what one request asks, in words
    clients: int
    warmup_s: float
    duration_s: float
    paths: int  # distinct jobs cycled through
    latencies: list[float] = field(default_factory=list)  # completed in the measured window
    warmup_requests: int = 0
    errors: int = 0  # warm-up and measured window together
    error_samples: list[str] = field(default_factory=list)
    nbytes: int = 0  # bodies in the measured window
    cpu: dict[str, float] = field(default_factory=dict)  # process -> CPU seconds per wall second
    by_route: dict[str, list[float]] = field(default_factory=dict)  # route -> measured latencies
    route_errors: dict[str, int] = field(default_factory=dict)  # route -> errors (warm-up included)

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

    @property
    def p99(self) -> float:
        return percentile(self.latencies, 0.99)

    def route_json(self) -> dict[str, dict[str, object]]:
        return {
            route: {
                "requests": len(seconds),
                "requests_per_s": len(seconds) / self.duration_s,
                "p50_s": percentile(seconds, 0.5),
                "p99_s": percentile(seconds, 0.99),
                "max_s": max(seconds, default=float("nan")),
                "errors": self.route_errors.get(route, 0),
            }
            for route, seconds in self.by_route.items()
        }

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
            "p99_s": self.p99,
            "max_s": max(self.latencies, default=float("nan")),
            "mean_bytes": self.nbytes / self.requests if self.requests else None,
            "warmup_requests": self.warmup_requests,
            "errors": self.errors,
            "error_samples": self.error_samples,
            "cpu_cores_used": self.cpu,
            "routes": self.route_json(),
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
    """Fill `result` (its clients, warmup_s and duration_s say how) with GETs of `paths`; return it."""
    jobs = [Job.get(result.name, p, headers) for p in paths]
    return run_jobs(result, host, port, jobs, pids, progress)


def run_jobs(
    result: ThroughputResult,
    host: str,
    port: int,
    jobs: Sequence[Job],
    pids: dict[str, int],
    progress: Callable[[str], None],
    sample: Callable[[float], object] | None = None,
) -> ThroughputResult:
    """Fill `result` (its clients, warmup_s and duration_s say how) with `jobs` on `host:port`.
    `sample(t)` is called about every SAMPLE_EVERY_S of the measured window (t: seconds into it)."""
    n = result.clients
    lock = threading.Lock()
    ready = threading.Barrier(n + 1)
    # (done, seconds, bytes, job index) per thread
    per_thread: list[list[tuple[float, float, int, int]]] = [[] for _ in range(n)]
    errors: list[tuple[str, str]] = []  # (route, text)
    marks: dict[str, float] = {}

    def one(conn: KeepAlive, job: Job) -> tuple[int, bytes, int]:
        """Status and body of the first request that is not a 200 (else the last), and bytes read."""
        nbytes = 0
        status, body = 0, b""
        for method, path, payload in job.requests:
            status, body = conn.request(method, path, payload, job.headers)
            nbytes += len(body)
            if status != 200:
                break
        return status, body, nbytes

    def client(i: int) -> None:
        conn = KeepAlive(host, port, timeout_s=60.0)
        mine = per_thread[i]
        k = i * max(1, len(jobs) // n)  # each client starts elsewhere in the list
        try:
            ready.wait()
            stop = marks["stop"]
            while True:
                t0 = time.perf_counter()
                if t0 >= stop:
                    break
                index = k % len(jobs)
                job = jobs[index]
                k += 1
                try:
                    status, body, nbytes = one(conn, job)
                except Exception as exc:  # counted, and the client goes on with a new connection
                    conn.close()
                    status, body, nbytes = 0, repr(exc).encode(), 0
                t1 = time.perf_counter()
                if status != 200:
                    with lock:
                        errors.append((job.route, f"{status}: {job.requests[0][1][:120]} -> {body[:200]!r}"))
                    continue
                mine.append((t1, t1 - t0, nbytes, index))
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
    if sample is None:
        _sleep_until(marks["stop"])
    else:
        tick = marks["measure"]
        while tick < marks["stop"]:
            tick = min(tick + SAMPLE_EVERY_S, marks["stop"])
            _sleep_until(tick)
            sample(tick - marks["measure"])
    cpu1 = {name: cpu_seconds(pid) for name, pid in pids.items()}
    cpu1["bench clients"] = time.process_time()
    for t in threads:
        t.join()
    result.cpu = {name: (cpu1[name] - cpu0[name]) / result.duration_s for name in cpu0}
    result.paths = len({j.key for j in jobs})
    for job in jobs:
        result.by_route.setdefault(job.route, [])
    for mine in per_thread:
        for done, seconds, nbytes, index in mine:
            if done < marks["measure"]:
                result.warmup_requests += 1
            elif done <= marks["stop"]:  # those still in flight at the stop mark are not counted
                result.latencies.append(seconds)
                result.by_route[jobs[index].route].append(seconds)
                result.nbytes += nbytes
    result.errors = len(errors)
    for route, _ in errors:
        result.route_errors[route] = result.route_errors.get(route, 0) + 1
    result.error_samples = [text for _, text in errors[:5]]
    return result


def _sleep_until(deadline: float) -> None:
    while (left := deadline - time.perf_counter()) > 0:
        time.sleep(min(left, 0.5))
