"""HTTP clients: the gpulens endpoint over one keep-alive connection, and the raw Prometheus baseline.

Both send `Accept-Encoding: identity` and read every body completely without decoding it.
"""

from __future__ import annotations

import http.client
import threading
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import ClassVar

from gpulens.backends.promjson import prometheus_time
from gpulens.domain.models import RangeQuery


class HttpError(RuntimeError):
    pass


class KeepAlive:
    """One persistent `http.client.HTTPConnection`, reopened if the server closed it."""

    def __init__(self, host: str, port: int, timeout_s: float = 300.0) -> None:
        self.host, self.port, self.timeout_s = host, port, timeout_s
        self.conn: http.client.HTTPConnection | None = None

    def request(
        self, method: str, path: str, body: bytes | None, headers: dict[str, str]
    ) -> tuple[int, bytes]:
        for attempt in (1, 2):
            if self.conn is None:
                self.conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout_s)
            try:
                self.conn.request(method, path, body=body, headers=headers)
                resp = self.conn.getresponse()
                data = resp.read()
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
                self.close()
                if attempt == 2:
                    raise
                continue
            if resp.will_close:
                self.close()
            return resp.status, data
        raise AssertionError("unreachable")

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None


class ApiClient:
    """GET the gpulens metrics endpoint with a Bearer key."""

    def __init__(self, host: str, port: int, key: str) -> None:
        self._conn = KeepAlive(host, port)
        self.headers = {"Authorization": f"Bearer {key}", "Accept-Encoding": "identity"}

    def get(self, path: str) -> bytes:
        status, body = self._conn.request("GET", path, None, self.headers)
        if status != 200:
            raise HttpError(f"GET {path} answered {status}: {body[:500]!r}")
        return body

    def timed(self, path: str) -> tuple[float, int]:
        t0 = time.perf_counter()
        body = self.get(path)
        return time.perf_counter() - t0, len(body)

    def close(self) -> None:
        self._conn.close()


@dataclass(frozen=True)
class BaselineRun:
    seconds: float
    nbytes: int
    bodies: list[bytes] | None  # in job order, when kept


class Baseline:
    """Range queries POSTed to Prometheus from a pool of threads, each with its own keep-alive connection."""

    HEADERS: ClassVar[dict[str, str]] = {
        "Content-Type": "application/x-www-form-urlencoded",
        "Accept-Encoding": "identity",
    }

    def __init__(self, host: str, port: int, threads: int = 12) -> None:
        self.host, self.port = host, port
        self._local = threading.local()
        self._conns: list[KeepAlive] = []
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="baseline")

    def _conn(self) -> KeepAlive:
        conn: KeepAlive | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._local.conn = KeepAlive(self.host, self.port)
            with self._lock:
                self._conns.append(conn)
        return conn

    @staticmethod
    def form(query: RangeQuery) -> bytes:
        w = query.window
        return urllib.parse.urlencode(
            {
                "query": query.expr,
                "start": prometheus_time(w.start_ms),
                "end": prometheus_time(w.end_ms),
                "step": prometheus_time(w.step_ms),
                "nocache": "1",
            }
        ).encode()

    def _one(self, body: bytes, path: str = "/api/v1/query_range") -> bytes:
        status, data = self._conn().request("POST", path, body, self.HEADERS)
        if status != 200:
            raise HttpError(f"{path} answered {status}: {data[:500]!r}")
        return data

    def run(self, queries: list[RangeQuery], *, keep: bool = False) -> BaselineRun:
        forms = [self.form(q) for q in queries]  # encoded before the clock starts
        t0 = time.perf_counter()
        futures = [self._pool.submit(self._one, f) for f in forms]
        bodies = [f.result() for f in futures]
        seconds = time.perf_counter() - t0
        return BaselineRun(seconds, sum(len(b) for b in bodies), bodies if keep else None)

    def single(self, query: RangeQuery) -> tuple[float, bytes]:
        """One query on the calling thread's connection (sequential measurements)."""
        body = self.form(query)
        t0 = time.perf_counter()
        data = self._one(body)
        return time.perf_counter() - t0, data

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
        with self._lock:
            for conn in self._conns:
                conn.close()
