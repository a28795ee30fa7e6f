"""A key minted through ExecutionService.create_key never outlives the key of its caller; body times
outside the one accepted range are a 422, never an OverflowError."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import anyio
import pytest

from gpulens.config import Settings
from gpulens.domain.errors import InvalidParameter
from gpulens.domain.models import Principal
from gpulens.service.auth import Authenticator
from gpulens.service.checks import utc
from gpulens.service.executions import ExecutionService
from gpulens.storage.registry import Registry

NOW = datetime(2026, 11, 28, 12, 0, tzinfo=UTC)
PARENT_END = NOW + timedelta(hours=1)


@pytest.fixture
def service(registry: Registry) -> ExecutionService:
    return ExecutionService(registry, clock=lambda: NOW)


def caller(expires: datetime | None) -> Principal:
    return Principal(org="acme", subject="lk_paren", key_id="k1", key_expires_at=expires)


@pytest.mark.parametrize(
    ("asked", "given"),
    [
        (None, PARENT_END),
        (NOW + timedelta(days=365), PARENT_END),
        (PARENT_END, PARENT_END),
        (NOW + timedelta(minutes=5), NOW + timedelta(minutes=5)),
    ],
)
async def test_a_key_expires_no_later_than_its_callers(
    service: ExecutionService, asked: datetime | None, given: datetime
) -> None:
    key, _ = await service.create_key(caller(PARENT_END), "child", asked)
    assert key.expires_at == given


async def test_callers_without_an_expiry_get_what_they_ask(service: ExecutionService) -> None:
    key, _ = await service.create_key(caller(None), "a")
    assert key.expires_at is None
    later = NOW + timedelta(days=365)
    key, _ = await service.create_key(caller(None), "b", later)
    assert key.expires_at == later


async def test_a_past_expiry_is_still_refused_before_clamping(service: ExecutionService) -> None:
    with pytest.raises(InvalidParameter) as exc:
        await service.create_key(caller(PARENT_END), "child", NOW - timedelta(seconds=1))
    assert exc.value.name == "expires_at"


def test_a_key_principal_carries_its_keys_expiry(registry: Registry, tmp_path: Path) -> None:
    auth = Authenticator(registry, Settings(data_dir=tmp_path), clock=lambda: NOW, cache_ttl=0)
    _, expiring = registry.create_key("acme", name="e", expires_at=PARENT_END)
    _, forever = registry.create_key("acme", name="f")
    assert anyio.run(auth.authenticate, expiring, None).key_expires_at == PARENT_END
    assert anyio.run(auth.authenticate, forever, None).key_expires_at is None


@pytest.mark.parametrize(
    "value",
    [
        datetime(1, 1, 1, tzinfo=timezone(timedelta(hours=1))),  # was an OverflowError: a 500
        datetime(9999, 12, 31, 23, 59, 59, tzinfo=timezone(timedelta(hours=-1))),
        datetime(1900, 1, 1, tzinfo=UTC),
        datetime(2300, 1, 1, tzinfo=UTC),
    ],
)
def test_body_times_outside_the_range_are_invalid_parameters(value: datetime) -> None:
    with pytest.raises(InvalidParameter) as exc:
        utc("start_time", value)
    assert exc.value.name == "start_time" and "1970-01-01T00:00:00Z" in exc.value.message
