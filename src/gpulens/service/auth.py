"""Who is calling: an API key (`lk_...`, looked up by its hash) or a JWT (HS256/RS256) becomes a Principal.

This runs on every request, so a key found in the registry is cached for a few seconds (keyed by
its hash; a revoke or toggle through the same registry empties it at once) and `last_used_at` is
written at most once per `touch_interval` per key and process.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import anyio
import jwt
from cryptography.hazmat.primitives.asymmetric.rsa import RSAPublicKey
from cryptography.hazmat.primitives.serialization import load_pem_public_key

from gpulens.config import Settings
from gpulens.domain.errors import Forbidden, Unauthenticated
from gpulens.domain.keys import KEY_MARKER, ApiKey, hash_key
from gpulens.domain.models import ORG_SLUG_RE, PROJECT_RE, Principal
from gpulens.storage.registry import Registry

log = logging.getLogger("gpulens.auth")

_KEY_SHAPE = re.compile(r"lk_[A-Za-z0-9_-]{8,256}")
_ORG = re.compile(ORG_SLUG_RE)
_PROJECT = re.compile(PROJECT_RE)
_CACHE_MAX = 10_000


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
        cache_ttl: float = 5.0,
        touch_interval: float = 60.0,
        jwt_leeway: float = 10.0,
    ) -> None:
        self.registry = registry
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
        now = self.clock()
        refusal = key.refusal(now)
        if refusal:
            raise Unauthenticated(refusal)
        await self._touch(key, now)
        return Principal(
            org=key.org, subject=key.prefix, is_admin=key.is_admin, projects=key.projects, key_id=key.key_id
        )

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


def _slugs(value: object, claim: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) and _ORG.fullmatch(v) for v in value):
        raise Unauthenticated(f"Invalid token: claim {claim!r} must hold organization slugs")
    return list(value)


def _projects(value: object) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) and _PROJECT.fullmatch(v) for v in value):
        raise Unauthenticated("Invalid token: claim 'projects' must be a list of project names")
    return list(value)
