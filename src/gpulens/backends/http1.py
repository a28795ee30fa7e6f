"""HTTP/1.1 form POSTs to the metrics backend on the event loop itself.

Keep-alive asyncio connections whose answers llhttp parses (`httptools`, the parser uvicorn serves
with): no worker thread, no thread hand-off per request, no Python code per header or body chunk
beyond a callback. It replaced blocking httpx clients in worker threads (4x its CPU then), and is kept
over aiohttp's client, which parses with the same llhttp but costs 1.6-1.9x its CPU on the Lyceum
reads of the bench (bench/client.py; docs/operations.md, "The HTTP client to the backend").

Every request is bounded: a wait for one of the pool's connections (its own timeout: the backend is
busy), then a deadline for the whole of the request (connect, send, headers and body), a cap on the
answer's heads (bytes and header lines, interim `1xx` answers included) and on its (decoded) body
bytes, declared or sent. Interim answers (`100 Continue`, `103 Early Hints`) are read past to the
final one. A host name's addresses are tried with happy eyeballs (RFC 8305). A connection is reused
only after a complete answer that lets it be; one the server closed while idle is noticed when reused,
and the request (read-only) is sent once more on a fresh one. Connections belong to the event loop
that opened them: those of a loop that has since closed (`anyio.run` per call, in a CLI or a test)
are closed when next seen.
"""

from __future__ import annotations

import asyncio
import functools
import socket
import ssl
import urllib.parse
import weakref
import zlib
from asyncio.staggered import staggered_race
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import httptools

CONNECT_TIMEOUT = "ConnectTimeout"  # a TransportError's kind when no connection came in time
POOL_TIMEOUT = "PoolTimeout"  # ... when none of the pool's connections came free in time
HEADERS_TOO_LARGE = "HeadersTooLarge"  # ... when an answer's heads pass MAX_HEAD_BYTES or MAX_HEADERS
MAX_HEAD_BYTES = 64 << 10  # the heads of one answer, interim (1xx) ones included: lines and headers
MAX_HEADERS = 100  # header lines over those heads
HAPPY_EYEBALLS_DELAY_S = 0.25  # RFC 8305's recommended "connection attempt delay"


# urlencode's escapes of ASCII as one translation table: a live alerts pass sends queries of 12,000
# characters, which urllib quotes one character at a time
_SAFE = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-~")
_FORM_ESCAPES = {c: ("+" if c == 0x20 else f"%{c:02X}") for c in range(128) if c not in _SAFE}


def form_body(form: dict[str, str]) -> bytes:
    """`urllib.parse.urlencode(form)` as bytes (the same text; ASCII by a table, the rest as urllib
    quotes it)."""
    return "&".join([f"{_quote(key)}={_quote(value)}" for key, value in form.items()]).encode("ascii")


def _quote(text: str) -> str:
    # an expression is kept escaped: a read asks each of its expressions once a chunk, a dashboard the
    # same ones again, and the table costs ~40 ns a character (~25 us a guarded query); times and
    # steps (short, new each chunk) and a live alerts pass's long queries are escaped as they come
    return _kept(text) if 64 < len(text) <= 4096 else _escaped(text)


def _escaped(text: str) -> str:
    if text.isascii():
        return text.translate(_FORM_ESCAPES)
    return urllib.parse.quote_plus(text, safe="")


_kept = functools.lru_cache(maxsize=512)(_escaped)


class TransportError(Exception):
    """The backend could not be reached or broke the protocol (`kind` names how, for logs)."""

    def __init__(self, kind: str, detail: str = "", *, fresh: bool = True) -> None:
        super().__init__(f"{kind}: {detail}" if detail else kind)
        self.kind = kind
        self.fresh = fresh  # False: a reused connection closed before any answer (worth one retry)


class AnswerTooLarge(Exception):
    def __init__(self, what: str) -> None:
        super().__init__(what)
        self.what = what


@dataclass(frozen=True)
class Origin:
    """Where requests go: scheme, host, port, and the path prefix of the base URL."""

    https: bool
    host: str
    port: int
    prefix: str

    @classmethod
    def parse(cls, url: str) -> Origin:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("the backend URL must be http:// or https:// with a host")
        https = parts.scheme == "https"
        port = parts.port  # ValueError: not a port number
        if port == 0:
            raise ValueError("the backend URL's port must not be 0")
        default = 443 if https else 80
        return cls(https, parts.hostname, default if port is None else port, parts.path.rstrip("/"))

    @property
    def host_header(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        default = 443 if self.https else 80
        return host if self.port == default else f"{host}:{self.port}"


def _safe_header(text: str) -> bool:
    return not any(ch in text for ch in "\r\n\0")


AddrInfo = tuple[int, int, int, str, tuple[Any, ...]]  # family, type, proto, canonname, address


def interleave(infos: list[AddrInfo]) -> list[AddrInfo]:
    """The addresses in the order RFC 8305 tries them: the first one's family first, then the families
    alternating (IPv6, IPv4, IPv6, ...); repeats dropped."""
    by_family: dict[int, list[AddrInfo]] = {}
    seen = set()
    for info in infos:
        if info[4] not in seen:
            seen.add(info[4])
            by_family.setdefault(info[0], []).append(info)
    lists = list(by_family.values())
    longest = max(map(len, lists), default=0)
    return [per[i] for i in range(longest) for per in lists if i < len(per)]


async def open_socket(
    loop: asyncio.AbstractEventLoop, host: str, port: int, delay_s: float = HAPPY_EYEBALLS_DELAY_S
) -> socket.socket:
    """A connected non-blocking TCP socket to `host`:`port`, by happy eyeballs (RFC 8305): the host's
    addresses interleaved by family, an attempt started every `delay_s` (at once when the one before
    fails), the first to connect kept and the others cancelled and closed. A literal IP address is
    not resolved (no thread hand-off). Raises OSError when none connects."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_NUMERICHOST)
    except socket.gaierror:  # a name: resolved off the loop
        infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    ordered = interleave(cast(list[AddrInfo], infos))
    if not ordered:
        raise OSError(f"no address for {host}")

    async def attempt(info: AddrInfo) -> socket.socket:
        family, kind, proto, _, address = info
        sock = socket.socket(family, kind, proto)
        try:
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # a request is one write
            await loop.sock_connect(sock, address)
        except BaseException:
            sock.close()
            raise
        return sock

    if len(ordered) == 1:
        return await attempt(ordered[0])
    winner, _, errors = await staggered_race([functools.partial(attempt, i) for i in ordered], delay_s)
    if winner is not None:
        return cast(socket.socket, winner)
    texts = {str(e) for e in errors if e is not None}
    raise OSError(f"{len(ordered)} addresses of {host}, none connected: {'; '.join(sorted(texts))}")


class _Connection(asyncio.Protocol):
    """One keep-alive connection; `exchange` sends a request and waits for its whole answer."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self.reused = False
        self.usable = True  # False once closed, failed or told to close
        self._waiter: asyncio.Future[tuple[int, bytes]] | None = None
        self._parser: Any = None
        self._received = False
        self._status = 0
        self._headers: dict[bytes, bytes] = {}
        self._chunks: list[bytes] = []
        self._size = 0
        self._cap = 0
        self._inflate: Any = None
        self._framed = True
        self._in_head = True  # reading a head (status line and headers), an interim one's included
        self._head_size = 0  # bytes of this answer's heads read so far
        self._header_count = 0
        self._interim = False  # the head read is a 1xx's: the final answer follows
        self.epoch = 0

    # -- asyncio.Protocol --------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's are not asyncio's classes

    def connection_lost(self, exc: Exception | None) -> None:
        self.usable = False
        waiter = self._waiter
        if waiter is None or waiter.done():
            return
        if exc is None and self._parser is not None and self._status and not self._framed:
            if self._inflate is not None and not self._inflate.eof:
                waiter.set_exception(TransportError("DecodingError", "the compressed answer ends early"))
                return
            self._complete()  # an answer delimited by the connection's end (HTTP/1.0 style)
            return
        detail = type(exc).__name__ if exc is not None else "closed by the server"
        waiter.set_exception(
            TransportError("ConnectionClosed", detail, fresh=self._received or not self.reused)
        )

    def data_received(self, data: bytes) -> None:
        self._received = True
        parser = self._parser
        if parser is None:  # bytes nobody asked for: the connection is not to be trusted
            self._fail(TransportError("UnexpectedData", "an answer to no request"))
            return
        at = 0
        try:
            while self._in_head and at < len(data):  # a head is fed no further than its limit
                room = MAX_HEAD_BYTES - self._head_size
                if room <= 0:
                    self._fail(TransportError(HEADERS_TOO_LARGE, f"heads over {MAX_HEAD_BYTES} bytes"))
                    return
                piece = data if at == 0 and len(data) <= room else memoryview(data)[at : at + room]
                at += len(piece)
                self._head_size += len(piece)
                parser.feed_data(piece)
                if self._parser is not parser:  # the answer ended or failed in a callback
                    return
            if at < len(data):
                parser.feed_data(memoryview(data)[at:] if at else data)
        except (httptools.HttpParserError, httptools.HttpParserUpgrade) as exc:
            self._fail(TransportError("ProtocolError", str(exc) or type(exc).__name__))

    # -- httptools callbacks -----------------------------------------------------------------------
    def _idle(self) -> bool:
        return self._waiter is None or self._waiter.done()

    def on_header(self, name: bytes, value: bytes) -> None:
        if self._idle():
            return
        self._header_count += 1
        if self._header_count > MAX_HEADERS:
            self._fail(TransportError(HEADERS_TOO_LARGE, f"over {MAX_HEADERS} header lines"))
            return
        self._headers[name.lower()] = value

    def on_headers_complete(self) -> None:
        if self._idle():
            return
        status = self._parser.get_status_code()
        if 100 <= status < 200:  # an interim answer: the final one follows on the same connection
            if status == 101:
                self._fail(TransportError("ProtocolError", "a protocol switch nobody asked for"))
            self._interim = True
            return
        self._status, self._in_head = status, False
        headers = self._headers
        declared = headers.get(b"content-length", b"")
        if declared.isdigit() and int(declared) > self._cap:
            self._fail(AnswerTooLarge(f"declared {int(declared)} bytes"))
            return
        self._framed = bool(declared) or b"chunked" in headers.get(b"transfer-encoding", b"").lower()
        encoding = headers.get(b"content-encoding", b"identity").lower()
        if encoding == b"gzip":
            self._inflate = zlib.decompressobj(16 + zlib.MAX_WBITS)
        elif encoding == b"deflate":
            self._inflate = zlib.decompressobj()
        elif encoding not in (b"identity", b""):
            self._fail(TransportError("UnsupportedEncoding", encoding.decode("latin-1")))

    def on_body(self, body: bytes) -> None:
        if self._idle():
            return
        if self._inflate is not None:
            try:  # never more than the cap allows, whatever the compressed size
                body = self._inflate.decompress(body, self._cap - self._size + 1)
            except zlib.error as exc:
                self._fail(TransportError("DecodingError", str(exc)))
                return
        self._size += len(body)
        if self._size > self._cap:
            self._fail(AnswerTooLarge("sent more"))
            return
        self._chunks.append(body)

    def on_message_complete(self) -> None:
        if self._idle():
            return
        if self._interim:  # read past it: its headers are not the final answer's
            self._interim, self._headers, self._in_head = False, {}, True
            return
        if self._inflate is not None and self._inflate.unconsumed_tail:
            self._fail(AnswerTooLarge("sent more"))
            return
        if self._inflate is not None and not self._inflate.eof:
            self._fail(TransportError("DecodingError", "the compressed answer ends early"))
            return
        if self._parser is None or not self._parser.should_keep_alive():
            self.usable = False
        self._complete()

    # -- use ---------------------------------------------------------------------------------------
    def exchange(self, request: bytes, cap: int) -> asyncio.Future[tuple[int, bytes]]:
        assert self.transport is not None
        self._waiter = self.loop.create_future()
        self._parser = httptools.HttpResponseParser(self)
        self._received = False
        self._status, self._headers, self._chunks, self._size = 0, {}, [], 0
        self._cap, self._inflate, self._framed = cap, None, True
        self._in_head, self._head_size, self._header_count, self._interim = True, 0, 0, False
        self.transport.write(request)
        return self._waiter

    def _complete(self) -> None:
        waiter, self._parser = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result((self._status, b"".join(self._chunks)))
        self._chunks = []

    def _fail(self, exc: Exception) -> None:
        self.usable = False
        self._parser = None
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_exception(exc)
        self.close()

    def close(self) -> None:
        self.usable = False
        if self.transport is not None and not self.loop.is_closed():
            self.transport.close()
        elif self.transport is not None:  # its loop is gone: nothing will run the transport's close
            sock = self.transport.get_extra_info("socket")
            close = getattr(getattr(sock, "_sock", None), "close", None)
            if close is not None:
                close()


class AsyncHttpClient:
    """Form POSTs over keep-alive connections: at most `pool` requests in flight and `pool`
    connections kept idle, per event loop.

    `headers`: sent with every request; `authorization`: called per request for the
    `Authorization` value (a rotating credential), or None; `ssl_context`: how an https backend is
    verified (None: the system's CAs); `compression`: ask for gzip (decoded here);
    `timeout_s`: the deadline of each whole request, counted from when it has one of the pool's
    slots; waiting for that slot gives up after `pool_timeout_s` (default: `timeout_s`) with a
    `POOL_TIMEOUT` error (the backend is busy, not slow); a connection attempt gives up after
    `connect_timeout_s` (default: the lesser of 5 s and `timeout_s`), so that a host that drops
    packets fails fast rather than at the request's deadline; a host name's next address is tried
    `happy_eyeballs_delay_s` after the one before (RFC 8305).
    """

    def __init__(
        self,
        timeout_s: float | None,
        *,
        pool: int = 12,
        headers: dict[str, str] | None = None,
        authorization: Callable[[], str] | None = None,
        ssl_context: ssl.SSLContext | None = None,
        compression: bool = False,
        access: Any = None,
        connect_timeout_s: float | None = None,
        pool_timeout_s: float | None = None,
        happy_eyeballs_delay_s: float = HAPPY_EYEBALLS_DELAY_S,
    ) -> None:
        extra = dict(headers or {})
        if not all(_safe_header(k) and _safe_header(v) and k.strip() for k, v in extra.items()):
            raise ValueError("a backend header name or value holds a line break")
        self.timeout_s = timeout_s
        self.access = access  # what the requests carry, for the backend's redaction
        self._pool = max(1, pool)
        self._authorization = authorization
        self._ssl = ssl_context  # made once, when the first https connection needs it
        default_connect = 5.0 if timeout_s is None else min(5.0, timeout_s)
        self._connect_timeout_s = connect_timeout_s if connect_timeout_s is not None else default_connect
        self.pool_timeout_s = pool_timeout_s if pool_timeout_s is not None else timeout_s
        self._happy_eyeballs_delay_s = happy_eyeballs_delay_s
        encoding = "gzip" if compression else "identity"
        fixed = {"Accept-Encoding": encoding, "User-Agent": "gpulens", **extra}
        self._fixed = "".join(f"{k}: {v}\r\n" for k, v in fixed.items())
        self._idle: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[Origin, list[_Connection]]]
        self._idle = weakref.WeakKeyDictionary()
        self._gates: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore]
        self._gates = weakref.WeakKeyDictionary()
        self._open: set[_Connection] = set()
        self._epoch = 0  # bumped by close(): connections in use then are not kept afterwards

    @property
    def open_connections(self) -> int:
        """Connections open now (in use or idle, on any loop)."""
        self._forget_closed_loops()
        return sum(1 for c in self._open if c.usable)

    async def post_form(
        self, origin: Origin, path: str, form: dict[str, str], max_bytes: int, timeout_s: float | None = None
    ) -> tuple[int, bytes]:
        """(status, body) of POSTing `form` to `origin` + `path` (the prefix included by the caller).

        Raises TransportError (kind POOL_TIMEOUT: no slot came free in `pool_timeout_s`),
        AnswerTooLarge, or TimeoutError when the request's deadline (`timeout_s`, default the
        client's) passes after it got its slot."""
        body = form_body(form)
        auth = ""
        if self._authorization is not None:
            value = self._authorization()
            if not _safe_header(value):
                raise TransportError("BadCredential", "the credential holds a line break")
            auth = f"Authorization: {value}\r\n"
        request = (
            f"POST {path} HTTP/1.1\r\nHost: {origin.host_header}\r\n{self._fixed}{auth}"
            f"Content-Type: application/x-www-form-urlencoded\r\nContent-Length: {len(body)}\r\n\r\n"
        ).encode("latin-1") + body
        loop = asyncio.get_running_loop()
        gate = self._gates.get(loop)
        if gate is None:
            gate = self._gates[loop] = asyncio.Semaphore(self._pool)
        try:  # waiting for a slot is not the request's time: the backend is not asked yet
            async with asyncio.timeout(self.pool_timeout_s):
                await gate.acquire()
        except TimeoutError:
            raise TransportError(POOL_TIMEOUT, f"no connection free in {self.pool_timeout_s} s") from None
        try:
            async with asyncio.timeout(timeout_s if timeout_s is not None else self.timeout_s):
                return await self._exchange(loop, origin, request, max_bytes)
        finally:
            gate.release()

    async def _exchange(
        self, loop: asyncio.AbstractEventLoop, origin: Origin, request: bytes, max_bytes: int
    ) -> tuple[int, bytes]:
        for attempt in (1, 2):
            conn = await self._connection(loop, origin, fresh=attempt == 2)
            try:
                status, answer = await conn.exchange(request, max_bytes)
            except TransportError as exc:
                if attempt == 1 and not exc.fresh:
                    continue  # a pooled connection the server had closed: once more, fresh
                raise
            except BaseException:
                conn.close()  # a deadline or a cancel mid-answer: the connection is spent
                raise
            self._release(loop, origin, conn)
            return status, answer
        raise AssertionError("unreachable")

    async def _connection(self, loop: asyncio.AbstractEventLoop, origin: Origin, fresh: bool) -> _Connection:
        idle = self._idle.setdefault(loop, {}).setdefault(origin, [])
        while idle and not fresh:
            conn = idle.pop()
            if conn.usable and conn.transport is not None and not conn.transport.is_closing():
                conn.reused = True
                return conn
            self._drop(conn)
        self._forget_closed_loops()
        context = None
        if origin.https:
            if self._ssl is None:
                self._ssl = ssl.create_default_context()  # reads the system's CA store: once
            context = self._ssl
        try:
            async with asyncio.timeout(self._connect_timeout_s):
                conn = await self._dial(loop, origin, context)
        except TimeoutError as exc:
            raise TransportError(CONNECT_TIMEOUT, f"no connection in {self._connect_timeout_s} s") from exc
        except ssl.SSLError as exc:
            raise TransportError("TLSError", str(exc)) from exc
        except OSError as exc:
            raise TransportError("ConnectError", str(exc)) from exc
        conn.epoch = self._epoch
        self._open.add(conn)
        return conn

    async def _dial(
        self, loop: asyncio.AbstractEventLoop, origin: Origin, context: ssl.SSLContext | None
    ) -> _Connection:
        sock = await open_socket(loop, origin.host, origin.port, self._happy_eyeballs_delay_s)
        try:
            _, conn = await loop.create_connection(
                lambda: _Connection(loop),
                sock=sock,
                ssl=context,
                server_hostname=origin.host if context is not None else None,
            )
        except BaseException:
            sock.close()  # a TLS handshake that failed or ran out of time
            raise
        return conn

    def _release(self, loop: asyncio.AbstractEventLoop, origin: Origin, conn: _Connection) -> None:
        idle = self._idle.setdefault(loop, {}).setdefault(origin, [])
        if conn.usable and conn.epoch == self._epoch and len(idle) < self._pool:
            idle.append(conn)
        else:
            self._drop(conn)

    def _drop(self, conn: _Connection) -> None:
        conn.close()
        self._open.discard(conn)

    def _forget_closed_loops(self) -> None:
        for conn in [c for c in self._open if c.loop.is_closed() or not c.usable]:
            self._drop(conn)
        for loop in [loop for loop in self._idle if loop.is_closed()]:
            self._idle.pop(loop, None)

    def close(self) -> None:
        """Close every connection (idle ones; those in use end with their request)."""
        self._epoch += 1
        idle = {c for per_loop in self._idle.values() for conns in per_loop.values() for c in conns}
        for conn in list(self._open):
            if conn in idle or conn.loop.is_closed() or not conn.usable:
                self._drop(conn)
        self._idle.clear()
