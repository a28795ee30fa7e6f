"""API keys as the registry knows them: never the secret, only its hash's row."""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from datetime import datetime

KEY_MARKER = "lk_"
PREFIX_LEN = 8  # "lk_" + 5 characters: what listings show (Lyceum shows the first 8 characters)


def new_key_secret() -> str:
    """A fresh key: `lk_` + 256 random bits, URL-safe."""
    return KEY_MARKER + secrets.token_urlsafe(32)


def hash_key(plaintext: str) -> str:
    # A plain digest is enough: keys are 256-bit random, so there is nothing to brute-force.
    return hashlib.sha256(plaintext.encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class ApiKey:
    """One API key of one org; `projects` None means every project of the org."""

    key_id: str
    org: str
    name: str
    prefix: str
    is_admin: bool
    is_active: bool
    created_at: datetime
    projects: frozenset[str] | None = None
    expires_at: datetime | None = None
    last_used_at: datetime | None = None
    revoked_at: datetime | None = None

    @property
    def is_revoked(self) -> bool:
        return self.revoked_at is not None

    def refusal(self, now: datetime) -> str | None:
        """Why this key may not be used at `now`, or None when it may."""
        if self.revoked_at is not None:
            return "API key has been revoked"
        if not self.is_active:
            return "API key is inactive"
        if self.expires_at is not None and self.expires_at <= now:
            return "API key has expired"
        return None
