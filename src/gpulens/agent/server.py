"""`/metrics` over HTTP (stdlib ThreadingHTTPServer): the latest pass, for a Prometheus to scrape."""

from __future__ import annotations

import re
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar

from gpulens.agent.exposition import CONTENT_TYPE, ExpositionSink

_LISTEN = re.compile(r"^(?:\[(?P<v6>[0-9a-fA-F:.]+)\]|(?P<host>[^:\[\]]*)):(?P<port>[0-9]{1,5})$")


def parse_listen(value: str) -> tuple[str, int]:
    """`host:port` or `[v6]:port` -> (host, port); an empty host means every interface."""
    m = _LISTEN.match(value.strip())
    port = int(m.group("port")) if m else -1
    if m is None or not 0 <= port <= 65535:
        raise ValueError(f"--listen wants HOST:PORT (e.g. 127.0.0.1:9400), got {value!r}")
    host = m.group("v6") or m.group("host") or "0.0.0.0"  # noqa: S104 - the operator asked for it
    return host, port


class _Handler(BaseHTTPRequestHandler):
    exposition: ClassVar[ExpositionSink]
    server_version = "gpulens-agent"

    def _send(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path == "/metrics":
            body = self.exposition.body()
            if body is None:
                self._send(503, b"no pass collected yet\n", "text/plain; charset=utf-8")
            else:
                self._send(200, body, CONTENT_TYPE)
        elif path == "/":
            self._send(200, b"gpulens agent: see /metrics\n", "text/plain; charset=utf-8")
        else:
            self._send(404, b"not found\n", "text/plain; charset=utf-8")

    do_HEAD = do_GET

    def log_message(self, format: str, *args: object) -> None:
        return None  # one line per scrape is noise


class _V6Server(ThreadingHTTPServer):
    address_family = socket.AF_INET6


class MetricsServer:
    """Serves `exposition` on host:port (port 0: any free port; see `.port`) from a background thread."""

    def __init__(self, exposition: ExpositionSink, host: str = "127.0.0.1", port: int = 9400) -> None:
        handler = type("Handler", (_Handler,), {"exposition": exposition})
        server_cls = _V6Server if ":" in host else ThreadingHTTPServer
        self._httpd = server_cls((host, port), handler)
        self._httpd.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self._httpd.server_address[1])

    @property
    def url(self) -> str:
        host = str(self._httpd.server_address[0])
        host = f"[{host}]" if ":" in host else host
        return f"http://{host}:{self.port}"

    def start(self) -> MetricsServer:
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.2}, name="gpulens-agent-http"
        )
        self._thread.daemon = True
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._thread is not None:
            self._httpd.shutdown()
            self._thread.join()
            self._thread = None
        self._httpd.server_close()

    def __enter__(self) -> MetricsServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
