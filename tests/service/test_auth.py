"""Authenticator: API keys (hash lookup, revoke/inactive/expiry, cache, last use) and JWTs (HS256, RS256)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import anyio
import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from gpulens.config import Settings
from gpulens.domain.errors import Forbidden, Unauthenticated
from gpulens.domain.models import Principal
from gpulens.service.auth import Authenticator
from gpulens.storage.registry import Registry

SECRET = "s" * 40
AUDIENCE = "gpulens-test"


@pytest.fixture(scope="module")
def rsa_pair() -> tuple[str, str]:
    private = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    private_pem = private.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()
    public_pem = (
        private.public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        .decode()
    )
    return private_pem, public_pem


@pytest.fixture
def registry(tmp_path: Path) -> Iterator[Registry]:
    reg = Registry.from_url(f"sqlite:///{tmp_path / 'r.db'}")
    reg.migrate()
    yield reg
    reg.dispose()


def settings(tmp_path: Path, **kw: Any) -> Settings:
    return Settings(data_dir=tmp_path, **kw)


class Clock:
    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


def auth(authenticator: Authenticator, token: str, org: str | None = None) -> Principal:
    return anyio.run(authenticator.authenticate, token, org)


def hs256(claims: dict[str, Any], secret: str = SECRET) -> str:
    return jwt.encode(claims, secret, algorithm="HS256")


def claims(**kw: Any) -> dict[str, Any]:
    # a day ahead: the parameters are made at collection, minutes before a long suite runs the test
    base: dict[str, Any] = {"sub": "user-1", "orgs": ["acme", "beta"], "exp": int(time.time()) + 86_400}
    base.update(kw)
    return {k: v for k, v in base.items() if v is not None}


# ---------------------------------------------------------------- API keys


def test_api_key_gives_its_org_and_ignores_the_header(registry: Registry, tmp_path: Path) -> None:
    key, plaintext = registry.create_key("acme", name="k", projects=["vision"])
    a = Authenticator(registry, settings(tmp_path))
    principal = auth(a, plaintext, "beta")
    assert principal == Principal(
        org="acme", subject=key.prefix, is_admin=False, projects=frozenset({"vision"}), key_id=key.key_id
    )


def test_admin_key(registry: Registry, tmp_path: Path) -> None:
    _, plaintext = registry.create_key("platform", name="svc", is_admin=True)
    principal = auth(Authenticator(registry, settings(tmp_path)), plaintext)
    assert principal.is_admin
    assert principal.org == "platform"
    assert principal.projects is None


@pytest.mark.parametrize(
    "token", ["lk_", "lk_short", "lk_" + "x" * 43, "lk_has spaces in it!", "lk_" + "y" * 300]
)
def test_unknown_or_malformed_keys_are_401(registry: Registry, tmp_path: Path, token: str) -> None:
    with pytest.raises(Unauthenticated, match="Invalid API key"):
        auth(Authenticator(registry, settings(tmp_path)), token)


def test_revoked_inactive_and_expired_keys_are_401(registry: Registry, tmp_path: Path) -> None:
    clock = Clock(datetime(2026, 11, 28, 10, 0, tzinfo=UTC))
    a = Authenticator(registry, settings(tmp_path), clock=clock, cache_ttl=0)
    revoked, revoked_pt = registry.create_key("acme", name="r")
    inactive, inactive_pt = registry.create_key("acme", name="i")
    _, expiring_pt = registry.create_key("acme", name="e", expires_at=clock.now + timedelta(hours=1))
    registry.revoke_key(revoked.key_id)
    registry.set_key_active(inactive.key_id, False)

    with pytest.raises(Unauthenticated, match="revoked"):
        auth(a, revoked_pt)
    with pytest.raises(Unauthenticated, match="inactive"):
        auth(a, inactive_pt)
    assert auth(a, expiring_pt).org == "acme"
    clock.now += timedelta(hours=1)
    with pytest.raises(Unauthenticated, match="expired"):
        auth(a, expiring_pt)


def test_cache_saves_lookups_and_forgets_revoked_and_toggled_keys(
    registry: Registry, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    key, plaintext = registry.create_key("acme", name="k")
    a = Authenticator(registry, settings(tmp_path), cache_ttl=60)
    lookups: list[str] = []
    real_find = registry.find_key

    def counting_find(digest: str) -> Any:
        lookups.append(digest)
        return real_find(digest)

    monkeypatch.setattr(registry, "find_key", counting_find)
    for _ in range(5):
        auth(a, plaintext)
    assert len(lookups) == 1

    registry.set_key_active(key.key_id, False)  # through the same registry: the cache forgets at once
    with pytest.raises(Unauthenticated, match="inactive"):
        auth(a, plaintext)
    registry.set_key_active(key.key_id, True)
    assert auth(a, plaintext).org == "acme"
    registry.revoke_key(key.key_id)
    with pytest.raises(Unauthenticated, match="revoked"):
        auth(a, plaintext)


def test_last_used_is_written_at_most_once_a_minute(
    registry: Registry, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    key, plaintext = registry.create_key("acme", name="k")
    clock = Clock(datetime(2026, 11, 28, 10, 0, tzinfo=UTC))
    a = Authenticator(registry, settings(tmp_path), clock=clock, cache_ttl=0, touch_interval=0.2)
    touches: list[datetime] = []
    real_touch = registry.touch_key

    def counting_touch(key_id: str, when: datetime) -> None:
        touches.append(when)
        real_touch(key_id, when)

    monkeypatch.setattr(registry, "touch_key", counting_touch)
    auth(a, plaintext)
    stored = registry.get_key(key.key_id)
    assert stored is not None
    assert stored.last_used_at == clock.now
    auth(a, plaintext)
    clock.now += timedelta(seconds=1)  # the stored last use is now old enough, but this process touched it
    auth(a, plaintext)
    assert len(touches) == 1
    time.sleep(0.25)
    auth(a, plaintext)
    assert touches == [clock.now - timedelta(seconds=1), clock.now]


def test_a_failing_touch_does_not_refuse_the_key(
    registry: Registry, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    _, plaintext = registry.create_key("acme", name="k")

    def broken(key_id: str, when: datetime) -> None:
        raise RuntimeError("database is locked")

    monkeypatch.setattr(registry, "touch_key", broken)
    assert auth(Authenticator(registry, settings(tmp_path)), plaintext).org == "acme"
    assert "could not record" in caplog.text


# ---------------------------------------------------------------- JWT HS256


@pytest.fixture
def hs(registry: Registry, tmp_path: Path) -> Authenticator:
    return Authenticator(registry, settings(tmp_path, jwt_secret=SECRET))


def test_jwt_org_resolution(hs: Authenticator) -> None:
    assert auth(hs, hs256(claims())) == Principal(org="acme", subject="user-1")
    assert auth(hs, hs256(claims(org="beta"))).org == "beta"
    assert auth(hs, hs256(claims(orgs=None, org="solo"))).org == "solo"
    assert auth(hs, hs256(claims()), "beta").org == "beta"
    assert auth(hs, hs256(claims(orgs=None, org="solo")), "solo").org == "solo"
    assert auth(hs, hs256(claims()), "").org == "acme"  # an empty header is no header


@pytest.mark.parametrize("header", ["gamma", "ACME", "acme,beta", "../etc"])
def test_jwt_org_header_needs_membership(hs: Authenticator, header: str) -> None:
    with pytest.raises(Forbidden, match="Not a member"):
        auth(hs, hs256(claims()), header)


def test_jwt_admin_and_projects(hs: Authenticator) -> None:
    principal = auth(hs, hs256(claims(admin=True, projects=["vision"])), "gamma")
    assert principal.is_admin
    assert principal.org == "gamma"
    assert principal.projects == frozenset({"vision"})
    assert not auth(hs, hs256(claims(admin="yes"))).is_admin  # only a JSON true counts


def test_jwt_without_org_is_403(hs: Authenticator) -> None:
    with pytest.raises(Forbidden, match="no organization"):
        auth(hs, hs256(claims(orgs=None)))


@pytest.mark.parametrize(
    ("token_claims", "message"),
    [
        (claims(exp=int(time.time()) - 3600), "expired"),
        (claims(exp=None), "exp"),
        (claims(sub=None), "sub"),
        (claims(orgs="acme"), "orgs"),
        (claims(orgs=["Not A Slug"]), "orgs"),
        (claims(projects="vision"), "projects"),
        (claims(org=7), "org"),
    ],
)
def test_bad_jwts_are_401(hs: Authenticator, token_claims: dict[str, Any], message: str) -> None:
    with pytest.raises(Unauthenticated, match=message):
        auth(hs, hs256(token_claims))


def test_jwt_signature_and_shape(hs: Authenticator) -> None:
    with pytest.raises(Unauthenticated):
        auth(hs, hs256(claims(), secret="t" * 40))
    with pytest.raises(Unauthenticated):
        auth(hs, "not-a-jwt")
    unsigned = jwt.encode(claims(), None, algorithm="none")
    with pytest.raises(Unauthenticated, match="algorithm"):
        auth(hs, unsigned)


def test_jwt_audience_is_checked_when_configured(registry: Registry, tmp_path: Path) -> None:
    a = Authenticator(registry, settings(tmp_path, jwt_secret=SECRET, jwt_audience=AUDIENCE))
    assert auth(a, hs256(claims(aud=AUDIENCE))).org == "acme"
    with pytest.raises(Unauthenticated, match=r"(?i)audience"):
        auth(a, hs256(claims(aud="someone-else")))
    with pytest.raises(Unauthenticated, match="aud"):
        auth(a, hs256(claims()))
    # Without a configured audience an `aud` claim is not held against the token.
    b = Authenticator(registry, settings(tmp_path, jwt_secret=SECRET))
    assert auth(b, hs256(claims(aud="anything"))).org == "acme"


def test_jwt_not_configured(registry: Registry, tmp_path: Path) -> None:
    with pytest.raises(Unauthenticated, match="not configured"):
        auth(Authenticator(registry, settings(tmp_path)), hs256(claims()))


# ---------------------------------------------------------------- JWT RS256


def test_rs256_from_pem_text_and_file(registry: Registry, tmp_path: Path, rsa_pair: tuple[str, str]) -> None:
    private_pem, public_pem = rsa_pair
    token = jwt.encode(claims(), private_pem, algorithm="RS256")
    a = Authenticator(registry, settings(tmp_path, jwt_public_key=public_pem))
    assert auth(a, token).subject == "user-1"
    pem_file = tmp_path / "jwt.pub"
    pem_file.write_text(public_pem)
    b = Authenticator(registry, settings(tmp_path, jwt_public_key=str(pem_file)))
    assert auth(b, token, "beta").org == "beta"
    expired = jwt.encode(claims(exp=int(time.time()) - 60), private_pem, algorithm="RS256")
    with pytest.raises(Unauthenticated, match="expired"):
        auth(a, expired)


def test_rs256_refuses_other_keys_and_algorithm_confusion(
    registry: Registry, tmp_path: Path, rsa_pair: tuple[str, str]
) -> None:
    _, public_pem = rsa_pair
    a = Authenticator(registry, settings(tmp_path, jwt_public_key=public_pem))
    stranger = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    with pytest.raises(Unauthenticated, match="Signature"):
        auth(a, jwt.encode(claims(), stranger, algorithm="RS256"))
    # The classic confusion attack: HS256 "signed" with the server's public key as the HMAC secret.
    with pytest.raises(Unauthenticated, match="algorithm"):
        auth(a, forged_with_public_key(public_pem))


def test_both_algorithms_configured(registry: Registry, tmp_path: Path, rsa_pair: tuple[str, str]) -> None:
    private_pem, public_pem = rsa_pair
    a = Authenticator(registry, settings(tmp_path, jwt_secret=SECRET, jwt_public_key=public_pem))
    assert auth(a, hs256(claims())).org == "acme"
    assert auth(a, jwt.encode(claims(), private_pem, algorithm="RS256")).org == "acme"
    with pytest.raises(Unauthenticated):  # HS256 checks against the secret, never the public key
        auth(a, forged_with_public_key(public_pem))


def forged_with_public_key(public_pem: str) -> str:
    """An HS256 JWT whose HMAC key is the RSA public key's PEM text (built by hand: PyJWT refuses to)."""

    def b64(data: bytes) -> str:
        return base64.urlsafe_b64encode(data).rstrip(b"=").decode()

    header = b64(json.dumps({"alg": "HS256", "typ": "JWT"}).encode())
    body = b64(json.dumps(claims()).encode())
    signing_input = f"{header}.{body}".encode()
    signature = b64(hmac.new(public_pem.encode(), signing_input, hashlib.sha256).digest())
    return f"{header}.{body}.{signature}"


def test_non_rsa_public_key_is_refused(registry: Registry, tmp_path: Path) -> None:
    from cryptography.hazmat.primitives.asymmetric import ec

    pem = (
        ec.generate_private_key(ec.SECP256R1())
        .public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        .decode()
    )
    with pytest.raises(ValueError, match="RSA"):
        Authenticator(registry, settings(tmp_path, jwt_public_key=pem))
