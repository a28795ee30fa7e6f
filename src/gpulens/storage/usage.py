"""The fleet usage table's query (docs/usage.md): the stored hourly slices of receipts inside a window
and their daily rollup, summed per group in SQL. A slice cut by the window's edge counts for the part
inside it (its figures prorated by time); the group keys come from the executions' rows."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Float, Select, and_, case, cast, func, literal, or_, select, union_all

from gpulens.domain.usage import UsageSlice
from gpulens.storage.archive import ACTIVE_STATUSES
from gpulens.storage.registry import RegistryTables
from gpulens.storage.tables import ExecutionRow, UsageDayRow, UsageSliceRow

MS_PER_HOUR = 3_600_000
MS_PER_DAY = 86_400_000
GROUP_KEYS = ("org", "user", "project", "hardware_profile", "hostname", "day")
# the figures summed per group, as the slices and the daily rollup name them
SUMMED = (
    "gpu_ms",
    "useful_gpu_s",
    "idle_ms",
    "idle_held_ms",
    "input_bound_ms",
    "throttled_ms",
    "energy_j",
)


@dataclass(frozen=True, slots=True)
class UsageRow:
    """One group's sums: GPU time in GPU-ms (prorated: fractional at the window's edges)."""

    keys: tuple[str | int | None, ...]  # per group key asked; `day`: the day's start, Unix ms
    executions: int
    running: int  # of them, still active: their figures run up to their last provisional slices
    gpu_ms: float
    useful_gpu_s: float
    idle_ms: float
    idle_held_ms: float
    input_bound_ms: float
    throttled_ms: float
    energy_j: float
    cost: float | None  # None: no priced slice in the group
    priced_ms: float  # the GPU-ms of the priced slices (cost covers these only)


def daily(slices: Iterable[UsageSlice]) -> list[dict[str, Any]]:
    """The sums of an execution's hourly slices per UTC day (the `usage_days` rows, less the ids)."""
    days: dict[int, dict[str, Any]] = {}
    for s in slices:
        if s.end_ms <= s.start_ms:  # covers nothing (the hourly read skips it too)
            continue
        day_ms = s.hour_ms - s.hour_ms % MS_PER_DAY
        d = days.get(day_ms)
        if d is None:
            d = days[day_ms] = {"day_ms": day_ms, "cost": None, "priced_ms": 0}
            d.update(dict.fromkeys(SUMMED, 0))
        for name in SUMMED:
            d[name] += getattr(s, name)
        if s.cost is not None:
            d["cost"] = (d["cost"] or 0.0) + s.cost
            d["priced_ms"] += s.gpu_ms
    return [days[k] for k in sorted(days)]


def _group_column(key: str, source: Any) -> Any:
    """`org` and `day` are the slices' (or the rollup's), the other keys the executions' rows'."""
    if key in ("org", "day"):
        return source.c[key]
    return getattr(ExecutionRow, key)


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
        (None: all; else those and executions without a project), in no particular order.

        The UTC days wholly inside the window are read from the daily rollup (`usage_days`, one row
        per execution and day); the hours of the edge days from the hourly slices, those cut by the
        window prorated by the part inside. Both in one `UNION ALL`, so that an execution in both
        still counts once."""
        source = self.window_source(org, start_ms, end_ms)
        e = ExecutionRow
        groups = [_group_column(k, source).label(f"g{i}") for i, k in enumerate(group_by)]
        conditions = []
        if projects is not None:
            conditions.append(or_(e.project.is_(None), e.project.in_(sorted(projects))))
        summed = [func.coalesce(func.sum(source.c[name]), 0.0) for name in (*SUMMED, "priced_ms")]
        stmt = (
            select(
                *groups,
                func.count(func.distinct(source.c.execution_id)),
                *summed,
                func.sum(source.c.cost),
                func.count(func.distinct(case((e.status.in_(ACTIVE_STATUSES), source.c.execution_id)))),
            )
            .join(e, and_(e.execution_id == source.c.execution_id, e.org == source.c.org))
            .where(*conditions)
            .group_by(*groups)
        )
        n = len(groups)
        with self._read() as session:
            found = session.execute(stmt).all()
        out = []
        for row in found:
            sums = dict(zip((*SUMMED, "priced_ms"), (float(v) for v in row[n + 1 : n + 9]), strict=True))
            cost = row[n + 9]
            out.append(
                UsageRow(
                    keys=tuple(row[:n]),
                    executions=int(row[n]),
                    running=int(row[n + 10]),
                    gpu_ms=sums["gpu_ms"],
                    useful_gpu_s=sums["useful_gpu_s"],
                    idle_ms=sums["idle_ms"],
                    idle_held_ms=sums["idle_held_ms"],
                    input_bound_ms=sums["input_bound_ms"],
                    throttled_ms=sums["throttled_ms"],
                    energy_j=sums["energy_j"],
                    cost=None if cost is None else float(cost),
                    priced_ms=sums["priced_ms"],
                )
            )
        return out

    def window_source(self, org: str | None, start_ms: int, end_ms: int) -> Any:
        """The window's figures as one subquery (`usage`: execution_id, org, day and SUMMED, cost,
        priced_ms): the daily rollup's rows of the UTC days wholly inside it and the hourly slices of
        its edge days, those cut by the window prorated."""
        first_day = -(-start_ms // MS_PER_DAY) * MS_PER_DAY  # the first whole day inside the window
        last_day = end_ms // MS_PER_DAY * MS_PER_DAY  # the end of the last one
        if first_day >= last_day:  # no whole day: every hour from the slices
            first_day = last_day = end_ms
        parts = [self._hours(org, start_ms, end_ms, first_day, last_day)]
        if first_day < last_day:
            parts.append(self._days(org, first_day, last_day))
        return union_all(*parts).subquery("usage")

    @staticmethod
    def _hours(org: str | None, start_ms: int, end_ms: int, first_day: int, last_day: int) -> Select[Any]:
        """The hourly slices of the window's edge days ([start, first_day) and [last_day, end)),
        prorated by the part of each inside the window."""
        s = UsageSliceRow
        lo = case((s.start_ms < start_ms, literal(start_ms)), else_=s.start_ms)
        hi = case((s.end_ms > end_ms, literal(end_ms)), else_=s.end_ms)
        share = cast(hi - lo, Float) / cast(s.end_ms - s.start_ms, Float)  # of the slice inside
        # a slice lies inside its hour: the hour range (the (org, hour_ms) index) bounds the scan
        edges = or_(
            and_(s.hour_ms > start_ms - MS_PER_HOUR, s.hour_ms < first_day),
            and_(s.hour_ms >= last_day, s.hour_ms < end_ms),
        )
        conditions = [edges, s.end_ms > start_ms, s.start_ms < end_ms, s.end_ms > s.start_ms]
        if org is not None:
            conditions.append(s.org == org)
        return select(
            s.execution_id,
            s.org,
            (s.hour_ms - s.hour_ms % MS_PER_DAY).label("day"),
            *((getattr(s, name) * share).label(name) for name in SUMMED),
            (s.cost * share).label("cost"),
            case((s.cost.is_not(None), s.gpu_ms * share), else_=0.0).label("priced_ms"),
        ).where(*conditions)

    @staticmethod
    def _days(org: str | None, first_day: int, last_day: int) -> Select[Any]:
        """The daily rollup's rows of the days wholly inside the window."""
        d = UsageDayRow
        conditions = [d.day_ms >= first_day, d.day_ms < last_day]
        if org is not None:
            conditions.append(d.org == org)
        return select(
            d.execution_id,
            d.org,
            d.day_ms.label("day"),
            *(cast(getattr(d, name), Float).label(name) for name in SUMMED),
            d.cost.label("cost"),
            cast(d.priced_ms, Float).label("priced_ms"),
        ).where(*conditions)
