"""`POST /api/v1/token`: trade a gpulens API key for a short-lived Run:ai-style access token (tag Tokens).

Grants: `client_credentials` (clientID, clientSecret) and the deprecated `app_token` (appID,
appSecret) — the secret is an `lk_` key, the id its 8-character prefix, its name or its id — and
`refresh_token` (refreshToken). Key spellings are matched without regard to case or underscores
(`AppId`/`AppSecret`, `client_id`...). The access token is an HS256 JWT (`iss` "gpulens", `kid`
"gpulens-hs256") that every bearer-authenticated route accepts for as long as its key is usable.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field, JsonValue, model_validator

from gpulens.api.deps import Ctx
from gpulens.api.responses import runai_errors
from gpulens.domain import limits
from gpulens.domain.errors import InvalidRequest

router = APIRouter(tags=["Tokens"])

_FIELDS = ("grantType", "clientID", "clientSecret", "appID", "appSecret", "refreshToken")
_CANONICAL = {name.lower(): name for name in _FIELDS}


def _grant(grant: str, *fields: str) -> JsonValue:
    return {
        "required": ["grantType", *fields],
        "properties": {
            "grantType": {"const": grant},
            **{f: {"type": "string", "minLength": 1} for f in fields},
        },
    }


# What the route answers other than 400: one of the three grants with its fields (the spellings the
# model also takes, `AppId`, `client_id`..., are not listed).
GRANTS: list[JsonValue] = [
    _grant("client_credentials", "clientID", "clientSecret"),
    _grant("app_token", "appID", "appSecret"),
    _grant("refresh_token", "refreshToken"),
]


class TokenRequest(BaseModel):
    model_config = ConfigDict(extra="ignore", json_schema_extra={"oneOf": GRANTS})

    grantType: str | None = Field(
        None,
        max_length=limits.GRANT_TYPE_MAX,
        description="client_credentials, app_token (deprecated) or refresh_token",
    )
    clientID: str | None = Field(
        None, max_length=limits.CREDENTIAL_MAX, description="The key's prefix (lk_xxxxx), name or id"
    )
    clientSecret: str | None = Field(
        None, max_length=limits.CREDENTIAL_MAX, description="The API key (lk_...)"
    )
    appID: str | None = Field(
        None, max_length=limits.CREDENTIAL_MAX, description="As clientID (deprecated grant)"
    )
    appSecret: str | None = Field(
        None, max_length=limits.CREDENTIAL_MAX, description="As clientSecret (deprecated grant)"
    )
    refreshToken: str | None = Field(None, max_length=limits.REFRESH_TOKEN_MAX)

    @model_validator(mode="before")
    @classmethod
    def _spellings(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        out: dict[str, Any] = {}
        for key, value in data.items():
            name = _CANONICAL.get(str(key).replace("_", "").replace("-", "").lower())
            if name is not None and name not in out:
                out[name] = value
        return out


class TokenResponse(BaseModel):
    accessToken: str
    refreshToken: str
    expiresIn: int = Field(description="Token lifetime in seconds")


@router.post(
    "/api/v1/token",
    operation_id="grant_token",
    summary="Create an access token v1",
    description="Create tokens using the `grantType` parameter.",
    responses={200: {"description": "Executed successfully."}, **runai_errors(400, 401, 413, 500, 503)},
)
async def grant_token(ctx: Ctx, body: TokenRequest) -> TokenResponse:
    issuer = ctx.authenticator.issuer
    if issuer is None:
        raise InvalidRequest("This server does not issue tokens")
    issued = await issuer.grant(
        body.grantType,
        client_id=body.clientID or body.appID,
        client_secret=body.clientSecret or body.appSecret,
        refresh_token=body.refreshToken,
    )
    return TokenResponse(
        accessToken=issued.access_token, refreshToken=issued.refresh_token, expiresIn=issued.expires_in
    )
