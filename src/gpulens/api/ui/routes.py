"""`GET /`, `/ui/executions/{id}`, `/ui/workloads/{id}`, `/ui/alerts`, `/ui/usage`: the dashboard's pages;
`/ui/static/...` their assets.

Every page is a fixed HTML file (the ids in the path are read by the page's script, never written
into the HTML), served with a Content-Security-Policy that allows nothing but this origin. None of
these routes is part of the API description.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

from fastapi import APIRouter, FastAPI
from fastapi.responses import Response
from fastapi.staticfiles import StaticFiles
from starlette.types import Receive, Scope, Send

PAGES_DIR: Final = Path(__file__).parent / "pages"
STATIC_DIR: Final = Path(__file__).parent / "static"
STATIC_PREFIX: Final = "/ui/static"

CSP: Final = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; font-src 'self'; object-src 'none'; base-uri 'none'; "
    "form-action 'self'; frame-ancestors 'none'"
)
SECURITY_HEADERS: Final = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-store",
}

router = APIRouter(include_in_schema=False)


def _page(name: str) -> Response:
    html = (PAGES_DIR / name).read_bytes()
    return Response(html, media_type="text/html; charset=utf-8", headers=SECURITY_HEADERS)


@router.get("/")
async def index() -> Response:
    """Sign-in, then the caller's executions and running workloads."""
    return _page("index.html")


@router.get("/ui/executions/{execution_id}")
async def execution_page(execution_id: str) -> Response:
    """One execution: its 12 series, findings, cost, stats (the id is read by the script)."""
    return _page("execution.html")


@router.get("/ui/workloads/{workload_id}")
async def workload_page(workload_id: str) -> Response:
    """One Run:ai workload: its pods and their metrics (the id is read by the script)."""
    return _page("workload.html")


@router.get("/ui/alerts")
async def alerts_page() -> Response:
    """The org's live alerts: rules, channels, recent deliveries (a failed one retried from here)."""
    return _page("alerts.html")


@router.get("/ui/usage")
async def usage_page() -> Response:
    """The org's GPU usage per group over a window (docs/usage.md), each group linked to its executions."""
    return _page("usage.html")


class _StaticAssets(StaticFiles):
    """The assets, with the same hardening headers as the pages (a script is never sniffed as HTML)."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def send_with_headers(message: dict[str, object]) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))  # type: ignore[call-overload]
                headers.append((b"x-content-type-options", b"nosniff"))
                headers.append((b"content-security-policy", CSP.encode()))
                message = {**message, "headers": headers}
            await send(message)

        await super().__call__(scope, receive, send_with_headers)  # type: ignore[arg-type]


def install(app: FastAPI) -> None:
    """Adds the pages and mounts the assets on `app`."""
    app.include_router(router)
    app.mount(STATIC_PREFIX, _StaticAssets(directory=STATIC_DIR), name="ui-static")
