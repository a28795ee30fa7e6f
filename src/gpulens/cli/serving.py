"""The one server runner: `gpulens serve` and `gpulens demo` both listen and serve through it.

The port is bound first (`listen`), before anything slow starts, so a port in use fails at once
with one line saying what to do. `run_server` then serves the app on that socket until Ctrl-C or
SIGTERM; both end it normally (in-flight requests get 5 s), so the caller's cleanup runs.
"""

from __future__ import annotations

import enum
import signal
import socket
from collections.abc import Mapping
from types import FrameType
from typing import Any

from gpulens.cli.common import fail
from gpulens.gctuning import tune_allocator, tune_gc

GRACEFUL_SHUTDOWN_S = 5


class LogLevel(enum.StrEnum):
    """`--log-level` of `serve` and `demo`: uvicorn's levels (checked when the command line is read)."""

    CRITICAL = "critical"
    ERROR = "error"
    WARNING = "warning"
    INFO = "info"
    DEBUG = "debug"
    TRACE = "trace"


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on host:port (raises OSError when it cannot be had, e.g. the port is taken)."""
    family, kind, proto, _, address = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(2048)
    except OSError:
        sock.close()
        raise
    return sock


def listen(host: str, port: int) -> socket.socket:
    """`bind`, or one red line naming the address and how to pick another port (exit 2)."""
    try:
        return bind(host, port)
    except OSError as exc:
        fail(
            f"cannot listen on {host}:{port} ({exc.strerror or exc}); "
            "pass --port N (or set GPULENS_PORT) to use another port",
            2,
        )


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def run_server(
    app: Any,
    listener: socket.socket,
    *,
    log_level: str = "info",
    access_log: bool = False,
    log_config: Mapping[str, Any] | None = None,
) -> None:
    """Serve `app` on `listener` until Ctrl-C or SIGTERM; returns normally on either.

    uvicorn handles SIGINT/SIGTERM itself (graceful shutdown), then re-raises the signal it caught:
    SIGTERM's is made a KeyboardInterrupt here, like Ctrl-C's, and both are swallowed, so the caller's
    `finally` blocks run instead of the process dying on the re-raised signal.
    """
    import uvicorn
    from uvicorn.config import LOGGING_CONFIG

    config = uvicorn.Config(
        app,
        log_level=log_level,
        access_log=access_log,
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
        log_config=dict(log_config) if log_config is not None else LOGGING_CONFIG,
    )
    server = uvicorn.Server(config)
    tune_gc()
    tune_allocator()
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        server.run(sockets=[listener])
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
