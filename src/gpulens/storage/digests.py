"""What a usage digest reads (service/alerts/digest.py, docs/alerts.md "Digests"): each execution's
usage over a window from the same stored figures as the fleet usage table (storage/usage.py: the daily
rollup for whole days, the hourly slices at the edges, a slice cut by the window prorated), summed per
execution, with the execution's row for the digest's grouping, matching and links."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import func, select

from gpulens.domain.models import Execution
from gpulens.storage.registry import _to_execution
from gpulens.storage.tables import ExecutionRow
from gpulens.storage.usage import SUMMED, UsageStore


@dataclass(frozen=True, slots=True)
class ExecutionUsage:
    """One execution's sums over a window: GPU time in GPU-ms (prorated: fractional at the edges)."""

    execution: Execution
    gpu_ms: float
    useful_gpu_s: float
    idle_ms: float
    idle_held_ms: float
    input_bound_ms: float
    throttled_ms: float
    energy_j: float
    cost: float | None  # None: none of its slices in the window was priced


class DigestStore(UsageStore):
    def executions_usage(self, org: str, start_ms: int, end_ms: int) -> list[ExecutionUsage]:
        """Every execution of `org` with stored usage in [start_ms, end_ms), its figures summed over
        the window exactly as the usage table sums them, in no particular order."""
        source = self.window_source(org, start_ms, end_ms)
        per_execution = (
            select(
                source.c.execution_id,
                source.c.org,
                *(func.coalesce(func.sum(source.c[name]), 0.0).label(name) for name in SUMMED),
                func.sum(source.c.cost).label("cost"),
            )
            .group_by(source.c.execution_id, source.c.org)
            .subquery("per_execution")
        )
        e = ExecutionRow
        stmt = select(e, *(per_execution.c[name] for name in (*SUMMED, "cost"))).join(
            per_execution,
            (e.execution_id == per_execution.c.execution_id) & (e.org == per_execution.c.org),
        )
        with self._read() as session:
            found = session.execute(stmt).all()
            out = []
            for row in found:
                sums = dict(zip(SUMMED, (float(v) for v in row[1:8]), strict=True))
                cost = None if row[8] is None else float(row[8])
                out.append(ExecutionUsage(execution=_to_execution(row[0]), cost=cost, **sums))
        return out
