"""Prometheus HTTP API backend (also Thanos, Mimir, VictoriaMetrics): POSTed form queries.

Requests run on a blocking `httpx.Client` in worker threads: measured here, the async client alone
cost 1.35x a threaded fetch of the same bodies (prometheus-notes.md).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from typing import Any, Protocol

import anyio
import httpx
import orjson

from gpulens.domain.errors import BackendBadResponse, BackendError, BackendTimeout, BackendUnavailable
from gpulens.domain.models import RangeQuery, Series

log = logging.getLogger(__name__)
# errors of a connection taken from the pool that turned out to be closed (never a timeout)
STALE_CONNECTION = (httpx.ReadError, httpx.WriteError, httpx.RemoteProtocolError)


RAW_PIECE_MS = 6 * 3_600_000  # query_raw asks for at most this much time per request (bounds memory)


def _seconds(ms: int) -> str:
    whole, frac = divmod(ms, 1000)
    return f"{whole}.{frac:03d}" if frac else str(whole)


def raw_pieces(start_ms: int, end_ms: int, piece_ms: int = RAW_PIECE_MS) -> list[tuple[int, int]]:
    """[start, end] as consecutive pieces (lo, hi): the first holds [start, hi], each later one (lo, hi]."""
    out = []
    lo = start_ms
    while True:
        hi = min(lo + piece_ms, end_ms)
        out.append((lo, hi))
        if hi >= end_ms:
            return out
        lo = hi


class PrometheusBackend:
    """Runs range queries against `base_url` with a caller-supplied `httpx.Client`."""

    def __init__(
        self,
        base_url: str,
        client: PostClient,
        *,
        concurrency: int = 12,
        send_nocache: bool = True,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.name = f"Prometheus at {self.base_url}"
        self._client = client
        self._limiter = anyio.CapacityLimiter(concurrency)
        self._nocache = send_nocache  # VictoriaMetrics aligns start to the step unless nocache=1

    # -- public API -----------------------------------------------------------------------------
    async def query_range(self, query: RangeQuery) -> list[Series]:
        w = query.window
        form = {
            "query": query.expr,
            "start": _seconds(w.start_ms),
            "end": _seconds(w.end_ms),
            "step": _seconds(w.step_ms),
        }
        if self._nocache:
            form["nocache"] = "1"
        data = await self._call("/api/v1/query_range", form)
        if not isinstance(data, dict) or data.get("resultType") != "matrix":
            raise BackendBadResponse(self.name, f"{self.name} answered a range query without a matrix")
        return [Series(item.get("metric", {}), item.get("values", [])) for item in data.get("result", [])]

    async def query(self, expr: str, time_ms: int) -> list[Series]:
        data = await self._call("/api/v1/query", {"query": expr, "time": _seconds(time_ms)})
        kind = data.get("resultType") if isinstance(data, dict) else None
        if kind == "vector":
            return [Series(item.get("metric", {}), [item.get("value")]) for item in data.get("result", [])]
        if kind == "scalar":
            return [Series({}, [data.get("result")])]
        raise BackendBadResponse(self.name, f"{self.name} answered an instant query without a vector")

    async def series_labels(self, match: str, label: str, start_ms: int, end_ms: int) -> list[str]:
        found = await self.series(match, start_ms, end_ms)
        return sorted({s[label] for s in found if label in s})

    async def series(self, match: str, start_ms: int, end_ms: int) -> list[dict[str, str]]:
        data = await self._call(
            "/api/v1/series", {"match[]": match, "start": _seconds(start_ms), "end": _seconds(end_ms)}
        )
        if not isinstance(data, list):
            raise BackendBadResponse(self.name, f"{self.name} answered a series query without a list")
        return [{str(k): str(v) for k, v in s.items()} for s in data if isinstance(s, dict)]

    async def query_raw(self, match: str, start_ms: int, end_ms: int) -> list[Series]:
        """Instant queries of the range selector `match[<piece>]` at the end of each piece (6 h at a
        time, concurrently). Each piece asks 1 ms more than it keeps, so Prometheus 2.x (a range
        selector closed at both ends) and 3.x (open at the start) give the same samples; a sample on
        a border between pieces is kept once."""
        pieces = raw_pieces(start_ms, end_ms)

        async def one(lo: int, hi: int) -> list[dict[str, Any]]:
            expr = f"{match}[{hi - lo + 1}ms]"
            data = await self._call("/api/v1/query", {"query": expr, "time": _seconds(hi)})
            if not isinstance(data, dict) or data.get("resultType") != "matrix":
                raise BackendBadResponse(self.name, f"{self.name} answered a raw query without a matrix")
            result: list[dict[str, Any]] = data.get("result", [])
            return result

        answers = await asyncio.gather(*(one(lo, hi) for lo, hi in pieces))
        merged: dict[tuple[tuple[str, str], ...], tuple[dict[str, str], list[Any]]] = {}
        for i, (lo, _) in enumerate(pieces):
            border = lo / 1000  # seconds, as the answer writes times
            for item in answers[i]:
                labels: dict[str, str] = item.get("metric", {})
                values: list[Any] = item.get("values", [])
                skip = 0  # the first piece keeps `start`, later ones only what follows their `lo`
                while skip < len(values) and (
                    values[skip][0] < border if i == 0 else values[skip][0] <= border
                ):
                    skip += 1
                if skip < len(values):
                    key = tuple(sorted(labels.items()))
                    merged.setdefault(key, (labels, []))[1].extend(values[skip:])
        return [Series(labels, samples) for labels, samples in merged.values()]

    async def ready(self) -> None:
        await self._call("/api/v1/query", {"query": "1"})

    async def aclose(self) -> None:
        await anyio.to_thread.run_sync(self._client.close)

    # -- transport ------------------------------------------------------------------------------
    async def _call(self, path: str, form: dict[str, str]) -> Any:
        return await anyio.to_thread.run_sync(self._post, path, form, limiter=self._limiter)

    def _post(self, path: str, form: dict[str, str]) -> Any:
        try:
            try:
                response = self._client.post(self.base_url + path, data=form)
            except STALE_CONNECTION as exc:
                # a pooled keep-alive connection the server (or a proxy) closed as we reused it: the
                # query is read-only, so ask once more on a fresh connection
                log.info("%s: %s on a pooled connection, retrying once", self.name, type(exc).__name__)
                response = self._client.post(self.base_url + path, data=form)
            body = response.content
        except httpx.TimeoutException as exc:
            raise BackendTimeout(
                self.name, f"{self.name} did not answer in time ({type(exc).__name__})"
            ) from exc
        except httpx.HTTPError as exc:
            raise BackendUnavailable(
                self.name, f"{self.name} is unreachable: {exc or type(exc).__name__}"
            ) from exc
        return self._decode(response.status_code, body)

    def _decode(self, status: int, body: bytes) -> Any:
        try:
            envelope = orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            if status >= 500:
                raise BackendUnavailable(self.name, f"{self.name} answered HTTP {status}") from exc
            raise BackendBadResponse(
                self.name, f"{self.name} answered HTTP {status} with a body that is not JSON"
            ) from exc
        if isinstance(envelope, dict) and envelope.get("status") == "success" and status < 400:
            return envelope.get("data")
        message = "unknown error"
        kind = "error"
        if isinstance(envelope, dict):
            message = str(envelope.get("error") or message)
            kind = str(envelope.get("errorType") or kind)
        error: type[BackendError] = BackendUnavailable if status in (502, 503, 504) else BackendBadResponse
        raise error(self.name, f"{self.name} answered HTTP {status} ({kind}): {message}")


class PostClient(Protocol):
    """What the backend needs of a client: `httpx.Client`, or `PerThreadClient`."""

    def post(self, url: str, *, data: dict[str, str]) -> httpx.Response: ...

    def close(self) -> None: ...


class PerThreadClient:
    """One keep-alive `httpx.Client` with one connection per worker thread.

    A shared pool of N connections scans all of them (idle? expired? readable?) on every request:
    measured here, ~17 ms of CPU per 24 h Lyceum read. A connection per thread needs no scan and no
    lock; the backend's limiter bounds the threads, so the connections stay bounded too.
    """

    def __init__(self, make: Callable[[], httpx.Client]) -> None:
        self._make = make
        self._local = threading.local()
        self._all: list[httpx.Client] = []
        self._lock = threading.Lock()

    def _client(self) -> httpx.Client:
        client: httpx.Client | None = getattr(self._local, "client", None)
        if client is None:
            client = self._local.client = self._make()
            with self._lock:
                self._all.append(client)
        return client

    def post(self, url: str, *, data: dict[str, str]) -> httpx.Response:
        return self._client().post(url, data=data)

    def close(self) -> None:
        with self._lock:
            clients, self._all = self._all, []
        for client in clients:
            client.close()


def make_client(timeout_s: float, compression: bool, pool: int) -> PerThreadClient:
    """Keep-alive clients (one connection per worker thread, at most `pool` threads ask at once);
    identity encoding unless compression is wanted (gzip is slow on loopback)."""
    headers = {} if compression else {"Accept-Encoding": "identity"}
    del pool  # the backend's limiter bounds the threads, hence the connections

    def one() -> httpx.Client:
        return httpx.Client(
            timeout=httpx.Timeout(timeout_s, connect=min(timeout_s, 5.0)),
            headers=headers,
            limits=httpx.Limits(max_connections=1, max_keepalive_connections=1),
        )

    return PerThreadClient(one)
