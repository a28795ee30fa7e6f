"""A pure-ASGI guard in front of every route, for what must happen before a request body is read.

1. Size: a body larger than `max_body_bytes` (GPULENS_MAX_BODY_BYTES) is answered 413 in the
   route's dialect: at once when Content-Length says so, else as soon as the bytes read (a chunked
   body, or a Content-Length that undercounts) pass the cap. The body is read here, whole, before
   the app sees it, so no route ever parses (or holds) more than the cap.
2. Admin routes (`/api/v2/admin/...`) authenticate before their body is read: FastAPI reads and
   parses a body parameter before it runs a route's dependencies, so a caller without an admin key
   would otherwise have its body parsed before its 401/403. The principal found here is the one
   the route's dependencies use (deps.PRINCIPAL_SCOPE_KEY).
"""

from __future__ import annotations

from starlette.datastructures import Headers
from starlette.requests import HTTPConnection
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gpulens.api.deps import PRINCIPAL_SCOPE_KEY, AppContext, get_admin, resolve_principal
from gpulens.api.errors import error_response
from gpulens.domain.errors import GpulensError, PayloadTooLarge

ADMIN_PREFIX = "/api/v2/admin/"


class RequestGuard:
    def __init__(self, app: ASGIApp, *, ctx: AppContext) -> None:
        self.app = app
        self.max_body_bytes = ctx.settings.max_body_bytes
        self.authenticator = ctx.authenticator

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        try:
            if _content_length(scope) > self.max_body_bytes:
                raise self._too_large()
            if route_path(scope).startswith(ADMIN_PREFIX):
                scope[PRINCIPAL_SCOPE_KEY] = await get_admin(
                    await resolve_principal(HTTPConnection(scope), self.authenticator)
                )
            body = await self._read_body(receive)
        except GpulensError as exc:
            await error_response(HTTPConnection(scope), exc)(scope, receive, send)
            return
        if body is None:  # the client went away before its body was complete: nobody to answer
            return
        await self.app(scope, _replay(body, receive), send)

    def _too_large(self) -> PayloadTooLarge:
        return PayloadTooLarge(
            f"The request body is larger than {self.max_body_bytes} bytes (GPULENS_MAX_BODY_BYTES)"
        )

    async def _read_body(self, receive: Receive) -> bytes | None:
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return None
            chunk: bytes = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:
                raise self._too_large()
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)


def route_path(scope: Scope) -> str:
    """The path the router matches: without the root path a proxy mounts the app under."""
    path: str = scope["path"]
    root: str = scope.get("root_path", "")
    return path[len(root) :] if root and path.startswith(root) else path


def _content_length(scope: Scope) -> int:
    """The declared body size; 0 when absent or unreadable (the bytes read are counted anyway)."""
    value = Headers(scope=scope).get("content-length", "")
    if not (value.isascii() and value.isdigit()):
        return 0
    return int(value) if len(value) <= 18 else 1 << 62  # never int() of a huge digit string


def _replay(body: bytes, receive: Receive) -> Receive:
    """A receive that hands the app the body read already, then passes on (e.g. a disconnect)."""
    pending = True

    async def replay() -> Message:
        nonlocal pending
        if pending:
            pending = False
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay
