"""Request dependencies: the application context and the calling principal."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from gpulens.config import Settings
from gpulens.domain.errors import Forbidden, Unauthenticated
from gpulens.domain.models import Principal
from gpulens.service.auth import Authenticator
from gpulens.service.executions import ExecutionService
from gpulens.service.metrics import MetricsService
from gpulens.service.pod_metrics import PodMetricsService
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


def get_ctx(request: Request) -> AppContext:
    ctx: AppContext = request.app.state.ctx
    return ctx


# auto_error=False: we answer missing credentials ourselves, as 401 (statement 4.A.2) in each dialect.
bearer = HTTPBearer(auto_error=False, description="An API key (`lk_...`) or a JWT access token")


async def get_principal(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
    ctx: Annotated[AppContext, Depends(get_ctx)],
) -> Principal:
    if credentials is None or not credentials.credentials:
        raise Unauthenticated("Not authenticated")
    org_slug = request.headers.get("x-org-slug")
    return await ctx.authenticator.authenticate(credentials.credentials, org_slug)


async def get_admin(principal: Annotated[Principal, Depends(get_principal)]) -> Principal:
    if not principal.is_admin:
        raise Forbidden("This endpoint needs an admin key")
    return principal


Ctx = Annotated[AppContext, Depends(get_ctx)]
Caller = Annotated[Principal, Depends(get_principal)]
Admin = Annotated[Principal, Depends(get_admin)]
