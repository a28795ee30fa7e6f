"""Executions and API keys as callers see them: validation, org/project visibility, registry calls.

Visibility: an execution of another org is "not found" (its existence is not revealed); one of
the caller's org in a project the caller's key is not limited to is "forbidden". Admin principals
(the platform's service key) see and register executions of every org.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from functools import partial
from typing import Any, TypedDict, TypeVar

from gpulens.domain import limits
from gpulens.domain.errors import Conflict, Forbidden, InvalidRequest, NotFound
from gpulens.domain.keys import KEY_MARKER, PREFIX_LEN, ApiKey
from gpulens.domain.models import (
    EXECUTION_ID_RE,
    EXECUTION_ID_TEXT,
    HOSTNAME_RE,
    HOSTNAME_TEXT,
    ORG_SLUG_RE,
    ORG_SLUG_TEXT,
    PROJECT_RE,
    PROJECT_TEXT,
    USER_RE,
    USER_TEXT,
    Execution,
    ExecutionStatus,
    Principal,
)
from gpulens.domain.timeparse import format_rfc3339
from gpulens.service.cache import RECENT_READ_TTL_S, TtlCache
from gpulens.service.checks import (
    ADMIN_ONLY,
    bad,
    check_visible,
    gpu_list,
    match,
    require_admin,
    run_sync,
    utc,
    utcnow,
)
from gpulens.storage.registry import ExecutionMatch, Registry

__all__ = [
    "ACTIVE",
    "ExecutionFields",
    "ExecutionPage",
    "ExecutionService",
]


T = TypeVar("T")

ACTIVE = (ExecutionStatus.PENDING, ExecutionStatus.STARTING, ExecutionStatus.RUNNING)
_TEXT_LIMITS = {
    "hardware_profile": limits.PROFILE_MAX,
    "execution_type": limits.PROFILE_MAX,
    "file_name": limits.FILE_NAME_MAX,
}

_EXECUTION_ID = re.compile(EXECUTION_ID_RE)
_ORG = re.compile(ORG_SLUG_RE)
_HOSTNAME = re.compile(HOSTNAME_RE)
_PROJECT = re.compile(PROJECT_RE)
_USER = re.compile(USER_RE)


class ExecutionFields(TypedDict, total=False):
    """What a registration or an update may set; absent keys are left alone (or defaulted on create).

    Times may carry any offset (naive means UTC); `gpus` None or empty means every GPU of the host.
    """

    execution_id: str | None
    org: str
    project: str | None
    user: str | None
    hostname: str | None
    gpus: Sequence[str] | None
    status: ExecutionStatus | str
    created_at: datetime | None
    start_time: datetime | None
    end_time: datetime | None
    hardware_profile: str | None
    execution_type: str | None
    file_name: str | None
    return_code: int | None
    system_errors: Sequence[str] | None


@dataclass(frozen=True, slots=True)
class ExecutionPage:
    """One page of a listing, newest first, with the number of all matches."""

    executions: tuple[Execution, ...]
    total: int
    limit: int
    offset: int
    counts_by_status: Mapping[ExecutionStatus, int] | None = None


def _clean(fields: Mapping[str, Any]) -> dict[str, Any]:
    """Validated Execution attributes for the keys present in `fields` (org and execution_id apart)."""
    out: dict[str, Any] = {}
    for name, value in fields.items():
        if name in ("org", "execution_id"):
            continue
        if name == "project":
            out[name] = None if value is None else match(name, value, _PROJECT, PROJECT_TEXT)
        elif name == "user":
            out[name] = None if value is None else match(name, value, _USER, USER_TEXT)
        elif name == "hostname":
            out[name] = None if value is None else match(name, value, _HOSTNAME, HOSTNAME_TEXT)
        elif name == "gpus":
            out[name] = gpu_list(name, value)
        elif name == "status":
            try:
                out[name] = ExecutionStatus(value)
            except ValueError:
                allowed = ", ".join(s.value for s in ExecutionStatus)
                raise bad(name, value, f"status must be one of {allowed}") from None
        elif name in ("created_at", "start_time", "end_time"):
            out[name] = utc(name, value)
        elif name in _TEXT_LIMITS:
            if value is not None and (not isinstance(value, str) or len(value) > _TEXT_LIMITS[name]):
                raise bad(name, value, f"{name} must be a string of at most {_TEXT_LIMITS[name]} characters")
            out[name] = value
        elif name == "return_code":
            if value is not None and (
                isinstance(value, bool)
                or not isinstance(value, int)
                or not limits.INT32_MIN <= value <= limits.INT32_MAX
            ):
                raise bad(name, value, "return_code must be a 32-bit integer")
            out[name] = value
        elif name == "system_errors":
            errors = list(value or ())
            longest = limits.SYSTEM_ERROR_MAX
            if len(errors) > limits.SYSTEM_ERRORS_MAX or not all(
                isinstance(e, str) and len(e) <= longest for e in errors
            ):
                raise bad(
                    name,
                    value,
                    f"system_errors must be at most {limits.SYSTEM_ERRORS_MAX} strings of {longest} "
                    "characters",
                )
            out[name] = tuple(errors)
        else:
            raise bad(name, value, f"unknown field {name!r}")
    return out


def _check_order(execution: Execution) -> None:
    if execution.start_time and execution.end_time and execution.end_time < execution.start_time:
        raise bad("end_time", execution.end_time.isoformat(), "end_time must not be before start_time")


class ExecutionService:
    """What the Lyceum, admin and CLI front ends do with executions and keys (all async)."""

    def __init__(self, registry: Registry, *, clock: Callable[[], datetime] = utcnow) -> None:
        self.registry = registry
        self.clock = clock
        # execution id -> the execution as the registry had it; who may see it is checked every read
        self._recent: TtlCache[str, Execution | None] = TtlCache(RECENT_READ_TTL_S, 4096)

    # ------------------------------------------------------------------ reading

    async def get_for(self, principal: Principal, execution_id: str, *, recent: bool = False) -> Execution:
        """The execution if the caller may see it; NotFound for unknown ids and other orgs.
        `recent`: a running execution as read up to RECENT_READ_TTL_S ago (metrics reads), else as the
        registry has it now."""
        if not _EXECUTION_ID.fullmatch(execution_id):
            raise NotFound("Execution not found")  # cannot exist: not worth a query
        read = partial(run_sync, self.registry.get_execution, execution_id)
        if recent:
            execution = await self._recent.get_or_load(execution_id, read, valid=_still_running)
        else:
            execution = await read()
        if execution is None:
            raise NotFound("Execution not found")
        check_visible(
            principal,
            execution.org,
            execution.project,
            "Execution not found",
            "This key is not allowed on this execution's project",
        )
        return execution

    async def list_active(
        self, principal: Principal, limit: int = limits.ACTIVE_EXECUTIONS_MAX
    ) -> list[Execution]:
        """The caller's org's pending, starting and running executions, newest first."""
        rows, _ = await run_sync(
            self.registry.list_executions,
            org=principal.org,
            statuses=ACTIVE,
            projects=principal.projects,
            limit=limit,
        )
        return rows

    async def history(
        self, principal: Principal, *, limit: int = 50, offset: int = 0, match: ExecutionMatch | None = None
    ) -> ExecutionPage:
        """A page of the caller's org's executions (those `match` keeps), newest first, with counts by
        status (of the same executions)."""
        rows, total = await run_sync(
            self.registry.list_executions,
            org=principal.org,
            projects=principal.projects,
            match=match,
            limit=limit,
            offset=offset,
        )
        counts = await run_sync(
            self.registry.count_by_status, org=principal.org, projects=principal.projects, match=match
        )
        return ExecutionPage(tuple(rows), total, limit, offset, counts)

    async def list_all(
        self,
        principal: Principal,
        *,
        org: str | None = None,
        statuses: Sequence[ExecutionStatus] | None = None,
        limit: int = 50,
        offset: int = 0,
    ) -> ExecutionPage:
        """Admin listing over every org (or one)."""
        require_admin(principal)
        rows, total = await run_sync(
            self.registry.list_executions, org=org, statuses=statuses, limit=limit, offset=offset
        )
        return ExecutionPage(tuple(rows), total, limit, offset)

    # ------------------------------------------------------------------ writing (admin)

    async def register(self, principal: Principal, fields: ExecutionFields) -> tuple[Execution, bool]:
        """Create an execution, or update the given fields of an existing one: (execution, created).

        The org of an existing execution never changes (Conflict); `created_at` is kept.
        """
        require_admin(principal)
        org = match("org", fields.get("org"), _ORG, ORG_SLUG_TEXT)
        raw_id = fields.get("execution_id")
        execution_id = (
            str(uuid.uuid4())
            if raw_id is None
            else match("execution_id", raw_id, _EXECUTION_ID, EXECUTION_ID_TEXT)
        )
        given = _clean(fields)
        now = self.clock()
        existing = None if raw_id is None else await run_sync(self.registry.get_execution, execution_id)
        if existing is None:
            created_at = given.pop("created_at", None) or now
            candidate = Execution(
                execution_id=execution_id,
                org=org,
                hostname=None,
                gpus=(),
                status=ExecutionStatus.PENDING,
                created_at=created_at,
            )
            candidate = replace(candidate, **given)
        else:
            given.pop("created_at", None)
            candidate = replace(existing, org=org, **given)
        _check_order(candidate)
        stored = await run_sync(self.registry.upsert_execution, candidate, tuple(given), now=now)
        self._recent.discard(execution_id)  # the next metrics read sees it as stored
        return stored

    async def update(self, principal: Principal, execution_id: str, changes: ExecutionFields) -> Execution:
        """Set some fields of an existing execution (never its id, org or created_at)."""
        require_admin(principal)
        for fixed in ("execution_id", "org", "created_at"):
            if fixed in changes:
                raise bad(fixed, changes.get(fixed), f"{fixed} cannot be changed")
        if changes.get("status", ExecutionStatus.PENDING) is None:
            raise bad("status", None, "status must not be null")
        given = _clean(changes)
        if not _EXECUTION_ID.fullmatch(execution_id):
            raise NotFound("Execution not found")
        existing = await run_sync(self.registry.get_execution, execution_id)
        if existing is None:
            raise NotFound("Execution not found")
        _check_order(replace(existing, **given))
        updated = await run_sync(self.registry.update_execution, execution_id, given, now=self.clock())
        self._recent.discard(execution_id)
        if updated is None:  # deleted in between
            raise NotFound("Execution not found")
        return updated

    # ------------------------------------------------------------------ API keys of the caller's org

    @staticmethod
    def _manageable(principal: Principal, key: ApiKey) -> bool:
        """Keys of the caller's org, never broader than the caller: no admin keys for ordinary
        callers, and a project-limited caller only sees keys limited to some of its projects."""
        if key.org != principal.org or key.is_revoked:
            return False
        if key.is_admin and not principal.is_admin:
            return False
        if principal.projects is not None:
            return key.projects is not None and key.projects <= principal.projects
        return True

    async def _managed_key(self, principal: Principal, key_id: str) -> ApiKey:
        too_long = len(key_id) > limits.API_KEY_ID_MAX
        key = None if too_long else await run_sync(self.registry.get_key, key_id)
        if key is None or not self._manageable(principal, key):
            raise NotFound("API key not found")
        return key

    async def list_keys(self, principal: Principal) -> list[ApiKey]:
        keys = await run_sync(self.registry.list_keys, principal.org)
        return [k for k in keys if self._manageable(principal, k)]

    async def create_key(
        self, principal: Principal, name: str, expires_at: datetime | None = None
    ) -> tuple[ApiKey, str]:
        """A new ordinary key of the caller's org, limited to the caller's projects; plaintext once.

        A key never outlives the key that creates it: when the caller's key expires, a later expiry
        (or none) is clamped to the caller's. JWT callers' keys are not clamped: a JWT is a sign-in
        session, not a credential whose lifetime a key could inherit.
        """
        return await self._create_key(
            principal, principal.org, name, is_admin=False, projects=principal.projects, expires_at=expires_at
        )

    async def create_key_for(
        self,
        principal: Principal,
        org: str,
        name: str,
        *,
        is_admin: bool = False,
        projects: Collection[str] | None = None,
        expires_at: datetime | None = None,
    ) -> tuple[ApiKey, str]:
        """Admin: a key of any org (created if new), an admin key, or one limited to `projects`;
        the same checks and expiry clamp as `create_key`."""
        require_admin(principal)
        return await self._create_key(
            principal, org, name, is_admin=is_admin, projects=projects, expires_at=expires_at
        )

    async def _create_key(
        self,
        principal: Principal,
        org: str,
        name: str,
        *,
        is_admin: bool,
        projects: Collection[str] | None,
        expires_at: datetime | None,
    ) -> tuple[ApiKey, str]:
        """The one path every new key takes (Lyceum route, admin, CLI): names, scope, expiry."""
        match("org", org, _ORG, ORG_SLUG_TEXT)
        name = name.strip() if isinstance(name, str) else name
        if not isinstance(name, str) or not 1 <= len(name) <= limits.KEY_NAME_MAX:
            raise bad("key_name", name, f"key_name must be 1-{limits.KEY_NAME_MAX} characters")
        scope = None if projects is None else frozenset(projects)
        for project in scope or ():
            match("projects", project, _PROJECT, PROJECT_TEXT)
        if principal.projects is not None and (scope is None or not scope <= principal.projects):
            raise Forbidden("A key limited to projects cannot create a key for other projects")
        if is_admin and not principal.is_admin:
            raise Forbidden(ADMIN_ONLY)
        now = self.clock()
        expires = utc("expires_at", expires_at)
        if expires is not None and expires <= now:
            raise bad("expires_at", format_rfc3339(expires), "expires_at is in the past")
        ceiling = principal.key_expires_at
        if ceiling is not None and (expires is None or expires > ceiling):
            expires = ceiling
        return await run_sync(
            self.registry.create_key,
            org,
            name=name,
            is_admin=is_admin,
            projects=scope,
            expires_at=expires,
            now=now,
        )

    async def revoke_key(self, principal: Principal, key_id: str) -> ApiKey:
        await self._managed_key(principal, key_id)
        revoked = await run_sync(self.registry.revoke_key, key_id, now=self.clock())
        if revoked is None:
            raise NotFound("API key not found")
        return revoked

    async def toggle_key(self, principal: Principal, key_id: str) -> ApiKey:
        await self._managed_key(principal, key_id)
        toggled = await run_sync(self.registry.set_key_active, key_id, None)
        if toggled is None:
            raise NotFound("API key not found")
        return toggled

    # ------------------------------------------------------------------ API keys of every org (admin)

    async def list_all_keys(
        self, principal: Principal, *, org: str | None = None, include_revoked: bool = False
    ) -> list[ApiKey]:
        """Admin: every org's keys (or one org's), oldest first."""
        require_admin(principal)
        return await run_sync(self.registry.list_keys, org, include_revoked=include_revoked)

    async def find_any_key(self, principal: Principal, ref: str) -> ApiKey:
        """Admin: a key of any org by its id or its 8-character prefix (`lk_xxxxx`)."""
        require_admin(principal)
        ref = ref.strip()
        if ref.startswith(KEY_MARKER):
            if len(ref) != PREFIX_LEN:
                raise InvalidRequest(
                    f"give a key's id or its {PREFIX_LEN}-character prefix, not the key itself"
                )
            matches = await run_sync(self.registry.find_keys_by_prefix, ref)
            if len(matches) > 1:
                raise Conflict(f"prefix {ref} is ambiguous ({len(matches)} keys): use the key id")
            if matches:
                return matches[0]
        elif len(ref) <= limits.API_KEY_ID_MAX:
            key = await run_sync(self.registry.get_key, ref)
            if key is not None:
                return key
        raise NotFound(f"no API key {ref!r}")

    async def revoke_any_key(self, principal: Principal, key_id: str) -> ApiKey:
        """Admin: revoke a key of any org for good; Conflict when it already is."""
        key = await self.find_any_key(principal, key_id)
        if key.is_revoked:
            raise Conflict(f"key {key.prefix} is already revoked")
        revoked = await run_sync(self.registry.revoke_key, key.key_id, now=self.clock())
        if revoked is None:
            raise NotFound(f"no API key {key_id!r}")
        return revoked

    async def toggle_any_key(self, principal: Principal, key_id: str) -> ApiKey:
        """Admin: switch a key of any org between active and inactive (Conflict when revoked)."""
        key = await self.find_any_key(principal, key_id)
        toggled = await run_sync(self.registry.set_key_active, key.key_id, None)
        if toggled is None:
            raise NotFound(f"no API key {key_id!r}")
        return toggled

    async def current_key(self, principal: Principal) -> ApiKey | None:
        """The key the caller authenticated with (None for JWT callers)."""
        if principal.key_id is None:
            return None
        return await run_sync(self.registry.get_key, principal.key_id)


def _still_running(kept: Execution | None) -> bool:
    """Whether a kept row serves a recent read: one of an execution without an end. An unknown one is
    looked for again at once (it may be registered any moment), and a finished one read as it is now
    (a change to it makes its archive stale: never served, not even for a moment)."""
    return kept is not None and kept.end_time is None
