"""The registry: orgs, API keys, executions, workloads and pods in SQLite (default) or PostgreSQL.

Every method is synchronous and opens its own short transaction; async callers run them in a
worker thread (`anyio.to_thread.run_sync`). Inputs are trusted: the service layer validates them.
Datetimes must be aware (the services convert at the edges, naive meaning UTC: domain/timeparse);
a naive one raises TypeError here rather than being given a zone.
"""

from __future__ import annotations

import enum
import threading
import uuid
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field, fields, replace
from datetime import UTC, datetime
from functools import cache
from pathlib import Path
from typing import Any, TypeVar, cast

from sqlalchemy import (
    Connection,
    Engine,
    Select,
    bindparam,
    create_engine,
    event,
    func,
    inspect,
    or_,
    select,
    text,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import StaticPool
from sqlalchemy.sql import ColumnElement

from gpulens.domain.errors import Conflict
from gpulens.domain.keys import PREFIX_LEN, ApiKey, hash_key, new_key_secret
from gpulens.domain.models import Execution, ExecutionStatus
from gpulens.domain.timeparse import require_utc
from gpulens.domain.workloads import Pod, PodPhase, Workload
from gpulens.storage.tables import ApiKeyRow, Base, ExecutionRow, OrgRow, PodRow, WorkloadRow

T = TypeVar("T")
R = TypeVar("R", bound=Base)

MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"

# The Execution fields a caller may set; execution_id and created_at are fixed at creation.
MUTABLE_FIELDS = frozenset(f.name for f in fields(Execution)) - {"execution_id", "created_at"}

# The Pod fields a caller may set; pod_id and workload_id are fixed at creation.
POD_MUTABLE_FIELDS = frozenset(f.name for f in fields(Pod)) - {"pod_id", "workload_id"}

KeyListener = Callable[[str], None]


@dataclass(frozen=True, slots=True)
class SyncCounts:
    """What `sync_discovered` did; `skipped` says why an item was left alone (another org's id...)."""

    workloads_created: int = 0
    workloads_updated: int = 0
    workloads_unchanged: int = 0
    pods_created: int = 0
    pods_updated: int = 0
    pods_unchanged: int = 0
    skipped: tuple[str, ...] = ()


def _now(now: datetime | None) -> datetime:
    """A write's time: the caller's (aware, else TypeError), or the clock's."""
    return datetime.now(UTC) if now is None else require_utc(now, "now")


def _to_execution(row: ExecutionRow) -> Execution:
    return Execution(
        execution_id=row.execution_id,
        org=row.org,
        hostname=row.hostname,
        gpus=tuple(row.gpus or ()),
        status=ExecutionStatus(row.status),
        created_at=row.created_at,
        start_time=row.start_time,
        end_time=row.end_time,
        hardware_profile=row.hardware_profile,
        execution_type=row.execution_type,
        file_name=row.file_name,
        return_code=row.return_code,
        system_errors=tuple(row.system_errors or ()),
        project=row.project,
        user=row.user,
    )


def _to_key(row: ApiKeyRow) -> ApiKey:
    return ApiKey(
        key_id=row.id,
        org=row.org,
        name=row.name,
        prefix=row.prefix,
        is_admin=row.is_admin,
        is_active=row.is_active,
        created_at=row.created_at,
        projects=None if row.projects is None else frozenset(row.projects),
        expires_at=row.expires_at,
        last_used_at=row.last_used_at,
        revoked_at=row.revoked_at,
    )


def _to_workload(row: WorkloadRow) -> Workload:
    return Workload(
        workload_id=row.workload_id,
        name=row.name,
        org=row.org,
        project=row.project,
        created_at=row.created_at,
    )


@cache
def _by_key(table: type[Base]) -> Select[Any]:
    """`SELECT * FROM table WHERE <primary key> = :key`, built once per table, each column under its
    attribute's name (a column named apart from its attribute, as `user_name` for `user`, included)."""
    mapper = inspect(table)
    (key,) = mapper.primary_key
    columns = [prop.columns[0].label(prop.key) for prop in mapper.column_attrs]
    return select(*columns).where(key == bindparam("key"))


_POD_WITH_WORKLOAD = (
    select(
        PodRow.pod_id,
        PodRow.workload_id,
        PodRow.name,
        PodRow.namespace,
        PodRow.node,
        PodRow.gpus,
        PodRow.phase,
        PodRow.start_time,
        PodRow.end_time,
        WorkloadRow.workload_id.label("w_workload_id"),
        WorkloadRow.name.label("w_name"),
        WorkloadRow.org.label("w_org"),
        WorkloadRow.project.label("w_project"),
        WorkloadRow.created_at.label("w_created_at"),
    )
    .join(WorkloadRow, WorkloadRow.workload_id == PodRow.workload_id)
    .where(PodRow.pod_id == bindparam("pod_id"))
)


def _to_pod(row: PodRow) -> Pod:
    return Pod(
        pod_id=row.pod_id,
        workload_id=row.workload_id,
        name=row.name,
        namespace=row.namespace,
        node=row.node,
        gpus=tuple(row.gpus or ()),
        phase=PodPhase(row.phase),
        start_time=row.start_time,
        end_time=row.end_time,
    )


# How a domain value is stored: lists as JSON lists, enums by value, datetimes in UTC.
_LIST_FIELDS = frozenset({"gpus", "system_errors"})
_ENUM_FIELDS: dict[str, Callable[[Any], enum.Enum]] = {"status": ExecutionStatus, "phase": PodPhase}


def _stored(name: str, value: Any) -> Any:
    """The domain attribute `name` as the row stores it (so the row reads back as stored)."""
    if name in _LIST_FIELDS:
        return list(value or ())
    if name in _ENUM_FIELDS:
        return _ENUM_FIELDS[name](value).value
    if isinstance(value, datetime):
        return require_utc(value, name)
    return value


def _copy_fields(row: object, source: object, names: Collection[str]) -> bool:
    """Copy the named fields of domain object `source` onto `row`; True when something changed."""
    changed = False
    for name in names:
        value = _stored(name, getattr(source, name))
        changed |= getattr(row, name) != value
        setattr(row, name, value)
    return changed


def _new_pod_row(pod: Pod, now: datetime) -> PodRow:
    row = PodRow(pod_id=pod.pod_id, workload_id=pod.workload_id, created_at=now, updated_at=now)
    _copy_fields(row, pod, POD_MUTABLE_FIELDS)
    return row


def _new_workload_row(workload: Workload, now: datetime) -> WorkloadRow:
    return WorkloadRow(
        workload_id=workload.workload_id,
        name=workload.name,
        org=workload.org,
        project=workload.project,
        created_at=require_utc(workload.created_at, "created_at"),
        updated_at=now,
    )


def _refuse_unknown(names: Collection[str], allowed: Collection[str]) -> None:
    unknown = set(names) - set(allowed)
    if unknown:
        raise ValueError(f"not updatable: {sorted(unknown)}")


def _scope(
    table: type[ExecutionRow] | type[WorkloadRow], org: str | None, projects: Collection[str] | None
) -> list[ColumnElement[bool]]:
    """Conditions: rows of `org` (None: any), of `projects` or of no project (None: any; see Principal)."""
    conditions: list[ColumnElement[bool]] = []
    if org is not None:
        conditions.append(table.org == org)
    if projects is not None:
        conditions.append(or_(table.project.is_(None), table.project.in_(list(projects))))
    return conditions


@dataclass(frozen=True, slots=True)
class ExecutionMatch:
    """What an execution listing keeps besides its org and projects: each key given (`user`,
    `project`, `hostname`, `hardware_profile`) must equal its value (None: the execution has none, or
    an empty one), and with a window, the execution ran in it (started before `until`, not ended by
    `since`)."""

    keys: Mapping[str, str | None] = field(default_factory=dict)
    since: datetime | None = None
    until: datetime | None = None

    def conditions(self) -> list[ColumnElement[bool]]:
        columns = {
            "user": ExecutionRow.user,
            "project": ExecutionRow.project,
            "hostname": ExecutionRow.hostname,
            "hardware_profile": ExecutionRow.hardware_profile,
        }
        out: list[ColumnElement[bool]] = []
        for key, value in self.keys.items():
            column = columns[key]  # an unknown key is a bug of the caller
            out.append(or_(column.is_(None), column == "") if value is None else column == value)
        if self.until is not None:
            out.append(ExecutionRow.start_time < require_utc(self.until))
        if self.since is not None:
            since = require_utc(self.since)
            out.append(ExecutionRow.start_time.is_not(None))
            out.append(or_(ExecutionRow.end_time.is_(None), ExecutionRow.end_time > since))
        return out


class Registry:
    """Orgs, API keys and executions; build with `Registry.from_url(url)`, then `migrate()` once."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._sessions = sessionmaker(engine, expire_on_commit=False)
        self._key_listeners: list[KeyListener] = []
        self._listeners_lock = threading.Lock()

    @classmethod
    def from_url(cls, url: str, *, echo: bool = False) -> Registry:
        if url.startswith(("postgresql://", "postgres://")):
            url = "postgresql+psycopg://" + url.split("://", 1)[1]
        if url.startswith("sqlite"):
            in_memory = url in ("sqlite://", "sqlite:///:memory:") or "mode=memory" in url
            extra: dict[str, Any] = {"poolclass": StaticPool} if in_memory else {}  # one shared connection
            engine = create_engine(
                url, echo=echo, connect_args={"check_same_thread": False, "timeout": 30}, **extra
            )
            event.listen(engine, "connect", _sqlite_connect)
            event.listen(engine, "begin", _sqlite_begin)
        else:
            engine = create_engine(url, echo=echo, pool_pre_ping=True, pool_size=10, max_overflow=10)
        return cls(engine)

    @property
    def url(self) -> str:
        return self.engine.url.render_as_string(hide_password=True)

    @property
    def dialect(self) -> str:
        return self.engine.dialect.name

    def migrate(self) -> None:
        """Bring the schema to the newest revision (alembic upgrade head); safe to call every start."""
        from alembic import command
        from alembic.config import Config

        config = Config()
        config.set_main_option("script_location", str(MIGRATIONS_DIR))
        with self.engine.connect() as connection:
            connection.execution_options(**{_WRITE_OPTION: True})
            with connection.begin():
                if connection.dialect.name == "postgresql":
                    # Two processes starting at once: the second waits, then finds nothing to do.
                    connection.execute(text("SELECT pg_advisory_xact_lock(7301925541)"))
                config.attributes["connection"] = connection
                command.upgrade(config, "head")

    def dispose(self) -> None:
        self.engine.dispose()

    def ping(self) -> None:
        with self.engine.connect() as connection:
            connection.execute(text("SELECT 1"))

    @contextmanager
    def _session(self, *, write: bool = False) -> Iterator[Session]:
        with self._sessions.begin() as session:
            if write:
                # SQLite: take the write lock up front (BEGIN IMMEDIATE), so a read-then-write
                # transaction waits for a concurrent writer instead of failing with "database is locked".
                session.connection(execution_options={_WRITE_OPTION: True})
            yield session

    def _write_retrying(self, work: Callable[[Session], T], conflict: str) -> T:
        """`work` in a write transaction, tried three times, then Conflict(conflict)."""
        for _attempt in range(3):
            try:
                with self._session(write=True) as session:
                    return work(session)
            except IntegrityError:
                # A concurrent insert of the same id won the race: go round again and update it.
                continue
        raise Conflict(conflict)

    @contextmanager
    def transaction(self, *, write: bool = False) -> Iterator[Session]:
        """A transaction with the registry's rules (a write takes SQLite's write lock up front), for
        the tables kept beside the registry's (storage/archive.py)."""
        with self._session(write=write) as session:
            yield session

    def write_retrying(self, work: Callable[[Session], T], conflict: str) -> T:
        """`work` in a write transaction, retried on a concurrent insert of the same key, then
        Conflict(conflict)."""
        return self._write_retrying(work, conflict)

    def _get(self, table: type[R], key: str, convert: Callable[[R], T]) -> T | None:
        """The `table` row with primary key `key`, converted; None if there is none.

        Every request resolves its key, execution or pod: one Core statement on a plain connection
        costs a third of the CPU of an ORM session's `get`. The converters read column attributes,
        which a Core row has under the same names."""
        with self.engine.connect() as connection:
            row = connection.execute(_by_key(table), {"key": key}).first()
        return None if row is None else convert(cast(R, row))

    # ------------------------------------------------------------------ orgs

    def _ensure_org(self, session: Session, slug: str, name: str | None, now: datetime) -> bool:
        insert = postgresql.insert if session.get_bind().dialect.name == "postgresql" else sqlite.insert
        stmt = (
            insert(OrgRow)
            .values(slug=slug, name=name, created_at=now)
            .on_conflict_do_nothing()
            .returning(OrgRow.slug)
        )
        return session.execute(stmt).scalar_one_or_none() is not None

    def ensure_org(self, slug: str, name: str | None = None, *, now: datetime | None = None) -> bool:
        """Create the org unless it exists; True when it was created."""
        with self._session(write=True) as session:
            return self._ensure_org(session, slug, name, _now(now))

    def org_exists(self, slug: str) -> bool:
        with self._session() as session:
            return session.get(OrgRow, slug) is not None

    def list_orgs(self) -> list[str]:
        with self._session() as session:
            return list(session.scalars(select(OrgRow.slug).order_by(OrgRow.slug)))

    # ------------------------------------------------------------------ API keys

    def add_key_listener(self, listener: KeyListener) -> None:
        """Call `listener(key_id)` after a key changes (revoke, toggle): lets caches forget it."""
        with self._listeners_lock:
            self._key_listeners.append(listener)

    def _key_changed(self, key_id: str) -> None:
        with self._listeners_lock:
            listeners = list(self._key_listeners)
        for listener in listeners:
            listener(key_id)

    def create_key(
        self,
        org: str,
        *,
        name: str,
        is_admin: bool = False,
        projects: Collection[str] | None = None,
        expires_at: datetime | None = None,
        now: datetime | None = None,
    ) -> tuple[ApiKey, str]:
        """A new active key (creating the org if needed); the plaintext is returned here only."""
        now = _now(now)
        expires_at = None if expires_at is None else require_utc(expires_at, "expires_at")
        plaintext = new_key_secret()
        row = ApiKeyRow(
            id=str(uuid.uuid4()),
            org=org,
            name=name,
            prefix=plaintext[:PREFIX_LEN],
            key_hash=hash_key(plaintext),
            is_admin=is_admin,
            is_active=True,
            projects=None if projects is None else sorted(set(projects)),
            created_at=now,
            expires_at=expires_at,
        )
        with self._session(write=True) as session:
            self._ensure_org(session, org, None, now)
            session.add(row)
            session.flush()
            return _to_key(row), plaintext

    def get_key(self, key_id: str) -> ApiKey | None:
        return self._get(ApiKeyRow, key_id, _to_key)

    def find_key(self, key_hash: str) -> ApiKey | None:
        """The key whose sha256 is `key_hash` (revoked and inactive ones too: the caller says why not)."""
        with self._session() as session:
            row = session.scalars(select(ApiKeyRow).where(ApiKeyRow.key_hash == key_hash)).one_or_none()
            return None if row is None else _to_key(row)

    def find_keys_by_prefix(self, prefix: str) -> list[ApiKey]:
        with self._session() as session:
            rows = session.scalars(select(ApiKeyRow).where(ApiKeyRow.prefix == prefix))
            return [_to_key(r) for r in rows]

    def list_keys(self, org: str | None = None, *, include_revoked: bool = False) -> list[ApiKey]:
        stmt = select(ApiKeyRow).order_by(ApiKeyRow.created_at, ApiKeyRow.id)
        if org is not None:
            stmt = stmt.where(ApiKeyRow.org == org)
        if not include_revoked:
            stmt = stmt.where(ApiKeyRow.revoked_at.is_(None))
        with self._session() as session:
            return [_to_key(r) for r in session.scalars(stmt)]

    def revoke_key(self, key_id: str, *, now: datetime | None = None) -> ApiKey | None:
        """Revoke for good (the row stays, so the key keeps failing as 'revoked'); None if unknown."""
        with self._session(write=True) as session:
            row = session.get(ApiKeyRow, key_id)
            if row is None:
                return None
            if row.revoked_at is None:
                row.revoked_at = _now(now)
                row.is_active = False
            key = _to_key(row)
        self._key_changed(key_id)
        return key

    def set_key_active(self, key_id: str, active: bool | None = None) -> ApiKey | None:
        """Set is_active (None: flip it); None if the key is unknown. Revoked keys stay inactive."""
        with self._session(write=True) as session:
            row = session.get(ApiKeyRow, key_id, with_for_update=True)
            if row is None:
                return None
            if row.revoked_at is not None:
                raise Conflict("API key has been revoked")
            row.is_active = (not row.is_active) if active is None else active
            key = _to_key(row)
        self._key_changed(key_id)
        return key

    def touch_key(self, key_id: str, when: datetime) -> None:
        """Record a use; never moves last_used_at backwards."""
        when = require_utc(when, "when")
        with self._session(write=True) as session:
            session.execute(
                update(ApiKeyRow)
                .where(ApiKeyRow.id == key_id)
                .where(or_(ApiKeyRow.last_used_at.is_(None), ApiKeyRow.last_used_at < when))
                .values(last_used_at=when)
            )

    # ------------------------------------------------------------------ executions

    def get_execution(self, execution_id: str) -> Execution | None:
        return self._get(ExecutionRow, execution_id, _to_execution)

    def upsert_execution(
        self, execution: Execution, fields: Collection[str] | None = None, *, now: datetime | None = None
    ) -> tuple[Execution, bool]:
        """Insert `execution`, or update the `fields` (default: every mutable field) of the stored one.

        Returns (stored execution, created). The org of an existing execution never changes:
        another org's id raises Conflict.
        """
        names = MUTABLE_FIELDS if fields is None else frozenset(fields)
        _refuse_unknown(names, MUTABLE_FIELDS)
        now = _now(now)

        def write(session: Session) -> tuple[Execution, bool]:
            row = session.get(ExecutionRow, execution.execution_id, with_for_update=True)
            if row is None:
                self._ensure_org(session, execution.org, None, now)
                row = ExecutionRow(execution_id=execution.execution_id, updated_at=now)
                _copy_fields(row, execution, MUTABLE_FIELDS | {"created_at"})
                session.add(row)
                session.flush()
                return _to_execution(row), True
            if row.org != execution.org:
                raise Conflict(f"execution {execution.execution_id!r} belongs to another org")
            _copy_fields(row, execution, names - {"org"})
            row.updated_at = now
            session.flush()
            return _to_execution(row), False

        conflict = f"execution {execution.execution_id!r} is being written concurrently; retry"
        return self._write_retrying(write, conflict)

    def update_execution(
        self, execution_id: str, changes: Mapping[str, Any], *, now: datetime | None = None
    ) -> Execution | None:
        """Set the given fields (Execution field names); None if the execution does not exist."""
        _refuse_unknown(changes, MUTABLE_FIELDS - {"org"})
        with self._session(write=True) as session:
            row = session.get(ExecutionRow, execution_id, with_for_update=True)
            if row is None:
                return None
            current = replace(_to_execution(row), **changes)
            _copy_fields(row, current, changes.keys())
            row.updated_at = _now(now)
            session.flush()
            return _to_execution(row)

    def list_executions(
        self,
        *,
        org: str | None = None,
        statuses: Collection[ExecutionStatus] | None = None,
        projects: Collection[str] | None = None,
        match: ExecutionMatch | None = None,
        limit: int | None = 50,
        offset: int = 0,
    ) -> tuple[list[Execution], int]:
        """A page of executions, newest first, and the total that match the filters.

        `projects` limits to those projects plus executions without a project (see Principal).
        """
        conditions = _scope(ExecutionRow, org, projects)
        if match is not None:
            conditions.extend(match.conditions())
        if statuses is not None:
            conditions.append(ExecutionRow.status.in_([ExecutionStatus(s).value for s in statuses]))
        order = (ExecutionRow.created_at.desc(), ExecutionRow.execution_id.desc())
        return self._page(ExecutionRow, conditions, order, limit, offset, _to_execution)

    def count_by_status(
        self,
        *,
        org: str | None = None,
        projects: Collection[str] | None = None,
        match: ExecutionMatch | None = None,
    ) -> dict[ExecutionStatus, int]:
        """Every status with its count (zero included)."""
        conditions = _scope(ExecutionRow, org, projects)
        if match is not None:
            conditions.extend(match.conditions())
        stmt = select(ExecutionRow.status, func.count()).where(*conditions).group_by(ExecutionRow.status)
        counts = dict.fromkeys(ExecutionStatus, 0)
        with self._session() as session:
            for status, n in session.execute(stmt):
                counts[ExecutionStatus(status)] = int(n)
        return counts

    # ------------------------------------------------------------------ workloads and pods

    def get_workload(self, workload_id: str) -> Workload | None:
        return self._get(WorkloadRow, workload_id, _to_workload)

    def upsert_workload(
        self, workload: Workload, pods: Sequence[Pod] = (), *, now: datetime | None = None
    ) -> tuple[Workload, bool]:
        """Insert or update a workload (name, project) and insert or replace the given pods' fields.

        Returns (stored workload, created); `created_at` of an existing workload is kept. Another
        org's workload id, or a pod id of another workload, raises Conflict (and nothing is written).
        """
        now = _now(now)
        for pod in pods:
            if pod.workload_id != workload.workload_id:
                raise ValueError(f"pod {pod.pod_id} names workload {pod.workload_id}, not this one")

        def write(session: Session) -> tuple[Workload, bool]:
            row = session.get(WorkloadRow, workload.workload_id, with_for_update=True)
            created = row is None
            if row is None:
                self._ensure_org(session, workload.org, None, now)
                row = _new_workload_row(workload, now)
                session.add(row)
            elif row.org != workload.org:
                raise Conflict(f"workload {workload.workload_id} belongs to another org")
            else:
                _copy_fields(row, workload, ("name", "project"))
                row.updated_at = now
            session.flush()
            for pod in pods:
                pod_row = session.get(PodRow, pod.pod_id, with_for_update=True)
                if pod_row is None:
                    session.add(_new_pod_row(pod, now))
                elif pod_row.workload_id != pod.workload_id:
                    raise Conflict(f"pod {pod.pod_id} belongs to another workload")
                elif _copy_fields(pod_row, pod, POD_MUTABLE_FIELDS):
                    pod_row.updated_at = now
            session.flush()
            return _to_workload(row), created

        conflict = f"workload {workload.workload_id} is being written concurrently; retry"
        return self._write_retrying(write, conflict)

    def list_workloads(
        self,
        *,
        org: str | None = None,
        projects: Collection[str] | None = None,
        limit: int | None = 50,
        offset: int = 0,
    ) -> tuple[list[Workload], int]:
        """A page of workloads, newest first, and the total that match (`projects` as for executions)."""
        order = (WorkloadRow.created_at.desc(), WorkloadRow.workload_id.desc())
        return self._page(WorkloadRow, _scope(WorkloadRow, org, projects), order, limit, offset, _to_workload)

    def get_pod(self, pod_id: str) -> Pod | None:
        return self._get(PodRow, pod_id, _to_pod)

    def get_pod_with_workload(self, pod_id: str) -> tuple[Workload, Pod] | None:
        """The pod and its workload in one read (what every pod-metrics request resolves): one
        statement on a plain connection, a third of the CPU of the two ORM look-ups."""
        with self.engine.connect() as connection:
            row = connection.execute(_POD_WITH_WORKLOAD, {"pod_id": pod_id}).first()
        if row is None:
            return None
        workload = Workload(row.w_workload_id, row.w_name, row.w_org, row.w_project, row.w_created_at)
        return workload, _to_pod(cast(PodRow, row))  # the pod's columns under their own names

    def list_pods(
        self, workload_id: str, *, limit: int | None = 50, offset: int = 0
    ) -> tuple[list[Pod], int]:
        """A page of a workload's pods, by start time (unstarted last), then name; and their total."""
        order = (PodRow.start_time.is_(None), PodRow.start_time, PodRow.name, PodRow.pod_id)
        return self._page(PodRow, [PodRow.workload_id == workload_id], order, limit, offset, _to_pod)

    def list_pods_overlapping(
        self, workload_id: str, start: datetime, end: datetime, *, limit: int
    ) -> tuple[list[Pod], int]:
        """The workload's pods whose lifetime (start_time .. end_time; an unknown end is still
        running, an unknown start unbounded) overlaps [start, end], at most `limit` of them in
        list_pods' order; and how many overlap in all."""
        conditions = [
            PodRow.workload_id == workload_id,
            or_(PodRow.start_time.is_(None), PodRow.start_time <= end),
            or_(PodRow.end_time.is_(None), PodRow.end_time >= start),
        ]
        order = (PodRow.start_time.is_(None), PodRow.start_time, PodRow.name, PodRow.pod_id)
        return self._page(PodRow, conditions, order, limit, 0, _to_pod)

    def _page(
        self,
        table: Any,
        conditions: Sequence[Any],
        order: Sequence[Any],
        limit: int | None,
        offset: int,
        convert: Callable[[Any], T],
    ) -> tuple[list[T], int]:
        """One page of `table` rows matching `conditions`, converted, and how many match in all."""
        page = select(table).where(*conditions).order_by(*order).limit(limit).offset(offset)
        count = select(func.count()).select_from(table).where(*conditions)
        with self._session() as session:
            rows = [convert(r) for r in session.scalars(page)]
            total = session.scalar(count) or 0
        return rows, total

    def update_pod(
        self, workload_id: str, pod_id: str, changes: Mapping[str, Any], *, now: datetime | None = None
    ) -> Pod | None:
        """Set the given Pod fields; None if there is no such pod in that workload."""
        _refuse_unknown(changes, POD_MUTABLE_FIELDS)
        with self._session(write=True) as session:
            row = session.get(PodRow, pod_id, with_for_update=True)
            if row is None or row.workload_id != workload_id:
                return None
            current = replace(_to_pod(row), **changes)
            if _copy_fields(row, current, changes.keys()):
                row.updated_at = _now(now)
            session.flush()
            return _to_pod(row)

    def sync_discovered(
        self, items: Sequence[tuple[Workload, Sequence[Pod]]], *, now: datetime | None = None
    ) -> SyncCounts:
        """Upsert what a discovery found, in one transaction; running it again changes nothing.

        Workloads: created, or name/project updated; `created_at` only moves earlier. Pods: created,
        or name/namespace/phase updated and node/start/end set when the discovery knows them (a
        value it does not know never clears a stored one); GPUs are never touched. Ids of another
        org's workload or of another workload's pod are skipped and named in `skipped`.
        """
        now = _now(now)
        return self._write_retrying(
            lambda session: self._sync(session, items, now),
            "discovery results are being written concurrently; retry",
        )

    def _sync(
        self, session: Session, items: Sequence[tuple[Workload, Sequence[Pod]]], now: datetime
    ) -> SyncCounts:
        counts = dict.fromkeys((f.name for f in fields(SyncCounts) if f.name != "skipped"), 0)
        skipped: list[str] = []
        orgs: set[str] = set()
        for workload, pods in items:
            if workload.org not in orgs:
                self._ensure_org(session, workload.org, None, now)
                orgs.add(workload.org)
            row = session.get(WorkloadRow, workload.workload_id, with_for_update=True)
            if row is None:
                session.add(_new_workload_row(workload, now))
                session.flush()
                counts["workloads_created"] += 1
            elif row.org != workload.org:
                skipped.append(f"workload {workload.workload_id} ({workload.name}) belongs to another org")
                continue
            else:
                changed = _copy_fields(row, workload, ("name", "project"))
                created_at = require_utc(workload.created_at, "created_at")
                if created_at < row.created_at:
                    row.created_at = created_at
                    changed = True
                if changed:
                    row.updated_at = now
                counts["workloads_updated" if changed else "workloads_unchanged"] += 1
            for pod in pods:
                pod_row = session.get(PodRow, pod.pod_id, with_for_update=True)
                if pod_row is None:
                    session.add(_new_pod_row(replace(pod, workload_id=workload.workload_id), now))
                    counts["pods_created"] += 1
                    continue
                if pod_row.workload_id != workload.workload_id:
                    skipped.append(f"pod {pod.pod_id} ({pod.name}) belongs to another workload")
                    continue
                known = ["name", "namespace", "phase"]
                known += [n for n in ("node", "start_time", "end_time") if getattr(pod, n) is not None]
                if _copy_fields(pod_row, pod, known):
                    pod_row.updated_at = now
                    counts["pods_updated"] += 1
                else:
                    counts["pods_unchanged"] += 1
            session.flush()
        return SyncCounts(**counts, skipped=tuple(skipped))


_WRITE_OPTION = "gpulens_write"


def _sqlite_connect(dbapi_connection: Any, _record: Any) -> None:
    # pysqlite's own implicit BEGIN cannot take the write lock up front; _sqlite_begin emits BEGIN.
    dbapi_connection.isolation_level = None
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute("PRAGMA journal_mode=WAL")  # readers do not block the writer
        cursor.execute("PRAGMA synchronous=NORMAL")  # safe with WAL; a commit costs no fsync
        cursor.execute("PRAGMA busy_timeout=30000")
    finally:
        cursor.close()


def _sqlite_begin(connection: Connection) -> None:
    immediate = connection.get_execution_options().get(_WRITE_OPTION, False)
    connection.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")


class RegistryTables:
    """Tables kept beside the registry's own (the archive, the stored summaries): they share its engine
    and its transaction discipline (SQLite writes: BEGIN IMMEDIATE, as every registry write)."""

    def __init__(self, registry: Registry) -> None:
        self.registry = registry

    def _read(self) -> AbstractContextManager[Session]:
        return self.registry.transaction()

    def _write(self) -> AbstractContextManager[Session]:
        return self.registry.transaction(write=True)
