"""What the registry-backed services share: body-field checks, the tenant rule, and running a blocking
registry call off the event loop."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from functools import partial
from typing import Any, TypeVar

import anyio

from gpulens.domain import limits
from gpulens.domain.errors import Forbidden, InvalidParameter, NotFound
from gpulens.domain.models import GPU_ID_RE, GPU_ID_TEXT, Principal
from gpulens.domain.timeparse import TIMESTAMP_RANGE, checked_datetime

T = TypeVar("T")

ADMIN_ONLY = "This endpoint needs an admin key"


def utcnow() -> datetime:
    return datetime.now(UTC)


def bad(name: str, raw: object, message: str) -> InvalidParameter:
    return InvalidParameter("body", name, raw, message)


def utc(name: str, value: object) -> datetime | None:
    """A body's date-time in UTC (no zone means UTC), within the one accepted range of timestamps
    (domain/timeparse); None stays None."""
    if value is None:
        return None
    if not isinstance(value, datetime):
        raise bad(name, value, f"{name} must be an RFC 3339 date-time")
    try:
        return checked_datetime(value)
    except ValueError:
        raise bad(name, value.isoformat(), f"{name} must lie {TIMESTAMP_RANGE}") from None


def match(name: str, value: object, pattern: re.Pattern[str], what: str) -> str:
    """`value` if it is a string the pattern matches whole, else a 422 naming the field."""
    if not isinstance(value, str) or not pattern.fullmatch(value):
        raise bad(name, value, f"{name} must be {what}")
    return value


def require_admin(principal: Principal) -> None:
    if not principal.is_admin:
        raise Forbidden(ADMIN_ONLY)


def may_see(principal: Principal, org: str, project: str | None) -> bool:
    """The tenant rule: admins see everything; others their org's objects of the projects they may see."""
    return principal.is_admin or (org == principal.org and principal.may_see_project(project))


def check_visible(
    principal: Principal, org: str, project: str | None, not_found: str, forbidden: str
) -> None:
    """`may_see`, or the error: another org's object does not exist (NotFound); another project of
    the caller's org is Forbidden."""
    if may_see(principal, org, project):
        return
    if org != principal.org:
        raise NotFound(not_found)
    raise Forbidden(forbidden)


async def run_sync(func: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
    """A blocking (registry) call in a worker thread."""
    return await anyio.to_thread.run_sync(partial(func, *args, **kwargs))


_GPU = re.compile(GPU_ID_RE)


def gpu_list(name: str, value: object) -> tuple[str, ...]:
    """A list of GPU indices or GPU/MIG UUIDs (repeats dropped, order kept); None is no GPUs. An index
    is kept as the exporters write it ("01" is GPU 1, whose series say `gpu="1"`)."""
    if value is None:
        return ()
    if isinstance(value, str) or not isinstance(value, Sequence):
        raise bad(name, value, f"{name} must be a list of GPU indices or GPU/MIG UUIDs")
    if len(value) > limits.GPUS_MAX:
        raise bad(name, value, f"at most {limits.GPUS_MAX} GPUs")
    for gpu in value:
        match(name, gpu, _GPU, GPU_ID_TEXT)
    return tuple(dict.fromkeys(str(int(gpu)) if gpu.isdigit() else gpu for gpu in value))
