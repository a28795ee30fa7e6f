"""The fleet usage table's query (docs/usage.md): the stored hourly slices of receipts inside a window,
summed per group in SQL. A slice cut by the window's edge counts for the part inside it (its figures
prorated by time); the group keys come from the executions' rows."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import ColumnElement, Float, and_, case, cast, func, literal, or_, select

from gpulens.storage.registry import RegistryTables
from gpulens.storage.tables import ExecutionRow, UsageSliceRow

MS_PER_HOUR = 3_600_000
MS_PER_DAY = 86_400_000
GROUP_KEYS = ("org", "user", "project", "hardware_profile", "hostname", "day")


@dataclass(frozen=True, slots=True)
class UsageRow:
    """One group's sums: GPU time in GPU-ms (prorated: fractional at the window's edges)."""

    keys: tuple[str | int | None, ...]  # per group key asked; `day`: the day's start, Unix ms
    executions: int
    gpu_ms: float
    useful_gpu_s: float
    idle_ms: float
    idle_held_ms: float
    input_bound_ms: float
    throttled_ms: float
    energy_j: float
    cost: float | None  # None: no priced slice in the group
    priced_ms: float  # the GPU-ms of the priced slices (cost covers these only)


def _group_column(key: str) -> Any:
    s, e = UsageSliceRow, ExecutionRow
    if key == "org":
        return s.org
    if key == "day":
        return s.hour_ms - s.hour_ms % MS_PER_DAY  # the UTC day's start
    return getattr(e, key)


class UsageStore(RegistryTables):
    def rows(
        self,
        *,
        org: str | None,
        projects: Collection[str] | None,
        start_ms: int,
        end_ms: int,
        group_by: Sequence[str],
    ) -> list[UsageRow]:
        """The groups' sums over [start_ms, end_ms) of `org` (None: every org) limited to `projects`
        (None: all; else those and executions without a project), in no particular order."""
        s, e = UsageSliceRow, ExecutionRow
        lo = case((s.start_ms < start_ms, literal(start_ms)), else_=s.start_ms)
        hi = case((s.end_ms > end_ms, literal(end_ms)), else_=s.end_ms)
        share = cast(hi - lo, Float) / cast(s.end_ms - s.start_ms, Float)  # of the slice inside

        def part(column: Any) -> ColumnElement[Any]:
            return func.coalesce(func.sum(column * share), 0.0)

        groups = [_group_column(k).label(f"g{i}") for i, k in enumerate(group_by)]
        # a slice lies inside its hour: the hour range (the (org, hour_ms) index) bounds the scan
        conditions = [
            s.hour_ms > start_ms - MS_PER_HOUR,
            s.hour_ms < end_ms,
            s.end_ms > start_ms,
            s.start_ms < end_ms,
            s.end_ms > s.start_ms,
        ]
        if org is not None:
            conditions.append(s.org == org)
        if projects is not None:
            conditions.append(or_(e.project.is_(None), e.project.in_(sorted(projects))))
        stmt = (
            select(
                *groups,
                func.count(func.distinct(s.execution_id)),
                part(s.gpu_ms),
                part(s.useful_gpu_s),
                part(s.idle_ms),
                part(s.idle_held_ms),
                part(s.input_bound_ms),
                part(s.throttled_ms),
                part(s.energy_j),
                func.sum(s.cost * share),
                part(case((s.cost.is_not(None), s.gpu_ms), else_=0)),
            )
            .join(e, and_(e.execution_id == s.execution_id, e.org == s.org))
            .where(*conditions)
            .group_by(*groups)
        )
        n = len(groups)
        with self._read() as session:
            found = session.execute(stmt).all()
        out = []
        for row in found:
            sums = [float(v) for v in row[n + 1 : n + 8]]
            out.append(
                UsageRow(
                    keys=tuple(row[:n]),
                    executions=int(row[n]),
                    gpu_ms=sums[0],
                    useful_gpu_s=sums[1],
                    idle_ms=sums[2],
                    idle_held_ms=sums[3],
                    input_bound_ms=sums[4],
                    throttled_ms=sums[5],
                    energy_j=sums[6],
                    cost=None if row[n + 8] is None else float(row[n + 8]),
                    priced_ms=float(row[n + 9]),
                )
            )
        return out
