"""Who is calling: an API key (`lk_...`, looked up by its hash) or a JWT (HS256/RS256) becomes a Principal.

This runs on every request, so a key found in the registry is cached for KEY_CACHE_TTL_S seconds
(keyed by its hash; a revoke or toggle through the same registry empties it at once; other replicas
on the same database see it once their entry expires, docs/operations.md) and `last_used_at` is
written at most once per `touch_interval` per key and process.

`TokenIssuer` trades an API key for short-lived HS256 access tokens (Run:ai's `POST /api/v1/token`).
An issued token names its key: it stops working as soon as the key is revoked, disabled or expired,
and it carries exactly the key's org, projects and admin flag.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import secrets
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import anyio
import jwt
from cryptography.hazmat.primitives.asymmetric.rsa import RSAPublicKey
from cryptography.hazmat.primitives.serialization import load_pem_public_key

from gpulens.config import Settings
from gpulens.domain.errors import Forbidden, InvalidRequest, Unauthenticated
from gpulens.domain.keys import KEY_MARKER, ApiKey, hash_key
from gpulens.domain.models import ORG_SLUG_RE, PROJECT_RE, Principal
from gpulens.storage.registry import Registry

log = logging.getLogger("gpulens.auth")

_KEY_SHAPE = re.compile(r"lk_[A-Za-z0-9_-]{8,256}")
_ORG = re.compile(ORG_SLUG_RE)
_PROJECT = re.compile(PROJECT_RE)
_CACHE_MAX = 10_000
# How long another replica may still accept a key revoked or disabled through this one: short, so
# a revocation holds everywhere within 2 s; it costs one indexed look-up per key every 2 s.
KEY_CACHE_TTL_S = 2.0


def _utcnow() -> datetime:
    return datetime.now(UTC)


class Authenticator:
    """Turns a bearer token (+ the `X-Org-Slug` header) into a Principal, or raises 401/403 errors."""

    def __init__(
        self,
        registry: Registry,
        settings: Settings,
        *,
        clock: Callable[[], datetime] = _utcnow,
        cache_ttl: float = KEY_CACHE_TTL_S,
        touch_interval: float = 60.0,
        jwt_leeway: float = 10.0,
        issuer: TokenIssuer | None = None,
    ) -> None:
        self.registry = registry
        self.issuer = issuer
        self.clock = clock
        self.cache_ttl = cache_ttl
        self.touch_interval = touch_interval
        self.jwt_leeway = jwt_leeway
        self.audience = settings.jwt_audience
        self._hs_secret = settings.jwt_secret.get_secret_value() if settings.jwt_secret else None
        pem = settings.jwt_public_key_pem()
        self._rs_key: RSAPublicKey | None = None
        if pem:
            loaded = load_pem_public_key(pem.encode())
            if not isinstance(loaded, RSAPublicKey):
                raise ValueError("jwt_public_key must be an RSA public key (RS256)")
            self._rs_key = loaded
        self._lock = threading.Lock()
        self._cache: dict[str, tuple[float, ApiKey]] = {}  # key hash -> (monotonic deadline, key)
        self._touched: dict[str, float] = {}  # key id -> monotonic time of our last touch
        registry.add_key_listener(self.forget)

    async def authenticate(self, token: str, org_slug: str | None) -> Principal:
        token = token.strip()
        if token.startswith(KEY_MARKER):
            return await self._from_key(token)  # the key's org; X-Org-Slug is ignored
        if self.issuer is not None and is_issued_token(token):
            return await self._from_issued(token)  # the key's org too
        return self._from_jwt(token, (org_slug or "").strip() or None)

    def forget(self, key_id: str | None = None) -> None:
        """Drop cached keys (one, or all): called by the registry after a revoke or toggle."""
        with self._lock:
            if key_id is None:
                self._cache.clear()
            else:
                for digest in [d for d, (_, k) in self._cache.items() if k.key_id == key_id]:
                    del self._cache[digest]

    # ------------------------------------------------------------------ API keys

    async def _from_key(self, token: str) -> Principal:
        if not _KEY_SHAPE.fullmatch(token):
            raise Unauthenticated("Invalid API key")
        digest = hash_key(token)
        key = self._cached(digest)
        if key is None:
            key = await anyio.to_thread.run_sync(self.registry.find_key, digest)
            if key is None:
                raise Unauthenticated("Invalid API key")
            self._remember(digest, key)
        return await self._admit(key)

    async def _from_issued(self, token: str) -> Principal:
        assert self.issuer is not None
        claims = self.issuer.verify(token, kind=ACCESS)
        return await self._admit(await self._key_by_id(str(claims["key_id"])))

    async def _admit(self, key: ApiKey) -> Principal:
        """The key's principal, unless it is revoked, disabled or expired; its use is recorded."""
        now = self.clock()
        refusal = key.refusal(now)
        if refusal:
            raise Unauthenticated(refusal)
        await self._touch(key, now)
        return Principal(
            org=key.org,
            subject=key.prefix,
            is_admin=key.is_admin,
            projects=key.projects,
            key_id=key.key_id,
            key_expires_at=key.expires_at,
        )

    async def _key_by_id(self, key_id: str) -> ApiKey:
        slot = "id:" + key_id  # shares the cache (and its invalidation) with the hash lookups
        key = self._cached(slot)
        if key is None:
            key = await anyio.to_thread.run_sync(self.registry.get_key, key_id)
            if key is None:
                raise Unauthenticated("Invalid token: its API key no longer exists")
            self._remember(slot, key)
        return key

    def _cached(self, digest: str) -> ApiKey | None:
        with self._lock:
            hit = self._cache.get(digest)
        if hit is None or hit[0] < time.monotonic():
            return None
        return hit[1]

    def _remember(self, digest: str, key: ApiKey) -> None:
        if self.cache_ttl <= 0:
            return
        with self._lock:
            if len(self._cache) >= _CACHE_MAX:
                self._cache.clear()
            self._cache[digest] = (time.monotonic() + self.cache_ttl, key)

    async def _touch(self, key: ApiKey, now: datetime) -> None:
        if key.last_used_at is not None and now - key.last_used_at < timedelta(seconds=self.touch_interval):
            return
        mono = time.monotonic()
        with self._lock:
            last = self._touched.get(key.key_id)
            if last is not None and mono - last < self.touch_interval:
                return
            if len(self._touched) >= _CACHE_MAX:
                self._touched.clear()
            self._touched[key.key_id] = mono
        try:
            await anyio.to_thread.run_sync(self.registry.touch_key, key.key_id, now)
        except Exception:  # bookkeeping only: a busy database must not refuse a valid key
            log.warning("could not record the use of API key %s", key.prefix, exc_info=True)

    # ------------------------------------------------------------------ JWTs

    def _from_jwt(self, token: str, org_slug: str | None) -> Principal:
        claims = self._decode(token)
        subject = claims.get("sub")
        if not isinstance(subject, str) or not subject:
            raise Unauthenticated("Invalid token: no subject")
        orgs = _slugs(claims.get("orgs", []), "orgs")
        single = claims.get("org")
        if single is not None:
            (single,) = _slugs([single], "org")
        is_admin = claims.get("admin") is True
        projects_claim = claims.get("projects")
        projects = None if projects_claim is None else frozenset(_projects(projects_claim))

        if org_slug is not None:
            if not (is_admin and _ORG.fullmatch(org_slug)) and org_slug not in orgs and org_slug != single:
                shown = org_slug if _ORG.fullmatch(org_slug) else "(invalid slug)"
                raise Forbidden(f"Not a member of organization {shown}")
            org = org_slug
        elif single is not None:
            org = single
        elif orgs:
            org = orgs[0]
        else:
            raise Forbidden("The token names no organization")
        return Principal(org=org, subject=subject, is_admin=is_admin, projects=projects)

    def _decode(self, token: str) -> dict[str, Any]:
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError:
            raise Unauthenticated("Invalid token") from None
        alg = header.get("alg")
        key: str | RSAPublicKey
        if alg == "HS256" and self._hs_secret is not None:
            key = self._hs_secret
        elif alg == "RS256" and self._rs_key is not None:
            key = self._rs_key
        elif self._hs_secret is None and self._rs_key is None:
            raise Unauthenticated("Invalid token: JWT authentication is not configured; use an API key")
        else:
            raise Unauthenticated("Invalid token: unsupported signing algorithm")
        try:
            claims: dict[str, Any] = jwt.decode(
                token,
                key,
                algorithms=[alg],  # exactly the one the key is for: no algorithm confusion
                audience=self.audience,
                options={"require": ["exp", "sub"], "verify_aud": self.audience is not None},
                leeway=self.jwt_leeway,
            )
        except jwt.ExpiredSignatureError:
            raise Unauthenticated("Token has expired") from None
        except jwt.PyJWTError as exc:
            raise Unauthenticated(f"Invalid token: {exc}") from None
        return claims


# ---------------------------------------------------------------------- issued tokens

ISSUER = "gpulens"
ISSUED_KID = "gpulens-hs256"  # the header `kid` that routes a token to TokenIssuer.verify
SECRET_FILE = "token.secret"  # noqa: S105 - a file name, not a secret
ACCESS = "access"
REFRESH = "refresh"
REFRESH_TTL_S = 7 * 86_400


def is_issued_token(token: str) -> bool:
    """Whether the (unverified) header says gpulens issued this token."""
    try:
        header = jwt.get_unverified_header(token)
    except jwt.PyJWTError:
        return False
    return header.get("kid") == ISSUED_KID and header.get("alg") == "HS256"


@dataclass(frozen=True, slots=True)
class IssuedToken:
    access_token: str
    refresh_token: str
    expires_in: int  # seconds


def load_or_create_secret(path: Path) -> bytes:
    """The signing secret in `path` (64 hex characters), created once with mode 0600.

    Creation is atomic (a hard link of a finished temporary file), so two processes starting at once
    agree on one secret.
    """
    try:
        return _read_secret(path)
    except FileNotFoundError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(secrets.token_hex(32) + "\n")
        with contextlib.suppress(FileExistsError):  # another process won: use its secret
            os.link(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return _read_secret(path)


def _read_secret(path: Path) -> bytes:
    text = path.read_text().strip()
    if len(text) < 64:
        raise ValueError(f"{path}: the token signing secret must hold at least 64 hex characters")
    return text.encode()


class TokenIssuer:
    """Signs and checks gpulens' own HS256 access and refresh tokens for API keys.

    The secret is `settings.jwt_secret` when set (so tokens also verify wherever that secret is
    configured), else a random one kept in `<data_dir>/token.secret`, made on first use. Several
    gpulens processes behind one registry must share it: set GPULENS_JWT_SECRET or one data_dir.
    """

    def __init__(
        self,
        registry: Registry,
        settings: Settings,
        *,
        clock: Callable[[], datetime] = _utcnow,
        refresh_ttl_s: int = REFRESH_TTL_S,
    ) -> None:
        self.registry = registry
        self.clock = clock
        self.ttl_s = settings.runai_token_ttl
        self.refresh_ttl_s = refresh_ttl_s
        self.audience = settings.jwt_audience
        self._configured = settings.jwt_secret.get_secret_value().encode() if settings.jwt_secret else None
        self._path = settings.data_dir / SECRET_FILE
        self._secret: bytes | None = self._configured
        self._lock = threading.Lock()

    def _key(self, *, create: bool) -> bytes | None:
        if self._secret is not None:
            return self._secret
        with self._lock:
            if self._secret is None:
                if create:
                    self._secret = load_or_create_secret(self._path)
                elif self._path.exists():
                    self._secret = _read_secret(self._path)
            return self._secret

    # -- issuing ---------------------------------------------------------------------------------

    def issue(self, key: ApiKey) -> IssuedToken:
        """An access/refresh token pair for an (already checked) API key."""
        secret = self._key(create=True)
        assert secret is not None
        now = int(self.clock().timestamp())
        base: dict[str, Any] = {"iss": ISSUER, "sub": key.prefix, "iat": now, "key_id": key.key_id}
        if self.audience is not None:
            base["aud"] = self.audience
        access = {**base, "typ": ACCESS, "exp": now + self.ttl_s, "orgs": [key.org]}
        if key.projects is not None:
            access["projects"] = sorted(key.projects)
        if key.is_admin:
            access["admin"] = True
        refresh = {**base, "typ": REFRESH, "exp": now + self.refresh_ttl_s, "jti": uuid.uuid4().hex}
        headers = {"kid": ISSUED_KID}
        return IssuedToken(
            access_token=jwt.encode(access, secret, algorithm="HS256", headers=headers),
            refresh_token=jwt.encode(refresh, secret, algorithm="HS256", headers=headers),
            expires_in=self.ttl_s,
        )

    async def grant(
        self,
        grant_type: str | None,
        *,
        client_id: str | None = None,
        client_secret: str | None = None,
        refresh_token: str | None = None,
    ) -> IssuedToken:
        """Run:ai's token grants: `client_credentials`/`app_token` (id = the key's 8-character prefix,
        its name or its id; secret = the `lk_` key) and `refresh_token`."""
        if grant_type in ("client_credentials", "app_token"):
            if not client_id or not client_secret:
                raise InvalidRequest("Required parameter is missing: the client id and secret")
            key = await self._key_for_secret(client_id, client_secret)
        elif grant_type == "refresh_token":
            if not refresh_token:
                raise InvalidRequest("Required parameter is missing: refreshToken")
            claims = self.verify(refresh_token, kind=REFRESH)
            key_id = str(claims["key_id"])
            found = await anyio.to_thread.run_sync(self.registry.get_key, key_id)
            if found is None:
                raise Unauthenticated("Invalid refresh token: its API key no longer exists")
            key = found
        elif not grant_type:
            raise InvalidRequest("Required parameter is missing: grantType")
        else:
            raise InvalidRequest("Unsupported grantType: use client_credentials, app_token or refresh_token")
        refusal = key.refusal(self.clock())
        if refusal:
            raise Unauthenticated(refusal)
        return self.issue(key)

    async def _key_for_secret(self, client_id: str, client_secret: str) -> ApiKey:
        secret = client_secret.strip()
        if not _KEY_SHAPE.fullmatch(secret):
            raise Unauthenticated("Invalid client credentials")
        key = await anyio.to_thread.run_sync(self.registry.find_key, hash_key(secret))
        if key is None or client_id.strip() not in (key.prefix, key.name, key.key_id):
            raise Unauthenticated("Invalid client credentials")
        return key

    # -- checking --------------------------------------------------------------------------------

    def verify(self, token: str, *, kind: str = ACCESS) -> dict[str, Any]:
        """The claims of a token this issuer signed, of the given kind; Unauthenticated otherwise."""
        secret = self._key(create=False)
        if secret is None:
            raise Unauthenticated("Invalid token: not issued by this server")
        try:
            claims: dict[str, Any] = jwt.decode(
                token,
                secret,
                algorithms=["HS256"],
                audience=self.audience,
                issuer=ISSUER,
                options={
                    "require": ["exp", "iat", "sub", "iss"],
                    "verify_aud": self.audience is not None,
                },
                leeway=10,
            )
        except jwt.ExpiredSignatureError:
            raise Unauthenticated("Token has expired") from None
        except jwt.PyJWTError as exc:
            raise Unauthenticated(f"Invalid token: {exc}") from None
        if claims.get("typ") != kind or not isinstance(claims.get("key_id"), str):
            raise Unauthenticated(f"Invalid token: not a gpulens {kind} token")
        return claims


def _slugs(value: object, claim: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) and _ORG.fullmatch(v) for v in value):
        raise Unauthenticated(f"Invalid token: claim {claim!r} must hold organization slugs")
    return list(value)


def _projects(value: object) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) and _PROJECT.fullmatch(v) for v in value):
        raise Unauthenticated("Invalid token: claim 'projects' must be a list of project names")
    return list(value)
