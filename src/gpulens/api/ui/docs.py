"""`GET /docs`: the API's description in Swagger UI, served from this package; `/redoc` leads there.

FastAPI's own pages load Swagger UI and ReDoc from a public CDN (unpinned, without SRI) and start them
with an inline script, on the origin whose sessionStorage holds the dashboard's API key. Here the page
is a fixed HTML file, Swagger UI is vendored (static/vendor/swagger-ui/, pinned from npm, its version
and checksums in static/vendor/README.md) and started by a script file of this origin, all under the
dashboard's Content-Security-Policy: no third-party code runs beside the key.

ReDoc cannot run under that policy (its styled-components write <style> elements, which
`style-src 'self'` refuses), so `/redoc` answers with a redirect to `/docs` rather than a second copy
of the same description with a weaker policy.
"""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import RedirectResponse, Response

from gpulens.api.ui.routes import PAGES_DIR, SECURITY_HEADERS

DOCS_PATH = "/docs"
router = APIRouter(include_in_schema=False)


@router.get(DOCS_PATH)
async def docs() -> Response:
    """Swagger UI over /openapi.json."""
    html = (PAGES_DIR / "docs.html").read_bytes()
    return Response(html, media_type="text/html; charset=utf-8", headers=SECURITY_HEADERS)


@router.get("/redoc")
async def redoc() -> Response:
    """The same description is at /docs (ReDoc needs inline styles: see the module's docstring)."""
    return RedirectResponse(DOCS_PATH, status_code=307, headers=SECURITY_HEADERS)
