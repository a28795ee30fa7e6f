"""Counts the HTTP requests in flight for `service/priority.py`: while one that is not a summary is
being served, the summaries' work steps aside (its backend queries and its computation's next step
wait), so a small read is not slowed down by summaries computing beside it."""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send

from gpulens.service.priority import Priority


class CountRequests:
    def __init__(self, app: ASGIApp, *, priority: Priority) -> None:
        self.app = app
        self.priority = priority

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        with self.priority.request():
            await self.app(scope, receive, send)
