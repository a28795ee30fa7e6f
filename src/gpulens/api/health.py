"""Liveness and readiness probes."""

from __future__ import annotations

import anyio
from fastapi import APIRouter, Request
from fastapi.responses import Response
from pydantic import BaseModel, Field

from gpulens.api.deps import Ctx
from gpulens.api.errors import json_response
from gpulens.api.observability import PassClock
from gpulens.domain.errors import BackendError

router = APIRouter(tags=["Health"])


class Readiness(BaseModel):
    status: str = Field(description="ready or not ready")
    checks: dict[str, str] = Field(description="ok, or error: ... for each of registry, backend, collector")
    detail: str | None = Field(None, description="The failed checks (only when not ready)")


@router.get("/healthz", summary="Liveness: the process answers")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get(
    "/readyz",
    summary="Readiness: the registry and the metrics backend answer",
    responses={
        200: {"model": Readiness, "description": "Ready"},
        503: {"model": Readiness, "description": "Not ready: `detail` says which check failed"},
    },
)
async def readyz(ctx: Ctx, request: Request) -> Response:
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
        checks["backend"] = f"error: {exc.message}"  # names "the metrics backend", never its URL
    clock: PassClock | None = getattr(request.app.state, "pass_clock", None)
    if clock is not None:  # the embedded default: its collector must keep passing
        stale = clock.stale_for()
        checks["collector"] = "ok" if stale is None else f"error: no completed pass for {stale:.0f} s"
    ok = all(v == "ok" for v in checks.values())
    body = {"status": "ready" if ok else "not ready", "checks": checks}
    if not ok:
        body["detail"] = "; ".join(f"{k}: {v}" for k, v in checks.items() if v != "ok")
    return json_response(200 if ok else 503, body)
