"""Work that stops when its client goes away.

FastAPI keeps running a route after its client disconnected: a summary nobody will read would still
read a month of series and compute its findings. `unless_disconnected` runs the work beside a watch on
the connection (the ASGI `receive` channel, which says `http.disconnect` once the client is gone; the
request's body, if any, was read before) and cancels the work when the client goes first. Cancelled
work stops at its next await: the backend reads in flight are cancelled, and a computation that has
not started in its worker thread never starts, and one already running stops at its next step (the
summary service checks between its findings, per-GPU figures and stats).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

from fastapi import Request
from fastapi.responses import Response

T = TypeVar("T")

CLIENT_CLOSED = 499  # what a proxy logs for a request whose client went away (nginx's status)


async def disconnected(request: Request) -> None:
    """Returns once the client has gone away (never while it stays)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def unless_disconnected(request: Request, work: Awaitable[T]) -> T | None:
    """`work`'s result, or None when the client went away first (the work is then cancelled and
    awaited, so nothing of it outlives the request)."""
    task = asyncio.ensure_future(work)
    watch = asyncio.ensure_future(disconnected(request))
    try:
        await asyncio.wait((task, watch), return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        task.cancel()
        watch.cancel()
        await asyncio.gather(task, watch, return_exceptions=True)
        raise
    if task.done():
        watch.cancel()
        await asyncio.gather(watch, return_exceptions=True)
        return task.result()
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    return None


def client_closed() -> Response:
    """The answer to a request whose client is gone (nobody reads it; the access log and /metrics do)."""
    return Response(status_code=CLIENT_CLOSED)
