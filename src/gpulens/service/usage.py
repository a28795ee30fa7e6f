"""Fleet usage (docs/usage.md): who used which GPUs, who wasted them, and what it cost, per group, from
the stored hourly slices of the executions' receipts (storage/usage.py sums them in SQL)."""

from __future__ import annotations

import csv
import io
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gpulens.domain.errors import Forbidden, InvalidParameter
from gpulens.domain.models import Principal
from gpulens.domain.timeparse import datetime_to_ms, format_rfc3339_ms
from gpulens.service.checks import run_sync
from gpulens.service.summary import load_prices
from gpulens.shaping.cells import csv_cell
from gpulens.shaping.findings_core import MS_PER_HOUR
from gpulens.storage.usage import GROUP_KEYS, UsageRow, UsageStore

MAX_WINDOW_MS = 400 * 24 * MS_PER_HOUR  # a little over a year of hourly slices
WEEK_MS = 7 * 24 * MS_PER_HOUR
LINES = ("idle", "idle_held", "input_bound", "throttled")  # the receipt's lines a finding charges


@dataclass(frozen=True, slots=True)
class UsageGroup:
    keys: dict[str, str | int | None]  # group key -> value (`day`: the day's start, Unix ms)
    executions: int
    running_executions: int  # of them, still running: counted up to their last provisional slices
    gpu_hours: float
    useful_gpu_hours: float
    idle_gpu_hours: float
    idle_held_gpu_hours: float
    input_bound_gpu_hours: float
    throttled_gpu_hours: float
    energy_kwh: float
    cost: float | None  # None: nothing in the group was priced
    priced_gpu_hours: float  # of gpu_hours, those priced: what `cost` covers
    top_findings: list[tuple[str, float]]  # receipt lines by GPU-hours, largest first (none at 0)


@dataclass(frozen=True, slots=True)
class UsageTable:
    start_ms: int
    end_ms: int
    group_by: tuple[str, ...]
    currency: str | None
    groups: list[UsageGroup]


def check_group_by(raw: Sequence[str], principal: Principal) -> tuple[str, ...]:
    """One or two distinct group keys (comma-separated values split by the caller); `org` only for
    an admin key, which sees every org."""
    keys = tuple(k.strip() for part in raw for k in part.split(",") if k.strip())
    allowed = ", ".join(GROUP_KEYS)
    if not keys:
        raise InvalidParameter("query", "group_by", ",".join(raw), f"one or two distinct keys of {allowed}")
    if len(set(keys)) != len(keys) or len(keys) > 2:  # what the schema's pattern per value cannot say
        raise InvalidParameter(
            "query", "group_by", ",".join(raw), "group_by: a key twice, or more than the maximum of 2 keys"
        )
    for key in keys:
        if key not in GROUP_KEYS:
            raise InvalidParameter("query", "group_by", key, f"group_by must be among {allowed}")
    if "org" in keys and not principal.is_admin:
        raise Forbidden("group_by=org needs an admin key")
    return keys


def _group(keys: tuple[str, ...], row: UsageRow) -> UsageGroup:
    lines = ((k, getattr(row, f"{k}_ms") / MS_PER_HOUR) for k in LINES)
    top = sorted(((k, hours) for k, hours in lines if hours > 0), key=lambda kv: -kv[1])
    return UsageGroup(
        dict(zip(keys, row.keys, strict=True)),
        row.executions,
        row.running,
        row.gpu_ms / MS_PER_HOUR,
        row.useful_gpu_s / 3600,
        row.idle_ms / MS_PER_HOUR,
        row.idle_held_ms / MS_PER_HOUR,
        row.input_bound_ms / MS_PER_HOUR,
        row.throttled_ms / MS_PER_HOUR,
        row.energy_j / 3_600_000,
        row.cost,
        row.priced_ms / MS_PER_HOUR,
        top,
    )


class UsageService:
    def __init__(
        self,
        store: UsageStore,
        prices: Path | None = None,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.store = store
        self.prices = prices
        self.clock = clock

    async def table(
        self,
        principal: Principal,
        start_ms: int | None,
        end_ms: int | None,
        group_by: Sequence[str],
        every_org: bool = False,
    ) -> UsageTable:
        """The caller's org's usage over [start_ms, end_ms) (default: the week before now) per group
        (an admin grouping by org: every org's), largest GPU-hours first (by day, in time order)."""
        keys = check_group_by(group_by, principal)
        end_ms = datetime_to_ms(self.clock()) if end_ms is None else end_ms
        start_ms = end_ms - WEEK_MS if start_ms is None else start_ms
        if end_ms <= start_ms:
            raise InvalidParameter("query", "end", str(end_ms), "end must not be before start, nor be it")
        if end_ms - start_ms > MAX_WINDOW_MS:
            raise InvalidParameter(
                "query", "start", str(start_ms), "the window is more than the maximum of 400 days"
            )
        every_org = principal.is_admin and (every_org or "org" in keys)  # an admin's: across orgs
        rows = await run_sync(
            self.store.rows,
            org=None if every_org else principal.org,
            projects=principal.projects,
            start_ms=start_ms,
            end_ms=end_ms,
            group_by=keys,
        )
        groups = [_group(keys, r) for r in rows]
        if "day" in keys:
            groups.sort(key=lambda g: (int(g.keys["day"] or 0), -g.gpu_hours, str(g.keys)))
        else:
            groups.sort(key=lambda g: (-g.gpu_hours, str(g.keys)))
        currency = None if self.prices is None else load_prices(self.prices).currency
        return UsageTable(start_ms, end_ms, keys, currency, groups)


CSV_FIELDS = (
    "executions",
    "runningExecutions",
    "gpuHours",
    "usefulGpuHours",
    "idleGpuHours",
    "idleHeldGpuHours",
    "inputBoundGpuHours",
    "throttledGpuHours",
    "energyKwh",
    "cost",
    "pricedGpuHours",
)


def group_dict(group: UsageGroup) -> dict[str, Any]:
    """A group as the API spells it (the CLI prints the same): key values as text (`day`: RFC 3339)."""
    keys = {
        k: (format_rfc3339_ms(int(v)) if k == "day" and v is not None else None if v is None else str(v))
        for k, v in group.keys.items()
    }
    return {
        "group": keys,
        "executions": group.executions,
        "runningExecutions": group.running_executions,
        "gpuHours": group.gpu_hours,
        "usefulGpuHours": group.useful_gpu_hours,
        "idleGpuHours": group.idle_gpu_hours,
        "idleHeldGpuHours": group.idle_held_gpu_hours,
        "inputBoundGpuHours": group.input_bound_gpu_hours,
        "throttledGpuHours": group.throttled_gpu_hours,
        "energyKwh": group.energy_kwh,
        "cost": group.cost,
        "pricedGpuHours": group.priced_gpu_hours,
        "topFindings": [{"kind": k, "gpuHours": h} for k, h in group.top_findings],
    }


def usage_csv(table: UsageTable) -> str:
    """The table as CSV: the group keys, then CSV_FIELDS; a header row."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow([*table.group_by, *CSV_FIELDS])
    for group in table.groups:
        row = group_dict(group)
        writer.writerow([csv_cell(v) for v in [*row["group"].values(), *(row[f] for f in CSV_FIELDS)]])
    return out.getvalue()
