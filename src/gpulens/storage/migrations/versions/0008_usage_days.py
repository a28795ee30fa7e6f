"""Daily rollup of the usage slices (docs/usage.md): one row per execution and UTC day, so that the
usage table sums whole days from it; filled from the slices already stored.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-02
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

DAY_MS = 86_400_000


def upgrade() -> None:
    op.create_table(
        "usage_days",
        sa.Column("execution_id", sa.String(128), nullable=False),
        sa.Column("day_ms", sa.BigInteger(), nullable=False),
        sa.Column("org", sa.String(63), nullable=False),
        sa.Column("gpu_ms", sa.BigInteger(), nullable=False),
        sa.Column("idle_ms", sa.BigInteger(), nullable=False),
        sa.Column("idle_held_ms", sa.BigInteger(), nullable=False),
        sa.Column("input_bound_ms", sa.BigInteger(), nullable=False),
        sa.Column("throttled_ms", sa.BigInteger(), nullable=False),
        sa.Column("useful_gpu_s", sa.Float(), nullable=False),
        sa.Column("energy_j", sa.Float(), nullable=False),
        sa.Column("cost", sa.Float(), nullable=True),
        sa.Column("priced_ms", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("execution_id", "day_ms", name="pk_usage_days"),
    )
    op.create_index("ix_usage_days_org_day", "usage_days", ["org", "day_ms"])
    day = f"(hour_ms - hour_ms % {DAY_MS})"
    op.execute(
        "INSERT INTO usage_days (execution_id, day_ms, org, gpu_ms, idle_ms, idle_held_ms, "
        "input_bound_ms, throttled_ms, useful_gpu_s, energy_j, cost, priced_ms) "
        f"SELECT execution_id, {day}, MIN(org), SUM(gpu_ms), SUM(idle_ms), SUM(idle_held_ms), "
        "SUM(input_bound_ms), SUM(throttled_ms), SUM(useful_gpu_s), SUM(energy_j), SUM(cost), "
        "SUM(CASE WHEN cost IS NULL THEN 0 ELSE gpu_ms END) "
        f"FROM usage_slices WHERE end_ms > start_ms GROUP BY execution_id, {day}"
    )


def downgrade() -> None:
    op.drop_index("ix_usage_days_org_day", table_name="usage_days")
    op.drop_table("usage_days")
