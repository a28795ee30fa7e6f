"""Prometheus HTTP API backend (also Thanos, Mimir, VictoriaMetrics): POSTed form queries.

Requests go out on gpulens' own HTTP/1.1 client on the event loop (`backends/http1.py`), and range
and raw answers are read without a Python object per sample where they can be (`backends/promjson.py`;
docs/operations.md, "Decoding, GC and HTTP client tuning"). A caller's `httpx.Client` (a custom
transport, a test's mock) is run in worker threads instead.

What a client is told about a failure names "the metrics backend" only: its URL and the transport's
own words go to the log (a client must not learn where the backend lives). Every answer is bounded:
a deadline for the whole request (connect, headers and body: not per read), a cap on the bytes read,
and sample values checked to be Prometheus' decimal text before anything copies them into JSON.

How a fleet's backend is reached (`BackendAccess`): a path prefix is part of `base_url` (Mimir's
`/prometheus`), extra headers (`X-Scope-OrgID`), basic auth or a bearer token (each from a value or a
file re-read when it changes, as Kubernetes rotates projected tokens), a CA bundle and a client
certificate. No credential is logged or shown: a backend's text is redacted of them, and a refusal
(401/403) is reported without its body.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import os
import re
import ssl
import threading
import time
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from operator import itemgetter
from pathlib import Path
from typing import Any, Protocol, TypeVar

import anyio
import httpx
import orjson

from gpulens.backends import promjson
from gpulens.backends.http1 import (
    CONNECT_TIMEOUT,
    POOL_TIMEOUT,
    AnswerTooLarge,
    AsyncHttpClient,
    Origin,
    TransportError,
)
from gpulens.backends.promjson import prometheus_time
from gpulens.domain.errors import BackendBadResponse, BackendError, BackendTimeout, BackendUnavailable
from gpulens.domain.models import RangeQuery, Series, TimedSamples, Window

log = logging.getLogger(__name__)
# errors of a connection taken from the pool that turned out to be closed (never a timeout)
STALE_CONNECTION = (httpx.ReadError, httpx.WriteError, httpx.RemoteProtocolError)
PUBLIC_NAME = "the metrics backend"  # all a client is told of the backend
DEFAULT_MAX_ANSWER_BYTES = 64 << 20

T = TypeVar("T")

RAW_PIECE_MS = 6 * 3_600_000  # query_raw asks for at most this much time per request (bounds memory)


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


# -- sample values --------------------------------------------------------------------------------
# Prometheus writes a sample value as decimal text (Go's strconv) or one of three specials. The Lyceum
# encoder copies the text verbatim into JSON, so it must be exactly a finite JSON number (or a
# special, which the encoder drops): orjson's strict number grammar is that check, run in C.
_NUMBER_CHARS = re.compile(r"[0-9.eE+,-]*")  # number text joined by commas: nothing else may appear
_SPECIALS = ("NaN", "+Inf", "-Inf")
_FIRST, _SECOND = itemgetter(0), itemgetter(1)


def valid_samples(samples: Any) -> bool:
    """True when `samples` is a list of [unix seconds (a JSON number), "finite decimal text" or
    "NaN"/"+Inf"/"-Inf"] pairs.

    Through C callables only (a 24 h read holds ~70,000 values; a few ms here): the values are
    joined by commas and parsed as one JSON array of numbers, which must have one number a value
    (a comma inside a value would add one; only number characters may appear, so nothing else parses).
    """
    if type(samples) is not list:
        return False
    n = len(samples)
    if n == 0:
        return True
    try:
        text = "," + ",".join(map(_SECOND, samples)) + ","  # TypeError: a value that is not a string
        if sum(map(len, samples)) != 2 * n:  # every item has >= 2 elements (above), so each has 2
            return False
        sum(map(_FIRST, samples))  # TypeError: a time that is not a number (a string item too)
    except (TypeError, IndexError, KeyError):
        return False
    if _NUMBER_CHARS.fullmatch(text) is None:
        for special in _SPECIALS:  # whole values only ("1NaN" stays); twice for adjacent ones
            if special in text:
                text = text.replace(f",{special},", ",0,").replace(f",{special},", ",0,")
        if _NUMBER_CHARS.fullmatch(text) is None:
            return False
    try:
        numbers = orjson.loads("[" + text[1:-1] + "]")  # rejects "01", ".5", "1.", "+1", 1e999
    except orjson.JSONDecodeError:
        return False
    return len(numbers) == n


def _joined(parts: list[Sequence[Any]]) -> Sequence[Any]:
    """One series' samples from consecutive pieces."""
    if all(isinstance(p, TimedSamples) for p in parts):
        return TimedSamples.concat(parts)  # type: ignore[arg-type]
    return [sample for part in parts for sample in part]


def _placeholders(data: Any) -> int:
    """How many series of a cut answer hold the `[]` left in place of their values (-1: one holds
    something else, so the cut went wrong)."""
    result = data.get("result") if isinstance(data, dict) else None
    if type(result) is not list:
        return -1
    count = 0
    for item in result:
        if type(item) is dict and "values" in item:
            if item["values"] != []:
                return -1
            count += 1
    return count


def _labels(value: Any) -> dict[str, str] | None:
    if type(value) is not dict or not all(type(v) is str for v in value.values()):
        return None
    return value


# -- how gpulens reaches a fleet's backend: headers, credentials, TLS --------------------------------
class CredentialUnreadable(Exception):
    """A credential file could not be read (and no earlier value of it is known)."""


class Secret:
    """A credential: a fixed value, or a file's content (surrounding whitespace stripped) re-read
    whenever the file stats differently (Kubernetes rotates a projected token by swapping a symlink:
    the path then names another inode). A file that cannot be read, or is empty, mid-rotation keeps
    the last value read. Its repr never shows the value."""

    def __init__(self, value: str | None = None, *, path: Path | None = None) -> None:
        if (value is None) == (path is None):
            raise ValueError("a Secret is a value or a file, exactly one")
        self._value = value
        self._path = path
        self._seen: tuple[int, int, int, int] | None = None  # (dev, inode, mtime ns, size) last read
        self._lock = threading.Lock()

    @property
    def path(self) -> Path | None:
        return self._path

    def get(self) -> str:
        if self._path is None:
            assert self._value is not None
            return self._value
        try:
            st = os.stat(self._path)
            key = (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size)
            if key != self._seen:
                with self._lock:
                    if key != self._seen:
                        text = self._path.read_text(encoding="utf-8").strip()
                        if not text:
                            raise OSError("the file is empty")
                        self._value, self._seen = text, key
        except (OSError, UnicodeDecodeError) as exc:
            if self._value is None:
                raise CredentialUnreadable(f"cannot read the credential file {self._path}: {exc}") from None
            log.warning("credential file %s unreadable (%s): the last value read is used", self._path, exc)
        assert self._value is not None
        return self._value

    def known(self) -> str | None:
        """The value last read (for redaction), without touching the file."""
        return self._value

    def __repr__(self) -> str:
        return f"Secret(path={str(self._path)!r})" if self._path is not None else "Secret(***)"


@dataclass(frozen=True)
class BackendAccess:
    """What reaching the backend takes besides its URL: extra headers (each request), basic auth
    (`username` and `password`) or a `bearer` token, a CA bundle and a client certificate."""

    headers: Mapping[str, str] = field(default_factory=dict)
    username: str | None = None
    password: Secret | None = None
    bearer: Secret | None = None
    ca_file: Path | None = None
    cert_file: Path | None = None
    key_file: Path | None = None  # None: the key is in cert_file

    def __post_init__(self) -> None:
        if self.bearer is not None and (self.username is not None or self.password is not None):
            raise ValueError("basic auth and a bearer token exclude each other")
        if (self.username is None) != (self.password is None):
            raise ValueError("basic auth needs both a username and a password")
        if self.key_file is not None and self.cert_file is None:
            raise ValueError("a client key needs a client certificate")

    def authorization(self) -> Callable[[], str] | None:
        """What makes each request's `Authorization` value (a file's credential as it is now)."""
        bearer, username, password = self.bearer, self.username, self.password
        if bearer is not None:
            return lambda: f"Bearer {bearer.get()}"
        if username is not None and password is not None:

            def basic() -> str:
                pair = f"{username}:{password.get()}".encode()
                return "Basic " + base64.b64encode(pair).decode("ascii")

            return basic
        return None

    def ssl_context(self) -> ssl.SSLContext | None:
        """None: the client's default verification (the system's CAs). Else only `ca_file`'s CAs are
        trusted (as Prometheus' own `tls_config.ca_file`), and the client certificate is presented
        when set."""
        if self.ca_file is None and self.cert_file is None:
            return None
        context = ssl.create_default_context(cafile=str(self.ca_file) if self.ca_file else None)
        if self.cert_file is not None:
            key = str(self.key_file) if self.key_file else None
            context.load_cert_chain(str(self.cert_file), key, password=b"")  # never a prompt
        return context

    def secrets(self) -> list[str]:
        """The credential values known now (header values too: one may be a key), to redact from any
        text a client or a log is shown; values under 4 characters are not worth hiding and would
        mangle the text."""
        found = [*self.headers.values()]
        for secret in (self.password, self.bearer):
            value = secret.known() if secret is not None else None
            if value:
                found.append(value)
                if secret is self.password:  # as a Basic header carries it
                    found.append(base64.b64encode(f"{self.username}:{value}".encode()).decode("ascii"))
        return sorted((v for v in found if len(v) >= 4), key=len, reverse=True)


class PrometheusBackend:
    """Runs range queries against `base_url` with a caller-supplied `httpx.Client`.

    `timeout_s`: the deadline of each whole request (default: the client's `timeout_s`, if it has one);
    `max_answer_bytes`: the largest answer read (decoded bytes), beyond which the request fails (502);
    `access`: the credentials the client sends, redacted from any backend text (default: the
    client's `access`, if it has one).
    """

    def __init__(
        self,
        base_url: str,
        client: AsyncHttpClient | PostClient,
        *,
        concurrency: int = 12,
        send_nocache: bool = True,
        timeout_s: float | None = None,
        max_answer_bytes: int = DEFAULT_MAX_ANSWER_BYTES,
        access: BackendAccess | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.name = f"Prometheus at {self.base_url}"  # for logs and cache keys; never shown to clients
        self._client = client
        self._http = client if isinstance(client, AsyncHttpClient) else None
        self._origin = Origin.parse(self.base_url) if self._http is not None else None
        self._limiter = anyio.CapacityLimiter(concurrency)
        self._nocache = send_nocache  # VictoriaMetrics aligns start to the step unless nocache=1
        self._timeout_s = timeout_s if timeout_s is not None else getattr(client, "timeout_s", None)
        self._max_bytes = max_answer_bytes
        self._access: BackendAccess | None = access if access is not None else getattr(client, "access", None)

    # -- public API -----------------------------------------------------------------------------
    async def query_range(self, query: RangeQuery) -> list[Series]:
        w = query.window
        form = {
            "query": query.expr,
            "start": prometheus_time(w.start_ms),
            "end": prometheus_time(w.end_ms),
            "step": prometheus_time(w.step_ms),
        }
        if self._nocache:
            form["nocache"] = "1"
        return await self._call_body(
            "/api/v1/query_range",
            form,
            lambda status, body: [Series(*s) for s in self._cut_matrix(status, body, "a range query", w)],
        )

    def _cut_matrix(
        self, status: int, body: bytes, what: str, grid: Window | None = None
    ) -> list[tuple[dict[str, str], Sequence[Any]]]:
        """The answer's series, their values arrays read without an object per sample where they
        can be: `GridSamples`/`GridPoints` on the range query's `grid`, `TimedSamples` (no grid: raw)."""
        cut = promjson.cut_values(body) if status == 200 else None
        if cut is not None:
            envelope, arrays = cut
            data = self._data(status, envelope)
            if _placeholders(data) == len(arrays):
                return self._matrix(data, what, arrays, grid)
        return self._matrix(self._decode(status, body), what)  # parsed whole

    def _matrix(
        self, data: Any, what: str, arrays: list[bytes] | None = None, grid: Window | None = None
    ) -> list[tuple[dict[str, str], Sequence[Any]]]:
        """The series of a matrix; `arrays`: their values arrays cut out of the body (in order)."""
        if not isinstance(data, dict) or data.get("resultType") != "matrix":
            raise self._bad(f"answered {what} without a matrix")
        result = data.get("result", [])
        if type(result) is not list:
            raise self._bad(f"answered {what} without a list of series")
        cut = iter(arrays or ())
        out: list[tuple[dict[str, str], Sequence[Any]]] = []
        for item in result:
            if type(item) is not dict:
                raise self._bad(f"answered {what} with a series that is not an object")
            labels = _labels(item.get("metric", {}))
            values: Any = item.get("values", [])
            if arrays is not None and "values" in item:
                array = next(cut)
                if grid is not None:
                    values = promjson.grid_samples(array, grid.step_ms, grid)
                else:
                    values = promjson.timed_samples(array)
                if values is not None:
                    if labels is None:
                        raise self._bad(f"answered {what} with malformed labels or sample values")
                    out.append((labels, values))
                    continue
                try:
                    values = orjson.loads(array)
                except orjson.JSONDecodeError:
                    values = None
            if labels is None or not valid_samples(values):
                raise self._bad(f"answered {what} with malformed labels or sample values")
            out.append((labels, values))
        return out

    async def query(self, expr: str, time_ms: int) -> list[Series]:
        form = {"query": expr, "time": prometheus_time(time_ms)}
        return await self._call("/api/v1/query", form, self._instant)

    def _instant(self, data: Any) -> list[Series]:
        kind = data.get("resultType") if isinstance(data, dict) else None
        if kind == "vector":
            result = data.get("result", [])
            if type(result) is not list or not all(type(item) is dict for item in result):
                raise self._bad("answered an instant query without a list of series")
            out = []
            for item in result:
                labels, point = _labels(item.get("metric", {})), item.get("value")
                if labels is None or not valid_samples([point]):
                    raise self._bad("answered an instant query with malformed labels or a malformed value")
                out.append(Series(labels, [point]))
            return out
        if kind == "scalar":
            point = data.get("result")
            if not valid_samples([point]):
                raise self._bad("answered an instant query with a malformed value")
            return [Series({}, [point])]
        raise self._bad("answered an instant query without a vector")

    async def series_labels(self, match: str, label: str, start_ms: int, end_ms: int) -> list[str]:
        found = await self.series(match, start_ms, end_ms)
        return sorted({s[label] for s in found if label in s})

    async def series(self, match: str, start_ms: int, end_ms: int) -> list[dict[str, str]]:
        form = {"match[]": match, "start": prometheus_time(start_ms), "end": prometheus_time(end_ms)}
        return await self._call("/api/v1/series", form, self._series_list)

    def _series_list(self, data: Any) -> list[dict[str, str]]:
        if not isinstance(data, list):
            raise self._bad("answered a series query without a list")
        return [{str(k): str(v) for k, v in s.items()} for s in data if isinstance(s, dict)]

    async def query_raw(self, match: str, start_ms: int, end_ms: int) -> list[Series]:
        """Instant queries of the range selector `match[<piece>]` at the end of each piece (6 h at a
        time, concurrently). Each piece asks 1 ms more than it keeps, so Prometheus 2.x (a range
        selector closed at both ends) and 3.x (open at the start) give the same samples; a sample on
        a border between pieces is kept once."""
        pieces = raw_pieces(start_ms, end_ms)

        def parse(status: int, body: bytes) -> list[tuple[dict[str, str], Sequence[Any]]]:
            return self._cut_matrix(status, body, "a raw query")

        async def one(lo: int, hi: int) -> list[tuple[dict[str, str], Sequence[Any]]]:
            expr = f"{match}[{hi - lo + 1}ms]"
            return await self._call_body("/api/v1/query", {"query": expr, "time": prometheus_time(hi)}, parse)

        answers = await asyncio.gather(*(one(lo, hi) for lo, hi in pieces))
        merged: dict[tuple[tuple[str, str], ...], tuple[dict[str, str], list[Sequence[Any]]]] = {}
        for i, (lo, _) in enumerate(pieces):
            border = lo / 1000  # seconds, as the answer writes times
            for labels, values in answers[i]:
                # the first piece keeps `start`, later ones only what follows their `lo` (times ascend)
                skip = (bisect_left if i == 0 else bisect_right)(values, border, key=_FIRST)
                if skip < len(values):
                    key = tuple(sorted(labels.items()))
                    part = values.tail(skip) if isinstance(values, TimedSamples) else values[skip:]
                    merged.setdefault(key, (labels, []))[1].append(part)
        return [Series(labels, _joined(parts)) for labels, parts in merged.values()]

    async def ready(self) -> None:
        await self._call("/api/v1/query", {"query": "1"}, lambda data: None)

    async def aclose(self) -> None:
        if self._http is not None:
            self._http.close()
        else:
            await anyio.to_thread.run_sync(self._client.close)

    # -- transport ------------------------------------------------------------------------------
    async def _call(self, path: str, form: dict[str, str], parse: Callable[[Any], T]) -> T:
        """POST `form` and `parse` the envelope's data."""
        return await self._call_body(path, form, lambda status, body: parse(self._decode(status, body)))

    async def _call_body(self, path: str, form: dict[str, str], parse: Callable[[int, bytes], T]) -> T:
        """POST `form` and `parse` the status and the raw body: on the event loop with gpulens' own
        client, else (a caller's httpx client) both in a worker thread."""
        if self._http is not None:
            return parse(*await self._post_async(path, form))
        return await anyio.to_thread.run_sync(self._fetch_body, path, form, parse, limiter=self._limiter)

    async def _post_async(self, path: str, form: dict[str, str]) -> tuple[int, bytes]:
        assert self._http is not None and self._origin is not None
        origin = self._origin
        try:  # the deadline runs from when the request has a connection slot (the client's pool)
            return await self._http.post_form(
                origin, origin.prefix + path, form, self._max_bytes, timeout_s=self._timeout_s
            )
        except TimeoutError as exc:
            log.warning("%s did not answer %s in time", self.name, path)
            raise BackendTimeout(self.name, f"{PUBLIC_NAME} did not answer in time (ReadTimeout)") from exc
        except AnswerTooLarge as exc:
            raise self._too_large(self._max_bytes, exc.what) from None
        except CredentialUnreadable as exc:
            raise self._credential_unreadable(exc) from None
        except TransportError as exc:
            if exc.kind == CONNECT_TIMEOUT:  # a host that drops packets: no answer in time, as before
                log.warning("%s did not accept a connection in time (%s)", self.name, path)
                raise BackendTimeout(self.name, f"{PUBLIC_NAME} did not answer in time ({exc.kind})") from exc
            if exc.kind == POOL_TIMEOUT:  # every slot busy with other queries: not the backend's delay
                log.warning("%s: no connection slot free in time (%s): %s", self.name, path, exc)
                raise BackendUnavailable(
                    self.name, f"{PUBLIC_NAME} is busy: no connection to it came free in time ({exc.kind})"
                ) from exc
            log.warning("%s is unreachable (%s): %s", self.name, path, self._unsecret(str(exc)))
            raise BackendUnavailable(self.name, f"{PUBLIC_NAME} is unreachable ({exc.kind})") from exc

    def _credential_unreadable(self, exc: CredentialUnreadable) -> BackendUnavailable:
        log.warning("%s: %s", self.name, exc)
        return BackendUnavailable(
            self.name, f"{PUBLIC_NAME} cannot be asked: gpulens' credential for it is unreadable"
        )

    def _fetch_body(self, path: str, form: dict[str, str], parse: Callable[[int, bytes], T]) -> T:
        return parse(*self._post(path, form))

    def _bad(self, what: str) -> BackendBadResponse:
        log.warning("%s %s", self.name, what)
        return BackendBadResponse(self.name, f"{PUBLIC_NAME} {what}")

    def _post(self, path: str, form: dict[str, str]) -> tuple[int, bytes]:
        """The threaded path (a caller's httpx client): the deadline is checked between body chunks."""
        started = time.monotonic()
        try:
            try:
                status, body = self._read(path, form, started)
            except STALE_CONNECTION as exc:
                # a pooled keep-alive connection the server (or a proxy) closed as we reused it:
                # the query is read-only, so ask once more on a fresh connection
                log.info("%s: %s on a pooled connection, retrying once", self.name, type(exc).__name__)
                status, body = self._read(path, form, started)
        except CredentialUnreadable as exc:
            raise self._credential_unreadable(exc) from None
        except httpx.TimeoutException as exc:
            log.warning("%s did not answer %s in time: %r", self.name, path, exc)
            raise BackendTimeout(
                self.name, f"{PUBLIC_NAME} did not answer in time ({type(exc).__name__})"
            ) from exc
        except httpx.HTTPError as exc:
            log.warning("%s is unreachable (%s): %r", self.name, path, exc)
            raise BackendUnavailable(
                self.name, f"{PUBLIC_NAME} is unreachable ({type(exc).__name__})"
            ) from exc
        return status, body

    def _read(self, path: str, form: dict[str, str], started: float) -> tuple[int, bytes]:
        """The status and the whole body, read chunk by chunk up to the cap and the deadline."""
        cap, chunks, size = self._max_bytes, [], 0
        assert not isinstance(self._client, AsyncHttpClient)  # that one is asked on the event loop
        with self._client.stream("POST", self.base_url + path, data=form) as response:
            declared = response.headers.get("content-length", "")
            if declared.isdigit() and int(declared) > cap:
                raise self._too_large(cap, f"declared {declared} bytes")
            for chunk in response.iter_bytes():
                size += len(chunk)
                if size > cap:
                    raise self._too_large(cap, "sent more")
                chunks.append(chunk)
                if self._timeout_s is not None and time.monotonic() - started > self._timeout_s:
                    raise httpx.ReadTimeout("the request's deadline passed", request=response.request)
            return response.status_code, b"".join(chunks)

    def _redact(self, text: str) -> str:
        """The backend's own error text without its address or any credential (a proxy may quote them)."""
        netloc = httpx.URL(self.base_url).netloc.decode("ascii", "replace")
        text = text.replace(self.base_url, PUBLIC_NAME)
        text = text.replace(netloc, "[backend]") if netloc else text
        return self._unsecret(text)

    def _unsecret(self, text: str) -> str:
        for secret in self._access.secrets() if self._access is not None else ():
            text = text.replace(secret, "[redacted]")
        return text

    def _too_large(self, cap: int, what: str) -> BackendBadResponse:
        log.warning("%s: an answer larger than %d bytes (%s): abandoned", self.name, cap, what)
        return BackendBadResponse(
            self.name,
            f"{PUBLIC_NAME} answered more than {cap} bytes (GPULENS_MAX_BACKEND_ANSWER_BYTES): "
            "ask for a shorter window or a coarser step",
        )

    def _decode(self, status: int, body: bytes) -> Any:
        if status in (401, 403, 407):  # its words may quote what was sent: logged redacted, never shown
            text = self._unsecret(body[:200].decode("utf-8", "replace"))
            log.warning("%s refused gpulens' credentials: HTTP %d %r", self.name, status, text)
            raise BackendBadResponse(self.name, f"{PUBLIC_NAME} refused gpulens' credentials (HTTP {status})")
        try:
            envelope = orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            if status >= 500:
                text = self._unsecret(body[:200].decode("utf-8", "replace"))
                log.warning("%s answered HTTP %d: %r", self.name, status, text)
                raise BackendUnavailable(self.name, f"{PUBLIC_NAME} answered HTTP {status}") from exc
            raise self._bad(f"answered HTTP {status} with a body that is not JSON") from exc
        return self._data(status, envelope)

    def _data(self, status: int, envelope: Any) -> Any:
        """The envelope's `data` when it reports success; else the error it reports, raised."""
        if isinstance(envelope, dict) and envelope.get("status") == "success" and status < 400:
            return envelope.get("data")
        message = "unknown error"
        kind = "error"
        if isinstance(envelope, dict):
            message = str(envelope.get("error") or message)
            kind = str(envelope.get("errorType") or kind)
        message = self._unsecret(message)
        log.warning("%s answered HTTP %d (%s): %s", self.name, status, kind, message)
        message = self._redact(message)
        error: type[BackendError] = BackendUnavailable if status in (502, 503, 504) else BackendBadResponse
        raise error(self.name, f"{PUBLIC_NAME} answered HTTP {status} ({kind}): {message}")


class PostClient(Protocol):
    """What the backend's threaded path needs of a caller's client: an `httpx.Client` (a custom
    transport, a test's mock)."""

    def stream(
        self, method: str, url: str, *, data: dict[str, str]
    ) -> AbstractContextManager[httpx.Response]: ...

    def close(self) -> None: ...


def make_client(
    timeout_s: float,
    compression: bool,
    pool: int,
    access: BackendAccess | None = None,
    pool_timeout_s: float | None = None,
) -> AsyncHttpClient:
    """gpulens' own client: keep-alive connections on the event loop, at most `pool` requests in
    flight and `pool` connections kept idle per loop; identity encoding unless compression is wanted
    (gzip is slow on loopback). `timeout_s` bounds each whole request (connect, headers, body), not
    each read, from when it has one of the `pool` slots; waiting for a slot gives up after
    `pool_timeout_s` (default: as long; the backend is then reported busy, 503, not slow). `access`:
    extra headers, credentials and TLS settings."""
    access = access or BackendAccess()
    return AsyncHttpClient(
        timeout_s,
        pool=pool,
        headers=dict(access.headers),
        authorization=access.authorization(),
        ssl_context=access.ssl_context(),
        compression=compression,
        access=access,
        pool_timeout_s=pool_timeout_s,
    )
