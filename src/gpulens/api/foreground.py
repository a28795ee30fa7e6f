"""Counts the HTTP requests in flight for `service/priority.py`: while one that is not a summary is
being served, the summaries' work steps aside (its backend queries and its computation's next step
wait), so a small read is not slowed down by summaries computing beside it. A summary request counts
as one from its first instant (its own queries never wait for it); health checks and the scrape of
gpulens' own metrics are not counted (a probe every few seconds would hold every summary back)."""

from __future__ import annotations

import re

from starlette.types import ASGIApp, Receive, Scope, Send

from gpulens.api.guard import route_path
from gpulens.api.lyceum.summary import SUMMARY_ROUTE
from gpulens.service.priority import Priority


class CountRequests:
    def __init__(self, app: ASGIApp, *, priority: Priority) -> None:
        self.app = app
        self.priority = priority

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = route_path(scope)  # without the root path a proxy mounts the app under
        if path in PROBES:
            await self.app(scope, receive, send)
            return
        with self.priority.request(summary=SUMMARY.match(path) is not None):
            await self.app(scope, receive, send)


PROBES = frozenset({"/healthz", "/readyz", "/metrics"})
SUMMARY = re.compile(re.escape(SUMMARY_ROUTE).replace(re.escape("{execution_id}"), "[^/]+") + r"\Z")
