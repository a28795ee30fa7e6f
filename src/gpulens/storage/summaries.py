"""Stored summaries of finished executions, in the registry database beside their archives.

One `execution_summaries` row per execution: the summary route's whole JSON body (as it is served)
and the few figures a list row shows (mean GPU utilization, cost, findings per kind), plus what it was
computed for: `key_digest` (the registration fields, the settings and the price used) and, for the
background pass's query, `settings_digest` and the registry row's `updated_at`. The service
(service/summary_store.py) decides what a key is and when a row is fresh; this module only keeps rows.
Writing a summary replaces the previous one in one transaction.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import asdict, dataclass, fields
from datetime import datetime
from typing import Any

from sqlalchemy import delete, func, or_, select, update
from sqlalchemy.orm import Session, defer

from gpulens.domain.models import Execution
from gpulens.domain.usage import UsageSlice
from gpulens.storage.archive import ACTIVE_STATUSES
from gpulens.storage.registry import RegistryTables, _to_execution
from gpulens.storage.tables import ExecutionRow, ExecutionSummaryRow, UsageDayRow, UsageSliceRow
from gpulens.storage.usage import MS_PER_DAY, daily


@dataclass(frozen=True, slots=True)
class SummaryInfo:
    """An `execution_summaries` row without its body."""

    execution_id: str
    org: str
    key_digest: str
    settings_digest: str
    source_updated_at: datetime
    computed_at: datetime
    compute_ms: int
    byte_count: int
    row: dict[str, Any]  # what a list row shows (service/summary_store.py writes and reads it)


_INFO_FIELDS = tuple(f.name for f in fields(SummaryInfo))


def _info(row: ExecutionSummaryRow) -> SummaryInfo:
    return SummaryInfo(**{name: getattr(row, name) for name in _INFO_FIELDS})


@dataclass(frozen=True, slots=True)
class Registered:
    """An execution as the registry holds it, its row's `updated_at`, and its stored summary (if any)."""

    execution: Execution
    updated_at: datetime
    summary: SummaryInfo | None


class SummaryStore(RegistryTables):
    """The `execution_summaries` table of a registry (its engine and transaction rules)."""

    # -- writing --------------------------------------------------------------------------------------
    def put(self, info: SummaryInfo, body: bytes, slices: Sequence[UsageSlice] = ()) -> None:
        """Make `info` with `body` the execution's stored summary (replacing any earlier one), and
        `slices` its receipt's hourly slices and their daily sums (replacing the earlier ones), in one
        transaction."""

        def write(session: Session) -> None:
            row = session.get(ExecutionSummaryRow, info.execution_id)
            if row is None:
                row = ExecutionSummaryRow(execution_id=info.execution_id)
                session.add(row)
            for name in _INFO_FIELDS[1:]:
                setattr(row, name, getattr(info, name))
            row.body = body
            session.execute(delete(UsageSliceRow).where(UsageSliceRow.execution_id == info.execution_id))
            session.execute(delete(UsageDayRow).where(UsageDayRow.execution_id == info.execution_id))
            session.add_all(
                UsageSliceRow(execution_id=info.execution_id, org=info.org, **asdict(s)) for s in slices
            )
            session.add_all(
                UsageDayRow(execution_id=info.execution_id, org=info.org, **day) for day in daily(slices)
            )
            session.flush()

        self.registry.write_retrying(
            write, f"the summary of execution {info.execution_id} is being written concurrently; retry"
        )

    def put_running(
        self, execution_id: str, org: str, from_hour_ms: int, slices: Sequence[UsageSlice]
    ) -> bool:
        """A running execution's provisional slices from `from_hour_ms` on (replacing those stored from
        that hour, and the daily rollup of the days they touch), in one transaction; False (nothing
        written) once its whole-life summary is stored, which is final."""

        def write(session: Session) -> bool:
            if session.get(ExecutionSummaryRow, execution_id) is not None:
                return False
            s, d = UsageSliceRow, UsageDayRow
            session.execute(delete(s).where(s.execution_id == execution_id, s.hour_ms >= from_hour_ms))
            session.add_all(
                UsageSliceRow(execution_id=execution_id, org=org, **asdict(one))
                for one in slices
                if one.hour_ms >= from_hour_ms
            )
            session.flush()
            day_ms = from_hour_ms - from_hour_ms % MS_PER_DAY
            names = [f.name for f in fields(UsageSlice)]
            kept = session.execute(
                select(*(getattr(s, n) for n in names)).where(
                    s.execution_id == execution_id, s.hour_ms >= day_ms
                )
            )
            session.execute(delete(d).where(d.execution_id == execution_id, d.day_ms >= day_ms))
            session.add_all(
                UsageDayRow(execution_id=execution_id, org=org, **day)
                for day in daily(UsageSlice(*row) for row in kept)
            )
            session.flush()
            return True

        return self.registry.write_retrying(
            write, f"the usage of execution {execution_id} is being written concurrently; retry"
        )

    def running(self, limit: int) -> list[tuple[Execution, int | None]]:
        """Active executions with a host and a start, each with the hour of its last stored slice
        (None: none yet), those never sliced first, then the earliest started."""
        e, s = ExecutionRow, UsageSliceRow
        active = (e.status.in_(ACTIVE_STATUSES), e.hostname.is_not(None), e.start_time.is_not(None))
        last = (
            select(s.execution_id, func.max(s.hour_ms).label("last"))
            .where(s.execution_id.in_(select(e.execution_id).where(*active)))
            .group_by(s.execution_id)
            .subquery()
        )
        stmt = (
            select(e, last.c.last)
            .outerjoin(last, last.c.execution_id == e.execution_id)
            .where(*active)
            .order_by(last.c.last.is_not(None), e.start_time, e.execution_id)
            .limit(limit)
        )
        with self._read() as session:
            return [(_to_execution(row), hour) for row, hour in session.execute(stmt)]

    def slices(self, execution_id: str) -> list[UsageSlice]:
        """The stored hourly slices of the execution's receipt, in time order."""
        t = UsageSliceRow
        names = [f.name for f in fields(UsageSlice)]
        stmt = (
            select(*(getattr(t, n) for n in names)).where(t.execution_id == execution_id).order_by(t.hour_ms)
        )
        with self._read() as session:
            return [UsageSlice(*row) for row in session.execute(stmt)]

    def mark(self, execution_id: str, *, settings_digest: str, source_updated_at: datetime) -> None:
        """Record that the stored summary still holds for the execution's row and the settings now."""
        with self._write() as session:
            session.execute(
                update(ExecutionSummaryRow)
                .where(ExecutionSummaryRow.execution_id == execution_id)
                .values(settings_digest=settings_digest, source_updated_at=source_updated_at)
            )

    # -- reading --------------------------------------------------------------------------------------
    def body(self, execution_id: str, key_digest: str) -> bytes | None:
        """The stored body when it was computed for `key_digest` (else None: missing or stale)."""
        with self._read() as session:
            found = session.scalar(
                select(ExecutionSummaryRow.body).where(
                    ExecutionSummaryRow.execution_id == execution_id,
                    ExecutionSummaryRow.key_digest == key_digest,
                )
            )
            return None if found is None else bytes(found)

    def get(self, execution_id: str) -> SummaryInfo | None:
        with self._read() as session:
            row = session.scalar(
                select(ExecutionSummaryRow)
                .where(ExecutionSummaryRow.execution_id == execution_id)
                .options(defer(ExecutionSummaryRow.body))
            )
            return None if row is None else _info(row)

    def executions(self, execution_ids: Collection[str]) -> dict[str, Registered]:
        """The registered executions among `execution_ids`, each with its stored summary's info (one
        query, no bodies); ids nobody registered are absent."""
        if not execution_ids:
            return {}
        stmt = (
            select(ExecutionRow, ExecutionSummaryRow)
            .outerjoin(ExecutionSummaryRow, ExecutionSummaryRow.execution_id == ExecutionRow.execution_id)
            .where(ExecutionRow.execution_id.in_(list(execution_ids)))
            .options(defer(ExecutionSummaryRow.body))
        )
        with self._read() as session:
            return {
                e.execution_id: Registered(_to_execution(e), e.updated_at, None if s is None else _info(s))
                for e, s in session.execute(stmt)
            }

    def pending(
        self,
        *,
        ended_after: datetime,
        ready_before: datetime,
        settings_digest: str,
        limit: int | None = None,
        exclude: Collection[str] = (),
    ) -> list[Registered]:
        """Finished executions (not active; host, start and end known) that ended in [ended_after,
        ready_before] and have no stored summary, or one whose row or settings changed since it was
        computed (it may still hold: the service compares keys); newest first."""
        summary = ExecutionSummaryRow
        stmt = (
            select(ExecutionRow, summary)
            .outerjoin(summary, summary.execution_id == ExecutionRow.execution_id)
            .where(
                ExecutionRow.status.not_in(ACTIVE_STATUSES),
                ExecutionRow.hostname.is_not(None),
                ExecutionRow.start_time.is_not(None),
                ExecutionRow.end_time.is_not(None),
                ExecutionRow.end_time >= ended_after,
                ExecutionRow.end_time <= ready_before,
                or_(
                    summary.execution_id.is_(None),
                    summary.settings_digest != settings_digest,
                    summary.source_updated_at < ExecutionRow.updated_at,
                ),
            )
            .options(defer(summary.body))
            .order_by(ExecutionRow.end_time.desc(), ExecutionRow.execution_id)
            .limit(limit)
        )
        if exclude:
            stmt = stmt.where(ExecutionRow.execution_id.not_in(list(exclude)))
        with self._read() as session:
            return [
                Registered(_to_execution(e), e.updated_at, None if s is None else _info(s))
                for e, s in session.execute(stmt)
            ]
