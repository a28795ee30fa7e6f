"""Request dependencies: the application context and the calling principal."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.requests import HTTPConnection

from gpulens.config import Settings
from gpulens.domain.errors import Forbidden, Unauthenticated
from gpulens.domain.models import Principal
from gpulens.service.alerts.rules import AlertService
from gpulens.service.archive import AnswerCache, ArchiveService
from gpulens.service.auth import Authenticator
from gpulens.service.executions import ExecutionService
from gpulens.service.metrics import MetricsService
from gpulens.service.pod_metrics import PodMetricsService
from gpulens.service.summary_store import StoredSummaries
from gpulens.service.usage import UsageService
from gpulens.service.workloads import WorkloadService
from gpulens.storage.registry import Registry


@dataclass(slots=True)
class AppContext:
    """Everything the routes use, built once by create_app (the composition root)."""

    settings: Settings
    registry: Registry
    authenticator: Authenticator
    executions: ExecutionService
    metrics: MetricsService
    workloads: WorkloadService
    pod_metrics: PodMetricsService
    summaries: StoredSummaries  # summaries: stored for finished executions, bounded
    alerts: AlertService  # live alerts' rules, channels, snoozes, deliveries (docs/alerts.md)
    usage: UsageService  # fleet usage from the stored receipts' hourly slices (docs/usage.md)
    archives: ArchiveService | None = None  # finished executions and pods (service/archive.py)
    answers: AnswerCache | None = None  # response bodies of archived objects


async def get_ctx(request: Request) -> AppContext:
    ctx: AppContext = request.app.state.ctx
    return ctx


# auto_error=False: we answer missing credentials ourselves, as 401 in each dialect's shape
# (docs/compatibility.md, "Errors").
bearer = HTTPBearer(auto_error=False, description="An API key (`lk_...`) or a JWT access token")

# Where the caller, once known, is kept for the rest of the request (api/guard.py authenticates the
# admin routes before their bodies are read; the routes' dependencies then reuse its answer).
PRINCIPAL_SCOPE_KEY = "gpulens.principal"


async def resolve_principal(request: HTTPConnection, authenticator: Authenticator) -> Principal:
    """The caller of `request` (bearer token + `X-Org-Slug`), resolved once per request."""
    known = request.scope.get(PRINCIPAL_SCOPE_KEY)
    if isinstance(known, Principal):
        return known
    credentials = await bearer(request)
    if credentials is None or not credentials.credentials:
        raise Unauthenticated("Not authenticated")
    principal = await authenticator.authenticate(credentials.credentials, request.headers.get("x-org-slug"))
    request.scope[PRINCIPAL_SCOPE_KEY] = principal
    return principal


async def get_principal(
    request: Request,
    ctx: Annotated[AppContext, Depends(get_ctx)],
    _credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],  # documents the scheme
) -> Principal:
    return await resolve_principal(request, ctx.authenticator)


async def get_admin(principal: Annotated[Principal, Depends(get_principal)]) -> Principal:
    if not principal.is_admin:
        raise Forbidden("This endpoint needs an admin key")
    return principal


Ctx = Annotated[AppContext, Depends(get_ctx)]
Caller = Annotated[Principal, Depends(get_principal)]
Admin = Annotated[Principal, Depends(get_admin)]
