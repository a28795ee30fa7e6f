"""Lyceum API key routes (`/api/v2/external/auth/api-keys/`): the caller's org's keys only."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path
from pydantic import BaseModel, Field

from gpulens.api.deps import Caller, Ctx
from gpulens.api.responses import AUTH, BODY, Timestamp, lyceum_errors
from gpulens.domain import limits
from gpulens.domain.keys import ApiKey
from gpulens.domain.timeparse import format_optional, format_rfc3339

router = APIRouter(prefix="/api/v2/external/auth/api-keys", tags=["API Keys"], responses=lyceum_errors(*AUTH))

KeyId = Annotated[str, Path(title="Api Key Id", max_length=limits.API_KEY_ID_MAX)]


class ApiKeyItem(BaseModel):
    id: str
    key_name: str
    key_prefix: str
    is_active: bool
    last_used_at: str | None
    expires_at: str | None
    created_at: str


class ApiKeyCreate(BaseModel):
    key_name: str = Field(
        min_length=1,
        max_length=limits.KEY_NAME_MAX,
        # it is stripped of whitespace (str.strip: ECMA's \s and also U+001C-U+001F, U+0085) first
        json_schema_extra={"pattern": r"[^\s\u001c-\u001f\u0085]"},
    )
    expires_at: Timestamp | None = Field(
        None,
        description="RFC 3339; the key stops working then. Never later than the expiry of the API key "
        "that creates it: a later expiry, or none, is clamped to that one",
    )


class ApiKeyCreated(BaseModel):
    id: str
    key_name: str
    api_key: str = Field(description="The full key: shown this once, stored only as a hash")
    key_prefix: str
    expires_at: str | None
    created_at: str


class ApiKeyRevoked(BaseModel):
    id: str
    message: str


class ApiKeyValidation(BaseModel):
    valid: bool
    org: str
    subject: str
    is_admin: bool
    key_prefix: str | None
    expires_at: str | None


def key_item(key: ApiKey) -> ApiKeyItem:
    return ApiKeyItem(
        id=key.key_id,
        key_name=key.name,
        key_prefix=key.prefix,
        is_active=key.is_active,
        last_used_at=format_optional(key.last_used_at),
        expires_at=format_optional(key.expires_at),
        created_at=format_rfc3339(key.created_at),
    )


@router.get("/", summary="List API keys")
async def list_keys(ctx: Ctx, caller: Caller) -> list[ApiKeyItem]:
    return [key_item(k) for k in await ctx.executions.list_keys(caller)]


# 200, not 201: the official CLI (`lyceum auth keys create`) accepts only 200 from this route.
@router.post("/", summary="Create API key", responses=lyceum_errors(*BODY))
async def create_key(ctx: Ctx, caller: Caller, body: ApiKeyCreate) -> ApiKeyCreated:
    key, plaintext = await ctx.executions.create_key(caller, body.key_name, body.expires_at)
    return ApiKeyCreated(
        id=key.key_id,
        key_name=key.name,
        api_key=plaintext,
        key_prefix=key.prefix,
        expires_at=format_optional(key.expires_at),
        created_at=format_rfc3339(key.created_at),
    )


@router.post("/validate", summary="Validate the presented API key or token")
async def validate_key(ctx: Ctx, caller: Caller) -> ApiKeyValidation:
    # Reaching here means the bearer authenticated; an invalid one was answered 401 already.
    key = await ctx.executions.current_key(caller)
    return ApiKeyValidation(
        valid=True,
        org=caller.org,
        subject=caller.subject,
        is_admin=caller.is_admin,
        key_prefix=None if key is None else key.prefix,
        expires_at=None if key is None else format_optional(key.expires_at),
    )


@router.delete("/{api_key_id}", summary="Revoke API key", responses=lyceum_errors(404))
async def revoke_key(ctx: Ctx, caller: Caller, api_key_id: KeyId) -> ApiKeyRevoked:
    key = await ctx.executions.revoke_key(caller, api_key_id)
    return ApiKeyRevoked(id=key.key_id, message="API key revoked")


@router.patch("/{api_key_id}/toggle", summary="Toggle API key active/inactive", responses=lyceum_errors(404))
async def toggle_key(ctx: Ctx, caller: Caller, api_key_id: KeyId) -> ApiKeyItem:
    return key_item(await ctx.executions.toggle_key(caller, api_key_id))
