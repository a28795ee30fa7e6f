"""Liveness and readiness probes."""

from __future__ import annotations

import anyio
from fastapi import APIRouter
from fastapi.responses import Response

from gpulens.api.deps import Ctx
from gpulens.api.errors import json_response
from gpulens.domain.errors import BackendError

router = APIRouter(tags=["Health"])


@router.get("/healthz", summary="Liveness: the process answers")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/readyz", summary="Readiness: the registry and the metrics backend answer")
async def readyz(ctx: Ctx) -> Response:
    checks: dict[str, str] = {}
    try:
        await anyio.to_thread.run_sync(ctx.registry.ping)
        checks["registry"] = "ok"
    except Exception as exc:  # any driver error means not ready
        checks["registry"] = f"error: {type(exc).__name__}"
    try:
        await ctx.metrics.backend.ready()
        checks["backend"] = "ok"
    except BackendError as exc:
        checks["backend"] = f"error: {exc.message}"
    ok = all(v == "ok" for v in checks.values())
    body = {"status": "ready" if ok else "not ready", "checks": checks}
    if not ok:
        body["detail"] = "; ".join(f"{k}: {v}" for k, v in checks.items() if v != "ok")
    return json_response(200 if ok else 503, body)
